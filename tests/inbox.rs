//! Promise: inbox mode acknowledges every delivery once it is stored and runs each event's
//! handler exactly once, across instances (DESIGN.md, "Tests that matter" 7).
//!
//! - 1,000 events × 3 copies, shuffled, sent at once over real sockets to 4 instances (each
//!   its own store handle, its own pool on a database, its own workers): every delivery is
//!   answered 2xx, each handler completes exactly once, none is lost;
//! - a poison event (always 500, or a panic) ends dead after its attempts while 100 others
//!   complete;
//! - an open transaction left idle on the database, holding an entry's row, neither stalls
//!   the workers nor makes them take it twice (PostgreSQL, MariaDB).
//!
//! On memory, SQLite (one file, four handles), PostgreSQL and MariaDB.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower_idempotency::inbox::{Inbox, WorkerHandle};
use tower_idempotency::key;
use tower_idempotency::store::inbox::InboxStore;

/// Runs of each event's handler, across every instance of a test.
type Runs = Arc<Mutex<HashMap<String, usize>>>;

/// One app instance: its server on a loopback port, and its workers.
struct Instance {
    addr: SocketAddr,
    workers: WorkerHandle,
    server: tokio::task::JoinHandle<()>,
}

async fn instance<St: InboxStore + Clone>(store: St, runs: Runs) -> Instance {
    let inbox = Inbox::new(store);
    let app = Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            // A little work, so that copies meet entries in every state.
            tokio::time::sleep(Duration::from_millis(2)).await;
            *runs.lock().unwrap().entry(body).or_default() += 1;
            StatusCode::NO_CONTENT
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let workers = inbox
        .workers(app.clone())
        .concurrency(16)
        .poll_interval(Duration::from_millis(200))
        .spawn();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Instance {
        addr,
        workers,
        server,
    }
}

/// Sends `event` once to `addr` over a connection of its own; the status.
async fn send(addr: SocketAddr, event: &str) -> StatusCode {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("/hooks")
        .header("host", "localhost")
        .header("x-event-id", event)
        .body(Full::new(Bytes::from(event.to_owned())))
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status();
    res.into_body().collect().await.unwrap();
    status
}

/// A shuffle without a random crate: each position swapped with one picked by a simple
/// generator, seeded from the clock.
fn shuffle<T>(items: &mut [T]) {
    let mut state = Instant::now().elapsed().as_nanos() as u64 | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// 1,000 events × 3 copies over 4 instances made by `stores` (one call each).
async fn thousand_events_three_copies_four_instances<St, F, Fut>(ns: &str, mut stores: F)
where
    St: InboxStore + Clone,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<St>>,
{
    let runs: Runs = Arc::default();
    let mut instances = Vec::new();
    for _ in 0..4 {
        let Some(store) = stores().await else { return };
        instances.push(instance(store, runs.clone()).await);
    }
    let addrs: Vec<SocketAddr> = instances.iter().map(|i| i.addr).collect();
    let events = 1000;
    let mut copies: Vec<(usize, String)> = (0..3)
        .flat_map(|copy| (0..events).map(move |n| (n + copy, format!("{ns}-{n}"))))
        .collect();
    shuffle(&mut copies);
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let sends: Vec<_> = copies
        .into_iter()
        .map(|(n, event)| {
            let addr = addrs[n % addrs.len()];
            let limit = limit.clone();
            tokio::spawn(async move {
                let _turn = limit.acquire().await.unwrap();
                (send(addr, &event).await, event)
            })
        })
        .collect();
    let mut answers: HashMap<StatusCode, usize> = HashMap::new();
    for sent in sends {
        let (status, event) = sent.await.unwrap();
        assert!(status.is_success(), "{event} answered {status}");
        *answers.entry(status).or_default() += 1;
    }
    assert_eq!(
        answers.get(&StatusCode::ACCEPTED),
        Some(&events),
        "{answers:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = runs.lock().unwrap().len();
        if done == events {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {events} events ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for instance in instances {
        instance.workers.stop().await;
        instance.server.abort();
    }
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "events run more than once: {twice:?}");
}

/// A poison event (always 500) and one that panics end dead after their 3 attempts, while
/// 100 others complete once each.
async fn poison_ends_dead_while_the_others_complete<St: InboxStore + Clone>(store: St) {
    use tower_idempotency::inbox::Backoff;
    use tower_idempotency::store::inbox::{AttemptResult, EntryState};

    let runs: Runs = Arc::default();
    let inbox = Inbox::new(store.clone());
    let counted = runs.clone();
    let app = Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            *counted.lock().unwrap().entry(body.clone()).or_default() += 1;
            if body.ends_with("-panic") {
                panic!("poison");
            }
            if body.ends_with("-fail") {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            }
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let ns = common::unique_namespace("poison");
    let mut events: Vec<String> = (0..100).map(|n| format!("{ns}-{n}")).collect();
    events.push(format!("{ns}-fail"));
    events.push(format!("{ns}-panic"));
    for event in &events {
        let req = Request::post("/hooks")
            .header("x-event-id", event)
            .body(axum::body::Body::from(event.clone()))
            .unwrap();
        let res = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
    }
    let workers = inbox
        .workers(app.clone())
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(40),
            3,
        ))
        .poll_interval(Duration::from_millis(20))
        .concurrency(4)
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = store.inbox_stats(None).await.unwrap();
        if stats.dead == 2 && stats.queued == 0 && stats.running == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    workers.stop().await;
    let runs = runs.lock().unwrap().clone();
    for event in &events[..100] {
        assert_eq!(runs.get(event), Some(&1), "{event}");
    }
    for poison in &events[100..] {
        assert_eq!(runs.get(poison), Some(&3), "{poison}");
        let key = tower_idempotency::IdempotencyKey::new("default@/hooks", poison.clone()).unwrap();
        let entry = store.entry(&key).await.unwrap().unwrap();
        assert_eq!((entry.state, entry.attempts), (EntryState::Dead, 3));
        assert_eq!(entry.history.len(), 3);
        let last = &entry.last_attempt().unwrap().result;
        if poison.ends_with("-fail") {
            assert_eq!(last, &AttemptResult::Status(500));
        } else {
            assert!(
                matches!(last, AttemptResult::Error(e) if e.contains("poison")),
                "{last:?}"
            );
        }
    }
}

mod memory {
    use tower_idempotency::store::MemoryStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poison_event_ends_dead_while_the_others_complete() {
        super::poison_ends_dead_while_the_others_complete(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn thousand_events_three_copies_four_instances() {
        let store = MemoryStore::new();
        super::thousand_events_three_copies_four_instances("memory", || {
            let store = store.clone();
            async move { Some(store) }
        })
        .await;
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn thousand_events_three_copies_four_instances() {
        let path = super::common::db::sqlite_file("inbox-load");
        let first = super::common::inbox::sqlite(path, "inbox_load").await;
        super::common::inbox::emptied(&first).await;
        super::thousand_events_three_copies_four_instances("sqlite", || async {
            Some(super::common::inbox::sqlite(path, "inbox_load").await)
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poison_event_ends_dead_while_the_others_complete() {
        let path = super::common::db::sqlite_file("inbox-load");
        let store = super::common::inbox::sqlite(path, "inbox_poison").await;
        super::common::inbox::emptied(&store).await;
        super::poison_ends_dead_while_the_others_complete(store).await;
    }
}

/// The tests of a database server, `$store(table)` opening an instance on `table`, and
/// `$lock` the statement that locks one entry's row (`$1`/`?`: its key).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! server_tests {
    ($module:ident, $store:ident, $lock:expr) => {
        mod $module {
            use super::common::inbox::{emptied, $store};

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn thousand_events_three_copies_four_instances() {
                let Some(first) = $store("inbox_load").await else {
                    return;
                };
                emptied(&first).await;
                let instances = || $store("inbox_load");
                super::thousand_events_three_copies_four_instances(stringify!($module), instances)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_poison_event_ends_dead_while_the_others_complete() {
                let Some(store) = $store("inbox_poison").await else {
                    return;
                };
                emptied(&store).await;
                super::poison_ends_dead_while_the_others_complete(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_idle_transaction_neither_stalls_the_workers_nor_doubles_a_run() {
                let Some(store) = $store("inbox_idle").await else {
                    return;
                };
                emptied(&store).await;
                let locker = store.pool().clone();
                super::idle_transaction(store, |event| async move {
                    let mut tx = locker.begin().await.unwrap();
                    sqlx::query($lock)
                        .bind(event)
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap();
                    let release: super::Release =
                        Box::new(move || Box::pin(async move { tx.commit().await.unwrap() }));
                    release
                })
                .await;
            }
        }
    };
}

#[cfg(feature = "postgres")]
server_tests!(
    postgres,
    postgres,
    r#"SELECT 1 FROM "inbox_idle_inbox" WHERE namespace = 'default@/hooks' AND "key" = $1 FOR UPDATE"#
);
#[cfg(feature = "mysql")]
server_tests!(
    mysql,
    mysql,
    "SELECT 1 FROM `inbox_idle_inbox` WHERE namespace = 'default@/hooks' AND `key` = ? FOR UPDATE"
);

/// Ends a transaction held elsewhere on the database.
#[cfg(any(feature = "postgres", feature = "mysql"))]
type Release =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// 20 events stored; another connection locks one entry's row in a transaction it leaves
/// idle (`lock(event)` answers how to end it). The workers run the other 19 meanwhile, the
/// locked one not at all; once the transaction ends, it runs, and each event ran once.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn idle_transaction<St, F, Fut>(store: St, lock: F)
where
    St: InboxStore + Clone,
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Release>,
{
    let runs: Runs = Arc::default();
    let inbox = Inbox::new(store);
    let counted = runs.clone();
    let app = Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            *counted.lock().unwrap().entry(body).or_default() += 1;
            StatusCode::NO_CONTENT
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let ns = common::unique_namespace("idle");
    for n in 0..20 {
        let event = format!("{ns}-{n}");
        let req = Request::post("/hooks")
            .header("x-event-id", &event)
            .body(axum::body::Body::from(event.clone()))
            .unwrap();
        let res = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
    }
    let locked = format!("{ns}-7");
    let release = lock(locked.clone()).await;
    let workers = inbox
        .workers(app.clone())
        .poll_interval(Duration::from_millis(50))
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs.lock().unwrap().len() < 19 {
        assert!(
            Instant::now() < deadline,
            "the workers stalled behind a locked row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !runs.lock().unwrap().contains_key(&locked),
        "the locked entry ran while its row was locked"
    );
    release().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !runs.lock().unwrap().contains_key(&locked) {
        assert!(Instant::now() < deadline, "the locked entry never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    workers.stop().await;
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 20);
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
}
