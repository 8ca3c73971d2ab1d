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

/// `(namespace, key)` pairs of `processing` rows that no `IdempotencyKey` can hold, for tests
/// that write them by hand: an empty key, a key and a namespace with a control character.
/// Each namespace starts with `ns`.
pub fn undecodable_keys(ns: &str) -> Vec<(String, String)> {
    vec![
        (ns.to_owned(), String::new()),
        (ns.to_owned(), "evt\u{1}bad".to_owned()),
        (format!("{ns}\u{7}"), "evt_1".to_owned()),
    ]
}

/// Checks what `stuck_claims` answered while the rows of [`undecodable_keys`] (`skipped` of
/// them old enough to be listed) were in the table: the valid stuck claims of namespace `ns`,
/// oldest first, and one `ERROR` event for each row it skipped.
pub fn assert_undecodable_rows_skipped(
    listed: Result<Vec<tower_idempotency::store::StuckClaim>, tower_idempotency::store::StoreError>,
    events: &ErrorEvents,
    ns: &str,
    valid: &[tower_idempotency::IdempotencyKey],
    skipped: usize,
) {
    let stuck = listed.expect("one row that is no valid key does not fail the whole listing");
    let mine: Vec<_> = stuck
        .into_iter()
        .filter(|s| s.key.namespace().starts_with(ns))
        .map(|s| s.key)
        .collect();
    assert_eq!(mine, valid, "the valid stuck claims, oldest first");
    let logged = events.messages();
    let about_ns = logged.iter().filter(|m| m.contains(ns)).count();
    assert_eq!(
        about_ns, skipped,
        "one error logged per skipped row: {logged:#?}"
    );
}

/// Collects the `ERROR` events of the current thread while installed: their message and
/// fields, formatted.
#[derive(Clone, Default)]
pub struct ErrorEvents(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl ErrorEvents {
    /// Collects this thread's events until the guard is dropped.
    pub fn install(&self) -> tracing::dispatcher::DefaultGuard {
        tracing::dispatcher::set_default(&tracing::Dispatch::new(self.clone()))
    }

    /// The events collected so far.
    pub fn messages(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl tracing::Subscriber for ErrorEvents {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write as _;
                let _ = write!(self.0, "{}={value:?} ", field.name());
            }
        }
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
