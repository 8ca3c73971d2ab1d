//! The store conformance suite, written once and run against every backend, and the
//! multi-instance races.
//!
//! A backend's test file builds stores and calls `conformance_suite!` and `race_suite!`:
//!
//! ```ignore
//! conformance_suite!(async { Some(MemoryStore::new()) });
//! race_suite!(async { Some(MemoryStore::new()) });
//! ```
//!
//! `$make` yields `Option<S>`: `None` when the backend's database cannot be reached and the
//! test is skipped (see [`unreachable`]; under `CI` it panics instead).
//!
//! Each test works in a namespace of its own, so backends that share one database between
//! tests (and between runs) need no cleaning.

#![allow(dead_code, unreachable_pub)]

pub mod db;
pub mod proxy;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::store::{Claim, KeyState, Lease, Resolution, Store, StoreError};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

/// The database URL in the environment variable `var`, or `default`.
pub fn database_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Connects with `connect` to the database at `url` (from the environment variable `var`).
/// If it cannot be reached, the test fails under `CI` and is skipped (loudly) otherwise; after
/// one failure the other tests of the binary do not wait for the connect timeout again.
pub async fn connect<T, E: std::fmt::Display>(
    var: &str,
    url: &str,
    connect: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    static UNREACHABLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let err = match UNREACHABLE.get() {
        Some(err) => err.clone(),
        None => match connect.await {
            Ok(pool) => return Some(pool),
            Err(err) => UNREACHABLE.get_or_init(|| err.to_string()).clone(),
        },
    };
    if std::env::var_os("CI").is_some() {
        panic!(
            "{var}={url} cannot be reached ({err}); CI is set, so this fails instead of skipping"
        );
    }
    // Straight to stderr, not `eprintln!`, which the test harness captures for passing tests.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {var}={url} cannot be reached ({err}); set {var} to a reachable database"
    );
    None
}

/// A namespace no other test or earlier run uses.
pub fn unique_namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{test}-{}-{nanos:x}-{n}", std::process::id())
}

pub fn key_in(ns: &str, value: &str) -> IdempotencyKey {
    IdempotencyKey::new(ns.to_owned(), value).unwrap()
}

/// The tests of a binary share their backend's table (one SQLite file per binary, one
/// PostgreSQL or MySQL database), and `purge_completed` purges every namespace in it: run
/// alongside the other tests, a test that purges would forget rows they still rely on (a
/// race's late duplicate of a purged event then runs it again), and the two tests that purge
/// would purge each other's rows. Every suite test holds this lock shared; a test that
/// purges holds it alone.
pub static SHARED_TABLE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub const LONG: Stale = Stale::reclaim_after(Duration::from_secs(600));
pub const SHORT: Duration = Duration::from_millis(300);
/// Comfortably past `SHORT`, even on a busy machine.
pub const PAST_SHORT: Duration = Duration::from_millis(700);

pub async fn acquire<S: Store>(store: &S, key: &IdempotencyKey, stale: Stale) -> Lease {
    match store.claim(key, stale).await.unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

pub async fn claim_commit_duplicate<S: Store>(store: S) {
    let ns = unique_namespace("commit");
    let key = key_in(&ns, "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    assert!(!lease.reclaimed());
    assert_eq!(lease.key(), &key);
    match store.claim(&key, LONG).await.unwrap() {
        Claim::InFlight(p) => assert_eq!(p.deliveries, 2),
        other => panic!("expected in flight, got {other:?}"),
    }
    store.commit(&lease).await.unwrap();
    // Committing again with the same lease is harmless (a retried commit).
    store.commit(&lease).await.unwrap();
    match store.claim(&key, LONG).await.unwrap() {
        Claim::Done(done) => assert_eq!(done.deliveries, 3),
        other => panic!("expected done, got {other:?}"),
    }
    // Other keys and other namespaces are independent.
    acquire(&store, &key_in(&ns, "evt_2"), LONG).await;
    acquire(&store, &key_in(&format!("{ns}-other"), "evt_1"), LONG).await;
}

pub async fn release_lets_the_retry_run<S: Store>(store: S) {
    let key = key_in(&unique_namespace("release"), "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    store.release(&lease).await.unwrap();
    let again = acquire(&store, &key, LONG).await;
    assert_ne!(
        again.token(),
        lease.token(),
        "every claim gets a fresh token"
    );
    // The first lease is gone: releasing or committing with it changes nothing.
    assert!(matches!(
        store.release(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.commit(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::InFlight(_)
    ));
    store.commit(&again).await.unwrap();
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    // A done row cannot be released.
    assert!(matches!(
        store.release(&again).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::Done(_)
    ));
}

pub async fn stale_reclaim_fences_the_old_owner<S: Store>(store: S) {
    let key = key_in(&unique_namespace("reclaim"), "evt_1");
    let old = acquire(&store, &key, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    // Not stale under a long limit...
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::InFlight(_)
    ));
    // ...stale under a short one: reclaimed with a new token.
    let new = acquire(&store, &key, Stale::reclaim_after(SHORT)).await;
    assert!(new.reclaimed());
    assert_ne!(new.token(), old.token());
    // The old owner's late commit and release change nothing.
    assert!(matches!(
        store.commit(&old).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.release(&old).await,
        Err(StoreError::LeaseLost)
    ));
    match store.claim(&key, LONG).await.unwrap() {
        // The reclaim restarted the claim's clock: the row is younger than the first claim.
        Claim::InFlight(p) => assert!(p.age < PAST_SHORT, "age {:?}", p.age),
        other => panic!("expected in flight, got {other:?}"),
    }
    store.commit(&new).await.unwrap();
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    assert!(matches!(
        store.commit(&old).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::Done(_)
    ));
}

pub async fn stale_hold_keeps_the_row<S: Store>(store: S) {
    let key = key_in(&unique_namespace("hold"), "evt_1");
    let hold = Stale::hold_after(SHORT);
    let owner = acquire(&store, &key, hold).await;
    assert!(matches!(
        store.claim(&key, hold).await.unwrap(),
        Claim::InFlight(_)
    ));
    tokio::time::sleep(PAST_SHORT).await;
    match store.claim(&key, hold).await.unwrap() {
        Claim::Held(p) => {
            assert!(p.age >= SHORT, "age {:?}", p.age);
            assert_eq!(p.deliveries, 3);
        }
        other => panic!("expected held, got {other:?}"),
    }
    assert!(matches!(
        store.claim(&key, hold).await.unwrap(),
        Claim::Held(_)
    ));
    // The owner may still finish: its lease was never taken over.
    store.commit(&owner).await.unwrap();
    assert!(matches!(
        store.claim(&key, hold).await.unwrap(),
        Claim::Done(_)
    ));
}

pub async fn stuck_claims_and_resolve<S: Store>(store: S) {
    let ns = unique_namespace("stuck");
    let old = key_in(&ns, "old");
    let done = key_in(&ns, "done");
    let young = key_in(&ns, "young");
    let old_lease = acquire(&store, &old, LONG).await;
    let done_lease = acquire(&store, &done, LONG).await;
    store.commit(&done_lease).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    acquire(&store, &young, LONG).await;

    let stuck: Vec<_> = store
        .stuck_claims(SHORT)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.key.namespace() == ns)
        .collect();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].key, old);
    assert!(stuck[0].age >= SHORT);
    assert_eq!(stuck[0].deliveries, 1);

    // Resolve as done: later deliveries are duplicates, the old owner is fenced off.
    assert!(store.resolve(&old, Resolution::Done).await.unwrap());
    assert!(matches!(
        store.claim(&old, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    assert!(matches!(
        store.release(&old_lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.claim(&old, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    // Only processing rows are resolved.
    assert!(!store.resolve(&old, Resolution::Release).await.unwrap());
    assert!(!store.resolve(&done, Resolution::Release).await.unwrap());
    assert!(
        !store
            .resolve(&key_in(&ns, "absent"), Resolution::Done)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&done, LONG).await.unwrap(),
        Claim::Done(_)
    ));

    // Resolve by release: the next delivery runs.
    assert!(store.resolve(&young, Resolution::Release).await.unwrap());
    acquire(&store, &young, LONG).await;
}

pub async fn purge_completed_keeps_recent_and_processing<S: Store>(store: S) {
    let ns = unique_namespace("purge");
    let old_done = key_in(&ns, "old-done");
    let processing = key_in(&ns, "processing");
    let lease = acquire(&store, &old_done, LONG).await;
    store.commit(&lease).await.unwrap();
    acquire(&store, &processing, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    let recent_done = key_in(&ns, "recent-done");
    let lease = acquire(&store, &recent_done, LONG).await;
    store.commit(&lease).await.unwrap();

    let purged = store.purge_completed(SHORT).await.unwrap();
    assert!(purged >= 1, "purged {purged}");
    // The old done key is forgotten: a delivery now runs again.
    acquire(&store, &old_done, LONG).await;
    assert!(matches!(
        store.claim(&recent_done, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    assert!(matches!(
        store.claim(&processing, LONG).await.unwrap(),
        Claim::InFlight(_)
    ));
}

/// A renewal moves the heartbeat: an old claim renewed just now is not stale, and it turns
/// stale one limit after its last renewal.
pub async fn renew_keeps_a_claim_fresh<S: Store>(store: S) {
    let key = key_in(&unique_namespace("renew"), "evt_1");
    let short = Stale::reclaim_after(SHORT);
    let owner = acquire(&store, &key, short).await;
    tokio::time::sleep(PAST_SHORT).await;
    store.renew(&owner).await.unwrap();
    match store.claim(&key, short).await.unwrap() {
        Claim::InFlight(p) => {
            assert!(p.age >= SHORT, "age {:?}", p.age);
            assert!(
                p.since_renewal < SHORT,
                "since renewal {:?}",
                p.since_renewal
            );
        }
        other => panic!("a claim renewed just now is not stale, got {other:?}"),
    }
    assert!(
        store
            .stuck_claims(SHORT)
            .await
            .unwrap()
            .iter()
            .all(|s| s.key != key),
        "a renewed claim is not stuck"
    );
    tokio::time::sleep(PAST_SHORT).await;
    let stuck = store.stuck_claims(SHORT).await.unwrap();
    let listed = stuck.iter().find(|s| s.key == key).expect("stale now");
    assert!(listed.since_renewal >= SHORT && listed.age >= listed.since_renewal);
    let new = acquire(&store, &key, short).await;
    assert!(
        new.reclaimed(),
        "taken over one limit after the last renewal"
    );
    // The old owner is fenced off.
    assert!(matches!(
        store.renew(&owner).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.commit(&owner).await,
        Err(StoreError::LeaseLost)
    ));
    store.renew(&new).await.unwrap();
    store.commit(&new).await.unwrap();
    // Only processing rows are renewed.
    assert!(matches!(
        store.renew(&new).await,
        Err(StoreError::LeaseLost)
    ));
    let released = key_in(&unique_namespace("renew"), "evt_2");
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();
    store.release(&lease).await.unwrap(); // a retried release is harmless
    assert!(matches!(
        store.renew(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.commit(&lease).await,
        Err(StoreError::LeaseLost)
    ));
}

/// The journal: deliveries against runs, through a failed run, a retry and a duplicate; a
/// released row is claimed as if it were new, and purged like a done one.
pub async fn describe_counts_deliveries_and_runs<S: Store>(store: S) {
    let ns = unique_namespace("describe");
    let key = key_in(&ns, "evt_1");
    assert_eq!(store.describe(&key).await.unwrap(), None);

    let first = acquire(&store, &key, LONG).await;
    let record = store.describe(&key).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Processing);
    assert_eq!((record.deliveries, record.runs), (1, 1));
    assert!(!record.reclaimed);
    assert!(record.renewed_ago.is_some() && record.settled_ago.is_none());
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::InFlight(_)
    ));
    store.release(&first).await.unwrap();
    let record = store.describe(&key).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Released);
    assert_eq!((record.deliveries, record.runs), (2, 1));
    assert!(record.settled_ago.is_some() && record.renewed_ago.is_none());
    // A released row is not stuck, and nothing to resolve.
    assert!(
        store
            .stuck_claims(Duration::ZERO)
            .await
            .unwrap()
            .iter()
            .all(|s| s.key != key)
    );
    assert!(!store.resolve(&key, Resolution::Done).await.unwrap());

    // The retry runs again.
    let second = acquire(&store, &key, LONG).await;
    assert!(
        !second.reclaimed(),
        "a released claim is free, not reclaimed"
    );
    store.commit(&second).await.unwrap();
    assert!(matches!(
        store.claim(&key, LONG).await.unwrap(),
        Claim::Done(_)
    ));
    let record = store.describe(&key).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Done);
    assert_eq!(
        (record.deliveries, record.runs),
        (4, 2),
        "sent 4 times, run twice"
    );
    assert!(record.first_seen_ago >= record.last_seen_ago);
    assert!(record.first_seen_ago >= record.claimed_ago);

    // A reclaim counts a run too, and says so.
    let stale_key = key_in(&ns, "evt_2");
    acquire(&store, &stale_key, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    let taken = acquire(&store, &stale_key, Stale::reclaim_after(SHORT)).await;
    assert!(taken.reclaimed());
    let record = store.describe(&stale_key).await.unwrap().unwrap();
    assert_eq!((record.deliveries, record.runs), (2, 2));
    assert!(record.reclaimed);

    // Released rows are purged past the retention, like done ones.
    let gone = key_in(&ns, "evt_3");
    let lease = acquire(&store, &gone, LONG).await;
    store.release(&lease).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    assert!(store.purge_completed(SHORT).await.unwrap() >= 1);
    assert_eq!(store.describe(&gone).await.unwrap(), None);
    assert!(
        store.describe(&stale_key).await.unwrap().is_some(),
        "processing rows stay"
    );
}

pub async fn concurrent_claims_have_one_winner<S: Store + Clone>(stores: Vec<S>) {
    let key = key_in(&unique_namespace("claims"), "evt_1");
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let key = key.clone();
            tokio::spawn(async move { store.claim(&key, LONG).await.unwrap() })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        match task.await.unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::InFlight(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1);
}

/// Generates one `#[tokio::test]` per conformance check, each with a store made by `$make`
/// (`None` skips the test).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claim_commit_duplicate() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::claim_commit_duplicate(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn release_lets_the_retry_run() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::release_lets_the_retry_run(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stale_reclaim_fences_the_old_owner() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::stale_reclaim_fences_the_old_owner(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stale_hold_keeps_the_row() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::stale_hold_keeps_the_row(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stuck_claims_and_resolve() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::stuck_claims_and_resolve(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn renew_keeps_a_claim_fresh() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::renew_keeps_a_claim_fresh(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn describe_counts_deliveries_and_runs() {
            let _alone = $crate::common::SHARED_TABLE.write().await;
            let Some(store) = $make.await else { return };
            $crate::common::describe_counts_deliveries_and_runs(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn purge_completed_keeps_recent_and_processing() {
            let _alone = $crate::common::SHARED_TABLE.write().await;
            let Some(store) = $make.await else { return };
            $crate::common::purge_completed_keeps_recent_and_processing(store).await;
        }
    };
}

/// A webhook handler that counts its runs per event id and sleeps a little, so concurrent
/// deliveries overlap.
pub fn counting_layer_service<St>(
    layer: IdempotencyLayer<St, key::Header>,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static
where
    St: Store + Clone,
{
    layer.layer(service_fn(move |_req| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    }))
}

fn delivery(id: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", id)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A store whose backend is gone (a closed pool): a claim fails with a backend error that keeps
/// its source, and the layer answers 503 without running the handler.
pub async fn store_down_is_503<St: Store + Clone>(store: St) -> StoreError {
    let ns = unique_namespace("down");
    let err = store.claim(&key_in(&ns, "evt_1"), LONG).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the backend error is kept as the source"
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns));
    let svc = counting_layer_service(layer, runs.clone());
    let res = svc.oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler never runs unguarded"
    );
    err
}

/// 64 deliveries of one event spread over several instances (one store handle each): exactly
/// one handler run, every other answer 200 (duplicate) or 409 (in flight).
pub async fn race_one_event<St: Store + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("race-one");
    let runs = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let layer =
                IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns.clone()));
            counting_layer_service(layer, runs.clone())
        })
        .collect();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = delivery("evt_race");
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one handler run");
    assert!(ok >= 1);
}

/// 200 distinct events, each delivered twice at once over several instances: exactly 200
/// handler runs.
pub async fn race_many_events<St: Store + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("race-many");
    let runs = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let layer =
                IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns.clone()));
            counting_layer_service(layer, runs.clone())
        })
        .collect();
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = delivery(&format!("evt_{}", i / 2));
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 200, "one run per event");
}

/// Generates the race tests for a backend; `$make` builds one instance's store (its own pool),
/// or `None` to skip.
#[macro_export]
macro_rules! race_suite {
    ($make:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_claims_have_one_winner() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let mut stores = Vec::new();
            for _ in 0..4 {
                let Some(store) = $make.await else { return };
                stores.push(store);
            }
            $crate::common::concurrent_claims_have_one_winner(stores).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn race_one_event_over_four_instances() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let mut stores = Vec::new();
            for _ in 0..4 {
                let Some(store) = $make.await else { return };
                stores.push(store);
            }
            $crate::common::race_one_event(stores).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn race_200_events_over_four_instances() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let mut stores = Vec::new();
            for _ in 0..4 {
                let Some(store) = $make.await else { return };
                stores.push(store);
            }
            $crate::common::race_many_events(stores).await;
        }
    };
}

/// After `migrate()` upgraded a table of the first release holding two rows of namespace `ns`
/// (`done`: done with 3 deliveries; `processing`: claimed an hour ago, never renewed), the rows
/// are all there and behave as they should, and the new states are accepted.
pub async fn upgraded_table_keeps_its_rows<S: Store>(store: S, ns: &str) {
    let done = key_in(ns, "done");
    let record = store
        .describe(&done)
        .await
        .unwrap()
        .expect("the done row was kept");
    assert_eq!(record.state, KeyState::Done);
    assert_eq!((record.deliveries, record.runs), (3, 1));
    assert!(
        record.first_seen_ago >= Duration::from_secs(3500),
        "{record:?}"
    );
    match store.claim(&done, LONG).await.unwrap() {
        Claim::Done(done) => assert_eq!(done.deliveries, 4),
        other => panic!("expected done, got {other:?}"),
    }

    let processing = key_in(ns, "processing");
    let record = store.describe(&processing).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Processing);
    assert!(
        record.renewed_ago.unwrap() >= Duration::from_secs(3500),
        "{record:?}"
    );
    let stuck = store.stuck_claims(Duration::from_secs(600)).await.unwrap();
    assert!(stuck.iter().any(|s| s.key == processing), "{stuck:?}");
    // Not renewed for an hour: stale under a ten-minute limit.
    let lease = acquire(&store, &processing, LONG).await;
    assert!(lease.reclaimed());
    store.renew(&lease).await.unwrap();
    store.release(&lease).await.unwrap();
    assert_eq!(
        store.describe(&processing).await.unwrap().unwrap().state,
        KeyState::Released,
        "the upgraded table accepts `released`"
    );
    let lease = acquire(&store, &processing, LONG).await;
    store.commit(&lease).await.unwrap();
    let record = store.describe(&processing).await.unwrap().unwrap();
    assert_eq!((record.state, record.runs), (KeyState::Done, 3));
}

/// A store that counts every call before passing it on: a test of what happens *before* the
/// claim asserts that the count stays zero.
#[derive(Clone)]
pub struct Counting<S> {
    pub inner: S,
    pub calls: Arc<AtomicUsize>,
}

impl<S> Counting<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl<S: Store> Store for Counting<S> {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        self.count();
        self.inner.claim(key, stale).await
    }
    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.renew(lease).await
    }
    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.commit(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.release(lease).await
    }
    async fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<tower_idempotency::store::KeyRecord>, StoreError> {
        self.count();
        self.inner.describe(key).await
    }
    async fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> Result<Vec<tower_idempotency::store::StuckClaim>, StoreError> {
        self.count();
        self.inner.stuck_claims(older_than).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.resolve(key, resolution).await
    }
    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge_completed(older_than).await
    }
}

/// A Stripe-shaped delivery of event `id` to `path`, signed with `secret` (no signature when
/// `None`) at the current time.
#[cfg(feature = "verify")]
pub fn stripe_delivery(path: &str, id: &str, secret: Option<&str>) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"id":"{id}","object":"event","type":"invoice.paid"}}"#);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = match secret {
        Some(secret) => stripe_v1(secret, now, body.as_bytes()),
        None => "0".repeat(64),
    };
    Request::post(path)
        .header("content-type", "application/json")
        .header("stripe-signature", format!("t={now},v1={signature}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// The hex `v1` signature Stripe would send: HMAC-SHA256 of `<t>.<body>`, computed here with
/// the same RFC 2104 construction as any HMAC library, on `sha2`.
#[cfg(feature = "verify")]
pub fn stripe_v1(secret: &str, t: u64, body: &[u8]) -> String {
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(body);
    hmac_sha256_hex(secret.as_bytes(), &message)
}

/// HMAC-SHA256 written out from RFC 2104 over `sha2`, so that the tests do not check the
/// crate's signatures with the crate's own HMAC code.
#[cfg(feature = "verify")]
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// A forged delivery with a real event id, sent first, claims nothing (401, the store never
/// called); the genuine delivery that follows runs, once.
#[cfg(feature = "verify")]
pub async fn forged_first_then_genuine_runs<St: Store + Clone>(store: St) {
    use tower_idempotency::verify;
    let path = format!("/{}", unique_namespace("forged"));
    let counting = Counting::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(counting.clone())
        .key(key::stripe())
        .verify(verify::stripe("whsec_genuine"));
    let svc = counting_body_service(layer, runs.clone());
    let id = "evt_leaked_in_a_log";

    for forged in [
        stripe_delivery(&path, id, None),
        stripe_delivery(&path, id, Some("whsec_guessed")),
    ] {
        let res = svc.clone().oneshot(forged).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["idempotency-outcome"], "unverified");
    }
    assert_eq!(
        counting.calls(),
        0,
        "a forged delivery never reaches the store"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let genuine = svc
        .clone()
        .oneshot(stripe_delivery(&path, id, Some("whsec_genuine")))
        .await
        .unwrap();
    assert_eq!(genuine.status(), StatusCode::OK);
    assert_eq!(genuine.headers().get("idempotency-outcome"), None);
    let again = svc
        .oneshot(stripe_delivery(&path, id, Some("whsec_genuine")))
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the genuine delivery ran, once"
    );
}

/// One event delivered to two routes on one store, both keyed by `key::stripe()`: each route
/// runs it once, and each route's redelivery is its own duplicate.
pub async fn two_routes_each_run_once<St: Store + Clone>(store: St) {
    let id = format!("evt_{}", unique_namespace("two-routes"));
    let delivery = |path: &str| {
        let body = format!(r#"{{"id":"{id}","object":"event"}}"#);
        Request::post(path)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let routes = ["/webhooks/billing", "/webhooks/analytics"];
    let runs = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let services: Vec<_> = runs
        .iter()
        .map(|runs| {
            let layer = IdempotencyLayer::new(store.clone()).key(key::stripe());
            counting_body_service(layer, runs.clone())
        })
        .collect();
    // Both endpoints at once, as the sender fans out.
    let (a, b) = tokio::join!(
        services[0].clone().oneshot(delivery(routes[0])),
        services[1].clone().oneshot(delivery(routes[1])),
    );
    for res in [a.unwrap(), b.unwrap()] {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers().get("idempotency-outcome"),
            None,
            "each route runs"
        );
    }
    for (svc, route) in services.into_iter().zip(routes) {
        let again = svc.oneshot(delivery(route)).await.unwrap();
        assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
    }
    assert_eq!(runs[0].load(Ordering::SeqCst), 1);
    assert_eq!(runs[1].load(Ordering::SeqCst), 1);
}

/// A handler that counts its runs, behind a layer with any extractor.
pub fn counting_body_service<St, K>(
    layer: IdempotencyLayer<St, K>,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static
where
    St: Store + Clone,
    K: key::ExtractKey + Clone,
{
    layer.layer(service_fn(move |_req| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    }))
}

/// Generates the tests of keys' trust and scope for a backend; `$make` builds its store.
#[macro_export]
macro_rules! trust_suite {
    ($make:expr) => {
        #[cfg(feature = "verify")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn forged_first_delivery_then_the_genuine_one_runs() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::forged_first_then_genuine_runs(store).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn one_event_to_two_routes_runs_on_each() {
            let _shared = $crate::common::SHARED_TABLE.read().await;
            let Some(store) = $make.await else { return };
            $crate::common::two_routes_each_run_once(store).await;
        }
    };
}

/// The namespace the layer stores for keys of `ns` delivered to `path` (the default scope).
pub fn scoped_ns(ns: &str, path: &str) -> String {
    key_in(ns, "x").scoped(path).unwrap().namespace().to_owned()
}
