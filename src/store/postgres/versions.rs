//! The version guard's store on PostgreSQL: [`VersionStore`] for [`PostgresStore`], in the
//! table `<table>_versions`.

use super::PostgresStore;
use crate::store::VersionStore;

impl VersionStore for PostgresStore {
    crate::store::sql::version_forwards!(begin_version);
    crate::store::sql::version_forwards!(shared);
}
