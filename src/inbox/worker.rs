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
use super::attempt::{Backoff, Config, attempt};
use super::settle::Settler;
use crate::Drain;
use crate::body::BoxError;
use crate::engine::settings::Settings;
use crate::store::inbox::{InboxStore, Settlement, Take, Taken};
use crate::store::{DEFAULT_RETENTION, Stale};

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
#[derive(Debug)]
pub struct WorkerHandle {
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl WorkerHandle {
    /// Stops taking entries and waits for the running ones to finish and settle.
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
    let config = Arc::new(Config {
        inbox: inbox.clone(),
        settings,
        stale,
        backoff,
        settler: Settler::spawn(inbox.store().clone()),
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
    let take = Take {
        limit: batch,
        stale,
        max_attempts: backoff.max_attempts(),
    };
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
        let taken = tokio::time::timeout(
            config.settings.store_timeout,
            store.take(&Take { limit, ..take }),
        )
        .await;
        let taken = match taken {
            Ok(Ok(taken)) => taken,
            Ok(Err(error)) => {
                tracing::error!(
                    error = &error as &dyn std::error::Error,
                    "the inbox's workers could not take entries; trying again",
                );
                Vec::new()
            }
            Err(_) => {
                tracing::error!("the inbox did not answer a take within the store timeout");
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
        for entry in taken {
            let slot = match permit.take() {
                Some(slot) => slot,
                None => slots
                    .clone()
                    .try_acquire_owned()
                    .expect("took no more than the free slots"),
            };
            let Some(tracked) = drain.enter() else {
                give_back(&store, entry).await;
                continue;
            };
            let config = config.clone();
            let service = service.clone();
            tokio::spawn(async move {
                attempt(config, service, entry, tracked).await;
                drop(slot);
            });
        }
    }
    watch.abort();
    upkeep.abort();
    // Every slot back: the running entries finished and settled.
    let _ = slots.acquire_many(concurrency as u32).await;
}

/// An entry taken as the drain closed goes back, due now, its attempt not counted.
async fn give_back<St: InboxStore>(store: &St, entry: Taken) {
    if let Err(error) = store.settle(&entry.lease, &Settlement::GiveBack, &[]).await {
        tracing::warn!(
            key = entry.lease.key().value(),
            error = &error as &dyn std::error::Error,
            "an inbox entry taken while draining could not be given back; it waits for the \
             stale limit",
        );
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
