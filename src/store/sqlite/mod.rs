#![doc = include_str!("../../docs/sqlite.md")]

use std::sync::Arc;

use sqlx::{Sqlite, SqlitePool};

use super::batch::{Batcher, DEFAULT_MOST};
use super::sql::{NewKeys, ResultExt as _, Table, TableName, Writer};
use super::{ConfigError, StoreError};

mod batch;
mod claims;
mod inbox;
mod open;
mod queries;
mod transactional;
mod versions;

pub(crate) use open::tuned;
use queries::{add_receipt, queries, upgrade};

/// Claims kept in a SQLite database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::sqlite) for how to
/// connect, the SQL, the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct SqliteStore {
    table: Table<Sqlite>,
    /// The statements of the [inbox](self#the-inbox) that are SQLite's own (the others are
    /// the table's), on `<table>_inbox`.
    inbox: Arc<inbox::Own>,
    /// Where concurrent claims and commits meet to share a transaction; none when each goes
    /// alone.
    batches: Batcher<claims::Write, claims::Wrote>,
    /// Whether the store's last claim found its key new: the next claim, if the writer is
    /// idle, then inserts first (see [round trips](self#round-trips)).
    new_keys: NewKeys,
}

impl SqliteStore {
    /// A store on `pool`, in the table `idempotency_keys`.
    ///
    /// The store's writes take turns in a queue of its own (see [writers](self#writers));
    /// [`open`](Self::open) shares one queue among the stores of a process on one file.
    ///
    /// **The pool must be in WAL mode** (or on an in-memory database), which sqlx does not set
    /// by default: [`migrate`](Self::migrate) refuses a rollback journal
    /// ([`ConfigError::SqliteJournalMode`]). There, the writer and the readers lock each other
    /// out, and under a burst (several stores on one file, hundreds of deliveries) a claim
    /// waits past the busy timeout and is answered 503. Set it in the connection options:
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    /// use tower_idempotency::store::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("new-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.join("webhooks.db"))
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal) // not sqlx's default
    ///     .busy_timeout(Duration::from_secs(30));
    /// let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
    /// let store = SqliteStore::new(pool);
    /// store.migrate().await?;
    ///
    /// // sqlx's default options leave a new file in a rollback journal: refused.
    /// let plain = SqliteConnectOptions::new()
    ///     .filename(dir.join("plain.db"))
    ///     .create_if_missing(true);
    /// let pool = SqlitePoolOptions::new().connect_with(plain).await?;
    /// let refused = SqliteStore::new(pool).migrate().await.unwrap_err();
    /// let why = std::error::Error::source(&refused).unwrap().to_string();
    /// assert!(why.contains("journal mode is `delete`"), "{why}");
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`SqliteStore::open`] sets this and the rest for you.
    pub fn new(pool: SqlitePool) -> Self {
        Self::queued(pool, Writer::queue())
    }

    fn queued(pool: SqlitePool, writer: Writer) -> Self {
        let table = Table::new(pool, queries(TableName::default_table())).writing_through(writer);
        Self::on(table, DEFAULT_MOST)
    }

    /// A store on `table`, its batches of at most `most` writes.
    fn on(table: Table<Sqlite>, most: usize) -> Self {
        let inbox = Arc::new(inbox::own(&table.sql.table));
        Self {
            batches: batch::batcher(
                claims::Lone {
                    table: table.clone(),
                    enter: queries::enter(&table.sql.table).into(),
                    enqueue: inbox.enqueue.clone(),
                },
                most,
            ),
            inbox,
            table,
            new_keys: NewKeys::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes.
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, false)?;
        let most = self.batches.most();
        Ok(Self::on(self.table.with_queries(queries(table)), most))
    }

    /// The most writes (claims that insert or take over a key, commits, and the inserts of
    /// [inbox](self#the-inbox) entries) that go to the database in one transaction: 128 unless
    /// set. Writes that arrive while the store's previous one is in flight go together in the
    /// next transaction, so that concurrent deliveries wait for one sync of the disk instead
    /// of one each; a lone delivery's write is sent at once, never held back for company (see
    /// [group commit](self#group-commit)). `1` commits each on its own. Set it before the
    /// store is used; clones made earlier keep theirs.
    ///
    /// At most 4,096: a larger `most` counts as that.
    ///
    /// # Panics
    ///
    /// If `most` is 0.
    pub fn max_batch(self, most: usize) -> Self {
        assert!(most > 0, "a batch carries at least one write");
        Self::on(self.table, most)
    }

    /// Creates the table and its indexes if they do not exist, in one transaction, and
    /// upgrades a table made by an earlier release (rebuilt with the new columns, its rows
    /// kept). Safe to call at every start-up, from several pools at once.
    ///
    /// First checks the pool's journal mode: a database that is neither in WAL mode nor in
    /// memory is refused with [`ConfigError::SqliteJournalMode`] as the error's source, and
    /// nothing is created (see [`new`](Self::new) for why, and the fix).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // IMMEDIATE takes the write lock up front, waiting for it under the busy timeout; a
        // deferred transaction could fail to upgrade its read lock instead.
        let mut tx = self
            .table
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .store()?;
        check_journal_mode(&mut tx).await?;
        let table = &self.table.sql.table;
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
            .bind(table.bare())
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let has = |name: &str| columns.iter().any(|c| c == name);
        if !columns.is_empty() && !has("runs") {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            self.table.script(&mut *tx, upgrade(table)).await?;
        } else if !columns.is_empty() && !has("receipt") {
            tracing::info!(table = %table.name(), "adding the receipt column to the idempotency table");
            self.table.script(&mut *tx, add_receipt(table)).await?;
        }
        self.table
            .script(&mut *tx, self.table.sql.migrate.clone())
            .await?;
        self.table
            .script(&mut *tx, self.table.sql.versions.migrate.clone())
            .await?;
        self.table
            .script(&mut *tx, self.table.sql.inbox.migrate.clone())
            .await?;
        // An earlier release's inbox has no `started` column: its running entries started.
        let inbox_columns: Vec<String> =
            sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
                .bind(table.inbox().bare())
                .fetch_all(&mut *tx)
                .await
                .store()?;
        if !inbox_columns.iter().any(|c| c == "started") {
            tracing::info!(table = %table.inbox().name(), "adding the started column to the inbox table");
            self.table
                .script(&mut *tx, self.table.sql.inbox.add_started.clone())
                .await?;
        }
        tx.commit().await.store()
    }
}

crate::store::sql::table_handles!(SqliteStore, SqlitePool);

/// Refuses a database that is neither in WAL mode nor in memory (whose journal mode is
/// `memory`, and cannot be WAL). WAL is a setting of the file, so one connection answers for
/// the pool; `memory` on a file is refused too, as it keeps the rollback journal's locking.
async fn check_journal_mode(conn: &mut sqlx::SqliteConnection) -> Result<(), StoreError> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .store()?;
    let mode = mode.to_ascii_lowercase();
    if mode == "wal" {
        return Ok(());
    }
    // The main database's file: empty for an in-memory (or a private temporary) database.
    let file: String = sqlx::query_scalar(
        "SELECT coalesce(file, '') FROM pragma_database_list WHERE name = 'main'",
    )
    .fetch_one(&mut *conn)
    .await
    .store()?;
    if mode == "memory" && file.is_empty() {
        return Ok(());
    }
    Err(StoreError::backend(ConfigError::SqliteJournalMode { mode }))
}

/// SQLITE_BUSY and its extended codes (the low byte is 5): "database is locked", the write
/// lock was not free within the busy timeout.
fn is_busy(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = e else {
        return false;
    };
    e.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 5)
}
