#![doc = include_str!("../../docs/mysql.md")]

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySql, MySqlPool};
use tokio::sync::OnceCell;

use super::batch::DEFAULT_MOST;
use super::sql::{NewKeys, ResultExt as _, Table, TableName};
use super::{ConfigError, StoreError};

mod batch;
mod claims;
mod inbox;
mod queries;
mod server;
mod transactional;
mod versions;

use queries::{ClaimQueries, add_receipt, queries, upgrade};
use server::{check_sql_mode, flavor_of, is_mariadb};

/// The name of the lock `migrate` holds: instances starting together upgrade the table once.
const MIGRATE_LOCK: &str = "tower_idempotency_migrate";

/// Which server a [`MySqlStore`] talks to; it decides how a claim is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub enum MySqlFlavor {
    /// MariaDB 10.5 or later: the claim is one `INSERT … ON DUPLICATE KEY UPDATE …
    /// RETURNING`.
    MariaDb,
    /// MySQL, or a MariaDB older than 10.5 (whose `INSERT` has no `RETURNING`): the claim is
    /// an upsert, then a `SELECT` unless the upsert inserted.
    MySql,
}

/// Claims kept in a MySQL or MariaDB table, shared by every app instance that uses the
/// database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::mysql) for the SQL,
/// the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub struct MySqlStore {
    table: Table<MySql>,
    /// The statements only this backend has.
    claims: Arc<ClaimQueries>,
    /// The statements of the inbox that are MySQL's own (the others are the table's).
    inbox: Arc<inbox::Own>,
    flavor: Arc<OnceCell<MySqlFlavor>>,
    /// Where concurrent claims and commits meet to go together.
    batches: batch::Batches,
    /// Whether the store's last claim found its key new: on MariaDB the next claim, sent
    /// alone, then inserts first (see [round trips](self#round-trips)).
    new_keys: NewKeys,
}

impl MySqlStore {
    /// A store on `pool`, in the table `idempotency_keys`. It finds out on first use whether
    /// the server is MariaDB or MySQL.
    pub fn new(pool: MySqlPool) -> Self {
        let table = TableName::default_table();
        let inbox = inbox::Own::new(&table);
        let (sql, claims) = queries(table);
        let (table, claims) = (Table::new(pool, sql), Arc::new(claims));
        Self {
            batches: batches(&table, &claims, DEFAULT_MOST),
            table,
            claims,
            inbox: Arc::new(inbox),
            flavor: Arc::default(),
            new_keys: NewKeys::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes.
    pub fn with_table_name(mut self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, false)?;
        self.inbox = Arc::new(inbox::Own::new(&table));
        let (sql, claims) = queries(table);
        self.table = self.table.with_queries(sql);
        self.claims = Arc::new(claims);
        let most = self.batches.claims.most();
        Ok(self.max_batch(most))
    }

    /// The most commits, and apart the most claims (MariaDB 10.5 and later), that go to the
    /// server in one statement: 128 unless set. Those that arrive while the store's previous
    /// one is in flight go together in the next statement, so that concurrent deliveries share
    /// its round trip, its transaction and its flush of the redo log; a lone delivery's is
    /// sent at once, never held back for company (see [group commit](self#group-commit)). `1`
    /// sends each on its own, as many at a time as the pool allows. Set it before the store is
    /// used; clones made earlier keep theirs.
    ///
    /// At most 4,096: a larger `most` counts as that.
    ///
    /// # Panics
    ///
    /// If `most` is 0.
    pub fn max_batch(mut self, most: usize) -> Self {
        assert!(most > 0, "a batch carries at least one write");
        self.batches = batches(&self.table, &self.claims, most);
        self
    }

    /// Skips asking the server which it is: claims are made the `flavor` way. Forcing
    /// [`MySqlFlavor::MySql`] on MariaDB works (two round trips); forcing
    /// [`MySqlFlavor::MariaDb`] on MySQL, or on MariaDB before 10.5, fails every claim with a
    /// syntax error. [`migrate`](Self::migrate) asks the server anyway, for its own dialect.
    pub fn with_flavor(mut self, flavor: MySqlFlavor) -> Self {
        self.flavor = Arc::new(OnceCell::new_with(Some(flavor)));
        self
    }

    /// How the store makes claims: as set by [`with_flavor`](Self::with_flavor), or asked
    /// once with `SELECT VERSION()` and remembered: [`MySqlFlavor::MariaDb`] for MariaDB 10.5
    /// and later, [`MySqlFlavor::MySql`] for MySQL, for older MariaDB, and for a MariaDB whose
    /// release it cannot read.
    pub async fn flavor(&self) -> Result<MySqlFlavor, StoreError> {
        self.flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&self.table.pool)
                    .await
                    .store()?;
                Ok(flavor_of(&version))
            })
            .await
            .copied()
    }

    /// Creates the table with its indexes if it does not exist (one `CREATE TABLE`, and one
    /// more each for the [versions](crate::store::mysql#entity-versions-the-version-guard)
    /// and the [inbox](crate::store::mysql#inbox) tables), and upgrades a table made by an
    /// earlier release (one `ALTER TABLE`, its rows kept). Safe to call at every start-up,
    /// from several instances at once: a named lock (`GET_LOCK`) lets one of them at a time
    /// in.
    ///
    /// Fails, changing nothing, when the server's SQL mode (its default, or this connection's)
    /// includes MariaDB's `SIMULTANEOUS_ASSIGNMENT`, under which claims are not safe (see the
    /// [module docs](crate::store::mysql#assignment-order)).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One connection holds a named lock throughout, so that instances starting together
        // do not both upgrade the table.
        let mut conn = self.table.pool.acquire().await.store()?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(MIGRATE_LOCK)
            .fetch_one(&mut *conn)
            .await
            .store()?;
        if locked != Some(1) {
            return Err(StoreError::backend(
                "another instance held the migration lock for 60 seconds",
            ));
        }
        let migrated = self.migrate_locked(&mut conn).await;
        let unlocked = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(MIGRATE_LOCK)
            .execute(&mut *conn)
            .await;
        migrated?;
        unlocked.store().map(drop)
    }

    /// Drops the indexes of earlier releases on `(state, claimed_at)` and `(state,
    /// completed_at)`, which every commit had to update, should the table have them (InnoDB
    /// drops a secondary index in place, without copying the table).
    async fn drop_old_indexes(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), StoreError> {
        let table = &self.table.sql.table;
        let [stuck, claimed, completed] = table.old_indexes();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME IN (?, ?, ?)",
        )
        .bind(table.bare())
        .bind(stuck)
        .bind(claimed)
        .bind(completed)
        .fetch_all(&mut *conn)
        .await
        .store()?;
        if found.is_empty() {
            return Ok(());
        }
        let drops: Vec<String> = found
            .iter()
            .map(|name| format!("DROP INDEX `{name}`"))
            .collect();
        let alter = format!("ALTER TABLE {} {}", table.quoted('`'), drops.join(", "));
        alter_briefly(conn, alter).await
    }

    async fn migrate_locked(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), StoreError> {
        let (version, session_mode, global_mode): (String, String, String) =
            sqlx::query_as("SELECT VERSION(), @@SESSION.sql_mode, @@GLOBAL.sql_mode")
                .fetch_one(&mut *conn)
                .await
                .store()?;
        check_sql_mode(&session_mode, &global_mode)?;
        let mariadb = is_mariadb(&version);
        // Asked anyway: the claims need not ask again.
        self.flavor
            .get_or_init(|| async { flavor_of(&version) })
            .await;
        self.table
            .script(&mut *conn, self.table.sql.migrate.clone())
            .await?;
        let table = &self.table.sql.table;
        // The columns that tell an earlier release's table: `runs` (added by the second),
        // `receipt` (the latest).
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
             AND COLUMN_NAME IN ('runs', 'receipt')",
        )
        .bind(table.bare())
        .fetch_all(&mut *conn)
        .await
        .store()?;
        let has = |name: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(name));
        if !has("runs") {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            // Only the check on `state`: a check of the application's own stays. The
            // catalog and the syntax are the server's, whichever way claims are made.
            let find = if mariadb {
                "SELECT CONSTRAINT_NAME FROM information_schema.CHECK_CONSTRAINTS \
                 WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ? \
                 AND CHECK_CLAUSE LIKE '%processing%'"
            } else {
                "SELECT tc.CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS tc \
                 JOIN information_schema.CHECK_CONSTRAINTS cc \
                 ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA \
                 AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME \
                 WHERE tc.TABLE_SCHEMA = DATABASE() AND tc.TABLE_NAME = ? \
                 AND tc.CONSTRAINT_TYPE = 'CHECK' AND cc.CHECK_CLAUSE LIKE '%processing%'"
            };
            let checks: Vec<String> = sqlx::query_scalar(find)
                .bind(table.bare())
                .fetch_all(&mut *conn)
                .await
                .store()?;
            self.table
                .script(&mut *conn, upgrade(table, &checks, mariadb))
                .await?;
        } else if !has("receipt") {
            tracing::info!(table = %table.name(), "adding the receipt column to the idempotency table");
            alter_briefly(conn, add_receipt(table)).await?;
        }
        self.drop_old_indexes(conn).await?;
        self.table
            .script(&mut *conn, self.table.sql.versions.migrate.clone())
            .await?;
        self.table
            .script(&mut *conn, self.table.sql.inbox.migrate.clone())
            .await?;
        // An earlier release's inbox has no `started` column: its running entries started.
        let started: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'started'",
        )
        .bind(table.inbox().bare())
        .fetch_one(&mut *conn)
        .await
        .store()?;
        if started == 0 {
            tracing::info!(table = %table.inbox().name(), "adding the started column to the inbox table");
            alter_briefly(conn, self.table.sql.inbox.add_started.to_string()).await?;
        }
        Ok(())
    }
}

/// Runs `alter` on `conn` waiting at most 10 s for the table's metadata lock. The lock waits
/// behind every open transaction on the table, and every later statement waits behind the
/// lock: giving up rather than stalling the claims, `migrate()` fails, and the next start tries
/// again. The connection's own wait is put back, as it returns to the pool.
async fn alter_briefly(conn: &mut sqlx::MySqlConnection, alter: String) -> Result<(), StoreError> {
    let previous: u64 = sqlx::query_scalar("SELECT @@SESSION.lock_wait_timeout")
        .fetch_one(&mut *conn)
        .await
        .store()?;
    let set = |seconds: u64| {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {seconds}"
        )))
    };
    set(10).execute(&mut *conn).await.store()?;
    let altered = sqlx::raw_sql(AssertSqlSafe(alter))
        .execute(&mut *conn)
        .await;
    set(previous).execute(&mut *conn).await.store()?;
    altered.store().map(drop)
}

crate::store::sql::table_handles!(MySqlStore, MySqlPool);

/// The batchers of a store on `table`, at most `most` writes a batch.
fn batches(table: &Table<MySql>, claims: &ClaimQueries, most: usize) -> batch::Batches {
    let lone = claims::Lone {
        pool: table.pool.clone(),
        claim: claims.insert_or_read.clone(),
        insert: claims.insert_new.clone(),
        commit: table.sql.commit.clone(),
    };
    batch::Batches::new(Arc::new(lone), &table.sql.table, most)
}
