//! What the lease guard does off a delivery's usual path: the heartbeat of a lease whose
//! handler has to wait, the retries of a settlement that failed, and a panicked handler's
//! claim.

use std::future::Future;
use std::sync::Arc;

use super::{
    FIRST_RETRY, LeaseGuard, LeaseState, Leased, MAX_RETRY_DELAY, Owner, RETRIES, Settle, bounded,
};
use crate::engine::drain::{Stage, Tracked};
use crate::store::{Receipt, StalePolicy, StoreError};

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

/// What the guard does off the delivery's usual path: the heartbeat, once the handler has to
/// wait; the retries of a failed settlement; a panicked handler's claim.
impl<O: Owner> LeaseGuard<O> {
    /// Starts renewing the claim in a task of its own, every renew interval until the lease is
    /// settled. Its own task, so that a handler that hogs its thread, or a run polled late,
    /// cannot starve the heartbeat. Called once the handler has to wait: a handler that
    /// answers at once never starts one.
    pub(crate) fn start_heartbeat(&mut self) {
        if self.beating {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.beating = true;
        runtime.spawn(heartbeat(self.owner.clone(), self.state.clone()));
    }

    /// The handler panicked: under reclaim, release so the retry runs; under hold, leave the
    /// claim to the stale path, since the work may have been half done.
    // Not an `async fn`, which would hold the guard twice.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(crate) fn abandon(mut self) -> impl Future<Output = ()> + Send {
        async move {
            #[cfg(feature = "ledger")]
            self.record_run(Settle::Release, Some("the handler panicked"));
            match self.owner.stale().policy() {
                StalePolicy::Reclaim => {
                    self.settle(Settle::Release).await;
                }
                StalePolicy::Hold => {
                    left_for_hold(self.lease(), O::WHAT, "the handler panicked");
                    self.finish();
                }
            }
        }
    }

    /// Tries a failed commit or release again with backoff, the heartbeat going on. Both
    /// are fenced, so a late attempt cannot touch a claim someone else holds by now.
    pub(super) async fn retry(mut self, action: Settle) -> Result<(), StoreError> {
        // The heartbeat goes on meanwhile: the claim stays ours while the store recovers.
        let receipt = self.receipt.take();
        let landed = retried(&*self.owner, self.lease(), action, receipt.as_deref()).await;
        self.finish();
        landed
    }
}
