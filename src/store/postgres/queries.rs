//! The SQL of the PostgreSQL store: its tables, their upgrade, and every statement, written
//! once per table name.

use super::super::sql::{
    PURGE_BATCH, Purge, Queries, TALLY_CHUNK, TableName, VersionQueries, statement_set,
};

/// Serialises concurrent `migrate()` calls: an arbitrary constant ("tower_id" in ASCII).
const MIGRATE_LOCK: i64 = 0x746f_7765_725f_6964;

/// The columns of the claims table, as `CREATE TABLE` makes them and the upgrade adds them.
fn columns() -> &'static str {
    r#"    namespace     TEXT        NOT NULL,
    "key"         TEXT        NOT NULL,
    state         TEXT        NOT NULL,
    token         BIGINT      NOT NULL,
    deliveries    BIGINT      NOT NULL,
    runs          BIGINT      NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN     NOT NULL DEFAULT FALSE,
    first_seen_at TIMESTAMPTZ,
    last_seen_at  TIMESTAMPTZ,
    claimed_at    TIMESTAMPTZ NOT NULL,
    renewed_at    TIMESTAMPTZ,
    completed_at  TIMESTAMPTZ,
    receipt       BYTEA,"#
}

/// The line of [`columns`] that makes `name`, for `ADD COLUMN`.
fn column(name: &str) -> Option<&'static str> {
    columns()
        .lines()
        .map(|line| line.trim().trim_end_matches(','))
        .find(|line| line.split_whitespace().next() == Some(name))
}

/// The columns a new claim's row is inserted with, and their values: `$1` namespace, `$2`
/// key, `$3` token.
const NEW_ROW: &str = r#"(namespace, "key", state, token, deliveries, runs, reclaimed,
        first_seen_at, last_seen_at, claimed_at, renewed_at)
    SELECT $1, $2, 'processing', $3, 1, 1, FALSE, now(), now(), now(), now()"#;

/// A claim's first statement: reads the key's row (`$1` namespace, `$2` key), and inserts a
/// new one (`$3` token) only when the read found none, so that a duplicate is one index lookup
/// that writes nothing and never starts the insert. The read sees the statement's snapshot: a
/// row another delivery inserted after it was taken, which makes the insert do nothing, is in
/// neither part, and the statement answers no row.
pub(super) fn insert_or_read(table: &TableName) -> String {
    let t = table.quoted('"');
    let age_of = |at: &str| format!("(extract(epoch FROM now() - {at}) * 1000000)::bigint");
    let age = age_of("claimed_at");
    let idle = age_of("COALESCE(renewed_at, claimed_at)");
    format!(
        r#"WITH found AS (
    SELECT state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt
    FROM {t} WHERE namespace = $1 AND "key" = $2
), inserted AS (
    INSERT INTO {t} {NEW_ROW}
    WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT (namespace, "key") DO NOTHING
    RETURNING state, token, deliveries, reclaimed, 0::bigint AS age_us, 0::bigint AS idle_us,
        NULL::bytea AS receipt
)
SELECT state, token, deliveries, reclaimed, age_us, idle_us, receipt FROM found
UNION ALL
SELECT state, token, deliveries, reclaimed, age_us, idle_us, receipt FROM inserted"#
    )
}

/// The claim of a key that is likely new: the row of [`insert_or_read`] inserted, nothing
/// read and nothing returned. The count of rows it inserted tells the claim: one, acquired;
/// none, the key has a row, which a read then finds.
pub(super) fn insert_new(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(r#"INSERT INTO {t} {NEW_ROW} ON CONFLICT (namespace, "key") DO NOTHING"#)
}

pub(super) fn queries(table: TableName) -> Queries {
    let t = table.quoted('"');
    let age_of = |at: &str| format!("(extract(epoch FROM now() - {at}) * 1000000)::bigint");
    let heartbeat = "COALESCE(renewed_at, claimed_at)";
    let age = age_of("claimed_at");
    let idle = age_of(heartbeat);
    let migrate = format!(
        r#"SELECT pg_advisory_xact_lock({MIGRATE_LOCK});
SET LOCAL lock_timeout = '10s';
CREATE TABLE IF NOT EXISTS {t} (
{columns}
    PRIMARY KEY (namespace, "key")
);"#,
        columns = columns(),
    );
    // $4: whether the policy reclaims; $5: the stale limit in microseconds. A released row is
    // free; a processing one only once its owner stopped renewing it.
    let take = "(t.state = 'released' OR (t.state = 'processing' AND $4 \
         AND COALESCE(t.renewed_at, t.claimed_at) <= now() - $5::bigint * interval '1 microsecond'))";
    let claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES ($1, $2, 'processing', $3, 1, 1, FALSE, now(), now(), now(), now())
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    state = CASE WHEN {take} THEN 'processing' ELSE t.state END,
    token = CASE WHEN {take} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {take} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {take} THEN t.state = 'processing' ELSE t.reclaimed END,
    claimed_at = CASE WHEN {take} THEN now() ELSE t.claimed_at END,
    renewed_at = CASE WHEN {take} THEN now() ELSE t.renewed_at END,
    completed_at = CASE WHEN {take} THEN NULL ELSE t.completed_at END,
    receipt = CASE WHEN {take} THEN NULL ELSE t.receipt END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt"#
    );
    let fenced = r#"namespace = $1 AND "key" = $2 AND token = $3"#;
    let renew =
        format!("UPDATE {t} SET renewed_at = now() WHERE {fenced} AND state = 'processing'");
    // $1: the encoded receipt (NULL for a plain commit); a row done already keeps its own.
    let commit = format!(
        r#"UPDATE {t} SET state = 'done',
    completed_at = CASE WHEN state = 'done' THEN completed_at ELSE now() END,
    receipt = CASE WHEN state = 'done' THEN receipt ELSE $1 END
WHERE namespace = $2 AND "key" = $3 AND token = $4 AND state <> 'released'"#
    );
    // Releasing twice with one lease is harmless: a release whose answer was lost is retried.
    let release = format!(
        "UPDATE {t} SET state = 'released', \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE now() END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    // The run is taken back only on the way from `processing`: a second give-back (its answer
    // lost) finds `released` and leaves the count alone.
    let give_back = format!(
        "UPDATE {t} SET state = 'released', \
         runs = CASE WHEN state = 'processing' AND runs > 0 THEN runs - 1 ELSE runs END, \
         completed_at = CASE WHEN state = 'released' THEN completed_at ELSE now() END \
         WHERE {fenced} AND state IN ('processing', 'released')"
    );
    let describe = format!(
        r#"SELECT state, deliveries, runs, reclaimed,
    {first}, {last}, {age}, {idle}, {settled}, receipt
FROM {t} WHERE namespace = $1 AND "key" = $2"#,
        first = age_of("COALESCE(first_seen_at, claimed_at)"),
        last = age_of("COALESCE(last_seen_at, claimed_at)"),
        settled = age_of("completed_at"),
    );
    let stuck = format!(
        r#"SELECT namespace, "key", deliveries, {age} AS age_us, {idle} AS idle_us FROM {t}
WHERE state = 'processing' AND {heartbeat} <= now() - $1::bigint * interval '1 microsecond'
ORDER BY {heartbeat}, namespace, "key""#
    );
    let resolve_done = format!(
        r#"UPDATE {t} SET state = 'done', completed_at = now(), token = $1, receipt = NULL
WHERE namespace = $2 AND "key" = $3 AND state = 'processing'"#
    );
    let resolve_release = format!(
        r#"UPDATE {t} SET state = 'released', completed_at = now()
WHERE namespace = $1 AND "key" = $2 AND state = 'processing'"#
    );
    // The purge walks the primary key in batches: no index on the settle time for every
    // commit to update, and no statement that holds many rows at once. One statement a
    // batch: PostgreSQL ends no index scan at a row-value upper bound, so a batch is what a
    // `LIMIT` ends.
    let purge = format!(
        r#"WITH batch AS (
    SELECT namespace, "key" FROM {t} WHERE (namespace, "key") > ($2, $3)
    ORDER BY namespace, "key" LIMIT {PURGE_BATCH}
), gone AS (
    DELETE FROM {t} AS t USING batch
    WHERE t.namespace = batch.namespace AND t."key" = batch."key"
        AND t.state IN ('done', 'released')
        AND t.completed_at <= now() - $1::bigint * interval '1 microsecond'
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS purged, last.namespace, last."key"
FROM (SELECT namespace, "key" FROM batch ORDER BY namespace DESC, "key" DESC LIMIT 1) AS last"#
    );
    let tx_check = format!("SELECT 1 FROM {t} WHERE {fenced}");
    // A released row is free for the marker too.
    let free = "t.state = 'released'";
    let tx_claim = format!(
        r#"INSERT INTO {t} AS t (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, completed_at)
VALUES ($1, $2, 'done', $3, 1, 1, FALSE, now(), now(), now(), now())
ON CONFLICT (namespace, "key") DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    state = CASE WHEN {free} THEN 'done' ELSE t.state END,
    token = CASE WHEN {free} THEN excluded.token ELSE t.token END,
    runs = CASE WHEN {free} THEN t.runs + 1 ELSE t.runs END,
    reclaimed = CASE WHEN {free} THEN FALSE ELSE t.reclaimed END,
    claimed_at = CASE WHEN {free} THEN now() ELSE t.claimed_at END,
    completed_at = CASE WHEN {free} THEN now() ELSE t.completed_at END,
    receipt = CASE WHEN {free} THEN NULL ELSE t.receipt END
RETURNING state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt"#
    );
    let read = format!(
        r#"SELECT state, token, deliveries, reclaimed, {age} AS age_us, {idle} AS idle_us, receipt
FROM {t} WHERE namespace = $1 AND "key" = $2"#
    );
    // Written in the background, many keys a statement: the last delivery's time from how
    // long ago it was.
    let counts = (0..TALLY_CHUNK)
        .map(|row| {
            let p = 4 * row;
            let (ns, key, n, ago) = (p + 1, p + 2, p + 3, p + 4);
            format!("(${ns}::text, ${key}::text, ${n}::bigint, ${ago}::bigint)")
        })
        .collect::<Vec<_>>()
        .join(",\n    ");
    let tally = format!(
        r#"UPDATE {t} AS t SET deliveries = t.deliveries + v.n,
    last_seen_at = GREATEST(COALESCE(t.last_seen_at, t.claimed_at),
        now() - v.ago * interval '1 microsecond')
FROM (VALUES
    {counts}
) AS v (namespace, "key", n, ago)
WHERE t.namespace = v.namespace AND t."key" = v."key""#
    );
    let versions = version_queries(&table);
    statement_set!(Queries {
        read, tx_claim, tx_check, migrate, claim, renew, commit, release, give_back, describe,
        stuck, resolve_done, resolve_release;
        inbox: super::inbox::shared(&table),
        table,
        tally: tally.into(),
        versions,
        purge: Purge::Batch(purge.into()),
    })
}

/// What adds the `receipt` column to a table made before it existed: instant, as the column
/// is nullable and has no default, but under the table's lock, which `lock_timeout` bounds.
pub(super) fn add_receipt(table: &TableName) -> String {
    let t = table.quoted('"');
    let receipt = column("receipt").unwrap_or_default();
    format!("SET LOCAL lock_timeout = '10s';\nALTER TABLE {t} ADD COLUMN IF NOT EXISTS {receipt};")
}

/// What turns a table of the first release (states `processing` and `done` only, no counts
/// of runs, no heartbeat) into the current one. Existing rows keep everything they had.
pub(super) fn upgrade(table: &TableName) -> String {
    let t = table.quoted('"');
    let add = [
        "runs",
        "reclaimed",
        "first_seen_at",
        "last_seen_at",
        "renewed_at",
        "receipt",
    ]
    .into_iter()
    .filter_map(column)
    .map(|column| format!("\n    ADD COLUMN IF NOT EXISTS {column}"))
    .collect::<Vec<_>>()
    .join(",");
    // Waiting long for the table's lock would stall every claim queued behind the wait: fail
    // the start-up instead, and let it try again.
    format!(
        r#"SET LOCAL lock_timeout = '10s';
ALTER TABLE {t}{add};
UPDATE {t} SET renewed_at = claimed_at WHERE state = 'processing' AND renewed_at IS NULL;"#
    )
}

/// What drops the checks on `state` and the indexes that earlier releases made (see the
/// module docs): each check a table and its name, each index its name, as `regclass` writes
/// them (schema-qualified unless the search path finds them). Empty when there are none. In
/// `migrate()`'s transaction, under its `lock_timeout`.
pub(super) fn drop_earlier(checks: &[(String, String)], indexes: &[String]) -> String {
    let checks = checks.iter().map(|(table, name)| {
        let name = name.replace('"', "\"\"");
        format!("ALTER TABLE {table} DROP CONSTRAINT IF EXISTS \"{name}\";\n")
    });
    let indexes = indexes
        .iter()
        .map(|index| format!("DROP INDEX IF EXISTS {index};\n"));
    checks.chain(indexes).collect()
}

/// The statements on the versions table of the [version guard](crate::version_guard).
fn version_queries(table: &TableName) -> VersionQueries {
    let v = table.versions().quoted('"');
    let age = "(extract(epoch FROM now() - pending_since) * 1000000)::bigint";
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {v} (
    namespace       TEXT        NOT NULL,
    entity          TEXT        NOT NULL,
    applied_version BIGINT,
    pending_version BIGINT,
    pending_token   BIGINT,
    pending_since   TIMESTAMPTZ,
    deliveries      BIGINT      NOT NULL,
    last_seen_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, entity)
);"#
    );
    // $1 namespace, $2 entity, $3 version, $4 our token, $5 whether the policy reclaims, $6 the
    // stale limit in microseconds. Every SET expression sees the row as it was. Only an older
    // version is outdated: an equal one takes the slot like a newer one.
    let acquire = "(t.applied_version IS NULL OR t.applied_version <= excluded.pending_version) \
        AND (t.pending_token IS NULL OR ($5 AND t.pending_since <= now() - $6::bigint * interval '1 microsecond' \
            AND t.pending_version <= excluded.pending_version))";
    let begin = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, pending_version, pending_token, pending_since, deliveries, last_seen_at)
VALUES ($1, $2, $3, $4, now(), 1, now())
ON CONFLICT (namespace, entity) DO UPDATE SET
    deliveries = t.deliveries + 1,
    last_seen_at = now(),
    pending_version = CASE WHEN {acquire} THEN excluded.pending_version ELSE t.pending_version END,
    pending_token = CASE WHEN {acquire} THEN excluded.pending_token ELSE t.pending_token END,
    pending_since = CASE WHEN {acquire} THEN excluded.pending_since ELSE t.pending_since END
RETURNING applied_version, pending_version, pending_token, {age} AS age_us"#
    );
    let clear = "pending_version = NULL, pending_token = NULL, pending_since = NULL";
    let renew = format!(
        "UPDATE {v} SET pending_since = now() WHERE namespace = $1 AND entity = $2 AND pending_token = $3"
    );
    let commit = format!(
        r#"UPDATE {v} SET applied_version = GREATEST(applied_version, pending_version), {clear}
WHERE namespace = $1 AND entity = $2 AND pending_token = $3"#
    );
    let release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = $1 AND entity = $2 AND pending_token = $3"
    );
    let applied = format!("SELECT applied_version FROM {v} WHERE namespace = $1 AND entity = $2");
    let resolve_done = format!(
        r#"UPDATE {v} SET applied_version = GREATEST(applied_version, pending_version), {clear}
WHERE namespace = $1 AND entity = $2 AND pending_token IS NOT NULL"#
    );
    let resolve_release = format!(
        "UPDATE {v} SET {clear} WHERE namespace = $1 AND entity = $2 AND pending_token IS NOT NULL"
    );
    // $1 namespace, $2 entity, $3 version. A row at a newer version is locked, not changed,
    // and returns nothing; an equal one is advanced (to the same version) like an older one.
    let advance = format!(
        r#"INSERT INTO {v} AS t (namespace, entity, applied_version, deliveries, last_seen_at)
VALUES ($1, $2, $3, 1, now())
ON CONFLICT (namespace, entity) DO UPDATE SET
    applied_version = excluded.applied_version,
    deliveries = t.deliveries + 1,
    last_seen_at = now()
WHERE t.applied_version IS NULL OR t.applied_version <= excluded.applied_version
RETURNING applied_version"#
    );
    statement_set!(VersionQueries {
        migrate, renew, begin, commit, release, applied, resolve_done, resolve_release, advance;
    })
}
