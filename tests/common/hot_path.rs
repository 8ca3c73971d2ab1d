//! The hot path of the SQL stores: a duplicate writes nothing, yet its delivery is counted; a
//! purge deletes in batches and keeps what it must.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use tower_idempotency::store::{Claim, KeyState, Store};

use super::{LONG, acquire, key_in, unique_namespace};

/// A done key and a released one, then `lock` holds both rows (or the database's write lock)
/// from another connection until what it answers is dropped; the store's own lock waits are
/// short. Duplicates of the done key are answered all the same, and counted: they write
/// nothing. The released key needs a write to be taken over, so its claim fails while the lock
/// is held: the lock does stop writes.
pub async fn a_duplicate_writes_nothing<S, L, Fut, G>(store: S, lock: L)
where
    S: Store,
    L: FnOnce(tower_idempotency::IdempotencyKey, tower_idempotency::IdempotencyKey) -> Fut,
    Fut: Future<Output = G>,
{
    let ns = unique_namespace("no-write");
    let (done, released) = (key_in(&ns, "done"), key_in(&ns, "released"));
    let lease = acquire(&store, &done, LONG).await;
    store.commit(&lease).await.unwrap();
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();

    let guard = lock(done.clone(), released.clone()).await;
    for deliveries in 2..=4 {
        match store.claim(&done, LONG).await {
            Ok(Claim::Done(record)) => assert_eq!(record.deliveries, deliveries),
            other => panic!("a duplicate of a done key, its row locked: {other:?}"),
        }
    }
    let blocked = store.claim(&released, LONG).await;
    assert!(
        blocked.is_err(),
        "taking a released row over writes it, and the lock must stop that: {blocked:?}"
    );
    drop(guard);

    let record = store.describe(&done).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Done);
    assert_eq!((record.deliveries, record.runs), (4, 1));
    match store.claim(&released, LONG).await {
        Ok(Claim::Acquired(lease)) => store.commit(&lease).await.unwrap(),
        other => panic!("the released key, the lock gone: {other:?}"),
    }
}

/// Duplicates through `store` are counted at once there; `other` (another instance) sees
/// them once `write` has written them, and then exactly once.
pub async fn duplicate_counts_reach_the_table<S, W, Fut>(store: S, other: S, write: W)
where
    S: Store + Clone,
    W: Fn(S) -> Fut,
    Fut: Future<Output = ()>,
{
    let ns = unique_namespace("counts");
    let key = key_in(&ns, "evt");
    let lease = acquire(&store, &key, LONG).await;
    store.commit(&lease).await.unwrap();
    for _ in 0..3 {
        assert!(matches!(store.claim(&key, LONG).await, Ok(Claim::Done(_))));
    }
    assert_eq!(store.describe(&key).await.unwrap().unwrap().deliveries, 4);
    write(store.clone()).await;
    let seen = other.describe(&key).await.unwrap().unwrap();
    assert_eq!((seen.deliveries, seen.runs), (4, 1), "written once");
    // Written counts no longer count in the process: no delivery counted twice.
    write(store.clone()).await;
    assert_eq!(store.describe(&key).await.unwrap().unwrap().deliveries, 4);
    assert_eq!(other.describe(&key).await.unwrap().unwrap().deliveries, 4);
    // A duplicate through the other instance counts there.
    assert!(matches!(other.claim(&key, LONG).await, Ok(Claim::Done(d)) if d.deliveries == 5));
}

/// How many settled rows a purge test leaves expired: more than two of the purge's batches.
pub const EXPIRED: u64 = 2_500;

/// `fill(ns, EXPIRED)` writes that many `done` rows in `ns`, settled two days ago. A purge
/// with a day's retention deletes them all, batch after batch, while new keys that sort among
/// them keep arriving, and keeps the fresh done key, the processing one and the new ones.
pub async fn purge_walks_the_table_in_batches<S, F, Fut>(store: S, fill: F)
where
    S: Store + Clone,
    F: FnOnce(String, u64) -> Fut,
    Fut: Future<Output = ()>,
{
    let ns = unique_namespace("purge-batches");
    fill(ns.clone(), EXPIRED).await;
    let fresh = key_in(&ns, "fresh");
    let lease = acquire(&store, &fresh, LONG).await;
    store.commit(&lease).await.unwrap();
    let running = key_in(&ns, "running");
    let _lease = acquire(&store, &running, LONG).await;
    for i in [0, EXPIRED / 2, EXPIRED - 1] {
        let old = key_in(&ns, &format!("old-{i}"));
        assert!(
            store.describe(&old).await.unwrap().is_some(),
            "filled: {old}"
        );
    }

    // New deliveries during the purge, their keys among the batches': `old-<i>-new`.
    let arriving = {
        let (store, ns) = (store.clone(), ns.clone());
        tokio::spawn(async move {
            let mut arrived = Vec::new();
            for i in (0..EXPIRED).step_by(50) {
                let key = key_in(&ns, &format!("old-{i}-new"));
                let lease = acquire(&store, &key, LONG).await;
                store.commit(&lease).await.unwrap();
                arrived.push(key);
                tokio::task::yield_now().await;
            }
            arrived
        })
    };
    let purged = store
        .purge_completed(Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    let arrived = arriving.await.unwrap();
    assert!(purged >= EXPIRED, "purged {purged}");
    for i in 0..EXPIRED {
        let old = key_in(&ns, &format!("old-{i}"));
        assert!(store.describe(&old).await.unwrap().is_none(), "left: {old}");
    }
    for key in arrived {
        assert!(
            store.describe(&key).await.unwrap().is_some(),
            "purged: {key}"
        );
    }
    assert!(store.describe(&fresh).await.unwrap().is_some());
    let running = store.describe(&running).await.unwrap().unwrap();
    assert_eq!(running.state, KeyState::Processing);
}

/// Where the server's write-ahead log is: `position()` answers something that changes whenever
/// anything is written (MySQL's `Innodb_lsn_current`). Duplicates of a done key leave it where
/// it was (tried up to 40 times, as the server's own background work moves it now and then);
/// taking a released key over moves it.
pub async fn duplicates_leave_the_log_alone<S, P, Fut>(store: S, position: P)
where
    S: Store,
    P: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    let ns = unique_namespace("log-alone");
    let (done, released) = (key_in(&ns, "done"), key_in(&ns, "released"));
    let lease = acquire(&store, &done, LONG).await;
    store.commit(&lease).await.unwrap();
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();

    // Other work on the server (its own background threads, other databases) moves the log
    // now and then: one still round among many shows what the duplicates write.
    let mut still = false;
    for _ in 0..40 {
        let before = position().await;
        for _ in 0..3 {
            assert!(matches!(store.claim(&done, LONG).await, Ok(Claim::Done(_))));
        }
        if position().await == before {
            still = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(still, "every round of duplicates moved the log");
    let before = position().await;
    let lease = acquire(&store, &released, LONG).await;
    assert_ne!(
        position().await,
        before,
        "a claim that writes moves the log"
    );
    store.commit(&lease).await.unwrap();
}

/// A count interval for stores whose counts a test writes itself.
pub const NEVER: Duration = Duration::from_secs(24 * 3600);
