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
//! replace the token only if the existing claim is `processing`, stale and the policy reclaims,
//! and restart `claimed_at` only if the token is now ours.
//!
//! - **MariaDB** (10.5 and later) accepts `RETURNING` on that statement and returns the row as
//!   the update left it: the claim is **one round trip**, as on Postgres.
//! - **MySQL** has no `RETURNING`. The upsert's affected-row count tells an insert (1: this
//!   delivery acquired a new key, **one round trip**) from an update (2); after an update a
//!   `SELECT` of the row (**a second round trip**) says whether the token is ours (reclaimed),
//!   or what the key is (`done`, or `processing` and how old). If the row vanished in between
//!   (released or purged), the claim starts over.
//!
//! The store asks the server once, with `SELECT VERSION()`, which one it is (a version
//! containing `MariaDB`), or takes your word for it: [`MySqlStore::with_flavor`].
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
//! [`MySqlStore::with_table_name`]). MySQL commits DDL implicitly, so it cannot share a
//! transaction; the indexes are part of the one atomic `CREATE TABLE`. Keys are compared
//! byte for byte (`utf8mb4_bin`): event ids are case-sensitive.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_keys` (
//!     namespace    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     `key`        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     state        VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
//!     token        BIGINT       NOT NULL,
//!     deliveries   BIGINT       NOT NULL,
//!     claimed_at   DATETIME(6)  NOT NULL,
//!     completed_at DATETIME(6)  NULL,
//!     PRIMARY KEY (namespace, `key`),
//!     KEY `idempotency_keys_claimed_idx` (state, claimed_at),
//!     KEY `idempotency_keys_completed_idx` (state, completed_at),
//!     CHECK (state IN ('processing', 'done'))
//! ) ENGINE = InnoDB
//! ```
//!
//! # Round trips
//!
//! - `claim`: one on MariaDB; on MySQL one for a new key, two otherwise (a duplicate of a
//!   done key included).
//! - `commit`: `UPDATE … WHERE namespace = ? AND `key` = ? AND token = ?`, one. sqlx connects
//!   with `CLIENT_FOUND_ROWS`, so the server reports matched rows and a repeated commit with
//!   the same lease answers `Ok`.
//! - `release`: `DELETE … WHERE … AND token = ? AND state = 'processing'`, one.
//! - `stuck_claims`, `resolve`, `purge_completed`: one statement each, using the indexes.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySqlPool, Row};
use tokio::sync::OnceCell;

use super::sql::{self, ClaimRow, Queries, ResultExt, TableName, sql_store};
use super::{Claim, ConfigError, Lease, LeaseToken, Stale, StalePolicy, StoreError};
use crate::key::IdempotencyKey;

/// Which server a [`MySqlStore`] talks to; it decides how a claim is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub enum MySqlFlavor {
    /// MariaDB 10.5 or later: the claim is one `INSERT … ON DUPLICATE KEY UPDATE …
    /// RETURNING`.
    MariaDb,
    /// MySQL (or a MariaDB older than 10.5): the claim is an upsert, then a `SELECT` unless the
    /// upsert inserted.
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
}

/// The age of the row's claim, in microseconds, by the server's clock.
const AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, claimed_at, UTC_TIMESTAMP(6))";

fn queries(table: TableName) -> (Queries, ClaimQueries) {
    let t = table.quoted('`');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state        VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token        BIGINT       NOT NULL,
    deliveries   BIGINT       NOT NULL,
    claimed_at   DATETIME(6)  NOT NULL,
    completed_at DATETIME(6)  NULL,
    PRIMARY KEY (namespace, `key`),
    KEY {claimed} (state, claimed_at),
    KEY {completed} (state, completed_at),
    CHECK (state IN ('processing', 'done'))
) ENGINE = InnoDB"#,
        claimed = table.claimed_index('`'),
        completed = table.completed_index('`'),
    );
    // Parameters: namespace, key, our token, whether the policy reclaims, the stale limit in
    // microseconds, our token, our token. The assignments run left to right: `token` is
    // decided on the old `claimed_at`, then `claimed_at` restarts only if the token is ours.
    let claim = format!(
        r#"INSERT INTO {t} (namespace, `key`, state, token, deliveries, claimed_at)
VALUES (?, ?, 'processing', ?, 1, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    token = IF(state = 'processing' AND ? AND {AGE_US} >= ?, ?, token),
    claimed_at = IF(token = ?, UTC_TIMESTAMP(6), claimed_at)"#
    );
    let commit = format!(
        r#"UPDATE {t}
SET completed_at = IF(state = 'done', completed_at, UTC_TIMESTAMP(6)), state = 'done'
WHERE namespace = ? AND `key` = ? AND token = ?"#
    );
    let release = format!(
        r#"DELETE FROM {t}
WHERE namespace = ? AND `key` = ? AND token = ? AND state = 'processing'"#
    );
    let stuck = format!(
        r#"SELECT namespace, `key`, deliveries, {AGE_US} AS age_us FROM {t}
WHERE state = 'processing' AND claimed_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY claimed_at, namespace, `key`"#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET token = ?, state = 'done', completed_at = UTC_TIMESTAMP(6)
WHERE namespace = ? AND `key` = ? AND state = 'processing'"#
    );
    let resolve_release =
        format!(r#"DELETE FROM {t} WHERE namespace = ? AND `key` = ? AND state = 'processing'"#);
    let purge = format!(
        r#"DELETE FROM {t}
WHERE state = 'done' AND completed_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"#
    );
    let claim_returning =
        format!("{claim}\nRETURNING state, token, deliveries, {AGE_US} AS age_us");
    let claim_read = format!(
        r#"SELECT state, token, deliveries, {AGE_US} AS age_us FROM {t}
WHERE namespace = ? AND `key` = ?"#
    );
    // INSERT IGNORE rather than ON DUPLICATE KEY UPDATE: duplicates waiting on an open
    // transaction then share a lock and never need an exclusive one on the same row, which
    // InnoDB would resolve by failing all but one of them as deadlocked.
    let tx_claim = format!(
        r#"INSERT IGNORE INTO {t} (namespace, `key`, state, token, deliveries, claimed_at, completed_at)
VALUES (?, ?, 'done', ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"#
    );
    let queries = Queries {
        table,
        tx_claim: tx_claim.into(),
        migrate: migrate.into(),
        claim: claim.into(),
        commit: commit.into(),
        release: release.into(),
        stuck: stuck.into(),
        resolve_done: resolve_done.into(),
        resolve_release: resolve_release.into(),
        purge: purge.into(),
    };
    let claims = ClaimQueries {
        returning: claim_returning.into(),
        read: claim_read.into(),
    };
    (queries, claims)
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
    /// [`MySqlFlavor::MariaDb`] on MySQL fails every claim with a syntax error.
    pub fn with_flavor(mut self, flavor: MySqlFlavor) -> Self {
        self.flavor = Arc::new(OnceCell::new_with(Some(flavor)));
        self
    }

    /// Which server the store talks to: as set by [`with_flavor`](Self::with_flavor), or
    /// asked once with `SELECT VERSION()` and remembered.
    pub async fn flavor(&self) -> Result<MySqlFlavor, StoreError> {
        self.flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&self.pool)
                    .await
                    .store()?;
                Ok(if version.contains("MariaDB") {
                    MySqlFlavor::MariaDb
                } else {
                    MySqlFlavor::MySql
                })
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

    /// Creates the table with its indexes if it does not exist: one `CREATE TABLE`. Safe to
    /// call at every start-up, from several instances at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&self.pool)
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
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .bind(stale.policy() == StalePolicy::Reclaim)
            .bind(sql::micros(stale.after()))
            .bind(token.to_i64())
            .bind(token.to_i64())
    }

    async fn claim_key(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let token = LeaseToken::generate();
        if self.flavor().await? == MySqlFlavor::MariaDb {
            let row = self
                .upsert(&self.claims.returning, key, token, stale)
                .fetch_one(&self.pool)
                .await
                .store()?;
            return claim_row(&row)?.into_claim(key, token, stale, None);
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
                return claim_row(&row)?.into_claim(key, token, stale, Some(true));
            }
            // Released or purged between the two statements: claim again.
        }
        Err(StoreError::backend(
            "the claimed row vanished between the upsert and the read, three times",
        ))
    }
}

fn claim_row(row: &sqlx::mysql::MySqlRow) -> Result<ClaimRow, StoreError> {
    Ok(ClaimRow {
        state: row.try_get(0).store()?,
        token: row.try_get(1).store()?,
        deliveries: row.try_get(2).store()?,
        age_us: row.try_get(3).store()?,
    })
}

sql_store!(MySqlStore);

impl crate::transactional::TransactionalStore for MySqlStore {
    type Database = sqlx::MySql;

    /// `SET SESSION innodb_lock_wait_timeout = <s>; BEGIN` (one round trip; whole seconds, at
    /// least 1), then `INSERT IGNORE` of the marker, followed, when the key existed, by a read
    /// of the row (deliveries of an existing key are not counted in this mode). The pooled
    /// connection keeps that lock wait timeout afterwards. When a first delivery rolls back,
    /// InnoDB may fail one of the waiting duplicates as deadlocked: it begins again, up to
    /// three times.
    async fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: std::time::Duration,
    ) -> Result<crate::transactional::Begin<sqlx::MySql>, StoreError> {
        let seconds = lock_timeout
            .as_secs_f64()
            .ceil()
            .clamp(1.0, 1_073_741_824.0) as u64;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let begin = format!("SET SESSION innodb_lock_wait_timeout = {seconds}; BEGIN");
            let mut tx = self.pool.begin_with(AssertSqlSafe(begin)).await.store()?;
            let token = LeaseToken::generate();
            let inserted = sqlx::query(AssertSqlSafe(self.sql.tx_claim.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .bind(token.to_i64())
                .execute(&mut *tx)
                .await;
            let claim = match inserted {
                Ok(done) if done.rows_affected() == 1 => {
                    return Ok(crate::transactional::Begin::Claimed(tx));
                }
                Ok(_) => {
                    let row = sqlx::query(AssertSqlSafe(self.claims.read.clone()))
                        .bind(key.namespace())
                        .bind(key.value())
                        .fetch_one(&mut *tx)
                        .await
                        .store()?;
                    claim_row(&row)?.into_claim(key, token, sql::NEVER_STALE, Some(false))?
                }
                Err(sqlx::Error::Database(e)) if mysql_error(&*e) == Some(LOCK_WAIT_TIMEOUT) => {
                    return Ok(crate::transactional::Begin::lock_timed_out(lock_timeout));
                }
                Err(sqlx::Error::Database(e))
                    if mysql_error(&*e) == Some(DEADLOCK) && attempt < 3 =>
                {
                    continue;
                }
                Err(e) => return Err(StoreError::backend(e)),
            };
            return crate::transactional::begun(claim, tx).await;
        }
    }
}

/// ER_LOCK_WAIT_TIMEOUT.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// ER_LOCK_DEADLOCK.
const DEADLOCK: u16 = 1213;

fn mysql_error(e: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}
