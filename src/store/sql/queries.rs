//! The statements of one store on one table, made once by the backend and shared by its
//! clones.

use std::sync::Arc;

use super::table::TableName;

/// The statements of one store on one table, made once and shared by its clones.
///
/// Parameters, by position: `claim` as the backend documents; `renew`, `commit` and
/// `release` (namespace, key, token); `describe` and `resolve_release` (namespace, key);
/// `resolve_done` (new token, namespace, key); `stuck` and `purge` (age in microseconds).
pub(crate) struct Queries {
    pub(crate) table: TableName,
    pub(crate) migrate: Arc<str>,
    pub(crate) claim: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) commit: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) describe: Arc<str>,
    pub(crate) stuck: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    pub(crate) purge: Arc<str>,
    /// Transactional mode: insert the marker as `done` inside the delivery's transaction
    /// (namespace, key, token); on a conflict, count the delivery and return the row.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) tx_claim: Arc<str>,
    /// Transactional mode, just before `COMMIT`: whether the delivery's transaction still
    /// holds its marker (namespace, key, token). A transaction a failed statement aborted, or
    /// one the database rolled back, does not.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) tx_check: Arc<str>,
    /// The entity versions of the version guard.
    pub(crate) versions: VersionQueries,
}

/// The statements on the versions table, shared by the SQL stores.
///
/// Parameters, by position: `begin` and `advance` as the backend documents; `commit` and
/// `release` (namespace, entity, token); `applied`, `resolve_done` and `resolve_release`
/// (namespace, entity).
pub(crate) struct VersionQueries {
    /// Creates the table (`IF NOT EXISTS`).
    pub(crate) migrate: Arc<str>,
    /// Moves the pending version's heartbeat (`pending_since`) if the token holds.
    pub(crate) renew: Arc<str>,
    /// Makes the version pending if it is not older and nothing else is pending (or that is stale
    /// and the policy reclaims), counts the delivery, and (but on MySQL) returns the row.
    pub(crate) begin: Arc<str>,
    pub(crate) commit: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) applied: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    /// Moves the applied version inside the caller's transaction, unless it is older.
    pub(crate) advance: Arc<str>,
}
