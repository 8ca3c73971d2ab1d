//! The version guard's store on PostgreSQL: [`VersionStore`] for [`PostgresStore`], in the
//! table `<table>_versions`.

use super::{PostgresStore, is_serialization_failure};
use crate::key::IdempotencyKey;
use crate::store::{Stale, StoreError, VersionClaim, VersionStore};

impl VersionStore for PostgresStore {
    /// The upsert of the module docs; tried once more after a serialization failure.
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let table = &self.table;
        (table.begin_version_upsert(entity, version, stale, is_serialization_failure)).await
    }

    crate::store::sql::version_forwards!(
        renew_version,
        commit_version,
        release_version,
        applied_version,
        resolve_version
    );
}
