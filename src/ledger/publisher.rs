//! Checkpoints published on a timer, by one instance at a time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::log::{LedgerStore, publish};
use super::note::{Checkpoint, NoteSigner};
use crate::key::IdempotencyKey;
use crate::store::{Claim, Stale, Store};

/// Publishes a signed checkpoint of a ledger every so often, on whichever instance holds the
/// publisher's claim: each round claims the key `tower-idempotency:ledger-publisher` in the
/// claims store (the same claim, lease and fencing every delivery gets), publishes, and
/// releases it, so that instances running a `Publisher` each take turns and never publish at
/// once. A round that fails is logged, and the next one tries again.
#[derive(Debug)]
pub struct Publisher {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    last: Arc<Mutex<Option<Checkpoint>>>,
}

impl Publisher {
    /// Starts publishing checkpoints of `ledger`, signed by `signer` under `origin`, every
    /// `every`, taking turns with other instances through `store`. Call it inside a Tokio
    /// runtime.
    pub fn spawn<L, St>(
        ledger: L,
        store: St,
        signer: NoteSigner,
        origin: impl Into<String>,
        every: Duration,
    ) -> Self
    where
        L: LedgerStore,
        St: Store,
    {
        let (stop, mut stopped) = watch::channel(false);
        let last = Arc::new(Mutex::new(None));
        let origin = origin.into();
        let published = last.clone();
        let task = tokio::spawn(async move {
            let key =
                IdempotencyKey::new("tower-idempotency", "ledger-publisher").expect("a valid key");
            // A publisher that died holding the claim is taken over after a few rounds.
            let stale = Stale::reclaim_after((every * 4).max(Duration::from_secs(30)));
            loop {
                tokio::select! {
                    _ = stopped.changed() => return,
                    () = tokio::time::sleep(every) => {}
                }
                let lease = match store.claim(&key, stale).await {
                    Ok(Claim::Acquired(lease)) => lease,
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "the ledger's publisher could not claim its turn");
                        continue;
                    }
                };
                match publish(&ledger, &signer, &origin).await {
                    Ok(checkpoint) => {
                        *published.lock().unwrap_or_else(|p| p.into_inner()) = Some(checkpoint);
                    }
                    Err(error) => {
                        tracing::error!(%error, "the ledger's checkpoint was not published");
                    }
                }
                if let Err(error) = store.release(&lease).await {
                    tracing::warn!(%error, "the ledger's publisher could not end its turn");
                }
            }
        });
        Self { task, stop, last }
    }

    /// The last checkpoint this instance published, if any.
    pub fn last(&self) -> Option<Checkpoint> {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Stops publishing, after the round under way.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
