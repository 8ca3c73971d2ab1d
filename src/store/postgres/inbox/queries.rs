//! The SQL of the PostgreSQL inbox: its table and every statement, written once per table
//! name.

use std::sync::Arc;

use crate::store::sql::TableName;

/// The longest channel name PostgreSQL takes (`NAMEDATALEN - 1`).
const MAX_CHANNEL_LEN: usize = 63;

/// The statements on the inbox table `<table>_inbox`, made once and shared by the store's
/// clones. The parameters of each are listed where it is written.
pub(crate) struct InboxQueries {
    /// The channel the enqueue (and an operator's retry) notifies.
    pub(crate) channel: String,
    pub(crate) migrate: Arc<str>,
    pub(crate) enqueue: Arc<str>,
    pub(crate) state: Arc<str>,
    pub(crate) take: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) settle: Arc<str>,
    pub(crate) settle_many: Arc<str>,
    /// The notification alone, which [`Herald`](super::herald::Herald) sends.
    pub(crate) herald: Arc<str>,
    pub(crate) entries: Arc<str>,
    pub(crate) entry: Arc<str>,
    pub(crate) request: Arc<str>,
    pub(crate) retry_now: Arc<str>,
    pub(crate) retry_dead: Arc<str>,
    pub(crate) discard: Arc<str>,
    pub(crate) stats: Arc<str>,
    pub(crate) purge_requests: Arc<str>,
    pub(crate) purge_entries: Arc<str>,
}

/// Microseconds from `from` to `to`, by the database's clock.
fn micros_between(from: &str, to: &str) -> String {
    format!("(extract(epoch FROM {to} - {from}) * 1000000)::bigint")
}

/// The channel of the inbox: its table's name as given, schema and all, unless that is
/// longer than PostgreSQL takes; then the name without its schema (inboxes of one name in two
/// schemas then wake each other's workers, for nothing worse than a look at an empty inbox).
fn channel(inbox: &TableName) -> String {
    let name = inbox.name();
    if name.len() <= MAX_CHANNEL_LEN {
        name
    } else {
        inbox.bare().to_owned()
    }
}

pub(crate) fn inbox_queries(table: &TableName) -> InboxQueries {
    let inbox = table.inbox();
    let t = inbox.quoted('"');
    let index = |suffix: &str| format!("\"{}_{suffix}\"", inbox.bare());
    let channel = channel(&inbox);
    // The name is letters, digits, `_` and `.` only: a literal needs no escaping.
    let notify = format!("pg_notify('{channel}', '')");
    let age_of = |at: &str| micros_between(at, "now()");
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace   TEXT        NOT NULL,
    "key"       TEXT        NOT NULL,
    state       TEXT        NOT NULL,
    token       BIGINT,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    crashes     INTEGER     NOT NULL DEFAULT 0,
    received_at TIMESTAMPTZ NOT NULL,
    due_at      TIMESTAMPTZ NOT NULL,
    renewed_at  TIMESTAMPTZ NOT NULL,
    settled_at  TIMESTAMPTZ,
    request     BYTEA,
    history     BYTEA,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX IF NOT EXISTS {due} ON {t} (due_at) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS {run} ON {t} (renewed_at) WHERE state = 'running';"#,
        due = index("due_idx"),
        run = index("run_idx"),
    );
    // $1 namespace, $2 key, $3 the encoded request. A duplicate is the read alone: the insert
    // does not start. A row another enqueue committed after the statement's snapshot is in
    // neither part (the insert runs into it and does nothing): no row is answered then. The
    // insert carries no notification: one committed with it would hold PostgreSQL's lock on
    // the notification queue through the commit's flush, one commit at a time (see
    // `herald`).
    let enqueue = format!(
        r#"WITH found AS (
    SELECT state FROM {t} WHERE namespace = $1 AND "key" = $2
), inserted AS (
    INSERT INTO {t} (namespace, "key", state, attempts, crashes, received_at, due_at,
        renewed_at, request)
    SELECT $1, $2, 'queued', 0, 0, now(), now(), now(), $3
    WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT (namespace, "key") DO NOTHING
    RETURNING state
)
SELECT state, FALSE AS stored FROM found
UNION ALL
SELECT state, TRUE AS stored FROM inserted"#
    );
    let herald = format!("SELECT {notify}");
    let key = r#"namespace = $1 AND "key" = $2"#;
    let state = format!("SELECT state FROM {t} WHERE {key}");
    // $1 the limit, $2 whether the policy reclaims, $3 the stale limit in microseconds, $4 the
    // most attempts, $5 one fresh token per entry the limit allows. Each kind of candidate is
    // read in its index's order and locked, skipping the rows other workers hold; the oldest
    // due of both are leased. A crashed entry past its last attempt becomes dead instead, and
    // is not answered.
    let dead = "(p.crashed AND t.attempts >= $4::integer)";
    let take = format!(
        r#"WITH queued AS (
    SELECT namespace, "key", due_at, FALSE AS crashed FROM {t}
    WHERE state = 'queued' AND due_at <= now()
    ORDER BY due_at LIMIT $1
    FOR UPDATE SKIP LOCKED
), stale AS (
    SELECT namespace, "key", due_at, TRUE AS crashed FROM {t}
    WHERE $2 AND state = 'running'
        AND renewed_at <= now() - $3::bigint * interval '1 microsecond'
    ORDER BY due_at LIMIT $1
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT namespace, "key", crashed,
        row_number() OVER (ORDER BY due_at, namespace, "key") AS n
    FROM (SELECT * FROM queued UNION ALL SELECT * FROM stale) AS due
    ORDER BY n LIMIT $1
), leased AS (
    UPDATE {t} AS t SET
        state = CASE WHEN {dead} THEN 'dead' ELSE 'running' END,
        token = CASE WHEN {dead} THEN NULL ELSE ($5::bigint[])[p.n] END,
        attempts = CASE WHEN {dead} THEN t.attempts ELSE t.attempts + 1 END,
        crashes = CASE WHEN p.crashed THEN t.crashes + 1 ELSE t.crashes END,
        renewed_at = CASE WHEN {dead} THEN t.renewed_at ELSE now() END,
        settled_at = CASE WHEN {dead} THEN now() ELSE t.settled_at END
    FROM picked AS p
    WHERE t.namespace = p.namespace AND t."key" = p."key"
    RETURNING t.namespace, t."key", t.state, t.token, t.attempts, t.crashes, p.crashed,
        t.request, t.history, p.n
)
SELECT namespace, "key", token, attempts, crashes, crashed, request, history
FROM leased WHERE state = 'running' ORDER BY n"#
    );
    // $1 namespace, $2 key, $3 token.
    let held = format!("{key} AND token = $3 AND state = 'running'");
    let renew = format!("UPDATE {t} SET renewed_at = now() WHERE {held}");
    // ... and $4 the new state, $5 the delay until due in microseconds (NULL: the due time
    // stays), $6 the attempts taken back, $7 the encoded history (NULL: it stays).
    let settle = format!(
        r#"UPDATE {t} SET state = $4::text, token = NULL,
    settled_at = CASE WHEN $4::text IN ('done', 'dead') THEN now() ELSE settled_at END,
    due_at = CASE WHEN $5::bigint IS NULL THEN due_at
        ELSE now() + $5::bigint * interval '1 microsecond' END,
    attempts = GREATEST(attempts - $6::integer, 0),
    history = COALESCE($7::bytea, history)
WHERE {held}"#
    );
    // Several settlements in one statement: the arrays hold one element per lease, as the
    // parameters of `settle` do; answers the (namespace, key, token) of each row settled.
    let settle_many = format!(
        r#"UPDATE {t} AS t SET state = v.state, token = NULL,
    settled_at = CASE WHEN v.state IN ('done', 'dead') THEN now() ELSE t.settled_at END,
    due_at = CASE WHEN v.due_us IS NULL THEN t.due_at
        ELSE now() + v.due_us * interval '1 microsecond' END,
    attempts = GREATEST(t.attempts - v.taken_back, 0),
    history = COALESCE(v.history, t.history)
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::integer[],
    $7::bytea[]) AS v(namespace, "key", token, state, due_us, taken_back, history)
WHERE t.namespace = v.namespace AND t."key" = v."key" AND t.token = v.token
    AND t.state = 'running'
RETURNING t.namespace, t."key", v.token"#
    );
    let described = format!(
        r#"namespace, "key", state, attempts, crashes, {age} AS age_us,
    CASE WHEN state = 'queued' THEN {due} END AS due_us,
    CASE WHEN state = 'running' THEN {idle} END AS idle_us,
    request IS NOT NULL AS has_request, history"#,
        age = age_of("received_at"),
        due = micros_between("now()", "due_at"),
        idle = age_of("renewed_at"),
    );
    let of_namespace = "($1::text IS NULL OR namespace = $1::text)";
    // $1 the namespace or NULL, $2 the states (none: all), $3 the limit.
    let entries = format!(
        r#"SELECT {described} FROM {t}
WHERE {of_namespace} AND (cardinality($2::text[]) = 0 OR state = ANY($2::text[]))
ORDER BY received_at, namespace, "key" LIMIT $3"#
    );
    let entry = format!("SELECT {described} FROM {t} WHERE {key}");
    let request = format!("SELECT request FROM {t} WHERE {key}");
    // A dead entry starts over; a queued one is only made due. Workers elsewhere are told.
    let retry = |which: &str| {
        format!(
            r#"WITH retried AS (
    UPDATE {t} SET state = 'queued', due_at = now(), settled_at = NULL, token = NULL,
        attempts = CASE WHEN state = 'dead' THEN 0 ELSE attempts END,
        crashes = CASE WHEN state = 'dead' THEN 0 ELSE crashes END
    WHERE {which}
    RETURNING 1
), woken AS (
    SELECT {notify} FROM (SELECT 1 FROM retried LIMIT 1) AS one
)
SELECT (SELECT count(*) FROM retried) AS retried, (SELECT count(*) FROM woken) AS woken"#
        )
    };
    // $1 namespace, $2 key; or $1 namespace.
    let retry_now = retry(&format!("{key} AND state IN ('queued', 'running', 'dead')"));
    let retry_dead = retry("namespace = $1 AND state = 'dead'");
    let discard = format!(
        "UPDATE {t} SET state = 'done', token = NULL, settled_at = now() \
         WHERE {key} AND state IN ('queued', 'running', 'dead')"
    );
    // $1 the namespace or NULL. Each count reads the rows of one state alone: the partial
    // indexes hold the queued and the running ones.
    let count = |state: &str| {
        format!("(SELECT count(*) FROM {t} WHERE state = '{state}' AND {of_namespace})")
    };
    let stats = format!(
        r#"SELECT {queued}, {running}, {dead},
    (SELECT {oldest} FROM {t} WHERE state = 'queued' AND due_at <= now() AND {of_namespace})"#,
        queued = count("queued"),
        running = count("running"),
        dead = count("dead"),
        oldest = age_of("min(due_at)"),
    );
    // $1 the age in microseconds, $2 the limit. Rows another statement holds are left for the
    // next purge.
    let old = |also: &str| {
        format!(
            r#"WITH old AS (
    SELECT namespace, "key" FROM {t}
    WHERE state = 'done'{also} AND settled_at <= now() - $1::bigint * interval '1 microsecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)"#
        )
    };
    let purge_requests = format!(
        r#"{old}
UPDATE {t} AS t SET request = NULL FROM old
WHERE t.namespace = old.namespace AND t."key" = old."key""#,
        old = old(" AND request IS NOT NULL"),
    );
    let purge_entries = format!(
        r#"{old}
DELETE FROM {t} AS t USING old
WHERE t.namespace = old.namespace AND t."key" = old."key""#,
        old = old(""),
    );
    InboxQueries {
        channel,
        migrate: migrate.into(),
        enqueue: enqueue.into(),
        state: state.into(),
        take: take.into(),
        renew: renew.into(),
        settle: settle.into(),
        settle_many: settle_many.into(),
        herald: herald.into(),
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
