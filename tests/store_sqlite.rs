//! Everything `SqliteStore` promises, on a file (several pools on it, as several processes
//! would share it), the claims also on `sqlite::memory:`; then its own checks.

#![cfg(feature = "sqlite")]

mod common;

use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use tower_idempotency::store::{SqliteStore, Store, StoreError};

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

/// A store whose pool would connect on first use: the table-name checks need no database.
fn lazy_store() -> SqliteStore {
    SqliteStore::new(SqlitePool::connect_lazy("sqlite::memory:").unwrap())
}

backend_suite! {
    claims: file_store(),
    trust: file_store(),
    races: file_store(),
    versions: file_store(),
    advance: SqliteStore = file_store(),
    transactional: SqliteStore = file_store(),
    sql: file_store(), tables: ["idempotency_custom"], quiet: impatient_store(),
    table_names: lazy_store(),
        rejects: ["", "bad-name", "1st", "x\"; DROP TABLE t; --", "main.t", &"t".repeat(50)],
        accepts: "Claims_2",
}

/// The claims on an in-memory database.
mod memory {
    use super::memory_store;

    crate::backend_suite! {
        claims: memory_store(),
    }
}

/// A pool opened with sqlx's default options leaves a new file in a rollback journal, where
/// claims under a burst wait past the busy timeout: `migrate()` refuses it, naming the mode
/// and the fix, and creates nothing. Once the file is in WAL, it migrates. An in-memory
/// database (journal mode `memory`) is accepted: the memory suite above migrates one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_rollback_journal_and_names_the_fix() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    use tower_idempotency::store::ConfigError;

    let path = std::env::temp_dir().join(format!(
        "tower-idempotency-{}.sqlite3",
        common::unique_namespace("journal")
    ));
    let plain = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(plain.clone())
        .await
        .unwrap();
    let err = SqliteStore::new(pool.clone()).migrate().await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    let source = std::error::Error::source(&err).unwrap();
    assert_eq!(
        source.downcast_ref::<ConfigError>(),
        Some(&ConfigError::SqliteJournalMode {
            mode: "delete".into()
        }),
        "{source:?}"
    );
    let why = source.to_string();
    for part in [
        "journal mode is `delete`",
        "SqliteConnectOptions::journal_mode(SqliteJournalMode::Wal)",
        "SqliteStore::open",
    ] {
        assert!(why.contains(part), "{why}");
    }
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "nothing was created");
    pool.close().await;

    // `memory` on a file keeps the rollback journal's locking: refused as well.
    let memory_journal = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(plain.clone().journal_mode(SqliteJournalMode::Memory))
        .await
        .unwrap();
    let err = SqliteStore::new(memory_journal.clone())
        .migrate()
        .await
        .unwrap_err();
    let source = std::error::Error::source(&err).unwrap();
    assert!(source.to_string().contains("`memory`"), "{source}");
    memory_journal.close().await;

    // The fix the message names.
    let wal = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(plain.journal_mode(SqliteJournalMode::Wal))
        .await
        .unwrap();
    let store = SqliteStore::new(wal.clone());
    store.migrate().await.unwrap();
    let key = common::key_in(&common::unique_namespace("journal"), "evt_1");
    common::acquire(&store, &key, common::LONG).await;
    wal.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
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
    common::sql::run(&pool, old).await;
    let store = SqliteStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let indexes = indexes(&pool, &table).await;
    assert_eq!(
        indexes,
        Vec::<String>::new(),
        "the rebuilt table has no index that every commit updates"
    );
    let drop = format!("DROP TABLE {table}; DROP TABLE {table}_versions");
    common::sql::run(&pool, drop).await;
}

/// A table made by the release before receipts (every column but `receipt`) with rows in it
/// gets the column from `migrate()`, rows kept, and keeps receipts from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_receipt_column_to_a_table_of_the_previous_release() {
    let pool = file_pool().await;
    let table = format!("idempotency_prev_{}", std::process::id());
    let ns = common::unique_namespace("upgrade-receipt");
    let now = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";
    let hour_ago = format!("{now} - 3600000000");
    let old = format!(
        r#"DROP TABLE IF EXISTS {table};
DROP TABLE IF EXISTS {table}_versions;
CREATE TABLE {table} (
    namespace     TEXT    NOT NULL,
    "key"         TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('processing', 'done', 'released')),
    token         INTEGER NOT NULL,
    deliveries    INTEGER NOT NULL,
    runs          INTEGER NOT NULL DEFAULT 1,
    reclaimed     INTEGER NOT NULL DEFAULT 0,
    first_seen_at INTEGER,
    last_seen_at  INTEGER,
    claimed_at    INTEGER NOT NULL,
    renewed_at    INTEGER,
    completed_at  INTEGER,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX {table}_stuck_idx ON {table} (claimed_at) WHERE state = 'processing';
-- An index of the user's own, under another name.
CREATE INDEX {table}_mine ON {table} (claimed_at) WHERE state = 'processing';
INSERT INTO {table} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at, completed_at) VALUES
    ('{ns}', 'done', 'done', 1, 3, 1, 0, {hour_ago}, {hour_ago}, {hour_ago}, NULL,
        {now} - 3540000000),
    ('{ns}', 'processing', 'processing', 2, 1, 1, 0, {hour_ago}, {hour_ago}, {hour_ago},
        {hour_ago}, NULL);"#
    );
    common::sql::run(&pool, old).await;
    let store = SqliteStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let receipt: String =
        sqlx::query_scalar("SELECT type FROM pragma_table_info(?1) WHERE name = 'receipt'")
            .bind(&table)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(receipt, "BLOB");
    let indexes = indexes(&pool, &table).await;
    assert_eq!(
        indexes,
        [format!("{table}_mine")],
        "the index of processing rows, which every commit updated, is gone; the user's stays"
    );
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let drop = format!("DROP TABLE {table}; DROP TABLE {table}_versions");
    common::sql::run(&pool, drop).await;
}

/// A transactional service on `store`: the handler reads the connection's busy timeout in the
/// delivery's transaction into `seen`, then answers 200, or 500 when `x-behave` says so.
fn busy_timeout_service(
    store: SqliteStore,
    ns: String,
    lock_timeout: std::time::Duration,
    seen: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
) -> impl tower::Service<
    http::Request<http_body_util::Full<bytes::Bytes>>,
    Response = http::Response<
        tower_idempotency::body::ResponseBody<http_body_util::Full<bytes::Bytes>>,
    >,
    Error = sqlx::Error,
    Future = impl Send,
> + Clone {
    use tower::Layer as _;
    use tower_idempotency::body::RequestBody;
    use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
    type Req = http::Request<RequestBody<http_body_util::Full<bytes::Bytes>>>;
    TransactionalLayer::new(store)
        .key(tower_idempotency::key::header("x-event-id").namespace(ns))
        .lock_timeout(lock_timeout)
        .layer(tower::service_fn(move |req: Req| {
            let seen = seen.clone();
            async move {
                let handle = req
                    .extensions()
                    .get::<TxHandle<sqlx::Sqlite>>()
                    .unwrap()
                    .clone();
                {
                    let mut tx = handle.lock().unwrap();
                    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
                        .fetch_one(&mut *tx)
                        .await?;
                    seen.lock().unwrap().push(busy);
                }
                let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                if req.headers()["x-behave"] == "500" {
                    *res.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                }
                Ok(res)
            }
        }))
}

/// Transactional mode bounds the wait for the write lock by the layer's lock timeout, and
/// leaves the pooled connection's busy timeout as it was: after a delivery that committed, one
/// that rolled back, a duplicate, and a delivery whose wait for the write lock timed out. The
/// handler's own statements see the connection's busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_keeps_the_connections_busy_timeout() {
    use tower::ServiceExt as _;
    const OWN: i64 = 30_000;
    let path = std::env::temp_dir().join(format!(
        "tower-idempotency-{}.sqlite3",
        common::unique_namespace("busy-timeout")
    ));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_millis(OWN as u64));
    let one = || {
        SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
    };
    let pool = one().await.unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    let own = || async {
        sqlx::query_scalar::<_, i64>("PRAGMA busy_timeout")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(own().await, OWN);
    let ns = common::unique_namespace("busy-timeout");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let lock_timeout = std::time::Duration::from_millis(300);
    let svc = busy_timeout_service(store, ns, lock_timeout, seen.clone());
    let delivery = |id: &str, behave: &str| {
        http::Request::post("/hook")
            .header("x-event-id", id)
            .header("x-behave", behave)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    for (id, behave, status) in [
        ("e1", "ok", http::StatusCode::OK),
        ("e1", "ok", http::StatusCode::OK),
        ("e2", "500", http::StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let res = svc.clone().oneshot(delivery(id, behave)).await.unwrap();
        assert_eq!(res.status(), status, "{id} {behave}");
        assert_eq!(
            own().await,
            OWN,
            "after {id} {behave}: the connection's own"
        );
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [OWN, OWN],
        "the handler's statements see it too"
    );

    // Another process holds the write lock: the delivery waits the lock timeout, answers 409,
    // and leaves the busy timeout as it was.
    let other = one().await.unwrap();
    let mut writer = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let waited = std::time::Instant::now();
    let res = svc.clone().oneshot(delivery("e3", "ok")).await.unwrap();
    let waited = waited.elapsed();
    assert_eq!(res.status(), http::StatusCode::CONFLICT);
    assert!(
        waited >= lock_timeout && waited < std::time::Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(
        own().await,
        OWN,
        "after a wait for the write lock that timed out"
    );
    // A delivery dropped while it waits (its sender hung up): the wait still ends, in a task
    // of its own, and the busy timeout is put back before the connection returns to the pool.
    let dropped = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        svc.clone().oneshot(delivery("e4", "ok")),
    )
    .await;
    assert!(dropped.is_err(), "dropped while its marker waits");
    assert_eq!(
        own().await,
        OWN,
        "after a delivery dropped while its marker waited"
    );
    sqlx::query("SELECT 1").execute(&mut *writer).await.unwrap();
    writer.rollback().await.unwrap();
    let res = svc.oneshot(delivery("e3", "ok")).await.unwrap();
    assert_eq!(res.status(), http::StatusCode::OK);
    assert_eq!(own().await, OWN);
    pool.close().await;
    other.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// A store on this run's file whose writes give up after 200 ms of waiting for the write
/// lock, its duplicate counts written only when asked: one app instance.
async fn impatient_store() -> Option<SqliteStore> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(common::db::sqlite_file("store"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_millis(200));
    // Opening can meet the brief locks other pools take on the file: try a few times.
    let mut attempt = 0;
    let pool = loop {
        attempt += 1;
        match SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await
        {
            Ok(pool) => break pool,
            Err(_) if attempt < 20 => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(err) => panic!("open the SQLite file: {err}"),
        }
    };
    let store = SqliteStore::new(pool).with_count_interval(common::hot_path::NEVER);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// Duplicates of a done key are answered while another connection holds the database's
/// write lock: they write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_writes_nothing() {
    // Alone: the write lock held stops every other test's writes on the file.
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = impatient_store().await else {
        return;
    };
    let locker = file_pool().await;
    common::hot_path::a_duplicate_writes_nothing(store, |_done, _released| async move {
        locker.begin_with("BEGIN IMMEDIATE").await.unwrap()
    })
    .await;
}

/// A purge of more rows than one batch holds deletes them all, and only them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_the_table_in_batches() {
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = file_store().await else {
        return;
    };
    let pool = store.pool().clone();
    common::hot_path::purge_walks_the_table_in_batches(store, |ns, count| async move {
        let two_days_ago = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000 \
                            - 2 * 86400 * 1000000)";
        let fill = format!(
            r#"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
            INSERT INTO idempotency_keys
                (namespace, "key", state, token, deliveries, claimed_at, completed_at)
            SELECT ?1, 'old-' || i, 'done', i, 1, {two_days_ago}, {two_days_ago} FROM n"#
        );
        sqlx::query(sqlx::AssertSqlSafe(fill))
            .bind(&ns)
            .bind(i64::try_from(count).unwrap())
            .execute(&pool)
            .await
            .unwrap();
    })
    .await;
}

/// 600 deliveries at once (300 events, each twice) through four stores opened on one new file,
/// as four pools of one process: writers queue in the process instead of sleeping in SQLite's
/// busy handler, so none is answered 5xx, each event runs once, and no claim is left
/// `processing`. The busy timeout is 20 ms: writes of this process that met each other's lock
/// in SQLite's busy handler would fail (without the queue, a third of them are answered 503);
/// it only covers the brief locks readers and checkpoints take.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_on_an_opened_file_queues_its_writes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::ServiceExt as _;
    use tower_idempotency::{IdempotencyLayer, key};

    let dir = std::env::temp_dir().join(common::unique_namespace("burst"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("burst.db");
    let mut stores = Vec::new();
    for _ in 0..4 {
        let options =
            SqliteStore::options(&path).busy_timeout(std::time::Duration::from_millis(20));
        stores.push(SqliteStore::open_with(options).await.expect("open"));
    }
    assert!(
        !stores[0].pool().options().get_test_before_acquire(),
        "an opened store's pool pings no connection before lending it"
    );
    let ns = common::unique_namespace("burst");
    let runs = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = stores
        .iter()
        .map(|store| {
            let layer = IdempotencyLayer::new(store.clone())
                .key(key::header("x-event-id").namespace(ns.clone()));
            common::counting_layer_service(layer, runs.clone())
        })
        .collect();
    let tasks: Vec<_> = (0..600)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = common::delivery(&format!("evt_{}", i / 2));
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::new();
    for task in tasks {
        *statuses.entry(task.await.unwrap().as_u16()).or_insert(0) += 1;
    }
    assert!(
        statuses
            .keys()
            .all(|status| *status == 200 || *status == 409),
        "{statuses:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        300,
        "each event once: {statuses:?}"
    );
    // Every answered delivery has settled its claim: a commit still retrying would show here.
    let stuck = stores[0]
        .stuck_claims(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(stuck.is_empty(), "{} claims left processing", stuck.len());
    for store in stores {
        store.pool().close().await;
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The inbox contract, on the table `inbox_conformance` (its inbox `inbox_conformance_inbox`)
/// of a file of its own: no other test's write lock holds up a take or a renewal, and no
/// other test's entries meet these. Each call is a new pool with a writer queue of its own,
/// so the race's four instances share the file as four processes would.
mod inbox_suite {
    use tower_idempotency::store::SqliteStore;

    async fn instance() -> Option<SqliteStore> {
        static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        let path = FILE.get_or_init(|| {
            let unique = super::common::unique_namespace("inbox");
            std::env::temp_dir().join(format!("tower-idempotency-{unique}.sqlite3"))
        });
        let pool = super::common::db::sqlite_file_pool(path).await;
        let store = SqliteStore::new(pool)
            .with_table_name("inbox_conformance")
            .expect("a valid table name");
        store.migrate().await.expect("migrate");
        Some(store)
    }

    tower_idempotency::conformance_suite! {
        inbox: instance(),
        inbox_races: instance(),
    }
}

/// A database of the release before the inbox (the claims and versions tables, a row in
/// each) gets the inbox table and its two indexes from `migrate()`, run twice; its rows stay,
/// and the inbox works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_inbox_table_to_a_database_of_the_previous_release() {
    use tower_idempotency::store::{KeyState, VersionStore};

    let pool = file_pool().await;
    let table = format!("idempotency_pre_inbox_{}", std::process::id());
    let ns = common::unique_namespace("pre-inbox");
    let now = "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";
    let old = format!(
        r#"DROP TABLE IF EXISTS {table};
DROP TABLE IF EXISTS {table}_versions;
DROP TABLE IF EXISTS {table}_inbox;
CREATE TABLE {table} (
    namespace     TEXT    NOT NULL,
    "key"         TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('processing', 'done', 'released')),
    token         INTEGER NOT NULL,
    deliveries    INTEGER NOT NULL,
    runs          INTEGER NOT NULL DEFAULT 1,
    reclaimed     INTEGER NOT NULL DEFAULT 0,
    first_seen_at INTEGER,
    last_seen_at  INTEGER,
    claimed_at    INTEGER NOT NULL,
    renewed_at    INTEGER,
    completed_at  INTEGER,
    receipt       BLOB,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX {table}_stuck_idx ON {table} (claimed_at) WHERE state = 'processing';
CREATE TABLE {table}_versions (
    namespace       TEXT    NOT NULL,
    entity          TEXT    NOT NULL,
    applied_version INTEGER,
    pending_version INTEGER,
    pending_token   INTEGER,
    pending_since   INTEGER,
    deliveries      INTEGER NOT NULL,
    last_seen_at    INTEGER NOT NULL,
    PRIMARY KEY (namespace, entity)
);
INSERT INTO {table} (namespace, "key", state, token, deliveries, claimed_at, completed_at)
VALUES ('{ns}', 'done', 'done', 1, 2, {now}, {now});
INSERT INTO {table}_versions (namespace, entity, applied_version, deliveries, last_seen_at)
VALUES ('{ns}', 'order_1', 7, 1, {now});"#
    );
    common::sql::run(&pool, old).await;
    let store = SqliteStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();

    let indexes = indexes(&pool, &format!("{table}_inbox")).await;
    assert_eq!(
        indexes,
        [
            format!("{table}_inbox_due_idx"),
            format!("{table}_inbox_run_idx")
        ]
    );
    let done = common::key_in(&ns, "done");
    let record = store
        .describe(&done)
        .await
        .unwrap()
        .expect("the claims row");
    assert_eq!((record.state, record.deliveries), (KeyState::Done, 2));
    let order = common::key_in(&ns, "order_1");
    assert_eq!(store.applied_version(&order).await.unwrap(), Some(7));

    let key = common::key_in(&ns, "evt_1");
    common::inbox::an_entry_runs(&store, &key).await;

    let drop = format!("DROP TABLE {table}; DROP TABLE {table}_versions; DROP TABLE {table}_inbox");
    common::sql::run(&pool, drop).await;
}

/// Bytes in an inbox row that no release wrote (a damaged file, a hand edit) give an error,
/// never a panic, when the request or the entry is read; a take that meets the row settles it
/// dead, kept with its bytes for a person, rather than failing every take after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_inbox_row_is_an_error() {
    use tower_idempotency::store::inbox::{InboxStore, Take};

    let pool = file_pool().await;
    let table = format!("inbox_damaged_{}", std::process::id());
    let store = SqliteStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let ns = common::unique_namespace("damaged");
    let key = common::key_in(&ns, "evt_1");
    let request = tower_idempotency::store::inbox::StoredRequest::new(
        http::Method::POST,
        "/hooks",
        Vec::new(),
        bytes::Bytes::new(),
    );
    store.enqueue(&key, &request).await.unwrap();
    let damage = |column: &str| {
        format!(
            r#"UPDATE {table}_inbox SET {column} = x'00ff' WHERE namespace = ?1 AND "key" = ?2"#
        )
    };
    for column in ["request", "history"] {
        sqlx::query(sqlx::AssertSqlSafe(damage(column)))
            .bind(key.namespace())
            .bind(key.value())
            .execute(&pool)
            .await
            .unwrap();
    }
    assert!(matches!(
        store.stored_request(&key).await,
        Err(StoreError::Backend(_))
    ));
    assert!(matches!(
        store.entry(&key).await,
        Err(StoreError::Backend(_))
    ));
    assert!(matches!(
        store.entries(Some(&ns), &[], 10).await,
        Err(StoreError::Backend(_))
    ));
    assert!(store.take(&Take::default()).await.unwrap().is_empty());
    common::inbox::assert_unreadable_and_dead(&store.entry(&key).await.unwrap().unwrap());
    assert!(matches!(
        store.stored_request(&key).await,
        Err(StoreError::Backend(_))
    ));
    let drop = format!("DROP TABLE {table}; DROP TABLE {table}_versions; DROP TABLE {table}_inbox");
    common::sql::run(&pool, drop).await;
}

/// A claim that guesses its key new inserts first; when that insert fails (here the database
/// is read-only for this store), the claim reads the key's row instead, so that duplicates are
/// still answered: a done key is a duplicate, an unknown one an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_insert_first_falls_back_to_the_read() {
    use tower_idempotency::store::Claim;

    let path = common::db::sqlite_file("insert-first");
    let writer = SqliteStore::new(common::db::sqlite_file_pool(path).await);
    writer.migrate().await.unwrap();
    let ns = common::unique_namespace("insert-first");
    let (done, unknown) = (common::key_in(&ns, "done"), common::key_in(&ns, "unknown"));
    let Claim::Acquired(lease) = writer.claim(&done, common::LONG).await.unwrap() else {
        panic!("a new key is acquired");
    };
    writer.commit(&lease).await.unwrap();

    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    let reader = SqliteStore::new(
        SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .unwrap(),
    );
    for _ in 0..3 {
        assert!(matches!(
            reader.claim(&done, common::LONG).await,
            Ok(Claim::Done(_))
        ));
        assert!(reader.claim(&unknown, common::LONG).await.is_err());
    }
}

/// The names of the indexes made for `table` (not the automatic ones of its keys), in order.
async fn indexes(pool: &SqlitePool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql IS NOT NULL \
         ORDER BY name",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}
