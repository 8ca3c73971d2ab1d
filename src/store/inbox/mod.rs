//! The [`InboxStore`] trait: what a backend implements to hold an inbox, the deliveries that
//! were acknowledged and wait for a worker.
//!
//! An entry is one event, under its key: the stored request, its state and its attempts. The
//! key's uniqueness is the claim: the write that stores the delivery is the write that claims
//! its key, so a duplicate finds the entry, whatever its state, and writes nothing.
//!
//! ```
//! # #[cfg(feature = "memory")] {
//! use std::time::Duration;
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::store::MemoryStore;
//! use tower_idempotency::store::inbox::{Enqueued, EntryState, InboxStore, Settlement, StoredRequest, Take};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let key = IdempotencyKey::new("stripe", "evt_1").unwrap();
//! let request = StoredRequest::new(http::Method::POST, "/webhooks/stripe", Vec::new(), "{}".into());
//!
//! assert_eq!(store.enqueue(&key, &request).await.unwrap(), Enqueued::Stored);
//! assert_eq!(
//!     store.enqueue(&key, &request).await.unwrap(),
//!     Enqueued::Duplicate(EntryState::Queued),
//! );
//!
//! // A worker takes it under a lease, runs it, and settles it.
//! let taken = store.take(&Take::default()).await.unwrap();
//! assert_eq!(taken.len(), 1);
//! assert_eq!(taken[0].request, request);
//! store.settle(&taken[0].lease, &Settlement::Done, &[]).await.unwrap();
//! assert!(store.take(&Take::default()).await.unwrap().is_empty());
//! # });
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use tokio::sync::Notify;

use super::{Lease, LeaseToken, Stale, StoreError};
use crate::key::IdempotencyKey;

mod codec;
#[cfg(feature = "_sql")]
pub(crate) mod unreadable;

pub use codec::HISTORY_LIMIT;

/// Where an inbox entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryState {
    /// Waiting for a worker: a new delivery, or one whose last attempt failed and that waits
    /// for its next attempt (see [`Entry::attempts`]).
    Queued,
    /// A worker holds it under a lease and runs its handler.
    Running,
    /// Its handler succeeded, or a person discarded it.
    Done,
    /// Its attempts ran out; it waits for a person to retry or discard it.
    Dead,
}

impl EntryState {
    /// The state as stores write it: `queued`, `running`, `done`, `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Dead => "dead",
        }
    }

    /// The state a store wrote, or `None` for another text.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "done" => Self::Done,
            "dead" => Self::Dead,
            _ => return None,
        })
    }
}

/// What [`InboxStore::enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// The delivery is stored, durably, as a new queued entry.
    Stored,
    /// The key already has an entry, in this state; nothing was written.
    Duplicate(EntryState),
}

/// A delivery as the inbox keeps it: enough to rebuild the request a worker hands to the
/// service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRequest {
    /// The request's method.
    pub method: Method,
    /// The path and query the sender used.
    pub uri: String,
    /// The headers kept, in order (repeated names repeat).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

impl StoredRequest {
    /// A stored request from its parts.
    pub fn new(
        method: Method,
        uri: impl Into<String>,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Self {
        Self {
            method,
            uri: uri.into(),
            headers,
            body,
        }
    }

    /// The headers as a map.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            map.append(name.clone(), value.clone());
        }
        map
    }

    /// The bytes a store keeps: a versioned, length-prefixed encoding that
    /// [`decode`](Self::decode) reads back.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_request(self)
    }

    /// Reads what [`encode`](Self::encode) wrote.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] if the bytes are not such an encoding (a damaged row).
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        codec::decode_request(bytes)
    }
}

/// How one attempt at an entry ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptResult {
    /// The service answered with this status.
    Status(u16),
    /// The service failed (`Err`) or panicked; the text says how.
    Error(String),
    /// The worker stopped renewing its lease (it crashed, or lost the database) and the
    /// entry was taken over.
    Crashed,
}

/// One attempt at an entry, as the inbox records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When it started, in milliseconds since the Unix epoch, by the worker's clock.
    pub started_ms: u64,
    /// How long it took, in milliseconds (0 when a crash cut it off).
    pub duration_ms: u64,
    /// How it ended.
    pub result: AttemptResult,
}

impl Attempt {
    /// Now, by this machine's clock, as an attempt's `started_ms` counts it.
    pub(crate) fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }

    /// An attempt.
    pub fn new(started_ms: u64, duration_ms: u64, result: AttemptResult) -> Self {
        Self {
            started_ms,
            duration_ms,
            result,
        }
    }

    /// Encodes a history (the last [`HISTORY_LIMIT`] attempts of `attempts` are kept), as a
    /// store writes it with a settlement.
    pub fn encode_history(attempts: &[Attempt]) -> Vec<u8> {
        codec::encode_history(attempts)
    }

    /// Reads a history [`encode_history`](Self::encode_history) wrote; empty bytes are an
    /// empty history.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] for bytes that are not such an encoding.
    pub fn decode_history(bytes: &[u8]) -> Result<Vec<Attempt>, StoreError> {
        codec::decode_history(bytes)
    }
}

/// What a worker asks of [`InboxStore::take`].
///
/// The worker makes the leases' tokens before it asks, one per entry it may take: should the
/// take's answer come late or never (a timeout, a lost connection), the worker still knows
/// them, and gives back by them whatever the take leased ([`InboxStore::give_back`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    /// One fresh token per entry the take may lease, in order: at most this many entries are
    /// taken, the first (the oldest due) under the first token, and so on.
    pub tokens: Vec<LeaseToken>,
    /// When a running entry's worker is taken for dead (no renewal for the stale limit), and
    /// whether such an entry is taken over (reclaim) or left for a person (hold). An entry
    /// whose handler never started is taken again under either policy, as a queued one is.
    pub stale: Stale,
    /// How many attempts an entry gets, crashes included. An entry taken over after a crash
    /// on its last attempt becomes dead instead.
    pub max_attempts: u32,
}

impl Take {
    /// A take of up to `limit` entries, each under a fresh token; the default stale policy
    /// and 8 attempts.
    pub fn up_to(limit: usize) -> Self {
        Self {
            tokens: (0..limit).map(|_| LeaseToken::generate()).collect(),
            stale: Stale::default(),
            max_attempts: 8,
        }
    }

    /// The most entries the take leases.
    pub fn limit(&self) -> usize {
        self.tokens.len()
    }
}

impl Default for Take {
    fn default() -> Self {
        Self::up_to(16)
    }
}

/// An entry a worker took: its lease, the request to run, and what came before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The lease, under one of the take's tokens; `reclaimed` when the entry was taken over
    /// from a worker whose handler had started and that stopped renewing.
    pub lease: Lease,
    /// The stored request.
    pub request: StoredRequest,
    /// This attempt's number once it [starts](InboxStore::start): 1 for the first.
    pub attempt: u32,
    /// How many earlier attempts ended in a crash.
    pub crashes: u32,
    /// When the entry was stored, by the store's clock.
    pub received_at: SystemTime,
    /// The earlier attempts, oldest first (at most [`HISTORY_LIMIT`]).
    pub history: Vec<Attempt>,
}

/// Which running entries an operator's [`retry_now`](InboxStore::retry_now) or
/// [`discard`](InboxStore::discard) takes from their worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Running {
    /// None: a running entry is left to its worker, and the action changes nothing.
    Leave,
    /// One whose worker has not renewed its lease for this long (it crashed, or lost the
    /// store); one renewed since is left to its worker.
    StaleFor(Duration),
    /// Any: a worker that still runs it settles nothing (its lease is spent).
    Force,
}

/// How a worker settles an entry it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// The handler succeeded: done.
    Done,
    /// The attempt failed: queued again, due after this long.
    Retry {
        /// How long from now until the next attempt.
        after: Duration,
    },
    /// The last attempt failed: dead, kept for a person.
    Dead,
    /// Nothing ran (the worker was stopped before it started the handler): queued again, due
    /// now, and the attempt taken back if it was [started](InboxStore::start).
    GiveBack,
}

/// One settlement of a batch ([`InboxStore::settle_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settling {
    /// The lease the worker holds.
    pub lease: Lease,
    /// How the entry settles.
    pub settlement: Settlement,
    /// The attempts so far, this one included.
    pub history: Vec<Attempt>,
}

impl crate::store::batch::Keyed for Settling {
    fn key(&self) -> &IdempotencyKey {
        self.lease.key()
    }
}

/// An entry as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The event's key.
    pub key: IdempotencyKey,
    /// Where it is.
    pub state: EntryState,
    /// Attempts started (crashes included).
    pub attempts: u32,
    /// Attempts that ended in a crash.
    pub crashes: u32,
    /// Time since the first copy was stored.
    pub age: Duration,
    /// For a queued entry, how long until it is due (zero when due already).
    pub due_in: Option<Duration>,
    /// For a running entry, the time since its worker last renewed the lease.
    pub since_renewal: Option<Duration>,
    /// Whether the stored request is still kept (retention deletes a done entry's).
    pub has_request: bool,
    /// The recorded attempts, oldest first.
    pub history: Vec<Attempt>,
}

impl Entry {
    /// An entry, as a store describes it.
    #[allow(clippy::too_many_arguments, reason = "a plain record of its fields")]
    pub fn new(
        key: IdempotencyKey,
        state: EntryState,
        attempts: u32,
        crashes: u32,
        age: Duration,
        due_in: Option<Duration>,
        since_renewal: Option<Duration>,
        has_request: bool,
        history: Vec<Attempt>,
    ) -> Self {
        Self {
            key,
            state,
            attempts,
            crashes,
            age,
            due_in,
            since_renewal,
            has_request,
            history,
        }
    }

    /// The last attempt, if any ran.
    pub fn last_attempt(&self) -> Option<&Attempt> {
        self.history.last()
    }
}

/// Counts an inbox's entries, for its metrics and its page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct InboxStats {
    /// Entries waiting (new, or to be tried again), due or not.
    pub queued: u64,
    /// Entries a worker runs now.
    pub running: u64,
    /// Dead entries.
    pub dead: u64,
    /// How long the oldest due entry has been due.
    pub oldest_due: Option<Duration>,
}

impl InboxStats {
    /// Counts, as a store reports them.
    pub fn new(queued: u64, running: u64, dead: u64, oldest_due: Option<Duration>) -> Self {
        Self {
            queued,
            running,
            dead,
            oldest_due,
        }
    }
}

/// What [`InboxStore::purge_inbox`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Purged {
    /// Done entries whose stored request was deleted (the entry stays, for duplicates).
    pub requests: u64,
    /// Done entries deleted whole.
    pub entries: u64,
}

impl Purged {
    /// Counts of what a purge deleted.
    pub fn new(requests: u64, entries: u64) -> Self {
        Self { requests, entries }
    }
}

/// Wakes idle workers when entries are stored, across the store's users.
pub type Wake = Arc<Notify>;

/// A store that holds an inbox: acknowledged deliveries waiting for workers.
///
/// Every method that changes an entry a worker holds is fenced by the lease's token: a worker
/// that lost its lease (it stalled past the stale limit, and another took the entry over)
/// changes nothing and gets [`StoreError::LeaseLost`].
///
/// The timestamps are the store's own clock (the database's `now()`, for SQL), so that
/// workers on several machines agree on what is due and what is stale.
pub trait InboxStore: Send + Sync + 'static {
    /// Stores `request` as a new queued entry under `key`, due now, in one durable write,
    /// unless the key has an entry; then it writes nothing and answers the entry's state.
    fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> impl Future<Output = Result<Enqueued, StoreError>> + Send;

    /// Takes up to [`take.limit()`](Take::limit) due entries, oldest due first, the n-th under
    /// the n-th of `take.tokens`, running from now, not yet started: queued entries whose
    /// time has come; running entries not renewed for the stale limit whose handler never
    /// [started](Self::start) (nobody ran them: taken again as queued ones, under either
    /// policy); and, under a reclaiming stale policy, running entries whose handler started and
    /// whose worker stopped renewing (`reclaimed`, counted as a crash; past their last attempt
    /// they become dead instead). Several workers, on several instances, calling at once never
    /// take the same entry.
    ///
    /// An entry whose stored request cannot be read (bytes no release wrote: a damaged row, a
    /// hand edit) cannot run: the take settles it dead at once, its history ending with an
    /// [`AttemptResult::Error`] that says why, and answers the others, so that one such row
    /// never stops the inbox.
    fn take(&self, take: &Take) -> impl Future<Output = Result<Vec<Taken>, StoreError>> + Send;

    /// Records that the handlers of these taken entries start, and counts their attempts, in
    /// one write: answers, lease by lease, whether it still held its entry (and may run it).
    /// Called before any of the handlers starts, so that an entry whose worker died before
    /// it is taken again without being counted as a crash.
    fn start(&self, leases: &[Lease])
    -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Gives back the entries leased under any of `tokens` (a take whose answer came late or
    /// never, entries taken while the worker stopped): queued again, due now, their attempt
    /// taken back if it was started. Tokens that lease nothing change nothing. Answers how
    /// many entries it gave back.
    fn give_back(
        &self,
        tokens: &[LeaseToken],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Renews a running entry's lease.
    fn renew_entry(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles a running entry, writing `history` (the attempts so far, this one included)
    /// with it.
    fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles several running entries, each as [`settle`](Self::settle) would, and answers
    /// each one's result in order. A store that can write them in one statement does; the
    /// default settles them one by one.
    fn settle_many(
        &self,
        batch: &[Settling],
    ) -> impl Future<Output = Vec<Result<(), StoreError>>> + Send {
        settle_each(self, batch)
    }

    /// Up to `limit` entries in one of `states` (all states when empty), of `namespace` when
    /// given, the oldest first.
    fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send;

    /// One entry.
    fn entry(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send;

    /// The stored request of an entry, if it is still kept.
    fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<StoredRequest>, StoreError>> + Send;

    /// Makes a queued or dead entry due now, and a running one when `running` allows it (its
    /// lease is spent: its worker, should it still run, settles nothing), in one conditional
    /// write. A dead one starts over with its attempts counted from zero. `false` if the key
    /// has no such entry.
    fn retry_now(
        &self,
        key: &IdempotencyKey,
        running: Running,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// [`retry_now`](Self::retry_now) for every dead entry of `namespace`; answers how many.
    fn retry_dead(&self, namespace: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Marks a queued or dead entry done without running it, and a running one when `running`
    /// allows it (its lease spent, as for [`retry_now`](Self::retry_now)), in one conditional
    /// write. `false` if the key has no such entry.
    fn discard(
        &self,
        key: &IdempotencyKey,
        running: Running,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts the entries (of `namespace` when given).
    fn inbox_stats(
        &self,
        namespace: Option<&str>,
    ) -> impl Future<Output = Result<InboxStats, StoreError>> + Send;

    /// Deletes, at most `limit` of each: the stored request of done entries settled longer
    /// than `requests_after` ago, and done entries settled longer than `entries_after` ago.
    /// Dead entries keep theirs.
    fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Purged, StoreError>> + Send;

    /// Passes on to `wake` the news of entries stored by other users of the store (other
    /// instances), until the future is dropped. A store without such news (memory, SQLite,
    /// where every user shares the process) answers at once; workers then poll, and the
    /// process's own ingest wakes them directly.
    fn watch(&self, wake: Wake) -> impl Future<Output = ()> + Send {
        let _ = wake;
        async {}
    }
}

/// Settles `batch` one by one: the default of [`InboxStore::settle_many`], and what a store
/// does with a batch of one.
pub(crate) async fn settle_each<S: InboxStore + ?Sized>(
    store: &S,
    batch: &[Settling],
) -> Vec<Result<(), StoreError>> {
    let mut results = Vec::with_capacity(batch.len());
    for one in batch {
        results.push(
            store
                .settle(&one.lease, &one.settlement, &one.history)
                .await,
        );
    }
    results
}

/// The answers of a batch written in one statement or transaction: per settlement, the rows
/// it changed (none: its lease was lost); or the one failure, told to each.
#[cfg(feature = "_sql")]
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
pub(crate) fn batch_results(
    written: Result<Vec<u64>, StoreError>,
    batch: &[Settling],
) -> Vec<Result<(), StoreError>> {
    match written {
        Ok(changed) => changed
            .into_iter()
            .map(|n| {
                if n == 0 {
                    Err(StoreError::LeaseLost)
                } else {
                    Ok(())
                }
            })
            .collect(),
        Err(error) => {
            let said = error.to_string();
            batch
                .iter()
                .map(|_| Err(StoreError::backend(said.clone())))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests;
