//! The SQL of the PostgreSQL inbox, written once per table name: the statements every SQL
//! store runs the same way ([`InboxQueries`]), and PostgreSQL's own ([`Own`]).

use std::sync::Arc;

use crate::store::sql::{InboxPurge, InboxQueries, TableName};

/// The longest channel name PostgreSQL takes (`NAMEDATALEN - 1`).
const MAX_CHANNEL_LEN: usize = 63;

/// The key's row: `$1` namespace, `$2` key.
const KEY: &str = r#"namespace = $1 AND "key" = $2"#;

/// The statements of the PostgreSQL inbox that no other store runs: the enqueue, the take, and
/// the ones that carry a batch in arrays. Made once and shared by the store's clones. The
/// parameters of each are listed where it is written.
pub(crate) struct Own {
    /// The channel the enqueue (and an operator's retry) notifies.
    pub(crate) channel: String,
    pub(crate) enqueue: Arc<str>,
    pub(crate) take: Arc<str>,
    pub(crate) start: Arc<str>,
    pub(crate) untake: Arc<str>,
    pub(crate) settle_many: Arc<str>,
    /// The notification alone, which [`Herald`](super::herald::Herald) sends.
    pub(crate) herald: Arc<str>,
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

/// The statements every SQL store runs the same way, in PostgreSQL's words.
pub(crate) fn shared(table: &TableName) -> InboxQueries {
    let inbox = table.inbox();
    let t = inbox.quoted('"');
    let index = |suffix: &str| format!("\"{}_{suffix}\"", inbox.bare());
    let age_of = |at: &str| micros_between(at, "now()");
    let migrate = format!(
        r#"CREATE TABLE IF NOT EXISTS {t} (
    namespace   TEXT        NOT NULL,
    "key"       TEXT        NOT NULL,
    state       TEXT        NOT NULL,
    token       BIGINT,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    crashes     INTEGER     NOT NULL DEFAULT 0,
    started     BOOLEAN     NOT NULL DEFAULT TRUE,
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
    let add_started =
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS started BOOLEAN NOT NULL DEFAULT TRUE");
    let lease = format!("{KEY} AND token = $3 AND state = 'running'");
    // $1 state, $2 microseconds until due or NULL, $3 whether a started attempt is taken
    // back, $4 history or NULL, $5 namespace, $6 key, $7 token.
    let settle = format!(
        r#"UPDATE {t} SET state = $1::text, token = NULL, started = FALSE,
    settled_at = CASE WHEN $1::text IN ('done', 'dead') THEN now() ELSE settled_at END,
    due_at = CASE WHEN $2::bigint IS NULL THEN due_at
        ELSE now() + $2::bigint * interval '1 microsecond' END,
    attempts = GREATEST(attempts - CASE WHEN $3::boolean AND started THEN 1 ELSE 0 END, 0),
    history = COALESCE($4::bytea, history)
WHERE namespace = $5 AND "key" = $6 AND token = $7 AND state = 'running'"#
    );
    let described = format!(
        r#"namespace, "key", state, attempts::bigint, crashes::bigint, {age} AS age_us,
    CASE WHEN state = 'queued' THEN {due} END AS due_us,
    CASE WHEN state = 'running' THEN {idle} END AS idle_us,
    CAST(request IS NOT NULL AS integer)::bigint AS has_request, history"#,
        age = age_of("received_at"),
        due = micros_between("now()", "due_at"),
        idle = age_of("renewed_at"),
    );
    let of_namespace = "($1::text IS NULL OR namespace = $2::text)";
    // A dead entry starts over; a queued one is only made due.
    let retry = format!(
        "UPDATE {t} SET state = 'queued', due_at = now(), settled_at = NULL, token = NULL, \
         started = FALSE, attempts = CASE WHEN state = 'dead' THEN 0 ELSE attempts END, \
         crashes = CASE WHEN state = 'dead' THEN 0 ELSE crashes END"
    );
    let by_hand = format!(
        "{KEY} AND (state IN ('queued', 'dead') OR state = 'running' AND ($3::boolean \
         OR renewed_at <= now() - $4::bigint * interval '1 microsecond'))"
    );
    // Each count reads the rows of one state alone: the partial indexes hold the queued and
    // the running ones.
    let count = |state: &str| {
        format!("(SELECT count(*) FROM {t} WHERE state = '{state}' AND {of_namespace})")
    };
    // Rows another statement holds are left for the next purge.
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
    InboxQueries {
        migrate: migrate.into(),
        add_started: add_started.into(),
        state: format!("SELECT state FROM {t} WHERE {KEY}").into(),
        renew: format!("UPDATE {t} SET renewed_at = now() WHERE {lease}").into(),
        settle: settle.into(),
        start: format!(
            "UPDATE {t} SET attempts = CASE WHEN started THEN attempts ELSE attempts + 1 END, \
             started = TRUE WHERE {lease}"
        )
        .into(),
        untake: format!("{UNTAKE} token = $1", UNTAKE = untake(&t)).into(),
        entries: format!(
            r#"SELECT {described} FROM {t}
WHERE {of_namespace} AND ((state = 'queued' AND $3) OR (state = 'running' AND $4)
    OR (state = 'done' AND $5) OR (state = 'dead' AND $6))
ORDER BY received_at, namespace, "key" LIMIT $7"#
        )
        .into(),
        entry: format!("SELECT {described} FROM {t} WHERE {KEY}").into(),
        request: format!("SELECT request FROM {t} WHERE {KEY}").into(),
        retry_now: format!("{retry} WHERE {by_hand}").into(),
        retry_dead: format!("{retry} WHERE namespace = $1 AND state = 'dead'").into(),
        discard: format!(
            "UPDATE {t} SET state = 'done', token = NULL, started = FALSE, settled_at = now() \
             WHERE {by_hand}"
        )
        .into(),
        stats: format!(
            r#"SELECT {queued}, {running}, {dead},
    (SELECT {oldest} FROM {t} WHERE state = 'queued' AND due_at <= now() AND {of_namespace})"#,
            queued = count("queued"),
            running = count("running"),
            dead = count("dead"),
            oldest = age_of("min(due_at)"),
        )
        .into(),
        purge: InboxPurge::Direct {
            requests: format!(
                r#"{old}
UPDATE {t} AS t SET request = NULL FROM old
WHERE t.namespace = old.namespace AND t."key" = old."key""#,
                old = old(" AND request IS NOT NULL"),
            )
            .into(),
            entries: format!(
                r#"{old}
DELETE FROM {t} AS t USING old
WHERE t.namespace = old.namespace AND t."key" = old."key""#,
                old = old(""),
            )
            .into(),
        },
    }
}

/// A give-back by token, to be completed with the tokens' condition: the running rows alone
/// are read (the partial index holds them).
fn untake(t: &str) -> String {
    format!(
        "UPDATE {t} SET state = 'queued', token = NULL, due_at = now(), \
         attempts = GREATEST(attempts - CASE WHEN started THEN 1 ELSE 0 END, 0), \
         started = FALSE WHERE state = 'running' AND"
    )
}

/// PostgreSQL's own statements.
pub(crate) fn own(table: &TableName) -> Own {
    let inbox = table.inbox();
    let t = inbox.quoted('"');
    let channel = channel(&inbox);
    // The name is letters, digits, `_` and `.` only: a literal needs no escaping.
    let notify = format!("pg_notify('{channel}', '')");
    // $1 namespace, $2 key, $3 the encoded request. A duplicate is the read alone: the insert
    // does not start. A row another enqueue committed after the statement's snapshot is in
    // neither part (the insert runs into it and does nothing): no row is answered then. The
    // insert carries no notification: one committed with it would hold PostgreSQL's lock on
    // the notification queue through the commit's flush, one commit at a time (see
    // `herald`).
    let enqueue = format!(
        r#"WITH found AS (
    SELECT state FROM {t} WHERE {KEY}
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
    // $1 the limit, $2 whether the policy reclaims, $3 the stale limit in microseconds, $4 the
    // most attempts, $5 the worker's tokens, one per entry the limit allows. Each kind of
    // candidate is read in its index's order and locked, skipping the rows other workers
    // hold; the oldest due of both are leased, not yet started. A stale entry whose handler
    // never started is taken as a queued one is, under either policy; one whose handler
    // started crashed, and past its last attempt becomes dead instead, and is not answered.
    let dead = "(p.crashed AND t.attempts >= $4::integer)";
    let take = format!(
        r#"WITH queued AS (
    SELECT namespace, "key", due_at, FALSE AS crashed FROM {t}
    WHERE state = 'queued' AND due_at <= now()
    ORDER BY due_at LIMIT $1
    FOR UPDATE SKIP LOCKED
), stale AS (
    SELECT namespace, "key", due_at, started AS crashed FROM {t}
    WHERE state = 'running' AND ($2 OR NOT started)
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
        started = FALSE,
        crashes = CASE WHEN p.crashed THEN t.crashes + 1 ELSE t.crashes END,
        renewed_at = CASE WHEN {dead} THEN t.renewed_at ELSE now() END,
        settled_at = CASE WHEN {dead} THEN now() ELSE t.settled_at END
    FROM picked AS p
    WHERE t.namespace = p.namespace AND t."key" = p."key"
    RETURNING t.namespace, t."key", t.state, t.token, t.attempts, t.crashes, p.crashed,
        t.request, t.history, p.n, t.received_at
)
SELECT namespace, "key", token, attempts::bigint, crashes::bigint, crashed, request, history,
    (extract(epoch FROM received_at) * 1000000)::bigint
FROM leased WHERE state = 'running' ORDER BY n"#
    );
    // $1 namespaces, $2 keys, $3 tokens: each lease's entry started, its attempt counted once.
    // Answers the token of each lease that still held its entry.
    let start = format!(
        r#"UPDATE {t} AS t SET
    attempts = CASE WHEN t.started THEN t.attempts ELSE t.attempts + 1 END, started = TRUE
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v(namespace, "key", token)
WHERE t.namespace = v.namespace AND t."key" = v."key" AND t.token = v.token
    AND t.state = 'running'
RETURNING t.token"#
    );
    // The arrays hold one element per lease, as the parameters of the settlement of one do;
    // answers the (namespace, key, token) of each row settled.
    let settle_many = format!(
        r#"UPDATE {t} AS t SET state = v.state, token = NULL, started = FALSE,
    settled_at = CASE WHEN v.state IN ('done', 'dead') THEN now() ELSE t.settled_at END,
    due_at = CASE WHEN v.due_us IS NULL THEN t.due_at
        ELSE now() + v.due_us * interval '1 microsecond' END,
    attempts = GREATEST(t.attempts - CASE WHEN v.taken_back AND t.started THEN 1 ELSE 0 END, 0),
    history = COALESCE(v.history, t.history)
FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::bytea[], $5::text[], $6::text[],
    $7::bigint[]) AS v(state, due_us, taken_back, history, namespace, "key", token)
WHERE t.namespace = v.namespace AND t."key" = v."key" AND t.token = v.token
    AND t.state = 'running'
RETURNING t.namespace, t."key", v.token"#
    );
    Own {
        enqueue: enqueue.into(),
        take: take.into(),
        start: start.into(),
        untake: format!("{} token = ANY($1::bigint[])", untake(&t)).into(),
        settle_many: settle_many.into(),
        herald: format!("SELECT {notify}").into(),
        channel,
    }
}
