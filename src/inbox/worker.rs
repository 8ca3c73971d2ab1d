//! The workers: take due entries in batches, run each in a task of its own, and keep the
//! inbox's counts and retention.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tower_service::Service;

use super::Inbox;
use super::attempt::{WorkerSettings, attempt};
use super::backoff::Backoff;
use super::settle::settler;
use crate::body::BoxError;
use crate::engine::Drain;
use crate::engine::mode::{Settings, acquire};
use crate::store::inbox::{InboxStore, Take, Taken};
use crate::store::{DEFAULT_RETENTION, Lease, LeaseToken, Stale, StoreError};

/// Runs an [`Inbox`]'s entries through a service: any number of these, on any number of
/// instances, share the work, and each entry runs on one of them at a time. Made by
/// [`Inbox::workers`], started by [`spawn`](Self::spawn).
///
/// Defaults: 16 entries at once; batches of up to 16; a poll every second when nothing wakes
/// the workers; [`Backoff::default`]; a running entry whose worker stopped renewing for 30
/// seconds is taken over (the workers renew every 7.5 seconds); done entries' requests kept
/// for a day and the entries, which answer duplicates, for
/// [`DEFAULT_RETENTION`](crate::store::DEFAULT_RETENTION).
#[must_use]
pub struct Workers<St, S> {
    inbox: Inbox<St>,
    service: S,
    concurrency: usize,
    batch: usize,
    poll: Duration,
    backoff: Backoff,
    stale: Stale,
    settings: Settings,
    keep_requests: Duration,
    keep_entries: Duration,
    stats_every: Duration,
}

impl<St: fmt::Debug, S> fmt::Debug for Workers<St, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers")
            .field("inbox", &self.inbox)
            .field("concurrency", &self.concurrency)
            .field("batch", &self.batch)
            .field("poll", &self.poll)
            .field("backoff", &self.backoff)
            .field("stale", &self.stale)
            .finish()
    }
}

impl<St, S> Workers<St, S> {
    pub(super) fn new(inbox: Inbox<St>, service: S) -> Self {
        Self {
            inbox,
            service,
            concurrency: 16,
            batch: 16,
            poll: Duration::from_secs(1),
            backoff: Backoff::default(),
            stale: Stale::default(),
            settings: Settings::default(),
            keep_requests: Duration::from_secs(24 * 60 * 60),
            keep_entries: DEFAULT_RETENTION,
            stats_every: Duration::from_secs(15),
        }
    }

    /// How many entries run at once, on this instance (at least 1).
    pub fn concurrency(mut self, entries: usize) -> Self {
        self.concurrency = entries.max(1);
        self
    }

    /// The most entries taken in one store call (at least 1).
    pub fn batch(mut self, entries: usize) -> Self {
        self.batch = entries.max(1);
        self
    }

    /// How often an idle worker looks for due entries when nothing woke it: entries due
    /// later (retries), and stores whose other instances cannot wake it.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// When failed entries are tried again, and how many attempts they get.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// What happens to an entry whose worker stopped renewing its lease (it crashed, or lost
    /// the store): [`Stale::reclaim_after`] (the default, 30 seconds) runs it again,
    /// [`Stale::hold_after`] leaves it running, listed, for a person. The workers renew at a
    /// quarter of it.
    pub fn stale(mut self, stale: Stale) -> Self {
        self.stale = stale;
        self
    }

    /// Which statuses settle an entry done; the others fail the attempt. Default: 2xx.
    pub fn commit_when<F>(mut self, predicate: F) -> Self
    where
        F: Fn(http::StatusCode) -> bool + Send + Sync + 'static,
    {
        self.settings.commit_when = crate::engine::settings::CommitWhen(Arc::new(predicate));
        self
    }

    /// How long one store call may take. Default: 5 seconds.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.store_timeout = timeout;
        self
    }

    /// Stops with `drain`: once it closes, the workers take nothing new, and it waits for the
    /// running entries to finish and settle, with the inbox layers' deliveries.
    pub fn drain(mut self, drain: &Drain) -> Self {
        self.settings.drain = drain.clone();
        self
    }

    /// How long a done entry's stored request is kept. Default: one day.
    pub fn keep_requests_for(mut self, retention: Duration) -> Self {
        self.keep_requests = retention;
        self
    }

    /// How long a done entry is kept to answer duplicates. Default:
    /// [`DEFAULT_RETENTION`](crate::store::DEFAULT_RETENTION).
    pub fn keep_entries_for(mut self, retention: Duration) -> Self {
        self.keep_entries = retention;
        self
    }

    /// How often the workers count the inbox for the metrics (and run its retention).
    /// Default: 15 seconds.
    pub fn stats_every(mut self, every: Duration) -> Self {
        self.stats_every = every.max(Duration::from_millis(1));
        self
    }
}

/// Running [`Workers`]: [`stop`](Self::stop) them to shut down cleanly. Dropping the handle
/// leaves them running, detached, until the runtime ends or their drain closes.
///
/// [`stop`](Self::stop) returns once every entry the workers took has settled: its
/// settlement landed in the store (a failed one is tried again first, with the entry's lease
/// renewed meanwhile), or it was given up after its retries and its entry turns stale.
#[derive(Debug)]
pub struct WorkerHandle {
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl WorkerHandle {
    /// Stops taking entries and waits for the running ones to finish and their settlements to
    /// land.
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.task.await;
    }

    /// Whether the workers stopped (after [`stop`](Self::stop), or their drain closed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<St: InboxStore + Clone, S> Workers<St, S> {
    /// Starts the workers on the current tokio runtime. The service receives each entry's
    /// request with a [`Full`] body, as an axum `Router` or any service generic over its
    /// body takes it.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn<ResB>(self) -> WorkerHandle
    where
        S: Service<Request<Full<Bytes>>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError> + Send,
        ResB: Send + 'static,
    {
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(work(self, stop.clone()));
        WorkerHandle { stop, task }
    }
}

/// The workers' loop: take while slots are free, sleep until woken or the poll is due.
async fn work<St, S, ResB>(workers: Workers<St, S>, stop: Arc<Notify>)
where
    St: InboxStore + Clone,
    S: Service<Request<Full<Bytes>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    ResB: Send + 'static,
{
    let Workers {
        inbox,
        service,
        concurrency,
        batch,
        poll,
        backoff,
        stale,
        settings,
        keep_requests,
        keep_entries,
        stats_every,
    } = workers;
    let drain = settings.drain.clone();
    let store_timeout = settings.store_timeout;
    let shared = Arc::new(WorkerSettings {
        inbox: inbox.clone(),
        settings,
        stale,
        backoff,
        settler: settler(inbox.store().clone(), store_timeout),
    });
    let store = inbox.store().clone();
    let wake = inbox.wake().clone();
    let watch = tokio::spawn({
        let store = store.clone();
        let wake = wake.clone();
        async move { store.watch(wake).await }
    });
    let upkeep = tokio::spawn(upkeep(
        store.clone(),
        stats_every,
        keep_requests,
        keep_entries,
    ));
    let slots = Arc::new(Semaphore::new(concurrency));
    let stopping = stop.notified();
    tokio::pin!(stopping);
    loop {
        // A free slot first: a worker with its hands full takes nothing.
        let first = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("never closed"),
            () = &mut stopping => break,
        };
        if drain.is_closed() {
            break;
        }
        // Registered before the take, so that an entry stored meanwhile wakes it.
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let limit = (slots.available_permits() + 1).min(batch);
        let take = Take {
            stale,
            max_attempts: backoff.max_attempts(),
            ..Take::up_to(limit)
        };
        let taken = match acquire(
            take_and_start(store.clone(), take, store_timeout),
            store_timeout,
            "take",
        )
        .await
        {
            Ok(mut leased) => match std::mem::replace(&mut leased.answer, Ok(Vec::new())) {
                Ok(taken) => {
                    // Each entry is run, or given back below: nothing for the drop to do.
                    leased.tokens.clear();
                    taken
                }
                Err(error) => {
                    tracing::error!(
                        error = &error as &dyn std::error::Error,
                        "the inbox's workers could not take entries; trying again",
                    );
                    Vec::new()
                }
            },
            Err(error) => {
                tracing::error!(
                    error = &error as &dyn std::error::Error,
                    "the inbox did not answer a take within the store timeout; whatever it \
                     leases when it answers is given back",
                );
                Vec::new()
            }
        };
        if taken.is_empty() {
            drop(first);
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep(poll) => {}
                () = &mut stopping => break,
            }
            continue;
        }
        let mut permit = Some(first);
        let mut unrun = Vec::new();
        for entry in taken {
            let Some(tracked) = drain.enter() else {
                unrun.push(entry.lease.token());
                continue;
            };
            let slot = match permit.take() {
                Some(slot) => slot,
                None => slots
                    .clone()
                    .try_acquire_owned()
                    .expect("took no more than the free slots"),
            };
            let shared = shared.clone();
            let service = service.clone();
            tokio::spawn(async move {
                attempt(shared, service, entry, tracked).await;
                drop(slot);
            });
        }
        if !unrun.is_empty() {
            give_back(&store, &unrun, store_timeout).await;
        }
    }
    watch.abort();
    upkeep.abort();
    // Every slot back: the running entries finished and their settlements landed.
    let _ = slots.acquire_many(concurrency as u32).await;
}

/// The entries of one take, given back by their tokens when dropped unless the worker runs
/// them: a take (or its start) that failed, or whose answer arrived after the worker stopped
/// waiting for it, leaves nothing leased to nobody.
struct Leased<St: InboxStore + Clone> {
    store: St,
    /// The take's tokens, until the worker runs what it took.
    tokens: Vec<LeaseToken>,
    timeout: Duration,
    /// The entries taken and started, or why none were.
    answer: Result<Vec<Taken>, StoreError>,
}

impl<St: InboxStore + Clone> Drop for Leased<St> {
    fn drop(&mut self) {
        if self.tokens.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // taken again once stale, not counted: none of them started
        };
        let (store, tokens, timeout) = (
            self.store.clone(),
            std::mem::take(&mut self.tokens),
            self.timeout,
        );
        runtime.spawn(async move { give_back(&store, &tokens, timeout).await });
    }
}

/// Takes entries, then records that their handlers start: the entries the worker may run.
async fn take_and_start<St: InboxStore + Clone>(
    store: St,
    take: Take,
    timeout: Duration,
) -> Result<Leased<St>, StoreError> {
    let mut leased = Leased {
        store: store.clone(),
        tokens: take.tokens.clone(),
        timeout,
        answer: Ok(Vec::new()),
    };
    let taken = match store.take(&take).await {
        Ok(taken) if taken.is_empty() => {
            leased.tokens.clear();
            return Ok(leased);
        }
        Ok(taken) => taken,
        Err(error) => {
            leased.answer = Err(error);
            return Ok(leased);
        }
    };
    let leases: Vec<Lease> = taken.iter().map(|entry| entry.lease.clone()).collect();
    leased.answer = store.start(&leases).await.map(|held| {
        taken
            .into_iter()
            .zip(held)
            .filter_map(|(entry, held)| held.then_some(entry))
            .collect()
    });
    Ok(leased)
}

/// Gives back the entries leased under `tokens`, due now, their attempts not counted.
async fn give_back<St: InboxStore>(store: &St, tokens: &[LeaseToken], timeout: Duration) {
    match tokio::time::timeout(timeout, store.give_back(tokens)).await {
        Ok(Ok(given)) => tracing::debug!(given, "inbox entries given back, none of them run"),
        Ok(Err(error)) => tracing::warn!(
            error = &error as &dyn std::error::Error,
            "inbox entries that were taken but not run could not be given back; they are taken \
             again once their lease is stale, not counted as crashes",
        ),
        Err(_) => tracing::warn!(
            "the inbox did not answer a give-back within the store timeout; entries taken but \
             not run are taken again once their lease is stale, not counted as crashes",
        ),
    }
}

/// Every `every`: the inbox's counts for the metrics, and its retention, in batches of 1,000.
async fn upkeep<St: InboxStore>(
    store: St,
    every: Duration,
    keep_requests: Duration,
    keep_entries: Duration,
) {
    const BATCH: usize = 1000;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Ok(stats) = store.inbox_stats(None).await {
            crate::metrics::inbox_stats(&stats);
        }
        loop {
            match store.purge_inbox(keep_requests, keep_entries, BATCH).await {
                Ok(purged)
                    if purged.requests as usize >= BATCH || purged.entries as usize >= BATCH =>
                {
                    tokio::task::yield_now().await;
                }
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "the inbox's retention failed; it runs again later",
                    );
                    break;
                }
            }
        }
    }
}
