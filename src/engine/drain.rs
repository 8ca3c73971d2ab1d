//! The drain: which deliveries hold a claim right now, and a clean shutdown that waits for them.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::key::IdempotencyKey;

/// Tracks the deliveries a layer has in flight, and shuts them down cleanly.
///
/// A handler runs to completion even after its sender hung up, in a task of its own; a commit
/// that failed is retried in the background. A process that exits while such work runs leaves
/// its claims to turn stale. Before exiting, [`drain`](Self::drain): new deliveries are answered
/// 503 with `Retry-After` (the sender comes back to another instance, or to this one after the
/// restart), the running ones finish and commit, and the [`DrainReport`] says what, if
/// anything, was still running at the deadline.
///
/// Create one, give it to each layer with `.drain(&drain)` (one drain can stop every route),
/// and keep a clone for the shutdown.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{Drain, IdempotencyLayer, key, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let drain = Drain::new();
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()).drain(&drain))
///     .service(service_fn(|_req| async {
///         tokio::time::sleep(Duration::from_millis(50)).await; // the work
///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///     }));
/// let delivery = |id: &str| {
///     Request::post("/").header("x-github-delivery", id).body(String::new()).unwrap()
/// };
///
/// // A delivery is running when the shutdown begins...
/// let running = tokio::spawn(svc.clone().oneshot(delivery("evt_1")));
/// tokio::task::yield_now().await;
/// assert_eq!(drain.in_flight(), 1);
/// let shutdown = tokio::spawn({
///     let drain = drain.clone();
///     async move { drain.drain(Duration::from_secs(10)).await }
/// });
/// tokio::task::yield_now().await;
///
/// // ...new ones are turned away, the running one finishes and commits.
/// let refused = svc.oneshot(delivery("evt_2")).await.unwrap();
/// assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(running.await.unwrap().unwrap().status(), StatusCode::OK);
/// let report = shutdown.await.unwrap();
/// assert!(report.is_clean(), "{report}");
/// # }
/// ```
#[derive(Clone)]
pub struct Drain {
    inner: Arc<Inner>,
}

struct Inner {
    closed: AtomicBool,
    /// Deliveries between [`Drain::enter`] and the end of their settlement.
    active: AtomicUsize,
    /// Of those, the ones holding a claim.
    held: Mutex<Slots>,
    /// Woken when an active delivery ends while the drain is closed.
    idle: Notify,
}

/// A claim (or pending version, or open transaction) the drain can report and a waiting
/// duplicate can wait for.
pub(crate) trait Tracked: Send + Sync + 'static {
    /// The key, or the entity.
    fn key(&self) -> &IdempotencyKey;
    /// "claim", "pending version", "transaction".
    fn what(&self) -> &'static str;
    fn stage(&self) -> Stage;
    /// Notified once the claim is settled. Call it before [`is_settled`](Self::is_settled),
    /// and enable the notification before looking.
    fn settled(&self) -> &Notify;
    fn is_settled(&self) -> bool;
}

/// Where a delivery left behind by a [`Drain`] was when the deadline came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// The handler was still running.
    Running,
    /// The handler had answered; the commit or release was under way.
    Settling,
    /// The commit or release had failed and was being retried.
    Retrying,
}

impl Stage {
    pub(crate) fn from_u8(raw: u8) -> Self {
        match raw {
            1 => Self::Settling,
            2 => Self::Retrying,
            _ => Self::Running,
        }
    }

    pub(crate) fn as_u8(self) -> u8 {
        match self {
            Self::Running => 0,
            Self::Settling => 1,
            Self::Retrying => 2,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Running => "the handler was still running",
            Self::Settling => "its commit or release was under way",
            Self::Retrying => "its commit or release was being retried after a store failure",
        }
    }
}

/// One delivery the drain waited for in vain.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeftBehind {
    /// The delivery's key (or, for the version guard, its entity).
    pub key: IdempotencyKey,
    /// What it held: `"claim"`, `"pending version"` or `"transaction"`.
    pub what: &'static str,
    /// How far it had got.
    pub stage: Stage,
}

/// What [`Drain::drain`] found at its end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// How long the drain waited.
    pub waited: Duration,
    /// The deliveries still holding a claim at the deadline. Once the process exits, their
    /// claims turn stale one stale limit after their last heartbeat and the stale policy
    /// decides (transactions roll back).
    pub left: Vec<LeftBehind>,
    /// Deliveries still waiting for the store's answer to their claim at the deadline.
    pub claiming: usize,
}

impl DrainReport {
    /// Whether every delivery settled before the deadline.
    pub fn is_clean(&self) -> bool {
        self.left.is_empty() && self.claiming == 0
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(f, "drained in {:?}: every delivery settled", self.waited);
        }
        write!(
            f,
            "drain deadline after {:?}: {} deliveries left behind",
            self.waited,
            self.left.len() + self.claiming
        )?;
        for left in &self.left {
            write!(
                f,
                "; {} ({}): {}",
                left.key,
                left.what,
                left.stage.describe()
            )?;
        }
        if self.claiming > 0 {
            write!(f, "; {} still claiming", self.claiming)?;
        }
        Ok(())
    }
}

impl Drain {
    /// A drain tracking nothing yet, open for deliveries.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                closed: AtomicBool::new(false),
                active: AtomicUsize::new(0),
                held: Mutex::new(Slots::default()),
                idle: Notify::new(),
            }),
        }
    }

    /// Stops new claims: from now on, keyed deliveries are answered 503 with `Retry-After`.
    /// Deliveries already past their check go on.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    /// Whether [`close`](Self::close) (or [`drain`](Self::drain)) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// How many deliveries are claiming or hold a claim right now, background commits
    /// included.
    pub fn in_flight(&self) -> usize {
        self.inner.active.load(Ordering::SeqCst)
    }

    /// Closes the drain and waits until every delivery in flight has settled, or `deadline`
    /// has passed; reports what was left. Call it before the runtime shuts down: a runtime
    /// that shuts down drops the tasks that run handlers whose sender hung up.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        let started = Instant::now();
        let until = crate::body::later(started, deadline);
        self.close();
        loop {
            let idle = self.inner.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                break;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                break;
            }
        }
        let left: Vec<_> = self
            .held()
            .iter()
            .map(|tracked| LeftBehind {
                key: tracked.key().clone(),
                what: tracked.what(),
                stage: tracked.stage(),
            })
            .collect();
        let claiming = self.in_flight().saturating_sub(left.len());
        let report = DrainReport {
            waited: started.elapsed(),
            left,
            claiming,
        };
        if report.is_clean() {
            tracing::info!(waited = ?report.waited, "drained: every delivery settled");
        } else {
            tracing::warn!(%report, "drain deadline passed with deliveries in flight");
        }
        report
    }

    /// A delivery about to claim: `None` when the drain is closed.
    pub(crate) fn enter(&self) -> Option<Ticket> {
        // Counted before the check: a drain that closes after this sees the count, or this
        // sees the drain closed (both are SeqCst).
        self.inner.active.fetch_add(1, Ordering::SeqCst);
        let ticket = Ticket {
            drain: self.clone(),
            slot: None,
        };
        crate::metrics::in_flight(1.0);
        if self.is_closed() {
            return None; // the ticket's drop uncounts it
        }
        Some(ticket)
    }

    /// A claim held in this process on `key`, if there is one.
    pub(crate) fn find(&self, key: &IdempotencyKey) -> Option<Arc<dyn Tracked>> {
        self.held()
            .iter()
            .find(|tracked| tracked.key() == key && !tracked.is_settled())
            .cloned()
    }

    fn held(&self) -> MutexGuard<'_, Slots> {
        // Every critical section is one map operation: a panic cannot leave it half done.
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("closed", &self.is_closed())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// The claims held right now, in reusable slots: a claim takes one and gives it back without
/// hashing anything, since the drain only ever walks them all.
#[derive(Default)]
struct Slots {
    slots: Vec<Option<Arc<dyn Tracked>>>,
    free: Vec<usize>,
}

impl Slots {
    fn insert(&mut self, tracked: Arc<dyn Tracked>) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(tracked);
                slot
            }
            None => {
                self.slots.push(Some(tracked));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, slot: usize) {
        if self.slots[slot].take().is_some() {
            self.free.push(slot);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tracked>> {
        self.slots.iter().flatten()
    }
}

/// One delivery counted by a [`Drain`], from its claim to the end of its settlement.
pub(crate) struct Ticket {
    drain: Drain,
    slot: Option<usize>,
}

impl Ticket {
    /// The delivery holds `tracked` now: the drain reports it, duplicates can wait for it.
    pub(crate) fn hold(&mut self, tracked: Arc<dyn Tracked>) {
        self.slot = Some(self.drain.held().insert(tracked));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.drain.held().remove(slot);
        }
        self.drain.inner.active.fetch_sub(1, Ordering::SeqCst);
        crate::metrics::in_flight(-1.0);
        if self.drain.is_closed() {
            self.drain.inner.idle.notify_waiters();
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("slot", &self.slot).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(IdempotencyKey, Notify);

    impl Tracked for Fake {
        fn key(&self) -> &IdempotencyKey {
            &self.0
        }
        fn what(&self) -> &'static str {
            "claim"
        }
        fn stage(&self) -> Stage {
            Stage::Running
        }
        fn settled(&self) -> &Notify {
            &self.1
        }
        fn is_settled(&self) -> bool {
            false
        }
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_entries_and_reports_the_rest() {
        let drain = Drain::new();
        let key = IdempotencyKey::new("ns", "evt_1").unwrap();
        let mut held = drain.enter().unwrap();
        held.hold(Arc::new(Fake(key.clone(), Notify::new())));
        let claiming = drain.enter().unwrap();
        assert_eq!(drain.in_flight(), 2);
        assert!(drain.find(&key).is_some());

        let report = drain.drain(Duration::from_secs(1)).await;
        assert_eq!(report.claiming, 1);
        assert_eq!(report.left.len(), 1);
        assert_eq!(report.left[0].key, key);
        assert!(
            report.to_string().contains("the handler was still running"),
            "{report}"
        );
        assert!(drain.enter().is_none(), "closed");
        assert_eq!(drain.in_flight(), 2, "a refused entry is not counted");

        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.drain(Duration::from_secs(60)).await }
        });
        tokio::task::yield_now().await;
        drop(claiming);
        drop(held);
        let report = waiting.await.unwrap();
        assert!(report.is_clean(), "{report}");
        assert!(report.waited < Duration::from_secs(60));
        assert!(drain.find(&key).is_none());
    }
}
