//! The SQL of the MySQL and MariaDB store: its tables, their upgrade, and every statement,
//! written once per table name (both ways a claim is made: one statement with `RETURNING` on
//! MariaDB, an upsert and a read on MySQL).

use std::sync::Arc;

use super::super::sql::{
    Bounded, PURGE_BATCH, Purge, Queries, TALLY_CHUNK, TableName, VersionQueries, statement_set,
};

/// The claim statements only this backend needs.
pub(super) struct ClaimQueries {
    /// MySQL: a claim's first statement, `INSERT IGNORE` of a new key.
    pub(super) insert_new: Arc<str>,
    /// MariaDB: a claim's first statement, which inserts a new key or returns the existing row
    /// without changing it.
    pub(super) insert_or_read: Arc<str>,
    /// MariaDB: the upsert with `RETURNING`, which takes a released or stale row over.
    pub(super) returning: Arc<str>,

    /// MySQL: the read after an upsert that updated.
    pub(super) read: Arc<str>,
    /// Transactional mode: the marker takes over a released row.
    pub(super) tx_take: Arc<str>,

    /// MariaDB: `begin_version`'s upsert with `RETURNING`.
    pub(super) version_returning: Arc<str>,
    /// MySQL: the read of the versions row after `begin_version`'s upsert updated it.
    pub(super) version_read: Arc<str>,
    /// MariaDB: `advance`'s upsert with `RETURNING`.
    pub(super) advance_returning: Arc<str>,
    /// MySQL: the locking read of the versions row after `advance`'s upsert updated it.
    pub(super) advance_read: Arc<str>,
}

/// The server's clock.
pub(super) const NOW: &str = "UTC_TIMESTAMP(6)";
/// The age of the row's claim, in microseconds, by the server's clock.
pub(super) const AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, claimed_at, UTC_TIMESTAMP(6))";
/// How long ago the row's claim was last renewed (or taken).
pub(super) const IDLE_US: &str =
    "TIMESTAMPDIFF(MICROSECOND, COALESCE(renewed_at, claimed_at), UTC_TIMESTAMP(6))";

/// The columns added since the first release, as the upgrade adds them.
const NEW_COLUMNS: &str = "runs          BIGINT       NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN      NOT NULL DEFAULT FALSE,
    first_seen_at DATETIME(6)  NULL,
    last_seen_at  DATETIME(6)  NULL,
    renewed_at    DATETIME(6)  NULL,";

/// The column of the receipt a commit keeps, the latest added: last in the table, where
/// InnoDB adds a column without copying the table.
const RECEIPT_COLUMN: &str = "receipt       LONGBLOB     NULL";

pub(super) fn queries(table: TableName) -> (Queries, ClaimQueries) {
    let t = table.quoted('`');
    let check = table.state_check('`');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace     VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state         VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token         BIGINT       NOT NULL,
    deliveries    BIGINT       NOT NULL,
    {NEW_COLUMNS}
    claimed_at    DATETIME(6)  NOT NULL,
    completed_at  DATETIME(6)  NULL,
    {RECEIPT_COLUMN},
    PRIMARY KEY (namespace, `key`),
    CONSTRAINT {check} CHECK (state IN ('processing', 'done', 'released'))
) ENGINE = InnoDB"#
    );
    // Parameters: namespace, key, our token, whether the policy reclaims, the stale limit in
    // microseconds, then our token eight times. The assignments run left to right: `token` is
    // decided on the row as it was (released, or processing and not renewed for the limit
    // under reclaim); every later assignment follows only if the token is ours now, and
    // `state` comes last, so `reclaimed` still sees the old state.
    let ours = |column: &str, value: &str| format!("{column} = IF(token = ?, {value}, {column})");
    let claim = format!(
        r#"INSERT INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?, ?, 'processing', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = {NOW},
    token = IF(state = 'released' OR (state = 'processing' AND ? AND {IDLE_US} >= ?), ?, token),
    {reclaimed},
    {runs},
    {claimed_at},
    {renewed_at},
    {completed_at},
    {receipt},
    {state}"#,
        reclaimed = ours("reclaimed", "state = 'processing'"),
        runs = ours("runs", "runs + 1"),
        claimed_at = ours("claimed_at", NOW),
        renewed_at = ours("renewed_at", NOW),
        completed_at = ours("completed_at", "NULL"),
        receipt = ours("receipt", "NULL"),
        state = ours("state", "'processing'"),
    );
    let fenced = "namespace = ? AND `key` = ? AND token = ?";
    let renew =
        format!("UPDATE {t} SET renewed_at = {NOW} WHERE {fenced} AND state = 'processing'");
    // The encoded receipt (NULL for a plain commit) first: a row done already keeps its own.
    let commit = format!(
        r#"UPDATE {t}
SET receipt = IF(state = 'done', receipt, ?),
    completed_at = IF(state = 'done', completed_at, {NOW}), state = 'done'
WHERE {fenced} AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET completed_at = IF(state = 'released', completed_at, {NOW}), \
         state = 'released' WHERE {fenced} AND state IN ('processing', 'released')"
    );
    // MySQL assigns left to right: `runs` and `completed_at` read `state` before it changes.
    // The run is taken back only on the way from `processing`, once.
    let give_back = format!(
        "UPDATE {t} SET runs = IF(state = 'processing' AND runs > 0, runs - 1, runs), \
         completed_at = IF(state = 'released', completed_at, {NOW}), \
         state = 'released' WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let age_of = |at: &str| format!("TIMESTAMPDIFF(MICROSECOND, {at}, {NOW})");
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {AGE_US}, {IDLE_US}, {settled}, receipt
FROM {t} WHERE namespace = ? AND `key` = ?"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, `key`, deliveries, {AGE_US} AS age_us, {IDLE_US} AS idle_us FROM {t}
WHERE state = 'processing'
    AND COALESCE(renewed_at, claimed_at) <= {NOW} - INTERVAL ? MICROSECOND
ORDER BY COALESCE(renewed_at, claimed_at), namespace, `key`"#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET token = ?, state = 'done', completed_at = {NOW}, receipt = NULL
WHERE namespace = ? AND `key` = ? AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = {NOW}
WHERE namespace = ? AND `key` = ? AND state = 'processing'"#
    );
    // The purge walks the primary key in batches: no index on the settle time for every
    // commit to update, and no statement that holds many row locks for long. A position is
    // spelt out (MariaDB reads a row-value comparison as no range of the key).
    let after = "(namespace > ? OR (namespace = ? AND `key` > ?))";
    let purge_bound = format!(
        "SELECT namespace, `key` FROM {t} WHERE {after} \
         ORDER BY namespace, `key` LIMIT 1 OFFSET {skip}",
        skip = PURGE_BATCH - 1
    );
    let purge_rest = format!(
        r#"DELETE FROM {t}
WHERE state IN ('done', 'released') AND completed_at <= {NOW} - INTERVAL ? MICROSECOND
    AND {after}"#
    );
    let purge = format!("{purge_rest} AND (namespace < ? OR (namespace = ? AND `key` <= ?))");
    let columns = format!(
        "state, token, deliveries, reclaimed, {AGE_US} AS age_us, {IDLE_US} AS idle_us, receipt"
    );
    let claim_returning = format!("{claim}\nRETURNING {columns}");
    // A claim's first statement (namespace, key, token): a new key inserted. On a duplicate
    // the MySQL flavor's insert is ignored, and MariaDB's "update" assigns a column to itself,
    // which InnoDB skips: neither writes a row, nor anything to the redo log.
    let insert = format!(
        r#"INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?, ?, 'processing', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})"#
    );
    let insert_new = format!("INSERT IGNORE {insert}");
    let insert_or_read =
        format!("INSERT {insert}\nON DUPLICATE KEY UPDATE token = token\nRETURNING {columns}");
    let claim_read = format!("SELECT {columns} FROM {t} WHERE namespace = ? AND `key` = ?");
    // INSERT IGNORE rather than ON DUPLICATE KEY UPDATE: duplicates waiting on an open
    // transaction then share a lock and never need an exclusive one on the same row, which
    // InnoDB would resolve by failing all but one of them as deadlocked.
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    let tx_claim = format!(
        r#"INSERT IGNORE INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES (?, ?, 'done', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})"#
    );
    // A released row is free for the marker too: taken over inside the transaction.
    let tx_take = format!(
        r#"UPDATE {t} SET token = ?, state = 'done', runs = runs + 1, reclaimed = FALSE,
    deliveries = deliveries + 1,
    last_seen_at = {NOW}, claimed_at = {NOW}, completed_at = {NOW}, receipt = NULL
WHERE namespace = ? AND `key` = ? AND state = 'released'"#
    );
    // Written in the background, many keys a statement: the last delivery's time from how
    // long ago it was. The first row names the columns, in the table's own collation.
    let text = "CAST(? AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin";
    let counts = std::iter::once(format!(
        "SELECT {text} AS namespace, {text} AS k, CAST(? AS SIGNED) AS n, CAST(? AS SIGNED) AS ago"
    ))
    .chain((1..TALLY_CHUNK).map(|_| "SELECT ?, ?, ?, ?".to_owned()))
    .collect::<Vec<_>>()
    .join("\n    UNION ALL ");
    let tally = format!(
        r#"UPDATE {t} AS t JOIN (
    {counts}
) AS v ON t.namespace = v.namespace AND t.`key` = v.k
SET t.deliveries = t.deliveries + v.n,
    t.last_seen_at = GREATEST(COALESCE(t.last_seen_at, t.claimed_at),
        TIMESTAMPADD(MICROSECOND, -v.ago, {NOW}))"#
    );
    let (versions, version_returning, version_read, advance_returning, advance_read) =
        version_queries(&table);
    let claim_read: std::sync::Arc<str> = claim_read.into();
    let queries = statement_set!(Queries {
        tx_claim, tx_check, migrate, claim, renew, commit, release, give_back, describe, stuck,
        resolve_done, resolve_release;
        inbox: super::inbox::shared(&table),
        read: claim_read.clone(),
        tally: tally.into(),
        table,
        versions,
        purge: Purge::Bounded(Bounded {
            bound: purge_bound.into(),
            up_to: purge.into(),
            rest: purge_rest.into(),
            before: Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED".into()),
        }),
    });
    let claims = ClaimQueries {
        insert_new: insert_new.into(),
        insert_or_read: insert_or_read.into(),
        returning: claim_returning.into(),
        read: claim_read,
        tx_take: tx_take.into(),
        version_returning,
        version_read,
        advance_returning,
        advance_read,
    };
    (queries, claims)
}

/// The `ALTER TABLE` that turns a table of the first release into the current one: the new
/// columns added, and the check on `state` (whose name the server chose, `checks`), which
/// refuses `released`, dropped. Both are done without copying the table; adding a new check
/// would copy it, with writes blocked, so an upgraded table goes without one.
pub(super) fn upgrade(table: &TableName, checks: &[String], mariadb: bool) -> String {
    let t = table.quoted('`');
    let mut alter: Vec<String> = NEW_COLUMNS
        .lines()
        .chain([RECEIPT_COLUMN])
        .map(|line| format!("ADD COLUMN {}", line.trim().trim_end_matches(',')))
        .collect();
    // MySQL 8.0.16 to 8.0.18 know only `DROP CHECK`.
    let drop = if mariadb {
        "DROP CONSTRAINT"
    } else {
        "DROP CHECK"
    };
    for check in checks {
        alter.push(format!("{drop} `{}`", check.replace('`', "``")));
    }
    format!("ALTER TABLE {t} {}", alter.join(", "))
}

/// The `ALTER TABLE` that adds the `receipt` column to a table made before it existed: in
/// place and without copying the table (InnoDB adds a last nullable column instantly).
pub(super) fn add_receipt(table: &TableName) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN {RECEIPT_COLUMN}",
        table.quoted('`')
    )
}

/// The age of the row's pending version, in microseconds, by the server's clock.
const PENDING_AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, pending_since, UTC_TIMESTAMP(6))";

/// The statements on the versions table of the [version guard](crate::version_guard), and the ones
/// only this backend needs.
fn version_queries(table: &TableName) -> (VersionQueries, Arc<str>, Arc<str>, Arc<str>, Arc<str>) {
    let v = table.versions().quoted('`');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    entity          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    applied_version BIGINT       NULL,
    applied_token   BIGINT       NULL,
    pending_version BIGINT       NULL,
    pending_token   BIGINT       NULL,
    pending_since   DATETIME(6)  NULL,
    deliveries      BIGINT       NOT NULL,
    last_seen_at    DATETIME(6)  NOT NULL,
    PRIMARY KEY (namespace, entity)
) ENGINE = InnoDB"#
    );
    // Parameters: namespace, entity, version, our token, version, whether the policy reclaims,
    // the stale limit in microseconds, version, our token, our token, version, our token. The
    // assignments run left to right: the token is decided on the row as it was, then the
    // version and the time follow it only if it is ours. Only an older version is outdated: an
    // equal one takes the slot like a newer one. Counting the delivery makes every update
    // change the row, so an insert is told from an update by the affected rows.
    let begin = format!(
        r#"INSERT INTO {v} (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), 1, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = UTC_TIMESTAMP(6),
    pending_token = IF((applied_version IS NULL OR applied_version <= ?)
        AND (pending_token IS NULL OR (? AND {PENDING_AGE_US} >= ? AND pending_version <= ?)),
        ?, pending_token),
    pending_version = IF(pending_token <=> ?, ?, pending_version),
    pending_since = IF(pending_token <=> ?, UTC_TIMESTAMP(6), pending_since)"#
    );
    let columns =
        format!("applied_version, pending_version, pending_token, {PENDING_AGE_US} AS age_us");
    let begin_returning = format!("{begin}\nRETURNING {columns}");
    let begin_read = format!("SELECT {columns} FROM {v} WHERE namespace = ? AND entity = ?");
    // Left to right: the applied version is read before the pending one is cleared.
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let newest = "GREATEST(COALESCE(applied_version, pending_version), pending_version)";
    let commit = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ? AND entity = ? AND pending_token = ?"#
    );
    let release =
        format!("UPDATE {v} SET {clear} WHERE namespace = ? AND entity = ? AND pending_token = ?");
    let renew = format!(
        "UPDATE {v} SET pending_since = UTC_TIMESTAMP(6) \
         WHERE namespace = ? AND entity = ? AND pending_token = ?"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = ? AND entity = ?");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ? AND entity = ? AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ? AND entity = ? AND pending_token IS NOT NULL"
    );
    // Parameters: namespace, entity, version, our token, version, our token, our token,
    // version. Unless the row is at a newer version, the version is moved (an equal one to
    // itself: it advances, as the version guard runs it) and the row stamped with a fresh token.
    // The stamp, not a comparison of versions, says whether this statement advanced the row:
    // ours exactly when it is our token, outdated otherwise (an older stamp, or none).
    let advance = format!(
        r#"INSERT INTO {v} (namespace, entity, applied_version, applied_token, deliveries, last_seen_at)
VALUES (?, ?, ?, ?, 1, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    deliveries = deliveries + 1,
    last_seen_at = UTC_TIMESTAMP(6),
    applied_token = IF(applied_version IS NULL OR applied_version <= ?, ?, applied_token),
    applied_version = IF(applied_token <=> ?, ?, applied_version)"#
    );
    let advance_returning = format!("{advance}\nRETURNING applied_version, applied_token");
    let advance_read = format!(
        "SELECT applied_version, applied_token FROM {v} WHERE namespace = ? AND entity = ? FOR UPDATE"
    );
    let queries = statement_set!(VersionQueries {
        migrate, renew, begin, commit, release, applied, resolve_done, resolve_release, advance;
    });
    (
        queries,
        begin_returning.into(),
        begin_read.into(),
        advance_returning.into(),
        advance_read.into(),
    )
}
