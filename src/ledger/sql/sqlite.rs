//! The ledger on SQLite.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlitePool};

use super::{Names, to_i64};
use crate::ledger::audit::Logged;
use crate::ledger::log::LedgerStore;
use crate::ledger::record::Record;
use crate::store::sql::{ResultExt as _, TableName};
use crate::store::{ConfigError, StoreError};

/// How many records one insert carries at most (three parameters each).
const ROWS_PER_INSERT: usize = 500;

/// A [`LedgerStore`] on SQLite, beside the claims' table: `<table>_ledger` holds the records,
/// `<table>_ledger_cp` the checkpoints. Clones share the pool.
#[derive(Clone, Debug)]
pub struct SqliteLedger {
    pool: SqlitePool,
    sql: Arc<Sql>,
}

#[derive(Debug)]
struct Sql {
    migrate: String,
    records_table: String,
    next: String,
    unnumbered: String,
    number: String,
    records: String,
    timeline: String,
    save: String,
    latest: String,
}

impl Sql {
    fn new(table: &TableName) -> Self {
        let names = Names::of(table);
        let (l, cp) = (names.records.quoted('"'), names.checkpoints.quoted('"'));
        Self {
            migrate: format!(
                r#"CREATE TABLE IF NOT EXISTS {l} (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    seq       INTEGER,
    namespace TEXT NOT NULL,
    "key"     TEXT NOT NULL,
    record    BLOB NOT NULL,
    leaf      BLOB
);
CREATE UNIQUE INDEX IF NOT EXISTS "{seq}" ON {l} (seq);
CREATE INDEX IF NOT EXISTS "{key}" ON {l} (namespace, "key", id);
CREATE TABLE IF NOT EXISTS {cp} (
    size     INTEGER PRIMARY KEY,
    note     TEXT NOT NULL,
    frontier BLOB NOT NULL
);"#,
                seq = names.by_seq,
                key = names.by_key,
            ),
            records_table: l.clone(),
            next: format!("SELECT COALESCE(MAX(seq) + 1, 0) FROM {l}"),
            unnumbered: format!("SELECT id, record FROM {l} WHERE seq IS NULL ORDER BY id LIMIT ?"),
            number: format!("UPDATE {l} SET seq = ?, leaf = ? WHERE id = ?"),
            records: format!("SELECT seq, record, leaf FROM {l} WHERE seq >= ? AND seq < ?"),
            timeline: format!(
                r#"SELECT record FROM {l} WHERE namespace = ? AND "key" = ? ORDER BY id"#
            ),
            save: format!(
                "INSERT INTO {cp} (size, note, frontier) VALUES (?, ?, ?) \
                 ON CONFLICT (size) DO NOTHING"
            ),
            latest: format!("SELECT note, size, frontier FROM {cp} ORDER BY size DESC LIMIT 1"),
        }
    }

    /// An insert of `rows` records.
    fn append(&self, rows: usize) -> String {
        let values = vec!["(?, ?, ?)"; rows].join(", ");
        format!(
            r#"INSERT INTO {} (namespace, "key", record) VALUES {values}"#,
            self.records_table
        )
    }
}

impl SqliteLedger {
    /// A ledger beside the default claims' table (`idempotency_keys_ledger`).
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            sql: Arc::new(Sql::new(&TableName::default_table())),
        }
    }

    /// The ledger beside the claims' table `name`, as given to the store's `with_table_name`.
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, false)?;
        Ok(Self {
            pool: self.pool,
            sql: Arc::new(Sql::new(&table)),
        })
    }

    /// Creates the ledger's tables if they do not exist, in one transaction. Safe to call at
    /// every start-up.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.store()?;
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()
    }
}

impl LedgerStore for SqliteLedger {
    async fn append(&self, records: &[Record]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.store()?;
        for chunk in records.chunks(ROWS_PER_INSERT) {
            let sql = self.sql.append(chunk.len());
            let mut insert = sqlx::query(AssertSqlSafe(sql));
            for record in chunk {
                insert = insert
                    .bind(record.key.namespace().to_owned())
                    .bind(record.key.value().to_owned())
                    .bind(record.encode());
            }
            insert.execute(&mut *tx).await.store()?;
        }
        tx.commit().await.store()
    }

    async fn sequence(&self, limit: usize) -> Result<Vec<Logged>, StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.store()?;
        let next: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.next.as_str()))
            .fetch_one(&mut *tx)
            .await
            .store()?;
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(AssertSqlSafe(self.sql.unnumbered.as_str()))
            .bind(to_i64(limit as u64))
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let first = u64::try_from(next).map_err(|_| StoreError::backend("a negative number"))?;
        let mut numbered = Vec::with_capacity(rows.len());
        for ((id, record), seq) in rows.into_iter().zip(first..) {
            let logged = Logged::new(seq, record);
            sqlx::query(AssertSqlSafe(self.sql.number.as_str()))
                .bind(to_i64(seq))
                .bind(logged.leaf.to_vec())
                .bind(id)
                .execute(&mut *tx)
                .await
                .store()?;
            numbered.push(logged);
        }
        tx.commit().await.store()?;
        Ok(numbered)
    }

    super::shared_reads!();
}
