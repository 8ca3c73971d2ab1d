//! The SQLite store: the embedded default, one process, zero setup.
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, key, store::SqliteStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("sqlite-module-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! // The file is created if missing, set up (WAL, durable commits, a small pool) and migrated.
//! let store = SqliteStore::open(dir.join("webhooks.db")).await?;
//! assert_eq!(store.table_name(), "idempotency_keys");
//! let layer = IdempotencyLayer::new(store).key(key::github());
//! # let _ = layer;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Connecting
//!
//! - **A file**: [`SqliteStore::open`] sets what the store needs. With a pool of your own
//!   ([`SqliteStore::new`]), use WAL (`journal_mode(SqliteJournalMode::Wal)`, not sqlx's
//!   default; [`migrate`](SqliteStore::migrate) refuses a rollback journal) so readers do
//!   not block the writer, a busy timeout (`busy_timeout`, 5 s by default in sqlx) so a write
//!   waits for another process's write lock instead of failing, and `synchronous(Full)` for
//!   commits that survive a power cut (sqlx's default in WAL mode). Several pools, and several
//!   processes on one machine, can share the file: SQLite's write lock serialises the claims.
//! - **In memory** (`sqlite::memory:`): sqlx opens a shared-cache in-memory database that all
//!   connections of the pool share and that vanishes when its last connection closes, and
//!   shared-cache connections fail with "database table is locked" instead of waiting. Use
//!   one connection that the pool never closes:
//!   `SqlitePoolOptions::new().max_connections(1).min_connections(1).idle_timeout(None)
//!   .max_lifetime(None)`. For tests; a restart forgets everything.
//! - **Pool size**: a small pool (1 to 4 connections) of the store's own; [`open`] makes 4.
//!   Transactional mode holds one connection per delivery in flight.
//!
//! # Writers
//!
//! SQLite has one writer at a time, and a connection that finds the write lock taken sleeps in
//! the busy handler, waking at intervals, rather than queueing: under a burst, some writers
//! sleep past the busy timeout while others get the lock again and again. So the store's
//! writes (claims that insert or take over, renewals, commits, releases, purges, the counts of
//! duplicates, and every write of the [inbox](#the-inbox)) take turns in a queue of the process, first come first served, and only one at
//! a time asks SQLite for the lock. Every store made by [`open`] on one file shares one queue
//! (the path made absolute); a store made by [`new`](SqliteStore::new) has a queue of its
//! own. A claim that guesses its key is new takes a turn only when the queue is empty (see
//! [round trips](#round-trips)); other reads (a duplicate's claim, `describe`, `stuck_claims`) do not
//! queue, and neither does transactional mode, whose transaction holds the write lock while
//! the handler runs.
//!
//! [`open`]: SqliteStore::open
//!
//! # Time
//!
//! Timestamps are integers, microseconds since the Unix epoch, computed in SQL from SQLite's
//! clock, `unixepoch('subsec')` (millisecond resolution; SQLite 3.42 or later, the bundled
//! SQLite is newer), never from a Rust clock. SQLite keeps `'now'` fixed within a statement,
//! so the stale test, the timestamp written and the age returned agree.
//!
//! # Table
//!
//! [`SqliteStore::migrate`] runs this in one `BEGIN IMMEDIATE` transaction
//! (`idempotency_keys` is the default name, see [`SqliteStore::with_table_name`]):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys" (
//!     namespace     TEXT    NOT NULL,
//!     "key"         TEXT    NOT NULL,
//!     state         TEXT    NOT NULL CHECK (state IN ('processing', 'done', 'released')),
//!     token         INTEGER NOT NULL,
//!     deliveries    INTEGER NOT NULL,
//!     runs          INTEGER NOT NULL DEFAULT 1,
//!     reclaimed     INTEGER NOT NULL DEFAULT 0,
//!     first_seen_at INTEGER,          -- microseconds since the Unix epoch, as every time here
//!     last_seen_at  INTEGER,
//!     claimed_at    INTEGER NOT NULL,
//!     renewed_at    INTEGER,
//!     completed_at  INTEGER,
//!     receipt       BLOB,
//!     PRIMARY KEY (namespace, "key")
//! );
//! ```
//!
//! The primary key is the only index: a commit changes `state` and the settle time, and an
//! index that named either would be written by every commit (an index of `processing` rows
//! cost a lone new event about a twentieth of its time). So
//! [`purge_completed`](crate::store::Store::purge_completed) walks the primary key, 1,000 keys
//! at a time, and [`stuck_claims`](crate::store::Store::stuck_claims), which only the
//! operator's list of held claims calls, reads the whole table. Where that list is read often
//! on a large table, add the index under a name of your own, which `migrate()` leaves alone:
//! `CREATE INDEX idempotency_keys_in_flight ON idempotency_keys (claimed_at) WHERE state =
//! 'processing'`. `migrate()` drops the indexes of earlier releases: `<table>_stuck_idx` (that
//! index of `processing` rows), `<table>_claimed_idx` on `(state, claimed_at)` and
//! `<table>_completed_idx` on `(state, completed_at)`.
//!
//! SQLite cannot change a `CHECK` constraint in place, so a table of the first release
//! (without `runs`) is rebuilt in the same transaction: renamed to `<table>_previous`, the new
//! table created, every row copied (the seen and renewal times start at the claim time), the
//! old table dropped. It takes as long as copying the table once. A table made before receipts
//! (with `runs`, without `receipt`) gets the column with `ALTER TABLE … ADD COLUMN receipt
//! BLOB`, a change of the schema alone: no row is rewritten. Its rows read as committed
//! without a receipt.
//!
//! # Receipts
//!
//! `receipt` holds what [`commit_with`](crate::store::Store::commit_with) kept with a `done`
//! row ([`Receipt::encode`](crate::store::Receipt::encode): the fingerprint and the stored
//! response, body included). It is NULL for a row committed with `commit`, in flight, or
//! released, and a new run of the key clears it. A claim reads it with the row, in the read or
//! the upsert it runs anyway.
//!
//! # Round trips
//!
//! SQLite runs in-process, so a "round trip" is one statement on sqlx's worker thread. One per
//! operation, but a claim, which takes one or two:
//!
//! - `claim` guesses from the store's last claim whether its key is new:
//!   - after a claim whose key had no row (and at first), when no write of this process is
//!     in flight or waiting for its turn, it inserts first, in the writer's turn: `INSERT …
//!     VALUES (…, 'processing', <a new token>, …) ON CONFLICT (namespace, "key") DO NOTHING`,
//!     one statement for a new key, acquired if it inserted a row. It returns no row: one
//!     would wake the claim before the commit's sync of the disk, for nothing. When the key
//!     has a row the insert writes nothing, and the row is read with a second statement on
//!     the same connection (`SELECT
//!     state, token, … WHERE namespace = ?1 AND "key" = ?2`), each its own autocommit. Should
//!     the insert fail, the claim reads as below. The insert asks for SQLite's write lock: a
//!     duplicate that meets a lock held by another connection (another process's write, a
//!     transaction of transactional mode, another pool or a store made by `new` on the same
//!     file) waits for it as a write does, under the busy timeout, and past the layer's store
//!     timeout is answered 503;
//!   - otherwise (after a duplicate, or while a write is in flight or queued), a read of the
//!     key's row first, which answers a duplicate (done, in flight, held) without writing,
//!     and so without taking the write lock (see [delivery counts](#delivery-counts)).
//!
//!   A key with no row after the read, a released one, or one not renewed for the limit
//!   under reclaim then takes, in the writer's turn, `INSERT … ON CONFLICT (namespace, "key")
//!   DO UPDATE SET deliveries = deliveries + 1, <the claim's columns> = CASE WHEN <released, or
//!   processing and not renewed for the limit under reclaim> THEN <a new run, its receipt
//!   NULL> ELSE <as was> END RETURNING …`, as on PostgreSQL; acquired if the returned token is
//!   the one it generated.
//! - `renew`, `release`: `UPDATE … WHERE namespace = ?1 AND "key" = ?2 AND token = ?3 AND
//!   <state>`; `commit` and `commit_with` the same with the receipt first (`?1`, NULL for
//!   `commit`, kept as it was on a row done already), the key and token after it.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
//!
//! # Group commit
//!
//! SQLite commits one transaction at a time, each waiting for its own sync of the disk. The
//! claims that insert or take over a key, the commits and the inbox's new entries that arrive
//! while the store's previous write is in flight go, in the next writer's turn, in one `BEGIN
//! IMMEDIATE` transaction: each write its own statement, as alone, and one `COMMIT`, so one
//! sync, for the lot. There is no timer: a write that finds none in flight is sent at once,
//! alone, in its own transaction, so a lone delivery pays nothing for it. (The insert of a
//! claim that guesses its key new is only ever sent so: with a write in flight or queued,
//! the claim reads first instead.) A batch carries at
//! most [`max_batch`](SqliteStore::max_batch) writes (128 unless set) and 1 MiB of receipts
//! or requests. Should a statement of a batch fail, the batch is rolled back and its writes
//! go again one by one, so that only the one that fails again is answered 503. Every 2xx
//! still goes out after that delivery's own claim and commit are durable. `max_batch(1)`
//! turns it off.
//!
//! # Delivery counts
//!
//! A duplicate (of a done key, or of one in flight or held) is answered from the read (after
//! an insert that did nothing, when the claim guessed its key new), which writes nothing. Its
//! delivery is counted in the
//! process and added to the row's `deliveries` and `last_seen_at` by a background task about
//! once a second ([`with_count_interval`](SqliteStore::with_count_interval)), one `UPDATE` per key
//! that had duplicates meanwhile. [`describe`](crate::store::Store::describe) and
//! [`stuck_claims`](crate::store::Store::stuck_claims) on the same store include the counts not
//! written yet; another instance sees them once they are. A crash loses at most the last
//! interval's counts of the instance (never a claim: counts are statistics);
//! [`write_counts`](SqliteStore::write_counts) writes them at once, before shutting down say.
//!
//! # Transactional mode
//!
//! `BEGIN`, the connection's busy timeout read and set to the lock timeout (`PRAGMA
//! busy_timeout`), the marker's insert as `done`, the busy timeout put back, the handler's
//! statements, a check that the marker is still in the transaction, `COMMIT`. SQLite has one
//! writer at a time: the marker's insert, the transaction's first statement on the database,
//! takes the write lock, so deliveries in this mode run one after another, and a duplicate
//! waits at the insert for the first to finish, up to the lock timeout (then 409). The pooled
//! connection keeps its own busy timeout, for the handler's statements too.
//!
//! # Entity versions (the version guard)
//!
//! [`migrate`](SqliteStore::migrate) also creates, in the same transaction, the table of the
//! [version guard](crate::version_guard), `<table>_versions`:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys_versions" (
//!     namespace       TEXT    NOT NULL,
//!     entity          TEXT    NOT NULL,
//!     applied_version INTEGER,
//!     pending_version INTEGER,
//!     pending_token   INTEGER,
//!     pending_since   INTEGER, -- microseconds since the Unix epoch
//!     deliveries      INTEGER NOT NULL,
//!     last_seen_at    INTEGER NOT NULL,
//!     PRIMARY KEY (namespace, entity)
//! );
//! ```
//!
//! `begin_version`, `commit_version`, `release_version` and
//! [`version_guard::advance`](crate::version_guard::advance) are the statements the
//! [PostgreSQL store](crate::store::postgres) documents, one each (`advance` adds a `SELECT`
//! when the version is outdated), with `max(coalesce(…))` for `GREATEST` and SQLite's clock.
//! As there, only a version older than the applied one is outdated; an equal one runs.
//!
//! # The inbox
//!
//! [`migrate`](SqliteStore::migrate) also creates, in the same transaction, the table of the
//! [inbox](crate::store::inbox::InboxStore), `<table>_inbox`, so a database of an earlier
//! release gets it on its next `migrate()`:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys_inbox" (
//!     namespace   TEXT    NOT NULL,
//!     "key"       TEXT    NOT NULL,
//!     state       TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done', 'dead')),
//!     token       INTEGER,          -- the lease's, while running
//!     attempts    INTEGER NOT NULL DEFAULT 0,
//!     crashes     INTEGER NOT NULL DEFAULT 0,
//!     reclaimed   INTEGER NOT NULL DEFAULT 0, -- the last take took over a crashed attempt
//!     started     INTEGER NOT NULL DEFAULT 1, -- the running entry's handler started
//!     received_at INTEGER NOT NULL, -- microseconds since the Unix epoch, as every time here
//!     due_at      INTEGER NOT NULL,
//!     renewed_at  INTEGER NOT NULL,
//!     settled_at  INTEGER,
//!     request     BLOB,             -- StoredRequest::encode; NULL once retention deletes it
//!     history     BLOB,             -- Attempt::encode_history
//!     PRIMARY KEY (namespace, "key")
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_inbox_due_idx"
//!     ON "idempotency_keys_inbox" (due_at) WHERE state = 'queued';
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_inbox_run_idx"
//!     ON "idempotency_keys_inbox" (renewed_at) WHERE state = 'running';
//! ```
//!
//! The two partial indexes are a take's: the due queued entries, oldest first, and the running
//! ones whose worker stopped renewing. Every write below takes its turn in the [writers'
//! queue](#writers); reads use the pool.
//!
//! - `enqueue`: `SELECT state` through the pool, which answers a duplicate with no write and
//!   no turn in the queue; for a new key, `INSERT … ON CONFLICT (namespace, "key") DO
//!   NOTHING`, its one write (an insert that meets a row stored meanwhile reads again).
//! - `take`: one `BEGIN IMMEDIATE` transaction, which waits for the write lock under the busy
//!   timeout rather than failing to upgrade a read: under reclaim, an `UPDATE` turns dead the
//!   running entries whose handler started, not renewed for the stale limit, whose attempts
//!   ran out (the crash counted); then a `SELECT rowid` of the oldest due entries (queued
//!   ones, and stale running ones: under reclaim all, under hold those never started, by
//!   `due_at`, `LIMIT n`), and for each an `UPDATE … SET state = 'running', token = <the
//!   worker's token>, started = 0, crashes = crashes + (state = 'running' AND started), …
//!   WHERE rowid = ? RETURNING …`. SQLite's one writer at a time is what keeps two takes, of
//!   any pool or process, from taking one entry.
//! - `start`, `give_back`: one transaction each, one `UPDATE` per lease (`started = 1`, the
//!   attempt counted) or per token (queued again, the attempt taken back if it started).
//! - `renew_entry`, `settle`: `UPDATE … WHERE namespace = ?1 AND "key" = ?2 AND token = ?3
//!   AND state = 'running'`; no row changed is a lost lease. A settlement clears the token:
//!   done or dead with `settled_at` and the history, a retry queued again `due_at = now +
//!   after` with the history, a give-back queued again due now with `attempts - started`.
//! - `retry_now`, `retry_dead`, `discard`: one `UPDATE` each, of queued or dead entries (a
//!   dead one's counts start over), and of a running one when forced or stale.
//! - `entries`, `entry`, `stored_request`, `inbox_stats`: one `SELECT` each, ages and due
//!   times computed in SQL from SQLite's clock. The counts read the namespace's rows (all
//!   rows without one).
//! - `purge_inbox`: `UPDATE … SET request = NULL`, then `DELETE`, each of at most `limit`
//!   done entries settled long enough ago (`rowid IN (SELECT … LIMIT ?)`).

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
    batches: Batcher<batch::Write, batch::Wrote>,
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
