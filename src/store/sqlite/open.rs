//! [`SqliteStore::open`]: a database file opened the way the store needs it.

use std::path::Path;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::SqliteStore;
use crate::store::StoreError;
use crate::store::sql::Writer;

/// How long a write waits for another process's write lock before it fails.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The pool's size: WAL lets readers run beside the one writer, and writers queue in the
/// process, so a few connections are all a store can use.
pub(super) const CONNECTIONS: u32 = 4;

impl SqliteStore {
    /// Opens (creating it if missing) the database file at `path` as the store needs it, and
    /// [migrates](Self::migrate) it: the one call an embedded deployment needs.
    ///
    /// - **WAL** journal, so duplicates and other reads never wait for a write.
    /// - **`synchronous = FULL`**: a commit is on disk when it returns, so a `done` marker
    ///   survives a power cut, not only a crash of the process (with `NORMAL` the last
    ///   commits before a power cut can be lost, and their events would run again). Each
    ///   write waits for a flush of the WAL.
    /// - **A pool of 4 connections**, and the writes of every store this process opens on the
    ///   file queued in the process, in arrival order (see [writers](super#writers)); a write
    ///   still waits up to 30 s (`busy_timeout`) for another process's. The pool lends a
    ///   connection without pinging it first (sqlx's `test_before_acquire`, on by default):
    ///   a connection in the process has no network to lose, and the ping is one more trip to
    ///   its thread for every statement.
    ///
    /// For other settings, open the pool yourself and use [`new`](Self::new).
    ///
    /// ```
    /// use tower_idempotency::store::{Claim, SqliteStore, Stale, Store};
    /// use tower_idempotency::IdempotencyKey;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("open-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let store = SqliteStore::open(dir.join("webhooks.db")).await?;
    /// let key = IdempotencyKey::new("stripe", "evt_1")?;
    /// let Claim::Acquired(lease) = store.claim(&key, Stale::default()).await? else {
    ///     panic!("a new key is acquired");
    /// };
    /// store.commit(&lease).await?;
    /// assert!(matches!(store.claim(&key, Stale::default()).await?, Claim::Done(_)));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(Self::options(path)).await
    }

    /// The connection options [`open`](Self::open) uses for the file at `path`: created if
    /// missing, WAL, `synchronous = FULL`, a busy timeout of 30 s. Change what you need and
    /// pass them to [`open_with`](Self::open_with).
    pub fn options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        tuned(SqliteConnectOptions::new().filename(path))
    }

    /// [`open`](Self::open) with connection options of your own (start from
    /// [`options`](Self::options)): the same pool, the writes queued with every other store
    /// of the process on the same file, the table migrated.
    pub async fn open_with(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        let store = Self::open_file(options)
            .await
            .map_err(StoreError::backend)?;
        store.migrate().await?;
        Ok(store)
    }

    /// [`open_with`](Self::open_with) but for the migration: the pool on the file, the
    /// store's writes queued with every other store of the process on that file.
    pub(crate) async fn open_file(options: SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        let path = options.get_filename().to_owned();
        let pool = open_pool(options).await?;
        Ok(Self::queued(pool, Writer::for_file(&path)))
    }
}

/// `options` as the store needs a file: created if missing, WAL, `synchronous = FULL`, a busy
/// timeout of 30 s.
pub(crate) fn tuned(options: SqliteConnectOptions) -> SqliteConnectOptions {
    options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
}

/// A pool of [`CONNECTIONS`] on a database file. Processes opening a new file at once can find
/// it locked while one of them switches it to WAL (the switch does not wait on the busy
/// timeout): the pool is tried again for a while.
async fn open_pool(options: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let mut attempt = 0;
    loop {
        let pool = SqlitePoolOptions::new()
            .max_connections(CONNECTIONS)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await;
        match pool {
            Err(error) if attempt < 10 && super::is_busy(&error) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            pool => return pool,
        }
    }
}
