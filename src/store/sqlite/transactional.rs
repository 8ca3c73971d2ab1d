//! Transactional mode and the version guard's advance on SQLite: the marker waits for the
//! write lock under the lock timeout, and the connection's own busy timeout is put back.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::key::IdempotencyKey;
use crate::store::sql::ResultExt as _;
use crate::store::{
    Advance, AdvanceVersion, Begin, LeaseToken, StoreError, TransactionalStore, begun,
};

impl TransactionalStore for SqliteStore {
    type Database = Sqlite;

    /// `BEGIN` (deferred: it takes no lock yet, so it cannot wait), then the connection's busy
    /// timeout read and set to the lock timeout. The marker's insert, the transaction's first
    /// statement on the database, waits for the write lock under it; then the connection's
    /// own busy timeout is put back, for the handler's statements and for the pool.
    async fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: Duration,
    ) -> Result<Begin<Sqlite>, StoreError> {
        let ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        let mut tx = self.table.pool.begin().await.store()?;
        let previous: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *tx)
            .await
            .store()?;
        set_busy_timeout(&mut tx, ms).await?;
        let marked = self
            .table
            .insert_marker(&mut tx, key, is_lock_timeout)
            .await;
        let restored = set_busy_timeout(&mut tx, previous).await;
        let marked = marked?;
        restored?;
        match marked {
            Some(claim) => begun(claim, tx).await,
            None => Ok(Begin::lock_timed_out(lock_timeout)),
        }
    }

    crate::store::sql::to_table!(
        holds_marker(conn: &mut SqliteConnection, key: &IdempotencyKey, token: LeaseToken)
        -> Result<bool, StoreError> => holds_marker
    );
}

impl AdvanceVersion for SqliteStore {
    crate::store::sql::to_table!(
        /// One statement when the version is newer or equal, a second when it is outdated (see
        /// the [module docs](crate::store::sqlite#entity-versions-the-version-guard)).
        advance_version(conn: &mut SqliteConnection, entity: &IdempotencyKey, version: i64)
        -> Result<Advance, StoreError> => advance_upsert
    );
}

/// Sets the connection's busy timeout, in milliseconds.
async fn set_busy_timeout(
    conn: &mut SqliteConnection,
    ms: impl std::fmt::Display,
) -> Result<(), StoreError> {
    sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA busy_timeout = {ms}")))
        .execute(conn)
        .await
        .store()
        .map(drop)
}

/// The write lock was not free within the busy timeout.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    super::is_busy(e)
}
