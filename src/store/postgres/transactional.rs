//! Transactional mode and the version guard's advance on PostgreSQL: the delivery's
//! transaction begins with its lock timeout, and ends it too.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use super::PostgresStore;
use crate::key::IdempotencyKey;
use crate::store::begun;
use crate::store::sql::ResultExt as _;
use crate::store::{Advance, AdvanceVersion, Begin, LeaseToken, StoreError, TransactionalStore};

impl TransactionalStore for PostgresStore {
    type Database = Postgres;

    /// `BEGIN; SET LOCAL lock_timeout = <ms>` (one round trip), then the marker's insert. The
    /// lock timeout stays in force for the handler's own statements in the transaction, and
    /// ends with it: the pooled connection keeps its own.
    async fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: Duration,
    ) -> Result<Begin<Postgres>, StoreError> {
        let ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        let begin = format!("BEGIN; SET LOCAL lock_timeout = {ms}");
        let mut tx = self
            .table
            .pool
            .begin_with(AssertSqlSafe(begin))
            .await
            .store()?;
        match self
            .table
            .insert_marker(&mut tx, key, is_lock_timeout)
            .await?
        {
            Some(claim) => begun(claim, tx).await,
            None => Ok(Begin::lock_timed_out(lock_timeout)),
        }
    }

    crate::store::sql::to_table!(
        holds_marker(conn: &mut PgConnection, key: &IdempotencyKey, token: LeaseToken)
        -> Result<bool, StoreError> => holds_marker
    );
}

impl AdvanceVersion for PostgresStore {
    crate::store::sql::to_table!(
        /// One statement when the version is newer or equal, a second when it is outdated (see
        /// the [module docs](crate::store::postgres#entity-versions-the-version-guard)).
        advance_version(conn: &mut PgConnection, entity: &IdempotencyKey, version: i64)
        -> Result<Advance, StoreError> => advance_upsert
    );
}

/// 55P03 lock_not_available: the first delivery's transaction is still open.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
}
