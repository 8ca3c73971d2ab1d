//! The SQLite store: the embedded default, one process, zero setup.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//! use tower_idempotency::{IdempotencyLayer, key, store::SqliteStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let options = SqliteConnectOptions::new()
//!     .filename("webhooks.db")
//!     .create_if_missing(true)
//!     .journal_mode(SqliteJournalMode::Wal)
//!     .busy_timeout(Duration::from_secs(5));
//! let pool = SqlitePoolOptions::new().connect_with(options).await?;
//! let store = SqliteStore::new(pool);
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store).key(key::github());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Connecting
//!
//! - **A file**: use WAL (`journal_mode(SqliteJournalMode::Wal)`) so readers do not block the
//!   writer, and a busy timeout (`busy_timeout`, 5 s by default in sqlx) so concurrent claims
//!   wait for the write lock instead of failing. Several pools, and several processes on one
//!   machine, can share the file: SQLite's write lock serialises the claims.
//! - **In memory** (`sqlite::memory:`): sqlx opens a shared-cache in-memory database that all
//!   connections of the pool share and that vanishes when its last connection closes, and
//!   shared-cache connections fail with "database table is locked" instead of waiting. Use
//!   one connection that the pool never closes:
//!   `SqlitePoolOptions::new().max_connections(1).min_connections(1).idle_timeout(None)
//!   .max_lifetime(None)`. For tests; a restart forgets everything.
//!
//! - **Pool size**: SQLite has one writer at a time, and a connection waiting for the write
//!   lock sleeps in the busy handler rather than queueing. Under many concurrent deliveries a
//!   large pool spends its time asleep (in the benchmarks, a 16-connection pool answered
//!   concurrent duplicates many times slower than a 1-connection pool). Give the store a small
//!   pool of its own (1 to 4 connections); transactional mode holds one connection per
//!   delivery in flight.
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
//!     PRIMARY KEY (namespace, "key")
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_claimed_idx"
//!     ON "idempotency_keys" (state, claimed_at);
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_completed_idx"
//!     ON "idempotency_keys" (state, completed_at);
//! ```
//!
//! SQLite cannot change a `CHECK` constraint in place, so a table of the first release
//! (without `runs`) is rebuilt in the same transaction: renamed to `<table>_previous`, the new
//! table created, every row copied (the seen and renewal times start at the claim time), the
//! old table dropped. It takes as long as copying the table once.
//!
//! # Round trips
//!
//! SQLite runs in-process, so a "round trip" is one statement on sqlx's worker thread. One per
//! operation:
//!
//! - `claim`: `INSERT … ON CONFLICT (namespace, "key") DO UPDATE SET deliveries =
//!   deliveries + 1, <the claim's columns> = CASE WHEN <released, or processing and not renewed
//!   for the limit under reclaim> THEN <a new run> ELSE <as was> END RETURNING …`, as on
//!   PostgreSQL; acquired if the returned token is the one it generated. A duplicate of a done
//!   key is this one statement too.
//! - `renew`, `commit`, `release`: `UPDATE … WHERE namespace = ?1 AND "key" = ?2 AND token =
//!   ?3 AND <state>`.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
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

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlitePool};

use super::sql::{
    Queries, ResultExt, TableName, VersionQueries, sql_store, upsert_store, version_store,
};
use super::{ConfigError, StoreError};

/// Now, in microseconds since the Unix epoch, from SQLite's clock.
const NOW_US: &str = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// Claims kept in a SQLite database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::sqlite) for how to
/// connect, the SQL, the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Queries>,
}

/// The claims table as `CREATE TABLE` makes it (an upgrade rebuilds an older table so).
fn create_table(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace     TEXT    NOT NULL,
    "key"         TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('processing', 'done', 'released')),
    token         INTEGER NOT NULL,
    deliveries    INTEGER NOT NULL,
    runs          INTEGER NOT NULL DEFAULT 1,
    reclaimed     INTEGER NOT NULL DEFAULT 0,
    first_seen_at INTEGER,
    last_seen_at  INTEGER,
    claimed_at    INTEGER NOT NULL,
    renewed_at    INTEGER,
    completed_at  INTEGER,
    PRIMARY KEY (namespace, "key")
);"#
    )
}

fn create_indexes(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(
        r#"CREATE INDEX IF NOT EXISTS {claimed} ON {t} (state, claimed_at);
CREATE INDEX IF NOT EXISTS {completed} ON {t} (state, completed_at);"#,
        claimed = table.claimed_index('"'),
        completed = table.completed_index('"'),
    )
}

/// Rebuilds a table of the first release (states `processing` and `done` only, no counts of
/// runs, no heartbeat): SQLite cannot change a `CHECK` constraint in place. The rows are
/// copied whole; the seen times start at the claim time.
fn upgrade(table: &TableName) -> String {
    let t = table.quoted('"');
    let previous = format!("\"{}_previous\"", table.bare());
    format!(
        r#"ALTER TABLE {t} RENAME TO {previous};
{create}
INSERT INTO {t} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at, completed_at)
SELECT namespace, "key", state, token, deliveries, 1, 0,
    claimed_at, claimed_at, claimed_at, claimed_at, completed_at
FROM {previous};
DROP TABLE {previous};"#,
        create = create_table(table),
    )
}

fn queries(table: TableName) -> Queries {
    let t = table.quoted('"');
    let heartbeat = "COALESCE(renewed_at, claimed_at)";
    let age_of = |at: &str| format!("{NOW_US} - {at}");
    let age = age_of("claimed_at");
    let idle = age_of(heartbeat);
    let migrate = format!("{}\n{}", create_table(&table), create_indexes(&table));
    // ?4: whether the policy reclaims; ?5: the stale limit in microseconds. A released row is
    // free; a processing one only once its owner stopped renewing it.
    let take = format!(
        "(t.state = 'released' OR (t.state = 'processing' AND ?4 \
         AND COALESCE(t.renewed_at, t.claimed_at) <= {NOW_US} - ?5))"
    );
    let claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?1, ?2, 'processing', ?3, 1, 1, 0, {NOW_US}, {NOW_US}, {NOW_US}, {NOW_US})
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    state = CASE WHEN {take} THEN 'processing' ELSE t.state END,
    token = CASE WHEN {take} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {take} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {take} THEN t.state = 'processing' ELSE t.reclaimed END,
    claimed_at = CASE WHEN {take} THEN {NOW_US} ELSE t.claimed_at END,
    renewed_at = CASE WHEN {take} THEN {NOW_US} ELSE t.renewed_at END,
    completed_at = CASE WHEN {take} THEN NULL ELSE t.completed_at END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us"#
    );
    let fenced = r#"namespace = ?1 AND "key" = ?2 AND token = ?3"#;
    let renew =
        format!("UPDATE {t} SET renewed_at = {NOW_US} WHERE {fenced} AND state = 'processing'");
    let commit = format!(
        r#"UPDATE {t} SET state = 'done',
    completed_at = CASE WHEN state = 'done' THEN completed_at ELSE {NOW_US} END
WHERE {fenced} AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET state = 'released', \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE {NOW_US} END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {age}, {idle}, {settled}
FROM {t} WHERE namespace = ?1 AND "key" = ?2"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, "key", deliveries, {age} AS age_us, {idle} AS idle_us FROM {t}
WHERE state = 'processing' AND {heartbeat} <= {NOW_US} - ?1
ORDER BY {heartbeat}, namespace, "key""#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET state = 'done', completed_at = {NOW_US}, token = ?1
WHERE namespace = ?2 AND "key" = ?3 AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = {NOW_US}
WHERE namespace = ?1 AND "key" = ?2 AND state = 'processing'"#
    );
    let purge = format!(
        r#"DELETE FROM {t}
WHERE state IN ('done', 'released') AND completed_at <= {NOW_US} - ?1"#
    );
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    // A released row is free for the marker too.
    let free = "t.state = 'released'";
    let tx_claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES (?1, ?2, 'done', ?3, 1, 1, 0, {NOW_US}, {NOW_US}, {NOW_US}, {NOW_US})
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    state = CASE WHEN {free} THEN 'done' ELSE t.state END,
    token = CASE WHEN {free} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {free} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {free} THEN 0 ELSE t.reclaimed END,
    claimed_at = CASE WHEN {free} THEN {NOW_US} ELSE t.claimed_at END,
    completed_at = CASE WHEN {free} THEN {NOW_US} ELSE t.completed_at END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us"#
    );
    let versions = version_queries(&table);
    Queries {
        table,
        versions,
        tx_claim: tx_claim.into(),
        tx_check: tx_check.into(),
        migrate: migrate.into(),
        claim: claim.into(),
        renew: renew.into(),
        commit: commit.into(),
        release: release.into(),
        describe: describe.into(),
        stuck: stuck.into(),
        resolve_done: resolve_done.into(),
        resolve_release: resolve_release.into(),
        purge: purge.into(),
    }
}

/// The statements on the versions table of the [version guard](crate::version_guard).
fn version_queries(table: &TableName) -> VersionQueries {
    let v = table.versions().quoted('"');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       TEXT    NOT NULL,
    entity          TEXT    NOT NULL,
    applied_version INTEGER,
    pending_version INTEGER,
    pending_token   INTEGER,
    pending_since   INTEGER,
    deliveries      INTEGER NOT NULL,
    last_seen_at    INTEGER NOT NULL,
    PRIMARY KEY (namespace, entity)
);"#
    );
    // ?1 namespace, ?2 entity, ?3 version, ?4 our token, ?5 whether the policy reclaims, ?6 the
    // stale limit in microseconds. Every SET expression sees the row as it was. Only an older
    // version is outdated: an equal one takes the slot like a newer one.
    let acquire = format!(
        "(t.applied_version IS NULL OR t.applied_version <= excluded.pending_version) \
         AND (t.pending_token IS NULL OR (?5 AND t.pending_since <= {NOW_US} - ?6 \
             AND t.pending_version <= excluded.pending_version))"
    );
    let begin = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES (?1, ?2, ?3, ?4, {NOW_US}, 1, {NOW_US})
ON CONFLICT (namespace, entity) DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    pending_version = CASE WHEN {acquire} THEN excluded.pending_version ELSE t.pending_version END,
    pending_token = CASE WHEN {acquire} THEN excluded.pending_token ELSE t.pending_token END,
    pending_since = CASE WHEN {acquire} THEN excluded.pending_since ELSE t.pending_since END
RETURNING applied_version, pending_version, pending_token, {NOW_US} - pending_since AS age_us"#
    );
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let renew = format!(
        "UPDATE {v} SET pending_since = {NOW_US} WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"
    );
    // SQLite's max() of several arguments is NULL if one is.
    let newest = "max(coalesce(applied_version, pending_version), pending_version)";
    let commit = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"#
    );
    let release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = ?1 AND entity = ?2");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ?1 AND entity = ?2 AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ?1 AND entity = ?2 AND pending_token IS NOT NULL"
    );
    // ?1 namespace, ?2 entity, ?3 version. A row at a newer version is left as it is and
    // returns nothing; an equal one is advanced (to the same version) like an older one.
    let advance = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, applied_version, deliveries, last_seen_at)
VALUES (?1, ?2, ?3, 1, {NOW_US})
ON CONFLICT (namespace, entity) DO UPDATE SET
    applied_version = excluded.applied_version,
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US}
WHERE t.applied_version IS NULL OR t.applied_version <= excluded.applied_version
RETURNING applied_version"#
    );
    VersionQueries {
        migrate: migrate.into(),
        renew: renew.into(),
        begin: begin.into(),
        commit: commit.into(),
        release: release.into(),
        applied: applied.into(),
        resolve_done: resolve_done.into(),
        resolve_release: resolve_release.into(),
        advance: advance.into(),
    }
}

impl SqliteStore {
    /// A store on `pool`, in the table `idempotency_keys`.
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            sql: Arc::new(queries(TableName::default_table())),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes.
    pub fn with_table_name(mut self, name: &str) -> Result<Self, ConfigError> {
        self.sql = Arc::new(queries(TableName::parse(name, false)?));
        Ok(self)
    }

    /// The table's name.
    pub fn table_name(&self) -> String {
        self.sql.table.name()
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates the table and its indexes if they do not exist, in one transaction, and
    /// upgrades a table made by an earlier release (rebuilt with the new columns, its rows
    /// kept). Safe to call at every start-up, from several pools at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // IMMEDIATE takes the write lock up front, waiting for it under the busy timeout; a
        // deferred transaction could fail to upgrade its read lock instead.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.store()?;
        let table = &self.sql.table;
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
            .bind(table.bare())
            .fetch_all(&mut *tx)
            .await
            .store()?;
        if !columns.is_empty() && !columns.iter().any(|c| c == "runs") {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            sqlx::raw_sql(AssertSqlSafe(upgrade(table)))
                .execute(&mut *tx)
                .await
                .store()?;
        }
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        sqlx::raw_sql(AssertSqlSafe(self.sql.versions.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()
    }
}

sql_store!(SqliteStore);
version_store!(SqliteStore);
upsert_store!(SqliteStore, sqlx::Sqlite, sqlx::SqliteConnection);

/// The connection's busy timeout before the delivery's transaction began, in milliseconds.
type LockWait = i64;

impl SqliteStore {
    /// `BEGIN` (deferred: it takes no lock yet, so it cannot wait), then the connection's busy
    /// timeout read and set to the lock timeout. The marker's insert, the transaction's first
    /// statement on the database, waits for the write lock under it, and
    /// [`end_lock_wait`](Self::end_lock_wait) puts the connection's own busy timeout back.
    async fn begin_transaction(
        &self,
        lock_timeout: std::time::Duration,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Sqlite>, LockWait), StoreError> {
        let ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        let mut tx = self.pool.begin().await.store()?;
        let previous: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *tx)
            .await
            .store()?;
        sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA busy_timeout = {ms}")))
            .execute(&mut *tx)
            .await
            .store()?;
        Ok((tx, previous))
    }

    /// Puts back the busy timeout the connection had before the transaction began.
    async fn end_lock_wait(
        &self,
        tx: &mut sqlx::SqliteConnection,
        previous: LockWait,
    ) -> Result<(), StoreError> {
        sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA busy_timeout = {previous}")))
            .execute(tx)
            .await
            .store()
            .map(drop)
    }
}

/// SQLite has one writer at a time: a claim never meets a concurrent write to serialize with.
fn is_serialization_failure(_: &sqlx::Error) -> bool {
    false
}

/// SQLITE_BUSY and its extended codes (the low byte is 5): the write lock was not free
/// within the busy timeout.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = e else {
        return false;
    };
    e.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 5)
}
