//! The [`InboxStore`] contract when a lease lapses: an entry whose worker crashed is taken
//! over (reclaim) or left for a person (hold); a give-back queues an entry again; an entry
//! whose worker never started it is taken again without a crash. The checks share the
//! store's inbox with nothing else while they run ([`INBOX_TABLE`](super::INBOX_TABLE)).

use std::time::Duration;

use crate::store::inbox::{EntryState, InboxStore, Running, Settlement};
use crate::store::{LeaseToken, Stale};

use super::expect::assert_lease_lost;
use super::inbox::{
    LONG, one_entry, run_again_by_hand, settle_done, take, take_one, take_one_unstarted, take_ours,
};
use super::{PAST_SHORT, SHORT};

/// A lease renewed stays; one left unrenewed past the stale limit is taken over under
/// reclaim (a crash, counted; the old worker is fenced off), and ends dead once the attempts
/// run out.
///
/// The limit is a second, and the checks keep most of it as margin: a renewal is stamped by
/// the database before its commit, which may wait a while for the disk.
pub async fn reclaim_counts_crashes_and_ends_dead<S: InboxStore>(store: S) {
    const LIMIT: Duration = Duration::from_secs(1);
    const PAST_LIMIT: Duration = Duration::from_millis(1500);
    let (ns, key) = one_entry(&store, "inbox-reclaim").await;
    let policy = take(10, Stale::reclaim_after(LIMIT), 2);
    let first = take_one(&store, &policy, &ns).await;
    tokio::time::sleep(LIMIT / 2).await;
    store.renew_entry(&first.lease).await.unwrap();
    tokio::time::sleep(LIMIT / 5).await;
    assert!(
        take_ours(&store, &policy, &ns).await.is_empty(),
        "renewed within the limit"
    );
    tokio::time::sleep(PAST_LIMIT).await;
    let second = take_one(&store, &policy, &ns).await;
    assert!(second.lease.reclaimed());
    assert_eq!((second.attempt, second.crashes), (2, 1));
    assert_lease_lost(store.settle(&first.lease, &Settlement::Done, &[]).await);
    tokio::time::sleep(PAST_LIMIT).await;
    assert!(
        take_ours(&store, &policy, &ns).await.is_empty(),
        "a crash on the last attempt ends dead"
    );
    let dead = store.entry(&key).await.unwrap().unwrap();
    assert_eq!((dead.state, dead.crashes), (EntryState::Dead, 2));
    assert_lease_lost(store.renew_entry(&second.lease).await);
}

/// Under hold, an entry whose worker stopped renewing stays running, listed for a person,
/// who runs it again (its first worker, back, is fenced off) or discards it.
pub async fn hold_leaves_a_crashed_entry_running<S: InboxStore>(store: S) {
    let (ns, key) = one_entry(&store, "inbox-hold").await;
    let policy = take(10, Stale::hold_after(SHORT), 5);
    let first = take_one(&store, &policy, &ns).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert!(take_ours(&store, &policy, &ns).await.is_empty());
    let listed = store
        .entries(Some(&ns), &[EntryState::Running], 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].since_renewal.unwrap() >= SHORT);
    run_again_by_hand(&store, &key).await;
    assert_lease_lost(store.settle(&first.lease, &Settlement::Done, &[]).await);
    let second = take_one(&store, &policy, &ns).await;
    assert_eq!(second.attempt, 2);
    assert!(
        !store
            .discard(&key, Running::StaleFor(Duration::from_secs(600)))
            .await
            .unwrap(),
        "a live worker's entry is left to it"
    );
    assert!(
        store.discard(&key, Running::Force).await.unwrap(),
        "or discards it, running"
    );
    assert_eq!(
        store.entry(&key).await.unwrap().unwrap().state,
        EntryState::Done
    );
    assert_lease_lost(store.renew_entry(&second.lease).await);
}

/// A give-back queues the entry again at once and takes back the attempt it counted; so does
/// a give-back by token, of entries whose take's answer the worker never heard, whether or not
/// it started them; tokens that lease nothing change nothing.
pub async fn give_back_takes_the_attempt_back<S: InboxStore>(store: S) {
    let (ns, key) = one_entry(&store, "inbox-give-back").await;
    let policy = take(10, LONG, 5);
    let first = take_one(&store, &policy, &ns).await;
    store
        .settle(&first.lease, &Settlement::GiveBack, &[])
        .await
        .unwrap();
    let again = take_one(&store, &policy, &ns).await;
    assert_eq!(again.attempt, 1);
    assert_eq!(store.entry(&key).await.unwrap().unwrap().attempts, 1);
    // Given back by its token: a take whose answer came too late.
    assert_eq!(store.give_back(&[again.lease.token()]).await.unwrap(), 1);
    assert_eq!(store.entry(&key).await.unwrap().unwrap().attempts, 0);
    assert_lease_lost(store.settle(&again.lease, &Settlement::Done, &[]).await);
    let third = take_one_unstarted(&store, &policy, &ns).await;
    assert_eq!(third.attempt, 1);
    let tokens = [LeaseToken::generate(), third.lease.token()];
    assert_eq!(store.give_back(&tokens).await.unwrap(), 1);
    assert_eq!(
        store.give_back(&tokens).await.unwrap(),
        0,
        "nothing is leased under them any more"
    );
    let described = store.entry(&key).await.unwrap().unwrap();
    assert_eq!(
        (described.state, described.attempts),
        (EntryState::Queued, 0)
    );
    let last = take_one(&store, &policy, &ns).await;
    assert_eq!((last.attempt, last.crashes), (1, 0));
    settle_done(&store, &last.lease).await;
}

/// An entry whose handler never started (its worker died between the take and the start, or
/// never heard the take's answer) is taken again once its lease is stale, under hold as under
/// reclaim, with no crash counted and no attempt spent; `start` answers whether each lease
/// still holds, and counts an attempt once.
pub async fn an_unstarted_entry_is_taken_again_without_a_crash<S: InboxStore>(store: S) {
    let (ns, key) = one_entry(&store, "inbox-unstarted").await;
    let hold = take(10, Stale::hold_after(SHORT), 1);
    let lost = take_one_unstarted(&store, &hold, &ns).await;
    assert_eq!(lost.attempt, 1);
    assert!(
        take_ours(&store, &hold, &ns).await.is_empty(),
        "running, renewed just now"
    );
    tokio::time::sleep(PAST_SHORT).await;
    let again = take_one(&store, &hold, &ns).await;
    assert!(!again.lease.reclaimed(), "nobody ran it: no crash");
    assert_eq!((again.attempt, again.crashes), (1, 0));
    assert!(again.history.is_empty());
    assert_eq!(
        store
            .start(&[lost.lease.clone(), again.lease.clone()])
            .await
            .unwrap(),
        vec![false, true],
        "the first lease is spent; started twice, the second counts once"
    );
    let described = store.entry(&key).await.unwrap().unwrap();
    assert_eq!((described.attempts, described.crashes), (1, 0));
    // Started, then its worker stopped renewing: under hold, kept for a person.
    tokio::time::sleep(PAST_SHORT).await;
    assert!(take_ours(&store, &hold, &ns).await.is_empty());
    run_again_by_hand(&store, &key).await;
    let third = take_one(&store, &hold, &ns).await;
    assert_eq!(third.attempt, 2);
    settle_done(&store, &third.lease).await;
}
