//! The inbox: `InboxStore` over the `inbox` table.
//!
//! An entry's lease is its token, fenced as a claim's is: every change a worker makes names the
//! token it holds, and changes nothing once another took the entry over, or a person did. The
//! stored request is kept as the bytes [`StoredRequest::encode`] writes, as a database would.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tower_idempotency::IdempotencyKey;
use tower_idempotency::store::inbox::{
    Attempt, AttemptResult, Enqueued, Entry, EntryState, HISTORY_LIMIT, InboxStats, InboxStore,
    Purged, Running, Settlement, StoredRequest, Take, Taken,
};
use tower_idempotency::store::{Lease, LeaseToken, StalePolicy, StoreError};

use super::{MapStore, lock};

/// One entry's row.
pub(super) struct Row {
    state: EntryState,
    /// The lease of a running entry.
    token: Option<LeaseToken>,
    /// Whether the running entry's handler started (`start`): its attempt is counted, and a
    /// stale lease then means a crash.
    started: bool,
    /// Attempts started, crashes included.
    attempts: u32,
    crashes: u32,
    received: Instant,
    received_at: SystemTime,
    due: Instant,
    renewed: Instant,
    settled: Option<Instant>,
    /// The stored request, until retention deletes a done entry's.
    request: Option<Vec<u8>>,
    history: Vec<Attempt>,
}

impl Row {
    /// Whether `take` takes the entry now: queued and due; or running, not renewed for the
    /// stale limit, and either never started (nobody ran it) or under a reclaiming policy.
    fn is_due(&self, take: &Take, now: Instant) -> bool {
        match self.state {
            EntryState::Queued => self.due <= now,
            EntryState::Running => {
                (!self.started || take.stale.policy() == StalePolicy::Reclaim)
                    && take.stale.is_stale(now - self.renewed)
            }
            _ => false,
        }
    }

    /// Whether an operator's action takes the entry: queued or dead, or running as `running`
    /// allows.
    fn operator_takes(&self, running: Running, now: Instant) -> bool {
        match (self.state, running) {
            (EntryState::Queued | EntryState::Dead, _) => true,
            (EntryState::Running, Running::Force) => true,
            (EntryState::Running, Running::StaleFor(after)) => now - self.renewed >= after,
            _ => false,
        }
    }

    /// Ends the row's lease, if any, and moves it to `state`.
    fn unlease(&mut self, state: EntryState) {
        self.state = state;
        self.token = None;
        self.started = false;
    }

    /// Queued again, due now, the attempt taken back if it was started.
    fn give_back(&mut self, now: Instant) {
        self.attempts -= u32::from(self.started);
        self.unlease(EntryState::Queued);
        self.due = now;
    }

    /// Settled (done or dead) now.
    fn settle(&mut self, state: EntryState, now: Instant) {
        self.unlease(state);
        self.settled = Some(now);
    }

    /// The row as an operator sees it.
    fn describe(&self, key: &IdempotencyKey, now: Instant) -> Entry {
        Entry::new(
            key.clone(),
            self.state,
            self.attempts,
            self.crashes,
            now - self.received,
            (self.state == EntryState::Queued).then(|| self.due.saturating_duration_since(now)),
            (self.state == EntryState::Running).then(|| now - self.renewed),
            self.request.is_some(),
            self.history.clone(),
        )
    }

    /// How long ago a done entry was settled.
    fn done_for(&self, now: Instant) -> Option<Duration> {
        let settled = self.settled.filter(|_| self.state == EntryState::Done)?;
        Some(now - settled)
    }
}

impl MapStore {
    /// Runs `change` on the lease's entry if the lease still holds it.
    fn held<T>(&self, lease: &Lease, change: impl FnOnce(&mut Row) -> T) -> Result<T, StoreError> {
        let mut rows = lock(&self.inbox);
        match rows.get_mut(lease.key()) {
            Some(row) if row.state == EntryState::Running && row.token == Some(lease.token()) => {
                Ok(change(row))
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// Runs `change` on `key`'s entry if an operator's action takes it (as `running` says of a
    /// running one): whether it did.
    fn by_operator(
        &self,
        key: &IdempotencyKey,
        running: Running,
        change: impl FnOnce(&mut Row, Instant) -> bool,
    ) -> bool {
        let now = Instant::now();
        let mut rows = lock(&self.inbox);
        rows.get_mut(key)
            .is_some_and(|row| row.operator_takes(running, now) && change(row, now))
    }
}

/// Makes a queued, running or dead entry due now: a dead one starts its attempts over, a
/// running one's lease is spent (an attempt it started stays counted). A done one stays done.
fn retry(row: &mut Row, now: Instant) -> bool {
    match row.state {
        EntryState::Queued | EntryState::Running => {}
        EntryState::Dead => (row.attempts, row.crashes, row.settled) = (0, 0, None),
        _ => return false,
    }
    row.unlease(EntryState::Queued);
    row.due = now;
    true
}

/// Now, in milliseconds since the Unix epoch, as an attempt's `started_ms` counts it.
fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

impl InboxStore for MapStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        let now = Instant::now();
        let mut rows = lock(&self.inbox);
        if let Some(row) = rows.get(key) {
            return Ok(Enqueued::Duplicate(row.state));
        }
        let row = Row {
            state: EntryState::Queued,
            token: None,
            started: false,
            attempts: 0,
            crashes: 0,
            received: now,
            received_at: SystemTime::now(),
            due: now,
            renewed: now,
            settled: None,
            request: Some(request.encode()),
            history: Vec::new(),
        };
        rows.insert(key.clone(), row);
        Ok(Enqueued::Stored)
    }

    /// Takes the oldest due entries, the n-th under the n-th of the worker's tokens. An entry
    /// whose handler started and whose worker stopped renewing crashed: counted, and dead
    /// instead past its last attempt. One whose request cannot be read ends dead at once.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let now = Instant::now();
        let mut rows = lock(&self.inbox);
        let mut due: Vec<(Instant, IdempotencyKey)> = rows
            .iter()
            .filter(|(_, row)| row.is_due(take, now))
            .map(|(key, row)| (row.due, key.clone()))
            .collect();
        due.sort();
        let mut tokens = take.tokens.iter().copied();
        let mut taken = Vec::new();
        for (_, key) in due {
            if taken.len() == take.limit() {
                break;
            }
            let row = rows.get_mut(&key).expect("listed just now");
            let crashed = row.state == EntryState::Running && row.started;
            if crashed {
                row.crashes += 1;
                if row.attempts >= take.max_attempts {
                    row.settle(EntryState::Dead, now);
                    continue;
                }
            }
            let bytes = row.request.as_deref().unwrap_or_default();
            let request = match StoredRequest::decode(bytes) {
                Ok(request) => request,
                Err(unreadable) => {
                    let why = format!("the stored request cannot be read: {unreadable}");
                    row.history
                        .push(Attempt::new(now_ms(), 0, AttemptResult::Error(why)));
                    row.settle(EntryState::Dead, now);
                    continue;
                }
            };
            let token = tokens.next().expect("fewer entries taken than tokens");
            row.state = EntryState::Running;
            (row.token, row.started, row.renewed) = (Some(token), false, now);
            taken.push(Taken {
                lease: Lease::new(key, token, crashed),
                request,
                attempt: row.attempts + 1,
                crashes: row.crashes,
                received_at: row.received_at,
                history: row.history.clone(),
            });
        }
        Ok(taken)
    }

    /// Counts each lease's attempt, once, if the lease still holds.
    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        Ok(leases
            .iter()
            .map(|lease| {
                self.held(lease, |row| {
                    if !row.started {
                        row.started = true;
                        row.attempts += 1;
                    }
                })
                .is_ok()
            })
            .collect())
    }

    /// Gives back whatever runs under one of `tokens`, started or not.
    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut given = 0;
        for row in lock(&self.inbox).values_mut() {
            if row.state == EntryState::Running && row.token.is_some_and(|t| tokens.contains(&t)) {
                row.give_back(now);
                given += 1;
            }
        }
        Ok(given)
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        self.held(lease, |row| row.renewed = Instant::now())
    }

    /// Settles the lease's entry, keeping the last [`HISTORY_LIMIT`] attempts; a give-back
    /// keeps the history it had.
    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        self.held(lease, |row| {
            match *settlement {
                Settlement::GiveBack => {
                    row.give_back(now);
                    return Ok(());
                }
                Settlement::Retry { after } => {
                    row.unlease(EntryState::Queued);
                    row.due = now + after;
                }
                Settlement::Dead => row.settle(EntryState::Dead, now),
                Settlement::Done => row.settle(EntryState::Done, now),
                other => {
                    return Err(StoreError::backend(format!("unknown settlement {other:?}")));
                }
            }
            let kept = history.len().saturating_sub(HISTORY_LIMIT);
            row.history = history[kept..].to_vec();
            Ok(())
        })?
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let now = Instant::now();
        let rows = lock(&self.inbox);
        let mut listed: Vec<(Instant, Entry)> = rows
            .iter()
            .filter(|(key, row)| {
                namespace.is_none_or(|ns| key.namespace() == ns)
                    && (states.is_empty() || states.contains(&row.state))
            })
            .map(|(key, row)| (row.received, row.describe(key, now)))
            .collect();
        listed.sort_by_key(|(received, _)| *received);
        Ok(listed.into_iter().take(limit).map(|(_, e)| e).collect())
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let now = Instant::now();
        Ok(lock(&self.inbox).get(key).map(|row| row.describe(key, now)))
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        let rows = lock(&self.inbox);
        let bytes = rows.get(key).and_then(|row| row.request.as_deref());
        bytes.map(StoredRequest::decode).transpose()
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        Ok(self.by_operator(key, running, retry))
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut retried = 0;
        for (key, row) in lock(&self.inbox).iter_mut() {
            if key.namespace() == namespace && row.state == EntryState::Dead && retry(row, now) {
                retried += 1;
            }
        }
        Ok(retried)
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        Ok(self.by_operator(key, running, |row, now| {
            row.settle(EntryState::Done, now);
            true
        }))
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        let now = Instant::now();
        let (mut queued, mut running, mut dead) = (0, 0, 0);
        let mut oldest_due: Option<Duration> = None;
        for (key, row) in lock(&self.inbox).iter() {
            if namespace.is_some_and(|ns| key.namespace() != ns) {
                continue;
            }
            match row.state {
                EntryState::Queued => {
                    queued += 1;
                    if row.due <= now {
                        oldest_due = oldest_due.max(Some(now - row.due));
                    }
                }
                EntryState::Running => running += 1,
                EntryState::Dead => dead += 1,
                _ => {}
            }
        }
        Ok(InboxStats::new(queued, running, dead, oldest_due))
    }

    /// Deletes the requests of done entries, then the done entries, settled long enough ago;
    /// dead entries keep theirs.
    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        let now = Instant::now();
        let mut rows = lock(&self.inbox);
        let mut requests = 0;
        for row in rows.values_mut() {
            if requests < limit
                && row.request.is_some()
                && row.done_for(now).is_some_and(|done| done >= requests_after)
            {
                row.request = None;
                requests += 1;
            }
        }
        let old: Vec<IdempotencyKey> = rows
            .iter()
            .filter(|(_, row)| row.done_for(now).is_some_and(|done| done >= entries_after))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &old {
            rows.remove(key);
        }
        Ok(Purged::new(requests as u64, old.len() as u64))
    }
}
