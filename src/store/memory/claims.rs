//! The claims of the [`MemoryStore`]: one row per key, each store call one step under its
//! shard's lock.

use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Hashed, MemoryStore};
use crate::key::IdempotencyKey;
use crate::store::{
    Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale,
    StalePolicy, Store, StoreError, StuckClaim,
};

/// One key's claim.
#[derive(Debug)]
pub(super) struct Row {
    token: LeaseToken,
    state: State,
    deliveries: u64,
    runs: u64,
    reclaimed: bool,
    first_seen: Instant,
    last_seen: Instant,
    claimed_at: Instant,
    /// What the run that committed the row left for its duplicates.
    receipt: Option<Arc<Receipt>>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Processing { renewed_at: Instant },
    Done { completed_at: Instant },
    Released { released_at: Instant },
}

impl Row {
    fn new(token: LeaseToken, now: Instant) -> Self {
        Self {
            token,
            state: State::Processing { renewed_at: now },
            deliveries: 1,
            runs: 1,
            reclaimed: false,
            first_seen: now,
            last_seen: now,
            claimed_at: now,
            receipt: None,
        }
    }

    /// A new run takes the row: a fresh token, a fresh claim.
    fn take(&mut self, key: &IdempotencyKey, now: Instant, reclaimed: bool) -> Claim {
        self.token = LeaseToken::generate();
        self.state = State::Processing { renewed_at: now };
        self.claimed_at = now;
        self.receipt = None;
        self.runs += 1;
        self.reclaimed = reclaimed;
        Claim::Acquired(
            Lease::new(key.clone(), self.token, reclaimed).with_deliveries(self.deliveries),
        )
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.token == lease.token() && matches!(self.state, State::Processing { .. })
    }
}

impl MemoryStore {
    /// Commits the leased row, keeping `receipt`; a second commit with the same lease keeps
    /// what the first kept.
    fn settle_done(&self, lease: &Lease, receipt: Option<Arc<Receipt>>) -> Result<(), StoreError> {
        let (key, mut map) = self.inner.shard_of(lease.key());
        match map.get_mut(&key) {
            Some(row) if row.token == lease.token() => match row.state {
                State::Processing { .. } => {
                    row.state = State::Done {
                        completed_at: Instant::now(),
                    };
                    row.receipt = receipt;
                    Ok(())
                }
                State::Done { .. } => Ok(()),
                State::Released { .. } => Err(StoreError::LeaseLost),
            },
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// Releases the leased row; `give_back` also takes back the run its claim counted, on the
    /// way from `processing` only (so once).
    fn settle_released(&self, lease: &Lease, give_back: bool) -> Result<(), StoreError> {
        let (key, mut map) = self.inner.shard_of(lease.key());
        match map.get_mut(&key) {
            Some(row) if row.token == lease.token() => match row.state {
                State::Processing { .. } => {
                    row.state = State::Released {
                        released_at: Instant::now(),
                    };
                    if give_back {
                        row.runs = row.runs.saturating_sub(1);
                    }
                    Ok(())
                }
                State::Released { .. } => Ok(()),
                State::Done { .. } => Err(StoreError::LeaseLost),
            },
            _ => Err(StoreError::LeaseLost),
        }
    }
}

impl Store for MemoryStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let (hashed, mut map) = self.inner.shard_of(key);
        let row = match map.entry(hashed) {
            Entry::Occupied(row) => row.into_mut(),
            Entry::Vacant(vacant) => {
                let row = Row::new(LeaseToken::generate(), now);
                let lease = Lease::new(key.clone(), row.token, false).with_deliveries(1);
                vacant.insert(row);
                return Ok(Claim::Acquired(lease));
            }
        };
        row.deliveries += 1;
        row.last_seen = now;
        Ok(match row.state {
            State::Done { .. } => {
                Claim::Done(Completed::new(row.deliveries).with_receipt(row.receipt.clone()))
            }
            State::Released { .. } => row.take(key, now, false),
            State::Processing { renewed_at } => {
                let since_renewal = now.saturating_duration_since(renewed_at);
                if stale.is_stale(since_renewal) && stale.policy() == StalePolicy::Reclaim {
                    row.take(key, now, true)
                } else {
                    let age = now.saturating_duration_since(row.claimed_at);
                    stale.pending(age, since_renewal, row.deliveries)
                }
            }
        })
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        let (key, mut map) = self.inner.shard_of(lease.key());
        match map.get_mut(&key) {
            Some(row) if row.holds(lease) => {
                row.state = State::Processing {
                    renewed_at: Instant::now(),
                };
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.settle_done(lease, None)
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        self.settle_done(lease, Some(Arc::new(receipt.clone())))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.settle_released(lease, false)
    }

    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.settle_released(lease, true)
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        let now = Instant::now();
        let (key, map) = self.inner.shard_of(key);
        let Some(row) = map.get(&key) else {
            return Ok(None);
        };
        let ago = |t: Instant| now.saturating_duration_since(t);
        let (state, at) = match row.state {
            State::Processing { renewed_at } => (KeyState::Processing, renewed_at),
            State::Done { completed_at } => (KeyState::Done, completed_at),
            State::Released { released_at } => (KeyState::Released, released_at),
        };
        Ok(Some(
            KeyRecord::new(state, row.deliveries, row.runs)
                .with_reclaimed(row.reclaimed)
                .with_seen(ago(row.first_seen), ago(row.last_seen))
                .with_times(ago(row.claimed_at), ago(at), ago(at))
                .with_receipt(row.receipt.clone()),
        ))
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        let now = Instant::now();
        let mut stuck = Vec::new();
        self.inner.each_shard(|map| {
            for (Hashed { key, .. }, row) in map.iter() {
                if let State::Processing { renewed_at } = row.state {
                    let silent = now.saturating_duration_since(renewed_at);
                    if silent >= older_than {
                        let age = now.saturating_duration_since(row.claimed_at);
                        stuck.push(StuckClaim::new(key.clone(), age, silent, row.deliveries));
                    }
                }
            }
        });
        stuck.sort_by(|a, b| {
            b.since_renewal
                .cmp(&a.since_renewal)
                .then_with(|| a.key.cmp(&b.key))
        });
        Ok(stuck)
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let (key, mut map) = self.inner.shard_of(key);
        let Some(row) = map.get_mut(&key) else {
            return Ok(false);
        };
        if !matches!(row.state, State::Processing { .. }) {
            return Ok(false);
        }
        let now = Instant::now();
        row.state = match resolution {
            // A new token fences off the old owner, whose late commit must not undo what the
            // person decided.
            Resolution::Done => {
                row.token = LeaseToken::generate();
                State::Done { completed_at: now }
            }
            Resolution::Release => State::Released { released_at: now },
        };
        Ok(true)
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0;
        self.inner.each_shard(|map| {
            map.retain(|_, row| match row.state {
                State::Done { completed_at: at } | State::Released { released_at: at }
                    if now.saturating_duration_since(at) >= older_than =>
                {
                    purged += 1;
                    false
                }
                _ => true,
            });
        });
        Ok(purged)
    }
}
