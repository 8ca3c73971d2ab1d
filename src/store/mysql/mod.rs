//! The MySQL and MariaDB store.
//!
//! ```no_run
//! use sqlx::mysql::MySqlPoolOptions;
//! use tower_idempotency::{IdempotencyLayer, key, store::MySqlStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = MySqlPoolOptions::new()
//!     .max_connections(16)
//!     .connect("mysql://app@db.internal/app")
//!     .await?;
//! let store = MySqlStore::new(pool);
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store).key(key::shopify());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # MariaDB and MySQL
//!
//! Neither has Postgres' `ON CONFLICT … RETURNING`. The claim is an
//! `INSERT … ON DUPLICATE KEY UPDATE` whose assignments run left to right: count the delivery,
//! replace the token only if the row is `released`, or `processing`, not renewed for the stale
//! limit and the policy reclaims, and start a new run (count it, restart `claimed_at` and
//! `renewed_at`, note whether it reclaimed, clear the receipt, set `state` last) only if the
//! token is now ours.
//!
//! - **MariaDB** (10.5 and later) accepts `RETURNING` on that statement and returns the row as
//!   the update left it: the claim is **one round trip**, as on Postgres.
//! - **MySQL** has no `RETURNING`. The upsert's affected-row count tells an insert (1: this
//!   delivery acquired a new key, **one round trip**) from an update (2); after an update a
//!   `SELECT` of the row (**a second round trip**) says whether the token is ours (a new run of
//!   a released or stale row), or what the key is (`done`, or `processing` and how long since
//!   its last renewal). If the row vanished in between (purged), the claim starts over.
//!
//! The store asks the server once, with `SELECT VERSION()`, which one it is (a version
//! containing `MariaDB`, and its release), or takes your word for it:
//! [`MySqlStore::with_flavor`]. MariaDB before 10.5 has no `RETURNING`: it claims the MySQL
//! way, in two statements.
//!
//! # Time
//!
//! Every timestamp and age comes from the server: `UTC_TIMESTAMP(6)` (microseconds, fixed
//! within a statement, independent of the session's time zone), ages with
//! `TIMESTAMPDIFF(MICROSECOND, …)`. App instances with skewed clocks agree on staleness.
//!
//! # Table
//!
//! [`MySqlStore::migrate`] runs one statement (`idempotency_keys` is the default name, see
//! [`MySqlStore::with_table_name`]), holding the named lock `tower_idempotency_migrate`
//! (`GET_LOCK`) so that instances starting together do not upgrade the table twice. MySQL
//! commits DDL implicitly, so it cannot share a transaction; the indexes are part of the one
//! atomic `CREATE TABLE`. Keys are compared byte for byte (`utf8mb4_bin`): event ids are
//! case-sensitive.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_keys` (
//!     namespace     VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     `key`         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     state         VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
//!     token         BIGINT       NOT NULL,
//!     deliveries    BIGINT       NOT NULL,
//!     runs          BIGINT       NOT NULL DEFAULT 1,
//!     reclaimed     BOOLEAN      NOT NULL DEFAULT FALSE,
//!     first_seen_at DATETIME(6)  NULL,
//!     last_seen_at  DATETIME(6)  NULL,
//!     renewed_at    DATETIME(6)  NULL,
//!     claimed_at    DATETIME(6)  NOT NULL,
//!     completed_at  DATETIME(6)  NULL,
//!     receipt       LONGBLOB     NULL,
//!     PRIMARY KEY (namespace, `key`),
//!     CONSTRAINT `idempotency_keys_state_check`
//!         CHECK (state IN ('processing', 'done', 'released'))
//! ) ENGINE = InnoDB
//! ```
//!
//! There is no index beside the primary key (MySQL has no partial index, and one on `state`
//! would be updated by every commit): [`stuck_claims`](crate::store::Store::stuck_claims) reads
//! the whole table (it is an operator's query, not one on the delivery path), and
//! [`purge_completed`](crate::store::Store::purge_completed) walks the primary key, 1,000 keys
//! at a time, so no statement holds many row locks for long. `migrate()` drops the two indexes
//! of earlier releases (`<table>_claimed_idx` on `(state, claimed_at)`, `<table>_completed_idx`
//! on `(state, completed_at)`) in place.
//!
//! A table of the first release (without `runs`) is upgraded with one `ALTER TABLE` that needs
//! no copy of the table: the new columns added, and the server-named check on `state` (found
//! in `information_schema.CHECK_CONSTRAINTS`), which refuses `released`, dropped. Adding the
//! new check would copy the table with writes blocked, so an upgraded table goes without it;
//! checks of your own stay. Rows are kept.
//!
//! A table made before receipts (with `runs`, without `receipt`, as `information_schema.COLUMNS`
//! says) gets the column with `ALTER TABLE … ADD COLUMN receipt LONGBLOB NULL`: a last
//! nullable column, which InnoDB adds in place without copying the table (instantly on MySQL
//! 8.0 and MariaDB 10.3 and later). The `ALTER` waits at most 10 s for the table's metadata
//! lock (`lock_wait_timeout`), as the drop of the old indexes does, and `migrate()` fails if it
//! did not get it. Its rows read as committed without a receipt.
//!
//! # Receipts
//!
//! `receipt` holds what [`commit_with`](crate::store::Store::commit_with) kept with a `done`
//! row ([`Receipt::encode`](crate::store::Receipt::encode): the fingerprint and the stored
//! response, body included; InnoDB keeps a large one off the row's page). It is NULL for a row
//! committed with `commit`, in flight, or released, and a new run of the key clears it. Claims
//! read it with the row, in the statements they run anyway. The commit sends it in one packet:
//! a receipt larger than the server's `max_allowed_packet` (16 MiB by default on MariaDB, 64
//! MiB on MySQL) fails the commit with the server's error.
//!
//! # Assignment order
//!
//! The claim and version statements rely on MySQL and MariaDB running the assignments of an
//! `ON DUPLICATE KEY UPDATE` left to right, each seeing the ones before it. MariaDB's
//! `SIMULTANEOUS_ASSIGNMENT` SQL mode (10.3.5 and later, off by default) makes every
//! assignment see the row as it was: a claim would then take a row's token without starting
//! a run, and a stale claim could be taken over again and again. The store does not support
//! it: [`migrate`](MySqlStore::migrate) fails when the mode is in the server's default
//! (`@@GLOBAL.sql_mode`) or in the session of the connection it migrates on, saying what to
//! change.
//!
//! Claims do not check it again: it would cost every claim a round trip. A pooled connection
//! whose session turns the mode on later (a `SET SESSION sql_mode` by application code on the
//! store's pool, or a pool whose `after_connect` sets it on some connections only) is not
//! detected; keep the store's pool to itself, and leave its SQL mode alone.
//!
//! # Round trips
//!
//! - `claim`: first an insert of the key as new. On MariaDB 10.5+ it is `INSERT … ON
//!   DUPLICATE KEY UPDATE token = token RETURNING …`: one round trip inserts a new key or
//!   returns the existing row, which assigning a column to itself leaves unchanged (InnoDB
//!   skips the write, nothing reaches the redo log; the row is locked for the statement). On
//!   MySQL and older MariaDB it is `INSERT IGNORE`, followed by a read of the row unless it
//!   inserted. On MariaDB too, while keys come new (the store's last claim found its key
//!   so), a claim sent alone is that `INSERT IGNORE` first, which returns nothing; only when
//!   it inserted nothing does the statement with `RETURNING` follow, to read the row. A
//!   duplicate that comes right after a new key takes two round trips, and the next one, one
//!   again. A duplicate (done, in flight, held) is answered from the row it read, writing
//!   nothing (see [delivery counts](#delivery-counts)). Only a released row, or one not renewed for the
//!   limit under reclaim, then takes the upsert described above, which takes it over.
//! - `renew`, `commit`, `release`: `UPDATE … WHERE namespace = ? AND `key` = ? AND token = ?
//!   AND <state>`, one each. sqlx connects with `CLIENT_FOUND_ROWS`, so the server reports
//!   matched rows and a repeated commit with the same lease answers `Ok`. `commit_with` is
//!   the commit's statement, whose first assignment `receipt = IF(state = 'done', receipt, ?)`
//!   writes the receipt (`commit` binds NULL), and keeps what a first commit wrote.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
//!
//! # Group commit
//!
//! Commits that arrive while the store's commit statements are in flight go together in the
//! next one, and on MariaDB 10.5 and later so do claims: one statement, one transaction and
//! one flush of the redo log for the lot, each delivery still answered with its own row and
//! fenced by its own token (the statements are in `batch.rs`: a multi-row insert-or-read for
//! claims, an `UPDATE` joined to the bound rows for commits). On MySQL and older MariaDB,
//! whose claim reads after an ignored insert, claims go one by one. Each kind has two lanes,
//! two statements in flight at once: a write that finds a lane free is sent at once, alone,
//! as the statement above, with no timer, so a lone delivery pays nothing for it. A batch
//! carries at most [`max_batch`](MySqlStore::max_batch) writes (128 unless set) and 1 MiB of
//! receipts, never two on one key, sorted by key so that two instances' batches lock shared
//! keys in one order. A batch chosen as a deadlock's victim, or one over the server's
//! `max_allowed_packet`, is sent again write by write; any other failure answers its own
//! deliveries 503. Every 2xx still goes out after that delivery's own claim and commit are
//! durable. `max_batch(1)` turns it off.
//!
//! # Delivery counts
//!
//! A duplicate (of a done key, or of one in flight or held) is answered from the read alone,
//! which writes nothing and so never waits for a disk flush. Its delivery is counted in the
//! process and added to the row's `deliveries` and `last_seen_at` by a background task about
//! once a second ([`with_count_interval`](MySqlStore::with_count_interval)), one `UPDATE` per key
//! that had duplicates meanwhile. [`describe`](crate::store::Store::describe) and
//! [`stuck_claims`](crate::store::Store::stuck_claims) on the same store include the counts not
//! written yet; another instance sees them once they are. A crash loses at most the last
//! interval's counts of the instance (never a claim: counts are statistics);
//! [`write_counts`](MySqlStore::write_counts) writes them at once, before shutting down say.
//!
//! # Transactional mode
//!
//! `BEGIN`, `INSERT IGNORE` of the marker as `done` (and, when the key existed, a read of its
//! row, and an `UPDATE` that takes it over if it was released), the handler's statements, a
//! check that the marker is still in the transaction, `COMMIT`. A duplicate's insert waits for
//! the open transaction on the primary key; past the lock timeout (error 1205) it answers 409.
//! The lock timeout bounds the marker's statements only, and the pooled connection keeps its
//! own `innodb_lock_wait_timeout`, for the handler's statements too: MariaDB runs each marker
//! statement as `SET STATEMENT innodb_lock_wait_timeout = <s> FOR …`; on MySQL (and MariaDB
//! before 10.5) the session's value is saved and replaced in the `BEGIN` round trip, and put
//! back in one more round trip right after the marker.
//!
//! # Entity versions (the version guard)
//!
//! [`migrate`](MySqlStore::migrate) also runs a second `CREATE TABLE` for the
//! [version guard](crate::version_guard), `<table>_versions`:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_keys_versions` (
//!     namespace       VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     entity          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     applied_version BIGINT       NULL,
//!     applied_token   BIGINT       NULL,
//!     pending_version BIGINT       NULL,
//!     pending_token   BIGINT       NULL,
//!     pending_since   DATETIME(6)  NULL,
//!     deliveries      BIGINT       NOT NULL,
//!     last_seen_at    DATETIME(6)  NOT NULL,
//!     PRIMARY KEY (namespace, entity)
//! ) ENGINE = InnoDB
//! ```
//!
//! - `begin_version`: `INSERT … ON DUPLICATE KEY UPDATE deliveries = deliveries + 1,
//!   pending_token = IF(<not older than applied_version (applied_version <= ours), and nothing
//!   pending or stale under reclaim>, ?, pending_token),
//!   pending_version = IF(pending_token <=> ?, ?, pending_version), …` (left to right, as for
//!   claims). MariaDB: with `RETURNING`, one round trip. MySQL: one for a new entity; otherwise
//!   a `SELECT` of the row follows (two), and the claim starts over if the row changed in
//!   between.
//! - `commit_version`, `release_version`: one `UPDATE … WHERE … AND pending_token = ?` each.
//! - [`version_guard::advance`](crate::version_guard::advance), in the caller's transaction: an upsert that
//!   takes the row's exclusive lock at once and, unless the row is at a newer version, moves
//!   the version (an equal one advances, as the version guard runs it) and stamps
//!   `applied_token` with a fresh token. The stamp says whether this statement advanced the
//!   row (ours: `Applied`) or left it at a newer version (`Outdated`), whatever the versions
//!   compare. MariaDB returns the row (one round trip); MySQL reads it with `SELECT … FOR
//!   UPDATE` unless it was new (one or two).
//!
//! # Inbox
//!
//! [`migrate`](MySqlStore::migrate) also creates the table of the
//! [inbox](crate::store::inbox), `<table>_inbox` (`IF NOT EXISTS`: a database of an earlier
//! release gets it on its next `migrate()`). Its timestamps are the server's
//! `UTC_TIMESTAMP(6)`, as the claims' are.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_keys_inbox` (
//!     namespace   VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     `key`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     state       VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
//!     token       BIGINT       NULL,
//!     attempts    INT          NOT NULL,
//!     crashes     INT          NOT NULL,
//!     received_at DATETIME(6)  NOT NULL,
//!     due_at      DATETIME(6)  NOT NULL,
//!     renewed_at  DATETIME(6)  NOT NULL,
//!     settled_at  DATETIME(6)  NULL,
//!     request     LONGBLOB     NULL,
//!     history     BLOB         NULL,
//!     PRIMARY KEY (namespace, `key`),
//!     KEY due_idx (state, due_at),
//!     KEY stale_idx (state, renewed_at),
//!     CONSTRAINT `idempotency_keys_inbox_check`
//!         CHECK (state IN ('queued', 'running', 'done', 'dead'))
//! ) ENGINE = InnoDB
//! ```
//!
//! `request` is [`StoredRequest::encode`](crate::store::inbox::StoredRequest::encode)'s bytes
//! (NULL once retention deleted it), `history`
//! [`Attempt::encode_history`](crate::store::inbox::Attempt::encode_history)'s. `token` is the
//! lease's while the entry runs, NULL once settled; a new entry keeps the random mark its
//! insert wrote there.
//!
//! - `enqueue`: on MariaDB 10.5+, one `INSERT … ON DUPLICATE KEY UPDATE token = token
//!   RETURNING state, token`: the returned mark says whether it inserted; a duplicate assigns a
//!   column to itself, which InnoDB skips, writing nothing. On MySQL and older MariaDB, a plain
//!   `INSERT` (one round trip for a new key); a duplicate fails on the primary key (error 1062,
//!   nothing written) and its state is read (a second).
//! - `take`: one transaction at READ COMMITTED (so InnoDB locks no gaps, and keeps no lock on a
//!   row it passes over): `SELECT … FORCE INDEX (due_idx) WHERE state = 'queued' AND due_at <=
//!   now ORDER BY due_at LIMIT n FOR UPDATE SKIP LOCKED` and, under reclaim, the same of the
//!   running entries not renewed for the stale limit (by `stale_idx`); the rows are merged in
//!   due order, and one `UPDATE … JOIN (SELECT ? … UNION ALL …)` gives each taken row its new
//!   token (made in the process) and counts its attempt, and makes dead a crashed one with no
//!   attempt left; then `COMMIT`. A take never waits for an entry another worker holds, and
//!   workers on every instance take each entry once. It needs `SKIP LOCKED`: MySQL 8.0.1 or
//!   MariaDB 10.6 and later. InnoDB's deadlock victim (error 1213) runs again, up to three
//!   times.
//! - `renew_entry`, `settle`: one `UPDATE` each of the entry's row, fenced by `token = ? AND
//!   state = 'running'`; no row matched is a lost lease.
//! - `entries`, `entry`, `stored_request`, `retry_now`, `retry_dead`, `discard`: one statement
//!   each, ages by the server's clock. `inbox_stats`: one `GROUP BY state` over `due_idx`,
//!   which holds the key too, so no row is read and done entries are skipped.
//! - `purge_inbox`: an `UPDATE … SET request = NULL … LIMIT ?` and a `DELETE … LIMIT ?`, each
//!   at READ COMMITTED, walking `due_idx` over the done entries due before the age (a done entry
//!   was due before it was settled: `discard` moves a due time still ahead back to now).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySql, MySqlPool};
use tokio::sync::OnceCell;

use super::batch::DEFAULT_MOST;
use super::sql::{NewKeys, ResultExt as _, Table, TableName};
use super::{ConfigError, StoreError};

mod batch;
mod claims;
mod inbox;
mod queries;
mod server;
mod transactional;
mod versions;

use queries::{ClaimQueries, add_receipt, queries, upgrade};
use server::{check_sql_mode, flavor_of, is_mariadb};

/// The name of the lock `migrate` holds: instances starting together upgrade the table once.
const MIGRATE_LOCK: &str = "tower_idempotency_migrate";

/// Which server a [`MySqlStore`] talks to; it decides how a claim is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub enum MySqlFlavor {
    /// MariaDB 10.5 or later: the claim is one `INSERT … ON DUPLICATE KEY UPDATE …
    /// RETURNING`.
    MariaDb,
    /// MySQL, or a MariaDB older than 10.5 (whose `INSERT` has no `RETURNING`): the claim is
    /// an upsert, then a `SELECT` unless the upsert inserted.
    MySql,
}

/// Claims kept in a MySQL or MariaDB table, shared by every app instance that uses the
/// database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::mysql) for the SQL,
/// the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub struct MySqlStore {
    table: Table<MySql>,
    /// The statements only this backend has.
    claims: Arc<ClaimQueries>,
    /// The statements of the inbox that are MySQL's own (the others are the table's).
    inbox: Arc<inbox::Own>,
    flavor: Arc<OnceCell<MySqlFlavor>>,
    /// Where concurrent claims and commits meet to go together.
    batches: batch::Batches,
    /// Whether the store's last claim found its key new: on MariaDB the next claim, sent
    /// alone, then inserts first (see [round trips](self#round-trips)).
    new_keys: NewKeys,
}

impl MySqlStore {
    /// A store on `pool`, in the table `idempotency_keys`. It finds out on first use whether
    /// the server is MariaDB or MySQL.
    pub fn new(pool: MySqlPool) -> Self {
        let table = TableName::default_table();
        let inbox = inbox::Own::new(&table);
        let (sql, claims) = queries(table);
        let (table, claims) = (Table::new(pool, sql), Arc::new(claims));
        Self {
            batches: batches(&table, &claims, DEFAULT_MOST),
            table,
            claims,
            inbox: Arc::new(inbox),
            flavor: Arc::default(),
            new_keys: NewKeys::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes.
    pub fn with_table_name(mut self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, false)?;
        self.inbox = Arc::new(inbox::Own::new(&table));
        let (sql, claims) = queries(table);
        self.table = self.table.with_queries(sql);
        self.claims = Arc::new(claims);
        let most = self.batches.claims.most();
        Ok(self.max_batch(most))
    }

    /// The most commits, and apart the most claims (MariaDB 10.5 and later), that go to the
    /// server in one statement: 128 unless set. Those that arrive while the store's previous
    /// one is in flight go together in the next statement, so that concurrent deliveries share
    /// its round trip, its transaction and its flush of the redo log; a lone delivery's is
    /// sent at once, never held back for company (see [group commit](self#group-commit)). `1`
    /// sends each on its own, as many at a time as the pool allows. Set it before the store is
    /// used; clones made earlier keep theirs.
    ///
    /// At most 4,096: a larger `most` counts as that.
    ///
    /// # Panics
    ///
    /// If `most` is 0.
    pub fn max_batch(mut self, most: usize) -> Self {
        assert!(most > 0, "a batch carries at least one write");
        self.batches = batches(&self.table, &self.claims, most);
        self
    }

    /// Skips asking the server which it is: claims are made the `flavor` way. Forcing
    /// [`MySqlFlavor::MySql`] on MariaDB works (two round trips); forcing
    /// [`MySqlFlavor::MariaDb`] on MySQL, or on MariaDB before 10.5, fails every claim with a
    /// syntax error. [`migrate`](Self::migrate) asks the server anyway, for its own dialect.
    pub fn with_flavor(mut self, flavor: MySqlFlavor) -> Self {
        self.flavor = Arc::new(OnceCell::new_with(Some(flavor)));
        self
    }

    /// How the store makes claims: as set by [`with_flavor`](Self::with_flavor), or asked
    /// once with `SELECT VERSION()` and remembered: [`MySqlFlavor::MariaDb`] for MariaDB 10.5
    /// and later, [`MySqlFlavor::MySql`] for MySQL, for older MariaDB, and for a MariaDB whose
    /// release it cannot read.
    pub async fn flavor(&self) -> Result<MySqlFlavor, StoreError> {
        self.flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&self.table.pool)
                    .await
                    .store()?;
                Ok(flavor_of(&version))
            })
            .await
            .copied()
    }

    /// Creates the table with its indexes if it does not exist (one `CREATE TABLE`, and one
    /// more each for the [versions](crate::store::mysql#entity-versions-the-version-guard)
    /// and the [inbox](crate::store::mysql#inbox) tables), and upgrades a table made by an
    /// earlier release (one `ALTER TABLE`, its rows kept). Safe to call at every start-up,
    /// from several instances at once: a named lock (`GET_LOCK`) lets one of them at a time
    /// in.
    ///
    /// Fails, changing nothing, when the server's SQL mode (its default, or this connection's)
    /// includes MariaDB's `SIMULTANEOUS_ASSIGNMENT`, under which claims are not safe (see the
    /// [module docs](crate::store::mysql#assignment-order)).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One connection holds a named lock throughout, so that instances starting together
        // do not both upgrade the table.
        let mut conn = self.table.pool.acquire().await.store()?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(MIGRATE_LOCK)
            .fetch_one(&mut *conn)
            .await
            .store()?;
        if locked != Some(1) {
            return Err(StoreError::backend(
                "another instance held the migration lock for 60 seconds",
            ));
        }
        let migrated = self.migrate_locked(&mut conn).await;
        let unlocked = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(MIGRATE_LOCK)
            .execute(&mut *conn)
            .await;
        migrated?;
        unlocked.store().map(drop)
    }

    /// Drops the indexes of earlier releases on `(state, claimed_at)` and `(state,
    /// completed_at)`, which every commit had to update, should the table have them (InnoDB
    /// drops a secondary index in place, without copying the table).
    async fn drop_old_indexes(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), StoreError> {
        let table = &self.table.sql.table;
        let [stuck, claimed, completed] = table.old_indexes();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME IN (?, ?, ?)",
        )
        .bind(table.bare())
        .bind(stuck)
        .bind(claimed)
        .bind(completed)
        .fetch_all(&mut *conn)
        .await
        .store()?;
        if found.is_empty() {
            return Ok(());
        }
        let drops: Vec<String> = found
            .iter()
            .map(|name| format!("DROP INDEX `{name}`"))
            .collect();
        let alter = format!("ALTER TABLE {} {}", table.quoted('`'), drops.join(", "));
        alter_briefly(conn, alter).await
    }

    async fn migrate_locked(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), StoreError> {
        let (version, session_mode, global_mode): (String, String, String) =
            sqlx::query_as("SELECT VERSION(), @@SESSION.sql_mode, @@GLOBAL.sql_mode")
                .fetch_one(&mut *conn)
                .await
                .store()?;
        check_sql_mode(&session_mode, &global_mode)?;
        let mariadb = is_mariadb(&version);
        // Asked anyway: the claims need not ask again.
        self.flavor
            .get_or_init(|| async { flavor_of(&version) })
            .await;
        self.table
            .script(&mut *conn, self.table.sql.migrate.clone())
            .await?;
        let table = &self.table.sql.table;
        // The columns that tell an earlier release's table: `runs` (added by the second),
        // `receipt` (the latest).
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
             AND COLUMN_NAME IN ('runs', 'receipt')",
        )
        .bind(table.bare())
        .fetch_all(&mut *conn)
        .await
        .store()?;
        let has = |name: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(name));
        if !has("runs") {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            // Only the check on `state`: a check of the application's own stays. The
            // catalog and the syntax are the server's, whichever way claims are made.
            let find = if mariadb {
                "SELECT CONSTRAINT_NAME FROM information_schema.CHECK_CONSTRAINTS \
                 WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ? \
                 AND CHECK_CLAUSE LIKE '%processing%'"
            } else {
                "SELECT tc.CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS tc \
                 JOIN information_schema.CHECK_CONSTRAINTS cc \
                 ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA \
                 AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME \
                 WHERE tc.TABLE_SCHEMA = DATABASE() AND tc.TABLE_NAME = ? \
                 AND tc.CONSTRAINT_TYPE = 'CHECK' AND cc.CHECK_CLAUSE LIKE '%processing%'"
            };
            let checks: Vec<String> = sqlx::query_scalar(find)
                .bind(table.bare())
                .fetch_all(&mut *conn)
                .await
                .store()?;
            self.table
                .script(&mut *conn, upgrade(table, &checks, mariadb))
                .await?;
        } else if !has("receipt") {
            tracing::info!(table = %table.name(), "adding the receipt column to the idempotency table");
            alter_briefly(conn, add_receipt(table)).await?;
        }
        self.drop_old_indexes(conn).await?;
        self.table
            .script(&mut *conn, self.table.sql.versions.migrate.clone())
            .await?;
        self.table
            .script(&mut *conn, self.table.sql.inbox.migrate.clone())
            .await?;
        // An earlier release's inbox has no `started` column: its running entries started.
        let started: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'started'",
        )
        .bind(table.inbox().bare())
        .fetch_one(&mut *conn)
        .await
        .store()?;
        if started == 0 {
            tracing::info!(table = %table.inbox().name(), "adding the started column to the inbox table");
            alter_briefly(conn, self.table.sql.inbox.add_started.to_string()).await?;
        }
        Ok(())
    }
}

/// Runs `alter` on `conn` waiting at most 10 s for the table's metadata lock. The lock waits
/// behind every open transaction on the table, and every later statement waits behind the
/// lock: giving up rather than stalling the claims, `migrate()` fails, and the next start tries
/// again. The connection's own wait is put back, as it returns to the pool.
async fn alter_briefly(conn: &mut sqlx::MySqlConnection, alter: String) -> Result<(), StoreError> {
    let previous: u64 = sqlx::query_scalar("SELECT @@SESSION.lock_wait_timeout")
        .fetch_one(&mut *conn)
        .await
        .store()?;
    let set = |seconds: u64| {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {seconds}"
        )))
    };
    set(10).execute(&mut *conn).await.store()?;
    let altered = sqlx::raw_sql(AssertSqlSafe(alter))
        .execute(&mut *conn)
        .await;
    set(previous).execute(&mut *conn).await.store()?;
    altered.store().map(drop)
}

crate::store::sql::table_handles!(MySqlStore, MySqlPool);

/// The batchers of a store on `table`, at most `most` writes a batch.
fn batches(table: &Table<MySql>, claims: &ClaimQueries, most: usize) -> batch::Batches {
    let lone = claims::Lone {
        pool: table.pool.clone(),
        claim: claims.insert_or_read.clone(),
        insert: claims.insert_new.clone(),
        commit: table.sql.commit.clone(),
    };
    batch::Batches::new(Arc::new(lone), &table.sql.table, most)
}
