//! Settlements go to the store in batches, through the group commit the SQL stores use for
//! their claims ([`Batcher`]): those that arrive while the previous batch is in flight go
//! together in the next one. There is no timer: a lone settlement is sent at once and never
//! waits for company. A batch the store does not answer within the store timeout no longer
//! holds the others back.

use std::time::Duration;

use crate::store::batch::{Batcher, DEFAULT_MOST, Shape};
use crate::store::inbox::{InboxStore, Settling};

/// Writes the settlements of one set of workers; cheap to share.
pub(super) type Settler = Batcher<Settling, ()>;

/// A settler writing to `store`, one batch in flight at a time, each holding the others back
/// for `stall` at most.
pub(super) fn settler<St: InboxStore + Clone>(store: St, stall: Duration) -> Settler {
    let alone = store.clone();
    Batcher::new(
        Shape::new(DEFAULT_MOST, 1).stall(stall),
        move |one: Settling| {
            let store = alone.clone();
            async move {
                let mut answers = store.settle_many(std::slice::from_ref(&one)).await;
                answers.pop().unwrap_or_else(|| {
                    Err(crate::store::StoreError::backend(
                        "the store answered no settlement",
                    ))
                })
            }
        },
        move |batch: Vec<Settling>| {
            let store = store.clone();
            async move { store.settle_many(&batch).await }
        },
    )
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::IdempotencyKey;
    use crate::store::inbox::{EntryState, Settlement, StoredRequest, Take};
    use crate::store::{MemoryStore, StoreError};

    #[tokio::test]
    async fn settlements_land_each_with_its_own_answer() {
        let store = MemoryStore::new();
        let request = StoredRequest::new(http::Method::POST, "/", Vec::new(), "{}".into());
        for n in 0..40 {
            let key = IdempotencyKey::new("ns", format!("e{n}")).unwrap();
            store.enqueue(&key, &request).await.unwrap();
        }
        let taken = store.take(&Take::up_to(100)).await.unwrap();
        let settler = settler(store.clone(), Duration::from_secs(5));
        let tasks: Vec<_> = taken
            .iter()
            .enumerate()
            .map(|(n, entry)| {
                let settler = settler.clone();
                let settlement = if n % 2 == 0 {
                    Settlement::Done
                } else {
                    Settlement::Retry {
                        after: Duration::from_secs(60),
                    }
                };
                let settling = Settling {
                    lease: entry.lease.clone(),
                    settlement,
                    history: Vec::new(),
                };
                tokio::spawn(async move { settler.write(settling).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        // A spent lease is fenced off, through the settler too.
        let again = Settling {
            lease: taken[0].lease.clone(),
            settlement: Settlement::Done,
            history: Vec::new(),
        };
        assert!(matches!(
            settler.write(again).await,
            Err(StoreError::LeaseLost)
        ));
        let stats = store.inbox_stats(None).await.unwrap();
        assert_eq!((stats.queued, stats.running), (20, 0));
        let done = store.entries(None, &[EntryState::Done], 100).await.unwrap();
        assert_eq!(done.len(), 20);
    }

    type Settled = std::pin::Pin<Box<dyn Future<Output = Vec<Result<(), StoreError>>> + Send>>;

    /// A store whose next batch of settlements hangs until released.
    #[derive(Clone)]
    struct Hangs {
        store: MemoryStore,
        hang: Arc<AtomicBool>,
    }

    impl Hangs {
        fn settle_many(&self, batch: Vec<Settling>) -> Settled {
            let (store, hang) = (self.store.clone(), self.hang.swap(false, Ordering::SeqCst));
            Box::pin(async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                store.settle_many(&batch).await
            })
        }
    }

    #[tokio::test]
    async fn a_batch_that_hangs_does_not_hold_the_others_back() {
        let store = MemoryStore::new();
        let request = StoredRequest::new(http::Method::POST, "/", Vec::new(), "{}".into());
        for n in 0..3 {
            let key = IdempotencyKey::new("ns", format!("e{n}")).unwrap();
            store.enqueue(&key, &request).await.unwrap();
        }
        let taken = store.take(&Take::up_to(3)).await.unwrap();
        let hangs = Hangs {
            store: store.clone(),
            hang: Arc::new(AtomicBool::new(true)),
        };
        let alone = hangs.clone();
        let settler: Settler = Batcher::new(
            Shape::new(DEFAULT_MOST, 1).stall(Duration::from_millis(50)),
            move |one| {
                let answers = alone.settle_many(vec![one]);
                async move { answers.await.remove(0) }
            },
            move |batch| hangs.settle_many(batch),
        );
        let settle = |n: usize| {
            let settler = settler.clone();
            let settling = Settling {
                lease: taken[n].lease.clone(),
                settlement: Settlement::Done,
                history: Vec::new(),
            };
            tokio::spawn(async move { settler.write(settling).await })
        };
        // The first settlement's statement hangs (a connection that stopped answering).
        let hung = settle(0);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let others = [settle(1), settle(2)];
        for other in others {
            tokio::time::timeout(Duration::from_secs(5), other)
                .await
                .expect("the settlements behind a hung one land")
                .unwrap()
                .unwrap();
        }
        assert!(!hung.is_finished(), "the hung one is still waiting");
        let done = store.entries(None, &[EntryState::Done], 10).await.unwrap();
        assert_eq!(done.len(), 2);
    }
}
