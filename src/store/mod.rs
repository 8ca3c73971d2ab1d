//! Where claims live: the [`Store`] trait and its backends.
//!
//! A store keeps one row per [`IdempotencyKey`](crate::IdempotencyKey): `processing` while a delivery holds the
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
//! | `SqliteStore` | `sqlite` | SQLite's `unixepoch('subsec')` | 1; 2 for a duplicate right after a new key |
//! | `PostgresStore` | `postgres` | Postgres' `now()` | 1; 2 for a duplicate right after a new key |
//! | `MySqlStore` | `mysql` | the server's `UTC_TIMESTAMP(6)` | 1 on MariaDB 10.5+ (2 for a duplicate right after a new key); on MySQL and older MariaDB 1 for a new key, 2 otherwise |
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
//!
//! # Writing a backend
//!
//! Every backend of the crate is a folder of the same shape, and a new one, here or in a crate
//! of its own, can follow it:
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the store's struct, its constructors (`new`, `open`, `connect`…), its settings and `migrate`; its docs (statements or scripts, time source, round trips) are a page of `src/docs/` that `mod.rs` includes |
//! | `claims.rs` | `impl Store`: the claim, its settlements, `describe` and the maintenance calls; on SQL, the statements a lone write sends |
//! | `versions.rs` | `impl VersionStore`, for the version guard |
//! | `transactional.rs` | `impl TransactionalStore` and `AdvanceVersion`, on a database with transactions |
//! | `inbox.rs` or `inbox/` | `impl InboxStore`: on SQL only `enqueue`, `take` and `settle_many` are the backend's own, with their statements in `inbox/queries.rs` |
//! | `batch.rs` | group commit's multi-row statements (the batcher itself is shared); on SQL |
//!
//! Helpers sit beside them when a backend needs them: its statements (`queries.rs`), its
//! server scripts (`scripts.rs`), how it opens a database (`open.rs`). What the SQL backends
//! run the same way (the fenced writes, the reads, the inbox's listing and settlement, the
//! row decoders) is written once over sqlx's `Database`, and each backend's `impl` names the
//! methods it forwards there.
//!
//! No method of [`Store`], [`VersionStore`] or `TransactionalStore` has a default: a backend
//! thinks about each one (the [`Store`] docs carry a complete small store). Those that need
//! the most thought:
//!
//! - [`claim`](Store::claim) and [`begin_version`](VersionStore::begin_version) are one
//!   atomic step, decided by the store (a unique index, a script, a lock), with time from the
//!   store's clock when several processes share it.
//! - [`commit_with`](Store::commit_with) keeps the receipt in the same step as the `done`
//!   state: a store that dropped it would turn response replay and the detection of reused
//!   keys off without a word.
//! - [`renew`](Store::renew), [`commit`](Store::commit), [`release`](Store::release) and
//!   [`give_back`](Store::give_back) are fenced by the lease's token; settling twice with
//!   one lease is harmless, and `give_back` takes the run back once.
//! - [`stuck_claims`](Store::stuck_claims), [`resolve`](Store::resolve) and
//!   [`purge_completed`](Store::purge_completed) are what an operator relies on when a process
//!   died.
//!
//! The conformance suite (`tower_idempotency::conformance`, feature `conformance`) checks the
//! contract: the crate's own stores run it, and a store in another crate runs the same checks
//! with `conformance_suite!`.

#[cfg(feature = "_store")]
pub mod any;
pub(crate) mod batch;
mod claim;
mod contract;
mod error;
#[cfg(feature = "_durable")]
mod give_back;
pub mod inbox;
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
mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "_sql")]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod stale;
#[cfg(feature = "_durable")]
mod tally;
#[cfg(feature = "_sql")]
mod transactional;
mod versions;

#[cfg(feature = "_store")]
pub use any::{AnyStore, ConnectError};
pub use claim::{Claim, Completed, Lease, LeaseToken, Pending};
pub use contract::Store;
pub use error::{ConfigError, StoreError};
#[cfg(feature = "_durable")]
pub(crate) use give_back::give_back_unanswered;
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::{MySqlFlavor, MySqlStore};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
pub use purge::{DEFAULT_RETENTION, PurgeTask, spawn_purge};
pub use receipt::{Fingerprint, Receipt, StoredResponse};
pub use record::{KeyRecord, KeyState, Resolution, StuckClaim};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
pub use stale::{DEFAULT_STALE_AFTER, Stale, StalePolicy};
#[cfg(feature = "_sql")]
pub(crate) use transactional::begun;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use transactional::{Begin, TransactionalStore};
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use versions::AdvanceVersion;
pub use versions::decide;
pub use versions::{Advance, PendingVersion, VersionClaim, VersionLease, VersionStore};
