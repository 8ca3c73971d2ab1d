//! Where claims live: the [`Store`] trait and its backends.
//!
//! A store keeps one row per [`IdempotencyKey`]: `processing` while a delivery holds the
//! claim, `done` once it committed. Its unique index, not application code, decides which of
//! several concurrent deliveries wins the claim.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyKey, Stale};
//! use tower_idempotency::store::{Claim, MemoryStore, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let key = IdempotencyKey::new("stripe", "evt_1")?;
//! let stale = Stale::reclaim_after(Duration::from_secs(60));
//!
//! let Claim::Acquired(lease) = store.claim(&key, stale).await? else { panic!("first claim") };
//! assert!(matches!(store.claim(&key, stale).await?, Claim::InFlight(_)));
//! store.commit(&lease).await?;
//! let Claim::Done(done) = store.claim(&key, stale).await? else { panic!("committed") };
//! assert_eq!(done.deliveries, 3);
//! # Ok(())
//! # }
//! ```
//!
//! # The contract every backend keeps
//!
//! - [`claim`](Store::claim) is atomic and counts the delivery. A new key answers
//!   [`Claim::Acquired`] with a fresh [`Lease`]; a `done` key [`Claim::Done`]; a `processing`
//!   key [`Claim::InFlight`], unless its claim is older than the [`Stale`] limit: then the
//!   policy decides, [`Claim::Acquired`] with a new token (reclaim) or [`Claim::Held`] (hold).
//! - [`commit`](Store::commit) and [`release`](Store::release) act only while the lease's
//!   token is still the row's token, and answer [`StoreError::LeaseLost`] otherwise. Committing
//!   twice with the same lease is harmless.
//! - Maintenance: [`stuck_claims`](Store::stuck_claims), [`resolve`](Store::resolve),
//!   [`purge_completed`](Store::purge_completed), and [`spawn_purge`] to purge periodically.
//!
//! # Backends
//!
//! | store | feature | time source | claim round trips |
//! |---|---|---|---|
//! | [`MemoryStore`] | `memory` (default) | [`tokio::time::Instant`] | none |
//! | `SqliteStore` | `sqlite` | SQLite's `unixepoch('subsec')` | 1 |
//! | `PostgresStore` | `postgres` | Postgres' `now()` | 1 |
//! | `MySqlStore` | `mysql` | the server's `UTC_TIMESTAMP(6)` | 1 on MariaDB; on MySQL 1 for a new key, 2 otherwise |
//!
//! The SQL stores take time from the database, never from the application's clock, so app
//! instances with skewed clocks agree on which claims are stale.
//!
//! Every store also keeps entity versions for the [order layer](crate::order):
//! [`VersionStore`](crate::order::VersionStore), in the table `<table>_versions` on the SQL
//! stores.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::key::IdempotencyKey;

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod purge;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::{MySqlFlavor, MySqlStore};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
pub use purge::{PurgeTask, spawn_purge};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;

/// How long done rows are kept by default before [`Store::purge_completed`] may delete them:
/// 7 days, longer than the senders' retry windows (Stripe and PayPal retry for 3 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// A storage backend for claims.
///
/// Futures are `Send`, so the layer works on multi-threaded runtimes.
pub trait Store: Send + Sync + 'static {
    /// Tries to claim `key` for this delivery, counting the delivery. One atomic step.
    fn claim(
        &self,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Marks the leased key `done`, if the lease still holds.
    fn commit(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes the leased `processing` row, if the lease still holds, so the next delivery
    /// runs the handler again.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Lists `processing` rows claimed at least `older_than` ago, oldest first: claims whose
    /// owner probably died, and claims held for a person.
    fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<Vec<StuckClaim>, StoreError>> + Send;

    /// Settles a `processing` row by hand, whoever holds it. Answers whether there was such
    /// a row.
    fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes `done` rows completed at least `older_than` ago; answers how many. Keep rows
    /// longer than any sender retries ([`DEFAULT_RETENTION`]).
    fn purge_completed(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// This delivery owns the key now: run the handler, then commit or release.
    Acquired(Lease),
    /// The event was processed already.
    Done(Completed),
    /// Another delivery holds a claim that is not stale yet.
    InFlight(Pending),
    /// A stale claim that the hold policy leaves for a person.
    Held(Pending),
}

/// A successful claim: the key and the fencing token unique to this claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: IdempotencyKey,
    token: LeaseToken,
    reclaimed: bool,
}

impl Lease {
    /// A lease on `key` with `token`. Stores call this when a claim succeeds.
    pub fn new(key: IdempotencyKey, token: LeaseToken, reclaimed: bool) -> Self {
        Self {
            key,
            token,
            reclaimed,
        }
    }

    /// The claimed key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// This claim's fencing token.
    pub fn token(&self) -> LeaseToken {
        self.token
    }

    /// Whether this claim took over a stale claim of another delivery.
    pub fn reclaimed(&self) -> bool {
        self.reclaimed
    }
}

/// A fencing token: 64 random-looking bits, fresh for every claim.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(u64);

impl LeaseToken {
    /// A new token, distinct from every other token this process made and, with overwhelming
    /// probability, from those of other processes.
    pub fn generate() -> Self {
        // SipHash keyed with per-process random keys, applied to a counter: distinct inputs,
        // unpredictable outputs, no extra dependency.
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self(KEYS.get_or_init(RandomState::new).hash_one(n))
    }

    /// The token as stored in a signed 64-bit column.
    pub fn to_i64(self) -> i64 {
        self.0 as i64
    }

    /// The token read back from a signed 64-bit column.
    pub fn from_i64(raw: i64) -> Self {
        Self(raw as u64)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({self})")
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A key that was processed already.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completed {
    /// Deliveries of this event seen so far, this one included.
    pub deliveries: u64,
}

impl Completed {
    /// Describes a done row.
    pub fn new(deliveries: u64) -> Self {
        Self { deliveries }
    }
}

/// A claim held by another delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// How long ago the claim was taken.
    pub age: Duration,
    /// Deliveries of this event seen so far, this one included.
    pub deliveries: u64,
}

impl Pending {
    /// Describes a `processing` row.
    pub fn new(age: Duration, deliveries: u64) -> Self {
        Self { age, deliveries }
    }
}

/// A `processing` row listed by [`Store::stuck_claims`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StuckClaim {
    /// The claimed key.
    pub key: IdempotencyKey,
    /// How long ago it was claimed.
    pub age: Duration,
    /// Deliveries of this event seen so far.
    pub deliveries: u64,
}

impl StuckClaim {
    /// Describes a stuck row.
    pub fn new(key: IdempotencyKey, age: Duration, deliveries: u64) -> Self {
        Self {
            key,
            age,
            deliveries,
        }
    }
}

/// How a person settles a held claim with [`Store::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The work was done: mark the key `done`, so further deliveries are duplicates.
    Done,
    /// The work was not done: delete the claim, so the next delivery runs the handler.
    Release,
}

/// What to do with a stale claim: a `processing` row older than a limit, whose owner probably
/// died between claim and commit.
///
/// The default reclaims after 15 minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    after: Duration,
    policy: StalePolicy,
}

/// The two deliberate answers to a stale claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StalePolicy {
    /// Take the claim over and run the handler again: a possible duplicate beats a
    /// certainly missing event (receipts, notifications).
    Reclaim,
    /// Leave the claim for a person and answer 409: for work that moves money or goods.
    Hold,
}

impl Stale {
    /// Reclaim claims older than `after`.
    pub const fn reclaim_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Reclaim,
        }
    }

    /// Hold claims older than `after` for a person to [`resolve`](Store::resolve).
    pub const fn hold_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Hold,
        }
    }

    /// The age past which a claim is stale.
    pub const fn after(&self) -> Duration {
        self.after
    }

    /// What happens to a stale claim.
    pub const fn policy(&self) -> StalePolicy {
        self.policy
    }

    /// Whether a claim of this age is stale.
    pub fn is_stale(&self, age: Duration) -> bool {
        age >= self.after
    }

    /// What a claim on a `processing` row of this `age` answers, when it does not take it over.
    pub fn pending(&self, age: Duration, deliveries: u64) -> Claim {
        let pending = Pending::new(age, deliveries);
        if self.policy == StalePolicy::Hold && self.is_stale(age) {
            Claim::Held(pending)
        } else {
            Claim::InFlight(pending)
        }
    }
}

impl Default for Stale {
    fn default() -> Self {
        Self::reclaim_after(Duration::from_secs(15 * 60))
    }
}

/// A store operation that did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease no longer holds: another delivery reclaimed the key (or a person resolved
    /// it). Nothing was changed.
    #[error("the lease was lost: the claim was taken over or resolved by someone else")]
    LeaseLost,
    /// The backend failed (connection lost, timeout, database error).
    #[error("the idempotency store failed")]
    Backend(#[source] Box<dyn StdError + Send + Sync>),
}

impl StoreError {
    /// Wraps a backend's error, keeping it as the source.
    pub fn backend(err: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::Backend(err.into())
    }
}

/// A store's configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The table name is not a plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most 49
    /// bytes (so the index names derived from it fit in 63), and on Postgres optionally
    /// `schema.table`.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}
