//! What the SQL backends share: table names, durations as database numbers, and the claim
//! decision made from the row an upsert returns.

use std::sync::Arc;
use std::time::Duration;

use super::{
    Claim, Completed, ConfigError, KeyRecord, KeyState, Lease, LeaseToken, Stale, StoreError,
    StuckClaim,
};
use crate::key::IdempotencyKey;

/// The table every SQL store uses unless told otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idempotency_keys";

/// The longest table name (or schema name) accepted: 63 bytes (Postgres' identifier limit)
/// less the longest index suffix, so the derived index names are never truncated into each
/// other.
pub(crate) const MAX_TABLE_NAME_LEN: usize = 63 - COMPLETED_INDEX_SUFFIX.len();
const _: () = assert!(
    MAX_TABLE_NAME_LEN == 49,
    "update the message in TableName::parse"
);

const CLAIMED_INDEX_SUFFIX: &str = "_claimed_idx";
const COMPLETED_INDEX_SUFFIX: &str = "_completed_idx";
/// The suffix of the entity versions table of the [version guard](crate::version_guard).
const VERSIONS_SUFFIX: &str = "_versions";
const _: () = assert!(
    MAX_TABLE_NAME_LEN + VERSIONS_SUFFIX.len() + "_pkey".len() <= 63,
    "the versions table and its primary key's name must fit Postgres' 63-byte identifiers"
);

/// Durations are bound as whole microseconds, capped at about a century: far past any stale
/// limit or retention anyone means, and well inside every backend's date range.
const MAX_MICROS: i64 = 100 * 366 * 24 * 60 * 60 * 1_000_000;

/// A validated table name, optionally schema-qualified (Postgres only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    schema: Option<String>,
    table: String,
}

impl TableName {
    /// The default table.
    pub(crate) fn default_table() -> Self {
        Self {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
        }
    }

    /// Validates `name`: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_TABLE_NAME_LEN`] bytes; with
    /// `allow_schema`, also `schema.table` with each part so.
    pub(crate) fn parse(name: &str, allow_schema: bool) -> Result<Self, ConfigError> {
        let invalid = |reason: &'static str| ConfigError::InvalidTableName {
            name: name.to_owned(),
            reason,
        };
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) if allow_schema => (Some(schema), table),
            Some(_) => return Err(invalid("this backend takes no schema-qualified name")),
            None => (None, name),
        };
        for part in schema.iter().chain([&table]) {
            if part.is_empty() {
                return Err(invalid("it is empty"));
            }
            if part.len() > MAX_TABLE_NAME_LEN {
                return Err(invalid("it is longer than 49 bytes"));
            }
            let mut bytes = part.bytes();
            let first_ok = bytes
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
            if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(
                    "only ASCII letters, digits and `_` are allowed, not starting with a digit",
                ));
            }
        }
        Ok(Self {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// The name as given.
    pub(crate) fn name(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The table, quoted with `quote` (`"` or `` ` ``), schema-qualified if it has a schema.
    /// Validation admits no quote characters, so quoting cannot be escaped.
    pub(crate) fn quoted(&self, quote: char) -> String {
        match &self.schema {
            Some(schema) => format!("{quote}{schema}{quote}.{quote}{}{quote}", self.table),
            None => format!("{quote}{}{quote}", self.table),
        }
    }

    /// The table of entity versions: `<table>_versions`, in the same schema. At most 58
    /// bytes, so Postgres' name for its primary key (`<table>_versions_pkey`) fits in 63.
    pub(crate) fn versions(&self) -> Self {
        Self {
            schema: self.schema.clone(),
            table: format!("{}{VERSIONS_SUFFIX}", self.table),
        }
    }

    /// The quoted, unqualified name of the check constraint on `state`: `<table>_state_check`,
    /// the name PostgreSQL gave the unnamed constraint of earlier releases.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn state_check(&self, quote: char) -> String {
        format!("{quote}{}_state_check{quote}", self.table)
    }

    /// The unqualified table name, unquoted: for catalog lookups.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) fn bare(&self) -> &str {
        &self.table
    }

    /// The quoted, unqualified name of the index on `(state, claimed_at)`.
    pub(crate) fn claimed_index(&self, quote: char) -> String {
        format!("{quote}{}{CLAIMED_INDEX_SUFFIX}{quote}", self.table)
    }

    /// The quoted, unqualified name of the index on `(state, completed_at)`.
    pub(crate) fn completed_index(&self, quote: char) -> String {
        format!("{quote}{}{COMPLETED_INDEX_SUFFIX}{quote}", self.table)
    }
}

/// `duration` in whole microseconds, for binding; capped at [`MAX_MICROS`].
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).map_or(MAX_MICROS, |us| us.min(MAX_MICROS))
}

/// A number of microseconds read back from the database; negative ages (a clock stepped
/// back) read as zero.
pub(crate) fn duration_from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn count(deliveries: i64) -> u64 {
    u64::try_from(deliveries).unwrap_or(0)
}

/// The row an upsert left behind (or a claim's follow-up read).
#[derive(Debug)]
pub(crate) struct ClaimRow {
    pub(crate) state: String,
    pub(crate) token: i64,
    pub(crate) deliveries: i64,
    /// Whether the row's latest run took over a stale claim.
    pub(crate) reclaimed: bool,
    /// Microseconds since the row's claim, by the database's clock.
    pub(crate) age_us: i64,
    /// Microseconds since the claim was last renewed (or taken).
    pub(crate) idle_us: i64,
}

impl ClaimRow {
    /// Reads the six columns `state, token, deliveries, reclaimed, age_us, idle_us`.
    pub(crate) fn read<R>(row: &R) -> Result<Self, StoreError>
    where
        R: sqlx::Row,
        usize: sqlx::ColumnIndex<R>,
        String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Self {
            state: row.try_get(0).store()?,
            token: row.try_get(1).store()?,
            deliveries: row.try_get(2).store()?,
            reclaimed: row.try_get(3).store()?,
            age_us: row.try_get(4).store()?,
            idle_us: row.try_get(5).store()?,
        })
    }

    /// What the claim answers. The upsert wrote `ours` if and only if it inserted the row or
    /// took it over (released, or stale under reclaim).
    pub(crate) fn into_claim(
        self,
        key: &IdempotencyKey,
        ours: LeaseToken,
        stale: Stale,
    ) -> Result<Claim, StoreError> {
        if LeaseToken::from_i64(self.token) == ours {
            return Ok(Claim::Acquired(Lease::new(
                key.clone(),
                ours,
                self.reclaimed,
            )));
        }
        let deliveries = count(self.deliveries);
        match KeyState::parse(&self.state) {
            Some(KeyState::Done) => Ok(Claim::Done(Completed::new(deliveries))),
            Some(KeyState::Processing) => Ok(stale.pending(
                duration_from_micros(self.age_us),
                duration_from_micros(self.idle_us),
                deliveries,
            )),
            _ => Err(StoreError::backend(format!(
                "unexpected state {:?} in the idempotency table after a claim",
                self.state
            ))),
        }
    }
}

/// Reads a [`KeyRecord`] from the nine columns of a describe statement: `state, deliveries,
/// runs, reclaimed`, then the ages in microseconds of the first and last delivery, the claim,
/// the last renewal and the settlement (the last two may be NULL).
pub(crate) fn key_record<R>(row: &R) -> Result<KeyRecord, StoreError>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = row.try_get(0).store()?;
    let state = KeyState::parse(&state).ok_or_else(|| {
        StoreError::backend(format!(
            "unexpected state {state:?} in the idempotency table"
        ))
    })?;
    let age = |i: usize| -> Result<Duration, StoreError> {
        let us: Option<i64> = row.try_get(i).store()?;
        Ok(duration_from_micros(us.unwrap_or(0)))
    };
    Ok(KeyRecord::new(
        state,
        count(row.try_get(1).store()?),
        count(row.try_get(2).store()?),
    )
    .with_reclaimed(row.try_get(3).store()?)
    .with_seen(age(4)?, age(5)?)
    .with_times(age(6)?, age(7)?, age(8)?))
}

/// A stale policy under which no claim is ever stale: transactional mode has no stale claims.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) const NEVER_STALE: Stale = Stale::reclaim_after(Duration::MAX);

/// A row of [`Store::stuck_claims`](super::Store::stuck_claims).
pub(crate) fn stuck_claim(
    namespace: String,
    key: String,
    deliveries: i64,
    age_us: i64,
    idle_us: i64,
) -> Result<StuckClaim, StoreError> {
    let key = IdempotencyKey::new(namespace, key).map_err(StoreError::backend)?;
    Ok(StuckClaim::new(
        key,
        duration_from_micros(age_us),
        duration_from_micros(idle_us),
        count(deliveries),
    ))
}

/// Logs a `processing` row that [`Store::stuck_claims`](super::Store::stuck_claims) skips
/// because it cannot read it: its namespace and key (when they are text at all) are no valid
/// [`IdempotencyKey`], or a column has an unexpected type.
pub(crate) fn undecodable_stuck_row(
    table: &TableName,
    namespace: Option<String>,
    key: Option<String>,
    error: &StoreError,
) {
    tracing::error!(
        table = %table.name(),
        namespace = ?namespace,
        key = ?key,
        error = error as &dyn std::error::Error,
        "skipping a processing row that is not a valid claim; fix or delete it by hand"
    );
}

/// The statements of one store on one table, made once and shared by its clones.
///
/// Parameters, by position: `claim` as the backend documents; `renew`, `commit` and
/// `release` (namespace, key, token); `describe` and `resolve_release` (namespace, key);
/// `resolve_done` (new token, namespace, key); `stuck` and `purge` (age in microseconds).
pub(crate) struct Queries {
    pub(crate) table: TableName,
    pub(crate) migrate: Arc<str>,
    pub(crate) claim: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) commit: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) describe: Arc<str>,
    pub(crate) stuck: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    pub(crate) purge: Arc<str>,
    /// Transactional mode: insert the marker as `done` inside the delivery's transaction
    /// (namespace, key, token); on a conflict, count the delivery and return the row.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) tx_claim: Arc<str>,
    /// Transactional mode, just before `COMMIT`: whether the delivery's transaction still
    /// holds its marker (namespace, key, token). A transaction a failed statement aborted, or
    /// one the database rolled back, does not.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) tx_check: Arc<str>,
    /// The entity versions of the version guard.
    pub(crate) versions: VersionQueries,
}

/// The statements on the versions table, shared by the SQL stores.
///
/// Parameters, by position: `begin` and `advance` as the backend documents; `commit` and
/// `release` (namespace, entity, token); `applied`, `resolve_done` and `resolve_release`
/// (namespace, entity).
pub(crate) struct VersionQueries {
    /// Creates the table (`IF NOT EXISTS`).
    pub(crate) migrate: Arc<str>,
    /// Moves the pending version's heartbeat (`pending_since`) if the token holds.
    pub(crate) renew: Arc<str>,
    /// Makes the version pending if it is not older and nothing else is pending (or that is stale
    /// and the policy reclaims), counts the delivery, and (but on MySQL) returns the row.
    pub(crate) begin: Arc<str>,
    pub(crate) commit: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) applied: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    /// Moves the applied version inside the caller's transaction, unless it is older.
    pub(crate) advance: Arc<str>,
}

/// A versions row as `begin_version` left it: applied version, pending version, pending token,
/// and the pending version's age in microseconds by the database's clock.
pub(crate) type VersionRow = (Option<i64>, Option<i64>, Option<i64>, Option<i64>);

/// What `begin_version` answers, from the row it left (or read). `Ok(None)`: the row says
/// nothing is pending, the version is not older and yet it is not ours: start over.
pub(crate) fn version_claim(
    entity: &IdempotencyKey,
    version: i64,
    ours: LeaseToken,
    stale: Stale,
    (applied, pending_version, pending_token, age_us): VersionRow,
) -> Option<crate::store::VersionClaim> {
    let pending = pending_version.zip(pending_token).map(|(version, token)| {
        let age = duration_from_micros(age_us.unwrap_or(0));
        (version, LeaseToken::from_i64(token), age)
    });
    crate::store::decide(entity, version, ours, stale, applied, pending)
}

/// Reads a [`VersionRow`] from the first four columns.
pub(crate) fn version_row<R>(row: &R) -> Result<VersionRow, StoreError>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok((
        row.try_get(0).store()?,
        row.try_get(1).store()?,
        row.try_get(2).store()?,
        row.try_get(3).store()?,
    ))
}

/// What PostgreSQL and SQLite share beyond [`sql_store!`]: both claim with `INSERT … ON
/// CONFLICT … RETURNING`, so their claim, version and transactional-marker code is the same
/// but for the connection type. The backend provides `is_lock_timeout(&sqlx::Error) -> bool`,
/// `is_serialization_failure(&sqlx::Error) -> bool` (a claim or version claim failing so is
/// tried once more), and an inherent `begin_transaction(lock_timeout)` answering the
/// transaction, in which the marker's insert waits at most the lock timeout, and a `LockWait`:
/// what `end_lock_wait(&mut tx, LockWait)` needs to put the connection's lock wait back once
/// the marker is in.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! upsert_store {
    ($store:ident, $db:ty, $conn:ty) => {
        impl $store {
            async fn claim_key(
                &self,
                key: &$crate::key::IdempotencyKey,
                stale: $crate::store::Stale,
            ) -> Result<$crate::store::Claim, $crate::store::StoreError> {
                let token = $crate::store::LeaseToken::generate();
                let upsert = || {
                    ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.claim.clone()))
                        .bind(key.namespace())
                        .bind(key.value())
                        .bind(token.to_i64())
                        .bind(stale.policy() == $crate::store::StalePolicy::Reclaim)
                        .bind($crate::store::sql::micros(stale.after()))
                        .fetch_one(&self.pool)
                };
                let row = $crate::store::sql::retry_serialization_failure(
                    "claim",
                    is_serialization_failure,
                    upsert,
                )
                .await?;
                $crate::store::sql::ClaimRow::read(&row)?.into_claim(key, token, stale)
            }

            async fn begin_entity_version(
                &self,
                entity: &$crate::key::IdempotencyKey,
                version: i64,
                stale: $crate::store::Stale,
            ) -> Result<$crate::store::VersionClaim, $crate::store::StoreError> {
                let token = $crate::store::LeaseToken::generate();
                let upsert = || {
                    ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.versions.begin.clone()))
                        .bind(entity.namespace())
                        .bind(entity.value())
                        .bind(version)
                        .bind(token.to_i64())
                        .bind(stale.policy() == $crate::store::StalePolicy::Reclaim)
                        .bind($crate::store::sql::micros(stale.after()))
                        .fetch_one(&self.pool)
                };
                let row = $crate::store::sql::retry_serialization_failure(
                    "version claim",
                    is_serialization_failure,
                    upsert,
                )
                .await?;
                let row = $crate::store::sql::version_row(&row)?;
                $crate::store::sql::version_claim(entity, version, token, stale, row).ok_or_else(
                    || $crate::store::StoreError::backend("the versions row was left inconsistent"),
                )
            }

            /// Inserts the transactional marker of `key` in `tx`, which the backend began with
            /// its lock timeout, then ends that timeout (`end_lock_wait`): it bounds the
            /// marker's wait, and the connection is left as it was.
            async fn insert_marker(
                &self,
                mut tx: ::sqlx::Transaction<'static, $db>,
                lock_wait: LockWait,
                key: &$crate::key::IdempotencyKey,
                lock_timeout: ::std::time::Duration,
            ) -> Result<$crate::store::Begin<$db>, $crate::store::StoreError> {
                let token = $crate::store::LeaseToken::generate();
                let row = ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.tx_claim.clone()))
                    .bind(key.namespace())
                    .bind(key.value())
                    .bind(token.to_i64())
                    .fetch_one(&mut *tx)
                    .await;
                let ended = self.end_lock_wait(&mut tx, lock_wait).await;
                let row = match row {
                    Ok(row) => row,
                    Err(e) if is_lock_timeout(&e) => {
                        ended?;
                        return Ok($crate::store::Begin::lock_timed_out(lock_timeout));
                    }
                    Err(e) => return Err($crate::store::StoreError::backend(e)),
                };
                ended?;
                let never = $crate::store::sql::NEVER_STALE;
                let claim =
                    $crate::store::sql::ClaimRow::read(&row)?.into_claim(key, token, never)?;
                $crate::store::begun(claim, tx).await
            }
        }

        impl $crate::store::TransactionalStore for $store {
            type Database = $db;

            /// The backend's own `BEGIN` with the lock timeout, then the marker's insert, then
            /// the connection's own lock wait back.
            async fn begin(
                &self,
                key: &$crate::key::IdempotencyKey,
                lock_timeout: ::std::time::Duration,
            ) -> Result<$crate::store::Begin<$db>, $crate::store::StoreError> {
                let (tx, lock_wait) = self.begin_transaction(lock_timeout).await?;
                self.insert_marker(tx, lock_wait, key, lock_timeout).await
            }

            async fn holds_marker(
                &self,
                conn: &mut $conn,
                key: &$crate::key::IdempotencyKey,
                token: $crate::store::LeaseToken,
            ) -> Result<bool, $crate::store::StoreError> {
                let found: Option<i32> =
                    ::sqlx::query_scalar(::sqlx::AssertSqlSafe(self.sql.tx_check.clone()))
                        .bind(key.namespace())
                        .bind(key.value())
                        .bind(token.to_i64())
                        .fetch_optional(conn)
                        .await
                        .map_err($crate::store::StoreError::backend)?;
                Ok(found.is_some())
            }
        }

        impl $crate::store::AdvanceVersion for $store {
            /// One statement when the version is newer or equal (an upsert whose `WHERE` keeps
            /// a row at a newer version as it is, and locks it either way); a second reads the
            /// applied version when not.
            async fn advance_version(
                &self,
                conn: &mut $conn,
                entity: &$crate::key::IdempotencyKey,
                version: i64,
            ) -> Result<$crate::store::Advance, $crate::store::StoreError> {
                use $crate::store::sql::ResultExt as _;
                let moved: Option<i64> =
                    ::sqlx::query_scalar(::sqlx::AssertSqlSafe(self.sql.versions.advance.clone()))
                        .bind(entity.namespace())
                        .bind(entity.value())
                        .bind(version)
                        .fetch_optional(&mut *conn)
                        .await
                        .store()?;
                if moved.is_some() {
                    return Ok($crate::store::Advance::Applied);
                }
                let applied: Option<i64> =
                    ::sqlx::query_scalar(::sqlx::AssertSqlSafe(self.sql.versions.applied.clone()))
                        .bind(entity.namespace())
                        .bind(entity.value())
                        .fetch_one(&mut *conn)
                        .await
                        .store()?;
                let applied = applied.ok_or_else(|| {
                    $crate::store::StoreError::backend(
                        "the versions row kept no applied version yet refused this one",
                    )
                })?;
                Ok($crate::store::Advance::Outdated { applied })
            }
        }
    };
}

/// The [`VersionStore`](super::VersionStore) methods that differ only in the pool's
/// type; `begin_version` calls the backend's inherent `begin_entity_version`. The store is a
/// struct `{ pool, sql: Arc<Queries> }`.
macro_rules! version_store {
    ($store:ident) => {
        impl $store {
            async fn on_entity(
                &self,
                sql: &::std::sync::Arc<str>,
                entity: &$crate::key::IdempotencyKey,
                token: Option<$crate::store::LeaseToken>,
            ) -> Result<u64, $crate::store::StoreError> {
                let mut query = ::sqlx::query(::sqlx::AssertSqlSafe(sql.clone()))
                    .bind(entity.namespace())
                    .bind(entity.value());
                if let Some(token) = token {
                    query = query.bind(token.to_i64());
                }
                let done = query
                    .execute(&self.pool)
                    .await
                    .map_err($crate::store::StoreError::backend)?;
                Ok(done.rows_affected())
            }
        }

        impl $crate::store::VersionStore for $store {
            async fn begin_version(
                &self,
                entity: &$crate::key::IdempotencyKey,
                version: i64,
                stale: $crate::store::Stale,
            ) -> Result<$crate::store::VersionClaim, $crate::store::StoreError> {
                self.begin_entity_version(entity, version, stale).await
            }

            async fn renew_version(
                &self,
                lease: &$crate::store::VersionLease,
            ) -> Result<(), $crate::store::StoreError> {
                let sql = &self.sql.versions.renew;
                match self
                    .on_entity(sql, lease.entity(), Some(lease.token()))
                    .await?
                {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn commit_version(
                &self,
                lease: &$crate::store::VersionLease,
            ) -> Result<(), $crate::store::StoreError> {
                let sql = &self.sql.versions.commit;
                match self
                    .on_entity(sql, lease.entity(), Some(lease.token()))
                    .await?
                {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn release_version(
                &self,
                lease: &$crate::store::VersionLease,
            ) -> Result<(), $crate::store::StoreError> {
                let sql = &self.sql.versions.release;
                match self
                    .on_entity(sql, lease.entity(), Some(lease.token()))
                    .await?
                {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn applied_version(
                &self,
                entity: &$crate::key::IdempotencyKey,
            ) -> Result<Option<i64>, $crate::store::StoreError> {
                use $crate::store::sql::ResultExt as _;
                let applied: Option<Option<i64>> =
                    ::sqlx::query_scalar(::sqlx::AssertSqlSafe(self.sql.versions.applied.clone()))
                        .bind(entity.namespace())
                        .bind(entity.value())
                        .fetch_optional(&self.pool)
                        .await
                        .store()?;
                Ok(applied.flatten())
            }

            async fn resolve_version(
                &self,
                entity: &$crate::key::IdempotencyKey,
                resolution: $crate::store::Resolution,
            ) -> Result<bool, $crate::store::StoreError> {
                let sql = match resolution {
                    $crate::store::Resolution::Done => &self.sql.versions.resolve_done,
                    $crate::store::Resolution::Release => &self.sql.versions.resolve_release,
                };
                Ok(self.on_entity(sql, entity, None).await? > 0)
            }
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use upsert_store;
pub(crate) use version_store;

/// The parts of a SQL store that differ only in the pool's type: `Debug`, and every
/// [`Store`](super::Store) method but `claim`, which calls the backend's inherent
/// `claim_key`. The store is a struct `{ pool, sql: Arc<Queries> }`.
macro_rules! sql_store {
    ($store:ident) => {
        impl $store {
            async fn affected(
                &self,
                sql: &::std::sync::Arc<str>,
                lease: &$crate::store::Lease,
            ) -> Result<u64, $crate::store::StoreError> {
                let done = ::sqlx::query(::sqlx::AssertSqlSafe(sql.clone()))
                    .bind(lease.key().namespace())
                    .bind(lease.key().value())
                    .bind(lease.token().to_i64())
                    .execute(&self.pool)
                    .await
                    .map_err($crate::store::StoreError::backend)?;
                Ok(done.rows_affected())
            }
        }

        impl ::std::fmt::Debug for $store {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("table", &self.sql.table.name())
                    .field("pool", &self.pool)
                    .finish()
            }
        }

        impl $crate::store::Store for $store {
            async fn claim(
                &self,
                key: &$crate::key::IdempotencyKey,
                stale: $crate::store::Stale,
            ) -> Result<$crate::store::Claim, $crate::store::StoreError> {
                self.claim_key(key, stale).await
            }

            async fn renew(
                &self,
                lease: &$crate::store::Lease,
            ) -> Result<(), $crate::store::StoreError> {
                match self.affected(&self.sql.renew, lease).await? {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn describe(
                &self,
                key: &$crate::key::IdempotencyKey,
            ) -> Result<Option<$crate::store::KeyRecord>, $crate::store::StoreError> {
                use $crate::store::sql::ResultExt as _;
                let row = ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.describe.clone()))
                    .bind(key.namespace())
                    .bind(key.value())
                    .fetch_optional(&self.pool)
                    .await
                    .store()?;
                row.as_ref().map($crate::store::sql::key_record).transpose()
            }

            async fn commit(
                &self,
                lease: &$crate::store::Lease,
            ) -> Result<(), $crate::store::StoreError> {
                // Matched rows, not changed rows (MySQL: sqlx sets CLIENT_FOUND_ROWS), so a
                // repeated commit answers Ok.
                match self.affected(&self.sql.commit, lease).await? {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn release(
                &self,
                lease: &$crate::store::Lease,
            ) -> Result<(), $crate::store::StoreError> {
                match self.affected(&self.sql.release, lease).await? {
                    0 => Err($crate::store::StoreError::LeaseLost),
                    _ => Ok(()),
                }
            }

            async fn stuck_claims(
                &self,
                older_than: ::std::time::Duration,
            ) -> Result<Vec<$crate::store::StuckClaim>, $crate::store::StoreError> {
                use ::sqlx::Row as _;
                use $crate::store::sql::ResultExt as _;
                let rows = ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.stuck.clone()))
                    .bind($crate::store::sql::micros(older_than))
                    .fetch_all(&self.pool)
                    .await
                    .store()?;
                // One row the store cannot read (a key written by hand, or by other code,
                // that is no valid `IdempotencyKey`) must not hide every other stuck claim.
                Ok(rows
                    .iter()
                    .filter_map(|row| {
                        let decoded = (|| {
                            $crate::store::sql::stuck_claim(
                                row.try_get(0).store()?,
                                row.try_get(1).store()?,
                                row.try_get(2).store()?,
                                row.try_get(3).store()?,
                                row.try_get(4).store()?,
                            )
                        })();
                        match decoded {
                            Ok(claim) => Some(claim),
                            Err(error) => {
                                $crate::store::sql::undecodable_stuck_row(
                                    &self.sql.table,
                                    row.try_get(0).ok(),
                                    row.try_get(1).ok(),
                                    &error,
                                );
                                None
                            }
                        }
                    })
                    .collect())
            }

            async fn resolve(
                &self,
                key: &$crate::key::IdempotencyKey,
                resolution: $crate::store::Resolution,
            ) -> Result<bool, $crate::store::StoreError> {
                let query = match resolution {
                    // A new token fences off the old owner, whose late commit must not undo
                    // what the person decided.
                    $crate::store::Resolution::Done => {
                        ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.resolve_done.clone()))
                            .bind($crate::store::LeaseToken::generate().to_i64())
                            .bind(key.namespace())
                            .bind(key.value())
                    }
                    $crate::store::Resolution::Release => {
                        ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.resolve_release.clone()))
                            .bind(key.namespace())
                            .bind(key.value())
                    }
                };
                let done = query
                    .execute(&self.pool)
                    .await
                    .map_err($crate::store::StoreError::backend)?;
                Ok(done.rows_affected() > 0)
            }

            async fn purge_completed(
                &self,
                older_than: ::std::time::Duration,
            ) -> Result<u64, $crate::store::StoreError> {
                let done = ::sqlx::query(::sqlx::AssertSqlSafe(self.sql.purge.clone()))
                    .bind($crate::store::sql::micros(older_than))
                    .execute(&self.pool)
                    .await
                    .map_err($crate::store::StoreError::backend)?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(crate) use sql_store;

/// A statement that failed to serialize with concurrent ones twice in a row: PostgreSQL's
/// SQLSTATE 40001, which a claim meets only when the connection's isolation is stricter than
/// READ COMMITTED (`default_transaction_isolation` set on the role, the database or the pool's
/// connections).
#[derive(Debug, thiserror::Error)]
#[error(
    "the {what} failed to serialize with concurrent deliveries of the same key twice in a row \
     (SQLSTATE 40001): the connection's default isolation is stricter than READ COMMITTED"
)]
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct SerializationFailure {
    what: &'static str,
    #[source]
    source: sqlx::Error,
}

/// The longest pause before the second attempt of a statement that failed to serialize.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
const SERIALIZATION_JITTER_US: u64 = 20_000;

/// Runs `statement`, and once more if it failed as `is_serialization_failure` says: a second
/// attempt starts after the concurrent statement that made the first fail has committed, so
/// it sees that row. A second failure of the same kind is a [`SerializationFailure`].
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn retry_serialization_failure<T, F, Fut>(
    what: &'static str,
    is_serialization_failure: fn(&sqlx::Error) -> bool,
    mut statement: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    match statement().await {
        Err(first) if is_serialization_failure(&first) => {
            tracing::debug!(
                error = &first as &dyn std::error::Error,
                "the {what} failed to serialize; trying it once more"
            );
            // Every delivery that waited for the same row failed at once: a random pause
            // spreads their second attempts, which would otherwise collide again.
            let pause = LeaseToken::generate().to_i64().unsigned_abs() % SERIALIZATION_JITTER_US;
            tokio::time::sleep(Duration::from_micros(pause)).await;
            match statement().await {
                Err(source) if is_serialization_failure(&source) => {
                    Err(StoreError::backend(SerializationFailure { what, source }))
                }
                again => again.store(),
            }
        }
        first => first.store(),
    }
}

/// Maps a backend result's error into a [`StoreError`], keeping the source.
pub(crate) trait ResultExt<T> {
    fn store(self) -> Result<T, StoreError>;
}

impl<T> ResultExt<T> for Result<T, sqlx::Error> {
    fn store(self) -> Result<T, StoreError> {
        self.map_err(StoreError::backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for ok in [
            "idempotency_keys",
            "_t",
            "T1",
            &"a".repeat(MAX_TABLE_NAME_LEN),
        ] {
            assert!(TableName::parse(ok, false).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "a-b",
            "a b",
            "t\"",
            "t`",
            "é",
            "a;drop",
            &"a".repeat(MAX_TABLE_NAME_LEN + 1),
            "s.t",
        ] {
            assert!(TableName::parse(bad, false).is_err(), "{bad}");
        }
        let qualified = TableName::parse("app.claims", true).unwrap();
        assert_eq!(qualified.quoted('"'), r#""app"."claims""#);
        assert_eq!(qualified.claimed_index('"'), r#""claims_claimed_idx""#);
        assert_eq!(qualified.name(), "app.claims");
        for bad in [".t", "s.", "s.t.u", "s.1"] {
            assert!(TableName::parse(bad, true).is_err(), "{bad}");
        }
        let long = "a".repeat(MAX_TABLE_NAME_LEN);
        let table = TableName::parse(&long, false).unwrap();
        assert_eq!(table.completed_index('`').len(), 63 + 2);
    }

    #[test]
    fn durations() {
        assert_eq!(micros(Duration::from_millis(300)), 300_000);
        assert_eq!(micros(Duration::MAX), MAX_MICROS);
        assert_eq!(duration_from_micros(-5), Duration::ZERO);
        assert_eq!(duration_from_micros(1_500), Duration::from_micros(1_500));
    }

    const PROCESSING: &str = "processing";
    const DONE: &str = "done";

    #[test]
    fn claim_decision() {
        let key = IdempotencyKey::new("ns", "k").unwrap();
        let ours = LeaseToken::generate();
        let other = LeaseToken::generate().to_i64();
        let stale = Stale::hold_after(Duration::from_secs(1));
        let row = |state: &str, token, deliveries, reclaimed, age_us, idle_us| ClaimRow {
            state: state.to_owned(),
            token,
            deliveries,
            reclaimed,
            age_us,
            idle_us,
        };
        match row(PROCESSING, ours.to_i64(), 1, false, 0, 0).into_claim(&key, ours, stale) {
            Ok(Claim::Acquired(lease)) => assert!(!lease.reclaimed()),
            other => panic!("{other:?}"),
        }
        match row(PROCESSING, ours.to_i64(), 4, true, 0, 0).into_claim(&key, ours, stale) {
            Ok(Claim::Acquired(lease)) => assert!(lease.reclaimed()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            row(DONE, other, 3, false, 9, 9)
                .into_claim(&key, ours, stale)
                .unwrap(),
            Claim::Done(Completed::new(3))
        );
        assert!(matches!(
            row(PROCESSING, other, 2, false, 10, 5).into_claim(&key, ours, stale),
            Ok(Claim::InFlight(p)) if p.deliveries == 2
                && p.age == Duration::from_micros(10)
                && p.since_renewal == Duration::from_micros(5)
        ));
        // Old, but renewed recently: not stale.
        assert!(matches!(
            row(PROCESSING, other, 2, false, 5_000_000, 10).into_claim(&key, ours, stale),
            Ok(Claim::InFlight(_))
        ));
        assert!(matches!(
            row(PROCESSING, other, 2, false, 2_000_000, 2_000_000).into_claim(&key, ours, stale),
            Ok(Claim::Held(_))
        ));
        for weird in ["weird", "released"] {
            assert!(
                row(weird, other, 2, false, 0, 0)
                    .into_claim(&key, ours, stale)
                    .is_err()
            );
        }
    }
}
