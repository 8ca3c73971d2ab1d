//! The version guard's statements that every SQL backend runs the same way: its fenced
//! writes, the applied version and an operator's resolution. The version claim itself is the
//! backend's (or, on PostgreSQL and SQLite, `upsert.rs`).

use sqlx::{AssertSqlSafe, Row as _};

use super::{ResultExt as _, statements};
use crate::key::IdempotencyKey;
use crate::store::{Resolution, StoreError, VersionLease};

statements! {
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
}
