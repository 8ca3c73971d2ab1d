//! Everything `MySqlStore` promises (the suites of `backend_suite!`), plus its own checks.
//!
//! The database comes from `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`). If it
//! cannot be reached the tests are skipped, or fail when `CI` is set. On MariaDB the suites of
//! claims, races, versions and `advance` run twice: with the detected one-statement claim, and
//! forced to the two-statement claim MySQL needs.

#![cfg(feature = "mysql")]

mod common;

use sqlx::mysql::MySqlPool;
use tower_idempotency::store::{MySqlFlavor, MySqlStore, Store, StoreError};

fn url() -> String {
    common::db::mysql_url()
}

async fn store() -> Option<MySqlStore> {
    common::db::mysql_store().await
}

/// A store whose pool would connect on first use: the table-name checks need no database.
fn lazy_store() -> MySqlStore {
    MySqlStore::new(MySqlPool::connect_lazy(&url()).unwrap())
}

backend_suite! {
    claims: store(),
    trust: store(),
    races: store(),
    versions: store(),
    advance: MySqlStore = store(),
    transactional: MySqlStore = store(),
    sql: store(), tables: ["idempotency_custom_e2e"], quiet: quiet_store(),
    table_names: lazy_store(),
        rejects: ["", "bad-name", "1st", "x`; DROP TABLE t; --", "db.t", &"t".repeat(50)],
        accepts: "Claims_2",
}

/// The claim as MySQL makes it (upsert, then a read), run against whatever server this is.
mod two_statement_claim {
    use super::*;

    async fn store() -> Option<MySqlStore> {
        Some(super::store().await?.with_flavor(MySqlFlavor::MySql))
    }

    crate::backend_suite! {
        claims: store(),
        races: store(),
        versions: store(),
        advance: MySqlStore = store(),
    }
}

/// The inbox's checks, on a table only they use (a worker's take reaches every namespace).
mod inbox_suite {
    use tower_idempotency::store::MySqlStore;

    /// A migrated store on the inbox tests' table, on a pool of its own: one app instance.
    pub(crate) async fn instance() -> Option<MySqlStore> {
        let store = MySqlStore::new(crate::common::db::mysql_pool().await?)
            .with_table_name("inbox_conformance")
            .unwrap();
        store.migrate().await.expect("migrate");
        Some(store)
    }

    tower_idempotency::conformance_suite! {
        inbox: instance(),
        inbox_races: instance(),
    }
}

/// The same with the two-statement enqueue of MySQL and of MariaDB before 10.5 (an insert,
/// and a read of a duplicate's state).
mod inbox_two_statement_enqueue {
    use tower_idempotency::store::{MySqlFlavor, MySqlStore};

    async fn instance() -> Option<MySqlStore> {
        Some(
            super::inbox_suite::instance()
                .await?
                .with_flavor(MySqlFlavor::MySql),
        )
    }

    tower_idempotency::conformance_suite! {
        inbox: instance(),
        inbox_races: instance(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_flavor_is_detected() {
    let Some(store) = store().await else { return };
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    // MariaDB 10.5 and later claim with RETURNING; MySQL and older MariaDB with two statements.
    let release: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let expected = if version.contains("MariaDB") && release >= vec![10, 5] {
        MySqlFlavor::MariaDb
    } else {
        MySqlFlavor::MySql
    };
    assert_eq!(store.flavor().await.unwrap(), expected, "{version}");
    let forced = store.with_flavor(MySqlFlavor::MySql);
    assert_eq!(forced.flavor().await.unwrap(), MySqlFlavor::MySql);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_case_sensitive() {
    let Some(store) = store().await else { return };
    let ns = common::unique_namespace("case");
    let lower = common::acquire(&store, &common::key_in(&ns, "evt_a"), common::LONG).await;
    store.commit(&lower).await.unwrap();
    common::acquire(&store, &common::key_in(&ns, "EVT_A"), common::LONG).await;
}

/// A table made by the first release (no runs, no heartbeat, no `released` state) with rows in
/// it is upgraded in place by `migrate()`, rows kept; several instances migrating at once
/// upgrade it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release() {
    upgrade_a_table_of_the_first_release("idempotency_up", None).await;
}

/// The same with the two-statement claim of MySQL and of MariaDB before 10.5: the upgrade
/// speaks the server's dialect (MariaDB's catalog and `DROP CONSTRAINT`), whichever way the
/// claims are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release_with_the_two_statement_claim() {
    upgrade_a_table_of_the_first_release("idempotency_up2", Some(MySqlFlavor::MySql)).await;
}

async fn upgrade_a_table_of_the_first_release(prefix: &str, flavor: Option<MySqlFlavor>) {
    let Some(pool) = common::db::mysql_pool().await else {
        return;
    };
    let table = format!("{prefix}_{}", std::process::id());
    let ns = common::unique_namespace("upgrade");
    let now = "UTC_TIMESTAMP(6)";
    for statement in [
        format!("DROP TABLE IF EXISTS {table}, {table}_versions"),
        format!(
            r#"CREATE TABLE {table} (
    namespace    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state        VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token        BIGINT       NOT NULL,
    deliveries   BIGINT       NOT NULL,
    claimed_at   DATETIME(6)  NOT NULL,
    completed_at DATETIME(6)  NULL,
    PRIMARY KEY (namespace, `key`),
    KEY {table}_claimed_idx (state, claimed_at),
    KEY {table}_completed_idx (state, completed_at),
    CHECK (state IN ('processing', 'done'))
) ENGINE = InnoDB"#
        ),
        format!(
            "INSERT INTO {table} VALUES
            ('{ns}', 'done', 'done', 1, 3, {now} - INTERVAL 1 HOUR, {now} - INTERVAL 59 MINUTE),
            ('{ns}', 'processing', 'processing', 2, 1, {now} - INTERVAL 1 HOUR, NULL)"
        ),
    ] {
        common::sql::run(&pool, statement).await;
    }
    let mut store = MySqlStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    if let Some(flavor) = flavor {
        store = store.with_flavor(flavor);
    }
    let instances: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for instance in instances {
        instance.await.unwrap().unwrap();
    }
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(&table)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        ["PRIMARY"],
        "the indexes every commit updated are gone"
    );
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let drop = format!("DROP TABLE {table}, {table}_versions");
    common::sql::run(&pool, drop).await;
}

/// A table made by the release before receipts (every column but `receipt`) with rows in it
/// gets the column from `migrate()`, rows kept, and keeps receipts from then on; several
/// instances migrating at once add it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_receipt_column_to_a_table_of_the_previous_release() {
    add_the_receipt_column("idempotency_prev", None).await;
}

/// The same with the two-statement claim of MySQL and of MariaDB before 10.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_receipt_column_with_the_two_statement_claim() {
    add_the_receipt_column("idempotency_prev2", Some(MySqlFlavor::MySql)).await;
}

async fn add_the_receipt_column(prefix: &str, flavor: Option<MySqlFlavor>) {
    let Some(pool) = common::db::mysql_pool().await else {
        return;
    };
    let table = format!("{prefix}_{}", std::process::id());
    let ns = common::unique_namespace("upgrade-receipt");
    let hour_ago = "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR";
    for statement in [
        format!("DROP TABLE IF EXISTS {table}, {table}_versions"),
        format!(
            r#"CREATE TABLE {table} (
    namespace     VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state         VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token         BIGINT       NOT NULL,
    deliveries    BIGINT       NOT NULL,
    runs          BIGINT       NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN      NOT NULL DEFAULT FALSE,
    first_seen_at DATETIME(6)  NULL,
    last_seen_at  DATETIME(6)  NULL,
    renewed_at    DATETIME(6)  NULL,
    claimed_at    DATETIME(6)  NOT NULL,
    completed_at  DATETIME(6)  NULL,
    PRIMARY KEY (namespace, `key`),
    CONSTRAINT `{table}_state_check` CHECK (state IN ('processing', 'done', 'released'))
) ENGINE = InnoDB"#
        ),
        format!(
            "INSERT INTO {table} (namespace, `key`, state, token, deliveries, runs, reclaimed,
                first_seen_at, last_seen_at, renewed_at, claimed_at, completed_at) VALUES
            ('{ns}', 'done', 'done', 1, 3, 1, FALSE, {hour_ago}, {hour_ago}, NULL, {hour_ago},
                UTC_TIMESTAMP(6) - INTERVAL 59 MINUTE),
            ('{ns}', 'processing', 'processing', 2, 1, 1, FALSE, {hour_ago}, {hour_ago},
                {hour_ago}, {hour_ago}, NULL)"
        ),
    ] {
        common::sql::run(&pool, statement).await;
    }
    let mut store = MySqlStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    if let Some(flavor) = flavor {
        store = store.with_flavor(flavor);
    }
    let instances: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for instance in instances {
        instance.await.unwrap().unwrap();
    }
    let receipt: String = sqlx::query_scalar(
        "SELECT CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'receipt'",
    )
    .bind(&table)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(receipt.to_ascii_lowercase(), "longblob");
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let drop = format!("DROP TABLE {table}, {table}_versions");
    common::sql::run(&pool, drop).await;
}

/// A pool whose connections add MariaDB's `SIMULTANEOUS_ASSIGNMENT` to their SQL mode: the
/// claims' `ON DUPLICATE KEY UPDATE` would no longer assign left to right, so `migrate()`
/// refuses, saying what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_simultaneous_assignment() {
    let Some(store) = store().await else { return };
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    if !version.contains("MariaDB") {
        // MySQL has no such mode: nothing to refuse.
        return;
    }
    let url = url();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let store = MySqlStore::new(pool);
    let err = store.migrate().await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    let message = std::error::Error::source(&err).unwrap().to_string();
    for says in ["SIMULTANEOUS_ASSIGNMENT", "@@SESSION.sql_mode", "remove it"] {
        assert!(message.contains(says), "{message}");
    }
    // The named lock was released: another instance can migrate.
    common::db::mysql_store().await.unwrap();
}

/// A transactional service on `store`: the handler reads `innodb_lock_wait_timeout` in the
/// delivery's transaction into `seen`, then answers as `x-behave` says (`ok`, `500`, or
/// `block` until `gate` has a permit, after telling `started`).
fn lock_wait_service(
    store: MySqlStore,
    ns: String,
    lock_timeout: std::time::Duration,
    seen: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    started: tokio::sync::mpsc::UnboundedSender<()>,
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
            let (seen, gate, started) = (seen.clone(), gate.clone(), started.clone());
            async move {
                let handle = req
                    .extensions()
                    .get::<TxHandle<sqlx::MySql>>()
                    .unwrap()
                    .clone();
                {
                    let mut tx = handle.lock().unwrap();
                    let wait: i64 = sqlx::query_scalar(
                        "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)",
                    )
                    .fetch_one(&mut *tx)
                    .await?;
                    seen.lock().unwrap().push(wait);
                }
                let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                match req.headers()["x-behave"].to_str().unwrap() {
                    "500" => *res.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR,
                    "block" => {
                        let _ = started.send(());
                        gate.acquire().await.unwrap().forget();
                    }
                    _ => {}
                }
                Ok(res)
            }
        }))
}

fn lock_wait_delivery(id: &str, behave: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post("/hook")
        .header("x-event-id", id)
        .header("x-behave", behave)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap()
}

/// Transactional mode bounds the marker's lock wait by the layer's lock timeout, and leaves the
/// pooled connection's `innodb_lock_wait_timeout` as it was: after a delivery that committed,
/// one that rolled back, a duplicate, and a duplicate whose wait timed out. The handler's own
/// statements see the connection's setting. On MariaDB the suite runs twice: with the detected
/// flavor, and forced to the MySQL one.
async fn transactional_mode_keeps_the_lock_wait_timeout(flavor: Option<MySqlFlavor>) {
    use tower::ServiceExt as _;
    const OWN: i64 = 37;
    let url = url();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION innodb_lock_wait_timeout = 37")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url);
    let Some(pool) = common::connect("MYSQL_URL", &url, pool).await else {
        return;
    };
    let mut store = MySqlStore::new(pool.clone());
    if let Some(flavor) = flavor {
        store = store.with_flavor(flavor);
    }
    store.migrate().await.unwrap();
    let own = || async {
        sqlx::query_scalar::<_, i64>("SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(own().await, OWN);
    let ns = common::unique_namespace("lock-wait");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let svc = lock_wait_service(
        store,
        ns.clone(),
        std::time::Duration::from_secs(1),
        seen.clone(),
        gate.clone(),
        started.clone(),
    );
    for (id, behave, status) in [
        ("e1", "ok", http::StatusCode::OK),
        ("e1", "ok", http::StatusCode::OK),
        ("e2", "500", http::StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let res = svc
            .clone()
            .oneshot(lock_wait_delivery(id, behave))
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{id} {behave}");
        assert_eq!(
            own().await,
            OWN,
            "after {id} {behave}: the connection's own setting"
        );
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [OWN, OWN],
        "the handler's statements see it too"
    );

    // Another instance holds e3's marker in its open transaction: this one's duplicate waits
    // one second, answers 409, and leaves the setting as it was.
    let other = lock_wait_service(
        common::db::mysql_store().await.unwrap(),
        ns,
        std::time::Duration::from_secs(10),
        seen.clone(),
        gate.clone(),
        started,
    );
    let first = tokio::spawn(other.oneshot(lock_wait_delivery("e3", "block")));
    started_rx.recv().await.unwrap();
    let waited = std::time::Instant::now();
    let res = svc
        .clone()
        .oneshot(lock_wait_delivery("e3", "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), http::StatusCode::CONFLICT);
    assert!(
        waited.elapsed() >= std::time::Duration::from_millis(900),
        "{:?}",
        waited.elapsed()
    );
    assert_eq!(own().await, OWN, "after a lock wait that timed out");
    // A duplicate dropped while it waits (its sender hung up): the wait still ends, in a task
    // of its own, and the setting is put back before the connection returns to the pool.
    let dropped = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        svc.clone().oneshot(lock_wait_delivery("e3", "ok")),
    )
    .await;
    assert!(dropped.is_err(), "dropped while its marker waits");
    assert_eq!(
        own().await,
        OWN,
        "after a duplicate dropped while its marker waited"
    );
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), http::StatusCode::OK);
    let res = svc.oneshot(lock_wait_delivery("e3", "ok")).await.unwrap();
    assert_eq!(
        res.status(),
        http::StatusCode::OK,
        "a duplicate of the committed e3"
    );
    assert_eq!(own().await, OWN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_keeps_the_connections_lock_wait_timeout() {
    transactional_mode_keeps_the_lock_wait_timeout(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_keeps_the_connections_lock_wait_timeout_two_statement_claim() {
    transactional_mode_keeps_the_lock_wait_timeout(Some(MySqlFlavor::MySql)).await;
}

/// A store whose duplicate counts are written only when asked: one app instance.
async fn quiet_store() -> Option<MySqlStore> {
    let store = MySqlStore::new(common::db::mysql_pool().await?)
        .with_count_interval(common::hot_path::NEVER);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// Where InnoDB's redo log is: it moves with every write to the server.
async fn log_position(pool: &MySqlPool) -> String {
    let (_, lsn): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'")
        .fetch_one(pool)
        .await
        .unwrap();
    lsn
}

/// Duplicates of a done key leave InnoDB's redo log where it was: they write nothing. (On
/// MariaDB the claim's insert returns the existing row, assigning a column to itself, which
/// InnoDB skips; on MySQL the insert is ignored and the row read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_writes_nothing() {
    // Alone: the other tests' writes would move the log.
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = quiet_store().await else {
        return;
    };
    let pool = store.pool().clone();
    common::hot_path::duplicates_leave_the_log_alone(store.clone(), || log_position(&pool)).await;
    let two_statements = store.with_flavor(MySqlFlavor::MySql);
    common::hot_path::duplicates_leave_the_log_alone(two_statements, || log_position(&pool)).await;
}

/// A purge of more rows than one batch holds deletes them all, and only them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_the_table_in_batches() {
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = store().await else { return };
    let pool = store.pool().clone();
    common::hot_path::purge_walks_the_table_in_batches(store, |ns, count| async move {
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let fill = format!(
            "INSERT INTO idempotency_keys \
             (namespace, `key`, state, token, deliveries, claimed_at, completed_at) \
             SELECT ?, CONCAT('old-', n), 'done', n, 1, \
                 UTC_TIMESTAMP(6) - INTERVAL 2 DAY, UTC_TIMESTAMP(6) - INTERVAL 2 DAY \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e) AS numbers \
             WHERE n < ?"
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

/// A database of the previous release (the claims and versions tables, no inbox table) gets
/// the inbox table from `migrate()`, which runs again harmlessly; the inbox then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_inbox_table_to_a_database_of_the_previous_release() {
    let Some(pool) = common::db::mysql_pool().await else {
        return;
    };
    let table = format!("inbox_prev_{}", std::process::id());
    let inbox = format!("{table}_inbox");
    let drop = format!("DROP TABLE IF EXISTS {table}, {table}_versions, {inbox}");
    common::sql::run(&pool, drop.clone()).await;
    let store = MySqlStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    // The previous release's database: the same, without the inbox table.
    common::sql::run(&pool, format!("DROP TABLE {inbox}")).await;
    let ns = common::unique_namespace("inbox-prev");
    let key = common::key_in(&ns, "evt_1");
    let lease = common::acquire(&store, &key, common::LONG).await;
    store.commit(&lease).await.unwrap();
    let tables = || async {
        let mut names = sqlx::query_scalar::<_, String>(
            "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
        )
        .bind(format!("{table}%"))
        .fetch_all(&pool)
        .await
        .unwrap();
        names.sort();
        names
    };
    assert_eq!(tables().await, [table.clone(), format!("{table}_versions")]);
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(
        tables().await,
        [table.clone(), inbox.clone(), format!("{table}_versions")]
    );
    assert!(
        matches!(
            store.claim(&key, common::LONG).await,
            Ok(tower_idempotency::store::Claim::Done(_))
        ),
        "the claims kept"
    );
    let mut indexes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT CAST(INDEX_NAME AS CHAR) FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(&inbox)
    .fetch_all(&pool)
    .await
    .unwrap();
    indexes.sort();
    assert_eq!(indexes, ["PRIMARY", "due_idx", "stale_idx"]);
    common::inbox::an_entry_runs(&store, &key).await;
    common::sql::run(&pool, drop).await;
}

/// The state column refuses a state the inbox does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_table_checks_its_states() {
    let _inbox = tower_idempotency::conformance::INBOX_TABLE.lock().await;
    let Some(store) = inbox_suite::instance().await else {
        return;
    };
    let ns = common::unique_namespace("inbox-check");
    let insert = sqlx::query(
        "INSERT INTO inbox_conformance_inbox (namespace, `key`, state, attempts, crashes, \
         received_at, due_at, renewed_at) \
         VALUES (?, 'evt_1', 'processing', 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6))",
    )
    .bind(&ns)
    .execute(store.pool())
    .await;
    assert!(insert.is_err(), "{insert:?}");
}

/// An entry whose stored bytes are damaged reads as an error, never a panic: its request and
/// its history. A take that meets it settles it dead, kept for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_inbox_entry_is_an_error() {
    use tower_idempotency::store::inbox::{InboxStore, Take};
    let Some(pool) = common::db::mysql_pool().await else {
        return;
    };
    // A table of its own: the damaged entry must not stop the other tests' takes.
    let table = format!("inbox_damaged_{}", std::process::id());
    let store = MySqlStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let ns = common::unique_namespace("inbox-damaged");
    let key = common::key_in(&ns, "evt_1");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table}_inbox (namespace, `key`, state, attempts, crashes, received_at, \
         due_at, renewed_at, request, history) \
         VALUES (?, ?, 'queued', 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         'TIR1 not a request', 'TIH1')"
    )))
    .bind(key.namespace())
    .bind(key.value())
    .execute(&pool)
    .await
    .unwrap();
    assert!(matches!(
        store.stored_request(&key).await,
        Err(StoreError::Backend(_))
    ));
    assert!(matches!(
        store.entry(&key).await,
        Err(StoreError::Backend(_))
    ));
    assert!(store.take(&Take::default()).await.unwrap().is_empty());
    common::inbox::assert_unreadable_and_dead(&store.entry(&key).await.unwrap().unwrap());
    assert!(matches!(
        store.stored_request(&key).await,
        Err(StoreError::Backend(_))
    ));
    let drop = format!("DROP TABLE {table}, {table}_versions, {table}_inbox");
    common::sql::run(&pool, drop).await;
}

/// Duplicates of an inbox entry leave InnoDB's redo log where it was: they write nothing (on
/// MariaDB the insert returns the existing row, assigning a column to itself; on MySQL it
/// fails on the key and the state is read). A new entry moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_duplicate_writes_nothing() {
    use tower_idempotency::store::inbox::{
        Enqueued, EntryState, InboxStore, Running, StoredRequest,
    };
    // Alone: the other tests' writes would move the log.
    let _alone = common::SHARED_TABLE.write().await;
    let _inbox = tower_idempotency::conformance::INBOX_TABLE.lock().await;
    let Some(store) = inbox_suite::instance().await else {
        return;
    };
    let pool = store.pool().clone();
    let request = StoredRequest::new(
        http::Method::POST,
        "/hook",
        Vec::new(),
        bytes::Bytes::from_static(b"{}"),
    );
    for store in [store.clone(), store.with_flavor(MySqlFlavor::MySql)] {
        let ns = common::unique_namespace("inbox-log-alone");
        let key = common::key_in(&ns, "evt_1");
        assert_eq!(
            store.enqueue(&key, &request).await.unwrap(),
            Enqueued::Stored
        );
        let mut still = false;
        for _ in 0..40 {
            let before = log_position(&pool).await;
            for _ in 0..3 {
                assert_eq!(
                    store.enqueue(&key, &request).await.unwrap(),
                    Enqueued::Duplicate(EntryState::Queued)
                );
            }
            if log_position(&pool).await == before {
                still = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(still, "every round of duplicates moved the log");
        let before = log_position(&pool).await;
        let other = common::key_in(&ns, "evt_2");
        assert_eq!(
            store.enqueue(&other, &request).await.unwrap(),
            Enqueued::Stored
        );
        assert_ne!(
            log_position(&pool).await,
            before,
            "an enqueue that stores moves the log"
        );
        store.discard(&key, Running::Force).await.unwrap();
        store.discard(&other, Running::Force).await.unwrap();
    }
}
