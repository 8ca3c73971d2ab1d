//! The layer's metrics, read from a recorder after a scripted run: new, duplicate, in flight,
//! held, store down.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tower::{ServiceExt, service_fn};
use tower_idempotency::store::{Claim, MemoryStore, Store, StoreError};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

/// Every value recorded, by `name{label=value,...}`; histograms by their count of samples.
#[derive(Clone, Default)]
struct Values(Arc<Mutex<BTreeMap<String, f64>>>);

struct Slot(Values, String);

impl Values {
    fn get(&self, id: &str) -> f64 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0.0)
    }

    fn slot(&self, key: &Key) -> Arc<Slot> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Slot(
            self.clone(),
            format!("{}{{{}}}", key.name(), labels.join(",")),
        ))
    }

    fn add(&self, id: &str, delta: f64) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += delta;
    }
}

impl metrics::CounterFn for Slot {
    fn increment(&self, value: u64) {
        self.0.add(&self.1, value as f64);
    }
    fn absolute(&self, value: u64) {
        self.0
            .0
            .lock()
            .unwrap()
            .insert(self.1.clone(), value as f64);
    }
}

impl metrics::GaugeFn for Slot {
    fn increment(&self, value: f64) {
        self.0.add(&self.1, value);
    }
    fn decrement(&self, value: f64) {
        self.0.add(&self.1, -value);
    }
    fn set(&self, value: f64) {
        self.0.0.lock().unwrap().insert(self.1.clone(), value);
    }
}

impl metrics::HistogramFn for Slot {
    fn record(&self, _value: f64) {
        self.0.add(&self.1, 1.0);
    }
}

impl Recorder for Values {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.slot(key))
    }
}

/// A store that is down.
#[derive(Clone)]
struct Down;

impl Store for Down {
    async fn claim(&self, _: &IdempotencyKey, _: Stale) -> Result<Claim, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn renew(&self, _: &tower_idempotency::store::Lease) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn commit(&self, _: &tower_idempotency::store::Lease) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn commit_with(
        &self,
        _: &tower_idempotency::store::Lease,
        _: &tower_idempotency::store::Receipt,
    ) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn release(&self, _: &tower_idempotency::store::Lease) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn give_back(&self, _: &tower_idempotency::store::Lease) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn describe(
        &self,
        _: &IdempotencyKey,
    ) -> Result<Option<tower_idempotency::store::KeyRecord>, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn stuck_claims(
        &self,
        _: Duration,
    ) -> Result<Vec<tower_idempotency::store::StuckClaim>, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn resolve(
        &self,
        _: &IdempotencyKey,
        _: tower_idempotency::store::Resolution,
    ) -> Result<bool, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
    async fn purge_completed(&self, _: Duration) -> Result<u64, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
}

fn delivery(id: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", id)
        .body(Full::default())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_counted_by_outcome() {
    let values = Values::default();
    metrics::set_global_recorder(values.clone()).expect("the only recorder of this binary");
    let store = MemoryStore::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (gate, started) = (gate.clone(), started.clone());
        service_fn(move |req: Request<_>| {
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                if req.headers()["x-event-id"] == "slow" {
                    started.notify_one();
                    gate.notified().await;
                }
                Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::default()))
            }
        })
    };
    let layer = |store: MemoryStore, stale: Stale| {
        IdempotencyLayer::new(store)
            .key(key::header("x-event-id").namespace("acme"))
            .stale(stale)
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer(store.clone(), Stale::default()))
        .service(handler.clone());

    // New, then duplicate.
    assert_eq!(
        svc.clone().oneshot(delivery("e1")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(delivery("e1")).await.unwrap().status(),
        StatusCode::OK
    );
    // In flight: a slow first delivery, and a copy meanwhile.
    // Its handler running, so that the copy cannot claim first (the gauge counts a delivery
    // from before its claim).
    let slow = tokio::spawn(svc.clone().oneshot(delivery("slow")));
    started.notified().await;
    assert_eq!(values.get("idempotency_claims_in_flight{}"), 1.0);
    let copy = svc.clone().oneshot(delivery("slow")).await.unwrap();
    assert_eq!(copy.status(), StatusCode::CONFLICT);
    gate.notify_one();
    slow.await.unwrap().unwrap();
    // Held: a claim whose owner never renews it, under hold.
    let scoped = IdempotencyKey::new("acme", "held").unwrap();
    let Claim::Acquired(_abandoned) = store.claim(&scoped, Stale::default()).await.unwrap() else {
        panic!("a new key")
    };
    let holding = tower::ServiceBuilder::new()
        .layer(layer(
            store.clone(),
            Stale::hold_after(Duration::from_millis(1)),
        ))
        .service(handler.clone());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        holding.oneshot(delivery("held")).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    // Store down.
    let down = tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::new(Down).key(key::header("x-event-id").namespace("acme")))
        .service(handler);
    let res = down.oneshot(delivery("e2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    let deliveries = |outcome: &str| {
        values.get(&format!(
            "idempotency_deliveries_total{{namespace=acme,outcome={outcome}}}"
        ))
    };
    assert_eq!(deliveries("processed"), 2.0, "e1 and slow");
    assert_eq!(deliveries("duplicate"), 1.0);
    assert_eq!(deliveries("in-flight"), 1.0);
    assert_eq!(deliveries("held"), 1.0);
    assert_eq!(deliveries("store-unavailable"), 1.0);
    assert_eq!(
        values.get("idempotency_handler_duration_seconds{namespace=acme}"),
        2.0,
        "one sample per run"
    );
    assert!(values.get("idempotency_store_duration_seconds{operation=claim}") >= 6.0);
    assert_eq!(
        values.get("idempotency_store_duration_seconds{operation=commit}"),
        2.0
    );
    assert_eq!(
        values.get("idempotency_claims_in_flight{}"),
        0.0,
        "every claim settled"
    );
}
