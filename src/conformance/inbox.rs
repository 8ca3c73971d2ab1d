//! The [`InboxStore`] contract: enqueue once per key, take under fenced leases, settle,
//! the operator's actions, retention. Leases that lapse (a crash, reclaimed or held; a
//! give-back; a worker that never started what it took) are in
//! [`inbox_leases`](super::inbox_leases); several instances enqueueing and taking at once,
//! and settlements in a batch, in [`inbox_races`](super::inbox_races).
//!
//! The checks share the store's inbox with nothing else while they run
//! ([`INBOX_TABLE`](super::INBOX_TABLE)): a worker takes entries of every namespace. Entries of
//! other namespaces a check takes (left by an earlier, interrupted run) are settled done.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};

use crate::IdempotencyKey;
use crate::store::inbox::{
    Attempt, AttemptResult, Enqueued, EntryState, InboxStore, Running, Settlement, StoredRequest,
    Take, Taken,
};
use crate::store::{Lease, Stale};

use super::expect::assert_lease_lost;
use super::{SHORT, key_in, unique_namespace};

pub(super) fn request(n: usize) -> StoredRequest {
    StoredRequest::new(
        Method::POST,
        format!("/hooks?n={n}"),
        vec![(
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("application/json"),
        )],
        Bytes::from(format!("{{\"n\":{n}}}")),
    )
}

pub(super) fn take(limit: usize, stale: Stale, max_attempts: u32) -> Take {
    Take {
        stale,
        max_attempts,
        ..Take::up_to(limit)
    }
}

/// Takes with `take`, keeping the entries of namespace `ns` and settling the others done; the
/// entries kept are started, as a worker starts what it takes.
pub async fn take_ours<S: InboxStore>(store: &S, take: &Take, ns: &str) -> Vec<Taken> {
    let ours = take_unstarted(store, take, ns).await;
    let leases: Vec<_> = ours.iter().map(|entry| entry.lease.clone()).collect();
    let held = store.start(&leases).await.expect("start");
    assert_eq!(held, vec![true; ours.len()], "every lease just taken holds");
    ours
}

/// [`take_ours`] without the start: as a worker that died, or never heard the answer. Each
/// call takes under fresh tokens, as a worker does, whatever `take`'s are.
pub async fn take_unstarted<S: InboxStore>(store: &S, take: &Take, ns: &str) -> Vec<Taken> {
    let take = &Take {
        stale: take.stale,
        max_attempts: take.max_attempts,
        ..Take::up_to(take.limit())
    };
    let taken = store.take(take).await.expect("take");
    let mut ours = Vec::new();
    for entry in taken {
        assert!(
            take.tokens.contains(&entry.lease.token()),
            "an entry is leased under one of the worker's tokens"
        );
        if entry.lease.key().namespace() == ns {
            ours.push(entry);
        } else {
            let _ = store.settle(&entry.lease, &Settlement::Done, &[]).await;
        }
    }
    ours
}

/// How many takes [`take_one`] tries before it calls an entry lost, a short pause apart.
const TRIES: u32 = 40;

/// The first entry of `ns` a take leases, started: takes again, a few milliseconds apart, until
/// one comes. A worker polls, so a take that misses an entry committed a moment before it
/// (InnoDB's `SKIP LOCKED` may still see the insert's lock) is a delay, not a loss; an entry
/// that no take leases within forty takes, over a second, is.
pub async fn take_one<S: InboxStore>(store: &S, take: &Take, ns: &str) -> Taken {
    first_of(|| take_ours(store, take, ns)).await
}

/// [`take_one`] without the start, as [`take_unstarted`].
pub async fn take_one_unstarted<S: InboxStore>(store: &S, take: &Take, ns: &str) -> Taken {
    first_of(|| take_unstarted(store, take, ns)).await
}

async fn first_of<F, Fut>(mut take: F) -> Taken
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<Taken>>,
{
    for _ in 0..TRIES {
        let mut taken = take().await;
        if !taken.is_empty() {
            return taken.swap_remove(0);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("a due entry was not taken by {TRIES} takes over a second")
}

pub(super) fn attempt(result: AttemptResult) -> Attempt {
    Attempt::new(1_700_000_000_000, 12, result)
}

/// A namespace of the check `test`'s own, and in it the entry `evt_1` (request 1), enqueued:
/// the namespace and the entry's key.
pub(super) async fn one_entry<S: InboxStore>(store: &S, test: &str) -> (String, IdempotencyKey) {
    let ns = unique_namespace(test);
    let key = key_in(&ns, "evt_1");
    store.enqueue(&key, &request(1)).await.unwrap();
    (ns, key)
}

/// Enqueues the entries `evt_0` to `evt_{count - 1}` in `ns`, entry `n` with request `n`.
pub(super) async fn enqueue_numbered<S: InboxStore>(store: &S, ns: &str, count: usize) {
    for n in 0..count {
        store
            .enqueue(&key_in(ns, &format!("evt_{n}")), &request(n))
            .await
            .unwrap();
    }
}

/// A person runs again the entry `key`, held since its worker stopped renewing it (for
/// [`SHORT`] at least): it must be taken from that worker and made due.
pub(super) async fn run_again_by_hand<S: InboxStore>(store: &S, key: &IdempotencyKey) {
    let running = Running::StaleFor(SHORT);
    assert!(
        store.retry_now(key, running).await.unwrap(),
        "a person runs it again"
    );
}

/// Settles the entry `lease` holds done, with no history: the lease must hold.
pub(super) async fn settle_done<S: InboxStore>(store: &S, lease: &Lease) {
    store.settle(lease, &Settlement::Done, &[]).await.unwrap();
}

pub(super) const LONG: Stale = Stale::reclaim_after(Duration::from_secs(600));

/// A key is stored once; every later copy, in every state, is a duplicate that writes
/// nothing; the stored request reads back whole.
pub async fn enqueue_once_then_duplicates<S: InboxStore>(store: S) {
    let ns = unique_namespace("inbox-once");
    let key = key_in(&ns, "evt_1");
    assert_eq!(
        store.enqueue(&key, &request(1)).await.unwrap(),
        Enqueued::Stored
    );
    assert_eq!(
        store.enqueue(&key, &request(2)).await.unwrap(),
        Enqueued::Duplicate(EntryState::Queued)
    );
    let taken = take_ours(&store, &take(10, LONG, 5), &ns).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    let entry = &taken[0];
    assert_eq!(entry.lease.key(), &key);
    assert_eq!(entry.request, request(1), "the first copy is the one kept");
    assert_eq!((entry.attempt, entry.crashes), (1, 0));
    assert!(entry.history.is_empty());
    assert!(!entry.lease.reclaimed());
    assert_eq!(
        store.enqueue(&key, &request(3)).await.unwrap(),
        Enqueued::Duplicate(EntryState::Running)
    );
    let history = [attempt(AttemptResult::Status(200))];
    store
        .settle(&entry.lease, &Settlement::Done, &history)
        .await
        .unwrap();
    assert_eq!(
        store.enqueue(&key, &request(4)).await.unwrap(),
        Enqueued::Duplicate(EntryState::Done)
    );
    let described = store.entry(&key).await.unwrap().expect("the entry");
    assert_eq!(described.state, EntryState::Done);
    assert_eq!(described.attempts, 1);
    assert_eq!(described.history, history);
    assert!(described.has_request);
    assert_eq!(store.stored_request(&key).await.unwrap(), Some(request(1)));
    assert!(take_ours(&store, &take(10, LONG, 5), &ns).await.is_empty());
    let unknown = key_in(&ns, "evt_unknown");
    assert_eq!(store.entry(&unknown).await.unwrap(), None);
    assert_eq!(store.stored_request(&unknown).await.unwrap(), None);
}

/// A failed attempt queues the entry again for later, with its history; the attempts run out
/// into dead; a person's retry starts it over; discard marks it done.
pub async fn retry_then_dead_then_retry_now<S: InboxStore>(store: S) {
    let (ns, key) = one_entry(&store, "inbox-retry").await;
    let policy = take(10, LONG, 2);
    let first = take_one(&store, &policy, &ns).await;
    let history = vec![attempt(AttemptResult::Status(500))];
    let later = Settlement::Retry {
        after: Duration::from_secs(3600),
    };
    store.settle(&first.lease, &later, &history).await.unwrap();
    // A settled lease is spent.
    assert_lease_lost(store.settle(&first.lease, &Settlement::Done, &[]).await);
    assert_lease_lost(store.renew_entry(&first.lease).await);
    let waiting = store.entry(&key).await.unwrap().unwrap();
    assert_eq!(waiting.state, EntryState::Queued);
    assert!(waiting.due_in.expect("a queued entry's due time") > Duration::from_secs(3000));
    assert!(
        take_ours(&store, &policy, &ns).await.is_empty(),
        "not due for an hour"
    );
    assert!(store.retry_now(&key, Running::Leave).await.unwrap());
    let second = take_one(&store, &policy, &ns).await;
    assert_eq!(second.attempt, 2);
    assert_eq!(second.history, history);
    assert_ne!(second.lease.token(), first.lease.token());
    let mut history = history;
    history.push(attempt(AttemptResult::Error("panicked".into())));
    store
        .settle(&second.lease, &Settlement::Dead, &history)
        .await
        .unwrap();
    let dead = store.entry(&key).await.unwrap().unwrap();
    assert_eq!((dead.state, dead.attempts), (EntryState::Dead, 2));
    assert_eq!(dead.history, history);
    assert!(take_ours(&store, &policy, &ns).await.is_empty());
    assert_eq!(store.inbox_stats(Some(&ns)).await.unwrap().dead, 1);
    assert_eq!(store.retry_dead(&ns).await.unwrap(), 1);
    assert_eq!(
        store.retry_dead(&ns).await.unwrap(),
        0,
        "nothing dead is left"
    );
    let third = take_one(&store, &policy, &ns).await;
    assert_eq!(third.attempt, 1, "a person's retry starts the count over");
    store
        .settle(
            &third.lease,
            &Settlement::Retry {
                after: Duration::ZERO,
            },
            &[],
        )
        .await
        .unwrap();
    assert!(store.discard(&key, Running::Leave).await.unwrap());
    assert_eq!(
        store.entry(&key).await.unwrap().unwrap().state,
        EntryState::Done
    );
    assert!(
        !store.discard(&key, Running::Force).await.unwrap(),
        "done already"
    );
    assert!(
        !store.retry_now(&key, Running::Force).await.unwrap(),
        "done is final"
    );
}

/// An operator's retry or discard leaves an entry its worker still renews unless forced, in
/// one conditional write: a queued or dead entry it takes whatever it is told of running ones.
pub async fn an_operator_leaves_a_live_entry_unless_forced<S: InboxStore>(store: S) {
    let (ns, key) = one_entry(&store, "inbox-by-hand").await;
    let policy = take(10, LONG, 5);
    let running = take_one(&store, &policy, &ns).await;
    let long = Running::StaleFor(Duration::from_secs(600));
    for leave in [Running::Leave, long] {
        assert!(!store.retry_now(&key, leave).await.unwrap());
        assert!(!store.discard(&key, leave).await.unwrap());
    }
    store.renew_entry(&running.lease).await.unwrap();
    assert_eq!(
        store.entry(&key).await.unwrap().unwrap().state,
        EntryState::Running
    );
    assert!(store.retry_now(&key, Running::Force).await.unwrap());
    assert_lease_lost(store.renew_entry(&running.lease).await);
    assert!(
        store.retry_now(&key, Running::Leave).await.unwrap(),
        "queued: due now whatever"
    );
    assert!(store.discard(&key, Running::Leave).await.unwrap());
    assert_eq!(
        store.entry(&key).await.unwrap().unwrap().state,
        EntryState::Done
    );
}

/// The take answers when each entry was received, by the store's clock.
pub async fn a_taken_entry_says_when_it_was_received<S: InboxStore>(store: S) {
    let ns = unique_namespace("inbox-received");
    let key = key_in(&ns, "evt_1");
    let before = std::time::SystemTime::now();
    store.enqueue(&key, &request(1)).await.unwrap();
    let taken = take_one(&store, &take(10, LONG, 5), &ns).await;
    // The store's clock and this machine's may differ a little.
    let skew = Duration::from_secs(60);
    assert!(
        taken.received_at + skew >= before,
        "{:?}",
        taken.received_at
    );
    assert!(taken.received_at <= std::time::SystemTime::now() + skew);
    settle_done(&store, &taken.lease).await;
}

/// Listing, counting, the oldest due entry, and a take's limit.
pub async fn entries_and_stats<S: InboxStore>(store: S) {
    let ns = unique_namespace("inbox-stats");
    enqueue_numbered(&store, &ns, 5).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stats = store.inbox_stats(Some(&ns)).await.unwrap();
    assert_eq!((stats.queued, stats.running, stats.dead), (5, 0, 0));
    assert!(stats.oldest_due.unwrap() >= Duration::from_millis(10));
    let two = take_ours(&store, &take(2, LONG, 5), &ns).await;
    assert_eq!(two.len(), 2);
    let stats = store.inbox_stats(Some(&ns)).await.unwrap();
    assert_eq!((stats.queued, stats.running), (3, 2));
    let queued = store
        .entries(Some(&ns), &[EntryState::Queued], 10)
        .await
        .unwrap();
    assert_eq!(queued.len(), 3);
    assert!(queued.iter().all(|e| e.state == EntryState::Queued));
    let all = store.entries(Some(&ns), &[], 10).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(store.entries(Some(&ns), &[], 1).await.unwrap().len(), 1);
    for entry in two {
        settle_done(&store, &entry.lease).await;
    }
    let rest = take_ours(&store, &take(10, LONG, 5), &ns).await;
    assert_eq!(rest.len(), 3);
    for entry in rest {
        settle_done(&store, &entry.lease).await;
    }
    let stats = store.inbox_stats(Some(&ns)).await.unwrap();
    assert_eq!(
        (stats.queued, stats.running, stats.oldest_due),
        (0, 0, None)
    );
}

/// Retention deletes a done entry's request, then the entry; a dead entry keeps its request.
pub async fn purge_keeps_dead_requests<S: InboxStore>(store: S) {
    let ns = unique_namespace("inbox-purge");
    let (done, dead) = (key_in(&ns, "done"), key_in(&ns, "dead"));
    store.enqueue(&done, &request(1)).await.unwrap();
    store.enqueue(&dead, &request(2)).await.unwrap();
    for entry in take_ours(&store, &take(10, LONG, 5), &ns).await {
        let settlement = if entry.lease.key() == &done {
            Settlement::Done
        } else {
            Settlement::Dead
        };
        store.settle(&entry.lease, &settlement, &[]).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = store
        .purge_inbox(Duration::ZERO, Duration::from_secs(3600), 1000)
        .await
        .unwrap();
    assert!(purged.requests >= 1, "{purged:?}");
    let kept = store.entry(&done).await.unwrap().expect("the marker stays");
    assert!(!kept.has_request);
    assert_eq!(store.stored_request(&done).await.unwrap(), None);
    assert_eq!(
        store.enqueue(&done, &request(3)).await.unwrap(),
        Enqueued::Duplicate(EntryState::Done),
        "still a duplicate"
    );
    assert!(store.entry(&dead).await.unwrap().unwrap().has_request);
    store
        .purge_inbox(Duration::ZERO, Duration::ZERO, 1000)
        .await
        .unwrap();
    assert_eq!(store.entry(&done).await.unwrap(), None);
    assert_eq!(store.stored_request(&dead).await.unwrap(), Some(request(2)));
}
