//! The version guard's store on SQLite: [`VersionStore`] for [`SqliteStore`], in the table
//! `<table>_versions`.

use super::{SqliteStore, is_serialization_failure};
use crate::key::IdempotencyKey;
use crate::store::{Resolution, Stale, StoreError, VersionClaim, VersionLease, VersionStore};

impl VersionStore for SqliteStore {
    /// The upsert of the module docs.
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let table = &self.table;
        (table.begin_version_upsert(entity, version, stale, is_serialization_failure)).await
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.table.renew_version(lease).await
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.table.commit_version(lease).await
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.table.release_version(lease).await
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        self.table.applied_version(entity).await
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        how: Resolution,
    ) -> Result<bool, StoreError> {
        self.table.resolve_version(entity, how).await
    }
}
