#![doc = include_str!("../../docs/postgres.md")]

use std::sync::Arc;

use sqlx::{PgPool, Postgres};

use super::batch::DEFAULT_MOST;
use super::sql::{NewKeys, ResultExt as _, Table, TableName};
use super::{ConfigError, StoreError};

mod batch;
mod claims;
mod inbox;
mod queries;
mod transactional;
mod versions;

use batch::Batches;
use inbox::Herald;
use queries::{add_receipt, drop_earlier, insert_new, insert_or_read, queries, upgrade};

/// Claims kept in a PostgreSQL table, shared by every app instance that uses the database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::postgres) for the SQL,
/// the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    table: Table<Postgres>,
    /// The statements of the inbox that are PostgreSQL's own (the others are the table's).
    inbox: Arc<inbox::Own>,
    /// Sends the notifications of new inbox entries.
    herald: Arc<Herald>,
    /// Where concurrent claims, commits and inbox entries meet to go together.
    batches: Batches,
    /// Whether the store's last claim found its key new: the next claim, sent alone, then
    /// inserts first (see [round trips](self#round-trips)).
    new_keys: NewKeys,
}

impl PostgresStore {
    /// A store on `pool`, in the table `idempotency_keys`.
    pub fn new(pool: PgPool) -> Self {
        Self::on(
            Table::new(pool, queries(TableName::default_table())),
            DEFAULT_MOST,
        )
    }

    /// A store on `table`, its batches of at most `most` writes.
    fn on(table: Table<Postgres>, most: usize) -> Self {
        let inbox: Arc<inbox::Own> = inbox::own(&table.sql.table).into();
        let lone = Arc::new(claims::Lone {
            pool: table.pool.clone(),
            claim: insert_or_read(&table.sql.table).into(),
            insert: insert_new(&table.sql.table).into(),
            commit: table.sql.commit.clone(),
            enqueue: inbox.enqueue.clone(),
        });
        Self {
            batches: Batches::new(lone, &table.sql.table, most),
            inbox,
            herald: Arc::default(),
            table,
            new_keys: NewKeys::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes, or
    /// `schema.table` with each part so (the schema must exist). It is quoted in SQL, so it is
    /// case-sensitive.
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, true)?;
        let most = self.batches.claims.most();
        Ok(Self::on(self.table.with_queries(queries(table)), most))
    }

    /// The most claims that go to the database in one statement, and apart the most commits:
    /// 128 unless set. Claims (and commits) that arrive while the store's previous one is in
    /// flight go together in the next statement, so that concurrent deliveries share its
    /// round trip, its transaction and its flush to disk; a lone delivery's is sent at once,
    /// never held back for company (see [group commit](self#group-commit)). `1` sends each on
    /// its own, as many at a time as the pool allows. Set it before the store is used; clones
    /// made earlier keep theirs.
    ///
    /// At most 4,096: a larger `most` counts as that.
    ///
    /// # Panics
    ///
    /// If `most` is 0.
    pub fn max_batch(self, most: usize) -> Self {
        assert!(most > 0, "a batch carries at least one write");
        Self::on(self.table, most)
    }

    /// Creates the table and its indexes if they do not exist, with the tables of the
    /// version guard and of the inbox (`<table>_versions`, `<table>_inbox`), in one
    /// transaction, and upgrades a table made by an earlier release (new columns added, its
    /// rows kept). Safe to call at every start-up, from several instances at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.table.pool.begin().await.store()?;
        self.table
            .script(&mut *tx, self.table.sql.migrate.clone())
            .await?;
        let table = &self.table.sql.table;
        // The columns that tell an earlier release's table: `runs` (added by the second),
        // `receipt` (the latest).
        let (runs, receipt): (bool, bool) = sqlx::query_as(
            "SELECT COALESCE(bool_or(attname = 'runs'), FALSE), \
             COALESCE(bool_or(attname = 'receipt'), FALSE) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname IN ('runs', 'receipt') \
             AND NOT attisdropped",
        )
        .bind(table.quoted('"'))
        .fetch_one(&mut *tx)
        .await
        .store()?;
        if !runs {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            self.table.script(&mut *tx, upgrade(table)).await?;
        } else if !receipt {
            tracing::info!(table = %table.name(), "adding the receipt column to the idempotency table");
            self.table.script(&mut *tx, add_receipt(table)).await?;
        }
        self.table
            .script(&mut *tx, self.table.sql.versions.migrate.clone())
            .await?;
        self.table
            .script(&mut *tx, self.table.sql.inbox.migrate.clone())
            .await?;
        // An earlier release's inbox has no `started` column: its running entries started.
        let started: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attname = 'started' AND NOT attisdropped)",
        )
        .bind(table.inbox().quoted('"'))
        .fetch_one(&mut *tx)
        .await
        .store()?;
        if !started {
            tracing::info!(table = %table.inbox().name(), "adding the started column to the inbox table");
            self.table
                .script(&mut *tx, self.table.sql.inbox.add_started.clone())
                .await?;
        }
        // The checks on `state` of earlier releases, whatever their names (a renamed table
        // keeps the old one), but one inherited from a parent table, which cannot be dropped
        // here: each table's as `regclass` names it, and the check's.
        let checks: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.conrelid::regclass::text, c.conname::text FROM pg_constraint c \
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'state' \
             WHERE c.conrelid IN (to_regclass($1), to_regclass($2)) AND c.contype = 'c' \
             AND c.conkey = ARRAY[a.attnum] AND c.coninhcount = 0",
        )
        .bind(table.quoted('"'))
        .bind(table.inbox().quoted('"'))
        .fetch_all(&mut *tx)
        .await
        .store()?;
        // The indexes of earlier releases, which every commit updated, looked up on this
        // table: a name alone is looked up along the search path, and could be another
        // schema's.
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT i.indexrelid::regclass::text FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = to_regclass($1) AND c.relname = ANY($2)",
        )
        .bind(table.quoted('"'))
        .bind(&table.old_indexes()[..])
        .fetch_all(&mut *tx)
        .await
        .store()?;
        let drops = drop_earlier(&checks, &indexes);
        if !drops.is_empty() {
            tracing::info!(table = %table.name(), "dropping the checks and indexes of earlier releases");
            self.table.script(&mut *tx, drops).await?;
        }
        tx.commit().await.store()
    }
}

crate::store::sql::table_handles!(PostgresStore, PgPool);

/// 40001 serialization_failure: under REPEATABLE READ or SERIALIZABLE (the connection's
/// `default_transaction_isolation`), a concurrent delivery changed the key's row after this
/// statement's snapshot was taken. Nothing was written; the statement can be run again.
fn is_serialization_failure(e: &sqlx::Error) -> bool {
    <Postgres as super::sql::Backend>::is_serialization_failure(e)
}
