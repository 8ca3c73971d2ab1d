//! An in-process store.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale,
    StalePolicy, Store, StoreError, StuckClaim,
};
use crate::key::IdempotencyKey;
use crate::store::{VersionClaim, VersionLease, VersionStore};

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
/// # Memory grows with every new key
///
/// The store keeps one entry per key it has seen, `done` and `released` ones included, and
/// never forgets one by itself: without purging, its memory grows with every event ever
/// delivered, without bound. A long-running service purges it with [`spawn_purge`], which
/// calls [`purge_completed`](Store::purge_completed) periodically, as for the SQL stores
/// (`processing` entries stay until they are settled or [resolved](Store::resolve)). The
/// entity versions of the [version guard](crate::version_guard) are one entry per entity and are not
/// purged.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, store::{DEFAULT_RETENTION, MemoryStore, spawn_purge}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// // Forget done keys once they are older than any sender retries, checking every hour.
/// let purge = spawn_purge(store.clone(), Duration::from_secs(60 * 60), DEFAULT_RETENTION);
/// let layer = IdempotencyLayer::new(store);
/// # let _ = layer;
/// # purge.stop().await;
/// # }
/// ```
///
/// [`spawn_purge`]: crate::store::spawn_purge
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Shards>,
}

#[derive(Debug)]
struct Shards {
    hasher: RandomState,
    shards: [Mutex<Map>; SHARDS],
    /// The entities' versions of the [version guard](crate::version_guard), apart from the keys.
    versions: [Mutex<HashMap<IdempotencyKey, VersionRow>>; SHARDS],
}

/// The claims of one shard, by key, each key hashed once per store call (see [`Hashed`]).
type Map = HashMap<Hashed, Row, BuildHasherDefault<Prehashed>>;

/// A key with its hash under the store's [`RandomState`]: one SipHash pass picks the shard
/// and finds the row.
#[derive(Clone, PartialEq, Eq)]
struct Hashed {
    hash: u64,
    key: IdempotencyKey,
}

impl fmt::Debug for Hashed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.key.fmt(f)
    }
}

impl Hash for Hashed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher of a [`Map`]: its keys come hashed already.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not called: `Hashed` writes one `u64`. Still a hash, should that change.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
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
        Claim::Acquired(Lease::new(key.clone(), self.token, reclaimed))
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.token == lease.token() && matches!(self.state, State::Processing { .. })
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys the store holds, in any state.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.inner.lock(i).len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

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

impl Shards {
    fn lock(&self, shard: usize) -> MutexGuard<'_, Map> {
        // Every critical section leaves the map consistent, so a panic elsewhere while the
        // lock was held cannot have left a half-made change behind.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The key hashed, and its shard locked.
    fn shard_of(&self, key: &IdempotencyKey) -> (Hashed, MutexGuard<'_, Map>) {
        let hash = self.hasher.hash_one(key);
        // Bits the map does not use: it takes the low ones for the bucket, the top seven as
        // the tag.
        let shard = (hash >> 32) as usize % SHARDS;
        let key = Hashed {
            hash,
            key: key.clone(),
        };
        (key, self.lock(shard))
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

    fn each_shard(&self, mut f: impl FnMut(&mut Map)) {
        for shard in 0..SHARDS {
            f(&mut self.lock(shard));
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
                let lease = Lease::new(key.clone(), row.token, false);
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
        // Only an older version is outdated: an equal one (another change in the same second)
        // takes the slot like a newer one.
        let not_older = row.applied.is_none_or(|applied| applied <= version);
        // A stale pending version is taken over only by itself or a newer one: its owner may
        // have written its state before it died, and an older state must not follow it.
        let free = row.pending.is_none_or(|p| {
            stale.policy() == StalePolicy::Reclaim
                && stale.is_stale(now.saturating_duration_since(p.since))
                && p.version <= version
        });
        let ours = LeaseToken::generate();
        if not_older && free {
            row.pending = Some(PendingSlot {
                version,
                token: ours,
                since: now,
            });
        }
        let pending = row
            .pending
            .map(|p| (p.version, p.token, now.saturating_duration_since(p.since)));
        crate::store::decide(entity, version, ours, stale, row.applied, pending)
            .ok_or_else(|| StoreError::backend("inconsistent version row"))
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map
            .get_mut(lease.entity())
            .and_then(|row| row.pending.as_mut())
        {
            Some(pending) if pending.token == lease.token() => {
                pending.since = Instant::now();
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
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
