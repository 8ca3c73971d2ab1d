//! What the SQL suites (`advance`, `transactional` and `sql_store`) need of a backend besides
//! its store: their statements, in the backend's dialect, and the few inherent methods of the
//! SQL stores they call.

use std::future::Future;

use tower_idempotency::store::{Store, StoreError};

/// The statements of the SQL suites, in a backend's dialect (placeholders, upserts), and the
/// SQL stores' own methods.
pub trait SqlBackend: Store + Clone {
    /// `advance`: writes the business row `(id, status, version)` of a subscription, counting
    /// its writes.
    const UPSERT_SUBSCRIPTION: &'static str;
    /// `advance`: reads `(status, version, writes)` of the subscription `id`.
    const SELECT_SUBSCRIPTION: &'static str;
    /// `transactional`: writes the business row of an event.
    const INSERT_EFFECT: &'static str;
    /// `transactional`: counts the business rows of an event.
    const COUNT_EFFECTS: &'static str;
    /// `transactional`: counts the markers (claims) of a namespace.
    const COUNT_MARKERS: &'static str;
    /// `sql_store`: moves the heartbeat of the row `(namespace, key)` of `idempotency_keys` a
    /// minute back.
    const AGE_RENEWAL: &'static str;
    /// `sql_store`: writes the `processing` row `(namespace, key)` into `idempotency_keys`,
    /// claimed and renewed an hour ago.
    const INSERT_STUCK: &'static str;
    /// `sql_store`: deletes the row `(namespace, key)` of `idempotency_keys`.
    const DELETE_ROW: &'static str;

    /// Creates or upgrades the store's tables.
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The store on the table `name` of the same database.
    fn on_table(self, name: &str) -> Self;
    /// Closes the store's pool: every later statement fails.
    fn close(&self) -> impl Future<Output = ()> + Send;
    /// Writes the duplicate counts the store keeps in memory.
    fn write_counts(&self) -> impl Future<Output = ()> + Send;
    /// Runs `sql` (one of the statements above) with its two parameters.
    fn execute(
        &self,
        sql: &'static str,
        first: &str,
        second: &str,
    ) -> impl Future<Output = ()> + Send;
    /// The rows of namespace `ns` in the table `table`.
    fn rows_in(&self, table: &str, ns: &str) -> impl Future<Output = i64> + Send;
}

/// The methods of [`SqlBackend`] that every SQL store has under the same name.
macro_rules! store_methods {
    () => {
        async fn migrate(&self) -> Result<(), StoreError> {
            Self::migrate(self).await
        }

        fn on_table(self, name: &str) -> Self {
            self.with_table_name(name).unwrap()
        }

        async fn write_counts(&self) {
            Self::write_counts(self).await.unwrap();
        }

        async fn execute(&self, sql: &'static str, first: &str, second: &str) {
            sqlx::query(sql)
                .bind(first)
                .bind(second)
                .execute(self.pool())
                .await
                .unwrap();
        }
    };
}

#[cfg(feature = "sqlite")]
impl SqlBackend for tower_idempotency::store::SqliteStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES (?1, ?2, ?3, 1) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
         writes = order_subscriptions.writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = ?1";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES (?1)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = ?1";
    const COUNT_MARKERS: &'static str =
        "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = ?1";
    const AGE_RENEWAL: &'static str = r#"UPDATE idempotency_keys SET renewed_at = renewed_at - 60000000
        WHERE namespace = ?1 AND "key" = ?2"#;
    const INSERT_STUCK: &'static str = r#"INSERT INTO idempotency_keys
        (namespace, "key", state, token, deliveries, claimed_at, renewed_at)
        VALUES (?1, ?2, 'processing', 1, 1,
            (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - 3600000000,
            (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - 3600000000)"#;
    const DELETE_ROW: &'static str =
        r#"DELETE FROM idempotency_keys WHERE namespace = ?1 AND "key" = ?2"#;

    store_methods!();

    async fn close(&self) {
        self.pool().close().await;
    }

    async fn rows_in(&self, table: &str, ns: &str) -> i64 {
        let sql = format!(r#"SELECT count(*) FROM "{table}" WHERE namespace = ?1"#);
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(ns)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

#[cfg(feature = "postgres")]
impl SqlBackend for tower_idempotency::store::PostgresStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES ($1, $2, $3, 1) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
         writes = order_subscriptions.writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = $1";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES ($1)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = $1";
    const COUNT_MARKERS: &'static str =
        "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = $1";
    const AGE_RENEWAL: &'static str = r#"UPDATE idempotency_keys
        SET renewed_at = renewed_at - interval '1 minute' WHERE namespace = $1 AND "key" = $2"#;
    const INSERT_STUCK: &'static str = r#"INSERT INTO idempotency_keys
        (namespace, "key", state, token, deliveries, claimed_at, renewed_at)
        VALUES ($1, $2, 'processing', 1, 1, now() - interval '1 hour', now() - interval '1 hour')"#;
    const DELETE_ROW: &'static str =
        r#"DELETE FROM idempotency_keys WHERE namespace = $1 AND "key" = $2"#;

    store_methods!();

    async fn close(&self) {
        self.pool().close().await;
    }

    async fn rows_in(&self, table: &str, ns: &str) -> i64 {
        // Not quoted: the name may be qualified by a schema.
        let sql = format!("SELECT count(*) FROM {table} WHERE namespace = $1");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(ns)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

#[cfg(feature = "mysql")]
impl SqlBackend for tower_idempotency::store::MySqlStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES (?, ?, ?, 1) \
         ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
         writes = writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = ?";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES (?)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = ?";
    const COUNT_MARKERS: &'static str = "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = ?";
    const AGE_RENEWAL: &'static str = "UPDATE idempotency_keys \
        SET renewed_at = renewed_at - INTERVAL 1 MINUTE WHERE namespace = ? AND `key` = ?";
    const INSERT_STUCK: &'static str = "INSERT INTO idempotency_keys
        (namespace, `key`, state, token, deliveries, claimed_at, renewed_at)
        VALUES (?, ?, 'processing', 1, 1,
            UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)";
    const DELETE_ROW: &'static str =
        "DELETE FROM idempotency_keys WHERE namespace = ? AND `key` = ?";

    store_methods!();

    async fn close(&self) {
        // The flavor first, so that the statements of a claim, not the detection, meet the
        // closed pool.
        self.flavor().await.unwrap();
        self.pool().close().await;
    }

    async fn rows_in(&self, table: &str, ns: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM `{table}` WHERE namespace = ?");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(ns)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

/// Runs `sql` (one statement or several) on `pool`, for a test's set-up and clean-up; a
/// failure fails the test.
pub async fn run<'p, DB, P>(pool: P, sql: String)
where
    DB: sqlx::Database,
    P: sqlx::Executor<'p, Database = DB>,
{
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("a test's SQL failed: {error}"));
}
