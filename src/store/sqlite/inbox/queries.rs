//! The SQL of the SQLite store's inbox: its table, and every statement on it, written once per
//! table name.

use std::sync::Arc;

use super::super::queries::NOW_US;
use crate::store::sql::TableName;

/// The inbox's statements on one table, made once and shared by the store's clones.
///
/// Parameters, by position: a key is (namespace, key) first, a lease (namespace, key, token);
/// durations are whole microseconds.
pub(in crate::store::sqlite) struct InboxQueries {
    /// Creates the table and its indexes (`IF NOT EXISTS`).
    pub(in crate::store::sqlite) migrate: Arc<str>,
    /// (namespace, key, request): inserts a queued entry, or nothing if the key has one.
    pub(crate) enqueue: Arc<str>,
    /// (namespace, key): the entry's state.
    pub(super) state: Arc<str>,
    /// (stale limit, max attempts): running entries whose handler started, not renewed within
    /// the limit, whose attempts ran out become dead, the crash counted.
    pub(super) expire: Arc<str>,
    /// (limit, whether the policy reclaims, stale limit, max attempts): the rowids of the
    /// oldest due entries, oldest first: queued ones, and running ones not renewed within the
    /// limit (under reclaim, all; under hold, those never started).
    pub(super) pick: Arc<str>,
    /// (rowid, token): leases one picked entry, returning `namespace, key, token, attempts,
    /// crashes, reclaimed, due_at, request, history, received_at`.
    pub(super) lease: Arc<str>,
    /// (lease): the entry's handler starts, its attempt counted once.
    pub(super) start: Arc<str>,
    /// (token): the entry leased under it queued again, due now, its attempt taken back if
    /// it started.
    pub(super) untake: Arc<str>,
    /// Adds the `started` column to an earlier release's table.
    pub(in crate::store::sqlite) add_started: Arc<str>,
    /// (lease): moves the renewal time.
    pub(super) renew: Arc<str>,
    /// (lease, `done` or `dead`, history).
    pub(super) settle: Arc<str>,
    /// (lease, microseconds until due, history): queued again, due later.
    pub(super) retry_later: Arc<str>,
    /// (lease): queued again, due now, the attempt taken back if it started.
    pub(super) give_back: Arc<str>,
    /// (namespace or NULL, four states, limit): [`entry_columns`], the oldest first.
    pub(super) entries: Arc<str>,
    /// (namespace, key): [`entry_columns`].
    pub(super) entry: Arc<str>,
    /// (namespace, key): the stored request, NULL once retention deleted it.
    pub(super) request: Arc<str>,
    /// (namespace, key, microseconds without a renewal or NULL, force): a queued or dead entry
    /// due now, a dead one's counts started over; a running one when forced, or not renewed
    /// for that long.
    pub(super) retry_now: Arc<str>,
    /// (namespace): `retry_now` for every dead entry of the namespace.
    pub(super) retry_dead: Arc<str>,
    /// (namespace, key, microseconds without a renewal or NULL, force): a queued or dead entry
    /// done; a running one as for `retry_now`.
    pub(super) discard: Arc<str>,
    /// (namespace or NULL): queued, running, dead, and microseconds since the oldest due
    /// entry's due time (NULL if none is due).
    pub(super) stats: Arc<str>,
    /// (age, limit): deletes the requests of done entries settled at least `age` ago.
    pub(super) purge_requests: Arc<str>,
    /// (age, limit): deletes done entries settled at least `age` ago.
    pub(super) purge_entries: Arc<str>,
}

/// What `entries` and `entry` read of an entry: `namespace, key, state, attempts, crashes`,
/// the microseconds since it was received, until it is due and since its last renewal, whether
/// the request is kept, the history.
fn entry_columns() -> String {
    format!(
        r#"namespace, "key", state, attempts, crashes,
    {NOW_US} - received_at, due_at - {NOW_US}, {NOW_US} - renewed_at, request IS NOT NULL,
    history"#
    )
}

/// The statements of the inbox of the claims table `table`, in `<table>_inbox`.
pub(in crate::store::sqlite) fn inbox_queries(table: &TableName) -> InboxQueries {
    let inbox = table.inbox();
    let t = inbox.quoted('"');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace   TEXT    NOT NULL,
    "key"       TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done', 'dead')),
    token       INTEGER,
    attempts    INTEGER NOT NULL DEFAULT 0,
    crashes     INTEGER NOT NULL DEFAULT 0,
    reclaimed   INTEGER NOT NULL DEFAULT 0,
    started     INTEGER NOT NULL DEFAULT 1,
    received_at INTEGER NOT NULL,
    due_at      INTEGER NOT NULL,
    renewed_at  INTEGER NOT NULL,
    settled_at  INTEGER,
    request     BLOB,
    history     BLOB,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX IF NOT EXISTS {due} ON {t} (due_at) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS {running} ON {t} (renewed_at) WHERE state = 'running';"#,
        due = table.inbox_due_index('"'),
        running = table.inbox_running_index('"'),
    );
    let now = NOW_US;
    let enqueue = format!(
        r#"INSERT INTO {t} (namespace, "key", state, received_at, due_at, renewed_at, request)
VALUES (?1, ?2, 'queued', {now}, {now}, {now}, ?3)
ON CONFLICT (namespace, "key") DO NOTHING"#
    );
    let key = r#"namespace = ?1 AND "key" = ?2"#;
    let state = format!("SELECT state FROM {t} WHERE {key}");
    // Not renewed for the stale limit, bound at `?n`.
    let stale = |n: u8| format!("renewed_at <= {now} - ?{n}");
    let expire = format!(
        "UPDATE {t} SET state = 'dead', token = NULL, crashes = crashes + 1, settled_at = {now} \
         WHERE state = 'running' AND started AND {} AND attempts >= ?2",
        stale(1)
    );
    // Each branch walks its own partial index.
    let pick = format!(
        r#"SELECT id FROM (
    SELECT id, due_at FROM (
        SELECT rowid AS id, due_at FROM {t}
        WHERE state = 'queued' AND due_at <= {now} ORDER BY due_at LIMIT ?1)
    UNION ALL
    SELECT id, due_at FROM (
        SELECT rowid AS id, due_at FROM {t}
        WHERE state = 'running' AND (?2 OR NOT started) AND {stale}
            AND (NOT started OR attempts < ?4)
        ORDER BY due_at LIMIT ?1)
) ORDER BY due_at LIMIT ?1"#,
        stale = stale(3),
    );
    // The SET expressions see the row as it was: a running row whose handler started is one
    // taken over after a crash.
    let lease = format!(
        r#"UPDATE {t} SET state = 'running', token = ?2,
    crashes = crashes + (state = 'running' AND started),
    reclaimed = (state = 'running' AND started), started = 0, renewed_at = {now}
WHERE rowid = ?1
RETURNING namespace, "key", token, attempts, crashes, reclaimed, due_at, request, history,
    received_at"#
    );
    let add_started = format!("ALTER TABLE {t} ADD COLUMN started INTEGER NOT NULL DEFAULT 1");
    let held = format!(r#"{key} AND token = ?3 AND state = 'running'"#);
    let renew = format!("UPDATE {t} SET renewed_at = {now} WHERE {held}");
    let start =
        format!("UPDATE {t} SET attempts = attempts + (NOT started), started = 1 WHERE {held}");
    let untake = format!(
        "UPDATE {t} SET state = 'queued', token = NULL, due_at = {now}, \
         attempts = max(attempts - started, 0), started = 0 \
         WHERE state = 'running' AND token = ?1"
    );
    let settle = format!(
        "UPDATE {t} SET state = ?4, token = NULL, started = 0, settled_at = {now}, history = ?5 \
         WHERE {held}"
    );
    let retry_later = format!(
        "UPDATE {t} SET state = 'queued', token = NULL, started = 0, due_at = {now} + ?4, \
         history = ?5 WHERE {held}"
    );
    let give_back = format!(
        "UPDATE {t} SET state = 'queued', token = NULL, due_at = {now}, \
         attempts = max(attempts - started, 0), started = 0 WHERE {held}"
    );
    let columns = entry_columns();
    let entries = format!(
        r#"SELECT {columns} FROM {t}
WHERE (?1 IS NULL OR namespace = ?1) AND state IN (?2, ?3, ?4, ?5)
ORDER BY received_at, namespace, "key" LIMIT ?6"#
    );
    let entry = format!("SELECT {columns} FROM {t} WHERE {key}");
    let request = format!("SELECT request FROM {t} WHERE {key}");
    // Every SET expression sees the row as it was.
    let retry = format!(
        "UPDATE {t} SET state = 'queued', due_at = {now}, settled_at = NULL, token = NULL, \
         started = 0, attempts = CASE WHEN state = 'dead' THEN 0 ELSE attempts END, \
         crashes = CASE WHEN state = 'dead' THEN 0 ELSE crashes END"
    );
    let by_hand = format!(
        "{key} AND (state IN ('queued', 'dead') OR state = 'running' AND (?4 OR {}))",
        stale(3)
    );
    let retry_now = format!("{retry} WHERE {by_hand}");
    let retry_dead = format!("{retry} WHERE namespace = ?1 AND state = 'dead'");
    let discard = format!(
        "UPDATE {t} SET state = 'done', token = NULL, started = 0, settled_at = {now} \
         WHERE {by_hand}"
    );
    let stats = format!(
        r#"SELECT coalesce(sum(state = 'queued'), 0), coalesce(sum(state = 'running'), 0),
    coalesce(sum(state = 'dead'), 0),
    {now} - min(CASE WHEN state = 'queued' AND due_at <= {now} THEN due_at END)
FROM {t} WHERE ?1 IS NULL OR namespace = ?1"#
    );
    let settled = format!("state = 'done' AND settled_at <= {now} - ?1");
    let purge_requests = format!(
        "UPDATE {t} SET request = NULL WHERE rowid IN \
         (SELECT rowid FROM {t} WHERE {settled} AND request IS NOT NULL LIMIT ?2)"
    );
    let purge_entries =
        format!("DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE {settled} LIMIT ?2)");
    InboxQueries {
        migrate: migrate.into(),
        enqueue: enqueue.into(),
        state: state.into(),
        expire: expire.into(),
        pick: pick.into(),
        lease: lease.into(),
        start: start.into(),
        untake: untake.into(),
        add_started: add_started.into(),
        renew: renew.into(),
        settle: settle.into(),
        retry_later: retry_later.into(),
        give_back: give_back.into(),
        entries: entries.into(),
        entry: entry.into(),
        request: request.into(),
        retry_now: retry_now.into(),
        retry_dead: retry_dead.into(),
        discard: discard.into(),
        stats: stats.into(),
        purge_requests: purge_requests.into(),
        purge_entries: purge_entries.into(),
    }
}
