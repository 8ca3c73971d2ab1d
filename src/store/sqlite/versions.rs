//! The version guard's store on SQLite: [`VersionStore`] for [`SqliteStore`], in the table
//! `<table>_versions`.

use super::SqliteStore;
use crate::store::VersionStore;

impl VersionStore for SqliteStore {
    crate::store::sql::version_forwards!(begin_version);
    crate::store::sql::version_forwards!(shared);
}
