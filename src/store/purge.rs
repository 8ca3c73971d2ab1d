//! A background task that purges `done` rows periodically, for any [`Store`].

use std::time::Duration;

use futures_util::future::{Either, select};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{MissedTickBehavior, interval};

use super::Store;

/// How long done rows are kept by default before [`Store::purge_completed`] may delete them:
/// 7 days, longer than the senders' retry windows (Stripe and PayPal retry for 3 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Spawns a task that calls [`Store::purge_completed`]`(retention)` now and then every
/// `every`, until the returned [`PurgeTask`] is stopped or dropped.
///
/// Keep `retention` longer than any sender retries: [`DEFAULT_RETENTION`]
/// is 7 days. A purge that fails is logged (`ERROR`) and tried again at the next tick; every
/// purge logs how many rows it deleted (`DEBUG`). Run it in one instance, or in several: purges
/// are idempotent.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::{DEFAULT_RETENTION, MemoryStore, spawn_purge};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let purge = spawn_purge(store.clone(), Duration::from_secs(60 * 60), DEFAULT_RETENTION);
/// // ... serve ...
/// purge.stop().await;
/// # }
/// ```
///
/// # Panics
///
/// If `every` is zero, or if called outside a Tokio runtime.
pub fn spawn_purge<S: Store>(store: S, every: Duration, retention: Duration) -> PurgeTask {
    assert!(!every.is_zero(), "spawn_purge: `every` must be non-zero");
    let (stop, stopped) = oneshot::channel();
    let handle = tokio::spawn(run(store, every, retention, stopped));
    PurgeTask {
        stop: Some(stop),
        handle: Some(handle),
    }
}

async fn run<S: Store>(
    store: S,
    every: Duration,
    retention: Duration,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut ticks = interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let tick = std::pin::pin!(ticks.tick());
        // Stop asked for, or the handle dropped.
        if let Either::Right(_) = select(tick, &mut stopped).await {
            return;
        }
        match store.purge_completed(retention).await {
            Ok(purged) => tracing::debug!(purged, ?retention, "purged completed claims"),
            Err(err) => tracing::error!(
                error = &err as &dyn std::error::Error,
                "purging completed claims failed; trying again at the next tick"
            ),
        }
    }
}

/// The handle of the task started by [`spawn_purge`].
///
/// [`stop`](Self::stop) ends it after the purge under way, if any. Dropping the handle stops it
/// the same way, without waiting.
#[derive(Debug)]
#[must_use = "dropping the PurgeTask stops the purge task"]
pub struct PurgeTask {
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl PurgeTask {
    /// Stops the task and waits until it has ended. A purge under way is finished first.
    ///
    /// # Panics
    ///
    /// If the task panicked (the store's `purge_completed` panicked), the panic goes on here.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take()
            && let Err(err) = handle.await
            && err.is_panic()
        {
            std::panic::resume_unwind(err.into_panic());
        }
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::time::Duration;

    use tokio::time::sleep;

    use super::spawn_purge;
    use crate::key::IdempotencyKey;
    use crate::store::{Claim, MemoryStore, Stale, Store};

    const MINUTE: Duration = Duration::from_secs(60);

    async fn done(store: &MemoryStore, id: &str) -> IdempotencyKey {
        let key = IdempotencyKey::new("purge", id).unwrap();
        let Claim::Acquired(lease) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("fresh key");
        };
        store.commit(&lease).await.unwrap();
        key
    }

    #[tokio::test(start_paused = true)]
    async fn purges_periodically_until_stopped() {
        let store = MemoryStore::new();
        let first = done(&store, "evt_1").await;
        let task = spawn_purge(store.clone(), MINUTE, 10 * MINUTE);
        sleep(5 * MINUTE).await;
        assert_eq!(store.len(), 1, "kept within retention");
        sleep(6 * MINUTE).await;
        assert!(store.is_empty(), "purged after retention");
        // Purged keys run again.
        assert!(matches!(
            store.claim(&first, Stale::default()).await.unwrap(),
            Claim::Acquired(_)
        ));

        assert!(!task.is_finished());
        task.stop().await;
        done(&store, "evt_2").await;
        sleep(60 * MINUTE).await;
        assert_eq!(store.len(), 2, "a stopped task purges nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_handle_stops_the_task() {
        let store = MemoryStore::new();
        drop(spawn_purge(store.clone(), MINUTE, MINUTE));
        done(&store, "evt_1").await;
        sleep(60 * MINUTE).await;
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    #[should_panic(expected = "non-zero")]
    async fn zero_interval_panics() {
        let _task = spawn_purge(MemoryStore::new(), Duration::ZERO, MINUTE);
    }
}
