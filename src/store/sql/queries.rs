//! The statements of one store on one table, made once by the backend and shared by its
//! clones.

use std::sync::Arc;

use super::table::TableName;

/// The statements of one store on one table, made once and shared by its clones.
///
/// Parameters, by position: `claim` as the backend documents; `read` (namespace, key);
/// `tally` ([`TALLY_CHUNK`](super::TALLY_CHUNK) rows of namespace, key, count, microseconds
/// since the last delivery); `renew`, `release` and `give_back` (namespace, key, token); `commit` (the
/// encoded receipt or NULL, namespace, key, token); `describe` and `resolve_release`
/// (namespace, key);
/// `resolve_done` (new token, namespace, key); `stuck` (age in microseconds); `purge` as
/// [`Purge`] says.
pub(crate) struct Queries {
    pub(crate) table: TableName,
    pub(crate) migrate: Arc<str>,
    /// A claim's read of the key's row (namespace, key): `state, token, deliveries,
    /// reclaimed, age_us, idle_us, receipt`. It writes nothing.
    pub(crate) read: Arc<str>,
    /// The upsert that takes a key: inserts it, or takes the row over when it is released or
    /// stale under a reclaiming policy (clearing its receipt), counting the delivery either
    /// way.
    pub(crate) claim: Arc<str>,
    /// Adds the deliveries the tally counted to the rows of up to
    /// [`TALLY_CHUNK`](super::TALLY_CHUNK) keys, in one statement.
    pub(crate) tally: Arc<str>,
    pub(crate) renew: Arc<str>,
    /// Marks the leased row `done` and writes the receipt, unless it is `done` already: a
    /// repeated commit matches the row and keeps what the first one wrote.
    pub(crate) commit: Arc<str>,
    pub(crate) release: Arc<str>,
    /// A release of a claim whose handler never started (namespace, key, token): as
    /// `release`, and the run its claim counted is taken back, once.
    pub(crate) give_back: Arc<str>,
    pub(crate) describe: Arc<str>,
    pub(crate) stuck: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    pub(crate) purge: Purge,
    /// Transactional mode: insert the marker as `done` inside the delivery's transaction
    /// (namespace, key, token); on a conflict, count the delivery and return the row.
    pub(crate) tx_claim: Arc<str>,
    /// Transactional mode, just before `COMMIT`: whether the delivery's transaction still
    /// holds its marker (namespace, key, token). A transaction a failed statement aborted, or
    /// one the database rolled back, does not.
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

/// How a purge walks the table in key order, [`PURGE_BATCH`](super::PURGE_BATCH) keys at a
/// time. A position is a namespace and a key, bound as
/// [`Backend::bind_position`](super::Backend::bind_position) does; the age is microseconds.
pub(crate) enum Purge {
    /// One statement a batch (age, position): takes the next keys after the position, deletes
    /// the settled ones past the age among them, and answers how many it deleted and the
    /// batch's last key; no row once no key is left. The batch is what the statement's
    /// snapshot holds, so a row inserted meanwhile is never deleted by mistake, and a row
    /// expired when the purge began (a retention above zero) is never passed over.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Batch(Arc<str>),
    /// Two statements a batch, for databases whose deletes end a key range where it ends.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    Bounded(Bounded),
}

/// The statements of [`Purge::Bounded`].
pub(crate) struct Bounded {
    /// The batch's last key (position): the `PURGE_BATCH`-th after the position; none
    /// when fewer are left.
    pub(crate) bound: Arc<str>,
    /// Deletes the settled rows past the age after one position, up to another (age,
    /// position, position).
    pub(crate) up_to: Arc<str>,
    /// The same to the end (age, position).
    pub(crate) rest: Arc<str>,
    /// Run on the delete's connection just before it: MySQL's `SET TRANSACTION ISOLATION
    /// LEVEL READ COMMITTED`, under which InnoDB neither waits for nor keeps the locks of
    /// the rows in the range that the delete does not match (in-flight claims,
    /// transactional markers), nor locks the gaps between them.
    pub(crate) before: Option<Arc<str>>,
}
