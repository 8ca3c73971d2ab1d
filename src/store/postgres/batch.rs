//! Group commit on PostgreSQL: the claims of concurrent deliveries go in one statement, and
//! so do their commits and the inbox's entries (see [`Batcher`]). A lone claim or commit is
//! sent as the [module docs](super#round-trips) say; a batch binds arrays and `unnest`s them:
//!
//! - claims: `WITH input AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH
//!   ORDINALITY …), found AS (<the rows of the keys that exist>), inserted AS (INSERT … SELECT
//!   … FROM input WHERE <not found> ORDER BY <position> ON CONFLICT DO NOTHING RETURNING …)
//!   SELECT … FROM found UNION ALL SELECT … FROM inserted`: the insert-or-read of each key, its
//!   row answered with the key's position;
//! - commits: `UPDATE … FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) …
//!   WHERE <key and token match> AND state <> 'released' RETURNING <the key>`: a commit whose
//!   key is missing from the answer lost its lease;
//! - inbox entries: the claims' statement on the inbox table, each new key inserted with its
//!   request, each existing one read.
//!
//! The keys of a batch are sorted, so that two instances' batches insert shared keys in the
//! same order and never wait for each other in a cycle. A key may be twice in a batch of
//! claims or of inbox entries (`ON CONFLICT DO NOTHING` takes it, and both positions answer
//! its row), never in a batch of commits. A batch that fails to serialize or
//! is chosen as a deadlock's victim is sent again write by write, each on the lone path with
//! its own retry; any other failure fails the batch's writes, answered 503.

use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row as _};

use super::claims::{Lone, is_retryable};
use crate::store::batch::{
    Answers, Batcher, ClaimWrite, CommitWrite, EnqueueWrite, Shape, all_fail, batcher, key_order,
    or_alone,
};
use crate::store::inbox::Settling;
use crate::store::sql::{ClaimRow, ResultExt as _, TableName, settlement};
use crate::store::{Lease, LeaseToken, StoreError};

/// The batches of one kind in flight at once: a second delivery that arrives while one
/// statement runs goes at once on the second, as it would without batching.
const LANES: usize = 2;

/// The batchers of one store's claims and commits. Clones share them.
#[derive(Clone)]
pub(super) struct Batches {
    /// Answers the row a claim's first statement found or inserted (none: the row was
    /// inserted by a delivery that committed after the statement's snapshot).
    pub(super) claims: Batcher<ClaimWrite, Option<ClaimRow>>,
    /// Answers the rows a commit matched: 0 when the lease is lost.
    pub(super) commits: Batcher<CommitWrite, u64>,
    /// Answers the state of the key's inbox entry and whether this insert stored it (none: the
    /// entry was stored by an enqueue that committed after the statement's snapshot).
    pub(super) enqueues: Batcher<EnqueueWrite, Option<(String, bool)>>,
}

/// The statements of a batch, and the lone ones its writes go again by when the batch must be
/// sent again write by write.
struct Statements {
    lone: Arc<Lone>,
    claims: String,
    commits: String,
    enqueues: String,
}

impl Batches {
    /// Batches of at most `most` writes in `table` and its inbox, whose writes go alone as
    /// `lone` says.
    pub(super) fn new(lone: Arc<Lone>, table: &TableName, most: usize) -> Self {
        let statements = Arc::new(Statements {
            lone: lone.clone(),
            claims: claims(table),
            commits: commits(table),
            enqueues: enqueues(table),
        });
        // A claim's insert-or-read answers every position of a key, each telling its own
        // token: one batch may carry a key twice. An `UPDATE … FROM` changes a row once,
        // however many bound rows name it, and an inbox insert would tell every position of a
        // key that it stored the entry: one commit, and one entry, of a key a batch.
        let shape = Shape::new(most, LANES);
        let claims = batcher!(shape.same_key(), lone.claim_one, statements.claim_all);
        let commits = batcher!(shape, lone.commit_one, statements.commit_all);
        let enqueues = batcher!(shape, lone.enqueue_one, statements.enqueue_all);
        Self {
            claims,
            commits,
            enqueues,
        }
    }
}

impl Statements {
    async fn claim_all(&self, writes: Vec<ClaimWrite>) -> Answers<Option<ClaimRow>> {
        let order = key_order(&writes);
        let (namespaces, keys, tokens) = order.iter().fold(
            (Vec::new(), Vec::new(), Vec::new()),
            |(mut n, mut k, mut t), &i| {
                n.push(writes[i].key.namespace());
                k.push(writes[i].key.value());
                t.push(writes[i].token.to_i64());
                (n, k, t)
            },
        );
        let rows = sqlx::query(AssertSqlSafe(self.claims.as_str()))
            .bind(namespaces)
            .bind(keys)
            .bind(tokens)
            .fetch_all(&self.lone.pool)
            .await;
        let rows = match or_alone(rows, &writes, is_retryable, |write| {
            self.lone.claim_one(write)
        })
        .await
        {
            Ok(rows) => rows,
            Err(answers) => return answers,
        };
        answered(
            &rows,
            &order,
            || None,
            7,
            |row| ClaimRow::read(row).map(Some),
        )
    }

    async fn commit_all(&self, writes: Vec<CommitWrite>) -> Answers<u64> {
        let order = key_order(&writes);
        let mut namespaces = Vec::with_capacity(order.len());
        let mut keys = Vec::with_capacity(order.len());
        let mut tokens = Vec::with_capacity(order.len());
        let mut receipts = Vec::with_capacity(order.len());
        for &i in &order {
            namespaces.push(writes[i].key.namespace());
            keys.push(writes[i].key.value());
            tokens.push(writes[i].token.to_i64());
            receipts.push(writes[i].receipt.as_deref());
        }
        let rows = sqlx::query(AssertSqlSafe(self.commits.as_str()))
            .bind(namespaces)
            .bind(keys)
            .bind(tokens)
            .bind(receipts)
            .fetch_all(&self.lone.pool)
            .await;
        let rows = match or_alone(rows, &writes, is_retryable, |write| {
            self.lone.commit_one(write)
        })
        .await
        {
            Ok(rows) => rows,
            Err(answers) => return answers,
        };
        answered(&rows, &order, || 0, 0, |_| Ok(1))
    }

    async fn enqueue_all(&self, writes: Vec<EnqueueWrite>) -> Answers<Option<(String, bool)>> {
        let order = key_order(&writes);
        let mut namespaces = Vec::with_capacity(order.len());
        let mut keys = Vec::with_capacity(order.len());
        let mut requests = Vec::with_capacity(order.len());
        for &i in &order {
            namespaces.push(writes[i].key.namespace());
            keys.push(writes[i].key.value());
            requests.push(writes[i].request.as_slice());
        }
        let rows = sqlx::query(AssertSqlSafe(self.enqueues.as_str()))
            .bind(namespaces)
            .bind(keys)
            .bind(requests)
            .fetch_all(&self.lone.pool)
            .await;
        let rows = match or_alone(rows, &writes, is_retryable, |write| {
            self.lone.enqueue_one(write)
        })
        .await
        {
            Ok(rows) => rows,
            Err(answers) => return answers,
        };
        answered(
            &rows,
            &order,
            || None,
            2,
            |row| Ok(Some((row.try_get(0).store()?, row.try_get(1).store()?))),
        )
    }
}

/// The answers of a batch's writes from the rows its statement answered: each row names, in
/// its column `at`, the 1-based position of its write in the arrays, and `read` reads its
/// answer; a write no row names answers `unnamed`. A row naming no write fails them all.
fn answered<T>(
    rows: &[PgRow],
    order: &[usize],
    unnamed: impl Fn() -> T,
    at: usize,
    read: impl Fn(&PgRow) -> Result<T, StoreError>,
) -> Answers<T> {
    let mut answers: Answers<T> = order.iter().map(|_| Ok(unnamed())).collect();
    for row in rows {
        let n = row.try_get::<i64, _>(at).store();
        match n.and_then(|n| position(order, n)) {
            Ok(write) => answers[write] = read(row),
            Err(error) => return all_fail(error, order.len()),
        }
    }
    answers
}

/// The index of the write at 1-based position `n` of the statement's arrays.
fn position(order: &[usize], n: i64) -> Result<usize, StoreError> {
    usize::try_from(n - 1)
        .ok()
        .and_then(|n| order.get(n).copied())
        .ok_or_else(|| {
            StoreError::backend(format!("a batch answered position {n} of {}", order.len()))
        })
}

/// The claims of a batch (see the module docs): `$1` namespaces, `$2` keys, `$3` tokens. Each
/// row answered is a claim's seven columns and the key's 1-based position in the arrays.
fn claims(table: &TableName) -> String {
    let t = table.quoted('"');
    let age_of = |at: &str| format!("(extract(epoch FROM now() - {at}) * 1000000)::bigint");
    let age = age_of("t.claimed_at");
    let idle = age_of("COALESCE(t.renewed_at, t.claimed_at)");
    format!(
        r#"WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        WITH ORDINALITY AS i(namespace, "key", token, n)
), found AS (
    SELECT t.state, t.token, t.deliveries, t.reclaimed, {age} AS age_us, {idle} AS idle_us,
        t.receipt, i.n
    FROM input i JOIN {t} t ON t.namespace = i.namespace AND t."key" = i."key"
), inserted AS (
    INSERT INTO {t} (namespace, "key", state, token, deliveries, runs, reclaimed,
        first_seen_at, last_seen_at, claimed_at, renewed_at)
    SELECT i.namespace, i."key", 'processing', i.token, 1, 1, FALSE, now(), now(), now(), now()
    FROM input i WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.n = i.n)
    ORDER BY i.n
    ON CONFLICT (namespace, "key") DO NOTHING
    RETURNING namespace, "key", state, token, deliveries, reclaimed
)
SELECT state, token, deliveries, reclaimed, age_us, idle_us, receipt, n FROM found
UNION ALL
SELECT x.state, x.token, x.deliveries, x.reclaimed, 0::bigint, 0::bigint, NULL::bytea, i.n
FROM inserted x JOIN input i ON i.namespace = x.namespace AND i."key" = x."key""#
    )
}

/// The commits of a batch: `$1` namespaces, `$2` keys, `$3` tokens, `$4` receipts (NULL for a
/// plain commit). A row done already keeps its own time and receipt, as a lone commit does.
/// Answers the 1-based position of each write whose row it matched.
fn commits(table: &TableName) -> String {
    let t = table.quoted('"');
    format!(
        r#"UPDATE {t} AS t SET state = 'done',
    completed_at = CASE WHEN t.state = 'done' THEN t.completed_at ELSE now() END,
    receipt = CASE WHEN t.state = 'done' THEN t.receipt ELSE i.receipt END
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[])
    WITH ORDINALITY AS i(namespace, "key", token, receipt, n)
WHERE t.namespace = i.namespace AND t."key" = i."key" AND t.token = i.token
    AND t.state <> 'released'
RETURNING i.n"#
    )
}

/// The inbox entries of a batch: `$1` namespaces, `$2` keys, `$3` encoded requests. Each row
/// answered is the entry's state, whether this statement stored it, and the key's 1-based
/// position in the arrays.
fn enqueues(table: &TableName) -> String {
    let t = table.inbox().quoted('"');
    format!(
        r#"WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])
        WITH ORDINALITY AS i(namespace, "key", request, n)
), found AS (
    SELECT t.state, i.n
    FROM input i JOIN {t} t ON t.namespace = i.namespace AND t."key" = i."key"
), inserted AS (
    INSERT INTO {t} (namespace, "key", state, attempts, crashes, received_at, due_at,
        renewed_at, request)
    SELECT i.namespace, i."key", 'queued', 0, 0, now(), now(), now(), i.request
    FROM input i WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.n = i.n)
    ORDER BY i.n
    ON CONFLICT (namespace, "key") DO NOTHING
    RETURNING namespace, "key"
)
SELECT state, FALSE AS stored, n FROM found
UNION ALL
SELECT 'queued', TRUE, i.n
FROM inserted x JOIN input i ON i.namespace = x.namespace AND i."key" = x."key""#
    )
}

/// The inbox's batches that PostgreSQL binds as arrays, one element per entry.
impl super::PostgresStore {
    /// A take's start: one `UPDATE … FROM unnest(…)`, answering the token of each lease that
    /// still held its entry.
    pub(super) async fn start_all(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let namespaces: Vec<&str> = leases.iter().map(|l| l.key().namespace()).collect();
        let keys: Vec<&str> = leases.iter().map(|l| l.key().value()).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| l.token().to_i64()).collect();
        let started: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.inbox.start.clone()))
            .bind(namespaces)
            .bind(keys)
            .bind(&tokens)
            .fetch_all(self.pool())
            .await
            .store()?;
        Ok(tokens.iter().map(|t| started.contains(t)).collect())
    }

    /// A give-back by token: one `UPDATE … WHERE token = ANY($1)`.
    pub(super) async fn untake_all(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        let tokens: Vec<i64> = tokens.iter().map(|t| t.to_i64()).collect();
        let done = sqlx::query(AssertSqlSafe(self.inbox.untake.clone()))
            .bind(tokens)
            .execute(self.pool())
            .await
            .store()?;
        Ok(done.rows_affected())
    }

    /// A batch of settlements in one statement, its arrays one element per settlement: each
    /// whose lease held is answered settled, the others lost; a failure fails them all.
    pub(super) async fn settle_all(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        let mut columns = (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for one in batch {
            let (state, due, taken_back, history) = settlement(&one.settlement, &one.history);
            columns.0.push(state.as_str());
            columns.1.push(due);
            columns.2.push(taken_back);
            columns.3.push(history);
            columns.4.push(one.lease.key().namespace());
            columns.5.push(one.lease.key().value());
            columns.6.push(one.lease.token().to_i64());
        }
        let rows = sqlx::query(AssertSqlSafe(self.inbox.settle_many.clone()))
            .bind(columns.0)
            .bind(columns.1)
            .bind(columns.2)
            .bind(columns.3)
            .bind(columns.4)
            .bind(columns.5)
            .bind(columns.6)
            .fetch_all(self.pool())
            .await;
        let settled: std::collections::HashSet<(String, String, i64)> = match rows {
            Ok(rows) => rows
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect(),
            Err(error) => {
                return crate::store::batch::all_fail(error, batch.len());
            }
        };
        batch
            .iter()
            .map(|one| {
                let key = one.lease.key();
                let row = (
                    key.namespace().to_owned(),
                    key.value().to_owned(),
                    one.lease.token().to_i64(),
                );
                if settled.contains(&row) {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost)
                }
            })
            .collect()
    }
}
