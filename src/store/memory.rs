//! An in-process store.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Claim, Completed, Lease, LeaseToken, Resolution, Stale, StalePolicy, Store, StoreError,
    StuckClaim,
};
use crate::key::IdempotencyKey;
use crate::order::{VersionClaim, VersionLease, VersionStore};

const SHARDS: usize = 16;

/// Claims kept in this process's memory.
///
/// For tests, and for a service that runs as exactly one process and accepts that a restart
/// forgets what was processed (a sender's retry after a restart runs the handler again). Use
/// a database store when several instances share the work or the record must survive.
///
/// Cloning is cheap and clones share the same claims. The map is split into shards so
/// concurrent deliveries of different keys rarely wait on each other. Time is
/// [`tokio::time::Instant`], so tests can move it with `tokio::time::advance`.
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, store::MemoryStore};
///
/// let layer = IdempotencyLayer::new(MemoryStore::new());
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Shards>,
}

#[derive(Debug)]
struct Shards {
    hasher: RandomState,
    shards: [Mutex<HashMap<IdempotencyKey, Row>>; SHARDS],
    /// The entities' versions of the [order layer](crate::order), apart from the keys.
    versions: [Mutex<HashMap<IdempotencyKey, VersionRow>>; SHARDS],
}

impl Default for Shards {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::default()),
            versions: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

/// One entity's versions.
#[derive(Debug, Default)]
struct VersionRow {
    applied: Option<i64>,
    pending: Option<PendingSlot>,
}

#[derive(Debug, Clone, Copy)]
struct PendingSlot {
    version: i64,
    token: LeaseToken,
    since: Instant,
}

#[derive(Debug)]
struct Row {
    token: LeaseToken,
    state: State,
    deliveries: u64,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Processing { claimed_at: Instant },
    Done { completed_at: Instant },
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys the store holds, `processing` and `done`.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.inner.lock(i).len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shards {
    fn lock(&self, shard: usize) -> MutexGuard<'_, HashMap<IdempotencyKey, Row>> {
        // Every critical section leaves the map consistent, so a panic elsewhere while the
        // lock was held cannot have left a half-made change behind.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn shard_of(&self, key: &IdempotencyKey) -> MutexGuard<'_, HashMap<IdempotencyKey, Row>> {
        self.lock(self.hasher.hash_one(key) as usize % SHARDS)
    }

    fn versions_of(
        &self,
        entity: &IdempotencyKey,
    ) -> MutexGuard<'_, HashMap<IdempotencyKey, VersionRow>> {
        let shard = self.hasher.hash_one(entity) as usize % SHARDS;
        self.versions[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn each_shard(&self, mut f: impl FnMut(&mut HashMap<IdempotencyKey, Row>)) {
        for shard in 0..SHARDS {
            f(&mut self.lock(shard));
        }
    }
}

impl Store for MemoryStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut map = self.inner.shard_of(key);
        let Some(row) = map.get_mut(key) else {
            let token = LeaseToken::generate();
            let state = State::Processing { claimed_at: now };
            map.insert(
                key.clone(),
                Row {
                    token,
                    state,
                    deliveries: 1,
                },
            );
            return Ok(Claim::Acquired(Lease::new(key.clone(), token, false)));
        };
        row.deliveries += 1;
        Ok(match row.state {
            State::Done { .. } => Claim::Done(Completed::new(row.deliveries)),
            State::Processing { claimed_at } => {
                let age = now.saturating_duration_since(claimed_at);
                if stale.is_stale(age) && stale.policy() == StalePolicy::Reclaim {
                    row.token = LeaseToken::generate();
                    row.state = State::Processing { claimed_at: now };
                    Claim::Acquired(Lease::new(key.clone(), row.token, true))
                } else {
                    stale.pending(age, row.deliveries)
                }
            }
        })
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut map = self.inner.shard_of(lease.key());
        match map.get_mut(lease.key()) {
            Some(row) if row.token == lease.token() => {
                if let State::Processing { .. } = row.state {
                    row.state = State::Done {
                        completed_at: Instant::now(),
                    };
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut map = self.inner.shard_of(lease.key());
        match map.get(lease.key()) {
            Some(row)
                if row.token == lease.token() && matches!(row.state, State::Processing { .. }) =>
            {
                map.remove(lease.key());
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        let now = Instant::now();
        let mut stuck = Vec::new();
        self.inner.each_shard(|map| {
            for (key, row) in map.iter() {
                if let State::Processing { claimed_at } = row.state {
                    let age = now.saturating_duration_since(claimed_at);
                    if age >= older_than {
                        stuck.push(StuckClaim::new(key.clone(), age, row.deliveries));
                    }
                }
            }
        });
        stuck.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.key.cmp(&b.key)));
        Ok(stuck)
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let mut map = self.inner.shard_of(key);
        let Some(row) = map.get_mut(key) else {
            return Ok(false);
        };
        if !matches!(row.state, State::Processing { .. }) {
            return Ok(false);
        }
        match resolution {
            Resolution::Done => {
                // A new token fences off the old owner, whose late commit or release must not
                // undo what the person decided.
                row.token = LeaseToken::generate();
                row.state = State::Done {
                    completed_at: Instant::now(),
                };
            }
            Resolution::Release => {
                map.remove(key);
            }
        }
        Ok(true)
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0;
        self.inner.each_shard(|map| {
            map.retain(|_, row| match row.state {
                State::Done { completed_at }
                    if now.saturating_duration_since(completed_at) >= older_than =>
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

impl VersionStore for MemoryStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let now = Instant::now();
        let mut map = self.inner.versions_of(entity);
        let row = map.entry(entity.clone()).or_default();
        let newer = row.applied.is_none_or(|applied| applied < version);
        // A stale pending version is taken over only by itself or a newer one: its owner may
        // have written its state before it died, and an older state must not follow it.
        let free = row.pending.is_none_or(|p| {
            stale.policy() == StalePolicy::Reclaim
                && stale.is_stale(now.saturating_duration_since(p.since))
                && p.version <= version
        });
        let ours = LeaseToken::generate();
        if newer && free {
            row.pending = Some(PendingSlot {
                version,
                token: ours,
                since: now,
            });
        }
        let pending = row
            .pending
            .map(|p| (p.version, p.token, now.saturating_duration_since(p.since)));
        crate::order::decide(entity, version, ours, stale, row.applied, pending)
            .ok_or_else(|| StoreError::backend("inconsistent version row"))
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map.get_mut(lease.entity()) {
            Some(row) if row.pending.is_some_and(|p| p.token == lease.token()) => {
                row.applied = Some(
                    row.applied
                        .map_or(lease.version(), |a| a.max(lease.version())),
                );
                row.pending = None;
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map.get_mut(lease.entity()) {
            Some(row) if row.pending.is_some_and(|p| p.token == lease.token()) => {
                row.pending = None;
                if row.applied.is_none() {
                    map.remove(lease.entity());
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        let map = self.inner.versions_of(entity);
        Ok(map.get(entity).and_then(|row| row.applied))
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let mut map = self.inner.versions_of(entity);
        let Some(row) = map.get_mut(entity) else {
            return Ok(false);
        };
        let Some(pending) = row.pending.take() else {
            return Ok(false);
        };
        if resolution == Resolution::Done {
            row.applied = Some(
                row.applied
                    .map_or(pending.version, |a| a.max(pending.version)),
            );
        }
        Ok(true)
    }
}
