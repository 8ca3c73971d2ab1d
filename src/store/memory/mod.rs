//! An in-process store: the store and its shards here, its claims in `claims.rs`, its entity
//! versions in `versions.rs`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::key::IdempotencyKey;

mod claims;
mod inbox;
mod versions;

use claims::Row;
use versions::VersionRow;

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
/// calls [`purge_completed`](crate::store::Store::purge_completed) periodically, as for the SQL stores
/// (`processing` entries stay until they are settled or [resolved](crate::store::Store::resolve)). The
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
    /// The [inbox](crate::store::inbox): its entries, apart from the keys' claims.
    inbox: inbox::Inbox,
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
            inbox: inbox::Inbox::default(),
        }
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
