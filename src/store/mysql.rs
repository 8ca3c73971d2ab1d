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
//! `renewed_at`, note whether it reclaimed, set `state` last) only if the token is now ours.
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
//!     PRIMARY KEY (namespace, `key`),
//!     KEY `idempotency_keys_claimed_idx` (state, claimed_at),
//!     KEY `idempotency_keys_completed_idx` (state, completed_at),
//!     CONSTRAINT `idempotency_keys_state_check`
//!         CHECK (state IN ('processing', 'done', 'released'))
//! ) ENGINE = InnoDB
//! ```
//!
//! A table of the first release (without `runs`) is upgraded with one `ALTER TABLE` that needs
//! no copy of the table: the new columns added, and the server-named check on `state` (found
//! in `information_schema.CHECK_CONSTRAINTS`), which refuses `released`, dropped. Adding the
//! new check would copy the table with writes blocked, so an upgraded table goes without it;
//! checks of your own stay. Rows are kept.
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
//! - `claim`: one on MariaDB 10.5+; on MySQL (and older MariaDB) one for a new key, two
//!   otherwise (a duplicate of a done key included).
//! - `renew`, `commit`, `release`: `UPDATE … WHERE namespace = ? AND `key` = ? AND token = ?
//!   AND <state>`, one each. sqlx connects with `CLIENT_FOUND_ROWS`, so the server reports
//!   matched rows and a repeated commit with the same lease answers `Ok`.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
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

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySqlPool, Row};
use tokio::sync::OnceCell;

use super::sql::{
    self, ClaimRow, Queries, ResultExt, TableName, VersionQueries, sql_store, version_store,
};
use super::{Claim, ConfigError, KeyState, Lease, LeaseToken, Stale, StalePolicy, StoreError};
use crate::key::IdempotencyKey;
use crate::store::{Advance, AdvanceVersion, VersionClaim, VersionLease};

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
    pool: MySqlPool,
    sql: Arc<Queries>,
    claims: Arc<ClaimQueries>,
    flavor: Arc<OnceCell<MySqlFlavor>>,
}

/// The claim statements only this backend needs.
struct ClaimQueries {
    /// MariaDB: the upsert with `RETURNING`.
    returning: Arc<str>,

    /// MySQL: the read after an upsert that updated.
    read: Arc<str>,
    /// Transactional mode: the marker takes over a released row.
    tx_take: Arc<str>,

    /// MariaDB: `begin_version`'s upsert with `RETURNING`.
    version_returning: Arc<str>,
    /// MySQL: the read of the versions row after `begin_version`'s upsert updated it.
    version_read: Arc<str>,
    /// MariaDB: `advance`'s upsert with `RETURNING`.
    advance_returning: Arc<str>,
    /// MySQL: the locking read of the versions row after `advance`'s upsert updated it.
    advance_read: Arc<str>,
}

/// The server's clock.
const NOW: &str = "UTC_TIMESTAMP(6)";
/// The age of the row's claim, in microseconds, by the server's clock.
const AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, claimed_at, UTC_TIMESTAMP(6))";
/// How long ago the row's claim was last renewed (or taken).
const IDLE_US: &str =
    "TIMESTAMPDIFF(MICROSECOND, COALESCE(renewed_at, claimed_at), UTC_TIMESTAMP(6))";

/// The columns added since the first release, as the upgrade adds them.
const NEW_COLUMNS: &str = "runs          BIGINT       NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN      NOT NULL DEFAULT FALSE,
    first_seen_at DATETIME(6)  NULL,
    last_seen_at  DATETIME(6)  NULL,
    renewed_at    DATETIME(6)  NULL,";

fn queries(table: TableName) -> (Queries, ClaimQueries) {
    let t = table.quoted('`');
    let check = table.state_check('`');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace     VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state         VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token         BIGINT       NOT NULL,
    deliveries    BIGINT       NOT NULL,
    {NEW_COLUMNS}
    claimed_at    DATETIME(6)  NOT NULL,
    completed_at  DATETIME(6)  NULL,
    PRIMARY KEY (namespace, `key`),
    KEY {claimed} (state, claimed_at),
    KEY {completed} (state, completed_at),
    CONSTRAINT {check} CHECK (state IN ('processing', 'done', 'released'))
) ENGINE = InnoDB"#,
        claimed = table.claimed_index('`'),
        completed = table.completed_index('`'),
    );
    // Parameters: namespace, key, our token, whether the policy reclaims, the stale limit in
    // microseconds, then our token seven times. The assignments run left to right: `token` is
    // decided on the row as it was (released, or processing and not renewed for the limit
    // under reclaim); every later assignment follows only if the token is ours now, and
    // `state` comes last, so `reclaimed` still sees the old state.
    let ours = |column: &str, value: &str| format!("{column} = IF(token = ?, {value}, {column})");
    let claim = format!(
        r#"INSERT INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?, ?, 'processing', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = {NOW},
    token = IF(state = 'released' OR (state = 'processing' AND ? AND {IDLE_US} >= ?), ?, token),
    {reclaimed},
    {runs},
    {claimed_at},
    {renewed_at},
    {completed_at},
    {state}"#,
        reclaimed = ours("reclaimed", "state = 'processing'"),
        runs = ours("runs", "runs + 1"),
        claimed_at = ours("claimed_at", NOW),
        renewed_at = ours("renewed_at", NOW),
        completed_at = ours("completed_at", "NULL"),
        state = ours("state", "'processing'"),
    );
    let fenced = "namespace = ? AND `key` = ? AND token = ?";
    let renew =
        format!("UPDATE {t} SET renewed_at = {NOW} WHERE {fenced} AND state = 'processing'");
    let commit = format!(
        r#"UPDATE {t}
SET completed_at = IF(state = 'done', completed_at, {NOW}), state = 'done'
WHERE {fenced} AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET completed_at = IF(state = 'released', completed_at, {NOW}), \
         state = 'released' WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let age_of = |at: &str| format!("TIMESTAMPDIFF(MICROSECOND, {at}, {NOW})");
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {AGE_US}, {IDLE_US}, {settled}
FROM {t} WHERE namespace = ? AND `key` = ?"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, `key`, deliveries, {AGE_US} AS age_us, {IDLE_US} AS idle_us FROM {t}
WHERE state = 'processing'
    AND COALESCE(renewed_at, claimed_at) <= {NOW} - INTERVAL ? MICROSECOND
ORDER BY COALESCE(renewed_at, claimed_at), namespace, `key`"#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET token = ?, state = 'done', completed_at = {NOW}
WHERE namespace = ? AND `key` = ? AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = {NOW}
WHERE namespace = ? AND `key` = ? AND state = 'processing'"#
    );
    let purge = format!(
        r#"DELETE FROM {t}
WHERE state IN ('done', 'released') AND completed_at <= {NOW} - INTERVAL ? MICROSECOND"#
    );
    let columns =
        format!("state, token, deliveries, reclaimed, {AGE_US} AS age_us, {IDLE_US} AS idle_us");
    let claim_returning = format!("{claim}\nRETURNING {columns}");
    let claim_read = format!("SELECT {columns} FROM {t} WHERE namespace = ? AND `key` = ?");
    // INSERT IGNORE rather than ON DUPLICATE KEY UPDATE: duplicates waiting on an open
    // transaction then share a lock and never need an exclusive one on the same row, which
    // InnoDB would resolve by failing all but one of them as deadlocked.
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    let tx_claim = format!(
        r#"INSERT IGNORE INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES (?, ?, 'done', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})"#
    );
    // A released row is free for the marker too: taken over inside the transaction.
    let tx_take = format!(
        r#"UPDATE {t} SET token = ?, state = 'done', runs = runs + 1, reclaimed = FALSE,
    deliveries = deliveries + 1,
    last_seen_at = {NOW}, claimed_at = {NOW}, completed_at = {NOW}
WHERE namespace = ? AND `key` = ? AND state = 'released'"#
    );
    let (versions, version_returning, version_read, advance_returning, advance_read) =
        version_queries(&table);
    let queries = Queries {
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
    };
    let claims = ClaimQueries {
        returning: claim_returning.into(),
        read: claim_read.into(),
        tx_take: tx_take.into(),
        version_returning,
        version_read,
        advance_returning,
        advance_read,
    };
    (queries, claims)
}

/// The `ALTER TABLE` that turns a table of the first release into the current one: the new
/// columns added, and the check on `state` (whose name the server chose, `checks`), which
/// refuses `released`, dropped. Both are done without copying the table; adding a new check
/// would copy it, with writes blocked, so an upgraded table goes without one.
fn upgrade(table: &TableName, checks: &[String], mariadb: bool) -> String {
    let t = table.quoted('`');
    let mut alter: Vec<String> = NEW_COLUMNS
        .lines()
        .map(|line| format!("ADD COLUMN {}", line.trim().trim_end_matches(',')))
        .collect();
    // MySQL 8.0.16 to 8.0.18 know only `DROP CHECK`.
    let drop = if mariadb {
        "DROP CONSTRAINT"
    } else {
        "DROP CHECK"
    };
    for check in checks {
        alter.push(format!("{drop} `{}`", check.replace('`', "``")));
    }
    format!("ALTER TABLE {t} {}", alter.join(", "))
}

/// The age of the row's pending version, in microseconds, by the server's clock.
const PENDING_AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, pending_since, UTC_TIMESTAMP(6))";

/// The statements on the versions table of the [version guard](crate::version_guard), and the ones
/// only this backend needs.
fn version_queries(table: &TableName) -> (VersionQueries, Arc<str>, Arc<str>, Arc<str>, Arc<str>) {
    let v = table.versions().quoted('`');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    entity          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    applied_version BIGINT       NULL,
    applied_token   BIGINT       NULL,
    pending_version BIGINT       NULL,
    pending_token   BIGINT       NULL,
    pending_since   DATETIME(6)  NULL,
    deliveries      BIGINT       NOT NULL,
    last_seen_at    DATETIME(6)  NOT NULL,
    PRIMARY KEY (namespace, entity)
) ENGINE = InnoDB"#
    );
    // Parameters: namespace, entity, version, our token, version, whether the policy reclaims,
    // the stale limit in microseconds, version, our token, our token, version, our token. The
    // assignments run left to right: the token is decided on the row as it was, then the
    // version and the time follow it only if it is ours. Only an older version is outdated: an
    // equal one takes the slot like a newer one. Counting the delivery makes every update
    // change the row, so an insert is told from an update by the affected rows.
    let begin = format!(
        r#"INSERT INTO {v} (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), 1, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = UTC_TIMESTAMP(6),
    pending_token = IF((applied_version IS NULL OR applied_version <= ?)
        AND (pending_token IS NULL OR (? AND {PENDING_AGE_US} >= ? AND pending_version <= ?)),
        ?, pending_token),
    pending_version = IF(pending_token <=> ?, ?, pending_version),
    pending_since = IF(pending_token <=> ?, UTC_TIMESTAMP(6), pending_since)"#
    );
    let columns =
        format!("applied_version, pending_version, pending_token, {PENDING_AGE_US} AS age_us");
    let begin_returning = format!("{begin}\nRETURNING {columns}");
    let begin_read = format!("SELECT {columns} FROM {v} WHERE namespace = ? AND entity = ?");
    // Left to right: the applied version is read before the pending one is cleared.
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let newest = "GREATEST(COALESCE(applied_version, pending_version), pending_version)";
    let commit = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ? AND entity = ? AND pending_token = ?"#
    );
    let release =
        format!("UPDATE {v} SET {clear} WHERE namespace = ? AND entity = ? AND pending_token = ?");
    let renew = format!(
        "UPDATE {v} SET pending_since = UTC_TIMESTAMP(6) \
         WHERE namespace = ? AND entity = ? AND pending_token = ?"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = ? AND entity = ?");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ? AND entity = ? AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ? AND entity = ? AND pending_token IS NOT NULL"
    );
    // Parameters: namespace, entity, version, our token, version, our token, our token,
    // version. Unless the row is at a newer version, the version is moved (an equal one to
    // itself: it advances, as the version guard runs it) and the row stamped with a fresh token.
    // The stamp, not a comparison of versions, says whether this statement advanced the row:
    // ours exactly when it is our token, outdated otherwise (an older stamp, or none).
    let advance = format!(
        r#"INSERT INTO {v} (namespace, entity, applied_version, applied_token, deliveries, last_seen_at)
VALUES (?, ?, ?, ?, 1, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = UTC_TIMESTAMP(6),
    applied_token = IF(applied_version IS NULL OR applied_version <= ?, ?, applied_token),
    applied_version = IF(applied_token <=> ?, ?, applied_version)"#
    );
    let advance_returning = format!("{advance}\nRETURNING applied_version, applied_token");
    let advance_read = format!(
        "SELECT applied_version, applied_token FROM {v} WHERE namespace = ? AND entity = ? FOR UPDATE"
    );
    let queries = VersionQueries {
        migrate: migrate.into(),
        renew: renew.into(),
        begin: begin.into(),
        commit: commit.into(),
        release: release.into(),
        applied: applied.into(),
        resolve_done: resolve_done.into(),
        resolve_release: resolve_release.into(),
        advance: advance.into(),
    };
    (
        queries,
        begin_returning.into(),
        begin_read.into(),
        advance_returning.into(),
        advance_read.into(),
    )
}

impl MySqlStore {
    /// A store on `pool`, in the table `idempotency_keys`. It finds out on first use whether
    /// the server is MariaDB or MySQL.
    pub fn new(pool: MySqlPool) -> Self {
        let (sql, claims) = queries(TableName::default_table());
        Self {
            pool,
            sql: Arc::new(sql),
            claims: Arc::new(claims),
            flavor: Arc::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes.
    pub fn with_table_name(mut self, name: &str) -> Result<Self, ConfigError> {
        let (sql, claims) = queries(TableName::parse(name, false)?);
        self.sql = Arc::new(sql);
        self.claims = Arc::new(claims);
        Ok(self)
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
                    .fetch_one(&self.pool)
                    .await
                    .store()?;
                Ok(flavor_of(&version))
            })
            .await
            .copied()
    }

    /// The table's name.
    pub fn table_name(&self) -> String {
        self.sql.table.name()
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Creates the table with its indexes if it does not exist (one `CREATE TABLE`), and
    /// upgrades a table made by an earlier release (one `ALTER TABLE`, its rows kept). Safe
    /// to call at every start-up, from several instances at once: a named lock (`GET_LOCK`)
    /// lets one of them at a time in.
    ///
    /// Fails, changing nothing, when the server's SQL mode (its default, or this connection's)
    /// includes MariaDB's `SIMULTANEOUS_ASSIGNMENT`, under which claims are not safe (see the
    /// [module docs](crate::store::mysql#assignment-order)).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One connection holds a named lock throughout, so that instances starting together
        // do not both upgrade the table.
        let mut conn = self.pool.acquire().await.store()?;
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
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&mut *conn)
            .await
            .store()?;
        let table = &self.sql.table;
        let current: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'runs'",
        )
        .bind(table.bare())
        .fetch_one(&mut *conn)
        .await
        .store()?;
        if current == 0 {
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
            sqlx::raw_sql(AssertSqlSafe(upgrade(table, &checks, mariadb)))
                .execute(&mut *conn)
                .await
                .store()?;
        }
        sqlx::raw_sql(AssertSqlSafe(self.sql.versions.migrate.clone()))
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(())
    }

    fn upsert<'q>(
        &self,
        sql: &Arc<str>,
        key: &'q IdempotencyKey,
        token: LeaseToken,
        stale: Stale,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .bind(stale.policy() == StalePolicy::Reclaim)
            .bind(sql::micros(stale.after()));
        for _ in 0..7 {
            query = query.bind(token.to_i64());
        }
        query
    }

    async fn claim_key(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let token = LeaseToken::generate();
        if self.flavor().await? == MySqlFlavor::MariaDb {
            let row = self
                .upsert(&self.claims.returning, key, token, stale)
                .fetch_one(&self.pool)
                .await
                .store()?;
            return ClaimRow::read(&row)?.into_claim(key, token, stale);
        }
        // A row that vanishes between the two statements more than twice in a row means
        // something else is deleting keys as fast as they are claimed.
        for _ in 0..3 {
            let upserted = self
                .upsert(&self.sql.claim, key, token, stale)
                .execute(&self.pool)
                .await
                .store()?;
            if upserted.rows_affected() == 1 {
                // Inserted: a new key.
                return Ok(Claim::Acquired(Lease::new(key.clone(), token, false)));
            }
            // Updated an existing row: read what it is now. Only this claim knows `token`, so
            // a row holding it is ours; any other row is someone else's.
            let row = sqlx::query(AssertSqlSafe(self.claims.read.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .fetch_optional(&self.pool)
                .await
                .store()?;
            if let Some(row) = row {
                let row = ClaimRow::read(&row)?;
                let ours = LeaseToken::from_i64(row.token) == token;
                if ours || KeyState::parse(&row.state) != Some(KeyState::Released) {
                    return row.into_claim(key, token, stale);
                }
            }
            // Released (by the owner the upsert saw) or purged between the two statements:
            // claim again.
        }
        Err(StoreError::backend(
            "the claimed row vanished between the upsert and the read, three times",
        ))
    }
}

sql_store!(MySqlStore);
version_store!(MySqlStore);

impl MySqlStore {
    fn version_upsert<'q>(
        &self,
        sql: &Arc<str>,
        entity: &'q IdempotencyKey,
        version: i64,
        token: LeaseToken,
        stale: Stale,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let token = token.to_i64();
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(entity.namespace())
            .bind(entity.value())
            .bind(version)
            .bind(token)
            .bind(version)
            .bind(stale.policy() == StalePolicy::Reclaim)
            .bind(sql::micros(stale.after()))
            .bind(version)
            .bind(token)
            .bind(token)
            .bind(version)
            .bind(token)
    }

    async fn begin_entity_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let token = LeaseToken::generate();
        if self.flavor().await? == MySqlFlavor::MariaDb {
            let row = self
                .version_upsert(
                    &self.claims.version_returning,
                    entity,
                    version,
                    token,
                    stale,
                )
                .fetch_one(&self.pool)
                .await
                .store()?;
            return sql::version_claim(entity, version, token, stale, sql::version_row(&row)?)
                .ok_or_else(|| StoreError::backend("the versions row was left inconsistent"));
        }
        // The row may change between the two statements (a pending version committed or
        // released): when what it says no longer explains why ours was not taken, start over.
        for _ in 0..3 {
            let token = LeaseToken::generate();
            let upserted = self
                .version_upsert(&self.sql.versions.begin, entity, version, token, stale)
                .execute(&self.pool)
                .await
                .store()?;
            if upserted.rows_affected() == 1 {
                // Inserted: a new entity, and the version is ours.
                return Ok(VersionClaim::Acquired(VersionLease::new(
                    entity.clone(),
                    version,
                    token,
                )));
            }
            let row = sqlx::query(AssertSqlSafe(self.claims.version_read.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .fetch_one(&self.pool)
                .await
                .store()?;
            if let Some(claim) =
                sql::version_claim(entity, version, token, stale, sql::version_row(&row)?)
            {
                return Ok(claim);
            }
        }
        Err(StoreError::backend(
            "the versions row changed between the upsert and the read, three times",
        ))
    }

    /// The claim row of `key`, read on `conn`.
    async fn read_claim(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &IdempotencyKey,
    ) -> Result<ClaimRow, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.claims.read.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_one(conn)
            .await
            .store()?;
        ClaimRow::read(&row)
    }

    /// The flavor, asked on `conn` if not known yet: inside a transaction, the pool may have
    /// no other connection to spare.
    async fn flavor_on(&self, conn: &mut sqlx::MySqlConnection) -> Result<MySqlFlavor, StoreError> {
        self.flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&mut *conn)
                    .await
                    .store()?;
                Ok(flavor_of(&version))
            })
            .await
            .copied()
    }
}

impl AdvanceVersion for MySqlStore {
    /// `INSERT … ON DUPLICATE KEY UPDATE`, which takes the row's exclusive lock at once and
    /// stamps the row with a fresh token when it moves the version (a newer or an equal one).
    /// MariaDB returns the row
    /// (one round trip); MySQL reads it with `SELECT … FOR UPDATE` unless the row was new.
    async fn advance_version(
        &self,
        conn: &mut sqlx::MySqlConnection,
        entity: &IdempotencyKey,
        version: i64,
    ) -> Result<Advance, StoreError> {
        let token = LeaseToken::generate().to_i64();
        let flavor = self.flavor_on(conn).await?;
        let upsert = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .bind(version)
                .bind(token)
                .bind(version)
                .bind(token)
                .bind(token)
                .bind(version)
        };
        let row = if flavor == MySqlFlavor::MariaDb {
            upsert(&self.claims.advance_returning)
                .fetch_one(&mut *conn)
                .await
                .store()?
        } else {
            let upserted = upsert(&self.sql.versions.advance)
                .execute(&mut *conn)
                .await
                .store()?;
            if upserted.rows_affected() == 1 {
                return Ok(Advance::Applied);
            }
            sqlx::query(AssertSqlSafe(self.claims.advance_read.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .fetch_one(&mut *conn)
                .await
                .store()?
        };
        let applied: Option<i64> = row.try_get(0).store()?;
        let stamp: Option<i64> = row.try_get(1).store()?;
        match applied {
            _ if stamp == Some(token) => Ok(Advance::Applied),
            Some(applied) => Ok(Advance::Outdated { applied }),
            None => Err(StoreError::backend(
                "the versions row kept no applied version yet refused this one",
            )),
        }
    }
}

impl crate::store::TransactionalStore for MySqlStore {
    type Database = sqlx::MySql;

    async fn holds_marker(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.tx_check.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .fetch_optional(conn)
            .await
            .store()?;
        Ok(found.is_some())
    }

    /// `BEGIN`, then `INSERT IGNORE` of the marker, followed, when the key existed, by a read
    /// of the row (deliveries of an existing key are not counted in this mode), and an
    /// `UPDATE` taking it over if it was released.
    ///
    /// The lock timeout (whole seconds, at least 1) bounds those statements only, and the
    /// pooled connection keeps its own `innodb_lock_wait_timeout`: on MariaDB each of them
    /// runs as `SET STATEMENT innodb_lock_wait_timeout = <s> FOR …`; on MySQL (and MariaDB
    /// before 10.5) the session's value is saved in a user variable and replaced in the
    /// `BEGIN` round trip, and put back in one more round trip right after the marker. The
    /// handler's own statements run with the connection's setting.
    ///
    /// When a first delivery rolls back, InnoDB may fail one of the waiting duplicates as
    /// deadlocked: it begins again, up to three times.
    async fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: std::time::Duration,
    ) -> Result<crate::store::Begin<sqlx::MySql>, StoreError> {
        let seconds = lock_timeout
            .as_secs_f64()
            .ceil()
            .clamp(1.0, 1_073_741_824.0) as u64;
        let scoped = self.flavor().await? == MySqlFlavor::MariaDb;
        let marker = if scoped {
            let within = |sql: &str| -> Arc<str> {
                format!("SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR {sql}").into()
            };
            MarkerQueries {
                begin: "BEGIN".into(),
                insert: within(&self.sql.tx_claim),
                take: within(&self.claims.tx_take),
            }
        } else {
            MarkerQueries {
                begin: format!(
                    "SET {SAVED_LOCK_WAIT} = @@SESSION.innodb_lock_wait_timeout; \
                     SET SESSION innodb_lock_wait_timeout = {seconds}; BEGIN"
                )
                .into(),
                insert: self.sql.tx_claim.clone(),
                take: self.claims.tx_take.clone(),
            }
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut tx = self
                .pool
                .begin_with(AssertSqlSafe(marker.begin.clone()))
                .await
                .store()?;
            let token = LeaseToken::generate();
            let marked = self.insert_marker(&mut tx, &marker, key, token).await;
            if !scoped {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET SESSION innodb_lock_wait_timeout = {SAVED_LOCK_WAIT}; \
                     SET {SAVED_LOCK_WAIT} = NULL"
                )))
                .execute(&mut *tx)
                .await
                .store()?;
            }
            let claim = match marked? {
                Marked::Claimed => return Ok(crate::store::Begin::Claimed(tx, token)),
                Marked::LockTimedOut => {
                    return Ok(crate::store::Begin::lock_timed_out(lock_timeout));
                }
                Marked::Deadlocked(_) if attempt < 3 => continue,
                Marked::Deadlocked(e) => return Err(StoreError::backend(e)),
                Marked::Found(row) => row.into_claim(key, token, sql::NEVER_STALE)?,
            };
            return crate::store::begun(claim, tx).await;
        }
    }
}

/// The user variable that keeps the session's `innodb_lock_wait_timeout` while a delivery's
/// marker is inserted with the lock timeout instead (MySQL, and MariaDB before 10.5).
const SAVED_LOCK_WAIT: &str = "@tower_idempotency_lock_wait";

/// The statements of one transactional delivery's marker, with its lock timeout.
struct MarkerQueries {
    begin: Arc<str>,
    insert: Arc<str>,
    take: Arc<str>,
}

/// What inserting a transactional marker found.
enum Marked {
    /// The marker is in the transaction, with this delivery's token.
    Claimed,
    /// The key's row, someone else's.
    Found(ClaimRow),
    /// The first delivery's transaction held the row past the lock timeout.
    LockTimedOut,
    /// InnoDB chose this transaction as a deadlock's victim and rolled it back.
    Deadlocked(sqlx::Error),
}

impl MySqlStore {
    /// Inserts the marker of `key` in `tx`, or takes over the key's released row.
    async fn insert_marker(
        &self,
        tx: &mut sqlx::MySqlConnection,
        marker: &MarkerQueries,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<Marked, StoreError> {
        let inserted = sqlx::query(AssertSqlSafe(marker.insert.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .execute(&mut *tx)
            .await;
        match inserted {
            Ok(done) if done.rows_affected() == 1 => return Ok(Marked::Claimed),
            Ok(_) => {}
            Err(e) => return marker_failed(e),
        }
        let row = self.read_claim(tx, key).await?;
        if KeyState::parse(&row.state) != Some(KeyState::Released) {
            return Ok(Marked::Found(row));
        }
        // A released row is free for the marker: taken over in this transaction, unless
        // another delivery was faster.
        let taken = sqlx::query(AssertSqlSafe(marker.take.clone()))
            .bind(token.to_i64())
            .bind(key.namespace())
            .bind(key.value())
            .execute(&mut *tx)
            .await;
        match taken {
            Ok(done) if done.rows_affected() == 1 => Ok(Marked::Claimed),
            Ok(_) => Ok(Marked::Found(self.read_claim(tx, key).await?)),
            Err(e) => marker_failed(e),
        }
    }
}

/// A marker statement's error: a lock wait past the lock timeout or a deadlock are answers,
/// any other error is the store's failure.
fn marker_failed(e: sqlx::Error) -> Result<Marked, StoreError> {
    match &e {
        sqlx::Error::Database(db) if mysql_error(&**db) == Some(LOCK_WAIT_TIMEOUT) => {
            Ok(Marked::LockTimedOut)
        }
        sqlx::Error::Database(db) if mysql_error(&**db) == Some(DEADLOCK) => {
            Ok(Marked::Deadlocked(e))
        }
        _ => Err(StoreError::backend(e)),
    }
}

/// Whether the server answering `SELECT VERSION()` with `version` is MariaDB (`10.11.6-MariaDB`,
/// `11.4.2-MariaDB-log`, `5.5.5-10.4.12-MariaDB-1:10.4.12+maria~bionic`) rather than MySQL.
fn is_mariadb(version: &str) -> bool {
    version.to_ascii_lowercase().contains("mariadb")
}

/// The release of a MariaDB server, `(major, minor)`, from its `SELECT VERSION()`; MariaDB 10
/// may carry the `5.5.5-` prefix it shows older clients.
fn mariadb_release(version: &str) -> Option<(u32, u32)> {
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut numbers = version.split(|c: char| !c.is_ascii_digit());
    let major = numbers.next()?.parse().ok()?;
    let minor = numbers.next()?.parse().ok()?;
    Some((major, minor))
}

/// How claims are made on the server answering `SELECT VERSION()` with `version`: with
/// `RETURNING` on MariaDB 10.5 and later, with two statements on MySQL and on older MariaDB
/// (whose `INSERT` has no `RETURNING`), and on a MariaDB whose release cannot be read.
fn flavor_of(version: &str) -> MySqlFlavor {
    match mariadb_release(version) {
        Some(release) if is_mariadb(version) && release >= (10, 5) => MySqlFlavor::MariaDb,
        _ => MySqlFlavor::MySql,
    }
}

/// Refuses a server whose SQL mode, for this connection (`session`) or for new ones
/// (`global`), has MariaDB's `SIMULTANEOUS_ASSIGNMENT`: the claims rely on the assignments of
/// `ON DUPLICATE KEY UPDATE` running left to right, each seeing the ones before it, and under
/// that mode a claim would hand out leases without starting a run (a handler could run twice).
fn check_sql_mode(session: &str, global: &str) -> Result<(), StoreError> {
    let simultaneous = |mode: &str| {
        mode.split(',')
            .any(|m| m.trim().eq_ignore_ascii_case("SIMULTANEOUS_ASSIGNMENT"))
    };
    let (on_session, on_global) = (simultaneous(session), simultaneous(global));
    if !on_session && !on_global {
        return Ok(());
    }
    let scope = match (on_session, on_global) {
        (true, true) => "the server's default (@@GLOBAL.sql_mode) and this connection's",
        (false, true) => "the server's default (@@GLOBAL.sql_mode)",
        _ => "this connection's (@@SESSION.sql_mode)",
    };
    let fix = if on_global {
        "remove it from sql_mode in the server's configuration and with \
         SET GLOBAL sql_mode = REPLACE(@@GLOBAL.sql_mode, 'SIMULTANEOUS_ASSIGNMENT', '')"
    } else {
        "remove it from what sets the session's sql_mode (the pool's after_connect, or the \
         connection options)"
    };
    Err(StoreError::backend(format!(
        "the SQL mode {scope} includes SIMULTANEOUS_ASSIGNMENT, under which the store's claims \
         are not safe (they rely on ON DUPLICATE KEY UPDATE assigning left to right): {fix}"
    )))
}

/// ER_LOCK_WAIT_TIMEOUT.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// ER_LOCK_DEADLOCK.
const DEADLOCK: u16 = 1213;

fn mysql_error(e: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flavor_follows_the_server_and_its_release() {
        for (version, flavor) in [
            // MariaDB 10.5 and later: INSERT … RETURNING.
            ("10.11.19-MariaDB-0+deb12u1", MySqlFlavor::MariaDb),
            ("10.5.0-MariaDB", MySqlFlavor::MariaDb),
            ("10.6.12-MariaDB-log", MySqlFlavor::MariaDb),
            ("11.4.2-MariaDB-ubu2404", MySqlFlavor::MariaDb),
            ("12.0.1-MariaDB", MySqlFlavor::MariaDb),
            (
                "5.5.5-10.5.8-MariaDB-1:10.5.8+maria~focal",
                MySqlFlavor::MariaDb,
            ),
            // Older MariaDB has no RETURNING: two statements, as on MySQL.
            ("10.4.32-MariaDB", MySqlFlavor::MySql),
            ("10.3.39-MariaDB-0ubuntu0.20.04.2", MySqlFlavor::MySql),
            (
                "5.5.5-10.4.12-MariaDB-1:10.4.12+maria~bionic",
                MySqlFlavor::MySql,
            ),
            ("10.1.48-MariaDB", MySqlFlavor::MySql),
            ("5.5.68-MariaDB", MySqlFlavor::MySql),
            // A MariaDB whose release cannot be read: the path every server runs.
            ("MariaDB", MySqlFlavor::MySql),
            ("x.y-MariaDB", MySqlFlavor::MySql),
            // MySQL, whatever its release.
            ("8.0.36", MySqlFlavor::MySql),
            ("8.0.36-0ubuntu0.22.04.1", MySqlFlavor::MySql),
            ("8.4.0-commercial", MySqlFlavor::MySql),
            ("11.0.0", MySqlFlavor::MySql),
            ("", MySqlFlavor::MySql),
        ] {
            assert_eq!(flavor_of(version), flavor, "{version}");
        }
        assert!(is_mariadb("10.4.32-MariaDB") && is_mariadb("10.6.1-mariadb"));
        assert!(!is_mariadb("8.0.36"));
        assert_eq!(mariadb_release("10.11.19-MariaDB"), Some((10, 11)));
        assert_eq!(mariadb_release("5.5.5-10.4.12-MariaDB"), Some((10, 4)));
        assert_eq!(mariadb_release("11-MariaDB"), None);
    }

    #[test]
    fn simultaneous_assignment_is_refused() {
        let default = "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION";
        assert!(check_sql_mode(default, default).is_ok());
        assert!(check_sql_mode("", "").is_ok());
        let with = format!("{default},SIMULTANEOUS_ASSIGNMENT");
        for (session, global, says) in [
            (with.as_str(), default, "@@SESSION.sql_mode"),
            (default, with.as_str(), "SET GLOBAL sql_mode"),
            (with.as_str(), with.as_str(), "SET GLOBAL sql_mode"),
            ("simultaneous_assignment", "", "@@SESSION.sql_mode"),
        ] {
            let err = check_sql_mode(session, global).unwrap_err();
            let message = std::error::Error::source(&err).unwrap().to_string();
            assert!(message.contains("SIMULTANEOUS_ASSIGNMENT"), "{message}");
            assert!(message.contains(says), "{message}");
        }
    }
}
