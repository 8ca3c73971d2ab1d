//! [`VersionStore`] for [`AnyStore`]: each method the chosen store's own.

use super::AnyStore;
use crate::key::IdempotencyKey;
use crate::store::{Resolution, Stale, StoreError, VersionClaim, VersionLease, VersionStore};

impl VersionStore for AnyStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        each!(self, s => s.begin_version(entity, version, stale).await)
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.renew_version(lease).await)
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.commit_version(lease).await)
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.release_version(lease).await)
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        each!(self, s => s.applied_version(entity).await)
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.resolve_version(entity, resolution).await)
    }
}
