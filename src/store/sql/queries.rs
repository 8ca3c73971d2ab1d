//! The statements of one store on one table, made once by the backend and shared by its
//! clones.

use std::sync::Arc;

use super::table::TableName;

/// A set of statements from the local strings named after its fields, each made an
/// `Arc<str>`, then the fields given as they are (written in order: a field that borrows a
/// local goes before the one that moves it).
macro_rules! statement_set {
    ($set:ident { $($sql:ident),+ $(,)? ; $($field:ident $(: $value:expr)?),* $(,)? }) => {
        $set { $($sql: $sql.into(),)+ $($field $(: $value)?,)* }
    };
}
pub(crate) use statement_set;

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
    /// The inbox.
    pub(crate) inbox: InboxQueries,
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

/// The inbox's statements that every SQL store runs the same way, on `<table>_inbox`: each
/// backend writes them in its own dialect, and [`Table`](super::Table) binds them in one order
/// for all (`sql/inbox.rs`). A backend's enqueue and take, which differ, are its own.
///
/// Parameters, by position: a key is (namespace, key), a lease (namespace, key, token);
/// durations are whole microseconds; what an operator's action may take of a running entry is
/// (force, microseconds without a renewal or NULL).
pub(crate) struct InboxQueries {
    /// Creates the table and its indexes (`IF NOT EXISTS`).
    pub(crate) migrate: Arc<str>,
    /// Adds the `started` column to an earlier release's table, whose running entries started.
    pub(crate) add_started: Arc<str>,
    /// (key): the entry's state.
    pub(crate) state: Arc<str>,
    /// (lease): moves the renewal time.
    pub(crate) renew: Arc<str>,
    /// (state, microseconds until due or NULL, whether a started attempt is taken back, the
    /// encoded history or NULL, lease): settles a running entry; NULL leaves the due time or
    /// the history as they are. A settled entry is not started, and its token is cleared.
    pub(crate) settle: Arc<str>,
    /// (lease): the running entry's handler starts, its attempt counted once.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) start: Arc<str>,
    /// (token): the running entry leased under it queued again, due now, its attempt taken
    /// back if it started.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) untake: Arc<str>,
    /// (namespace or NULL, namespace or NULL, whether queued, running, done and dead entries
    /// are wanted, four flags, limit): the entries' [columns](super::inbox_entry), the oldest
    /// first.
    pub(crate) entries: Arc<str>,
    /// (key): the entry's [columns](super::inbox_entry).
    pub(crate) entry: Arc<str>,
    /// (key): the stored request, NULL once retention deleted it.
    pub(crate) request: Arc<str>,
    /// (key, force, microseconds or NULL): a queued or dead entry due now, a dead one's counts
    /// started over; a running one when forced, or not renewed for that long.
    pub(crate) retry_now: Arc<str>,
    /// (namespace): `retry_now` for every dead entry of the namespace.
    pub(crate) retry_dead: Arc<str>,
    /// (key, force, microseconds or NULL): a queued or dead entry done without running; a
    /// running one as for `retry_now`.
    pub(crate) discard: Arc<str>,
    /// (namespace or NULL, namespace or NULL): one row, the queued, running and dead entries
    /// counted, and the microseconds since the oldest due entry fell due (NULL if none).
    pub(crate) stats: Arc<str>,
    /// How retention deletes done entries' requests, then the entries.
    pub(crate) purge: InboxPurge,
}

/// How an inbox's retention deletes, at most a limit of rows a statement.
pub(crate) enum InboxPurge {
    /// One statement each (age, limit): the requests of done entries settled at least the
    /// age ago, then such entries.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    Direct {
        requests: Arc<str>,
        entries: Arc<str>,
    },
    /// Each part in a transaction of its own, `before` run first on its connection: a pick of
    /// the rows (age, age, limit) that skips those another transaction holds, then a statement
    /// a picked row (key).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Picked {
        before: Arc<str>,
        pick_requests: Arc<str>,
        request_of: Arc<str>,
        pick_entries: Arc<str>,
        entry_of: Arc<str>,
    },
}
