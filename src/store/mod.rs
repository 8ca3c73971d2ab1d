//! Where claims live: the [`Store`] trait and its backends.
//!
//! A store keeps one row per [`IdempotencyKey`]: `processing` while a delivery holds the
//! claim, `done` once it committed. Its unique index, not application code, decides which of
//! several concurrent deliveries wins the claim.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyKey, Stale};
//! use tower_idempotency::store::{Claim, KeyState, MemoryStore, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let key = IdempotencyKey::new("stripe", "evt_1")?;
//! let stale = Stale::reclaim_after(Duration::from_secs(60));
//!
//! let Claim::Acquired(lease) = store.claim(&key, stale).await? else { panic!("first claim") };
//! assert!(matches!(store.claim(&key, stale).await?, Claim::InFlight(_)));
//! store.renew(&lease).await?; // the heartbeat of a handler that runs long
//! store.commit(&lease).await?;
//! let Claim::Done(done) = store.claim(&key, stale).await? else { panic!("committed") };
//! assert_eq!(done.deliveries, 3);
//!
//! let record = store.describe(&key).await?.expect("the key is known");
//! assert_eq!(record.state, KeyState::Done);
//! assert_eq!((record.deliveries, record.runs), (3, 1), "sent three times, run once");
//! # Ok(())
//! # }
//! ```
//!
//! # The contract every backend keeps
//!
//! - [`claim`](Store::claim) is atomic and counts the delivery. A new key, or one whose last
//!   run was released, answers [`Claim::Acquired`] with a fresh [`Lease`] and counts a run; a
//!   `done` key answers [`Claim::Done`]; a `processing` key [`Claim::InFlight`], unless its
//!   owner has not renewed it for the [`Stale`] limit: then the policy decides,
//!   [`Claim::Acquired`] with a new token (reclaim) or [`Claim::Held`] (hold).
//! - [`renew`](Store::renew), [`commit`](Store::commit) and [`release`](Store::release) act
//!   only while the lease's token is still the row's token and the row is `processing`
//!   (`commit` and `release` also on a row they settled already), and answer
//!   [`StoreError::LeaseLost`] otherwise. Committing or releasing twice with the same lease is
//!   harmless: a settlement whose answer was lost can be tried again.
//! - A release keeps the row, as `released`, so that its counts survive: the next delivery
//!   claims it as if it were new.
//! - [`describe`](Store::describe) reads one key's record (state, deliveries, runs, times)
//!   without changing it.
//! - Maintenance: [`stuck_claims`](Store::stuck_claims), [`resolve`](Store::resolve),
//!   [`purge_completed`](Store::purge_completed), and [`spawn_purge`] to purge periodically.
//!
//! # Heartbeats and stale claims
//!
//! A claim is stale when its owner has not renewed it for the stale limit, not when it is old.
//! The layer renews a claim every [quarter of the limit](Stale::renew_interval) while the
//! handler runs, so a live handler is never taken over however long it runs, and the claim of
//! a process that died is free again one stale limit after its last heartbeat.
//!
//! # Backends
//!
//! | store | feature | time source | claim round trips |
//! |---|---|---|---|
//! | [`MemoryStore`] | `memory` (default) | [`tokio::time::Instant`] | none |
//! | `SqliteStore` | `sqlite` | SQLite's `unixepoch('subsec')` | 1 |
//! | `PostgresStore` | `postgres` | Postgres' `now()` | 1 |
//! | `MySqlStore` | `mysql` | the server's `UTC_TIMESTAMP(6)` | 1 on MariaDB 10.5+; on MySQL and older MariaDB 1 for a new key, 2 otherwise |
//! | `RedisStore` | `redis` | the server's `TIME` | 1 (one server script), on one server or a Redis Cluster |
//!
//! The SQL stores take time from the database, never from the application's clock, so app
//! instances with skewed clocks agree on which claims are stale.
//!
//! No store but Redis forgets a key by itself (a settled Redis key expires after the store's
//! retention): every table, and the [`MemoryStore`]'s map, grows with
//! every new event until [`purge_completed`](Store::purge_completed) deletes settled keys past
//! their retention. For the `MemoryStore` that growth is the process's memory, without bound:
//! a long-running service runs [`spawn_purge`] next to it.
//!
//! Every store also keeps entity versions for the [version guard](crate::version_guard):
//! [`VersionStore`], in the table `<table>_versions` on the SQL
//! stores.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::key::IdempotencyKey;

#[cfg(any(
    feature = "memory",
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
pub mod any;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod purge;
mod receipt;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
mod tally;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod transactional;
mod versions;

#[cfg(any(
    feature = "memory",
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
pub use any::{AnyStore, ConnectError};
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
pub use receipt::{Fingerprint, Receipt, StoredResponse};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use transactional::begun;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use transactional::{Begin, TransactionalStore};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use versions::AdvanceVersion;
#[cfg(any(
    feature = "memory",
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
pub(crate) use versions::decide;
pub use versions::{Advance, PendingVersion, VersionClaim, VersionLease, VersionStore};

/// A claim made with `token` failed after it may have reached the store: its answer was lost
/// (a response timeout, a connection dropped after the write), so the store may hold a claim
/// that nobody will run. Gives it back in a task of its own, with `give_back`, fenced by the
/// token: a claim that never landed, or was settled or taken over since, answers
/// [`StoreError::LeaseLost`] and nothing changes. Tried again with backoff while the store
/// fails, a bounded number of times. Without a runtime, the claim is left to the stale path.
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
pub(crate) fn give_back_unanswered<F, Fut>(key: &IdempotencyKey, token: LeaseToken, give_back: F)
where
    F: Fn(Lease) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    const ATTEMPTS: u32 = 8;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let lease = Lease::new(key.clone(), token, false);
    runtime.spawn(async move {
        let mut delay = Duration::from_millis(250);
        for _ in 0..ATTEMPTS {
            match give_back(lease.clone()).await {
                Ok(()) => {
                    tracing::info!(
                        namespace = lease.key().namespace(),
                        key = lease.key().value(),
                        lease = %lease.token(),
                        "a claim whose answer was lost was given back",
                    );
                    return;
                }
                // It never landed, or it is not ours to give back any more.
                Err(StoreError::LeaseLost) => return,
                Err(StoreError::Backend(_)) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::warn!(
            namespace = lease.key().namespace(),
            key = lease.key().value(),
            lease = %lease.token(),
            "could not give back a claim whose answer was lost; if it landed, it turns stale \
             one stale limit after it was made, and the stale policy decides",
        );
    });
}

/// How long done rows are kept by default before [`Store::purge_completed`] may delete them:
/// 7 days, longer than the senders' retry windows (Stripe and PayPal retry for 3 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// A storage backend for claims.
///
/// Futures are `Send`, so the layer works on multi-threaded runtimes. The [module
/// documentation](self#the-contract-every-backend-keeps) states the contract; the conformance
/// suite in the crate's `tests/` checks it for every backend.
///
/// A store for a database this crate does not cover implements these nine methods. A small
/// complete one, over a map in memory (each method is one atomic step under the lock, as each
/// would be one conditional statement in a database):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::{Duration, Instant};
///
/// use tower_idempotency::IdempotencyKey;
/// use tower_idempotency::store::{
///     Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Resolution, Stale, StalePolicy,
///     Store, StoreError, StuckClaim,
/// };
///
/// struct Row { state: KeyState, token: LeaseToken, claimed: Instant, renewed: Instant,
///              settled: Instant, first_seen: Instant, last_seen: Instant, deliveries: u64, runs: u64 }
///
/// #[derive(Clone, Default)]
/// struct MapStore(Arc<Mutex<HashMap<IdempotencyKey, Row>>>);
///
/// impl MapStore {
///     /// Runs `change` on the leased row if the lease still holds.
///     fn leased(&self, lease: &Lease, change: impl FnOnce(&mut Row)) -> Result<(), StoreError> {
///         let mut rows = self.0.lock().unwrap();
///         match rows.get_mut(lease.key()) {
///             Some(row) if row.token == lease.token() && row.state == KeyState::Processing => {
///                 change(row);
///                 Ok(())
///             }
///             // Releasing twice with one lease is `Ok`, as the contract says.
///             Some(row) if row.token == lease.token() && row.state == KeyState::Released => Ok(()),
///             _ => Err(StoreError::LeaseLost),
///         }
///     }
/// }
///
/// impl Store for MapStore {
///     async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
///         let (now, token) = (Instant::now(), LeaseToken::generate());
///         let mut rows = self.0.lock().unwrap();
///         let fresh = Row { state: KeyState::Processing, token, claimed: now, renewed: now,
///                           settled: now, first_seen: now, last_seen: now, deliveries: 0, runs: 0 };
///         let row = rows.entry(key.clone()).or_insert(fresh);
///         (row.deliveries, row.last_seen) = (row.deliveries + 1, now);
///         let silent = now - row.renewed;
///         let take_over = match row.state {
///             KeyState::Done => return Ok(Claim::Done(Completed::new(row.deliveries))),
///             KeyState::Released => Some(false),
///             KeyState::Processing if row.token == token => Some(false), // just inserted
///             KeyState::Processing
///                 if stale.policy() == StalePolicy::Reclaim && stale.is_stale(silent) => Some(true),
///             _ => None,
///         };
///         let Some(reclaimed) = take_over else {
///             return Ok(stale.pending(now - row.claimed, silent, row.deliveries));
///         };
///         (row.state, row.token, row.claimed, row.renewed) = (KeyState::Processing, token, now, now);
///         row.runs += 1;
///         Ok(Claim::Acquired(Lease::new(key.clone(), token, reclaimed)))
///     }
///
///     async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| row.renewed = Instant::now())
///     }
///
///     async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| (row.state, row.settled) = (KeyState::Done, Instant::now()))
///     }
///
///     async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| (row.state, row.settled) = (KeyState::Released, Instant::now()))
///     }
///
///     async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
///         // Only a `processing` row gets here (see `leased`): the run is taken back once.
///         self.leased(lease, |row| {
///             (row.state, row.settled) = (KeyState::Released, Instant::now());
///             row.runs -= 1;
///         })
///     }
///
///     async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
///         let now = Instant::now();
///         Ok(self.0.lock().unwrap().get(key).map(|row| {
///             KeyRecord::new(row.state, row.deliveries, row.runs)
///                 .with_seen(now - row.first_seen, now - row.last_seen)
///                 .with_times(now - row.claimed, now - row.renewed, now - row.settled)
///         }))
///     }
///
///     async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
///         let now = Instant::now();
///         let rows = self.0.lock().unwrap();
///         let mut stuck: Vec<_> = rows
///             .iter()
///             .filter(|(_, row)| row.state == KeyState::Processing && now - row.renewed >= older_than)
///             .map(|(key, row)| {
///                 StuckClaim::new(key.clone(), now - row.claimed, now - row.renewed, row.deliveries)
///             })
///             .collect();
///         stuck.sort_by(|a, b| b.since_renewal.cmp(&a.since_renewal));
///         Ok(stuck)
///     }
///
///     async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
///         let mut rows = self.0.lock().unwrap();
///         let Some(row) = rows.get_mut(key).filter(|row| row.state == KeyState::Processing) else {
///             return Ok(false);
///         };
///         row.state = match how {
///             Resolution::Done => KeyState::Done,
///             Resolution::Release => KeyState::Released,
///         };
///         row.settled = Instant::now();
///         Ok(true)
///     }
///
///     async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
///         let now = Instant::now();
///         let mut rows = self.0.lock().unwrap();
///         let before = rows.len();
///         rows.retain(|_, row| row.state == KeyState::Processing || now - row.settled < older_than);
///         Ok((before - rows.len()) as u64)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, key};
///
/// let store = MapStore::default();
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(store.clone()).key(key::github()))
///     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
/// let delivery = || Request::post("/hook").header("x-github-delivery", "d-1").body(String::new()).unwrap();
/// svc.clone().oneshot(delivery()).await.unwrap();
/// let again = svc.oneshot(delivery()).await.unwrap();
/// assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
///
/// let stored = IdempotencyKey::new("github", "d-1").unwrap(); // no router, so no scope
/// let record = store.describe(&stored).await.unwrap().unwrap();
/// assert_eq!((record.state, record.deliveries, record.runs), (KeyState::Done, 2, 1));
/// # }
/// ```
///
/// The crate's own conformance suite (in `tests/common`) runs the same checks against every
/// backend; a new store can borrow it.
pub trait Store: Send + Sync + 'static {
    /// Tries to claim `key` for this delivery, counting the delivery. One atomic step.
    fn claim(
        &self,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Moves the leased claim's heartbeat to now, if the lease still holds: the claim is not
    /// stale for another stale limit.
    fn renew(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the leased key `done`, if the lease still holds.
    fn commit(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the leased key `done` as [`commit`](Self::commit) does, and keeps `receipt` with
    /// it: the request's fingerprint and the response of [response replay](crate::replay),
    /// which later claims of the key answer in [`Completed::receipt`] (and
    /// [`describe`](Self::describe) in [`KeyRecord::receipt`]).
    ///
    /// Every store of this crate keeps it. The default, for stores written elsewhere, commits
    /// without it: their duplicates are answered as a webhook's are (an empty 200), and a
    /// reused key is not told apart.
    fn commit_with(
        &self,
        lease: &Lease,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = receipt;
        self.commit(lease)
    }

    /// Marks the leased `processing` row `released`, if the lease still holds, so the next
    /// delivery runs the handler again. Releasing a row this lease released already is `Ok`.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back a claim whose handler never started (its delivery went away while the claim
    /// was on its way, or the claim's answer was lost): as [`release`](Self::release), and
    /// the run the claim counted is taken back, so that [`KeyRecord::runs`] counts only the
    /// runs a handler started. An operator reads that count to decide what a held claim
    /// needs. Giving back twice with one lease is `Ok` and takes the run back once.
    fn give_back(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What the store knows of `key`: its state, how many deliveries arrived and how many runs
    /// started, and when. `None` for a key it has never seen (or purged). Writes nothing.
    fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<KeyRecord>, StoreError>> + Send;

    /// Lists `processing` rows whose owner has not renewed them for at least `older_than`,
    /// longest silent first: claims whose owner probably died, and claims held for a person.
    ///
    /// A row the SQL stores cannot read as a claim (written by other code, with a namespace or
    /// key that is no valid [`IdempotencyKey`]) is left out and logged at `ERROR` with its
    /// table, namespace and key; the other rows are listed as usual.
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

    /// Deletes `done` and `released` rows settled at least `older_than` ago; answers how many.
    /// Keep rows longer than any sender retries ([`DEFAULT_RETENTION`]).
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
    /// A lease on `key` with `token`. Stores call this when a claim succeeds; `reclaimed` says
    /// whether it took over a stale `processing` claim of another delivery.
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
    /// What the committing delivery left for its duplicates, if it was committed with
    /// [`Store::commit_with`].
    pub receipt: Option<Arc<Receipt>>,
}

impl Completed {
    /// Describes a done row.
    pub fn new(deliveries: u64) -> Self {
        Self {
            deliveries,
            receipt: None,
        }
    }

    /// The same, with the receipt the row keeps.
    pub fn with_receipt(mut self, receipt: Option<Arc<Receipt>>) -> Self {
        self.receipt = receipt;
        self
    }
}

/// A claim held by another delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// How long ago the claim was taken.
    pub age: Duration,
    /// How long ago its owner last renewed it (or took it, if it never renewed): the claim is
    /// stale once this reaches the stale limit.
    pub since_renewal: Duration,
    /// Deliveries of this event seen so far, this one included.
    pub deliveries: u64,
}

impl Pending {
    /// Describes a `processing` row.
    pub fn new(age: Duration, since_renewal: Duration, deliveries: u64) -> Self {
        Self {
            age,
            since_renewal,
            deliveries,
        }
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
    /// How long ago its owner last renewed it.
    pub since_renewal: Duration,
    /// Deliveries of this event seen so far.
    pub deliveries: u64,
}

impl StuckClaim {
    /// Describes a stuck row.
    pub fn new(
        key: IdempotencyKey,
        age: Duration,
        since_renewal: Duration,
        deliveries: u64,
    ) -> Self {
        Self {
            key,
            age,
            since_renewal,
            deliveries,
        }
    }
}

/// The state of a key's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyState {
    /// A delivery holds the claim and its handler runs (or its owner died).
    Processing,
    /// The event was processed; further deliveries are duplicates.
    Done,
    /// The last run failed and gave the claim back; the next delivery runs the handler.
    Released,
}

impl KeyState {
    /// The state's name, as stored by the SQL stores.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Done => "done",
            Self::Released => "released",
        }
    }

    /// The state named `name`, as stored.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "processing" => Some(Self::Processing),
            "done" => Some(Self::Done),
            "released" => Some(Self::Released),
            _ => None,
        }
    }
}

impl fmt::Display for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store knows of one key: the answer of [`Store::describe`].
///
/// `deliveries` against `runs` answers "was it sent twice, or did my handler run twice?". Times
/// are ages by the store's clock. Rows written before these counts existed read `runs` as 1
/// and the seen times as the claim time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The row's state.
    pub state: KeyState,
    /// Deliveries of the event that arrived (claims counted, transactional duplicates too
    /// where the backend counts them).
    pub deliveries: u64,
    /// Claims that started the handler: the first run, runs after a release, reclaims. A claim
    /// given back because its delivery vanished before the handler started counts too.
    pub runs: u64,
    /// Whether the latest run took over a stale claim.
    pub reclaimed: bool,
    /// How long ago the first delivery arrived.
    pub first_seen_ago: Duration,
    /// How long ago the latest delivery arrived.
    pub last_seen_ago: Duration,
    /// How long ago the latest run claimed the key.
    pub claimed_ago: Duration,
    /// `processing` rows: how long ago the owner last renewed the claim.
    pub renewed_ago: Option<Duration>,
    /// `done` and `released` rows: how long ago the run was settled.
    pub settled_ago: Option<Duration>,
    /// `done` rows committed with [`Store::commit_with`]: the fingerprint and stored response.
    pub receipt: Option<Arc<Receipt>>,
}

impl KeyRecord {
    /// A record in `state` with the counts; times are set with the `with_` methods (zero until
    /// then). Stores call this.
    pub fn new(state: KeyState, deliveries: u64, runs: u64) -> Self {
        Self {
            state,
            deliveries,
            runs,
            reclaimed: false,
            first_seen_ago: Duration::ZERO,
            last_seen_ago: Duration::ZERO,
            claimed_ago: Duration::ZERO,
            renewed_ago: None,
            settled_ago: None,
            receipt: None,
        }
    }

    /// Sets the receipt a `done` row keeps.
    pub fn with_receipt(mut self, receipt: Option<Arc<Receipt>>) -> Self {
        self.receipt = receipt;
        self
    }

    /// Sets whether the latest run reclaimed.
    pub fn with_reclaimed(mut self, reclaimed: bool) -> Self {
        self.reclaimed = reclaimed;
        self
    }

    /// Sets the first and latest arrival.
    pub fn with_seen(mut self, first_seen_ago: Duration, last_seen_ago: Duration) -> Self {
        self.first_seen_ago = first_seen_ago;
        self.last_seen_ago = last_seen_ago;
        self
    }

    /// Sets the claim time, the heartbeat (for `processing` rows) and the settlement (for the
    /// others), as the state says.
    pub fn with_times(
        mut self,
        claimed_ago: Duration,
        renewed_ago: Duration,
        settled_ago: Duration,
    ) -> Self {
        self.claimed_ago = claimed_ago;
        match self.state {
            KeyState::Processing => self.renewed_ago = Some(renewed_ago),
            KeyState::Done | KeyState::Released => self.settled_ago = Some(settled_ago),
        }
        self
    }
}

/// How a person settles a held claim with [`Store::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The work was done: mark the key `done`, so further deliveries are duplicates.
    Done,
    /// The work was not done: release the claim, so the next delivery runs the handler.
    Release,
}

/// What to do with a stale claim: a `processing` row whose owner has not renewed it for a
/// limit, because it died between claim and commit (or lost the store).
///
/// The default reclaims after 30 seconds without a heartbeat. While a handler runs, the layer
/// renews its claim every [quarter of the limit](Self::renew_interval): three renewals in a
/// row must fail before a live claim turns stale.
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

/// The stale limit of [`Stale::default`]: 30 seconds without a heartbeat.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

impl Stale {
    /// Reclaim claims not renewed for `after`.
    pub const fn reclaim_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Reclaim,
        }
    }

    /// Hold claims not renewed for `after`, for a person to [`resolve`](Store::resolve).
    pub const fn hold_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Hold,
        }
    }

    /// How long a claim may go without a heartbeat before it is stale.
    pub const fn after(&self) -> Duration {
        self.after
    }

    /// What happens to a stale claim.
    pub const fn policy(&self) -> StalePolicy {
        self.policy
    }

    /// How often the layer renews a running claim: a quarter of the limit (7.5 s at the
    /// default 30 s), and never more often than every 10 ms.
    pub fn renew_interval(&self) -> Duration {
        (self.after / 4).max(Duration::from_millis(10))
    }

    /// Whether a claim last renewed this long ago is stale.
    pub fn is_stale(&self, since_renewal: Duration) -> bool {
        since_renewal >= self.after
    }

    /// What a claim on a `processing` row answers when it does not take it over.
    pub fn pending(&self, age: Duration, since_renewal: Duration, deliveries: u64) -> Claim {
        let pending = Pending::new(age, since_renewal, deliveries);
        if self.policy == StalePolicy::Hold && self.is_stale(since_renewal) {
            Claim::Held(pending)
        } else {
            Claim::InFlight(pending)
        }
    }
}

impl Default for Stale {
    fn default() -> Self {
        Self::reclaim_after(DEFAULT_STALE_AFTER)
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
    /// The SQLite database is not in WAL mode (nor an in-memory database), which the
    /// [SQLite store](crate::store::SqliteStore::migrate) refuses: in a rollback journal the
    /// writer and the readers lock each other out, and under a burst claims wait past the busy
    /// timeout and are answered 503. Returned by `migrate()` as the source of a
    /// [`StoreError::Backend`].
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    #[error(
        "the SQLite database's journal mode is `{mode}`; the store needs WAL (in a rollback \
         journal, claims under a burst wait past the busy timeout): open the pool with \
         `SqliteConnectOptions::journal_mode(SqliteJournalMode::Wal)`, or use `SqliteStore::open`"
    )]
    SqliteJournalMode {
        /// The journal mode found, as `PRAGMA journal_mode` answers it (`delete`, say).
        mode: String,
    },
}

#[cfg(all(
    test,
    feature = "memory",
    any(
        feature = "postgres",
        feature = "sqlite",
        feature = "mysql",
        feature = "redis"
    )
))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Waits, a little at a time, until `key` is in `state`.
    async fn settles(store: &MemoryStore, key: &IdempotencyKey, state: KeyState) -> KeyRecord {
        for _ in 0..200 {
            let record = store.describe(key).await.unwrap().unwrap();
            if record.state == state {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{key} never became {state:?}");
    }

    /// A claim that landed, its answer lost: given back, after the store fails twice, with
    /// its run taken back, so that the sender's retry runs the handler.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_claim_is_given_back_once_the_store_answers() {
        let store = MemoryStore::new();
        let key = IdempotencyKey::new("test", "lost").unwrap();
        let Claim::Acquired(lease) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("a new key");
        };
        let tries = Arc::new(AtomicUsize::new(0));
        let (memory, count) = (store.clone(), tries.clone());
        give_back_unanswered(&key, lease.token(), move |lease| {
            let (store, tries) = (memory.clone(), count.clone());
            async move {
                if tries.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(StoreError::backend("connection refused"));
                }
                store.give_back(&lease).await
            }
        });
        let record = settles(&store, &key, KeyState::Released).await;
        assert_eq!((record.deliveries, record.runs), (1, 0));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert!(matches!(
            store.claim(&key, Stale::default()).await.unwrap(),
            Claim::Acquired(_)
        ));
    }

    /// A claim that never landed, or that another delivery holds by now, is left alone.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_claim_that_is_not_ours_is_left_alone() {
        let store = MemoryStore::new();
        let key = IdempotencyKey::new("test", "theirs").unwrap();
        let Claim::Acquired(theirs) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("a new key");
        };
        let tries = Arc::new(AtomicUsize::new(0));
        let (memory, count) = (store.clone(), tries.clone());
        give_back_unanswered(&key, LeaseToken::generate(), move |lease| {
            let (store, tries) = (memory.clone(), count.clone());
            async move {
                tries.fetch_add(1, Ordering::SeqCst);
                store.give_back(&lease).await
            }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(tries.load(Ordering::SeqCst), 1, "lease lost: no second try");
        let record = store.describe(&key).await.unwrap().unwrap();
        assert_eq!((record.state, record.runs), (KeyState::Processing, 1));
        store.commit(&theirs).await.unwrap();
    }
}
