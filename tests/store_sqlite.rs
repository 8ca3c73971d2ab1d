//! The conformance suite and the races on `SqliteStore`: a file (several pools on it, as
//! several processes would share it) and `sqlite::memory:`.

#![cfg(feature = "sqlite")]

mod common;

use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use tower_idempotency::store::{Claim, ConfigError, SqliteStore, Store, StoreError};

/// A new pool on this run's database file: one app instance.
async fn file_pool() -> SqlitePool {
    common::db::sqlite_file_pool(common::db::sqlite_file("store")).await
}

async fn file_store() -> Option<SqliteStore> {
    let store = SqliteStore::new(file_pool().await);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A new in-memory database: one connection the pool never closes, since the database lives
/// only as long as its connections.
async fn memory_store() -> Option<SqliteStore> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect("sqlite::memory:")
        .await
        .expect("open an in-memory SQLite database");
    let store = SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    Some(store)
}

mod file {
    use super::file_store;

    crate::conformance_suite!(file_store());
    crate::trust_suite!(file_store());
    crate::race_suite!(file_store());
}

mod memory {
    use super::memory_store;

    crate::conformance_suite!(memory_store());
}

#[tokio::test]
async fn table_names_are_validated() {
    let store = SqliteStore::new(SqlitePool::connect_lazy("sqlite::memory:").unwrap());
    assert_eq!(store.table_name(), "idempotency_keys");
    for bad in [
        "",
        "bad-name",
        "1st",
        "x\"; DROP TABLE t; --",
        "main.t",
        &"t".repeat(50),
    ] {
        let err = store.clone().with_table_name(bad).unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidTableName { .. }),
            "{bad}: {err}"
        );
    }
    assert_eq!(
        store.with_table_name("Claims_2").unwrap().table_name(),
        "Claims_2"
    );
}

async fn rows_in(pool: &SqlitePool, table: &str, ns: &str) -> i64 {
    let sql = format!(r#"SELECT count(*) FROM "{table}" WHERE namespace = ?1"#);
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(ns)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_table_name_end_to_end() {
    let pool = file_pool().await;
    SqliteStore::new(pool.clone()).migrate().await.unwrap();
    let store = SqliteStore::new(pool.clone())
        .with_table_name("idempotency_custom")
        .unwrap();
    store.migrate().await.unwrap();
    let ns = common::unique_namespace("custom");
    let key = common::key_in(&ns, "evt_1");
    let lease = common::acquire(&store, &key, common::LONG).await;
    store.commit(&lease).await.unwrap();
    assert!(matches!(
        store.claim(&key, common::LONG).await.unwrap(),
        Claim::Done(_)
    ));
    assert_eq!(rows_in(&pool, "idempotency_custom", &ns).await, 1);
    assert_eq!(rows_in(&pool, "idempotency_keys", &ns).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_fine() {
    let Some(store) = file_store().await else {
        return;
    };
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let key = common::key_in(&common::unique_namespace("twice"), "evt_1");
    common::acquire(&store, &key, common::LONG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pool_is_a_503_with_the_sqlx_error_as_source() {
    let Some(store) = file_store().await else {
        return;
    };
    store.pool().close().await;
    let err = common::store_down_is_503(store).await;
    let source = std::error::Error::source(&err).unwrap();
    assert!(
        matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolClosed)
        ),
        "{source:?}"
    );
    assert!(matches!(err, StoreError::Backend(_)));
}

/// A table made by the first release (no runs, no heartbeat, no `released` state) with rows in
/// it is rebuilt by `migrate()`, rows kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release() {
    let pool = file_pool().await;
    let table = format!("idempotency_up_{}", std::process::id());
    let ns = common::unique_namespace("upgrade");
    let now = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";
    let old = format!(
        r#"DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (
    namespace    TEXT    NOT NULL,
    "key"        TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('processing', 'done')),
    token        INTEGER NOT NULL,
    deliveries   INTEGER NOT NULL,
    claimed_at   INTEGER NOT NULL,
    completed_at INTEGER,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX {table}_claimed_idx ON {table} (state, claimed_at);
CREATE INDEX {table}_completed_idx ON {table} (state, completed_at);
INSERT INTO {table} VALUES
    ('{ns}', 'done', 'done', 1, 3, {now} - 3600000000, {now} - 3540000000),
    ('{ns}', 'processing', 'processing', 2, 1, {now} - 3600000000, NULL);"#
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(old))
        .execute(&pool)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    common::upgraded_table_keeps_its_rows(store, &ns).await;
    let indexes: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql IS NOT NULL",
    )
    .bind(&table)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(indexes, 2, "the rebuilt table has its indexes back");
    let drop = format!("DROP TABLE {table}; DROP TABLE {table}_versions");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&pool)
        .await
        .unwrap();
}

/// A `processing` row whose namespace or key is no valid `IdempotencyKey` (written by hand or
/// by other code) is skipped by `stuck_claims`, which still lists the valid stuck claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_claims_skip_a_row_that_is_no_valid_key() {
    // Alone: until they are deleted, the rows are in every listing of the shared table.
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = file_store().await else {
        return;
    };
    let ns = common::unique_namespace("undecodable");
    let (older, newer) = (common::key_in(&ns, "evt_a"), common::key_in(&ns, "evt_b"));
    common::acquire(&store, &older, common::LONG).await;
    common::acquire(&store, &newer, common::LONG).await;
    sqlx::query(
        r#"UPDATE idempotency_keys SET renewed_at = renewed_at - 60000000
        WHERE namespace = ?1 AND "key" = ?2"#,
    )
    .bind(older.namespace())
    .bind(older.value())
    .execute(store.pool())
    .await
    .unwrap();
    let bad = common::db::undecodable_keys(&ns);
    let hour_ago = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000) - 3600000000";
    for (namespace, key) in &bad {
        let insert = format!(
            r#"INSERT INTO idempotency_keys
            (namespace, "key", state, token, deliveries, claimed_at, renewed_at)
            VALUES (?1, ?2, 'processing', 1, 1, {hour_ago}, {hour_ago})"#
        );
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(namespace)
            .bind(key)
            .execute(store.pool())
            .await
            .unwrap();
    }
    tokio::time::sleep(common::PAST_SHORT).await;
    let events = common::db::ErrorEvents::default();
    let listed = {
        let _collect = events.install();
        store.stuck_claims(common::SHORT).await
    };
    for (namespace, key) in &bad {
        sqlx::query(r#"DELETE FROM idempotency_keys WHERE namespace = ?1 AND "key" = ?2"#)
            .bind(namespace)
            .bind(key)
            .execute(store.pool())
            .await
            .unwrap();
    }
    common::db::assert_undecodable_rows_skipped(listed, &events, &ns, &[older, newer], bad.len());
}
