//! What PostgreSQL and SQLite share beyond [`Table`]'s statements: both claim with `INSERT …
//! ON CONFLICT … RETURNING`, so their claim, version claim, transactional marker and version
//! advance are one round trip each, run the same way.

use sqlx::{AssertSqlSafe, Row as _};

use super::version_row;
use super::{
    ClaimRow, NEVER_STALE, ResultExt as _, micros, retry_serialization_failure, returned,
    statements, version_claim,
};
use crate::key::IdempotencyKey;
use crate::store::{Advance, Claim, LeaseToken, Stale, StalePolicy, StoreError, VersionClaim};

/// Whether an error is of a kind a backend names: a lock timeout.
pub(crate) type Is = fn(&sqlx::Error) -> bool;

statements! {
    /// The claim: the upsert writes `token` if and only if it inserts the row or takes it
    /// over, and returns the row either way. Parameters: namespace, key, token, whether the
    /// policy reclaims, the stale limit in microseconds. On an error the caller gives back
    /// whatever the statement may have granted to `token`. (SQLite runs the same statement in
    /// its batches of writes.)
    #[cfg(feature = "postgres")]
    pub(crate) async fn claim_upsert(
        &self,
        key: &IdempotencyKey,
        token: LeaseToken,
        stale: Stale,
    ) -> Result<Claim, StoreError> {
        let upsert = || {
            sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .bind(token.to_i64())
                .bind(stale.policy() == StalePolicy::Reclaim)
                .bind(micros(stale.after()))
                .fetch_all(&self.pool)
        };
        let turn = self.writer.turn().await;
        let rows = retry_serialization_failure("claim", DB::is_serialization_failure, upsert).await;
        drop(turn);
        rows.and_then(|rows| ClaimRow::read(&returned(rows)?)?.into_claim(key, token, stale))
    }

    /// The version claim, the same way. Parameters: namespace, entity, version, token,
    /// whether the policy reclaims, the stale limit in microseconds.
    pub(crate) async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let token = LeaseToken::generate();
        let upsert = || {
            sqlx::query(AssertSqlSafe(self.sql.versions.begin.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .bind(version)
                .bind(token.to_i64())
                .bind(stale.policy() == StalePolicy::Reclaim)
                .bind(micros(stale.after()))
                .fetch_all(&self.pool)
        };
        let what = "version claim";
        let turn = self.writer.turn().await;
        let rows = retry_serialization_failure(what, DB::is_serialization_failure, upsert).await;
        drop(turn);
        version_claim(
            entity,
            version,
            token,
            stale,
            version_row(&returned(rows?)?)?,
        )
        .ok_or_else(|| StoreError::backend("the versions row was left inconsistent"))
    }

    /// Inserts the transactional marker of `key` as `done` in the transaction on `tx`, or
    /// counts the delivery on the row that exists. `Ok(None)`: the insert waited past the
    /// transaction's lock timeout, as `is_lock_timeout` tells. The claim is what the row says,
    /// with the marker's token.
    pub(crate) async fn insert_marker(
        &self,
        tx: &mut DB::Connection,
        key: &IdempotencyKey,
        is_lock_timeout: Is,
    ) -> Result<Option<Claim>, StoreError> {
        let token = LeaseToken::generate();
        let row = sqlx::query(AssertSqlSafe(self.sql.tx_claim.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .fetch_one(tx)
            .await;
        match row {
            Ok(row) => ClaimRow::read(&row)?
                .into_claim(key, token, NEVER_STALE)
                .map(Some),
            Err(e) if is_lock_timeout(&e) => Ok(None),
            Err(e) => Err(StoreError::backend(e)),
        }
    }

    /// The version guard's advance in the caller's transaction: one statement when the
    /// version is newer or equal (an upsert whose `WHERE` keeps a row at a newer version as it
    /// is, and locks it either way); a second reads the applied version when not.
    pub(crate) async fn advance_upsert(
        &self,
        conn: &mut DB::Connection,
        entity: &IdempotencyKey,
        version: i64,
    ) -> Result<Advance, StoreError> {
        let moved = sqlx::query(AssertSqlSafe(self.sql.versions.advance.clone()))
            .bind(entity.namespace())
            .bind(entity.value())
            .bind(version)
            .fetch_optional(&mut *conn)
            .await
            .store()?;
        if moved.is_some() {
            return Ok(Advance::Applied);
        }
        let row = sqlx::query(AssertSqlSafe(self.sql.versions.applied.clone()))
            .bind(entity.namespace())
            .bind(entity.value())
            .fetch_one(&mut *conn)
            .await
            .store()?;
        let applied: Option<i64> = row.try_get(0).store()?;
        let applied = applied.ok_or_else(|| {
            StoreError::backend("the versions row kept no applied version yet refused this one")
        })?;
        Ok(Advance::Outdated { applied })
    }
}
