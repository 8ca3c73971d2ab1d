//! What a store answers when it cannot do what it was asked: [`StoreError`], and
//! [`ConfigError`] for a configuration it refuses.

use std::error::Error as StdError;

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
