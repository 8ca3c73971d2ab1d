//! The memory store's inbox: one map behind one lock, ordered by key for stable listings.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryStore;
use crate::key::IdempotencyKey;
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Settlement,
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
    received: Instant,
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
                received: now,
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
                    reclaims && now.saturating_duration_since(row.renewed) >= take.stale.after()
                }
                _ => false,
            })
            .map(|(key, row)| (row.due, key.clone()))
            .collect();
        due.sort();
        let mut taken = Vec::new();
        for (_, key) in due {
            if taken.len() >= take.limit {
                break;
            }
            let row = rows.get_mut(&key).expect("listed just now");
            let crashed = row.state == EntryState::Running;
            if crashed {
                row.crashes += 1;
                if row.attempts >= take.max_attempts {
                    row.state = EntryState::Dead;
                    row.token = None;
                    row.settled = Some(now);
                    continue;
                }
            }
            let token = LeaseToken::generate();
            row.state = EntryState::Running;
            row.token = Some(token);
            row.attempts += 1;
            row.renewed = now;
            let Some(request) = row.request.clone() else {
                // Retention never deletes the request of an entry that can still run.
                return Err(StoreError::backend(
                    "an inbox entry lost its stored request",
                ));
            };
            taken.push(Taken {
                lease: Lease::new(key, token, crashed),
                request,
                attempt: row.attempts,
                crashes: row.crashes,
                history: row.history.clone(),
            });
        }
        Ok(taken)
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
        row.token = None;
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
            Settlement::GiveBack => {
                row.state = EntryState::Queued;
                row.due = now;
                row.attempts = row.attempts.saturating_sub(1);
                return Ok(());
            }
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

    async fn retry_now(&self, key: &IdempotencyKey) -> Result<bool, StoreError> {
        let mut rows = self.inner.inbox.lock();
        Ok(rows
            .get_mut(key)
            .is_some_and(|row| retry(row, Instant::now())))
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

    async fn discard(&self, key: &IdempotencyKey) -> Result<bool, StoreError> {
        let mut rows = self.inner.inbox.lock();
        let Some(row) = rows.get_mut(key) else {
            return Ok(false);
        };
        if row.state == EntryState::Done {
            return Ok(false);
        }
        row.state = EntryState::Done;
        row.token = None;
        row.settled = Some(Instant::now());
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
