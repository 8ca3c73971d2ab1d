//! The memory store's inbox: one map behind one lock, ordered by key for stable listings.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::MemoryStore;
use crate::key::IdempotencyKey;
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running, Settlement,
    StoredRequest, Take, Taken,
};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

#[derive(Debug, Default)]
pub(super) struct Inbox(Mutex<BTreeMap<IdempotencyKey, Row>>);

#[derive(Debug)]
struct Row {
    state: EntryState,
    token: Option<LeaseToken>,
    attempts: u32,
    crashes: u32,
    /// Whether the running entry's handler started (its attempt counted).
    started: bool,
    received: Instant,
    received_at: SystemTime,
    due: Instant,
    renewed: Instant,
    settled: Option<Instant>,
    request: Option<StoredRequest>,
    history: Vec<Attempt>,
}

impl Row {
    fn describe(&self, key: &IdempotencyKey, now: Instant) -> Entry {
        Entry::new(
            key.clone(),
            self.state,
            self.attempts,
            self.crashes,
            now.saturating_duration_since(self.received),
            (self.state == EntryState::Queued).then(|| self.due.saturating_duration_since(now)),
            (self.state == EntryState::Running)
                .then(|| now.saturating_duration_since(self.renewed)),
            self.request.is_some(),
            self.history.clone(),
        )
    }

    /// The row, if `lease` still holds it.
    fn held(&mut self, lease: &Lease) -> Result<&mut Self, StoreError> {
        if self.state == EntryState::Running && self.token == Some(lease.token()) {
            Ok(self)
        } else {
            Err(StoreError::LeaseLost)
        }
    }

    /// Queued again, due now, the attempt taken back if it started.
    fn give_back(&mut self, now: Instant) {
        self.state = EntryState::Queued;
        self.token = None;
        self.due = now;
        self.attempts = self.attempts.saturating_sub(u32::from(self.started));
        self.started = false;
    }

    /// Whether an operator's action may take this entry, as `running` says of running ones.
    fn may_take(&self, running: Running, now: Instant) -> bool {
        match (self.state, running) {
            (EntryState::Queued | EntryState::Dead, _) => true,
            (EntryState::Running, Running::Force) => true,
            (EntryState::Running, Running::StaleFor(after)) => {
                now.saturating_duration_since(self.renewed) >= after
            }
            _ => false,
        }
    }
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<IdempotencyKey, Row>> {
        // Every critical section leaves the map consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn in_namespace(key: &IdempotencyKey, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| key.namespace() == ns)
}

impl InboxStore for MemoryStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        let mut rows = self.inner.inbox.lock();
        if let Some(row) = rows.get(key) {
            return Ok(Enqueued::Duplicate(row.state));
        }
        let now = Instant::now();
        rows.insert(
            key.clone(),
            Row {
                state: EntryState::Queued,
                token: None,
                attempts: 0,
                crashes: 0,
                started: false,
                received: now,
                received_at: SystemTime::now(),
                due: now,
                renewed: now,
                settled: None,
                request: Some(request.clone()),
                history: Vec::new(),
            },
        );
        Ok(Enqueued::Stored)
    }

    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let reclaims = take.stale.policy() == StalePolicy::Reclaim;
        let mut due: Vec<(Instant, IdempotencyKey)> = rows
            .iter()
            .filter(|(_, row)| match row.state {
                EntryState::Queued => row.due <= now,
                EntryState::Running => {
                    (reclaims || !row.started)
                        && now.saturating_duration_since(row.renewed) >= take.stale.after()
                }
                _ => false,
            })
            .map(|(key, row)| (row.due, key.clone()))
            .collect();
        due.sort();
        let mut tokens = take.tokens.iter().copied();
        let mut taken = Vec::new();
        for (_, key) in due {
            if taken.len() >= take.limit() {
                break;
            }
            let row = rows.get_mut(&key).expect("listed just now");
            let crashed = row.state == EntryState::Running && row.started;
            if crashed {
                row.crashes += 1;
                if row.attempts >= take.max_attempts {
                    row.state = EntryState::Dead;
                    row.token = None;
                    row.started = false;
                    row.settled = Some(now);
                    continue;
                }
            }
            let Some(request) = row.request.clone() else {
                // Retention never deletes the request of an entry that can still run.
                return Err(StoreError::backend(
                    "an inbox entry lost its stored request",
                ));
            };
            let token = tokens.next().expect("fewer taken than tokens");
            row.state = EntryState::Running;
            row.token = Some(token);
            row.started = false;
            row.renewed = now;
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

    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        let mut rows = self.inner.inbox.lock();
        Ok(leases
            .iter()
            .map(|lease| {
                let Some(Ok(row)) = rows.get_mut(lease.key()).map(|row| row.held(lease)) else {
                    return false;
                };
                if !row.started {
                    row.started = true;
                    row.attempts += 1;
                }
                true
            })
            .collect())
    }

    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let mut given = 0;
        for row in rows.values_mut() {
            if row.state == EntryState::Running && row.token.is_some_and(|t| tokens.contains(&t)) {
                row.give_back(now);
                given += 1;
            }
        }
        Ok(given)
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut rows = self.inner.inbox.lock();
        let row = rows.get_mut(lease.key()).ok_or(StoreError::LeaseLost)?;
        row.held(lease)?.renewed = Instant::now();
        Ok(())
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let row = rows.get_mut(lease.key()).ok_or(StoreError::LeaseLost)?;
        let row = row.held(lease)?;
        if *settlement == Settlement::GiveBack {
            row.give_back(now);
            return Ok(());
        }
        row.token = None;
        row.started = false;
        match *settlement {
            Settlement::Done => {
                row.state = EntryState::Done;
                row.settled = Some(now);
            }
            Settlement::Dead => {
                row.state = EntryState::Dead;
                row.settled = Some(now);
            }
            Settlement::Retry { after } => {
                row.state = EntryState::Queued;
                row.due = now + after;
            }
            Settlement::GiveBack => unreachable!("given back above"),
        }
        let kept = history
            .len()
            .saturating_sub(crate::store::inbox::HISTORY_LIMIT);
        row.history = history[kept..].to_vec();
        Ok(())
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let now = Instant::now();
        let rows = self.inner.inbox.lock();
        let mut listed: Vec<(Instant, Entry)> = rows
            .iter()
            .filter(|(key, row)| {
                in_namespace(key, namespace) && (states.is_empty() || states.contains(&row.state))
            })
            .map(|(key, row)| (row.received, row.describe(key, now)))
            .collect();
        listed.sort_by_key(|(received, _)| *received);
        Ok(listed.into_iter().take(limit).map(|(_, e)| e).collect())
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let now = Instant::now();
        Ok(self
            .inner
            .inbox
            .lock()
            .get(key)
            .map(|row| row.describe(key, now)))
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        Ok(self
            .inner
            .inbox
            .lock()
            .get(key)
            .and_then(|row| row.request.clone()))
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        Ok(rows
            .get_mut(key)
            .is_some_and(|row| row.may_take(running, now) && retry(row, now)))
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let mut n = 0;
        for (key, row) in rows.iter_mut() {
            if key.namespace() == namespace && row.state == EntryState::Dead && retry(row, now) {
                n += 1;
            }
        }
        Ok(n)
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let Some(row) = rows.get_mut(key) else {
            return Ok(false);
        };
        if !row.may_take(running, now) {
            return Ok(false);
        }
        row.state = EntryState::Done;
        row.token = None;
        row.started = false;
        row.settled = Some(now);
        Ok(true)
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        let now = Instant::now();
        let rows = self.inner.inbox.lock();
        let (mut queued, mut running, mut dead) = (0, 0, 0);
        let mut oldest: Option<Instant> = None;
        for (key, row) in rows.iter() {
            if !in_namespace(key, namespace) {
                continue;
            }
            match row.state {
                EntryState::Queued => {
                    queued += 1;
                    if row.due <= now {
                        oldest = Some(oldest.map_or(row.due, |o| o.min(row.due)));
                    }
                }
                EntryState::Running => running += 1,
                EntryState::Dead => dead += 1,
                _ => {}
            }
        }
        let oldest_due = oldest.map(|due| now.saturating_duration_since(due));
        Ok(InboxStats::new(queued, running, dead, oldest_due))
    }

    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        let now = Instant::now();
        let mut rows = self.inner.inbox.lock();
        let settled_for = |row: &Row| {
            (row.state == EntryState::Done)
                .then_some(row.settled)
                .flatten()
                .map(|at| now.saturating_duration_since(at))
        };
        let mut requests = 0;
        for row in rows.values_mut() {
            if requests as usize >= limit {
                break;
            }
            if row.request.is_some() && settled_for(row).is_some_and(|d| d >= requests_after) {
                row.request = None;
                requests += 1;
            }
        }
        let old: Vec<IdempotencyKey> = rows
            .iter()
            .filter(|(_, row)| settled_for(row).is_some_and(|d| d >= entries_after))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &old {
            rows.remove(key);
        }
        Ok(Purged::new(requests, old.len() as u64))
    }
}

/// Makes a queued, running or dead entry due now; a dead one starts its attempts over, a
/// running one's lease is spent.
fn retry(row: &mut Row, now: Instant) -> bool {
    match row.state {
        EntryState::Queued => {}
        EntryState::Running => {
            row.state = EntryState::Queued;
            row.token = None;
            row.started = false;
        }
        EntryState::Dead => {
            row.state = EntryState::Queued;
            row.attempts = 0;
            row.crashes = 0;
            row.settled = None;
        }
        _ => return false,
    }
    row.due = now;
    true
}
