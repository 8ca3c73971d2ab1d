//! The claims every `Store` makes the same way: acquire, duplicate, release, reclaim, hold,
//! renew, resolve, describe and purge, one key at a time.

use std::time::Duration;

use crate::store::{KeyState, Resolution, Stale, Store};

use super::expect::{assert_lease_lost, expect_done, expect_held, expect_in_flight};
use super::{LONG, PAST_SHORT, SHORT, acquire, key_in, unique_namespace};

/// The first claim of a key acquires it, a second one finds it in flight, and after the commit
/// (twice: a retried commit is harmless) every claim finds it done, counting each delivery.
/// Other keys, and the same key in another namespace, are independent.
pub async fn claim_commit_duplicate<S: Store>(store: S) {
    let ns = unique_namespace("commit");
    let key = key_in(&ns, "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    assert!(!lease.reclaimed());
    assert_eq!(lease.key(), &key);
    assert_eq!(
        expect_in_flight(store.claim(&key, LONG).await).deliveries,
        2
    );
    store.commit(&lease).await.unwrap();
    // Committing again with the same lease is harmless (a retried commit).
    store.commit(&lease).await.unwrap();
    assert_eq!(expect_done(store.claim(&key, LONG).await).deliveries, 3);
    // Other keys and other namespaces are independent.
    acquire(&store, &key_in(&ns, "evt_2"), LONG).await;
    acquire(&store, &key_in(&format!("{ns}-other"), "evt_1"), LONG).await;
}

/// A released claim lets the next delivery acquire the key with a fresh token (each lease says
/// which delivery of the key claimed: the first, then the second); the released
/// lease can neither release nor commit again, and a done row cannot be released.
pub async fn release_lets_the_retry_run<S: Store>(store: S) {
    let key = key_in(&unique_namespace("release"), "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    assert_eq!(
        lease.deliveries(),
        Some(1),
        "a lease says which delivery claimed"
    );
    store.release(&lease).await.unwrap();
    let again = acquire(&store, &key, LONG).await;
    assert_ne!(
        again.token(),
        lease.token(),
        "every claim gets a fresh token"
    );
    assert_eq!(
        again.deliveries(),
        Some(2),
        "the retry is the key's second delivery"
    );
    // The first lease is gone: releasing or committing with it changes nothing.
    assert_lease_lost(store.release(&lease).await);
    assert_lease_lost(store.commit(&lease).await);
    expect_in_flight(store.claim(&key, LONG).await);
    store.commit(&again).await.unwrap();
    expect_done(store.claim(&key, LONG).await);
    // A done row cannot be released.
    assert_lease_lost(store.release(&again).await);
    expect_done(store.claim(&key, LONG).await);
}

/// A claim whose handler never started is given back: released, and its run taken back, so
/// that `runs` counts only runs a handler started. Twice with one lease is harmless.
pub async fn give_back_takes_the_run_back<S: Store>(store: S) {
    let key = key_in(&unique_namespace("giveback"), "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    store.give_back(&lease).await.unwrap();
    let record = store.describe(&key).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Released);
    assert_eq!((record.deliveries, record.runs), (1, 0));
    // A give-back whose answer was lost is tried again: the run is taken back once.
    store.give_back(&lease).await.unwrap();
    assert_eq!(store.describe(&key).await.unwrap().unwrap().runs, 0);
    // The next delivery runs the handler; it counts that run, and a released run stays counted.
    let again = acquire(&store, &key, LONG).await;
    store.release(&again).await.unwrap();
    assert_eq!(store.describe(&key).await.unwrap().unwrap().runs, 1);
    let third = acquire(&store, &key, LONG).await;
    assert_lease_lost(store.give_back(&lease).await);
    store.give_back(&third).await.unwrap();
    let record = store.describe(&key).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.deliveries, record.runs),
        (KeyState::Released, 3, 1)
    );
    // A committed key cannot be given back.
    let fourth = acquire(&store, &key, LONG).await;
    store.commit(&fourth).await.unwrap();
    assert_lease_lost(store.give_back(&fourth).await);
    assert_eq!(store.describe(&key).await.unwrap().unwrap().runs, 2);
}

/// A claim not renewed for the stale limit is taken over under the reclaim policy, with a new
/// token and a new clock; the old owner's late commit and release change nothing.
pub async fn stale_reclaim_fences_the_old_owner<S: Store>(store: S) {
    let key = key_in(&unique_namespace("reclaim"), "evt_1");
    let old = acquire(&store, &key, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    // Not stale under a long limit...
    expect_in_flight(store.claim(&key, LONG).await);
    // ...stale under a short one: reclaimed with a new token.
    let new = acquire(&store, &key, Stale::reclaim_after(SHORT)).await;
    assert!(new.reclaimed());
    assert_ne!(new.token(), old.token());
    // The old owner's late commit and release change nothing.
    assert_lease_lost(store.commit(&old).await);
    assert_lease_lost(store.release(&old).await);
    // The reclaim restarted the claim's clock: the row is younger than the first claim.
    let p = expect_in_flight(store.claim(&key, LONG).await);
    assert!(p.age < PAST_SHORT, "age {:?}", p.age);
    store.commit(&new).await.unwrap();
    expect_done(store.claim(&key, LONG).await);
    assert_lease_lost(store.commit(&old).await);
    expect_done(store.claim(&key, LONG).await);
}

/// Under the hold policy a stale claim is answered as held, never taken over, and its owner may
/// still commit.
pub async fn stale_hold_keeps_the_row<S: Store>(store: S) {
    let key = key_in(&unique_namespace("hold"), "evt_1");
    let hold = Stale::hold_after(SHORT);
    let owner = acquire(&store, &key, hold).await;
    expect_in_flight(store.claim(&key, hold).await);
    tokio::time::sleep(PAST_SHORT).await;
    let p = expect_held(store.claim(&key, hold).await);
    assert!(p.age >= SHORT, "age {:?}", p.age);
    assert_eq!(p.deliveries, 3);
    expect_held(store.claim(&key, hold).await);
    // The owner may still finish: its lease was never taken over.
    store.commit(&owner).await.unwrap();
    expect_done(store.claim(&key, hold).await);
}

/// `stuck_claims` lists the processing rows silent for the limit (and only those), and
/// `resolve` settles a processing row by hand, as done (its owner fenced off) or released;
/// it answers `false` for any other row.
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
    expect_done(store.claim(&old, LONG).await);
    assert_lease_lost(store.release(&old_lease).await);
    expect_done(store.claim(&old, LONG).await);
    // Only processing rows are resolved.
    assert!(!store.resolve(&old, Resolution::Release).await.unwrap());
    assert!(!store.resolve(&done, Resolution::Release).await.unwrap());
    assert!(
        !store
            .resolve(&key_in(&ns, "absent"), Resolution::Done)
            .await
            .unwrap()
    );
    expect_done(store.claim(&done, LONG).await);

    // Resolve by release: the next delivery runs.
    assert!(store.resolve(&young, Resolution::Release).await.unwrap());
    acquire(&store, &young, LONG).await;
}

/// `purge_completed` deletes done rows settled before the limit, and keeps recent ones and
/// processing ones. It purges every namespace: run it alone on its table
/// ([`SHARED_TABLE`](super::SHARED_TABLE)).
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
    expect_done(store.claim(&recent_done, LONG).await);
    expect_in_flight(store.claim(&processing, LONG).await);
}

/// A renewal moves the heartbeat: an old claim renewed just now is not stale, and it turns
/// stale one limit after its last renewal.
pub async fn renew_keeps_a_claim_fresh<S: Store>(store: S) {
    let key = key_in(&unique_namespace("renew"), "evt_1");
    let short = Stale::reclaim_after(SHORT);
    let owner = acquire(&store, &key, short).await;
    tokio::time::sleep(PAST_SHORT).await;
    store.renew(&owner).await.unwrap();
    // A claim renewed just now is not stale.
    let p = expect_in_flight(store.claim(&key, short).await);
    assert!(p.age >= SHORT, "age {:?}", p.age);
    assert!(
        p.since_renewal < SHORT,
        "since renewal {:?}",
        p.since_renewal
    );
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
    assert_lease_lost(store.renew(&owner).await);
    assert_lease_lost(store.commit(&owner).await);
    store.renew(&new).await.unwrap();
    store.commit(&new).await.unwrap();
    // Only processing rows are renewed.
    assert_lease_lost(store.renew(&new).await);
    let released = key_in(&unique_namespace("renew"), "evt_2");
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();
    store.release(&lease).await.unwrap(); // a retried release is harmless
    assert_lease_lost(store.renew(&lease).await);
    assert_lease_lost(store.commit(&lease).await);
}

/// The journal: deliveries against runs, through a failed run, a retry and a duplicate; a
/// released row is claimed as if it were new, and purged like a done one. It purges every
/// namespace: run it alone on its table ([`SHARED_TABLE`](super::SHARED_TABLE)).
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
    expect_in_flight(store.claim(&key, LONG).await);
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
    expect_done(store.claim(&key, LONG).await);
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
