//! Group commit on MySQL and MariaDB: the claims of concurrent deliveries go in one
//! statement (MariaDB 10.5 and later), and so do their commits (both), as the
//! [`Batcher`] sends them. A lone claim or commit is the statement of the [module
//! docs](super#round-trips).
//!
//! - claims: one multi-row `INSERT … VALUES (…), (…) ON DUPLICATE KEY UPDATE token = token
//!   RETURNING …, namespace, key`: the insert-or-read of each key, as alone;
//! - commits: one `UPDATE (SELECT ? … UNION ALL SELECT ? …) AS v STRAIGHT_JOIN <table> AS t ON
//!   <key> SET … WHERE t.token = v.token AND t.state = 'processing'`. When it matches fewer
//!   rows than the batch has commits (a lease lost, or a commit repeated), one read of the
//!   batch's rows tells which: a row `done` under the commit's token is committed.
//!
//! The rows of a batch are sorted by key, so that two instances' batches lock shared keys in
//! one order. Statements come in sizes that are powers of two (a claim batch repeats its last
//! row, which then reads the row its first copy wrote; a commit batch adds rows that match no
//! key), so that each connection prepares a handful of statements rather than one per size.
//! A batch chosen as a deadlock's victim, or larger than the server's `max_allowed_packet`,
//! is sent again write by write; any other failure fails the batch's writes, answered 503.

use std::sync::Arc;

use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Row as _};

use super::claims::Lone;
use super::queries::{AGE_US, IDLE_US, NOW};
use super::server::{DEADLOCK, mysql_error};
use crate::key::IdempotencyKey;
use crate::store::StoreError;
use crate::store::batch::{
    Answers, Batcher, ClaimWrite, CommitWrite, Shape, all_fail, batcher, key_order, or_alone,
};
use crate::store::sql::{ClaimRow, ResultExt as _, TableName};

/// The batches of one kind in flight at once: a second delivery that arrives while one
/// statement runs goes at once on the second, as it would without batching.
const LANES: usize = 2;

/// The batchers of one store's claims and commits. Clones share them.
#[derive(Clone)]
pub(super) struct Batches {
    /// MariaDB: the row a claim's first statement inserted or found.
    pub(super) claims: Batcher<ClaimWrite, ClaimRow>,
    /// The rows a commit matched: 0 when the lease is lost.
    pub(super) commits: Batcher<CommitWrite, u64>,
}

/// The statements of a batch, and the lone ones its writes go again by when the batch must be
/// sent again write by write.
struct Statements {
    lone: Arc<Lone>,
    /// The quoted table.
    table: String,
}

impl Batches {
    /// Batches of at most `most` writes in `table`, whose writes go alone as `lone` says.
    pub(super) fn new(lone: Arc<Lone>, table: &TableName, most: usize) -> Self {
        let statements = Arc::new(Statements {
            lone: lone.clone(),
            table: table.quoted('`'),
        });
        // Rows come back by key: one write of a key a batch.
        let shape = Shape::new(most, LANES);
        let claims = batcher!(shape, lone.claim_one, statements.claim_all);
        let commits = batcher!(shape, lone.commit_one, statements.commit_all);
        Self { claims, commits }
    }
}

impl Statements {
    async fn claim_all(&self, writes: Vec<ClaimWrite>) -> Answers<ClaimRow> {
        let order = key_order(&writes);
        let size = writes.len().next_power_of_two();
        let sql = self.claims(size);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for n in 0..size {
            let write = &writes[order[n.min(order.len() - 1)]];
            query = query
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.token.to_i64());
        }
        let rows = query.fetch_all(&self.lone.pool).await;
        let rows = match or_alone(rows, &writes, is_deadlock, |write| {
            self.lone.claim_one(write)
        })
        .await
        {
            Ok(rows) => rows,
            Err(answers) => return answers,
        };
        let mut answers: Answers<ClaimRow> = writes
            .iter()
            .map(|_| {
                Err(StoreError::backend(
                    "a batched claim returned no row for its key",
                ))
            })
            .collect();
        for row in &rows {
            let at = key_at(row, 7)
                .and_then(|(namespace, key)| find(&writes, |w| &w.key, &namespace, &key));
            match at {
                Ok(at) => answers[at] = ClaimRow::read(row),
                Err(error) => return all_fail(error, writes.len()),
            }
        }
        answers
    }

    async fn commit_all(&self, writes: Vec<CommitWrite>) -> Answers<u64> {
        let order = key_order(&writes);
        let size = writes.len().next_power_of_two();
        let mut query = sqlx::query(AssertSqlSafe(self.commits(size)));
        for &i in &order {
            let write = &writes[i];
            query = query
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.token.to_i64())
                .bind(write.receipt.as_deref());
        }
        for _ in order.len()..size {
            // Matches no row: no key has an empty namespace.
            query = query.bind("").bind("").bind(0_i64).bind(None::<&[u8]>);
        }
        let done = query.execute(&self.lone.pool).await;
        let matched = match or_alone(done, &writes, is_deadlock, |write| {
            self.lone.commit_one(write)
        })
        .await
        {
            Ok(done) => done.rows_affected(),
            Err(answers) => return answers,
        };
        if matched == writes.len() as u64 {
            return writes.iter().map(|_| Ok(1)).collect();
        }
        self.committed(&writes).await
    }

    /// Which commits of a batch hold: a row `done` under the commit's token.
    async fn committed(&self, writes: &[CommitWrite]) -> Answers<u64> {
        let size = writes.len().next_power_of_two();
        let mut query: Query<'_, MySql, MySqlArguments> =
            sqlx::query(AssertSqlSafe(self.reads(size)));
        for write in writes {
            query = query.bind(write.key.namespace()).bind(write.key.value());
        }
        for _ in writes.len()..size {
            query = query.bind("").bind("");
        }
        let rows = match query.fetch_all(&self.lone.pool).await {
            Ok(rows) => rows,
            Err(error) => return all_fail(error, writes.len()),
        };
        let mut answers: Answers<u64> = writes.iter().map(|_| Ok(0)).collect();
        for row in &rows {
            let at = key_at(row, 0)
                .and_then(|(namespace, key)| find(writes, |w| &w.key, &namespace, &key));
            let held = at.and_then(|at| {
                let token: i64 = row.try_get(2).store()?;
                let state: String = row.try_get(3).store()?;
                Ok((at, token == writes[at].token.to_i64() && state == "done"))
            });
            match held {
                Ok((at, true)) => answers[at] = Ok(1),
                Ok((_, false)) => {}
                Err(error) => return all_fail(error, writes.len()),
            }
        }
        answers
    }

    /// The claims of `size` keys: (namespace, key, token) each. Each row returned is a
    /// claim's seven columns, its namespace and its key.
    fn claims(&self, size: usize) -> String {
        let row = format!("(?, ?, 'processing', ?, 1, 1, FALSE, {NOW}, {NOW}, {NOW}, {NOW})");
        let rows = vec![row; size].join(",\n    ");
        format!(
            r#"INSERT INTO {t} (namespace, `key`, state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at)
VALUES {rows}
ON DUPLICATE KEY UPDATE token = token
RETURNING state, token, deliveries, reclaimed, {AGE_US} AS age_us, {IDLE_US} AS idle_us,
    receipt, namespace, `key`"#,
            t = self.table
        )
    }

    /// The commits of `size` leases: (namespace, key, token, receipt) each. The assignments
    /// of a multiple-table `UPDATE` run in no set order, so none reads a column another sets;
    /// a row done already is left as it is (and told apart by [`Self::committed`]).
    fn commits(&self, size: usize) -> String {
        let text = "CAST(? AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin";
        let bound = std::iter::once(format!(
            "SELECT {text} AS namespace, {text} AS k, CAST(? AS SIGNED) AS token, \
             CAST(? AS BINARY) AS receipt"
        ))
        .chain((1..size).map(|_| "SELECT ?, ?, ?, ?".to_owned()))
        .collect::<Vec<_>>()
        .join("\n    UNION ALL ");
        format!(
            r#"UPDATE (
    {bound}
) AS v STRAIGHT_JOIN {t} AS t ON t.namespace = v.namespace AND t.`key` = v.k
SET t.receipt = v.receipt, t.completed_at = {NOW}, t.state = 'done'
WHERE t.token = v.token AND t.state = 'processing'"#,
            t = self.table
        )
    }

    /// The rows of `size` keys: namespace, key, token, state.
    fn reads(&self, size: usize) -> String {
        let keys = vec!["(namespace = ? AND `key` = ?)"; size].join(" OR ");
        format!(
            "SELECT namespace, `key`, token, state FROM {t} WHERE {keys}",
            t = self.table
        )
    }
}

/// The namespace and key in columns `at` and `at + 1` of `row`.
fn key_at(row: &sqlx::mysql::MySqlRow, at: usize) -> Result<(String, String), StoreError> {
    Ok((row.try_get(at).store()?, row.try_get(at + 1).store()?))
}

/// The index of the write on (`namespace`, `key`).
fn find<W>(
    writes: &[W],
    key: impl Fn(&W) -> &IdempotencyKey,
    namespace: &str,
    value: &str,
) -> Result<usize, StoreError> {
    writes
        .iter()
        .position(|w| key(w).namespace() == namespace && key(w).value() == value)
        .ok_or_else(|| StoreError::backend("a batch answered a row of a key it did not carry"))
}

/// A deadlock's victim, or a statement larger than the server takes in one packet
/// (`max_allowed_packet`): nothing was written, and each write can go again alone.
fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e)
        if matches!(mysql_error(&**e), Some(DEADLOCK | PACKET_TOO_LARGE)))
}

/// ER_NET_PACKET_TOO_LARGE.
const PACKET_TOO_LARGE: u16 = 1153;
