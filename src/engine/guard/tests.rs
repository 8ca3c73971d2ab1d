use std::sync::atomic::AtomicUsize;

use super::*;
use crate::Drain;
use crate::engine::settings::Settings;
use crate::store::{Claim, KeyState, MemoryStore, Store};

/// An owner over a memory store whose commits fail `fail` times first.
struct Test {
    store: MemoryStore,
    settings: Settings,
    stale: Stale,
    fail: AtomicUsize,
}

impl Configured for Test {
    fn settings(&self) -> &Settings {
        &self.settings
    }
}

impl Owner for Test {
    type Lease = Lease;
    const WHAT: &'static str = "claim";

    fn stale(&self) -> Stale {
        self.stale
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.renew(lease).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        action: Settle,
        _receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::backend("down"));
        }
        match action {
            Settle::Commit => self.store.commit(lease).await,
            Settle::Release => self.store.release(lease).await,
            Settle::GiveBack => self.store.give_back(lease).await,
        }
    }
}

async fn make(stale: Stale, fail: usize) -> (LeaseGuard<Test>, MemoryStore, Drain) {
    let store = MemoryStore::new();
    let key = IdempotencyKey::new("guard", "evt_1").unwrap();
    let Claim::Acquired(lease) = store.claim(&key, stale).await.unwrap() else {
        panic!("a new key");
    };
    let settings = Settings::default();
    let drain = settings.drain.clone();
    let owner = Arc::new(Test {
        store: store.clone(),
        settings,
        stale,
        fail: AtomicUsize::new(fail),
    });
    let entry = drain.enter().unwrap();
    (LeaseGuard::claimed(owner, lease, entry), store, drain)
}

async fn state(store: &MemoryStore) -> KeyState {
    let key = IdempotencyKey::new("guard", "evt_1").unwrap();
    store.describe(&key).await.unwrap().unwrap().state
}

async fn settled(drain: &Drain) {
    for _ in 0..1000 {
        if drain.in_flight() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the guard never settled");
}

#[tokio::test]
async fn dropped_before_the_handler_starts_gives_the_claim_back() {
    for stale in [Stale::default(), Stale::hold_after(Duration::from_secs(1))] {
        let (guard, store, drain) = make(stale, 0).await;
        assert_eq!(drain.in_flight(), 1);
        drop(guard);
        settled(&drain).await;
        assert_eq!(state(&store).await, KeyState::Released, "{stale:?}");
    }
}

#[tokio::test]
async fn dropped_while_running_follows_the_policy() {
    let (mut guard, store, drain) = make(Stale::default(), 0).await;
    guard.start();
    drop(guard);
    settled(&drain).await;
    assert_eq!(state(&store).await, KeyState::Released, "reclaim releases");

    let (mut guard, store, drain) = make(Stale::hold_after(Duration::from_secs(1)), 0).await;
    guard.start();
    drop(guard);
    settled(&drain).await;
    assert_eq!(state(&store).await, KeyState::Processing, "hold leaves it");
}

#[tokio::test]
async fn settled_guard_does_nothing_on_drop() {
    let (mut guard, store, drain) = make(Stale::default(), 0).await;
    guard.start();
    assert_eq!(guard.settle(Settle::Commit).await, Outcome::Processed);
    settled(&drain).await;
    assert_eq!(state(&store).await, KeyState::Done);
}

#[tokio::test(start_paused = true)]
async fn failed_commit_is_retried_until_it_lands() {
    let (mut guard, store, drain) = make(Stale::default(), 3).await;
    guard.start();
    let state_arc = guard.state.clone();
    assert_eq!(guard.settle(Settle::Commit).await, Outcome::Processed);
    assert_eq!(
        state(&store).await,
        KeyState::Processing,
        "first attempt failed"
    );
    assert_eq!(drain.in_flight(), 1, "the retry counts as in flight");
    assert_eq!(state_arc.stage(), Stage::Retrying);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(state(&store).await, KeyState::Done, "a retry landed");
    assert_eq!(drain.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn retries_give_up_after_their_bound() {
    let (mut guard, store, drain) = make(Stale::default(), usize::MAX).await;
    guard.start();
    guard.settle(Settle::Commit).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(drain.in_flight(), 0, "gave up");
    assert_eq!(
        state(&store).await,
        KeyState::Processing,
        "left to the stale path"
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeat_renews_until_settled_and_remembers_a_lost_lease() {
    let stale = Stale::reclaim_after(Duration::from_secs(1));
    let key = IdempotencyKey::new("guard", "evt_1").unwrap();
    let (mut guard, store, drain) = make(stale, 0).await;
    let handle = guard.handle();
    guard.start();
    guard.start_heartbeat();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let record = store.describe(&key).await.unwrap().unwrap();
    assert!(
        record.renewed_ago.unwrap() <= stale.renew_interval(),
        "{record:?}"
    );
    assert!(matches!(
        store.claim(&key, stale).await.unwrap(),
        Claim::InFlight(_)
    ));
    assert!(handle.is_held());
    // A person settles the claim under the running handler: the next renewal finds out.
    assert!(
        store
            .resolve(&key, crate::store::Resolution::Done)
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!handle.is_held(), "the lease was taken");
    guard.settle(Settle::Commit).await;
    settled(&drain).await;

    // Settled: the heartbeat stops.
    let (mut guard, store, drain) = make(stale, 0).await;
    guard.start();
    guard.start_heartbeat();
    tokio::time::sleep(Duration::from_millis(600)).await;
    guard.settle(Settle::Release).await;
    settled(&drain).await;
    let before = store.describe(&key).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        store.describe(&key).await.unwrap().unwrap().state,
        KeyState::Released
    );
    assert_eq!(before.state, KeyState::Released);
}
