//! What the SQL backends share.
//!
//! Each backend writes its own SQL (`queries` in its folder) and its own `impl Store`; the
//! statements that are run the same way on every database (bind the key, run, count the rows)
//! are the methods of [`Table`], written once over sqlx's [`Database`]. What sqlx's trait does
//! not say, and these need, is [`Backend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool};
use sqlx::{Row as _, Type};

mod queries;
mod rows;
mod table;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod upsert;

pub(crate) use queries::{Queries, VersionQueries};
pub(crate) use rows::{
    ClaimRow, NEVER_STALE, key_record, micros, stuck_claim, undecodable_stuck_row, version_claim,
    version_row,
};
pub(crate) use table::TableName;

use super::{KeyRecord, Lease, LeaseToken, Resolution, StoreError, StuckClaim, VersionLease};
use crate::key::IdempotencyKey;

/// A database the SQL stores run on: what [`Table`] needs beyond sqlx's [`Database`].
pub(crate) trait Backend: Database {
    /// How many rows a statement changed (or matched: MySQL's connections report matched
    /// rows, sqlx sets `CLIENT_FOUND_ROWS`).
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

#[cfg(feature = "postgres")]
impl Backend for sqlx::Postgres {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl Backend for sqlx::MySql {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A store's table on its pool: the pool, and the statements the backend wrote for the table.
/// Clones share both.
pub(crate) struct Table<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: Arc<Queries>,
}

impl<DB: Database> Clone for Table<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl<DB: Database> Table<DB> {
    pub(crate) fn new(pool: Pool<DB>, sql: Queries) -> Self {
        Self {
            pool,
            sql: Arc::new(sql),
        }
    }

    /// The `Debug` of the store `name` on this table.
    pub(crate) fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("table", &self.sql.table.name())
            .field("pool", &self.pool)
            .finish()
    }
}

/// What the statements bind and read, on `DB`: the bounds of every generic statement below.
///
/// (Written out where they are needed: bounds on a trait's associated types are not implied
/// where the trait is used.)
impl<DB> Table<DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    i64: for<'a> Encode<'a, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    bool: for<'a> Encode<'a, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Runs `sql` with (namespace, key[, token]) and counts the rows it changed.
    async fn on_key(
        &self,
        sql: &Arc<str>,
        key: &IdempotencyKey,
        token: Option<LeaseToken>,
    ) -> Result<u64, StoreError> {
        let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value());
        if let Some(token) = token {
            query = query.bind(token.to_i64());
        }
        let done = query.execute(&self.pool).await.store()?;
        Ok(DB::rows_affected(&done))
    }

    /// Runs a statement fenced by `token` on the row of `key`: no row changed means the lease
    /// is lost.
    async fn fenced(
        &self,
        sql: &Arc<str>,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<(), StoreError> {
        match self.on_key(sql, key, Some(token)).await? {
            0 => Err(StoreError::LeaseLost),
            _ => Ok(()),
        }
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.renew, lease.key(), lease.token())
            .await
    }

    /// Matched rows, not changed rows (MySQL: sqlx sets `CLIENT_FOUND_ROWS`), so a repeated
    /// commit answers `Ok`.
    pub(crate) async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.commit, lease.key(), lease.token())
            .await
    }

    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.release, lease.key(), lease.token())
            .await
    }

    pub(crate) async fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.describe.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        row.as_ref().map(key_record).transpose()
    }

    /// One row the store cannot read (a key written by hand, or by other code, that is no
    /// valid `IdempotencyKey`) is logged and skipped: it must not hide every other stuck claim.
    pub(crate) async fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> Result<Vec<StuckClaim>, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.stuck.clone()))
            .bind(micros(older_than))
            .fetch_all(&self.pool)
            .await
            .store()?;
        let decode = |row: &DB::Row| {
            stuck_claim(
                row.try_get(0).store()?,
                row.try_get(1).store()?,
                row.try_get(2).store()?,
                row.try_get(3).store()?,
                row.try_get(4).store()?,
            )
        };
        Ok(rows
            .iter()
            .filter_map(|row| match decode(row) {
                Ok(claim) => Some(claim),
                Err(error) => {
                    let (namespace, key) = (row.try_get(0).ok(), row.try_get(1).ok());
                    undecodable_stuck_row(&self.sql.table, namespace, key, &error);
                    None
                }
            })
            .collect())
    }

    pub(crate) async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let changed = match resolution {
            // A new token fences off the old owner, whose late commit must not undo what the
            // person decided.
            Resolution::Done => {
                let done = sqlx::query(AssertSqlSafe(self.sql.resolve_done.clone()))
                    .bind(LeaseToken::generate().to_i64())
                    .bind(key.namespace())
                    .bind(key.value())
                    .execute(&self.pool)
                    .await
                    .store()?;
                DB::rows_affected(&done)
            }
            Resolution::Release => self.on_key(&self.sql.resolve_release, key, None).await?,
        };
        Ok(changed > 0)
    }

    pub(crate) async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
            .bind(micros(older_than))
            .execute(&self.pool)
            .await
            .store()?;
        Ok(DB::rows_affected(&done))
    }

    pub(crate) async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.fenced(&self.sql.versions.renew, lease.entity(), lease.token())
            .await
    }

    pub(crate) async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.fenced(&self.sql.versions.commit, lease.entity(), lease.token())
            .await
    }

    pub(crate) async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.fenced(&self.sql.versions.release, lease.entity(), lease.token())
            .await
    }

    pub(crate) async fn applied_version(
        &self,
        entity: &IdempotencyKey,
    ) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.versions.applied.clone()))
            .bind(entity.namespace())
            .bind(entity.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        match row {
            Some(row) => row.try_get::<Option<i64>, _>(0).store(),
            None => Ok(None),
        }
    }

    pub(crate) async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let sql = match resolution {
            Resolution::Done => &self.sql.versions.resolve_done,
            Resolution::Release => &self.sql.versions.resolve_release,
        };
        Ok(self.on_key(sql, entity, None).await? > 0)
    }

    /// Transactional mode, just before `COMMIT`: whether the transaction on `conn` still
    /// holds the marker of `key` with `token`.
    pub(crate) async fn holds_marker(
        &self,
        conn: &mut DB::Connection,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<bool, StoreError> {
        let found = sqlx::query(AssertSqlSafe(self.sql.tx_check.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .fetch_optional(conn)
            .await
            .store()?;
        Ok(found.is_some())
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
