//! Promise: nothing the inbox acknowledged is held by nobody, whatever the store does
//! (DESIGN.md, "Inbox mode": nothing held by nobody).
//!
//! - a take whose answer arrives after the workers stopped waiting (the store timeout): what
//!   it leased is given back by the workers' tokens, and runs once, with no crash counted,
//!   even under the hold policy;
//! - batches of settlements that never answer (a connection that stopped answering), for
//!   longer than the stale limit: each settlement is tried again under a lease that is
//!   renewed meanwhile, and lands; no entry is taken over as a crash, each handler runs once
//!   (that one batch that hangs holds no other back is `store::batch`'s unit test);
//! - settlements that fail a few times: `stop()` returns once they landed;
//! - an inbox layer that neither verifies nor says `unverified()` is refused when it is built.
//!
//! The store is the memory store behind a wrapper that plays the fault, through the public
//! `InboxStore` trait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::inbox::Inbox;
use tower_idempotency::store::inbox::{
    Attempt, AttemptResult, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running,
    Settlement, Settling, StoredRequest, Take, Taken,
};
use tower_idempotency::store::{Lease, LeaseToken, MemoryStore, StoreError};
use tower_idempotency::{IdempotencyKey, Stale, key};

/// The memory store, with faults to play.
#[derive(Clone, Default)]
struct Faulty {
    store: MemoryStore,
    faults: Arc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// The next take's answer comes this long after the take was done.
    late_take: Mutex<Option<Duration>>,
    /// Every batch of settlements sent before then never answers.
    hang_settlements_until: Mutex<Option<std::time::Instant>>,
    /// The next this many settlements fail.
    failing_settlements: AtomicUsize,
}

fn failed() -> StoreError {
    StoreError::backend("the database failed")
}

impl InboxStore for Faulty {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        self.store.enqueue(key, request).await
    }
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let taken = self.store.take(take).await;
        let late = self.faults.late_take.lock().unwrap().take();
        if let Some(late) = late
            && taken.as_ref().is_ok_and(|t| !t.is_empty())
        {
            tokio::time::sleep(late).await;
        }
        taken
    }
    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        self.store.start(leases).await
    }
    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        self.store.give_back(tokens).await
    }
    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.renew_entry(lease).await
    }
    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        self.store.settle(lease, settlement, history).await
    }
    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        let hang = *self.faults.hang_settlements_until.lock().unwrap();
        if hang.is_some_and(|until| std::time::Instant::now() < until) {
            std::future::pending::<()>().await;
        }
        let failing = &self.faults.failing_settlements;
        if failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return batch.iter().map(|_| Err(failed())).collect();
        }
        self.store.settle_many(batch).await
    }
    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.store.entries(namespace, states, limit).await
    }
    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        self.store.entry(key).await
    }
    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        self.store.stored_request(key).await
    }
    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.store.retry_now(key, running).await
    }
    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        self.store.retry_dead(namespace).await
    }
    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.store.discard(key, running).await
    }
    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        self.store.inbox_stats(namespace).await
    }
    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        self.store
            .purge_inbox(requests_after, entries_after, limit)
            .await
    }
}

/// Runs of each event's handler.
type Runs = Arc<Mutex<HashMap<String, usize>>>;

fn app(inbox: &Inbox<Faulty>, runs: &Runs) -> Router {
    let runs = runs.clone();
    Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            *runs.lock().unwrap().entry(body).or_default() += 1;
            StatusCode::NO_CONTENT
        })
        .layer(
            inbox
                .layer()
                .key(key::header("x-event-id").namespace("ev"))
                .unverified(),
        ),
    )
}

async fn send(app: &Router, event: &str) {
    let req = Request::post("/hooks")
        .header("x-event-id", event)
        .body(axum::body::Body::from(event.to_owned()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
}

fn key_of(event: &str) -> IdempotencyKey {
    IdempotencyKey::new("ev@/hooks", event).unwrap()
}

/// Waits, up to 10 seconds, until every event's entry is done.
async fn all_done(store: &Faulty, events: &[&str]) -> Vec<Entry> {
    let mut entries = Vec::new();
    for event in events {
        let mut waited = 0;
        loop {
            let entry = store.entry(&key_of(event)).await.unwrap().unwrap();
            if entry.state == EntryState::Done {
                entries.push(entry);
                break;
            }
            waited += 1;
            assert!(waited < 1000, "{event} never done: {entry:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    entries
}

fn ran_once(entries: &[Entry], runs: &Runs, events: &[&str]) {
    for (entry, event) in entries.iter().zip(events) {
        assert_eq!(
            (entry.attempts, entry.crashes),
            (1, 0),
            "{event}: {entry:?}"
        );
        assert_eq!(
            entry.history.iter().map(|a| &a.result).collect::<Vec<_>>(),
            [&AttemptResult::Status(204)],
            "{event}: one attempt, no crash"
        );
        assert_eq!(runs.lock().unwrap().get(*event), Some(&1), "{event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_answered_late_gives_its_entries_back() {
    let store = Faulty::default();
    *store.faults.late_take.lock().unwrap() = Some(Duration::from_millis(300));
    let inbox = Inbox::new(store.clone());
    let runs = Runs::default();
    let app = app(&inbox, &runs);
    let events = ["late-1", "late-2", "late-3"];
    for event in events {
        send(&app, event).await;
    }
    // Under hold, an entry leased to nobody would wait for a person.
    let workers = inbox
        .workers(app.clone())
        .store_timeout(Duration::from_millis(50))
        .stale(Stale::hold_after(Duration::from_secs(60)))
        .poll_interval(Duration::from_millis(20))
        .spawn();
    let entries = all_done(&store, &events).await;
    ran_once(&entries, &runs, &events);
    workers.stop().await;
}

/// For twice the stale limit, every batch of settlements hangs, as on a connection that
/// stopped answering: each settlement is tried again, its entry's lease renewed meanwhile,
/// and lands once the store answers; no entry goes stale and runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_settlements_rerun_nothing() {
    const STALE: Duration = Duration::from_millis(600);
    let store = Faulty::default();
    let inbox = Inbox::new(store.clone());
    let runs = Runs::default();
    let app = app(&inbox, &runs);
    let workers = inbox
        .workers(app.clone())
        .store_timeout(Duration::from_millis(100))
        .stale(Stale::reclaim_after(STALE))
        .poll_interval(Duration::from_millis(20))
        .spawn();
    *store.faults.hang_settlements_until.lock().unwrap() =
        Some(std::time::Instant::now() + STALE * 2);
    let events = ["hung-1", "hung-2", "hung-3"];
    for event in events {
        send(&app, event).await;
    }
    let entries = all_done(&store, &events).await;
    // Past the stale limit again: nothing was taken over and run again.
    tokio::time::sleep(STALE * 2).await;
    ran_once(&entries, &runs, &events);
    workers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_returns_once_failed_settlements_landed() {
    let store = Faulty::default();
    store.faults.failing_settlements.store(3, Ordering::SeqCst);
    let inbox = Inbox::new(store.clone());
    let runs = Runs::default();
    let app = app(&inbox, &runs);
    let workers = inbox.workers(app.clone()).spawn();
    send(&app, "stop-1").await;
    while runs.lock().unwrap().get("stop-1").is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    workers.stop().await;
    let entry = store.entry(&key_of("stop-1")).await.unwrap().unwrap();
    assert_eq!(
        entry.state,
        EntryState::Done,
        "settled before stop returned"
    );
    assert_eq!(store.faults.failing_settlements.load(Ordering::SeqCst), 0);
}

#[test]
#[should_panic(expected = "must check signatures")]
fn an_inbox_layer_without_verify_or_unverified_is_refused() {
    let inbox = Inbox::new(MemoryStore::new());
    let _app: Router = Router::new().route(
        "/hooks",
        post(|| async { StatusCode::OK }).layer(inbox.layer().key(key::github())),
    );
}
