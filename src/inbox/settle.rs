//! Settlements go to the store in batches: those that arrive while the store's previous
//! batch is in flight go together in the next one. There is no timer: a lone settlement is
//! sent at once and never waits for company.

use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;
use crate::store::inbox::{InboxStore, Settling};

type Reply = oneshot::Sender<Result<(), StoreError>>;

/// The most settlements in one store call.
const MOST: usize = 128;

/// Hands settlements to the task that writes them; cheap to share.
pub(super) struct Settler {
    queue: mpsc::UnboundedSender<(Settling, Reply)>,
}

impl Settler {
    /// A settler writing to `store`, its task spawned on the current runtime. The task ends
    /// once the settler is dropped and its queue is written.
    pub(super) fn spawn<St: InboxStore + Clone>(store: St) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(write(store, waiting));
        Self { queue }
    }

    /// Settles one entry, in whichever batch it meets.
    pub(super) async fn settle(&self, settling: Settling) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.queue.send((settling, reply)).is_err() {
            return Err(StoreError::backend("the inbox's settler stopped"));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::backend("the inbox's settler stopped")))
    }
}

async fn write<St: InboxStore>(store: St, mut waiting: mpsc::UnboundedReceiver<(Settling, Reply)>) {
    let mut batch = Vec::with_capacity(MOST);
    let mut replies = Vec::with_capacity(MOST);
    while let Some((settling, reply)) = waiting.recv().await {
        batch.push(settling);
        replies.push(reply);
        while batch.len() < MOST {
            let Ok((settling, reply)) = waiting.try_recv() else {
                break;
            };
            batch.push(settling);
            replies.push(reply);
        }
        let results = store.settle_many(&batch).await;
        let mut results = results.into_iter();
        for reply in replies.drain(..) {
            let result = results.next().unwrap_or_else(|| {
                Err(StoreError::backend(
                    "the store answered fewer settlements than asked",
                ))
            });
            let _ = reply.send(result);
        }
        batch.clear();
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::IdempotencyKey;
    use crate::store::MemoryStore;
    use crate::store::inbox::{EntryState, Settlement, StoredRequest, Take};

    #[tokio::test]
    async fn settlements_land_each_with_its_own_answer() {
        let store = MemoryStore::new();
        let request = StoredRequest::new(http::Method::POST, "/", Vec::new(), "{}".into());
        for n in 0..40 {
            let key = IdempotencyKey::new("ns", format!("e{n}")).unwrap();
            store.enqueue(&key, &request).await.unwrap();
        }
        let take = Take {
            limit: 100,
            ..Take::default()
        };
        let taken = store.take(&take).await.unwrap();
        let settler = std::sync::Arc::new(Settler::spawn(store.clone()));
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
                tokio::spawn(async move { settler.settle(settling).await })
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
            settler.settle(again).await,
            Err(StoreError::LeaseLost)
        ));
        let stats = store.inbox_stats(None).await.unwrap();
        assert_eq!((stats.queued, stats.running), (20, 0));
        let done = store.entries(None, &[EntryState::Done], 100).await.unwrap();
        assert_eq!(done.len(), 20);
    }
}
