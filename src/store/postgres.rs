//! The PostgreSQL store.
//!
//! ```no_run
//! use sqlx::postgres::PgPoolOptions;
//! use tower_idempotency::{IdempotencyLayer, key, store::PostgresStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPoolOptions::new()
//!     .max_connections(16)
//!     .connect("postgres://app@db.internal/app")
//!     .await?;
//! let store = PostgresStore::new(pool);
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store).key(key::stripe());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Time
//!
//! Every timestamp and age is computed by the server with `now()`: the start of the current
//! transaction, which for the store's single-statement operations is the start of the
//! statement. It is one value throughout a statement, so the stale test, the timestamp written
//! and the age returned agree, and app instances with skewed clocks agree on staleness. (Not
//! `clock_timestamp()`, which changes while a statement runs.)
//!
//! # Isolation
//!
//! The store needs nothing stricter than READ COMMITTED, PostgreSQL's default: the primary key
//! decides between concurrent claims. Where the connections' isolation is stricter
//! (`default_transaction_isolation` set to `repeatable read` or `serializable` on the role, the
//! database or the server), PostgreSQL fails a claim whose row another delivery of the same key
//! changed meanwhile with a serialization failure (SQLSTATE 40001). Nothing was written then:
//! the claim, and the version guard's version claim, are tried once more after a random pause
//! of up to 20 ms, and only a second failure is an error (answered 503, so the sender retries).
//! Many duplicates of one event arriving at once still fail so now and then; give the store a
//! pool of its own that sets `SET default_transaction_isolation = 'read committed'` in
//! [`after_connect`](sqlx::pool::PoolOptions::after_connect) to avoid them altogether.
//!
//! # Table
//!
//! [`PostgresStore::migrate`] runs this in one transaction, under a transaction-scoped advisory
//! lock so that instances starting together do not race on the catalog (`idempotency_keys` is
//! the default name, see [`PostgresStore::with_table_name`]):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys" (
//!     namespace     TEXT        NOT NULL,
//!     "key"         TEXT        NOT NULL,
//!     state         TEXT        NOT NULL,
//!     token         BIGINT      NOT NULL,
//!     deliveries    BIGINT      NOT NULL,
//!     runs          BIGINT      NOT NULL DEFAULT 1,
//!     reclaimed     BOOLEAN     NOT NULL DEFAULT FALSE,
//!     first_seen_at TIMESTAMPTZ,
//!     last_seen_at  TIMESTAMPTZ,
//!     claimed_at    TIMESTAMPTZ NOT NULL,
//!     renewed_at    TIMESTAMPTZ,
//!     completed_at  TIMESTAMPTZ,
//!     PRIMARY KEY (namespace, "key"),
//!     CONSTRAINT "idempotency_keys_state_check"
//!         CHECK (state IN ('processing', 'done', 'released'))
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_claimed_idx"
//!     ON "idempotency_keys" (state, claimed_at);
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_completed_idx"
//!     ON "idempotency_keys" (state, completed_at);
//! ```
//!
//! A table of the first release (without `runs`) is upgraded in the same transaction: the new
//! columns are added (`ADD COLUMN IF NOT EXISTS`, instant for these defaults), the check on
//! `state`, whatever its name, is replaced by one that admits `released` (`NOT VALID`: every
//! existing row passes it already, so nothing is scanned), and `renewed_at` of `processing`
//! rows starts at their claim time. Rows are kept as they are. The upgrade waits at most 10 s
//! for the table's lock (`lock_timeout`), rather than stall the claims queued behind it, and
//! `migrate()` fails if it could not get it.
//!
//! # Round trips
//!
//! One per operation (once sqlx has prepared the statement on the connection):
//!
//! - `claim`: `INSERT … ON CONFLICT (namespace, "key") DO UPDATE SET deliveries =
//!   deliveries + 1, last_seen_at = now(), <the claim's columns> = CASE WHEN <released, or
//!   processing and not renewed for the limit under reclaim> THEN <a new run> ELSE <as was> END
//!   RETURNING state, token, deliveries, reclaimed, <age>, <since renewal>`. The primary key
//!   decides between concurrent claims; the claim acquired if the returned token is the one it
//!   generated. A duplicate of a done key is this one statement too.
//! - `renew`: `UPDATE … SET renewed_at = now() WHERE namespace = $1 AND "key" = $2 AND token =
//!   $3 AND state = 'processing'`; `commit` sets `state = 'done'`, `release` sets `state =
//!   'released'`, fenced the same way.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
//!
//! # Transactional mode
//!
//! `BEGIN; SET LOCAL lock_timeout = <ms>` (one round trip), the marker's insert as `done`,
//! the handler's statements, a check that the marker is still in the transaction, `COMMIT`.
//! A duplicate's insert waits for the open transaction on the primary key; past the lock
//! timeout (SQLSTATE 55P03) it answers 409. The lock timeout stays in force for the handler's
//! own statements in the transaction, and ends with it: the pooled connection keeps its own.
//!
//! # Entity versions (the version guard)
//!
//! [`migrate`](PostgresStore::migrate) also creates, in the same transaction, the table of the
//! [version guard](crate::version_guard), named after the claims table (`<table>_versions`, whose
//! primary key's name `<table>_versions_pkey` still fits in 63 bytes):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys_versions" (
//!     namespace       TEXT        NOT NULL,
//!     entity          TEXT        NOT NULL,
//!     applied_version BIGINT,
//!     pending_version BIGINT,
//!     pending_token   BIGINT,
//!     pending_since   TIMESTAMPTZ,
//!     deliveries      BIGINT      NOT NULL,
//!     last_seen_at    TIMESTAMPTZ NOT NULL,
//!     PRIMARY KEY (namespace, entity)
//! );
//! ```
//!
//! - `begin_version`: one round trip, `INSERT … ON CONFLICT (namespace, entity) DO UPDATE SET
//!   deliveries = deliveries + 1, pending_* = CASE WHEN <not older than applied_version
//!   (applied_version <= ours), and nothing pending or the pending one stale and the policy
//!   reclaims> THEN <ours> ELSE <as was> END RETURNING applied_version, pending_version,
//!   pending_token, <age>`; acquired if the returned token is ours, outdated if the returned
//!   applied version is newer than ours.
//! - `commit_version`: `UPDATE … SET applied_version = GREATEST(applied_version,
//!   pending_version), pending_* = NULL WHERE … AND pending_token = $3`; `release_version`
//!   the same without moving `applied_version`. One round trip each.
//! - [`version_guard::advance`](crate::version_guard::advance), in the caller's transaction: `INSERT … ON
//!   CONFLICT … DO UPDATE SET applied_version = excluded.applied_version WHERE
//!   t.applied_version IS NULL OR t.applied_version <= excluded.applied_version RETURNING
//!   applied_version` (an equal version advances, as the version guard runs it); when it returns
//!   nothing (outdated: the row is at a newer version), a `SELECT` of the applied version. The
//!   conflicting row is locked either way until the transaction ends.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, PgPool};

use super::sql::{
    Queries, ResultExt, TableName, VersionQueries, sql_store, upsert_store, version_store,
};
use super::{ConfigError, StoreError};

/// Serialises concurrent `migrate()` calls: an arbitrary constant ("tower_id" in ASCII).
const MIGRATE_LOCK: i64 = 0x746f_7765_725f_6964;

/// Claims kept in a PostgreSQL table, shared by every app instance that uses the database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::postgres) for the SQL,
/// the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Queries>,
}

/// The columns of the claims table, as `CREATE TABLE` makes them and the upgrade adds them.
fn columns() -> &'static str {
    r#"    namespace     TEXT        NOT NULL,
    "key"         TEXT        NOT NULL,
    state         TEXT        NOT NULL,
    token         BIGINT      NOT NULL,
    deliveries    BIGINT      NOT NULL,
    runs          BIGINT      NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN     NOT NULL DEFAULT FALSE,
    first_seen_at TIMESTAMPTZ,
    last_seen_at  TIMESTAMPTZ,
    claimed_at    TIMESTAMPTZ NOT NULL,
    renewed_at    TIMESTAMPTZ,
    completed_at  TIMESTAMPTZ,"#
}

fn queries(table: TableName) -> Queries {
    let t = table.quoted('"');
    let check = table.state_check('"');
    let age_of = |at: &str| format!("(extract(epoch FROM now() - {at}) * 1000000)::bigint");
    let heartbeat = "COALESCE(renewed_at, claimed_at)";
    let age = age_of("claimed_at");
    let idle = age_of(heartbeat);
    let migrate = format!(
        r#"SELECT pg_advisory_xact_lock({MIGRATE_LOCK});
CREATE TABLE IF NOT EXISTS {t} (
{columns}
    PRIMARY KEY (namespace, "key"),
    CONSTRAINT {check} CHECK (state IN ('processing', 'done', 'released'))
);
CREATE INDEX IF NOT EXISTS {claimed} ON {t} (state, claimed_at);
CREATE INDEX IF NOT EXISTS {completed} ON {t} (state, completed_at);"#,
        columns = columns(),
        claimed = table.claimed_index('"'),
        completed = table.completed_index('"'),
    );
    // $4: whether the policy reclaims; $5: the stale limit in microseconds. A released row is
    // free; a processing one only once its owner stopped renewing it.
    let take = "(t.state = 'released' OR (t.state = 'processing' AND $4 \
         AND COALESCE(t.renewed_at, t.claimed_at) <= now() - $5::bigint * interval '1 microsecond'))";
    let claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES ($1, $2, 'processing', $3, 1, 1, FALSE, now(), now(), now(), now())
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    state = CASE WHEN {take} THEN 'processing' ELSE t.state END,
    token = CASE WHEN {take} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {take} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {take} THEN t.state = 'processing' ELSE t.reclaimed END,
    claimed_at = CASE WHEN {take} THEN now() ELSE t.claimed_at END,
    renewed_at = CASE WHEN {take} THEN now() ELSE t.renewed_at END,
    completed_at = CASE WHEN {take} THEN NULL ELSE t.completed_at END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us"#
    );
    let fenced = r#"namespace = $1 AND "key" = $2 AND token = $3"#;
    let renew =
        format!("UPDATE {t} SET renewed_at = now() WHERE {fenced} AND state = 'processing'");
    let commit = format!(
        r#"UPDATE {t} SET state = 'done',
    completed_at = CASE WHEN state = 'done' THEN completed_at ELSE now() END
WHERE {fenced} AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET state = 'released', \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE now() END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {age}, {idle}, {settled}
FROM {t} WHERE namespace = $1 AND "key" = $2"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, "key", deliveries, {age} AS age_us, {idle} AS idle_us FROM {t}
WHERE state = 'processing' AND {heartbeat} <= now() - $1::bigint * interval '1 microsecond'
ORDER BY {heartbeat}, namespace, "key""#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET state = 'done', completed_at = now(), token = $1
WHERE namespace = $2 AND "key" = $3 AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = now()
WHERE namespace = $1 AND "key" = $2 AND state = 'processing'"#
    );
    let purge = format!(
        r#"DELETE FROM {t}
WHERE state IN ('done', 'released')
    AND completed_at <= now() - $1::bigint * interval '1 microsecond'"#
    );
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    // A released row is free for the marker too.
    let free = "t.state = 'released'";
    let tx_claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES ($1, $2, 'done', $3, 1, 1, FALSE, now(), now(), now(), now())
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    state = CASE WHEN {free} THEN 'done' ELSE t.state END,
    token = CASE WHEN {free} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {free} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {free} THEN FALSE ELSE t.reclaimed END,
    claimed_at = CASE WHEN {free} THEN now() ELSE t.claimed_at END,
    completed_at = CASE WHEN {free} THEN now() ELSE t.completed_at END
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

/// What turns a table of the first release (states `processing` and `done` only, no counts
/// of runs, no heartbeat) into the current one. Existing rows keep everything they had; the
/// constraint is replaced `NOT VALID` because every existing row satisfies it already.
fn upgrade(table: &TableName, checks: &[String]) -> String {
    let t = table.quoted('"');
    let check = table.state_check('"');
    let drop: String = checks
        .iter()
        .map(|name| {
            format!(
                "ALTER TABLE {t} DROP CONSTRAINT \"{}\";\n",
                name.replace('"', "\"\"")
            )
        })
        .collect();
    let add: String = columns()
        .lines()
        .filter(|line| {
            [
                "runs",
                "reclaimed",
                "first_seen_at",
                "last_seen_at",
                "renewed_at",
            ]
            .contains(&line.split_whitespace().next().unwrap_or_default())
        })
        .map(|line| format!("\n    ADD COLUMN IF NOT EXISTS {}", line.trim()))
        .collect();
    let add = add.trim_end_matches(',');
    // Waiting long for the table's lock would stall every claim queued behind the wait: fail
    // the start-up instead, and let it try again.
    format!(
        r#"SET LOCAL lock_timeout = '10s';
ALTER TABLE {t}{add};
{drop}ALTER TABLE {t} ADD CONSTRAINT {check} CHECK (state IN ('processing', 'done', 'released')) NOT VALID;
UPDATE {t} SET renewed_at = claimed_at WHERE state = 'processing' AND renewed_at IS NULL;"#
    )
}

/// The statements on the versions table of the [version guard](crate::version_guard).
fn version_queries(table: &TableName) -> VersionQueries {
    let v = table.versions().quoted('"');
    let age = "(extract(epoch FROM now() - pending_since) * 1000000)::bigint";
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       TEXT        NOT NULL,
    entity          TEXT        NOT NULL,
    applied_version BIGINT,
    pending_version BIGINT,
    pending_token   BIGINT,
    pending_since   TIMESTAMPTZ,
    deliveries      BIGINT      NOT NULL,
    last_seen_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, entity)
);"#
    );
    // $1 namespace, $2 entity, $3 version, $4 our token, $5 whether the policy reclaims, $6 the
    // stale limit in microseconds. Every SET expression sees the row as it was. Only an older
    // version is outdated: an equal one takes the slot like a newer one.
    let acquire = "(t.applied_version IS NULL OR t.applied_version <= excluded.pending_version) \
        AND (t.pending_token IS NULL OR ($5 AND t.pending_since <= now() - $6::bigint * interval '1 microsecond' \
            AND t.pending_version <= excluded.pending_version))";
    let begin = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES ($1, $2, $3, $4, now(), 1, now())
ON CONFLICT (namespace, entity) DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    pending_version = CASE WHEN {acquire} THEN excluded.pending_version ELSE t.pending_version END,
    pending_token = CASE WHEN {acquire} THEN excluded.pending_token ELSE t.pending_token END,
    pending_since = CASE WHEN {acquire} THEN excluded.pending_since ELSE t.pending_since END
RETURNING applied_version, pending_version, pending_token, {age} AS age_us"#
    );
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let renew = format!(
        "UPDATE {v} SET pending_since = now() WHERE namespace = $1 AND entity = $2 AND pending_token = $3"
    );
    let commit = format!(
        r#"UPDATE {v} SET applied_version = GREATEST(applied_version, pending_version), {clear}
WHERE namespace = $1 AND entity = $2 AND pending_token = $3"#
    );
    let release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = $1 AND entity = $2 AND pending_token = $3"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = $1 AND entity = $2");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = GREATEST(applied_version, pending_version), {clear}
WHERE namespace = $1 AND entity = $2 AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = $1 AND entity = $2 AND pending_token IS NOT NULL"
    );
    // $1 namespace, $2 entity, $3 version. A row at a newer version is locked, not changed,
    // and returns nothing; an equal one is advanced (to the same version) like an older one.
    let advance = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, applied_version, deliveries, last_seen_at)
VALUES ($1, $2, $3, 1, now())
ON CONFLICT (namespace, entity) DO UPDATE SET
    applied_version = excluded.applied_version,
    deliveries = t.deliveries + 1,
    last_seen_at = now()
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

impl PostgresStore {
    /// A store on `pool`, in the table `idempotency_keys`.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sql: Arc::new(queries(TableName::default_table())),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes, or
    /// `schema.table` with each part so (the schema must exist). It is quoted in SQL, so it is
    /// case-sensitive.
    pub fn with_table_name(mut self, name: &str) -> Result<Self, ConfigError> {
        self.sql = Arc::new(queries(TableName::parse(name, true)?));
        Ok(self)
    }

    /// The table's name, as given.
    pub fn table_name(&self) -> String {
        self.sql.table.name()
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the table and its indexes if they do not exist, in one transaction, and
    /// upgrades a table made by an earlier release (new columns added, its rows kept). Safe
    /// to call at every start-up, from several instances at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        let table = &self.sql.table;
        let current: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = 'runs' AND NOT attisdropped)",
        )
        .bind(table.quoted('"'))
        .fetch_one(&mut *tx)
        .await
        .store()?;
        if !current {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            // The check on `state` refuses `released`, whatever its name (a renamed table
            // keeps the old one).
            let checks: Vec<String> = sqlx::query_scalar(
                "SELECT conname::text FROM pg_constraint WHERE conrelid = to_regclass($1) \
                 AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%processing%'",
            )
            .bind(table.quoted('"'))
            .fetch_all(&mut *tx)
            .await
            .store()?;
            sqlx::raw_sql(AssertSqlSafe(upgrade(table, &checks)))
                .execute(&mut *tx)
                .await
                .store()?;
        }
        sqlx::raw_sql(AssertSqlSafe(self.sql.versions.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()
    }
}

sql_store!(PostgresStore);
version_store!(PostgresStore);
upsert_store!(PostgresStore, sqlx::Postgres, sqlx::PgConnection);

/// Nothing to put back after the marker: `SET LOCAL` ends with the transaction.
type LockWait = ();

impl PostgresStore {
    /// `BEGIN; SET LOCAL lock_timeout = <ms>`, one round trip. The lock timeout stays in force
    /// for the handler's own statements in the transaction, and ends with it: the pooled
    /// connection keeps its own.
    async fn begin_transaction(
        &self,
        lock_timeout: std::time::Duration,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, LockWait), StoreError> {
        let ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        let begin = format!("BEGIN; SET LOCAL lock_timeout = {ms}");
        let tx = self.pool.begin_with(AssertSqlSafe(begin)).await.store()?;
        Ok((tx, ()))
    }

    async fn end_lock_wait(
        &self,
        _tx: &mut sqlx::PgConnection,
        (): LockWait,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}

/// 40001 serialization_failure: under REPEATABLE READ or SERIALIZABLE (the connection's
/// `default_transaction_isolation`), a concurrent delivery changed the key's row after this
/// statement's snapshot was taken. Nothing was written; the statement can be run again.
fn is_serialization_failure(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e) if e.code().as_deref() == Some("40001"))
}

/// 55P03 lock_not_available: the first delivery's transaction is still open.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
}
