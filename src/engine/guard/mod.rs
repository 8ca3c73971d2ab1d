//! The lease guard: holds a claim from the moment the store grants it until it is settled, and
//! settles it whatever happens to the delivery in between. The heartbeat that renews it and
//! the retries of a failed settlement are in [`beat`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;

use super::drain::{Stage, Ticket, Tracked};
use super::observe::record;
use super::settings::Configured;
use crate::key::IdempotencyKey;
use crate::response::Outcome;
use crate::store::{
    Fingerprint, Lease, LeaseToken, Receipt, Stale, StalePolicy, StoreError, StoredResponse,
};

/// What a lease is on: a key's claim, or an entity's pending version.
pub(crate) trait Leased: Clone + Send + Sync + 'static {
    /// The key, or the entity.
    fn key(&self) -> &IdempotencyKey;
    fn token(&self) -> LeaseToken;

    /// The version the lease is on, for an entity's: what its log lines add.
    fn version(&self) -> Option<i64> {
        None
    }

    /// Which delivery of the key made the claim, where the store counted: what a run's record
    /// says.
    #[cfg(feature = "ledger")]
    fn deliveries(&self) -> Option<u64> {
        None
    }
}

impl Leased for Lease {
    fn key(&self) -> &IdempotencyKey {
        self.key()
    }

    fn token(&self) -> LeaseToken {
        self.token()
    }

    #[cfg(feature = "ledger")]
    fn deliveries(&self) -> Option<u64> {
        self.deliveries()
    }
}

/// What holds leases in a store, renewed and settled by the guard: claim-then-commit, the
/// version guard, an inbox worker's attempt. It says what its leases are on and how the store
/// renews and settles them; the guard does the rest, its logging included ([`report`]).
pub(crate) trait Owner: Configured + Send + Sync + 'static {
    type Lease: Leased;
    /// What the lease is on, for log lines and drain reports: "claim", "pending version".
    const WHAT: &'static str;

    fn stale(&self) -> Stale;

    fn renew(&self, lease: &Self::Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Commits or releases in the store, once; a commit keeps `receipt` when there is one.
    fn settle(
        &self,
        lease: &Self::Lease,
        action: Settle,
        receipt: Option<&Receipt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The ledger the owner records its handlers' runs in, if any.
    #[cfg(feature = "ledger")]
    fn ledger(&self) -> Option<&crate::ledger::Recorder> {
        None
    }
}

/// A handler's run, for the ledger: when it started, and the status it answered (none when it
/// failed without an answer).
#[cfg(feature = "ledger")]
#[derive(Debug, Clone, Copy)]
struct HandlerRun {
    started: std::time::SystemTime,
    status: Option<u16>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Commit,
    Release,
    /// A release of a claim whose handler never started: the store takes back the run the
    /// claim counted.
    GiveBack,
}

impl Settle {
    /// The store operation, as metrics name it.
    pub(crate) fn operation(self) -> &'static str {
        match self {
            Self::Commit => "commit",
            Self::Release | Self::GiveBack => "release",
        }
    }

    pub(crate) fn outcome(self) -> Outcome {
        match self {
            Self::Commit => Outcome::Processed,
            Self::Release | Self::GiveBack => Outcome::Released,
        }
    }

    /// The delivery's outcome once the store answered the settlement: fenced off, the
    /// commit or release changed nothing, and the outcome says so.
    pub(crate) fn outcome_of(self, result: &Result<(), StoreError>) -> Outcome {
        match result {
            Err(StoreError::LeaseLost) => Outcome::LeaseLost,
            _ => self.outcome(),
        }
    }
}

/// A lease and what is known about it, shared by the guard, the handler (through a
/// [`LeaseHandle`]) and the drain.
pub(crate) struct LeaseState<L> {
    lease: L,
    what: &'static str,
    held: AtomicBool,
    stage: AtomicU8,
    done: AtomicBool,
    /// Whether a duplicate waits for this lease: only then does settling notify.
    watched: AtomicBool,
    settled: Notify,
    /// Stops the heartbeat once the lease is settled.
    stop: Notify,
    /// When the handler started, if anything will read how long it took. Kept here, not in
    /// the run's future, which is boxed for every delivery.
    started: std::sync::OnceLock<std::time::Instant>,
}

impl<L> LeaseState<L> {
    pub(crate) fn new(lease: L, what: &'static str) -> Self {
        Self {
            lease,
            what,
            held: AtomicBool::new(true),
            stage: AtomicU8::new(Stage::Running.as_u8()),
            done: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            settled: Notify::new(),
            stop: Notify::new(),
            started: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn lease(&self) -> &L {
        &self.lease
    }

    pub(crate) fn set_stage(&self, stage: Stage) {
        self.stage.store(stage.as_u8(), Ordering::Relaxed);
    }

    pub(crate) fn lost(&self) {
        self.held.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Wakes whoever waits for this lease to settle. A waiter marks the lease watched before
    /// it looks at `done`, and this looks at `watched` after it set `done` (both SeqCst): one
    /// of the two sees the other, so no waiter sleeps through the settlement.
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        // A permit, kept if the heartbeat is not waiting right now.
        self.stop.notify_one();
        if self.watched.load(Ordering::SeqCst) {
            self.settled.notify_waiters();
        }
    }
}

impl<L: Leased> Tracked for LeaseState<L> {
    fn key(&self) -> &IdempotencyKey {
        self.lease.key()
    }

    fn what(&self) -> &'static str {
        self.what
    }

    fn stage(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Relaxed))
    }

    fn settled(&self) -> &Notify {
        self.watched.store(true, Ordering::SeqCst);
        &self.settled
    }

    fn is_settled(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

/// The claim a handler runs under, in the request extensions of every delivery that holds one.
///
/// The layer renews the claim while the handler runs. Should a renewal find that another
/// delivery took the claim over (this process lost the store for longer than the stale limit,
/// say), [`is_held`](Self::is_held) turns `false`: the handler's commit will not count, and a
/// long handler may stop early or make its side effect conditional.
///
/// ```
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, LeaseHandle, key, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()))
///     .service(service_fn(|req: Request<_>| async move {
///         let lease = req.extensions().get::<LeaseHandle>().expect("a claimed delivery");
///         assert!(lease.is_held());
///         assert_eq!(lease.lease().key().value(), "d-1");
///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///     }));
/// let delivery = Request::post("/").header("x-github-delivery", "d-1").body(String::new()).unwrap();
/// assert!(svc.oneshot(delivery).await.unwrap().status().is_success());
/// # }
/// ```
///
/// Under the version guard the handle is a `LeaseHandle<VersionLease>`.
pub struct LeaseHandle<L = Lease> {
    state: Arc<LeaseState<L>>,
}

impl<L> LeaseHandle<L> {
    /// The lease: the key (or entity) and its fencing token.
    pub fn lease(&self) -> &L {
        &self.state.lease
    }

    /// Whether the delivery still holds its claim, as far as the last renewal knows: `false`
    /// once a renewal was answered that another delivery took the claim over.
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }
}

impl<L> Clone for LeaseHandle<L> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
        }
    }
}

impl<L: fmt::Debug> fmt::Debug for LeaseHandle<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("lease", &self.state.lease)
            .field("held", &self.state.is_held())
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The store granted the claim; the handler has not started.
    Claimed,
    /// The handler is running.
    Running,
    /// A commit or release is under way.
    Settling(Settle),
    /// Nothing left to do.
    Settled,
}

/// How often, and for how long, a commit or release that failed is tried again.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);
const RETRIES: u32 = 12;

/// Holds a lease from the store's answer to its settlement.
///
/// Made where the store's answer arrives, so that an answer nobody reads (its delivery went
/// away during the claim) gives the claim back when it is dropped. Dropped later, it finishes
/// what it was doing: a release if the handler never started or was cut off (under hold: left
/// for the stale path), the commit or release under way otherwise.
pub(crate) struct LeaseGuard<O: Owner> {
    owner: Arc<O>,
    state: Arc<LeaseState<O::Lease>>,
    phase: Phase,
    entry: Option<Ticket>,
    /// Whether the heartbeat task runs.
    beating: bool,
    /// What a commit keeps for the key's duplicates: the request's fingerprint, the response.
    receipt: Option<Arc<Receipt>>,
    /// Whether a failed settlement is retried in place rather than in a task of its own.
    in_place: bool,
    /// The handler's run, when the owner records runs in a ledger.
    #[cfg(feature = "ledger")]
    run: Option<HandlerRun>,
}

impl<O: Owner> LeaseGuard<O> {
    /// The store granted `lease`; `entry` counts the delivery in the drain.
    pub(crate) fn claimed(owner: Arc<O>, lease: O::Lease, mut entry: Ticket) -> Self {
        if let Some(span) = super::observe::span() {
            span.record("lease", tracing::field::display(lease.token()));
        }
        let state = Arc::new(LeaseState::new(lease, O::WHAT));
        entry.hold(state.clone());
        Self {
            owner,
            state,
            phase: Phase::Claimed,
            entry: Some(entry),
            beating: false,
            receipt: None,
            in_place: false,
            #[cfg(feature = "ledger")]
            run: None,
        }
    }

    /// The request's fingerprint, which the commit keeps.
    pub(crate) fn fingerprint(&mut self, fingerprint: Fingerprint) {
        let response = self.receipt.take().and_then(|r| r.response.clone());
        self.receipt = Some(Arc::new(Receipt::new(Some(fingerprint), response)));
    }

    /// The response to replay to the key's duplicates, which the commit keeps.
    pub(crate) fn keep(&mut self, response: StoredResponse) {
        let fingerprint = self.receipt.take().and_then(|r| r.fingerprint);
        self.receipt = Some(Arc::new(Receipt::new(fingerprint, Some(response))));
    }

    pub(crate) fn lease(&self) -> &O::Lease {
        self.state.lease()
    }

    pub(crate) fn owner(&self) -> &O {
        &self.owner
    }

    /// What the handler gets in its request extensions.
    pub(crate) fn handle(&self) -> LeaseHandle<O::Lease> {
        LeaseHandle {
            state: self.state.clone(),
        }
    }

    /// The handler starts.
    pub(crate) fn start(&mut self) {
        self.phase = Phase::Running;
        #[cfg(feature = "ledger")]
        if self.owner.ledger().is_some() {
            self.run = Some(HandlerRun {
                started: std::time::SystemTime::now(),
                status: None,
            });
        }
        if let Some(now) = super::observe::started() {
            let _ = self.state.started.set(now);
        }
    }

    /// The handler answered: its span and the metrics hear how long it took.
    pub(crate) fn handler_answered(&mut self, status: Option<u16>) {
        #[cfg(feature = "ledger")]
        if let Some(run) = &mut self.run {
            run.status = status;
        }
        #[cfg(not(feature = "ledger"))]
        let _ = status;
        let Some(took) = self.state.started.get().map(std::time::Instant::elapsed) else {
            return;
        };
        if let Some(span) = super::observe::span() {
            span.record("handler_ms", took.as_secs_f64() * 1000.0);
        }
        crate::metrics::handler(self.lease().key().namespace(), took);
    }

    /// Commits or releases, and answers the delivery's outcome. A store failure is retried in
    /// the background, with the heartbeat going on, while the delivery answers.
    // Not an `async fn`, which would hold the guard twice: its future sits in every run's.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(crate) fn settle(mut self, action: Settle) -> impl Future<Output = Outcome> + Send {
        async move {
            #[cfg(feature = "ledger")]
            self.record_run(action, None);
            self.phase = Phase::Settling(action);
            self.state.set_stage(Stage::Settling);
            let timeout = self.owner.settings().store_timeout;
            let started = super::observe::started();
            let settling = self
                .owner
                .settle(self.lease(), action, self.receipt.as_deref());
            let result = bounded(settling, timeout).await;
            if let Some(started) = started {
                crate::metrics::store_call(action.operation(), started.elapsed());
            }
            if matches!(result, Err(StoreError::LeaseLost)) {
                crate::metrics::lease_lost(action.operation());
            }
            report::<O>(self.lease(), action, &result);
            let outcome = action.outcome_of(&result);
            let runtime = tokio::runtime::Handle::try_current();
            match (result, runtime) {
                (Err(StoreError::Backend(_)), Ok(runtime)) => {
                    self.state.set_stage(Stage::Retrying);
                    // The claim stays ours while the store recovers, however quickly the
                    // handler answered.
                    self.start_heartbeat();
                    if self.in_place {
                        let landed = self.retry(action).await;
                        return action.outcome_of(&landed);
                    }
                    runtime.spawn(self.retry(action));
                }
                // Settled, fenced off, or (without a runtime) left for the stale path; logged.
                _ => self.finish(),
            }
            outcome
        }
    }

    /// A settlement that fails is tried again where it is, and [`settle`](Self::settle)
    /// answers once it landed (or was given up): for a caller that must not move on before,
    /// an inbox worker whose stop waits for every settlement.
    pub(crate) fn retry_in_place(&mut self) {
        self.in_place = true;
    }

    /// Hands the handler's run to the owner's ledger, once, before its settlement (or as it
    /// is left: a panic, a run cut off), with `error` when it ended without an answer: a run
    /// that never started (a give-back) is none.
    #[cfg(feature = "ledger")]
    pub(super) fn record_run(&mut self, action: Settle, error: Option<&str>) {
        let (Some(run), Some(ledger)) = (self.run.take(), self.owner.ledger()) else {
            return;
        };
        if matches!(action, Settle::GiveBack) {
            return;
        }
        ledger.record(crate::ledger::Record {
            key: self.lease().key().clone(),
            at: std::time::SystemTime::now(),
            event: crate::ledger::Event::Run {
                delivery: self.lease().deliveries(),
                instance: ledger.instance().to_owned(),
                started: run.started,
                status: run.status,
                error: run.status.is_none().then(|| {
                    error
                        .unwrap_or("the handler failed without an answer")
                        .to_owned()
                }),
                replay: false,
            },
        });
    }

    fn finish(&mut self) {
        self.phase = Phase::Settled;
        self.state.finish();
        self.entry = None;
    }
}

impl<O: Owner> Drop for LeaseGuard<O> {
    fn drop(&mut self) {
        let action = match self.phase {
            Phase::Settled => return,
            Phase::Settling(action) => action,
            // Nothing ran: give the claim back, whatever the policy.
            Phase::Claimed => Settle::GiveBack,
            Phase::Running => {
                #[cfg(feature = "ledger")]
                self.record_run(Settle::Release, Some("the handler was cut off"));
                match self.owner.stale().policy() {
                    StalePolicy::Reclaim => Settle::Release,
                    StalePolicy::Hold => {
                        left_for_hold(self.lease(), O::WHAT, "the handler was cut off");
                        self.finish();
                        return;
                    }
                }
            }
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let lease = self.lease();
            tracing::warn!(
                namespace = lease.key().namespace(),
                key = lease.key().value(),
                lease = %lease.token(),
                "no runtime to settle a dropped {}; it is left to the stale path",
                O::WHAT,
            );
            self.finish();
            return;
        };
        let owner = self.owner.clone();
        let state = self.state.clone();
        let entry = self.entry.take();
        let receipt = self.receipt.take();
        self.phase = Phase::Settled;
        runtime.spawn(async move {
            let timeout = owner.settings().store_timeout;
            let settling = owner.settle(state.lease(), action, receipt.as_deref());
            let result = bounded(settling, timeout).await;
            if action == Settle::GiveBack && result.is_ok() {
                let lease = state.lease();
                tracing::debug!(
                    namespace = lease.key().namespace(),
                    key = lease.key().value(),
                    lease = %lease.token(),
                    "the delivery went away before its handler started; the {} was given back",
                    O::WHAT,
                );
            } else {
                report::<O>(state.lease(), action, &result);
            }
            // A claim nobody will run must not wait for the stale path: while the store
            // fails, it is tried again as a settlement is. The drain still counts it.
            if matches!(result, Err(StoreError::Backend(_))) {
                state.set_stage(Stage::Retrying);
                let _ = retried(&*owner, state.lease(), action, receipt.as_deref()).await;
            }
            state.finish();
            drop(entry);
        });
    }
}

mod beat;
#[cfg(feature = "_sql")]
mod marker;
#[cfg(all(test, feature = "memory"))]
mod tests;

#[cfg(feature = "_sql")]
pub(crate) use marker::MarkerGuard;

use beat::{left_for_hold, retried};
