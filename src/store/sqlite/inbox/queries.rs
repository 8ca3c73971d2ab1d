//! The SQL of the SQLite store's inbox, written once per table name: the statements every SQL
//! store runs the same way ([`InboxQueries`]), and SQLite's own ([`Own`]).

use std::sync::Arc;

use super::super::queries::NOW_US;
use crate::store::sql::{InboxPurge, InboxQueries, TableName};

/// The key's row: `?1` namespace, `?2` key.
const KEY: &str = r#"namespace = ?1 AND "key" = ?2"#;

/// The inbox's statements that no other store runs, made once and shared by the store's
/// clones. Parameters, by position, as each field says; durations are whole microseconds.
pub(in crate::store::sqlite) struct Own {
    /// (namespace, key, request): inserts a queued entry, or nothing if the key has one.
    pub(crate) enqueue: Arc<str>,
    /// (stale limit, max attempts): running entries whose handler started, not renewed within
    /// the limit, whose attempts ran out become dead, the crash counted.
    pub(super) expire: Arc<str>,
    /// (limit, whether the policy reclaims, stale limit, max attempts): the rowids of the
    /// oldest due entries, oldest first: queued ones, and running ones not renewed within the
    /// limit (under reclaim, all; under hold, those never started).
    pub(super) pick: Arc<str>,
    /// (rowid, token): leases one picked entry, returning what a take answers of it.
    pub(super) lease: Arc<str>,
}

/// Not renewed for the stale limit, bound at `?n`.
fn stale(n: u8) -> String {
    format!("renewed_at <= {NOW_US} - ?{n}")
}

/// The statements every SQL store runs the same way, in SQLite's words, on `<table>_inbox`.
pub(in crate::store::sqlite) fn shared(table: &TableName) -> InboxQueries {
    let inbox = table.inbox();
    let t = inbox.quoted('"');
    let now = NOW_US;
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
    let lease = format!("{KEY} AND token = ?3 AND state = 'running'");
    // ?1 state, ?2 microseconds until due or NULL, ?3 whether a started attempt is taken back,
    // ?4 history or NULL, ?5 namespace, ?6 key, ?7 token. Every SET expression sees the row as
    // it was.
    let settle = format!(
        r#"UPDATE {t} SET state = ?1, token = NULL, started = 0,
    settled_at = CASE WHEN ?1 IN ('done', 'dead') THEN {now} ELSE settled_at END,
    due_at = CASE WHEN ?2 IS NULL THEN due_at ELSE {now} + ?2 END,
    attempts = max(attempts - (?3 AND started), 0), history = coalesce(?4, history)
WHERE namespace = ?5 AND "key" = ?6 AND token = ?7 AND state = 'running'"#
    );
    let columns = format!(
        r#"namespace, "key", state, attempts, crashes, {now} - received_at,
    CASE WHEN state = 'queued' THEN due_at - {now} END,
    CASE WHEN state = 'running' THEN {now} - renewed_at END, request IS NOT NULL, history"#
    );
    let of_namespace = "(?1 IS NULL OR namespace = ?2)";
    let retry = format!(
        "UPDATE {t} SET state = 'queued', due_at = {now}, settled_at = NULL, token = NULL, \
         started = 0, attempts = CASE WHEN state = 'dead' THEN 0 ELSE attempts END, \
         crashes = CASE WHEN state = 'dead' THEN 0 ELSE crashes END"
    );
    let by_hand = format!(
        "{KEY} AND (state IN ('queued', 'dead') OR state = 'running' AND (?3 OR {}))",
        stale(4)
    );
    let settled = format!("state = 'done' AND settled_at <= {now} - ?1");
    InboxQueries {
        migrate: migrate.into(),
        add_started: format!("ALTER TABLE {t} ADD COLUMN started INTEGER NOT NULL DEFAULT 1")
            .into(),
        state: format!("SELECT state FROM {t} WHERE {KEY}").into(),
        renew: format!("UPDATE {t} SET renewed_at = {now} WHERE {lease}").into(),
        settle: settle.into(),
        start: format!(
            "UPDATE {t} SET attempts = attempts + (NOT started), started = 1 WHERE {lease}"
        )
        .into(),
        untake: format!(
            "UPDATE {t} SET state = 'queued', token = NULL, due_at = {now}, \
             attempts = max(attempts - started, 0), started = 0 \
             WHERE state = 'running' AND token = ?1"
        )
        .into(),
        entries: format!(
            r#"SELECT {columns} FROM {t}
WHERE {of_namespace} AND ((state = 'queued' AND ?3) OR (state = 'running' AND ?4)
    OR (state = 'done' AND ?5) OR (state = 'dead' AND ?6))
ORDER BY received_at, namespace, "key" LIMIT ?7"#
        )
        .into(),
        entry: format!("SELECT {columns} FROM {t} WHERE {KEY}").into(),
        request: format!("SELECT request FROM {t} WHERE {KEY}").into(),
        retry_now: format!("{retry} WHERE {by_hand}").into(),
        retry_dead: format!("{retry} WHERE namespace = ?1 AND state = 'dead'").into(),
        discard: format!(
            "UPDATE {t} SET state = 'done', token = NULL, started = 0, settled_at = {now} \
             WHERE {by_hand}"
        )
        .into(),
        stats: format!(
            r#"SELECT coalesce(sum(state = 'queued'), 0), coalesce(sum(state = 'running'), 0),
    coalesce(sum(state = 'dead'), 0),
    {now} - min(CASE WHEN state = 'queued' AND due_at <= {now} THEN due_at END)
FROM {t} WHERE {of_namespace}"#
        )
        .into(),
        purge: InboxPurge::Direct {
            requests: format!(
                "UPDATE {t} SET request = NULL WHERE rowid IN \
                 (SELECT rowid FROM {t} WHERE {settled} AND request IS NOT NULL LIMIT ?2)"
            )
            .into(),
            entries: format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE {settled} LIMIT ?2)"
            )
            .into(),
        },
    }
}

/// SQLite's own statements of the inbox of the claims table `table`.
pub(in crate::store::sqlite) fn own(table: &TableName) -> Own {
    let t = table.inbox().quoted('"');
    let now = NOW_US;
    Own {
        enqueue: format!(
            r#"INSERT INTO {t} (namespace, "key", state, received_at, due_at, renewed_at, request)
VALUES (?1, ?2, 'queued', {now}, {now}, {now}, ?3)
ON CONFLICT (namespace, "key") DO NOTHING"#
        )
        .into(),
        expire: format!(
            "UPDATE {t} SET state = 'dead', token = NULL, crashes = crashes + 1, \
             settled_at = {now} WHERE state = 'running' AND started AND {} AND attempts >= ?2",
            stale(1)
        )
        .into(),
        // Each branch walks its own partial index.
        pick: format!(
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
        )
        .into(),
        // The SET expressions see the row as it was: a running row whose handler started is
        // one taken over after a crash.
        lease: format!(
            r#"UPDATE {t} SET state = 'running', token = ?2,
    crashes = crashes + (state = 'running' AND started),
    reclaimed = (state = 'running' AND started), started = 0, renewed_at = {now}
WHERE rowid = ?1
RETURNING namespace, "key", token, attempts, crashes, reclaimed, request, history,
    received_at"#
        )
        .into(),
    }
}
