//! The SQL of the SQLite store: its tables, their upgrade, and every statement, written once
//! per table name.

use super::super::sql::{
    Bounded, PURGE_BATCH, Purge, Queries, TALLY_CHUNK, TableName, VersionQueries, statement_set,
};

/// Now, in microseconds since the Unix epoch, from SQLite's clock.
pub(super) const NOW_US: &str = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// The claims table as `CREATE TABLE` makes it (an upgrade rebuilds an older table so).
fn create_table(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace     TEXT    NOT NULL,
    "key"         TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('processing', 'done', 'released')),
    token         INTEGER NOT NULL,
    deliveries    INTEGER NOT NULL,
    runs          INTEGER NOT NULL DEFAULT 1,
    reclaimed     INTEGER NOT NULL DEFAULT 0,
    first_seen_at INTEGER,
    last_seen_at  INTEGER,
    claimed_at    INTEGER NOT NULL,
    renewed_at    INTEGER,
    completed_at  INTEGER,
    receipt       BLOB,
    PRIMARY KEY (namespace, "key")
);"#
    )
}

/// Drops the indexes of earlier releases, which every commit had to update.
fn drop_indexes(table: &TableName) -> String {
    table
        .old_indexes()
        .map(|index| format!("DROP INDEX IF EXISTS \"{index}\";"))
        .join("\n")
}

/// Rebuilds a table of the first release (states `processing` and `done` only, no counts of
/// runs, no heartbeat): SQLite cannot change a `CHECK` constraint in place. The rows are
/// copied whole; the seen times start at the claim time.
pub(super) fn upgrade(table: &TableName) -> String {
    let t = table.quoted('"');
    let previous = format!("\"{}_previous\"", table.bare());
    format!(
        r#"ALTER TABLE {t} RENAME TO {previous};
{create}
INSERT INTO {t} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at, completed_at)
SELECT namespace, "key", state, token, deliveries, 1, 0,
    claimed_at, claimed_at, claimed_at, claimed_at, completed_at
FROM {previous};
DROP TABLE {previous};"#,
        create = create_table(table),
    )
}

/// Adds the `receipt` column to a table made before it existed: a change of the schema
/// alone, no row is rewritten.
pub(super) fn add_receipt(table: &TableName) -> String {
    format!("ALTER TABLE {} ADD COLUMN receipt BLOB", table.quoted('"'))
}

/// A claim that guesses its key is new: inserts the row (`?3` token), or, when the key has a
/// row already, does nothing (the claim then reads the row). It returns no row: its count of
/// rows tells which, and a row returned would cost the claim a wake-up from the connection's
/// thread before the commit's sync of the disk, for nothing.
pub(super) fn enter(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(
        r#"INSERT INTO {t} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?1, ?2, 'processing', ?3, 1, 1, 0, {NOW_US}, {NOW_US}, {NOW_US}, {NOW_US})
ON CONFLICT (namespace, "key") DO NOTHING"#
    )
}

pub(super) fn queries(table: TableName) -> Queries {
    let t = table.quoted('"');
    let heartbeat = "COALESCE(renewed_at, claimed_at)";
    let age_of = |at: &str| format!("{NOW_US} - {at}");
    let age = age_of("claimed_at");
    let idle = age_of(heartbeat);
    let migrate = format!("{}\n{}", create_table(&table), drop_indexes(&table));
    // ?4: whether the policy reclaims; ?5: the stale limit in microseconds. A released row is
    // free; a processing one only once its owner stopped renewing it.
    let take = format!(
        "(t.state = 'released' OR (t.state = 'processing' AND ?4 \
         AND COALESCE(t.renewed_at, t.claimed_at) <= {NOW_US} - ?5))"
    );
    let claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES (?1, ?2, 'processing', ?3, 1, 1, 0, {NOW_US}, {NOW_US}, {NOW_US}, {NOW_US})
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    state = CASE WHEN {take} THEN 'processing' ELSE t.state END,
    token = CASE WHEN {take} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {take} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {take} THEN t.state = 'processing' ELSE t.reclaimed END,
    claimed_at = CASE WHEN {take} THEN {NOW_US} ELSE t.claimed_at END,
    renewed_at = CASE WHEN {take} THEN {NOW_US} ELSE t.renewed_at END,
    completed_at = CASE WHEN {take} THEN NULL ELSE t.completed_at END,
    receipt = CASE WHEN {take} THEN NULL ELSE t.receipt END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt"#
    );
    let fenced = r#"namespace = ?1 AND "key" = ?2 AND token = ?3"#;
    let renew =
        format!("UPDATE {t} SET renewed_at = {NOW_US} WHERE {fenced} AND state = 'processing'");
    // ?1: the encoded receipt (NULL for a plain commit); a row done already keeps its own.
    let commit = format!(
        r#"UPDATE {t} SET state = 'done',
    completed_at = CASE WHEN state = 'done' THEN completed_at ELSE {NOW_US} END,
    receipt = CASE WHEN state = 'done' THEN receipt ELSE ?1 END
WHERE namespace = ?2 AND "key" = ?3 AND token = ?4 AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET state = 'released', \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE {NOW_US} END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    // The run is taken back only on the way from `processing`: a second give-back (its answer
    // lost) finds `released` and leaves the count alone.
    let give_back = format!(
        "UPDATE {t} SET state = 'released', \
         runs = CASE WHEN state = 'processing' AND runs > 0 THEN runs - 1 ELSE runs END, \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE {NOW_US} END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {age}, {idle}, {settled}, receipt
FROM {t} WHERE namespace = ?1 AND "key" = ?2"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, "key", deliveries, {age} AS age_us, {idle} AS idle_us FROM {t}
WHERE state = 'processing' AND {heartbeat} <= {NOW_US} - ?1
ORDER BY {heartbeat}, namespace, "key""#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET state = 'done', completed_at = {NOW_US}, token = ?1, receipt = NULL
WHERE namespace = ?2 AND "key" = ?3 AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = {NOW_US}
WHERE namespace = ?1 AND "key" = ?2 AND state = 'processing'"#
    );
    // The purge walks the primary key in batches: no index on the settle time for every
    // commit to update, and the write lock held for one batch at a time.
    let purge_bound = format!(
        r#"SELECT namespace, "key" FROM {t} WHERE (namespace, "key") > (?1, ?2)
ORDER BY namespace, "key" LIMIT 1 OFFSET {skip}"#,
        skip = PURGE_BATCH - 1
    );
    let purge_rest = format!(
        r#"DELETE FROM {t}
WHERE state IN ('done', 'released') AND completed_at <= {NOW_US} - ?1
    AND (namespace, "key") > (?2, ?3)"#
    );
    let purge = format!(r#"{purge_rest} AND (namespace, "key") <= (?4, ?5)"#);
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    // A released row is free for the marker too.
    let free = "t.state = 'released'";
    let tx_claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES (?1, ?2, 'done', ?3, 1, 1, 0, {NOW_US}, {NOW_US}, {NOW_US}, {NOW_US})
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    state = CASE WHEN {free} THEN 'done' ELSE t.state END,
    token = CASE WHEN {free} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {free} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {free} THEN 0 ELSE t.reclaimed END,
    claimed_at = CASE WHEN {free} THEN {NOW_US} ELSE t.claimed_at END,
    completed_at = CASE WHEN {free} THEN {NOW_US} ELSE t.completed_at END,
    receipt = CASE WHEN {free} THEN NULL ELSE t.receipt END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt"#
    );
    let read = format!(
        r#"SELECT state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt
FROM {t} WHERE namespace = ?1 AND "key" = ?2"#
    );
    // Written in the background, many keys a statement: the last delivery's time from how
    // long ago it was.
    let counts = (0..TALLY_CHUNK)
        .map(|row| {
            let p = 4 * row;
            let (ns, key, n, ago) = (p + 1, p + 2, p + 3, p + 4);
            format!("(?{ns}, ?{key}, ?{n}, ?{ago})")
        })
        .collect::<Vec<_>>()
        .join(",\n    ");
    let tally = format!(
        r#"WITH v (namespace, "key", n, ago) AS (VALUES
    {counts}
)
UPDATE {t} AS t SET deliveries = t.deliveries + v.n,
    last_seen_at = max(COALESCE(t.last_seen_at, t.claimed_at), {NOW_US} - v.ago)
FROM v WHERE t.namespace = v.namespace AND t."key" = v."key""#
    );
    let versions = version_queries(&table);
    statement_set!(Queries {
        read, tx_claim, tx_check, migrate, claim, renew, commit, release, give_back, describe,
        stuck, resolve_done, resolve_release;
        inbox: super::inbox::shared(&table),
        table,
        tally: tally.into(),
        versions,
        purge: Purge::Bounded(Bounded {
            bound: purge_bound.into(),
            up_to: purge.into(),
            rest: purge_rest.into(),
            before: None,
        }),
    })
}

/// The statements on the versions table of the [version guard](crate::version_guard).
fn version_queries(table: &TableName) -> VersionQueries {
    let v = table.versions().quoted('"');
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       TEXT    NOT NULL,
    entity          TEXT    NOT NULL,
    applied_version INTEGER,
    pending_version INTEGER,
    pending_token   INTEGER,
    pending_since   INTEGER,
    deliveries      INTEGER NOT NULL,
    last_seen_at    INTEGER NOT NULL,
    PRIMARY KEY (namespace, entity)
);"#
    );
    // ?1 namespace, ?2 entity, ?3 version, ?4 our token, ?5 whether the policy reclaims, ?6 the
    // stale limit in microseconds. Every SET expression sees the row as it was. Only an older
    // version is outdated: an equal one takes the slot like a newer one.
    let acquire = format!(
        "(t.applied_version IS NULL OR t.applied_version <= excluded.pending_version) \
         AND (t.pending_token IS NULL OR (?5 AND t.pending_since <= {NOW_US} - ?6 \
             AND t.pending_version <= excluded.pending_version))"
    );
    let begin = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES (?1, ?2, ?3, ?4, {NOW_US}, 1, {NOW_US})
ON CONFLICT (namespace, entity) DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US},
    pending_version = CASE WHEN {acquire} THEN excluded.pending_version ELSE t.pending_version END,
    pending_token = CASE WHEN {acquire} THEN excluded.pending_token ELSE t.pending_token END,
    pending_since = CASE WHEN {acquire} THEN excluded.pending_since ELSE t.pending_since END
RETURNING applied_version, pending_version, pending_token, {NOW_US} - pending_since AS age_us"#
    );
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let renew = format!(
        "UPDATE {v} SET pending_since = {NOW_US} WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"
    );
    // SQLite's max() of several arguments is NULL if one is.
    let newest = "max(coalesce(applied_version, pending_version), pending_version)";
    let commit = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"#
    );
    let release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ?1 AND entity = ?2 AND pending_token = ?3"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = ?1 AND entity = ?2");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = {newest}, {clear}
WHERE namespace = ?1 AND entity = ?2 AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = ?1 AND entity = ?2 AND pending_token IS NOT NULL"
    );
    // ?1 namespace, ?2 entity, ?3 version. A row at a newer version is left as it is and
    // returns nothing; an equal one is advanced (to the same version) like an older one.
    let advance = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, applied_version, deliveries, last_seen_at)
VALUES (?1, ?2, ?3, 1, {NOW_US})
ON CONFLICT (namespace, entity) DO UPDATE SET
    applied_version = excluded.applied_version,
    deliveries = t.deliveries + 1,
    last_seen_at = {NOW_US}
WHERE t.applied_version IS NULL OR t.applied_version <= excluded.applied_version
RETURNING applied_version"#
    );
    statement_set!(VersionQueries {
        migrate, renew, begin, commit, release, applied, resolve_done, resolve_release, advance;
    })
}
