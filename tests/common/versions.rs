//! The version guard (`tower_idempotency::version_guard`) on a backend: out-of-order
//! deliveries of one entity end in the newest version's state, one version of an entity runs
//! at a time (the `VersionStore` contract is in the conformance suite). Also the harness the layer's own tests in
//! `tests/version_guard.rs` share: a webhook sender's deliveries and a handler that records
//! what it applied.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::sync::{Semaphore, mpsc};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::ResponseBody;
use tower_idempotency::store::Store;
use tower_idempotency::version_guard::{self, VersionGuardLayer, VersionStore};
use tower_idempotency::{IdempotencyLayer, Outcome, key};

use super::{key_in, unique_namespace};

/// A webhook sender's delivery: event `event` sets entity `entity` to `status` at `version`.
pub fn delivery(
    event: &str,
    entity: &str,
    status: &str,
    version: i64,
    behave: &str,
) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "id": event,
        "data": {"object": {"id": entity, "status": status, "version": version}},
    });
    Request::post("/webhooks")
        .header("x-event-id", event)
        .header("x-behave", behave)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The state the handler keeps, and what the test watches.
#[derive(Clone, Default)]
pub struct Business {
    /// entity id -> (version, status): written by the handler without a check of its own.
    pub states: Arc<Mutex<HashMap<String, (i64, String)>>>,
    /// The versions the handler applied, in the order it applied them.
    pub applied: Arc<Mutex<Vec<i64>>>,
    pub runs: Arc<AtomicUsize>,
    /// Handlers running right now, and whether two ever ran at once.
    pub active: Arc<AtomicUsize>,
    pub overlapped: Arc<AtomicBool>,
}

impl Business {
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub fn state(&self, entity: &str) -> Option<(i64, String)> {
        self.states.lock().unwrap().get(entity).cloned()
    }
}

/// Counts a running handler down even when its future is dropped.
pub struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
pub struct Handler {
    business: Business,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<i64>,
}

/// The webhook handler: writes the event's status, unconditionally, and behaves as `x-behave`
/// says (`ok`, `slow`, `500`, `block`: wait for a permit of `gate` after announcing itself).
pub fn handler<B>(
    h: Handler,
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = impl Send>
+ Clone
+ Send
+ 'static
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Debug,
{
    service_fn(move |req: Request<B>| {
        let h = h.clone();
        async move {
            let b = &h.business;
            b.runs.fetch_add(1, Ordering::SeqCst);
            if b.active.fetch_add(1, Ordering::SeqCst) > 0 {
                b.overlapped.store(true, Ordering::SeqCst);
            }
            let _running = Running(b.active.clone());
            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let object = &event["data"]["object"];
            let (id, status) = (
                object["id"].as_str().unwrap(),
                object["status"].as_str().unwrap(),
            );
            let version = object["version"].as_i64().unwrap();
            match behave.as_str() {
                "block" => {
                    let _ = h.started.send(version);
                    h.gate.acquire().await.unwrap().forget();
                }
                "slow" => tokio::time::sleep(Duration::from_millis(5)).await,
                _ => {}
            }
            let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
            if behave == "500" {
                *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return Ok(res);
            }
            b.states
                .lock()
                .unwrap()
                .insert(id.to_owned(), (version, status.to_owned()));
            b.applied.lock().unwrap().push(version);
            Ok(res)
        }
    })
}

pub struct Harness {
    pub handler: Handler,
    pub business: Business,
    pub gate: Arc<Semaphore>,
    pub started: mpsc::UnboundedReceiver<i64>,
}

impl Harness {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let business = Business::default();
        let gate = Arc::new(Semaphore::new(0));
        Self {
            handler: Handler {
                business: business.clone(),
                gate: gate.clone(),
                started: tx,
            },
            business,
            gate,
            started: rx,
        }
    }
}

pub type OrderedRes = Response<ResponseBody<Full<Bytes>>>;

pub fn order_layer<St: VersionStore + Clone>(
    store: St,
    ns: &str,
) -> VersionGuardLayer<St, key::Json, version_guard::version::Json> {
    VersionGuardLayer::new(store)
        .entity(key::json("/data/object/id").namespace(ns.to_owned()))
        .version(version_guard::version::json("/data/object/version"))
        .retry_after(Duration::from_secs(2))
}

/// The version guard alone around the handler.
pub fn ordered<St: VersionStore + Clone>(
    store: St,
    ns: &str,
    h: &Harness,
) -> impl Service<Request<Full<Bytes>>, Response = OrderedRes, Error = Infallible, Future = impl Send>
+ Clone
+ Send
+ 'static {
    order_layer(store, ns).layer(handler(h.handler.clone()))
}

pub fn outcome_header<B>(res: &Response<B>) -> Option<&str> {
    res.headers()
        .get("idempotency-outcome")
        .map(|v| v.to_str().unwrap())
}

/// Delivers like a sender: again after every non-2xx answer (409 busy, 503, a 500 from a
/// deadlocked transaction), a little later each time, until it is acknowledged.
pub async fn deliver_until_acknowledged<Svc, B>(svc: Svc, make: impl Fn() -> Request<Full<Bytes>>)
where
    Svc: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    Svc::Error: Debug,
{
    for attempt in 0..400u64 {
        let res = svc.clone().oneshot(make()).await.unwrap();
        if res.status().is_success() {
            return;
        }
        assert!(
            [
                StatusCode::CONFLICT,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::INTERNAL_SERVER_ERROR
            ]
            .contains(&res.status()),
            "unexpected {}",
            res.status()
        );
        if res.status() == StatusCode::CONFLICT {
            assert!(res.headers().contains_key("retry-after"));
        }
        tokio::time::sleep(Duration::from_millis(5 + attempt % 7 * 3)).await;
    }
    panic!("a delivery was not acknowledged after 400 attempts");
}

/// A small xorshift generator: the order of the deliveries, reproducible from its seed.
pub struct Shuffle(pub u64);

impl Shuffle {
    pub fn seeded() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Self((nanos as u64) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

// ---- The layer, once per backend ----

/// Two events for one entity in reverse order: the newer state wins, the older one is
/// acknowledged (200, `outdated`) without running the handler.
pub async fn reverse_order_newer_wins<St: VersionStore + Clone>(store: St) {
    let ns = unique_namespace("reverse");
    let h = Harness::new();
    let svc = ordered(store.clone(), &ns, &h);

    // `cancelled` (version 2) overtakes `active` (version 1).
    let res = svc
        .clone()
        .oneshot(delivery("evt_2", "sub_1", "cancelled", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = svc
        .clone()
        .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome_header(&res), Some("outdated"));
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Outdated));
    assert!(
        res.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty()
    );

    assert_eq!(
        h.business.runs(),
        1,
        "the outdated event did not run the handler"
    );
    assert_eq!(h.business.state("sub_1"), Some((2, "cancelled".into())));
    let entity = key_in(&ns, "sub_1");
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    // In order, both apply; a failure applies nothing and the retry runs.
    let res = svc
        .clone()
        .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "500"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    let res = svc
        .clone()
        .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = svc
        .oneshot(delivery("evt_4", "sub_1", "active", 4, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.business.state("sub_1"), Some((4, "active".into())));
    assert_eq!(*h.business.applied.lock().unwrap(), [2, 3, 4]);
}

/// Deduplication outside, ordering inside (the recommended stack): two different changes with
/// the same version (a timestamp in whole seconds) both run; the redeliveries of each are
/// duplicates, answered outside; an older version is outdated.
pub async fn equal_version_runs_and_redeliveries_are_duplicates<
    St: Store + VersionStore + Clone,
>(
    store: St,
) {
    let ns = unique_namespace("equal");
    let h = Harness::new();
    let svc = IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace(ns.clone()))
        .layer(order_layer(store.clone(), &ns).layer(handler(h.handler.clone())));
    let entity = key_in(&ns, "sub_1");

    let res = svc
        .clone()
        .oneshot(delivery("evt_a", "sub_1", "active", 7, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome_header(&res), None, "the handler's own response");
    let res = svc
        .clone()
        .oneshot(delivery("evt_a", "sub_1", "active", 7, "ok"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("duplicate"));
    // Another change in the same second: the same version under a new event id. It runs.
    let res = svc
        .clone()
        .oneshot(delivery("evt_b", "sub_1", "past_due", 7, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome_header(&res), None, "the handler's own response");
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(7));
    let res = svc
        .clone()
        .oneshot(delivery("evt_b", "sub_1", "past_due", 7, "ok"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("duplicate"));
    // An older version is outdated; the outer layer still commits its key, so its
    // duplicates are duplicates.
    let res = svc
        .clone()
        .oneshot(delivery("evt_c", "sub_1", "incomplete", 6, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome_header(&res), Some("outdated"));
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Outdated));
    let res = svc
        .oneshot(delivery("evt_c", "sub_1", "incomplete", 6, "ok"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("duplicate"));

    assert_eq!(h.business.runs(), 2);
    assert_eq!(*h.business.applied.lock().unwrap(), [7, 7]);
    assert_eq!(h.business.state("sub_1"), Some((7, "past_due".into())));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(7));
}

/// The version guard alone: an equal version runs and leaves the applied version as it was,
/// so a redelivery of the latest version runs again (what the docs say); an older one is
/// outdated.
pub async fn equal_version_runs_with_the_guard_alone<St: VersionStore + Clone>(store: St) {
    let ns = unique_namespace("equal-alone");
    let h = Harness::new();
    let svc = ordered(store.clone(), &ns, &h);
    let entity = key_in(&ns, "sub_1");

    let res = svc
        .clone()
        .oneshot(delivery("evt_1", "sub_1", "active", 3, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    // Two different changes with the same timestamp: both run, the later one's state stays.
    let res = svc
        .clone()
        .oneshot(delivery("evt_2", "sub_1", "cancelled", 3, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(outcome_header(&res), None);
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
    assert_eq!(h.business.state("sub_1"), Some((3, "cancelled".into())));
    // An equal version that fails applies nothing, and leaves the applied version as it was.
    let res = svc
        .clone()
        .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "500"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
    // The guard alone cannot tell a redelivery from another change: it runs again.
    let res = svc
        .clone()
        .oneshot(delivery("evt_2", "sub_1", "cancelled", 3, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    // Older: outdated, not run.
    let res = svc
        .oneshot(delivery("evt_0", "sub_1", "incomplete", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome_header(&res), Some("outdated"));
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Outdated));

    assert_eq!(
        h.business.runs(),
        4,
        "three equal versions and the first ran"
    );
    assert_eq!(*h.business.applied.lock().unwrap(), [3, 3, 3]);
    assert_eq!(h.business.state("sub_1"), Some((3, "cancelled".into())));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
}

/// Deliveries of a version equal to the applied one still take the pending slot one at a time:
/// while one runs, another of the same version answers 409 and does not run; it runs once the
/// first is done.
pub async fn equal_versions_take_the_pending_slot_one_at_a_time<St: VersionStore + Clone>(
    store: St,
) {
    let ns = unique_namespace("equal-busy");
    let mut h = Harness::new();
    let svc = ordered(store.clone(), &ns, &h);
    let entity = key_in(&ns, "sub_1");

    let res = svc
        .clone()
        .oneshot(delivery("evt_1", "sub_1", "active", 5, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let first =
        tokio::spawn(
            svc.clone()
                .oneshot(delivery("evt_2", "sub_1", "cancelled", 5, "block")),
        );
    assert_eq!(h.started.recv().await, Some(5));
    for event in ["evt_3", "evt_2"] {
        let res = svc
            .clone()
            .oneshot(delivery(event, "sub_1", "past_due", 5, "ok"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CONFLICT, "{event}");
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::InFlight));
    }
    // An older version is outdated even while an equal one runs.
    let res = svc
        .clone()
        .oneshot(delivery("evt_0", "sub_1", "incomplete", 4, "ok"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("outdated"));
    assert_eq!(h.business.runs(), 2);

    h.gate.add_permits(1);
    let res = first.await.unwrap().unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = svc
        .oneshot(delivery("evt_3", "sub_1", "past_due", 5, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.business.runs(), 3);
    assert!(!h.business.overlapped.load(Ordering::SeqCst));
    assert_eq!(h.business.state("sub_1"), Some((5, "past_due".into())));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
}

/// While one version of an entity is being applied, another answers 409 with `Retry-After`
/// and does not run; other entities are not held up.
pub async fn busy_entity_answers_409<St: VersionStore + Clone>(store: St) {
    let ns = unique_namespace("busy");
    let mut h = Harness::new();
    let svc = ordered(store.clone(), &ns, &h);

    let first = tokio::spawn(
        svc.clone()
            .oneshot(delivery("evt_1", "sub_1", "active", 1, "block")),
    );
    assert_eq!(h.started.recv().await, Some(1));
    for (version, status) in [(2, "cancelled"), (1, "active"), (0, "incomplete")] {
        let res = svc
            .clone()
            .oneshot(delivery("evt_x", "sub_1", status, version, "ok"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CONFLICT, "version {version}");
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(outcome_header(&res), Some("in-flight"));
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::InFlight));
    }
    let other = svc
        .clone()
        .oneshot(delivery("evt_9", "sub_2", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another entity runs meanwhile"
    );
    assert_eq!(h.business.runs(), 2);

    h.gate.add_permits(1);
    let res = first.await.unwrap().unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = svc
        .oneshot(delivery("evt_2", "sub_1", "cancelled", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.business.state("sub_1"), Some((2, "cancelled".into())));
}

/// A delivery whose future is dropped mid-handler (the client went away) runs on to the end
/// and applies its version: the retry is answered busy while it runs. After, the guard alone
/// runs it again (an equal version runs; `IdempotencyLayer` outside would answer it
/// `duplicate`), and an older version is outdated.
pub async fn dropped_future_runs_on_and_applies<St: VersionStore + Clone>(store: St) {
    let ns = unique_namespace("dropped");
    let mut h = Harness::new();
    let svc = ordered(store.clone(), &ns, &h);

    let mut fut = Box::pin(
        svc.clone()
            .oneshot(delivery("evt_1", "sub_1", "active", 1, "block")),
    );
    tokio::select! {
        _ = &mut fut => panic!("the handler should block"),
        v = h.started.recv() => assert_eq!(v, Some(1)),
    }
    drop(fut);
    let retry = svc
        .clone()
        .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT, "still being applied");
    h.gate.add_permits(1);
    let entity = key_in(&ns, "sub_1");
    for _ in 0..400 {
        if store.applied_version(&entity).await.unwrap() == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(1));
    assert_eq!(h.business.state("sub_1"), Some((1, "active".into())));
    assert_eq!(h.business.runs(), 1);
    let retry = svc
        .clone()
        .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(
        retry.extensions().get::<Outcome>(),
        Some(&Outcome::Processed)
    );
    assert_eq!(h.business.runs(), 2);
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(1));
    let older = svc
        .oneshot(delivery("evt_0", "sub_1", "incomplete", 0, "ok"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&older), Some("outdated"));
    assert_eq!(h.business.runs(), 2);
}

/// 16 versions of one entity delivered at once, in random order, over several instances
/// (store handles with pools of their own), each retried by its sender until acknowledged:
/// the handler never runs two versions at once, applies versions only in increasing order, and
/// the final state is the newest version's.
pub async fn sixteen_versions_in_random_order<St: VersionStore + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("random");
    let h = Harness::new();
    let services: Vec<_> = stores.iter().map(|s| ordered(s.clone(), &ns, &h)).collect();
    let mut versions: Vec<i64> = (1..=16).collect();
    let mut rng = Shuffle::seeded();
    let seed = rng.0;
    rng.shuffle(&mut versions);

    let tasks: Vec<_> = versions
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let svc = services[i % services.len()].clone();
            tokio::spawn(deliver_until_acknowledged(svc, move || {
                delivery(
                    &format!("evt_{v}"),
                    "sub_1",
                    &format!("status-{v}"),
                    v,
                    "slow",
                )
            }))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let context = format!("seed {seed}, order {versions:?}");
    assert_eq!(
        h.business.state("sub_1"),
        Some((16, "status-16".into())),
        "{context}"
    );
    let applied = h.business.applied.lock().unwrap().clone();
    assert!(
        applied.windows(2).all(|w| w[0] < w[1]),
        "applied out of order: {applied:?} ({context})"
    );
    assert_eq!(applied.last(), Some(&16), "{context}");
    assert!(!h.business.overlapped.load(Ordering::SeqCst), "{context}");
    let entity = key_in(&ns, "sub_1");
    assert_eq!(stores[0].applied_version(&entity).await.unwrap(), Some(16));
}

/// 16 different events, two per version (two changes in the same second), delivered at once
/// in random order over several instances, each retried until acknowledged: the handler never
/// runs two deliveries at once, the versions it applies never go down, both changes of the
/// newest version run, and the applied version is the newest.
pub async fn pairs_of_equal_versions_in_random_order<St: VersionStore + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("random-pairs");
    let h = Harness::new();
    let services: Vec<_> = stores.iter().map(|s| ordered(s.clone(), &ns, &h)).collect();
    let mut events: Vec<(i64, char)> = (1..=8).flat_map(|v| [(v, 'a'), (v, 'b')]).collect();
    let mut rng = Shuffle::seeded();
    let seed = rng.0;
    rng.shuffle(&mut events);

    let tasks: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, &(v, change))| {
            let svc = services[i % services.len()].clone();
            tokio::spawn(deliver_until_acknowledged(svc, move || {
                delivery(
                    &format!("evt_{v}{change}"),
                    "sub_1",
                    &format!("status-{v}{change}"),
                    v,
                    "slow",
                )
            }))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let context = format!("seed {seed}, order {events:?}");
    let applied = h.business.applied.lock().unwrap().clone();
    assert!(
        applied.windows(2).all(|w| w[0] <= w[1]),
        "applied out of order: {applied:?} ({context})"
    );
    assert_eq!(
        applied.iter().filter(|&&v| v == 8).count(),
        2,
        "both changes of the newest version ran: {applied:?} ({context})"
    );
    let (version, status) = h.business.state("sub_1").unwrap();
    assert_eq!(version, 8, "{context}");
    assert!(
        ["status-8a", "status-8b"].contains(&status.as_str()),
        "{status} ({context})"
    );
    assert!(!h.business.overlapped.load(Ordering::SeqCst), "{context}");
    let entity = key_in(&ns, "sub_1");
    assert_eq!(stores[0].applied_version(&entity).await.unwrap(), Some(8));
}

/// The `versions` arm of [`backend_suite!`](crate::backend_suite): module `version_guard`, the
/// version guard on the backend (once alone, once inside `IdempotencyLayer`); the
/// `VersionStore` contract is the conformance suite's `versions` module. `$make` builds a
/// store (`None` skips); the tests over four instances call `$instance` (`$make` unless given)
/// four times, one app instance each.
#[macro_export]
macro_rules! versions_suite {
    ($make:expr) => {
        $crate::versions_suite!($make, $make);
    };
    ($make:expr, $instance:expr) => {
        mod version_guard {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reverse_order_newer_wins() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::reverse_order_newer_wins(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_version_runs_and_redeliveries_are_duplicates() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::equal_version_runs_and_redeliveries_are_duplicates(store)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_version_runs_with_the_guard_alone() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::equal_version_runs_with_the_guard_alone(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_versions_take_the_pending_slot_one_at_a_time() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::equal_versions_take_the_pending_slot_one_at_a_time(store)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn busy_entity_answers_409() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::busy_entity_answers_409(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dropped_future_runs_on_and_applies() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::versions::dropped_future_runs_on_and_applies(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sixteen_versions_in_random_order_over_four_instances() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $instance.await else { return };
                    stores.push(store);
                }
                $crate::common::versions::sixteen_versions_in_random_order(stores).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pairs_of_equal_versions_in_random_order_over_four_instances() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $instance.await else { return };
                    stores.push(store);
                }
                $crate::common::versions::pairs_of_equal_versions_in_random_order(stores).await;
            }
        }
    };
}
