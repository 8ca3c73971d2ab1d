//! The SQL of the inbox on MySQL and MariaDB, written once per table name: the statements
//! every SQL store runs the same way ([`InboxQueries`]), and MySQL's own ([`Own`]).

use std::sync::Arc;

use crate::store::sql::{InboxPurge, InboxQueries, TableName};

/// The server's clock.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The key's row: (namespace, key).
const KEY: &str = "namespace = ? AND `key` = ?";

/// The columns a worker's take reads of each entry it locks: the key, the state (a running one
/// whose handler started is a crash), the counts, the stored request and history, the due time
/// as a number (microseconds since 2000, in the table's own time: no time zone is applied), to
/// merge the queued and the stale entries in due order, whether it started, and when it was
/// received (microseconds since the Unix epoch; the table's times are UTC).
const TAKE_COLUMNS: &str = "namespace, `key`, state, attempts, crashes, request, history, \
     TIMESTAMPDIFF(MICROSECOND, '2000-01-01 00:00:00', due_at) AS due_us, started, \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', received_at) AS received_us";

/// The columns that describe an entry (`entries`, `entry`), ages by the server's clock.
const ENTRY_COLUMNS: &str = "namespace, `key`, state, CAST(attempts AS SIGNED), \
     CAST(crashes AS SIGNED), TIMESTAMPDIFF(MICROSECOND, received_at, UTC_TIMESTAMP(6)) AS age_us, \
     IF(state = 'queued', TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), due_at), NULL) AS due_us, \
     IF(state = 'running', TIMESTAMPDIFF(MICROSECOND, renewed_at, UTC_TIMESTAMP(6)), NULL) AS idle_us, \
     CAST(request IS NOT NULL AS SIGNED) AS has_request, history";

/// The inbox's statements that no other store runs: its enqueue and its take. Parameters, by
/// position, as each field says.
pub(crate) struct Own {
    /// MySQL: inserts a new entry (key, the insert's mark, request); a duplicate fails with
    /// error 1062, having written nothing.
    pub(crate) insert: Arc<str>,
    /// MariaDB 10.5 and later: the same insert, which on a duplicate assigns a column to itself
    /// (InnoDB writes nothing) and returns the existing row's `state, token` either way.
    pub(crate) insert_returning: Arc<str>,
    /// The due queued entries, oldest due first, locked, skipping the ones other workers hold
    /// (limit).
    pub(crate) take_queued: Arc<str>,
    /// The running entries not renewed for the stale limit, oldest due first, locked, skipping
    /// the ones other workers hold: under reclaim all, under hold those never started (stale
    /// limit, whether the policy reclaims, limit).
    pub(crate) take_stale: Arc<str>,
    /// The quoted table, for the take's update (whose text depends on how many rows it
    /// changes).
    table: String,
}

/// The statements every SQL store runs the same way, in MySQL's words, on `<table>_inbox`.
pub(crate) fn shared(table: &TableName) -> InboxQueries {
    let inbox = table.inbox();
    let t = inbox.quoted('`');
    let check = format!("`{}_check`", inbox.bare());
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace   VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state       VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token       BIGINT       NULL,
    attempts    INT          NOT NULL,
    crashes     INT          NOT NULL,
    started     BOOLEAN      NOT NULL DEFAULT TRUE,
    received_at DATETIME(6)  NOT NULL,
    due_at      DATETIME(6)  NOT NULL,
    renewed_at  DATETIME(6)  NOT NULL,
    settled_at  DATETIME(6)  NULL,
    request     LONGBLOB     NULL,
    history     BLOB         NULL,
    PRIMARY KEY (namespace, `key`),
    KEY due_idx (state, due_at),
    KEY stale_idx (state, renewed_at),
    CONSTRAINT {check} CHECK (state IN ('queued', 'running', 'done', 'dead'))
) ENGINE = InnoDB"#
    );
    let lease = format!("{KEY} AND token = ? AND state = 'running'");
    // Single-table assignments run left to right, each seeing those before it: `attempts`
    // reads `started` before it changes, `settled_at` reads the new `state`. The due time is
    // NULL plus an interval, so kept, when no delay is bound.
    let settle = format!(
        "UPDATE {t} SET state = ?, due_at = COALESCE({NOW} + INTERVAL ? MICROSECOND, due_at), \
         attempts = IF(? AND started AND attempts > 0, attempts - 1, attempts), \
         started = FALSE, history = COALESCE(?, history), token = NULL, \
         settled_at = IF(state IN ('done', 'dead'), {NOW}, settled_at) WHERE {lease}"
    );
    let start_over =
        |column: &str, value: &str| format!("{column} = IF(state = 'dead', {value}, {column})");
    let retry = format!(
        "UPDATE {t} SET {attempts}, {crashes}, {settled}, due_at = {NOW}, token = NULL, \
         started = FALSE, state = 'queued'",
        attempts = start_over("attempts", "0"),
        crashes = start_over("crashes", "0"),
        settled = start_over("settled_at", "NULL"),
    );
    let by_hand = format!(
        "{KEY} AND (state IN ('queued', 'dead') OR state = 'running' \
         AND (? OR renewed_at <= {NOW} - INTERVAL ? MICROSECOND))"
    );
    // A done entry was due before it was settled: the walk of the due index ends at the age,
    // reading only the done entries due before it.
    let settled_before = format!(
        "state = 'done' AND due_at <= {NOW} - INTERVAL ? MICROSECOND \
         AND settled_at <= {NOW} - INTERVAL ? MICROSECOND"
    );
    // A purge picks its rows first, skipping any a transaction elsewhere holds: a row locked
    // by someone else never stalls it, nor the workers queued behind it.
    let pick = |also: &str| {
        format!(
            "SELECT namespace, `key` FROM {t} FORCE INDEX (due_idx) \
             WHERE {settled_before}{also} ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"
        )
    };
    InboxQueries {
        migrate: migrate.into(),
        add_started: format!("ALTER TABLE {t} ADD COLUMN started BOOLEAN NOT NULL DEFAULT TRUE")
            .into(),
        state: format!("SELECT state FROM {t} WHERE {KEY}").into(),
        renew: format!("UPDATE {t} SET renewed_at = {NOW} WHERE {lease}").into(),
        settle: settle.into(),
        start: format!(
            "UPDATE {t} SET attempts = IF(started, attempts, attempts + 1), started = TRUE \
             WHERE {lease}"
        )
        .into(),
        untake: format!(
            "UPDATE {t} SET state = 'queued', due_at = {NOW}, \
             attempts = IF(started AND attempts > 0, attempts - 1, attempts), started = FALSE, \
             token = NULL WHERE state = 'running' AND token = ?"
        )
        .into(),
        entries: format!(
            r#"SELECT {ENTRY_COLUMNS} FROM {t}
WHERE (? IS NULL OR namespace = ?)
    AND ((state = 'queued' AND ?) OR (state = 'running' AND ?)
        OR (state = 'done' AND ?) OR (state = 'dead' AND ?))
ORDER BY received_at, namespace, `key` LIMIT ?"#
        )
        .into(),
        entry: format!("SELECT {ENTRY_COLUMNS} FROM {t} WHERE {KEY}").into(),
        request: format!("SELECT request FROM {t} WHERE {KEY}").into(),
        retry_now: format!("{retry} WHERE {by_hand}").into(),
        retry_dead: format!("{retry} WHERE namespace = ? AND state = 'dead'").into(),
        // A discarded entry's due time is moved back to now if it lay ahead: a done entry was
        // due before it was settled, which the purge's walk of the due index relies on.
        discard: format!(
            "UPDATE {t} SET state = 'done', settled_at = {NOW}, due_at = LEAST(due_at, {NOW}), \
             token = NULL, started = FALSE WHERE {by_hand}"
        )
        .into(),
        // The due index holds the state and the primary key: the count reads no row, and skips
        // the done entries.
        stats: format!(
            r#"SELECT CAST(COALESCE(SUM(state = 'queued'), 0) AS SIGNED),
    CAST(COALESCE(SUM(state = 'running'), 0) AS SIGNED),
    CAST(COALESCE(SUM(state = 'dead'), 0) AS SIGNED),
    TIMESTAMPDIFF(MICROSECOND, MIN(IF(state = 'queued' AND due_at <= {NOW}, due_at, NULL)),
        {NOW})
FROM {t} FORCE INDEX (due_idx)
WHERE state IN ('queued', 'running', 'dead') AND (? IS NULL OR namespace = ?)"#
        )
        .into(),
        purge: InboxPurge::Picked {
            before: "SET TRANSACTION ISOLATION LEVEL READ COMMITTED".into(),
            pick_requests: pick(" AND request IS NOT NULL").into(),
            request_of: format!("UPDATE {t} SET request = NULL WHERE {KEY} AND state = 'done'")
                .into(),
            pick_entries: pick("").into(),
            entry_of: format!("DELETE FROM {t} WHERE {KEY} AND state = 'done'").into(),
        },
    }
}

impl Own {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.inbox().quoted('`');
        let insert = format!(
            r#"INSERT INTO {t} (namespace, `key`, state, token, attempts, crashes,
    received_at, due_at, renewed_at, request)
VALUES (?, ?, 'queued', ?, 0, 0, {NOW}, {NOW}, {NOW}, ?)"#
        );
        let insert_returning =
            format!("{insert}\nON DUPLICATE KEY UPDATE token = token\nRETURNING state, token");
        // The index's order is the take's: InnoDB stops after `limit` rows it could lock, and
        // never waits for one another worker holds.
        let take_queued = format!(
            r#"SELECT {TAKE_COLUMNS} FROM {t} FORCE INDEX (due_idx)
WHERE state = 'queued' AND due_at <= {NOW}
ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"#
        );
        let take_stale = format!(
            r#"SELECT {TAKE_COLUMNS} FROM {t} FORCE INDEX (stale_idx)
WHERE state = 'running' AND renewed_at <= {NOW} - INTERVAL ? MICROSECOND AND (? OR NOT started)
ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"#
        );
        Self {
            insert: insert.into(),
            insert_returning: insert_returning.into(),
            take_queued: take_queued.into(),
            take_stale: take_stale.into(),
            table: t,
        }
    }

    /// The take's update of `rows` locked entries, in one statement: each row (namespace, key,
    /// its new token or NULL, 1 if it crashed or 0) is taken under its token, not yet started,
    /// or, without one, made dead. The assignments of a multiple-table `UPDATE` run in no set
    /// order: each reads only its own column and the bound row. `STRAIGHT_JOIN` reads the
    /// bound rows first and finds each entry by its primary key: a plan that walked the table
    /// instead would wait on every row a transaction elsewhere holds, the ones the take
    /// skipped included.
    pub(crate) fn take_update(&self, rows: usize) -> String {
        let text = "CAST(? AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin";
        let bound = std::iter::once(format!(
            "SELECT {text} AS namespace, {text} AS k, CAST(? AS SIGNED) AS token, \
             CAST(? AS SIGNED) AS crashed"
        ))
        .chain((1..rows).map(|_| "SELECT ?, ?, ?, ?".to_owned()))
        .collect::<Vec<_>>()
        .join("\n    UNION ALL ");
        format!(
            r#"UPDATE (
    {bound}
) AS v STRAIGHT_JOIN {t} AS t ON t.namespace = v.namespace AND t.`key` = v.k
SET t.crashes = t.crashes + v.crashed,
    t.started = FALSE,
    t.renewed_at = IF(v.token IS NULL, t.renewed_at, {NOW}),
    t.settled_at = IF(v.token IS NULL, {NOW}, t.settled_at),
    t.state = IF(v.token IS NULL, 'dead', 'running'),
    t.token = v.token"#,
            t = self.table
        )
    }
}
