//! The version guard's store on MySQL and on MariaDB: [`VersionStore`] for [`MySqlStore`], in
//! the table `<table>_versions`. A version's claim is one upsert with `RETURNING` on MariaDB
//! 10.5 and later, an upsert then a read (unless it inserted) on MySQL and on older MariaDB.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

use super::{MySqlFlavor, MySqlStore};
use crate::key::IdempotencyKey;
use crate::store::sql::{self, ResultExt as _};
use crate::store::{
    LeaseToken, Stale, StalePolicy, StoreError, VersionClaim, VersionLease, VersionStore,
};

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

    /// MariaDB 10.5 and later: one upsert of the versions row, returning it.
    async fn begin_version_returning(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let token = LeaseToken::generate();
        let sql = &self.claims.version_returning;
        let row = self
            .version_upsert(sql, entity, version, token, stale)
            .fetch_one(&self.table.pool)
            .await
            .store()?;
        sql::version_claim(entity, version, token, stale, sql::version_row(&row)?)
            .ok_or_else(|| StoreError::backend("the versions row was left inconsistent"))
    }

    /// MySQL and older MariaDB: the upsert, and a read of the row unless it inserted.
    async fn begin_version_and_read(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        // The row may change between the two statements (a pending version committed or
        // released): when what it says no longer explains why ours was not taken, start over.
        for _ in 0..3 {
            let token = LeaseToken::generate();
            let upserted = self
                .version_upsert(
                    &self.table.sql.versions.begin,
                    entity,
                    version,
                    token,
                    stale,
                )
                .execute(&self.table.pool)
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
                .fetch_one(&self.table.pool)
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
}

impl VersionStore for MySqlStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        match self.flavor().await? {
            MySqlFlavor::MariaDb => self.begin_version_returning(entity, version, stale).await,
            MySqlFlavor::MySql => self.begin_version_and_read(entity, version, stale).await,
        }
    }

    crate::store::sql::version_forwards!(shared);
}
