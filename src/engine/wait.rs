//! A duplicate that waits, for a bounded time, for the claim in flight to settle.

use std::pin::pin;
use std::time::Duration;

use tokio::time::Instant;

use super::drain::Drain;
use crate::key::IdempotencyKey;
use crate::store::{KeyState, Stale, Store};

/// The first pause between looks at the store, when the claim is held by another process.
const FIRST_POLL: Duration = Duration::from_millis(25);
const MAX_POLL: Duration = Duration::from_secs(1);

/// Waits until the claim on `key` is settled (or turned stale), or until `until`; answers
/// whether it is. A claim held in this process wakes the waiter when it settles; one held
/// elsewhere is polled with [`Store::describe`], which writes nothing.
pub(crate) async fn settled<St: Store>(
    store: &St,
    drain: &Drain,
    key: &IdempotencyKey,
    stale: Stale,
    store_timeout: Duration,
    until: Instant,
) -> bool {
    let mut pause = FIRST_POLL;
    loop {
        let now = Instant::now();
        if now >= until {
            return false;
        }
        match drain.find(key) {
            Some(local) => {
                let woken = local.settled().notified();
                let mut woken = pin!(woken);
                woken.as_mut().enable();
                if !local.is_settled() {
                    // Polled as well, in case the claim was taken over elsewhere meanwhile.
                    let _ = tokio::time::timeout_at(until.min(now + MAX_POLL), woken).await;
                }
            }
            None => {
                tokio::time::sleep_until(until.min(now + pause)).await;
                pause = (pause * 2).min(MAX_POLL);
            }
        }
        match tokio::time::timeout(store_timeout, store.describe(key)).await {
            Ok(Ok(Some(record))) if record.state == KeyState::Processing => {
                let since = record.renewed_ago.unwrap_or(record.claimed_ago);
                if stale.is_stale(since) {
                    return true;
                }
            }
            Ok(Ok(_)) => return true,
            // A store that fails is asked again until the deadline.
            Ok(Err(_)) | Err(_) => {}
        }
    }
}
