//! The version guard's store on SQLite: [`VersionStore`] for [`SqliteStore`], in the table
//! `<table>_versions`.

use super::{SqliteStore, is_serialization_failure};
use crate::key::IdempotencyKey;
use crate::store::{Stale, StoreError, VersionClaim, VersionStore};

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

    crate::store::sql::version_forwards!(
        renew_version,
        commit_version,
        release_version,
        applied_version,
        resolve_version
    );
}
