//! The ledger on PostgreSQL.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, PgPool};

use super::{Names, to_i64};
use crate::ledger::audit::Logged;
use crate::ledger::log::LedgerStore;
use crate::ledger::record::Record;
use crate::store::sql::{ResultExt as _, TableName};
use crate::store::{ConfigError, StoreError};

/// The advisory lock that makes one numbering wait for another, and migrations for each
/// other.
const LOCK: i64 = 0x7469_6c65_6467_6572; // "tiledger"

/// A [`LedgerStore`] on PostgreSQL, beside the claims' table: `<table>_ledger` holds the
/// records, `<table>_ledger_cp` the checkpoints. Clones share the pool.
#[derive(Clone, Debug)]
pub struct PostgresLedger {
    pool: PgPool,
    sql: Arc<Sql>,
}

#[derive(Debug)]
struct Sql {
    migrate: String,
    append: String,
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
                r#"SELECT pg_advisory_xact_lock({LOCK});
CREATE TABLE IF NOT EXISTS {l} (
    id        BIGSERIAL PRIMARY KEY,
    seq       BIGINT,
    namespace TEXT  NOT NULL,
    "key"     TEXT  NOT NULL,
    record    BYTEA NOT NULL,
    leaf      BYTEA
);
CREATE UNIQUE INDEX IF NOT EXISTS "{seq}" ON {l} (seq);
CREATE INDEX IF NOT EXISTS "{key}" ON {l} (namespace, "key", id);
CREATE TABLE IF NOT EXISTS {cp} (
    size     BIGINT PRIMARY KEY,
    note     TEXT   NOT NULL,
    frontier BYTEA  NOT NULL
);"#,
                seq = names.by_seq,
                key = names.by_key,
            ),
            append: format!(
                r#"INSERT INTO {l} (namespace, "key", record)
SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[])"#
            ),
            next: format!("SELECT COALESCE(MAX(seq) + 1, 0) FROM {l}"),
            unnumbered: format!(
                "SELECT id, record FROM {l} WHERE seq IS NULL ORDER BY id LIMIT $1 FOR UPDATE"
            ),
            number: format!(
                r#"UPDATE {l} AS t SET seq = v.seq, leaf = v.leaf
FROM UNNEST($1::bigint[], $2::bigint[], $3::bytea[]) AS v(id, seq, leaf) WHERE t.id = v.id"#
            ),
            records: format!("SELECT seq, record, leaf FROM {l} WHERE seq >= $1 AND seq < $2"),
            timeline: format!(
                r#"SELECT record FROM {l} WHERE namespace = $1 AND "key" = $2 ORDER BY id"#
            ),
            save: format!(
                "INSERT INTO {cp} (size, note, frontier) VALUES ($1, $2, $3) \
                 ON CONFLICT (size) DO NOTHING"
            ),
            latest: format!("SELECT note, size, frontier FROM {cp} ORDER BY size DESC LIMIT 1"),
        }
    }
}

impl PostgresLedger {
    /// A ledger beside the default claims' table (`idempotency_keys_ledger`).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sql: Arc::new(Sql::new(&TableName::default_table())),
        }
    }

    /// The ledger beside the claims' table `name` (`schema.table` allowed), as given to the
    /// store's `with_table_name`.
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, true)?;
        Ok(Self {
            pool: self.pool,
            sql: Arc::new(Sql::new(&table)),
        })
    }

    /// Creates the ledger's tables if they do not exist, in one transaction. Safe to call at
    /// every start-up, from several instances at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.clone()))
            .execute(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()
    }
}

impl LedgerStore for PostgresLedger {
    async fn append(&self, records: &[Record]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<&str> = records.iter().map(|r| r.key.namespace()).collect();
        let keys: Vec<&str> = records.iter().map(|r| r.key.value()).collect();
        let bytes: Vec<Vec<u8>> = records.iter().map(Record::encode).collect();
        sqlx::query(AssertSqlSafe(self.sql.append.as_str()))
            .bind(namespaces)
            .bind(keys)
            .bind(bytes)
            .execute(&self.pool)
            .await
            .store()?;
        Ok(())
    }

    async fn sequence(&self, limit: usize) -> Result<Vec<Logged>, StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(LOCK)
            .execute(&mut *tx)
            .await
            .store()?;
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
        let numbered: Vec<Logged> = rows
            .iter()
            .zip(first..)
            .map(|((_, record), seq)| Logged::new(seq, record.clone()))
            .collect();
        if !numbered.is_empty() {
            let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
            let seqs: Vec<i64> = numbered.iter().map(|l| to_i64(l.seq)).collect();
            let leaves: Vec<Vec<u8>> = numbered.iter().map(|l| l.leaf.to_vec()).collect();
            sqlx::query(AssertSqlSafe(self.sql.number.as_str()))
                .bind(ids)
                .bind(seqs)
                .bind(leaves)
                .execute(&mut *tx)
                .await
                .store()?;
        }
        tx.commit().await.store()?;
        Ok(numbered)
    }

    super::shared_reads!();
}
