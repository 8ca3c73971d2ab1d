//! The version guard (`tower_idempotency::version_guard`) on every backend: out-of-order deliveries of
//! one entity end in the newest version's state, one version of an entity runs at a time, and
//! transactional mode moves the version together with the business write.
//!
//! Backends: memory, a SQLite file (several pools on it), PostgreSQL and MariaDB/MySQL (an
//! unreachable database skips the test, or fails it under `CI`).

#![cfg(feature = "memory")]
// The database suites need the SQL stores; without them, what only they use is unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(unused)
)]

mod common;

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
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{MemoryStore, Resolution, Stale, Store, StoreError};
use tower_idempotency::version_guard::{
    self, PendingVersion, VersionClaim, VersionGuardError, VersionGuardLayer, VersionLease,
    VersionStore,
};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MissingKey, Outcome, key};

use common::{LONG, PAST_SHORT, SHORT, key_in, unique_namespace};

/// A webhook sender's delivery: event `event` sets entity `entity` to `status` at `version`.
fn delivery(
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
struct Business {
    /// entity id -> (version, status): written by the handler without a check of its own.
    states: Arc<Mutex<HashMap<String, (i64, String)>>>,
    /// The versions the handler applied, in the order it applied them.
    applied: Arc<Mutex<Vec<i64>>>,
    runs: Arc<AtomicUsize>,
    /// Handlers running right now, and whether two ever ran at once.
    active: Arc<AtomicUsize>,
    overlapped: Arc<AtomicBool>,
}

impl Business {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn state(&self, entity: &str) -> Option<(i64, String)> {
        self.states.lock().unwrap().get(entity).cloned()
    }
}

/// Counts a running handler down even when its future is dropped.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Handler {
    business: Business,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<i64>,
}

/// The webhook handler: writes the event's status, unconditionally, and behaves as `x-behave`
/// says (`ok`, `slow`, `500`, `block`: wait for a permit of `gate` after announcing itself).
fn handler<B>(
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

struct Harness {
    handler: Handler,
    business: Business,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedReceiver<i64>,
}

impl Harness {
    fn new() -> Self {
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

type OrderedRes = Response<ResponseBody<Full<Bytes>>>;

fn order_layer<St: VersionStore + Clone>(
    store: St,
    ns: &str,
) -> VersionGuardLayer<St, key::Json, version_guard::version::Json> {
    VersionGuardLayer::new(store)
        .entity(key::json("/data/object/id").namespace(ns.to_owned()))
        .version(version_guard::version::json("/data/object/version"))
        .retry_after(Duration::from_secs(2))
}

/// The version guard alone around the handler.
fn ordered<St: VersionStore + Clone>(
    store: St,
    ns: &str,
    h: &Harness,
) -> impl Service<Request<Full<Bytes>>, Response = OrderedRes, Error = Infallible, Future = impl Send>
+ Clone
+ Send
+ 'static {
    order_layer(store, ns).layer(handler(h.handler.clone()))
}

fn outcome_header<B>(res: &Response<B>) -> Option<&str> {
    res.headers()
        .get("idempotency-outcome")
        .map(|v| v.to_str().unwrap())
}

/// Delivers like a sender: again after every non-2xx answer (409 busy, 503, a 500 from a
/// deadlocked transaction), a little later each time, until it is acknowledged.
async fn deliver_until_acknowledged<Svc, B>(svc: Svc, make: impl Fn() -> Request<Full<Bytes>>)
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
struct Shuffle(u64);

impl Shuffle {
    fn seeded() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Self((nanos as u64) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

// ---- The layer, once per backend ----

/// Two events for one entity in reverse order: the newer state wins, the older one is
/// acknowledged (200, `outdated`) without running the handler.
async fn reverse_order_newer_wins<St: VersionStore + Clone>(store: St) {
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
async fn equal_version_runs_and_redeliveries_are_duplicates<St: Store + VersionStore + Clone>(
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
async fn equal_version_runs_with_the_guard_alone<St: VersionStore + Clone>(store: St) {
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
async fn equal_versions_take_the_pending_slot_one_at_a_time<St: VersionStore + Clone>(store: St) {
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
async fn busy_entity_answers_409<St: VersionStore + Clone>(store: St) {
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
async fn dropped_future_runs_on_and_applies<St: VersionStore + Clone>(store: St) {
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
async fn sixteen_versions_in_random_order<St: VersionStore + Clone>(stores: Vec<St>) {
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
async fn pairs_of_equal_versions_in_random_order<St: VersionStore + Clone>(stores: Vec<St>) {
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

// ---- The store contract, once per backend ----

async fn acquire_version<St: VersionStore>(
    store: &St,
    entity: &IdempotencyKey,
    version: i64,
    stale: Stale,
) -> VersionLease {
    match store.begin_version(entity, version, stale).await.unwrap() {
        VersionClaim::Acquired(lease) => lease,
        other => panic!("expected to begin {entity} at {version}, got {other:?}"),
    }
}

async fn version_store_contract<St: VersionStore>(store: St) {
    let ns = unique_namespace("versions");
    let entity = key_in(&ns, "sub_1");
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let first = acquire_version(&store, &entity, 2, LONG).await;
    assert_eq!((first.entity(), first.version()), (&entity, 2));
    for version in [1, 2, 3] {
        match store.begin_version(&entity, version, LONG).await.unwrap() {
            VersionClaim::Busy(PendingVersion { version: 2, .. }) => {}
            other => panic!("expected busy for {version}, got {other:?}"),
        }
    }
    store.release_version(&first).await.unwrap();
    assert!(matches!(
        store.release_version(&first).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.commit_version(&first).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let again = acquire_version(&store, &entity, 2, LONG).await;
    assert_ne!(again.token(), first.token());
    store.commit_version(&again).await.unwrap();
    assert!(matches!(
        store.commit_version(&again).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    // Only an older version is outdated.
    for version in [1, -5] {
        assert_eq!(
            store.begin_version(&entity, version, LONG).await.unwrap(),
            VersionClaim::Outdated { applied: 2 }
        );
    }
    // An equal version (another change in the same second) takes the slot like a newer one,
    // one delivery at a time: the same version again waits behind it.
    let equal = acquire_version(&store, &entity, 2, LONG).await;
    assert_ne!(equal.token(), again.token());
    for version in [2, 3] {
        match store.begin_version(&entity, version, LONG).await.unwrap() {
            VersionClaim::Busy(PendingVersion { version: 2, .. }) => {}
            other => panic!("expected busy for {version}, got {other:?}"),
        }
    }
    assert_eq!(
        store.begin_version(&entity, 1, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 2 }
    );
    store.commit_version(&equal).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    // A released equal version leaves the applied one as it was.
    let equal = acquire_version(&store, &entity, 2, LONG).await;
    store.release_version(&equal).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    let newer = acquire_version(&store, &entity, 5, LONG).await;
    // Outdated wins over busy: a version older than the applied one never waits; an equal
    // one does.
    assert_eq!(
        store.begin_version(&entity, 1, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 2 }
    );
    match store.begin_version(&entity, 2, LONG).await.unwrap() {
        VersionClaim::Busy(PendingVersion { version: 5, .. }) => {}
        other => panic!("expected busy for the applied version, got {other:?}"),
    }
    store.commit_version(&newer).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
    assert_eq!(
        store.begin_version(&entity, 2, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 5 }
    );

    // Other entities, and the same id in another namespace, are independent.
    acquire_version(&store, &key_in(&ns, "sub_2"), 1, LONG).await;
    acquire_version(&store, &key_in(&format!("{ns}-other"), "sub_1"), 1, LONG).await;
    // Versions are full 64-bit integers: microsecond timestamps, negative ones too.
    let wide = key_in(&ns, "wide");
    for version in [i64::MIN + 1, -1, 1_714_572_003_250_000, i64::MAX] {
        let lease = acquire_version(&store, &wide, version, LONG).await;
        store.commit_version(&lease).await.unwrap();
        assert_eq!(store.applied_version(&wide).await.unwrap(), Some(version));
    }
}

async fn stale_pending_version_reclaim_hold_and_resolve<St: VersionStore>(store: St) {
    let ns = unique_namespace("stale-versions");
    let entity = key_in(&ns, "sub_1");
    let old = acquire_version(&store, &entity, 1, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert!(matches!(
        store.begin_version(&entity, 2, LONG).await.unwrap(),
        VersionClaim::Busy(_)
    ));
    match store
        .begin_version(&entity, 2, Stale::hold_after(SHORT))
        .await
        .unwrap()
    {
        VersionClaim::Held(pending) => {
            assert_eq!(pending.version, 1);
            assert!(pending.age >= SHORT, "age {:?}", pending.age);
        }
        other => panic!("expected held, got {other:?}"),
    }
    // Reclaim: the new version takes over; the old owner is fenced off.
    let new = acquire_version(&store, &entity, 2, Stale::reclaim_after(SHORT)).await;
    assert!(matches!(
        store.commit_version(&old).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.release_version(&old).await,
        Err(StoreError::LeaseLost)
    ));
    match store.begin_version(&entity, 3, LONG).await.unwrap() {
        // The takeover restarted the pending version's clock.
        VersionClaim::Busy(p) => assert!(p.version == 2 && p.age < PAST_SHORT, "{p:?}"),
        other => panic!("expected busy, got {other:?}"),
    }
    store.commit_version(&new).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    // A stale pending version is never taken over by an older one: its owner may have written
    // its state before it died.
    let newer = key_in(&ns, "sub_3");
    acquire_version(&store, &newer, 5, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    match store
        .begin_version(&newer, 4, Stale::reclaim_after(SHORT))
        .await
        .unwrap()
    {
        VersionClaim::Busy(p) => assert_eq!(p.version, 5),
        other => panic!("an older version must not take over, got {other:?}"),
    }
    // The same version (its sender's retry) or a newer one may.
    let retry = acquire_version(&store, &newer, 5, Stale::reclaim_after(SHORT)).await;
    store.commit_version(&retry).await.unwrap();
    assert_eq!(store.applied_version(&newer).await.unwrap(), Some(5));

    // A person settles held versions.
    let held = key_in(&ns, "sub_2");
    let lease = acquire_version(&store, &held, 7, LONG).await;
    assert!(
        store
            .resolve_version(&held, Resolution::Done)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve_version(&held, Resolution::Done)
            .await
            .unwrap()
    );
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert!(matches!(
        store.commit_version(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    let lease = acquire_version(&store, &held, 8, LONG).await;
    assert!(
        store
            .resolve_version(&held, Resolution::Release)
            .await
            .unwrap()
    );
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert!(matches!(
        store.release_version(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    acquire_version(&store, &held, 8, LONG).await;
    assert!(
        !store
            .resolve_version(&key_in(&ns, "absent"), Resolution::Release)
            .await
            .unwrap()
    );
}

/// Generates the layer and store tests for one backend. `$make` builds a store (`None`
/// skips), `$instances` four store handles that share one database (separate pools).
macro_rules! order_suite {
    ($module:ident, $feature:literal, $make:expr, $instances:expr) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reverse_order_newer_wins() {
                let Some(store) = $make.await else { return };
                super::reverse_order_newer_wins(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_version_runs_and_redeliveries_are_duplicates() {
                let Some(store) = $make.await else { return };
                super::equal_version_runs_and_redeliveries_are_duplicates(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_version_runs_with_the_guard_alone() {
                let Some(store) = $make.await else { return };
                super::equal_version_runs_with_the_guard_alone(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn equal_versions_take_the_pending_slot_one_at_a_time() {
                let Some(store) = $make.await else { return };
                super::equal_versions_take_the_pending_slot_one_at_a_time(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn busy_entity_answers_409() {
                let Some(store) = $make.await else { return };
                super::busy_entity_answers_409(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dropped_future_runs_on_and_applies() {
                let Some(store) = $make.await else { return };
                super::dropped_future_runs_on_and_applies(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sixteen_versions_in_random_order_over_four_instances() {
                let Some(stores) = $instances.await else {
                    return;
                };
                super::sixteen_versions_in_random_order(stores).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pairs_of_equal_versions_in_random_order_over_four_instances() {
                let Some(stores) = $instances.await else {
                    return;
                };
                super::pairs_of_equal_versions_in_random_order(stores).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn version_store_contract() {
                let Some(store) = $make.await else { return };
                super::version_store_contract(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stale_pending_version_reclaim_hold_and_resolve() {
                let Some(store) = $make.await else { return };
                super::stale_pending_version_reclaim_hold_and_resolve(store).await;
            }
        }
    };
}

/// Four handles on one database, each with a pool of its own.
macro_rules! four {
    ($make:expr) => {
        async {
            let mut stores = Vec::new();
            for _ in 0..4 {
                stores.push($make.await?);
            }
            Some(stores)
        }
    };
}

order_suite!(
    memory,
    "memory",
    async { Some(MemoryStore::new()) },
    async {
        // One process: the instances share one store.
        let store = MemoryStore::new();
        Some(vec![store.clone(), store.clone(), store.clone(), store])
    }
);
#[cfg(feature = "sqlite")]
async fn sqlite_store() -> Option<tower_idempotency::store::SqliteStore> {
    common::db::sqlite_file_store("order").await
}
order_suite!(sqlite, "sqlite", sqlite_store(), four!(sqlite_store()));
order_suite!(
    postgres,
    "postgres",
    common::db::postgres_store(),
    four!(common::db::postgres_store())
);
order_suite!(
    mysql,
    "mysql",
    common::db::mysql_store(),
    four!(common::db::mysql_store())
);
// MySQL's way (an upsert, then a read unless it inserted), run on whichever server is there.
#[cfg(feature = "mysql")]
async fn mysql_two_step() -> Option<tower_idempotency::store::MySqlStore> {
    let store = common::db::mysql_store().await?;
    Some(store.with_flavor(tower_idempotency::store::MySqlFlavor::MySql))
}
order_suite!(
    mysql_two_step,
    "mysql",
    mysql_two_step(),
    four!(mysql_two_step())
);

// ---- What the layer answers by itself (memory) ----

async fn problem<B: Body<Data = Bytes>>(res: Response<B>) -> serde_json::Value
where
    B::Error: Debug,
{
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

fn raw(body: &str) -> Request<Full<Bytes>> {
    Request::post("/webhooks")
        .header("x-behave", "ok")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

#[tokio::test]
async fn missing_or_invalid_entity_and_version_are_400() {
    let h = Harness::new();
    let svc = ordered(MemoryStore::new(), "subscription", &h);
    let cases = [
        (
            r#"{"data":{"object":{"version":1}}}"#,
            "no entity id found: expected JSON field `/data/object/id`",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1"}}}"#,
            "no version found: expected JSON field `/data/object/version`",
        ),
        (
            r#"{"data":{"object":{"id":"","version":1}}}"#,
            "invalid entity id",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1","version":"yesterday"}}}"#,
            "invalid version",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1","version":1.5}}}"#,
            "invalid version",
        ),
        // What is wrong is reported before what is absent.
        (r#"{"data":{"object":{"version":true}}}"#, "invalid version"),
        ("not json", "not valid JSON"),
    ];
    for (body, detail) in cases {
        let res = svc.clone().oneshot(raw(body)).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Rejected));
        assert!(res.extensions().get::<VersionGuardError>().is_some());
        let problem = problem(res).await;
        let got = problem["detail"].as_str().unwrap();
        assert!(got.contains(detail), "{body}: {got}");
    }
    let res = svc.clone().oneshot(raw(r#"{"data":{}}"#)).await.unwrap();
    assert_eq!(
        problem(res).await["expected"],
        "JSON field `/data/object/id`"
    );
    assert_eq!(h.business.runs(), 0);
}

#[tokio::test]
async fn missing_entity_can_pass_through_but_invalid_cannot() {
    let h = Harness::new();
    let svc = order_layer(MemoryStore::new(), "subscription")
        .missing_key(MissingKey::PassThrough)
        .layer(handler(h.handler.clone()));
    for invalid in [
        r#"{"data":{"object":{"id":"sub_1","version":"soon"}}}"#,
        r#"{"data":{"object":{"id":"","version":1}}}"#,
        r#"{"data":{"object":{"version":false}}}"#,
    ] {
        let res = svc.clone().oneshot(raw(invalid)).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{invalid}");
    }
    assert_eq!(h.business.runs(), 0);

    // A `ping` without an object runs the handler unordered.
    let passes = service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let svc = order_layer(MemoryStore::new(), "subscription")
        .missing_key(MissingKey::PassThrough)
        .layer(passes);
    let res = svc.oneshot(raw(r#"{"type":"ping"}"#)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<Outcome>(),
        Some(&Outcome::PassedThrough)
    );
}

#[tokio::test]
async fn header_extractors_leave_the_body_alone_and_it_arrives_intact() {
    let store = MemoryStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_handler = seen.clone();
    let echo = service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
        let seen = seen_by_handler.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            seen.lock().unwrap().push(body);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let headers = VersionGuardLayer::new(store.clone())
        .entity(key::header("x-entity").namespace("acme"))
        .version(version_guard::version::header("x-version"))
        .layer(echo.clone());
    let send = |version: &str, body: &'static str| {
        Request::post("/")
            .header("x-entity", "order_1")
            .header("x-version", version)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let res = headers
        .clone()
        .oneshot(send("2024-05-01T14:00:03Z", "not json at all"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = headers
        .oneshot(send("2024-05-01T16:00:01+02:00", "older"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("outdated"));
    let entity = IdempotencyKey::new("acme", "order_1").unwrap();
    assert_eq!(
        store.applied_version(&entity).await.unwrap(),
        Some(1_714_572_003_000_000)
    );

    // Body extractors buffer it, and the handler still reads every byte.
    let json = order_layer(store, "acme-json").layer(echo);
    let event = r#"{"data":{"object":{"id":"o","version":3}},"padding":"ééé"}"#;
    json.oneshot(raw(event)).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["not json at all", event]);
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let h = Harness::new();
    let svc = order_layer(MemoryStore::new(), "subscription")
        .body_limit(64)
        .layer(handler(h.handler.clone()));
    let big = format!(
        r#"{{"data":{{"object":{{"id":"sub_1","version":1}}}},"pad":"{}"}}"#,
        "x".repeat(100)
    );
    let res = svc.oneshot(raw(&big)).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.business.runs(), 0);
}

#[tokio::test]
async fn panic_releases_the_pending_version_under_reclaim_and_keeps_it_under_hold() {
    let store = MemoryStore::new();
    let panics = service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
        if req.headers()["x-behave"] == "panic" {
            panic!("the handler panicked");
        }
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let reclaim = order_layer(store.clone(), "reclaim").layer(panics);
    let join = tokio::spawn(
        reclaim
            .clone()
            .oneshot(delivery("e", "sub_1", "active", 1, "panic")),
    )
    .await;
    assert!(join.unwrap_err().is_panic());
    let res = reclaim
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));

    let held = Arc::new(AtomicUsize::new(0));
    let hook = held.clone();
    let hold = order_layer(store.clone(), "hold")
        .stale(Stale::hold_after(Duration::from_millis(50)))
        .on_held(move |entity, _pending| {
            assert_eq!(entity.value(), "sub_1");
            hook.fetch_add(1, Ordering::SeqCst);
        })
        .layer(panics);
    let join = tokio::spawn(
        hold.clone()
            .oneshot(delivery("e", "sub_1", "active", 1, "panic")),
    )
    .await;
    assert!(join.unwrap_err().is_panic());
    let res = hold
        .clone()
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "pending, not stale yet");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = hold
        .clone()
        .oneshot(delivery("e", "sub_1", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Held));
    assert!(
        res.headers().get("retry-after").is_none(),
        "only a person can settle it"
    );
    assert_eq!(held.load(Ordering::SeqCst), 1);
    let entity = IdempotencyKey::new("hold", "sub_1").unwrap();
    assert!(
        store
            .resolve_version(&entity, Resolution::Release)
            .await
            .unwrap()
    );
    let res = hold
        .oneshot(delivery("e", "sub_1", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn store_failure_is_503_and_the_handler_does_not_run() {
    let store = sqlite_store().await.unwrap();
    store.pool().close().await;
    let h = Harness::new();
    let res = ordered(store, "down", &h)
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(h.business.runs(), 0);
}

// ---- Legal transitions in a handler ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Incomplete,
    Active,
    Cancelled,
    Expired,
}

impl Status {
    fn parse(s: &str) -> Self {
        match s {
            "incomplete" => Self::Incomplete,
            "active" => Self::Active,
            "cancelled" => Self::Cancelled,
            "expired" => Self::Expired,
            other => panic!("unknown status {other}"),
        }
    }
}

const SUBSCRIPTION: version_guard::Lifecycle<Status> = version_guard::Lifecycle::from_static(&[
    (Status::Incomplete, Status::Active),
    (Status::Incomplete, Status::Expired),
    (Status::Active, Status::Cancelled),
]);

/// The handler checks the lifecycle against the entity's current state: an illegal transition
/// is refused with 409 problem+json and not applied (the version is released, so a retry may
/// run once it is legal); a legal one applies.
#[tokio::test]
async fn illegal_transition_is_refused_and_reported_legal_one_applies() {
    let states = Arc::new(Mutex::new(HashMap::<String, Status>::new()));
    let db = states.clone();
    let svc = order_layer(MemoryStore::new(), "subscription").layer(service_fn(
        move |req: Request<RequestBody<Full<Bytes>>>| {
            let db = db.clone();
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let id = event["data"]["object"]["id"].as_str().unwrap().to_owned();
                let to = Status::parse(event["data"]["object"]["status"].as_str().unwrap());
                let mut db = db.lock().unwrap();
                if let Some(&from) = db.get(&id)
                    && let Err(illegal) = SUBSCRIPTION.check(from, to)
                {
                    return Ok::<_, Infallible>(illegal.to_response::<Full<Bytes>>());
                }
                db.insert(id, to);
                Ok(Response::new(Full::new(Bytes::new())))
            }
        },
    ));
    let send = |status: &str, version: i64| delivery("e", "sub_1", status, version, "ok");

    assert_eq!(
        svc.clone()
            .oneshot(send("incomplete", 1))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone()
            .oneshot(send("expired", 2))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // expired -> active: refused and reported, not applied.
    let res = svc.clone().oneshot(send("active", 3)).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
    let problem = problem(res).await;
    assert_eq!(
        problem["detail"],
        "illegal transition from Expired to Active"
    );
    assert_eq!(
        (problem["from"].as_str(), problem["to"].as_str()),
        (Some("Expired"), Some("Active"))
    );
    assert_eq!(states.lock().unwrap()["sub_1"], Status::Expired);

    // A legal transition on another subscription applies.
    let res = svc
        .clone()
        .oneshot(delivery("e", "sub_2", "incomplete", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = svc
        .oneshot(delivery("e", "sub_2", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(states.lock().unwrap()["sub_2"], Status::Active);
}

// ---- Transactional mode: `version_guard::advance` in the delivery's transaction ----

/// Generates the transactional suite for one SQL backend: `$db` is its database, `$make` and
/// `$instances` as above, `$upsert` writes the business row (id, status, version) counting its
/// writes, `$select` reads (status, version, writes) by id.
macro_rules! advance_suite {
    ($module:ident, $feature:literal, $store:ty, $db:ty, $make:expr, $instances:expr,
     upsert: $upsert:literal, select: $select:literal) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;
            use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
            use tower_idempotency::version_guard::Advance;

            const CREATE: &str = "CREATE TABLE IF NOT EXISTS order_subscriptions (\
                id VARCHAR(255) NOT NULL PRIMARY KEY, status VARCHAR(64) NOT NULL, \
                version BIGINT NOT NULL, writes BIGINT NOT NULL)";

            /// Transactional mode keyed by `x-event-id`; the handler advances the entity's
            /// version in the delivery's transaction and writes the business row only if it is
            /// newer, then behaves as `x-behave` says (`ok`, `slow`, `500` after its writes).
            fn service(
                store: $store,
                ns: &str,
            ) -> impl Service<
                Request<Full<Bytes>>,
                Response = Response<ResponseBody<Full<Bytes>>>,
                Error = Infallible,
                Future = impl Send,
            > + Clone
            + Send
            + 'static {
                let ns = ns.to_owned();
                let handler_store = store.clone();
                let handler_ns = ns.clone();
                TransactionalLayer::new(store)
                    .key(key::header("x-event-id").namespace(ns))
                    .lock_timeout(Duration::from_secs(10))
                    .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                        let (store, ns) = (handler_store.clone(), handler_ns.clone());
                        async move {
                            let answer = |status: StatusCode, body: &'static str| {
                                let mut res =
                                    Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                                *res.status_mut() = status;
                                Ok::<_, Infallible>(res)
                            };
                            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
                            let handle = req.extensions().get::<TxHandle<$db>>().unwrap().clone();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            let object = &event["data"]["object"];
                            let id = format!("{ns}/{}", object["id"].as_str().unwrap());
                            let status = object["status"].as_str().unwrap().to_owned();
                            let version = object["version"].as_i64().unwrap();
                            let entity =
                                IdempotencyKey::new(ns.clone(), object["id"].as_str().unwrap())
                                    .unwrap();

                            let mut tx = handle.lock().unwrap();
                            match version_guard::advance(&mut *tx, &store, &entity, version).await {
                                Ok(Advance::Applied) => {}
                                Ok(Advance::Outdated { .. }) => {
                                    return answer(StatusCode::OK, "outdated");
                                }
                                // A deadlock or lock timeout: the sender retries.
                                Err(_) => {
                                    return answer(
                                        StatusCode::INTERNAL_SERVER_ERROR,
                                        "advance failed",
                                    );
                                }
                            }
                            let written = sqlx::query($upsert)
                                .bind(&id)
                                .bind(&status)
                                .bind(version)
                                .execute(&mut *tx)
                                .await;
                            if written.is_err() {
                                return answer(StatusCode::INTERNAL_SERVER_ERROR, "write failed");
                            }
                            drop(tx);
                            match behave.as_str() {
                                "500" => answer(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "failed after writing",
                                ),
                                "slow" => {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    answer(StatusCode::OK, "applied")
                                }
                                _ => answer(StatusCode::OK, "applied"),
                            }
                        }
                    }))
            }

            async fn setup(store: &$store) {
                sqlx::query(CREATE).execute(store.pool()).await.unwrap();
            }

            async fn business(store: &$store, ns: &str, id: &str) -> Option<(String, i64, i64)> {
                sqlx::query_as($select)
                    .bind(format!("{ns}/{id}"))
                    .fetch_optional(store.pool())
                    .await
                    .unwrap()
            }

            async fn body_text(res: Response<ResponseBody<Full<Bytes>>>) -> String {
                let bytes = res.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(bytes.to_vec()).unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_reverse_order_newer_wins_and_a_500_rolls_back_both() {
                let Some(store) = $make.await else { return };
                setup(&store).await;
                let ns = unique_namespace("advance");
                let svc = service(store.clone(), &ns);
                let entity = key_in(&ns, "sub_1");

                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2", "sub_1", "cancelled", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("cancelled".into(), 2, 1))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

                // Another change with the same version under a new event id: it applies, as
                // the version guard runs it; the applied version stays.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                // A redelivery of that event is the marker's duplicate: the handler does not run.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(outcome_header(&res), Some("duplicate"));
                // An older version under a new event id is outdated, nothing written.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1b", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );

                // A 500 after both writes: the version and the business row roll back together.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "500"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                // The sender's retry applies it.
                let res = svc
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("past_due".into(), 3, 3))
                );
            }

            /// `advance` directly, in two transactions on the store's database: an equal
            /// version counts as advanced, and the entity's row keeps the second transaction
            /// waiting until the first ends; an older version is outdated.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_equal_version_applies_one_transaction_at_a_time() {
                let Some(store) = $make.await else { return };
                let ns = unique_namespace("advance-equal");
                let entity = key_in(&ns, "sub_1");

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.commit().await.unwrap();

                let mut first = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *first, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied,
                    "an equal version advances"
                );
                let (second_store, second_entity) = (store.clone(), entity.clone());
                let mut second = tokio::spawn(async move {
                    let mut tx = second_store.pool().begin().await.unwrap();
                    let advanced =
                        version_guard::advance(&mut *tx, &second_store, &second_entity, 5)
                            .await
                            .unwrap();
                    tx.commit().await.unwrap();
                    advanced
                });
                assert!(
                    tokio::time::timeout(Duration::from_millis(300), &mut second)
                        .await
                        .is_err(),
                    "the second transaction waits for the entity's row"
                );
                first.commit().await.unwrap();
                assert_eq!(second.await.unwrap(), Advance::Applied);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 4)
                        .await
                        .unwrap(),
                    Advance::Outdated { applied: 5 }
                );
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 6)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.rollback().await.unwrap();
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn advance_sixteen_versions_in_random_order_over_four_instances() {
                let Some(stores) = $instances.await else {
                    return;
                };
                let stores: Vec<$store> = stores;
                setup(&stores[0]).await;
                let ns = unique_namespace("advance-random");
                let services: Vec<_> = stores.iter().map(|s| service(s.clone(), &ns)).collect();
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
                let (status, version, writes) = business(&stores[0], &ns, "sub_1").await.unwrap();
                assert_eq!((status.as_str(), version), ("status-16", 16), "{context}");
                assert!((1..=16).contains(&writes), "{writes} writes ({context})");
                let entity = key_in(&ns, "sub_1");
                assert_eq!(
                    stores[0].applied_version(&entity).await.unwrap(),
                    Some(16),
                    "{context}"
                );
            }
        }
    };
}

advance_suite!(advance_sqlite, "sqlite", tower_idempotency::store::SqliteStore, sqlx::Sqlite,
    super::sqlite_store(), four!(super::sqlite_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
             writes = order_subscriptions.writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?1");

advance_suite!(advance_postgres, "postgres", tower_idempotency::store::PostgresStore, sqlx::Postgres,
    common::db::postgres_store(), four!(common::db::postgres_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES ($1, $2, $3, 1) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
             writes = order_subscriptions.writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = $1");

advance_suite!(advance_mysql, "mysql", tower_idempotency::store::MySqlStore, sqlx::MySql,
    common::db::mysql_store(), four!(common::db::mysql_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?, ?, ?, 1) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
             writes = writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?");

advance_suite!(advance_mysql_two_step, "mysql", tower_idempotency::store::MySqlStore, sqlx::MySql,
    super::mysql_two_step(), four!(super::mysql_two_step()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?, ?, ?, 1) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
             writes = writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?");

/// The version guard's former names (the module `order`, `OrderLayer`, `Order`,
/// `OrderError`) still build the same layer, for one release.
#[tokio::test]
#[allow(deprecated)]
async fn former_names_still_work() {
    use tower_idempotency::order::{self, Order, OrderError, OrderLayer};
    let store = MemoryStore::new();
    let svc: Order<_, _, _, _> = OrderLayer::new(store.clone())
        .entity(key::header("x-entity").namespace("acme"))
        .version(order::version::header("x-version"))
        .layer(service_fn(
            |_req: Request<RequestBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));
    let send = |version: &str| {
        Request::post("/")
            .header("x-entity", "order_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(send("2")).await.unwrap().status(),
        StatusCode::OK
    );
    let older = svc.clone().oneshot(send("1")).await.unwrap();
    assert_eq!(older.headers()["idempotency-outcome"], "outdated");
    let refused = svc.oneshot(Request::post("/").body(Full::new(Bytes::new())).unwrap());
    let refused = refused.await.unwrap();
    let error: Option<&OrderError> = refused.extensions().get();
    assert!(error.is_some_and(|e| e.is_missing()));
}

/// The version guard's entities are shared by every route by default: events about one entity
/// that arrive on two endpoints are still applied in order.
#[tokio::test]
async fn an_entity_is_ordered_across_routes() {
    let store = MemoryStore::new();
    let route = || {
        VersionGuardLayer::new(store.clone())
            .entity(key::header("x-entity").namespace("subscription"))
            .version(version_guard::version::header("x-version"))
            .layer(service_fn(
                |_req: Request<RequestBody<Full<Bytes>>>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                },
            ))
    };
    let send = |path: &str, version: &str| {
        Request::post(path)
            .header("x-entity", "sub_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let updated = route().oneshot(send("/hooks/updated", "2")).await.unwrap();
    assert_eq!(updated.status(), StatusCode::OK);
    let late = route().oneshot(send("/hooks/deleted", "1")).await.unwrap();
    assert_eq!(outcome_header(&late), Some("outdated"));
}
