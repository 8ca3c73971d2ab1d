//! One attempt at an entry: the request rebuilt, the service called under the entry's lease,
//! and the entry settled as the answer says.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use tower_service::Service;
use tracing::Instrument;

use super::Inbox;
use super::settle::Settler;
use crate::body::BoxError;
use crate::engine::drain::Entry;
use crate::engine::guard::{LeaseGuard, Owner, Settle};
use crate::engine::settings::Settings;
use crate::key::IdempotencyKey;
use crate::response::Outcome;
use crate::store::inbox::{Attempt, AttemptResult, InboxStore, Settlement, Settling, Taken};
use crate::store::{Lease, LeaseToken, Receipt, Stale, StoreError};

/// What a worker's request carries in its extensions: which entry it is and which attempt.
/// The inbox layer hands a request carrying it straight to its handler. A handler that wants
/// to know may read it (and the [`LeaseHandle`](crate::LeaseHandle), there too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxDelivery {
    key: IdempotencyKey,
    attempt: u32,
    crashes: u32,
}

impl InboxDelivery {
    /// The event's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// This attempt's number: 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many earlier attempts ended with their worker gone.
    pub fn crashes(&self) -> u32 {
        self.crashes
    }
}

/// When a failed entry is tried again: exponential, from `base`, doubling up to `cap`, with
/// jitter (each delay is drawn between half of it and all of it), for `max_attempts` attempts
/// in all, crashes included.
///
/// The default: 5 seconds, doubling up to 30 minutes, 10 attempts (about 45 minutes of
/// retries before an entry is dead).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::inbox::Backoff;
///
/// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), 5);
/// let third = backoff.delay(3); // after the third attempt failed: 2 to 4 s
/// assert!(third >= Duration::from_secs(2) && third <= Duration::from_secs(4));
/// assert!(backoff.delay(30) <= Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(5), Duration::from_secs(30 * 60), 10)
    }
}

impl Backoff {
    /// A backoff from `base` up to `cap`, for `max_attempts` attempts in all (at least 1).
    pub fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        Self {
            base,
            cap: cap.max(base),
            max_attempts: max_attempts.max(1),
        }
    }

    /// How many attempts an entry gets.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long to wait after failed attempt number `attempt` (1 for the first), jitter
    /// included.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(40);
        let full = self
            .base
            .checked_mul(1 << doublings.min(31))
            .map_or(self.cap, |d| d.min(self.cap));
        LeaseToken::spread(full)
    }
}

/// What the workers of one [`Workers::spawn`] share.
pub(crate) struct Config<St> {
    pub(super) inbox: Inbox<St>,
    /// The store timeout, the commit predicate and the drain, as the lease guard reads them.
    pub(super) settings: Settings,
    pub(super) stale: Stale,
    pub(super) backoff: Backoff,
    /// Writes the settlements in batches.
    pub(super) settler: Settler,
}

/// The owner of one entry's lease: the guard renews and settles through it.
struct Attempting<St> {
    config: Arc<Config<St>>,
    /// The attempts so far, written with the settlement, and how a failure settles.
    plan: Mutex<Plan>,
}

struct Plan {
    history: Vec<Attempt>,
    failure: Settlement,
}

impl<St> Attempting<St> {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<St: InboxStore> Owner for Attempting<St> {
    type Lease = Lease;
    const WHAT: &'static str = "inbox entry";

    fn settings(&self) -> &Settings {
        &self.config.settings
    }

    fn stale(&self) -> Stale {
        self.config.stale
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.config.inbox.store().renew_entry(lease).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        action: Settle,
        _receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let (settlement, history) = {
            let plan = self.plan();
            let settlement = match action {
                Settle::Commit => Settlement::Done,
                Settle::Release => plan.failure,
                Settle::GiveBack => Settlement::GiveBack,
            };
            (settlement, plan.history.clone())
        };
        let settling = Settling {
            lease: lease.clone(),
            settlement,
            history,
        };
        self.config.settler.settle(settling).await
    }

    fn report(lease: &Lease, action: Settle, result: &Result<(), StoreError>) {
        let key = lease.key();
        match result {
            Ok(()) => tracing::debug!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                action = ?action,
                "inbox entry settled",
            ),
            Err(StoreError::LeaseLost) => tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                action = ?action,
                "lost the lease on an inbox entry: another worker took it over; nothing was \
                 changed",
            ),
            Err(error) => tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                action = ?action,
                "settling an inbox entry failed; it is retried in the background",
            ),
        }
    }
}

/// Runs one taken entry through `service` and settles it.
pub(super) async fn attempt<St, S, B, ResB>(
    config: Arc<Config<St>>,
    service: S,
    taken: Taken,
    entry: Entry,
) where
    St: InboxStore,
    S: Service<Request<B>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: From<Bytes> + Send + 'static,
{
    let Taken {
        lease,
        request,
        attempt,
        crashes,
        mut history,
    } = taken;
    if lease.reclaimed() {
        history.push(Attempt::new(Attempt::now_ms(), 0, AttemptResult::Crashed));
    }
    let failure = if attempt >= config.backoff.max_attempts() {
        Settlement::Dead
    } else {
        Settlement::Retry {
            after: config.backoff.delay(attempt),
        }
    };
    let key = lease.key().clone();
    let span = tracing::info_span!(
        "inbox_attempt",
        namespace = key.namespace(),
        key = key.value(),
        attempt,
        lease = %lease.token(),
        status = tracing::field::Empty,
        result = tracing::field::Empty,
    );
    let owner = Arc::new(Attempting {
        config,
        plan: Mutex::new(Plan { history, failure }),
    });
    let mut guard = LeaseGuard::claimed(owner.clone(), lease, entry);
    let run = async move {
        let delivery = InboxDelivery {
            key: key.clone(),
            attempt,
            crashes,
        };
        let started_ms = Attempt::now_ms();
        let rebuilt = request.uri.parse::<Uri>().map(|uri| {
            let mut req = Request::new(B::from(request.body.clone()));
            *req.method_mut() = request.method.clone();
            *req.uri_mut() = uri;
            *req.headers_mut() = request.header_map();
            req.extensions_mut().insert(delivery);
            req.extensions_mut().insert(guard.handle());
            req
        });
        let (result, success) = match rebuilt {
            Ok(req) => {
                guard.start();
                let started = Instant::now();
                let call = crate::engine::run::call(service, req);
                let mut call = std::pin::pin!(call);
                // A handler that answers at once never needs a heartbeat: one starts only
                // once it has to wait.
                let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                let ran = match first {
                    Poll::Ready(ran) => ran,
                    Poll::Pending => {
                        guard.start_heartbeat();
                        call.await
                    }
                };
                let took = started.elapsed();
                let (result, success) = match ran {
                    Ok(Ok(res)) => {
                        let status = res.status();
                        let commits = owner.config.settings.commit_when.commits(status);
                        (AttemptResult::Status(status.as_u16()), commits)
                    }
                    Ok(Err(error)) => (AttemptResult::Error(error.into().to_string()), false),
                    Err(panic) => (AttemptResult::Error(panicked(&*panic)), false),
                };
                let took_ms = took.as_millis() as u64;
                owner
                    .plan()
                    .history
                    .push(Attempt::new(started_ms, took_ms, result.clone()));
                (result, success)
            }
            Err(error) => {
                // A stored path that no longer parses can never run: dead at once.
                let result = AttemptResult::Error(format!("the stored path is not a URI: {error}"));
                let mut plan = owner.plan();
                plan.history
                    .push(Attempt::new(started_ms, 0, result.clone()));
                plan.failure = Settlement::Dead;
                (result, false)
            }
        };
        let failure = owner.plan().failure;
        let outcome = guard
            .settle(if success {
                Settle::Commit
            } else {
                Settle::Release
            })
            .await;
        let label = match (outcome, success, failure) {
            (Outcome::LeaseLost, ..) => "lease-lost",
            (_, true, _) => "done",
            (_, false, Settlement::Dead) => "dead",
            _ => "retry",
        };
        let span = tracing::Span::current();
        if let AttemptResult::Status(status) = result {
            span.record("status", status);
        }
        span.record("result", label);
        crate::metrics::inbox_attempt(key.namespace(), label);
        match (label, &result) {
            ("dead", _) => tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                attempt,
                result = ?result,
                "inbox entry dead after its last attempt; it waits for a person",
            ),
            ("retry", _) => tracing::info!(
                namespace = key.namespace(),
                key = key.value(),
                attempt,
                result = ?result,
                "inbox attempt failed; it is tried again later",
            ),
            _ => {}
        }
    };
    run.instrument(span).await;
}

/// What a panic said, as an attempt records it.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let said = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    format!("the handler panicked: {said}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(100), 9);
        for attempt in 1..=6 {
            let full = Duration::from_secs(2 << (attempt - 1)).min(Duration::from_secs(100));
            for _ in 0..50 {
                let delay = backoff.delay(attempt);
                assert!(delay >= full / 2 && delay <= full, "{attempt}: {delay:?}");
            }
        }
        assert!(backoff.delay(u32::MAX) <= Duration::from_secs(100));
        let spread: std::collections::HashSet<_> = (0..20).map(|_| backoff.delay(4)).collect();
        assert!(spread.len() > 1, "jitter spreads the delays");
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::ZERO, 0).max_attempts(),
            1
        );
    }

    #[test]
    fn a_panic_message_is_kept() {
        assert_eq!(panicked(&"boom"), "the handler panicked: boom");
        assert_eq!(
            panicked(&String::from("bang")),
            "the handler panicked: bang"
        );
        assert_eq!(panicked(&7u8), "the handler panicked: (no message)");
    }
}
