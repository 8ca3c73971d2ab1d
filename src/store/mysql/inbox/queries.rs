//! The SQL of the inbox on MySQL and MariaDB: its table and every statement, written once per
//! table name.

use std::sync::Arc;

use crate::store::sql::TableName;

/// The server's clock.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The columns a worker's take reads of each entry it locks: the key, the state (a running one
/// whose handler started is a crash), the counts, the stored request and history, the due time
/// as a number (microseconds since 2000, in the table's own time: no time zone is applied), to
/// merge the queued and the stale entries in due order, whether it started, and when it was
/// received (microseconds since the Unix epoch; the table's times are UTC).
const TAKE_COLUMNS: &str = "namespace, `key`, state, attempts, crashes, request, history, \
     TIMESTAMPDIFF(MICROSECOND, '2000-01-01 00:00:00', due_at) AS due_us, started, \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', received_at) AS received_us";

/// The columns that describe an entry (`entries`, `entry`), ages by the server's clock.
const ENTRY_COLUMNS: &str = "namespace, `key`, state, attempts, crashes, \
     TIMESTAMPDIFF(MICROSECOND, received_at, UTC_TIMESTAMP(6)) AS age_us, \
     IF(state = 'queued', TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), due_at), NULL) AS due_us, \
     IF(state = 'running', TIMESTAMPDIFF(MICROSECOND, renewed_at, UTC_TIMESTAMP(6)), NULL) AS idle_us, \
     CAST(request IS NOT NULL AS SIGNED) AS has_request, history";

/// The statements of the inbox table, `<table>_inbox`.
///
/// Parameters, by position: as each field says; a key is (namespace, key), a lease (namespace,
/// key, token), an age or a delay microseconds.
pub(crate) struct InboxQueries {
    /// Creates the table with its indexes (`IF NOT EXISTS`).
    pub(crate) migrate: Arc<str>,
    /// MySQL: inserts a new entry (key, the insert's mark, request); a duplicate fails with
    /// error 1062, having written nothing.
    pub(crate) insert: Arc<str>,
    /// MariaDB 10.5 and later: the same insert, which on a duplicate assigns a column to itself
    /// (InnoDB writes nothing) and returns the existing row's `state, token` either way.
    pub(crate) insert_returning: Arc<str>,
    /// The state of one entry (key).
    pub(crate) state: Arc<str>,
    /// The due queued entries, oldest due first, locked, skipping the ones other workers hold
    /// (limit).
    pub(crate) take_queued: Arc<str>,
    /// The running entries not renewed for the stale limit, oldest due first, locked, skipping
    /// the ones other workers hold: under reclaim all, under hold those never started
    /// (whether the policy reclaims, stale limit, limit).
    pub(crate) take_stale: Arc<str>,
    /// A taken entry's handler starts, its attempt counted once (lease).
    pub(crate) start: Arc<str>,
    /// The entry leased under a token queued again, due now, its attempt taken back if it
    /// started (token).
    pub(crate) untake: Arc<str>,
    /// Adds the `started` column to an earlier release's table.
    pub(crate) add_started: Arc<str>,
    /// Renews a lease (lease).
    pub(crate) renew: Arc<str>,
    /// Settles as done or dead (state, history, lease).
    pub(crate) settle: Arc<str>,
    /// Settles to be tried again (delay, history, lease).
    pub(crate) retry_later: Arc<str>,
    /// Settles as a give-back: due now, the attempt taken back if it started, the history kept
    /// (lease).
    pub(crate) give_back: Arc<str>,
    /// Entries, the oldest first (namespace or NULL twice, whether each of queued, running,
    /// done, dead is wanted, limit).
    pub(crate) entries: Arc<str>,
    /// One entry (key).
    pub(crate) entry: Arc<str>,
    /// The stored request of one entry (key).
    pub(crate) request: Arc<str>,
    /// A queued or dead entry made due now, a dead one starting over; a running one when
    /// forced or not renewed for the microseconds given (key, force, microseconds or NULL).
    pub(crate) retry_now: Arc<str>,
    /// Every dead entry of a namespace made due now, starting over (namespace).
    pub(crate) retry_dead: Arc<str>,
    /// A queued or dead entry marked done; a running one as for `retry_now` (key, force,
    /// microseconds or NULL).
    pub(crate) discard: Arc<str>,
    /// Counts by state, and for queued entries how long the oldest due one has been due
    /// (namespace or NULL twice).
    pub(crate) stats: Arc<str>,
    /// Deletes the stored request of done entries settled at least the age ago (age, age,
    /// limit).
    pub(crate) purge_requests: Arc<str>,
    /// Picks done entries settled at least the age ago (age, age, limit).
    pub(crate) purge_entries: Arc<str>,
    /// Deletes one picked entry's request (namespace, key).
    pub(crate) purge_request_of: Arc<str>,
    /// Deletes one picked entry (namespace, key).
    pub(crate) purge_entry_of: Arc<str>,
    /// The quoted table, for the take's update (whose text depends on how many rows it
    /// changes).
    table: String,
}

impl InboxQueries {
    pub(crate) fn new(table: &TableName) -> Self {
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
        let insert = format!(
            r#"INSERT INTO {t} (namespace, `key`, state, token, attempts, crashes,
    received_at, due_at, renewed_at, request)
VALUES (?, ?, 'queued', ?, 0, 0, {NOW}, {NOW}, {NOW}, ?)"#
        );
        let insert_returning =
            format!("{insert}\nON DUPLICATE KEY UPDATE token = token\nRETURNING state, token");
        let at_key = "namespace = ? AND `key` = ?";
        let state = format!("SELECT state FROM {t} WHERE {at_key}");
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
        let held = "namespace = ? AND `key` = ? AND token = ? AND state = 'running'";
        let renew = format!("UPDATE {t} SET renewed_at = {NOW} WHERE {held}");
        // Assignments run left to right: the attempts read `started` before it changes.
        let start = format!(
            "UPDATE {t} SET attempts = IF(started, attempts, attempts + 1), started = TRUE \
             WHERE {held}"
        );
        let taken_back = "attempts = IF(started AND attempts > 0, attempts - 1, attempts), \
             started = FALSE";
        let untake = format!(
            "UPDATE {t} SET state = 'queued', due_at = {NOW}, {taken_back}, token = NULL \
             WHERE state = 'running' AND token = ?"
        );
        let add_started =
            format!("ALTER TABLE {t} ADD COLUMN started BOOLEAN NOT NULL DEFAULT TRUE");
        let settle = format!(
            "UPDATE {t} SET state = ?, settled_at = {NOW}, history = ?, token = NULL, \
             started = FALSE WHERE {held}"
        );
        let retry_later = format!(
            "UPDATE {t} SET state = 'queued', due_at = {NOW} + INTERVAL ? MICROSECOND, \
             history = ?, token = NULL, started = FALSE WHERE {held}"
        );
        let give_back = format!(
            "UPDATE {t} SET state = 'queued', due_at = {NOW}, {taken_back}, token = NULL \
             WHERE {held}"
        );
        let entries = format!(
            r#"SELECT {ENTRY_COLUMNS} FROM {t}
WHERE (? IS NULL OR namespace = ?)
    AND ((state = 'queued' AND ?) OR (state = 'running' AND ?)
        OR (state = 'done' AND ?) OR (state = 'dead' AND ?))
ORDER BY received_at, namespace, `key` LIMIT ?"#
        );
        let entry = format!("SELECT {ENTRY_COLUMNS} FROM {t} WHERE {at_key}");
        let request = format!("SELECT request FROM {t} WHERE {at_key}");
        // Assignments run left to right: the counts and the settle time read `state` before it
        // changes.
        let start_over =
            |column: &str, value: &str| format!("{column} = IF(state = 'dead', {value}, {column})");
        let by_hand = format!(
            "{at_key} AND (state IN ('queued', 'dead') OR state = 'running' \
             AND (? OR renewed_at <= {NOW} - INTERVAL ? MICROSECOND))"
        );
        let retry_now = format!(
            "UPDATE {t} SET {attempts}, {crashes}, {settled}, due_at = {NOW}, token = NULL, \
             started = FALSE, state = 'queued' WHERE {by_hand}",
            attempts = start_over("attempts", "0"),
            crashes = start_over("crashes", "0"),
            settled = start_over("settled_at", "NULL"),
        );
        let retry_dead = format!(
            "UPDATE {t} SET attempts = 0, crashes = 0, settled_at = NULL, due_at = {NOW}, \
             state = 'queued' WHERE namespace = ? AND state = 'dead'"
        );
        // A discarded entry's due time is moved back to now if it lay ahead: a done entry was
        // due before it was settled, which the purge's walk of the due index relies on.
        let discard = format!(
            "UPDATE {t} SET state = 'done', settled_at = {NOW}, due_at = LEAST(due_at, {NOW}), \
             token = NULL, started = FALSE WHERE {by_hand}"
        );
        // The due index holds the state and the primary key: the count reads no row, and skips
        // the done entries.
        let stats = format!(
            r#"SELECT state, COUNT(*),
    TIMESTAMPDIFF(MICROSECOND, MIN(IF(due_at <= {NOW}, due_at, NULL)), {NOW})
FROM {t} FORCE INDEX (due_idx)
WHERE state IN ('queued', 'running', 'dead') AND (? IS NULL OR namespace = ?)
GROUP BY state"#
        );
        // A done entry was due before it was settled: the walk of the due index ends at the
        // age, reading only the done entries due before it.
        let settled_before = format!(
            "state = 'done' AND due_at <= {NOW} - INTERVAL ? MICROSECOND \
             AND settled_at <= {NOW} - INTERVAL ? MICROSECOND"
        );
        // A purge picks its rows first, skipping any a transaction elsewhere holds: a row
        // locked by someone else never stalls it, nor the workers queued behind it.
        let purge_requests = format!(
            "SELECT namespace, `key` FROM {t} FORCE INDEX (due_idx) \
             WHERE {settled_before} AND request IS NOT NULL \
             ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let purge_entries = format!(
            "SELECT namespace, `key` FROM {t} FORCE INDEX (due_idx) \
             WHERE {settled_before} ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        Self {
            purge_request_of: format!(
                "UPDATE {t} SET request = NULL WHERE {at_key} AND state = 'done'"
            )
            .into(),
            purge_entry_of: format!("DELETE FROM {t} WHERE {at_key} AND state = 'done'").into(),
            migrate: migrate.into(),
            insert: insert.into(),
            insert_returning: insert_returning.into(),
            state: state.into(),
            take_queued: take_queued.into(),
            take_stale: take_stale.into(),
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
            table: t,
        }
    }

    /// The take's update of `rows` locked entries, in one statement: each row (namespace, key,
    /// its new token or NULL, 1 if it crashed or 0) is taken under its token, not yet started,
    /// or, without one, made dead. The assignments of a multiple-table `UPDATE` run in no set order: each reads
    /// only its own column and the bound row. `STRAIGHT_JOIN` reads the bound rows first and
    /// finds each entry by its primary key: a plan that walked the table instead would wait on
    /// every row a transaction elsewhere holds, the ones the take skipped included.
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
