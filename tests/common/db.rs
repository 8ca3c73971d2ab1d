//! Connections to the test databases, one pool per call: each pool is one app instance.
//!
//! URLs come from `POSTGRES_URL` and `MYSQL_URL` at run time (defaults: the local servers).
//! An unreachable database skips the test, or fails it when `CI` is set.

#![allow(dead_code, unused_imports)]

use std::time::Duration;

/// The PostgreSQL test database.
#[cfg(feature = "postgres")]
pub fn postgres_url() -> String {
    super::database_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// A new PostgreSQL pool.
#[cfg(feature = "postgres")]
pub async fn postgres_pool() -> Option<sqlx::PgPool> {
    let url = postgres_url();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url);
    super::connect("POSTGRES_URL", &url, pool).await
}

/// A migrated `PostgresStore` on a new pool.
#[cfg(feature = "postgres")]
pub async fn postgres_store() -> Option<tower_idempotency::store::PostgresStore> {
    let store = tower_idempotency::store::PostgresStore::new(postgres_pool().await?);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The MySQL or MariaDB test database.
#[cfg(feature = "mysql")]
pub fn mysql_url() -> String {
    super::database_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A new MySQL pool.
#[cfg(feature = "mysql")]
pub async fn mysql_pool() -> Option<sqlx::MySqlPool> {
    let url = mysql_url();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url);
    super::connect("MYSQL_URL", &url, pool).await
}

/// A migrated `MySqlStore` on a new pool.
#[cfg(feature = "mysql")]
pub async fn mysql_store() -> Option<tower_idempotency::store::MySqlStore> {
    let store = tower_idempotency::store::MySqlStore::new(mysql_pool().await?);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A new pool on a SQLite file (WAL, generous busy timeout), as one process would open it.
/// Opening retries: pools opened at once on a new WAL file can meet `database is locked` while
/// connecting (the journal-mode switch does not wait on the busy timeout).
#[cfg(feature = "sqlite")]
pub async fn sqlite_file_pool(path: &std::path::Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
            .await;
        match pool {
            Ok(pool) => return pool,
            Err(_) if attempt < 10 => {
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            Err(err) => panic!("open the SQLite file {}: {err}", path.display()),
        }
    }
}

/// The SQLite file of this test binary, named after `name`, in the system's temp directory.
#[cfg(feature = "sqlite")]
pub fn sqlite_file(name: &str) -> &'static std::path::Path {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let unique = super::unique_namespace(name);
        std::env::temp_dir().join(format!("tower-idempotency-{unique}.sqlite3"))
    })
}

/// A migrated `SqliteStore` on a new pool on this binary's SQLite file.
#[cfg(feature = "sqlite")]
pub async fn sqlite_file_store(name: &str) -> Option<tower_idempotency::store::SqliteStore> {
    let store =
        tower_idempotency::store::SqliteStore::new(sqlite_file_pool(sqlite_file(name)).await);
    store.migrate().await.expect("migrate");
    Some(store)
}
