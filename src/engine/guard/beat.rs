//! The heartbeat of a lease, the bound on each store call, the retries of a settlement that
//! failed, and the log of how each settlement went.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::{FIRST_RETRY, LeaseState, Leased, MAX_RETRY_DELAY, Owner, RETRIES, Settle};
use crate::engine::drain::{Stage, Tracked};
use crate::engine::observe::record;
use crate::store::{Receipt, StoreError};

/// The heartbeat of one lease: a renewal every renew interval, at a fixed rate from the claim,
/// each bounded by the store timeout and by the interval itself, so that one renewal that
/// hangs cannot delay the next. Ends once the lease is settled, or found taken over.
pub(super) async fn heartbeat<O: Owner>(owner: Arc<O>, state: Arc<LeaseState<O::Lease>>) {
    let every = owner.stale().renew_interval();
    let bound = owner.settings().store_timeout.min(every);
    let mut next = crate::body::later(tokio::time::Instant::now(), every);
    loop {
        let stopped = state.stop.notified();
        let mut stopped = std::pin::pin!(stopped);
        stopped.as_mut().enable();
        if state.is_settled() {
            return;
        }
        let beat = std::pin::pin!(tokio::time::sleep_until(next));
        if let futures_util::future::Either::Right(_) =
            futures_util::future::select(beat, stopped).await
        {
            return;
        }
        next = crate::body::later(next, every);
        let started = std::time::Instant::now();
        let result = bounded(owner.renew(state.lease()), bound).await;
        crate::metrics::store_call("renew", started.elapsed());
        // Once the settlement has begun, a renewal has nothing left to say: the commit or the
        // release it raced may have changed the row already.
        if state.is_settled() || state.stage() != Stage::Running && state.stage() != Stage::Retrying
        {
            continue;
        }
        let lease = state.lease();
        match result {
            Ok(()) => tracing::trace!(lease = %lease.token(), "renewed"),
            Err(StoreError::LeaseLost) => {
                if state.stage() == Stage::Retrying {
                    return; // the retried settlement finds out, and says so
                }
                crate::metrics::lease_lost("renew");
                state.lost();
                tracing::warn!(
                    namespace = lease.key().namespace(),
                    key = lease.key().value(),
                    lease = %lease.token(),
                    "lost the {} while the handler runs: it was not renewed within the stale \
                     limit and another delivery took it over; this run's commit will not count",
                    O::WHAT,
                );
                return;
            }
            Err(error) => tracing::warn!(
                namespace = lease.key().namespace(),
                key = lease.key().value(),
                lease = %lease.token(),
                error = &error as &dyn std::error::Error,
                "renewing the {} failed; trying again at the next heartbeat",
                O::WHAT,
            ),
        }
    }
}

/// A store call, bounded by the store timeout. A store that answers at the first poll (the
/// memory store) never needs the timer, and none is made for it.
pub(crate) async fn bounded(
    call: impl Future<Output = Result<(), StoreError>>,
    timeout: Duration,
) -> Result<(), StoreError> {
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    if let Poll::Ready(result) = first {
        return result;
    }
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::backend(format!(
                "the store did not answer within {timeout:?}"
            )))
        })
}

/// Tries a settlement that failed again, with backoff, up to [`RETRIES`] more times or until
/// the store answers something other than a failure, says how it went, and answers the last
/// result.
pub(super) async fn retried<O: Owner>(
    owner: &O,
    lease: &O::Lease,
    action: Settle,
    receipt: Option<&Receipt>,
) -> Result<(), StoreError> {
    let timeout = owner.settings().store_timeout;
    let mut delay = FIRST_RETRY;
    for attempt in 1..=RETRIES {
        // Settlements that failed together (one batch of commits, say) come back apart.
        tokio::time::sleep(crate::store::LeaseToken::spread(delay)).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
        crate::metrics::settle_retry(action.operation());
        let result = bounded(owner.settle(lease, action, receipt), timeout).await;
        if !matches!(result, Err(StoreError::Backend(_))) {
            tracing::info!(
                namespace = lease.key().namespace(),
                key = lease.key().value(),
                lease = %lease.token(),
                attempt,
                action = ?action,
                settled = result.is_ok(),
                "a {} that failed was tried again",
                O::WHAT,
            );
            super::report::<O>(lease, action, &result);
            return result;
        }
    }
    tracing::error!(
        namespace = lease.key().namespace(),
        key = lease.key().value(),
        lease = %lease.token(),
        action = ?action,
        "gave up settling the {} after {RETRIES} more attempts; it turns stale one stale \
         limit from its last heartbeat, and the stale policy decides",
        O::WHAT,
    );
    Err(StoreError::backend(format!(
        "gave up settling the {} after {RETRIES} more attempts",
        O::WHAT
    )))
}

pub(super) fn left_for_hold<L: Leased>(lease: &L, what: &str, why: &str) {
    tracing::warn!(
        namespace = lease.key().namespace(),
        key = lease.key().value(),
        lease = %lease.token(),
        "{why}; under the hold policy the {what} stays for review once stale",
    );
}

/// Logs how a settlement went, for every owner alike: the `delivery` event with the outcome,
/// and a warning or an error when the settlement did not land.
pub(crate) fn report<O: Owner>(lease: &O::Lease, action: Settle, result: &Result<(), StoreError>) {
    let key = lease.key();
    let version = lease.version();
    record(key, version, Some(lease.token()), action.outcome_of(result));
    match (result, action) {
        (Ok(()), _) => {}
        (Err(StoreError::LeaseLost), _) => tracing::warn!(
            namespace = key.namespace(),
            key = key.value(),
            version,
            lease = %lease.token(),
            action = ?action,
            "lost the lease on the {}: another delivery took it over; nothing was changed",
            O::WHAT,
        ),
        (Err(error), Settle::Commit) => tracing::error!(
            namespace = key.namespace(),
            key = key.value(),
            version,
            lease = %lease.token(),
            error = error as &dyn std::error::Error,
            "committing the {} failed after the handler succeeded; it is retried",
            O::WHAT,
        ),
        (Err(error), Settle::Release | Settle::GiveBack) => tracing::error!(
            namespace = key.namespace(),
            key = key.value(),
            version,
            lease = %lease.token(),
            error = error as &dyn std::error::Error,
            action = ?action,
            "releasing the {} failed; it is retried",
            O::WHAT,
        ),
    }
}
