//! Giving back a claim whose answer was lost, in a task of its own.

use std::future::Future;
use std::time::Duration;

use super::{Lease, LeaseToken, StoreError};
use crate::key::IdempotencyKey;

/// A claim made with `token` failed after it may have reached the store: its answer was lost
/// (a response timeout, a connection dropped after the write), so the store may hold a claim
/// that nobody will run. Gives it back in a task of its own, with `give_back`, fenced by the
/// token: a claim that never landed, or was settled or taken over since, answers
/// [`StoreError::LeaseLost`] and nothing changes. Tried again with backoff while the store
/// fails, a bounded number of times. Without a runtime, the claim is left to the stale path.
pub(crate) fn give_back_unanswered<F, Fut>(key: &IdempotencyKey, token: LeaseToken, give_back: F)
where
    F: Fn(Lease) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    const ATTEMPTS: u32 = 8;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let lease = Lease::new(key.clone(), token, false);
    runtime.spawn(async move {
        let mut delay = Duration::from_millis(250);
        for _ in 0..ATTEMPTS {
            match give_back(lease.clone()).await {
                Ok(()) => {
                    tracing::info!(
                        namespace = lease.key().namespace(),
                        key = lease.key().value(),
                        lease = %lease.token(),
                        "a claim whose answer was lost was given back",
                    );
                    return;
                }
                // It never landed, or it is not ours to give back any more.
                Err(StoreError::LeaseLost) => return,
                Err(StoreError::Backend(_)) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::warn!(
            namespace = lease.key().namespace(),
            key = lease.key().value(),
            lease = %lease.token(),
            "could not give back a claim whose answer was lost; if it landed, it turns stale \
             one stale limit after it was made, and the stale policy decides",
        );
    });
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::{Claim, KeyRecord, KeyState, MemoryStore, Stale, Store};

    /// Waits, a little at a time, until `key` is in `state`.
    async fn settles(store: &MemoryStore, key: &IdempotencyKey, state: KeyState) -> KeyRecord {
        for _ in 0..200 {
            let record = store.describe(key).await.unwrap().unwrap();
            if record.state == state {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{key} never became {state:?}");
    }

    /// A claim that landed, its answer lost: given back, after the store fails twice, with
    /// its run taken back, so that the sender's retry runs the handler.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_claim_is_given_back_once_the_store_answers() {
        let store = MemoryStore::new();
        let key = IdempotencyKey::new("test", "lost").unwrap();
        let Claim::Acquired(lease) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("a new key");
        };
        let tries = Arc::new(AtomicUsize::new(0));
        let (memory, count) = (store.clone(), tries.clone());
        give_back_unanswered(&key, lease.token(), move |lease| {
            let (store, tries) = (memory.clone(), count.clone());
            async move {
                if tries.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(StoreError::backend("connection refused"));
                }
                store.give_back(&lease).await
            }
        });
        let record = settles(&store, &key, KeyState::Released).await;
        assert_eq!((record.deliveries, record.runs), (1, 0));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert!(matches!(
            store.claim(&key, Stale::default()).await.unwrap(),
            Claim::Acquired(_)
        ));
    }

    /// A claim that never landed, or that another delivery holds by now, is left alone.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_claim_that_is_not_ours_is_left_alone() {
        let store = MemoryStore::new();
        let key = IdempotencyKey::new("test", "theirs").unwrap();
        let Claim::Acquired(theirs) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("a new key");
        };
        let tries = Arc::new(AtomicUsize::new(0));
        let (memory, count) = (store.clone(), tries.clone());
        give_back_unanswered(&key, LeaseToken::generate(), move |lease| {
            let (store, tries) = (memory.clone(), count.clone());
            async move {
                tries.fetch_add(1, Ordering::SeqCst);
                store.give_back(&lease).await
            }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(tries.load(Ordering::SeqCst), 1, "lease lost: no second try");
        let record = store.describe(&key).await.unwrap().unwrap();
        assert_eq!((record.state, record.runs), (KeyState::Processing, 1));
        store.commit(&theirs).await.unwrap();
    }
}
