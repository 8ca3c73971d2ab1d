//! The lease guard: holds a claim from the moment the store grants it until it is settled, and
//! settles it whatever happens to the delivery in between.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;

use super::drain::{Entry, Stage, Tracked};
use super::settings::Settings;
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
}

impl Leased for Lease {
    fn key(&self) -> &IdempotencyKey {
        self.key()
    }

    fn token(&self) -> LeaseToken {
        self.token()
    }
}

/// A mode whose claims are leases in a store: claim-then-commit and the version guard. The
/// guard renews, commits and releases through it.
pub(crate) trait Owner: Send + Sync + 'static {
    type Lease: Leased;
    /// What the lease is on, for log lines and drain reports: "claim", "pending version".
    const WHAT: &'static str;

    fn settings(&self) -> &Settings;
    fn stale(&self) -> Stale;

    fn renew(&self, lease: &Self::Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Commits or releases in the store, once; a commit keeps `receipt` when there is one.
    fn settle(
        &self,
        lease: &Self::Lease,
        action: Settle,
        receipt: Option<&Receipt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Logs how a settlement went.
    fn report(lease: &Self::Lease, action: Settle, result: &Result<(), StoreError>);
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
    entry: Option<Entry>,
    /// Whether the heartbeat task runs.
    beating: bool,
    /// What a commit keeps for the key's duplicates: the request's fingerprint, the response.
    receipt: Option<Arc<Receipt>>,
}

impl<O: Owner> LeaseGuard<O> {
    /// The store granted `lease`; `entry` counts the delivery in the drain.
    pub(crate) fn claimed(owner: Arc<O>, lease: O::Lease, mut entry: Entry) -> Self {
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
        if let Some(now) = super::observe::started() {
            let _ = self.state.started.set(now);
        }
    }

    /// The handler answered: its span and the metrics hear how long it took.
    pub(crate) fn handler_answered(&self) {
        let Some(took) = self.state.started.get().map(std::time::Instant::elapsed) else {
            return;
        };
        if let Some(span) = super::observe::span() {
            span.record("handler_ms", took.as_secs_f64() * 1000.0);
        }
        crate::metrics::handler(self.lease().key().namespace(), took);
    }

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

    /// Commits or releases, and answers the delivery's outcome. A store failure is retried in
    /// the background, with the heartbeat going on, while the delivery answers.
    // Not an `async fn`, which would hold the guard twice: its future sits in every run's.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub(crate) fn settle(mut self, action: Settle) -> impl Future<Output = Outcome> + Send {
        async move {
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
            O::report(self.lease(), action, &result);
            let outcome = action.outcome_of(&result);
            let runtime = tokio::runtime::Handle::try_current();
            match (result, runtime) {
                (Err(StoreError::Backend(_)), Ok(runtime)) => {
                    self.state.set_stage(Stage::Retrying);
                    runtime.spawn(self.retry(action));
                }
                // Settled, fenced off, or (without a runtime) left for the stale path; logged.
                _ => self.finish(),
            }
            outcome
        }
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
    async fn retry(mut self, action: Settle) {
        // The heartbeat goes on meanwhile: the claim stays ours while the store recovers.
        let receipt = self.receipt.take();
        retried(&*self.owner, self.lease(), action, receipt.as_deref()).await;
        self.finish();
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
            Phase::Running => match self.owner.stale().policy() {
                StalePolicy::Reclaim => Settle::Release,
                StalePolicy::Hold => {
                    left_for_hold(self.lease(), O::WHAT, "the handler was cut off");
                    self.finish();
                    return;
                }
            },
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
                O::report(state.lease(), action, &result);
            }
            // A claim nobody will run must not wait for the stale path: while the store
            // fails, it is tried again as a settlement is. The drain still counts it.
            if matches!(result, Err(StoreError::Backend(_))) {
                state.set_stage(Stage::Retrying);
                retried(&*owner, state.lease(), action, receipt.as_deref()).await;
            }
            state.finish();
            drop(entry);
        });
    }
}

/// The heartbeat of one lease: a renewal every renew interval, at a fixed rate from the claim,
/// each bounded by the store timeout and by the interval itself, so that one renewal that
/// hangs cannot delay the next. Ends once the lease is settled, or found taken over.
async fn heartbeat<O: Owner>(owner: Arc<O>, state: Arc<LeaseState<O::Lease>>) {
    let every = owner.stale().renew_interval();
    let bound = owner.settings().store_timeout.min(every);
    let mut next = super::later(tokio::time::Instant::now(), every);
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
        next = super::later(next, every);
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
/// the store answers something other than a failure, and says how it went.
async fn retried<O: Owner>(owner: &O, lease: &O::Lease, action: Settle, receipt: Option<&Receipt>) {
    let timeout = owner.settings().store_timeout;
    let mut delay = FIRST_RETRY;
    for attempt in 1..=RETRIES {
        tokio::time::sleep(delay).await;
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
            O::report(lease, action, &result);
            return;
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
}

fn left_for_hold<L: Leased>(lease: &L, what: &str, why: &str) {
    tracing::warn!(
        namespace = lease.key().namespace(),
        key = lease.key().value(),
        lease = %lease.token(),
        "{why}; under the hold policy the {what} stays for review once stale",
    );
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::Drain;
    use crate::store::{Claim, KeyState, MemoryStore, Store};

    /// An owner over a memory store whose commits fail `fail` times first.
    struct Test {
        store: MemoryStore,
        settings: Settings,
        stale: Stale,
        fail: AtomicUsize,
    }

    impl Owner for Test {
        type Lease = Lease;
        const WHAT: &'static str = "claim";

        fn settings(&self) -> &Settings {
            &self.settings
        }

        fn stale(&self) -> Stale {
            self.stale
        }

        async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
            self.store.renew(lease).await
        }

        async fn settle(
            &self,
            lease: &Lease,
            action: Settle,
            _receipt: Option<&Receipt>,
        ) -> Result<(), StoreError> {
            if self
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(StoreError::backend("down"));
            }
            match action {
                Settle::Commit => self.store.commit(lease).await,
                Settle::Release => self.store.release(lease).await,
                Settle::GiveBack => self.store.give_back(lease).await,
            }
        }

        fn report(_: &Lease, _: Settle, _: &Result<(), StoreError>) {}
    }

    async fn make(stale: Stale, fail: usize) -> (LeaseGuard<Test>, MemoryStore, Drain) {
        let store = MemoryStore::new();
        let key = IdempotencyKey::new("guard", "evt_1").unwrap();
        let Claim::Acquired(lease) = store.claim(&key, stale).await.unwrap() else {
            panic!("a new key");
        };
        let settings = Settings::default();
        let drain = settings.drain.clone();
        let owner = Arc::new(Test {
            store: store.clone(),
            settings,
            stale,
            fail: AtomicUsize::new(fail),
        });
        let entry = drain.enter().unwrap();
        (LeaseGuard::claimed(owner, lease, entry), store, drain)
    }

    async fn state(store: &MemoryStore) -> KeyState {
        let key = IdempotencyKey::new("guard", "evt_1").unwrap();
        store.describe(&key).await.unwrap().unwrap().state
    }

    async fn settled(drain: &Drain) {
        for _ in 0..1000 {
            if drain.in_flight() == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the guard never settled");
    }

    #[tokio::test]
    async fn dropped_before_the_handler_starts_gives_the_claim_back() {
        for stale in [Stale::default(), Stale::hold_after(Duration::from_secs(1))] {
            let (guard, store, drain) = make(stale, 0).await;
            assert_eq!(drain.in_flight(), 1);
            drop(guard);
            settled(&drain).await;
            assert_eq!(state(&store).await, KeyState::Released, "{stale:?}");
        }
    }

    #[tokio::test]
    async fn dropped_while_running_follows_the_policy() {
        let (mut guard, store, drain) = make(Stale::default(), 0).await;
        guard.start();
        drop(guard);
        settled(&drain).await;
        assert_eq!(state(&store).await, KeyState::Released, "reclaim releases");

        let (mut guard, store, drain) = make(Stale::hold_after(Duration::from_secs(1)), 0).await;
        guard.start();
        drop(guard);
        settled(&drain).await;
        assert_eq!(state(&store).await, KeyState::Processing, "hold leaves it");
    }

    #[tokio::test]
    async fn settled_guard_does_nothing_on_drop() {
        let (mut guard, store, drain) = make(Stale::default(), 0).await;
        guard.start();
        assert_eq!(guard.settle(Settle::Commit).await, Outcome::Processed);
        settled(&drain).await;
        assert_eq!(state(&store).await, KeyState::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_commit_is_retried_until_it_lands() {
        let (mut guard, store, drain) = make(Stale::default(), 3).await;
        guard.start();
        let state_arc = guard.state.clone();
        assert_eq!(guard.settle(Settle::Commit).await, Outcome::Processed);
        assert_eq!(
            state(&store).await,
            KeyState::Processing,
            "first attempt failed"
        );
        assert_eq!(drain.in_flight(), 1, "the retry counts as in flight");
        assert_eq!(state_arc.stage(), Stage::Retrying);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(state(&store).await, KeyState::Done, "a retry landed");
        assert_eq!(drain.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_give_up_after_their_bound() {
        let (mut guard, store, drain) = make(Stale::default(), usize::MAX).await;
        guard.start();
        guard.settle(Settle::Commit).await;
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(drain.in_flight(), 0, "gave up");
        assert_eq!(
            state(&store).await,
            KeyState::Processing,
            "left to the stale path"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeat_renews_until_settled_and_remembers_a_lost_lease() {
        let stale = Stale::reclaim_after(Duration::from_secs(1));
        let key = IdempotencyKey::new("guard", "evt_1").unwrap();
        let (mut guard, store, drain) = make(stale, 0).await;
        let handle = guard.handle();
        guard.start();
        guard.start_heartbeat();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let record = store.describe(&key).await.unwrap().unwrap();
        assert!(
            record.renewed_ago.unwrap() <= stale.renew_interval(),
            "{record:?}"
        );
        assert!(matches!(
            store.claim(&key, stale).await.unwrap(),
            Claim::InFlight(_)
        ));
        assert!(handle.is_held());
        // A person settles the claim under the running handler: the next renewal finds out.
        assert!(
            store
                .resolve(&key, crate::store::Resolution::Done)
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!handle.is_held(), "the lease was taken");
        guard.settle(Settle::Commit).await;
        settled(&drain).await;

        // Settled: the heartbeat stops.
        let (mut guard, store, drain) = make(stale, 0).await;
        guard.start();
        guard.start_heartbeat();
        tokio::time::sleep(Duration::from_millis(600)).await;
        guard.settle(Settle::Release).await;
        settled(&drain).await;
        let before = store.describe(&key).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            store.describe(&key).await.unwrap().unwrap().state,
            KeyState::Released
        );
        assert_eq!(before.state, KeyState::Released);
    }
}
