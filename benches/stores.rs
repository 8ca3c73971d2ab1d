//! The stores on real databases, against the seed's hand-written SQL on the same pool (and,
//! for Redis, the usual hand-written Redis on the same kind of connection).
//!
//! For each of PostgreSQL, SQLite and MariaDB/MySQL:
//!
//! 1. throughput of new events and of duplicates at 1, 16 and 64 concurrent deliveries,
//!    through the layer (`key::header`, a handler that does nothing) and through the baseline:
//!    the same handler doing `INSERT … ON CONFLICT DO NOTHING` (MariaDB: `INSERT IGNORE`),
//!    the work, then `UPDATE … SET status = 'done'`;
//! 2. delivery latency as the table grows to 1e6 done rows, and the time
//!    `purge_completed` takes for 1e5 expired rows;
//! 3. statements per delivery, counted from sqlx's `sqlx::query` events and checked against
//!    the server's counters (MariaDB `Questions`, PostgreSQL `xact_commit`).
//!
//! Redis (`stores/redis.rs`) gets the first and the third: throughput against `SET key 1 NX PX`,
//! the work, `SET key done PX`, and requests per delivery, counted at a proxy between the
//! client and the server.
//!
//! URLs come from `POSTGRES_URL`, `MYSQL_URL`, `SQLITE_URL` and `REDIS_URL` (defaults: the
//! local servers and a file in the temp directory). An unreachable database prints `SKIPPED: <VAR>
//! unreachable` and the others go on. Tables used: `bench_idempotency`, `bench_seed`,
//! `bench_growth` (dropped and made afresh by the bench).
//!
//! Knobs: `BENCH_GROWTH=0` skips the growth and purge part; `BENCH_SEED_INDEXES=1` gives the
//! baseline's table the store's index of processing rows; `BENCH_BASELINE=store` replaces the
//! seed's SQL with the store called by hand (claim, work, commit) to isolate what the layer
//! adds; `BENCH_COUNT_INTERVAL_S=3600` keeps the stores from writing the counts of duplicates
//! while they are measured, to show what writing them costs; `BENCH_NO_STUCK_INDEX=1` drops
//! the store's index of processing rows (PostgreSQL, SQLite) after `migrate`, to show what it
//! costs a commit.
//!
//! ```sh
//! cargo bench --all-features --bench stores
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode};
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, SqlitePool};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::store::{
    Claim, DEFAULT_RETENTION, MySqlStore, PostgresStore, SqliteStore, Store, StoreError,
};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Scope, Stale, key};

#[path = "stores/redis.rs"]
mod redis;

/// Connections per pool, for the layer and the baseline alike.
const POOL_SIZE: u32 = 16;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Done keys the duplicate benches cycle through.
const DUP_KEYS: u64 = 10_000;
const NAMESPACE: &str = "bench";
const STORE_TABLE: &str = "bench_idempotency";
const SEED_TABLE: &str = "bench_seed";
const GROWTH_TABLE: &str = "bench_growth";
const GROWTH: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];
const PURGE_ROWS: u64 = 100_000;
const PURGE_REPEATS: usize = 3;
/// Rows per bulk `INSERT`.
const FILL_CHUNK: u64 = 100_000;
const SAMPLE_SIZE: usize = 10;
/// Deliveries for the statement counts.
const COUNT_N: u64 = 200;

type Req = Request<Empty<Bytes>>;

/// The handler's work: nothing, so that only the cost of idempotency is measured.
async fn work<B>(_req: Request<B>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

fn request(id: &str) -> Req {
    Request::post("/webhooks/acme")
        .header("x-event-id", id)
        .body(Empty::new())
        .expect("request")
}

/// Per-sample times (ns per delivery) by bench id, for the summary.
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());
static RUN: AtomicU64 = AtomicU64::new(0);

fn record(id: &str, elapsed: Duration, iters: u64) {
    SAMPLES
        .lock()
        .unwrap()
        .entry(id.to_owned())
        .or_default()
        .push(elapsed.as_nanos() as f64 / iters as f64);
}

/// The median of criterion's measurement samples of `id` (the last `SAMPLE_SIZE` runs; the
/// earlier ones are its warm-up), in ns per delivery.
fn median(id: &str) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let all = samples.get(id)?;
    let mut last = all[all.len().saturating_sub(SAMPLE_SIZE)..].to_vec();
    last.sort_by(f64::total_cmp);
    Some(last[last.len() / 2])
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

// ---------------------------------------------------------------------------------------
// Databases

#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Postgres,
    Sqlite,
    MySql,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Sqlite => "sqlite",
            Kind::MySql => "mariadb",
        }
    }

    fn var(self) -> &'static str {
        match self {
            Kind::Postgres => "POSTGRES_URL",
            Kind::Sqlite => "SQLITE_URL",
            Kind::MySql => "MYSQL_URL",
        }
    }

    fn url(self) -> String {
        std::env::var(self.var()).unwrap_or_else(|_| match self {
            Kind::Postgres => "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            Kind::MySql => "mysql://root@127.0.0.1:3306/test".to_owned(),
            Kind::Sqlite => {
                let file = std::env::temp_dir().join("tower-idempotency-bench.sqlite3");
                format!("sqlite://{}", file.display())
            }
        })
    }

    /// A pool of `size` connections, or `None` if the database cannot be reached. Not
    /// `durable`: commits do not wait for the disk where a session can say so (PostgreSQL
    /// `synchronous_commit = off`, SQLite `synchronous = NORMAL`; MariaDB cannot per session).
    async fn connect(self, size: u32, durable: bool) -> Option<Db> {
        let url = self.url();
        let timeout = Duration::from_secs(30);
        let db = match self {
            Kind::Postgres => match url.parse::<sqlx::postgres::PgConnectOptions>() {
                Ok(options) => {
                    let options = if durable {
                        options
                    } else {
                        options.options([("synchronous_commit", "off")])
                    };
                    sqlx::postgres::PgPoolOptions::new()
                        .max_connections(size)
                        .acquire_timeout(timeout)
                        .connect_with(options)
                        .await
                        .map(Db::Postgres)
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            },
            Kind::MySql => sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(timeout)
                .connect(&url)
                .await
                .map(Db::MySql)
                .map_err(|e| e.to_string()),
            Kind::Sqlite => match url.parse::<sqlx::sqlite::SqliteConnectOptions>() {
                Ok(options) => {
                    let options = options
                        .create_if_missing(true)
                        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                        .busy_timeout(timeout);
                    let options = if durable {
                        options
                    } else {
                        options.synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                    };
                    sqlx::sqlite::SqlitePoolOptions::new()
                        .max_connections(size)
                        .acquire_timeout(timeout)
                        .connect_with(options)
                        .await
                        .map(Db::Sqlite)
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            },
        };
        match db {
            Ok(db) => Some(db),
            Err(error) => {
                println!("SKIPPED: {} unreachable ({error})", self.var());
                None
            }
        }
    }
}

impl Db {
    fn kind(&self) -> Kind {
        match self {
            Db::Postgres(_) => Kind::Postgres,
            Db::Sqlite(_) => Kind::Sqlite,
            Db::MySql(_) => Kind::MySql,
        }
    }

    /// Runs bench-made SQL (no user input: names and numbers are the bench's own).
    async fn exec(&self, sql: String) -> u64 {
        let sql = AssertSqlSafe(sql);
        let done = match self {
            Db::Postgres(pool) => sqlx::raw_sql(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Db::Sqlite(pool) => sqlx::raw_sql(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Db::MySql(pool) => sqlx::raw_sql(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        };
        done.expect("bench SQL")
    }

    async fn create_seed_table(&self) {
        let sql = match self.kind() {
            Kind::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    TEXT NOT NULL,
                    event_id     TEXT NOT NULL,
                    status       TEXT NOT NULL,
                    claimed_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
                    completed_at TIMESTAMPTZ,
                    PRIMARY KEY (namespace, event_id))"
            ),
            Kind::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    TEXT NOT NULL,
                    event_id     TEXT NOT NULL,
                    status       TEXT NOT NULL,
                    claimed_at   INTEGER NOT NULL DEFAULT (unixepoch()),
                    completed_at INTEGER,
                    PRIMARY KEY (namespace, event_id))"
            ),
            Kind::MySql => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                    event_id     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                    status       VARCHAR(10) NOT NULL,
                    claimed_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                    completed_at DATETIME(6) NULL,
                    PRIMARY KEY (namespace, event_id)) ENGINE = InnoDB"
            ),
        };
        self.exec(sql).await;
    }

    async fn drop_table(&self, table: &str) {
        self.exec(format!("DROP TABLE IF EXISTS {table}")).await;
    }

    async fn analyze(&self, table: &str) {
        let sql = match self.kind() {
            Kind::Postgres => format!("ANALYZE {table}"),
            Kind::Sqlite => "ANALYZE".to_owned(),
            Kind::MySql => format!("ANALYZE TABLE {table}"),
        };
        self.exec(sql).await;
    }

    /// Inserts done rows `{prefix}{from}..{prefix}{to}` completed `age_s` seconds ago into
    /// `table`: the store's columns, or the seed table's when `table` is [`SEED_TABLE`].
    async fn fill(&self, table: &str, prefix: &str, from: u64, to: u64, age_s: u64) {
        let mut start = from;
        while start < to {
            let end = to.min(start + FILL_CHUNK);
            self.exec(self.fill_sql(table, prefix, start, end, age_s))
                .await;
            start = end;
        }
    }

    fn fill_sql(&self, table: &str, prefix: &str, from: u64, to: u64, age_s: u64) -> String {
        let seed = table == SEED_TABLE;
        let cols = if seed {
            "namespace, event_id, status, claimed_at, completed_at"
        } else {
            "namespace, \"key\", state, token, deliveries, claimed_at, completed_at"
        };
        match self.kind() {
            Kind::Postgres => {
                let at = format!("now() - interval '{age_s} seconds'");
                let values = if seed {
                    format!("'{NAMESPACE}', '{prefix}' || i, 'done', {at}, {at}")
                } else {
                    format!("'{NAMESPACE}', '{prefix}' || i, 'done', i, 1, {at}, {at}")
                };
                format!(
                    "INSERT INTO {table} ({cols}) SELECT {values} FROM generate_series({from}, {last}) AS i",
                    last = to - 1
                )
            }
            Kind::Sqlite => {
                let at = format!(
                    "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000 - {age_s} * 1000000)"
                );
                let at = if seed {
                    format!("(unixepoch() - {age_s})")
                } else {
                    at
                };
                let values = if seed {
                    format!("'{NAMESPACE}', '{prefix}' || i, 'done', {at}, {at}")
                } else {
                    format!("'{NAMESPACE}', '{prefix}' || i, 'done', i, 1, {at}, {at}")
                };
                format!(
                    "WITH RECURSIVE s(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM s WHERE i + 1 < {to})
                     INSERT INTO {table} ({cols}) SELECT {values} FROM s"
                )
            }
            Kind::MySql => {
                let cols = cols.replace('"', "`");
                let at = format!("UTC_TIMESTAMP(6) - INTERVAL {age_s} SECOND");
                let values = if seed {
                    format!("'{NAMESPACE}', CONCAT('{prefix}', n), 'done', {at}, {at}")
                } else {
                    format!("'{NAMESPACE}', CONCAT('{prefix}', n), 'done', n, 1, {at}, {at}")
                };
                // Numbers from a cross join of digit tables: as many digits as the count needs.
                let count = to - from;
                let mut digits = 1;
                while 10u64.pow(digits) < count {
                    digits += 1;
                }
                let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                     UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                     UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let number = (0..digits)
                    .map(|k| format!("{}*d{k}.d", 10u64.pow(k)))
                    .collect::<Vec<_>>()
                    .join(" + ");
                let tables = (0..digits)
                    .map(|k| format!("{digit} d{k}"))
                    .collect::<Vec<_>>()
                    .join(" CROSS JOIN ");
                format!(
                    "INSERT INTO {table} ({cols}) SELECT {values} FROM
                     (SELECT {from} + {number} AS n FROM {tables}) s WHERE n < {to}"
                )
            }
        }
    }

    /// The seed's claim: `true` if this delivery inserted the row.
    async fn seed_claim(&self, id: &str) -> Result<bool, sqlx::Error> {
        let inserted = match self {
            Db::Postgres(pool) => sqlx::query(
                "INSERT INTO bench_seed (namespace, event_id, status) VALUES ($1, $2, 'processing') \
                 ON CONFLICT DO NOTHING",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
            Db::Sqlite(pool) => sqlx::query(
                "INSERT INTO bench_seed (namespace, event_id, status) VALUES (?1, ?2, 'processing') \
                 ON CONFLICT DO NOTHING",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
            Db::MySql(pool) => sqlx::query(
                "INSERT IGNORE INTO bench_seed (namespace, event_id, status) VALUES (?, ?, 'processing')",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(inserted == 1)
    }

    /// The seed's commit.
    async fn seed_done(&self, id: &str) -> Result<(), sqlx::Error> {
        match self {
            Db::Postgres(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = now() \
                 WHERE namespace = $1 AND event_id = $2",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
            Db::Sqlite(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = unixepoch() \
                 WHERE namespace = ?1 AND event_id = ?2",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
            Db::MySql(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = UTC_TIMESTAMP(6) \
                 WHERE namespace = ? AND event_id = ?",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
        }
    }

    /// MariaDB: statements this session has sent (`Questions`), the `SHOW` included.
    async fn questions(&self) -> Option<u64> {
        let Db::MySql(pool) = self else { return None };
        let (_, value): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
            .fetch_one(pool)
            .await
            .ok()?;
        value.parse().ok()
    }

    /// PostgreSQL: committed transactions of this database. `pg_stat_force_next_flush()`
    /// makes this connection publish its counters before it answers, so on a one-connection
    /// pool the read sees every earlier statement (two transactions of its own each time).
    async fn xact_commit(&self) -> Option<i64> {
        let Db::Postgres(pool) = self else {
            return None;
        };
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(pool)
            .await
            .ok()?;
        sqlx::query_scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .ok()
    }
}

/// The seed's hand-written SQL in the handler: claim with `ON CONFLICT DO NOTHING`, answer
/// 200 to a duplicate, else do the work and mark the row done.
fn baseline(
    db: Db,
) -> impl Service<Req, Response = Response<Empty<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: Req| {
        let db = db.clone();
        async move {
            let id = req
                .headers()
                .get("x-event-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let status = |code| {
                let mut res = Response::new(Empty::new());
                *res.status_mut() = code;
                Ok(res)
            };
            match db.seed_claim(&id).await {
                Ok(true) => {}
                Ok(false) => return status(StatusCode::OK),
                Err(_) => return status(StatusCode::SERVICE_UNAVAILABLE),
            }
            let res = work(req).await?;
            match db.seed_done(&id).await {
                Ok(()) => Ok(res),
                Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR),
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Stores

/// How often the stores write the counts of duplicates: `BENCH_COUNT_INTERVAL_S` seconds
/// (default: the stores' own, one second). A long one shows what writing them costs.
fn count_interval() -> Duration {
    std::env::var("BENCH_COUNT_INTERVAL_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
}

/// What the bench needs of a store beyond [`Store`]: to be made on a `Db`, and migrated.
trait BenchStore: Store + Clone + Sized {
    fn open(db: &Db, table: &str) -> Self;
    fn create(&self) -> impl Future<Output = Result<(), StoreError>>;
}

impl BenchStore for PostgresStore {
    fn open(db: &Db, table: &str) -> Self {
        let Db::Postgres(pool) = db else {
            unreachable!()
        };
        PostgresStore::new(pool.clone())
            .with_table_name(table)
            .expect("table name")
            .with_count_interval(count_interval())
    }
    fn create(&self) -> impl Future<Output = Result<(), StoreError>> {
        self.migrate()
    }
}

impl BenchStore for SqliteStore {
    fn open(db: &Db, table: &str) -> Self {
        let Db::Sqlite(pool) = db else { unreachable!() };
        SqliteStore::new(pool.clone())
            .with_table_name(table)
            .expect("table name")
            .with_count_interval(count_interval())
    }
    fn create(&self) -> impl Future<Output = Result<(), StoreError>> {
        self.migrate()
    }
}

impl BenchStore for MySqlStore {
    fn open(db: &Db, table: &str) -> Self {
        let Db::MySql(pool) = db else { unreachable!() };
        MySqlStore::new(pool.clone())
            .with_table_name(table)
            .expect("table name")
            .with_count_interval(count_interval())
    }
    fn create(&self) -> impl Future<Output = Result<(), StoreError>> {
        self.migrate()
    }
}

/// The store called by hand in the handler, without the layer (`BENCH_BASELINE=store`):
/// separates what the layer adds from what the store's SQL costs.
fn store_by_hand<St: Store + Clone>(
    store: St,
) -> impl Service<Req, Response = Response<Empty<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: Req| {
        let store = store.clone();
        async move {
            let id = req
                .headers()
                .get("x-event-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let key = IdempotencyKey::new(NAMESPACE, id).expect("key");
            let status = |code| {
                let mut res = Response::new(Empty::new());
                *res.status_mut() = code;
                Ok(res)
            };
            match store.claim(&key, Stale::default()).await {
                Ok(Claim::Acquired(lease)) => {
                    let res = work(req).await?;
                    match store.commit(&lease).await {
                        Ok(()) => Ok(res),
                        Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR),
                    }
                }
                Ok(Claim::Done(_)) => status(StatusCode::OK),
                Ok(_) => status(StatusCode::CONFLICT),
                Err(_) => status(StatusCode::SERVICE_UNAVAILABLE),
            }
        }
    })
}

fn layered<St: Store + Clone>(
    store: St,
) -> impl Service<Req, Response = Response<impl Send>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    // The key alone, as the baseline and the prefilled rows have it: no route scope.
    IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(NAMESPACE))
        .scope(Scope::shared())
        .layer(service_fn(work))
}

/// Runs `iters` deliveries over `concurrency` tasks; the key of delivery `i` is `key(i)`.
async fn drive<S, B>(
    svc: S,
    concurrency: usize,
    iters: u64,
    key: Arc<dyn Fn(u64) -> String + Send + Sync>,
) -> Duration
where
    S: Service<Req, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..(concurrency as u64).min(iters) {
        let (mut svc, next, key) = (svc.clone(), next.clone(), key.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= iters {
                    break;
                }
                let res = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(request(&key(i)))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK, "delivery {i}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("delivery task");
    }
    start.elapsed()
}

/// The key of each delivery of a run, by its number.
type Keys = Arc<dyn Fn(u64) -> String + Send + Sync>;

fn new_keys() -> Keys {
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    Arc::new(move |i| format!("new-{pid}-{run}-{i}"))
}

fn dup_keys(count: u64) -> Keys {
    let run = RUN.fetch_add(1, Ordering::Relaxed) << 32;
    Arc::new(move |i| format!("dup-{}", splitmix(run + i) % count))
}

fn group_config<'c>(
    c: &'c mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(SAMPLE_SIZE)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sampling_mode(SamplingMode::Flat);
    group
}

/// Throughput of the layer and the baseline, new events and duplicates, at each concurrency
/// (see [`paired`]).
fn throughput<St: BenchStore>(c: &mut Criterion, rt: &Runtime, db: &Db, label: &str) {
    let store = St::open(db, STORE_TABLE);
    rt.block_on(async {
        // Tables made afresh, so that nothing left by an earlier run changes their shape.
        db.drop_table(STORE_TABLE).await;
        db.drop_table(SEED_TABLE).await;
        store.create().await.expect("migrate");
        db.create_seed_table().await;
        if std::env::var("BENCH_NO_STUCK_INDEX").is_ok_and(|v| v == "1")
            && !matches!(db.kind(), Kind::MySql)
        {
            // MySQL's store has none.
            db.exec(format!("DROP INDEX IF EXISTS {STORE_TABLE}_stuck_idx"))
                .await;
        }
        if std::env::var("BENCH_SEED_INDEXES").is_ok_and(|v| v == "1") {
            // The store's index of processing rows (for `stuck_claims`) on the baseline's
            // table too, where the backend has one (MySQL has no partial index, and the store
            // none): separates its cost from the rest.
            if !matches!(db.kind(), Kind::MySql) {
                db.exec(format!(
                    "CREATE INDEX {SEED_TABLE}_stuck ON {SEED_TABLE} (claimed_at) \
                     WHERE status = 'processing'"
                ))
                .await;
            }
        }
        db.fill(STORE_TABLE, "dup-", 0, DUP_KEYS, 60).await;
        db.fill(SEED_TABLE, "dup-", 0, DUP_KEYS, 60).await;
    });
    let by_hand = std::env::var("BENCH_BASELINE").is_ok_and(|v| v == "store");
    let mut group = group_config(c, label);
    for path in ["new", "duplicate"] {
        for concurrency in CONCURRENCY {
            let base: Run<'_> = if by_hand {
                Box::new(|n, keys| {
                    Box::pin(drive(store_by_hand(store.clone()), concurrency, n, keys))
                })
            } else {
                Box::new(|n, keys| Box::pin(drive(baseline(db.clone()), concurrency, n, keys)))
            };
            let layer: Run<'_> =
                Box::new(|n, keys| Box::pin(drive(layered(store.clone()), concurrency, n, keys)));
            paired(&mut group, rt, label, path, concurrency, base, layer);
        }
    }
    group.finish();
}

/// `n` deliveries over the given keys, through one side of a pair, answering how long they
/// took.
type Run<'a> = Box<dyn Fn(u64, Keys) -> Pin<Box<dyn Future<Output = Duration> + 'a>> + 'a>;

/// The bench `label/path/c{concurrency}` of one pair: each criterion iteration is one
/// baseline delivery and one layer delivery. Within a sample the two run alternately in blocks
/// (which goes first alternates too), so that both meet the same load from the rest of the
/// machine; each side's time is recorded for the summary.
fn paired(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    label: &str,
    path: &str,
    concurrency: usize,
    base: Run<'_>,
    layer: Run<'_>,
) {
    let id = format!("{path}/c{concurrency}");
    let full = format!("{label}/{id}");
    let keys = || {
        if path == "new" {
            new_keys()
        } else {
            dup_keys(DUP_KEYS)
        }
    };
    group.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            let block = (concurrency as u64 * 8).max(128);
            let (mut base_took, mut layer_took) = (Duration::ZERO, Duration::ZERO);
            let (mut left, mut layer_first) = (iters, false);
            while left > 0 {
                let n = left.min(block);
                left -= n;
                rt.block_on(async {
                    if layer_first {
                        layer_took += layer(n, keys()).await;
                    }
                    base_took += base(n, keys()).await;
                    if !layer_first {
                        layer_took += layer(n, keys()).await;
                    }
                });
                layer_first = !layer_first;
            }
            record(&format!("{full}/baseline"), base_took, iters);
            record(&format!("{full}/layer"), layer_took, iters);
            base_took + layer_took
        })
    });
}

/// Delivery latency as the table grows, then purge time.
fn growth<St: BenchStore>(c: &mut Criterion, rt: &Runtime, db: &Db, full: bool) -> Vec<Duration> {
    let backend = db.kind().name();
    let store = St::open(db, GROWTH_TABLE);
    rt.block_on(async {
        db.drop_table(GROWTH_TABLE).await;
        store.create().await.expect("migrate");
    });
    if std::env::var("BENCH_GROWTH").is_ok_and(|v| v == "0") {
        println!("{backend}: growth and purge skipped (BENCH_GROWTH=0)");
        return Vec::new();
    }
    let sizes: &[u64] = if full { &GROWTH } else { &GROWTH[..1] };
    let mut rows = 0;
    let mut group = group_config(c, &format!("{backend}-growth"));
    for &size in sizes {
        let started = Instant::now();
        rt.block_on(async {
            db.fill(GROWTH_TABLE, "g-", rows, size, 3600).await;
            db.analyze(GROWTH_TABLE).await;
        });
        println!(
            "{backend}: {GROWTH_TABLE} grown to {size} done rows in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        rows = size;
        for path in ["new", "duplicate"] {
            let id = format!("{size}/{path}");
            let full_id = format!("{backend}-growth/{id}");
            group.bench_function(&id, |b| {
                b.iter_custom(|iters| {
                    let keys: Arc<dyn Fn(u64) -> String + Send + Sync> = if path == "new" {
                        new_keys()
                    } else {
                        Arc::new(move |i| format!("g-{}", splitmix(i) % size))
                    };
                    let elapsed = rt.block_on(drive(layered(store.clone()), 1, iters, keys));
                    record(&full_id, elapsed, iters);
                    elapsed
                })
            });
        }
    }
    group.finish();

    // Purge: expired rows among the grown table.
    let (purge_rows, repeats) = if full {
        (PURGE_ROWS, PURGE_REPEATS)
    } else {
        (1_000, 1)
    };
    let mut times = Vec::new();
    for rep in 0..repeats {
        let (took, quiet, during) = rt.block_on(async {
            let expired = DEFAULT_RETENTION.as_secs() + 86_400;
            db.fill(GROWTH_TABLE, &format!("p{rep}-"), 0, purge_rows, expired)
                .await;
            // Deliveries of new events one after another: for a while alone, then while the
            // purge runs. A purge that held its locks long would show in the second.
            let quiet = deliveries_until(store.clone(), tokio::time::sleep(PROBE_QUIET)).await;
            // Timed inside: the probe's last delivery, which ends after the purge, is not.
            let purge = async {
                let start = Instant::now();
                let purged = store.purge_completed(DEFAULT_RETENTION).await;
                (purged, start.elapsed())
            };
            let ((purged, took), during) = deliveries_during(store.clone(), purge).await;
            assert_eq!(purged.expect("purge"), purge_rows, "purged rows");
            (took, quiet, during)
        });
        println!(
            "{backend}: purge_completed deleted {purge_rows} expired rows of {} in {:.3} s; \
             claim and commit of a new event alone {}, during the purge {}",
            rows + purge_rows,
            took.as_secs_f64(),
            latencies(quiet),
            latencies(during),
        );
        times.push(took);
    }
    times
}

/// How long deliveries are probed alone before a purge.
const PROBE_QUIET: Duration = Duration::from_millis(500);

/// Delivers new events through the layer one after another until `until` is ready; answers
/// how long each took.
async fn deliveries_until<St: BenchStore>(
    store: St,
    until: impl Future<Output = ()>,
) -> Vec<Duration> {
    deliveries_during(store, until).await.1
}

/// The same, while `work` runs; answers what it answered too.
async fn deliveries_during<St: BenchStore, T>(
    store: St,
    work: impl Future<Output = T>,
) -> (T, Vec<Duration>) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (stop, keys) = (stop.clone(), new_keys());
        let mut svc = layered(store);
        tokio::spawn(async move {
            let mut took = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let res = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(request(&keys(i)))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                took.push(start.elapsed());
                i += 1;
            }
            took
        })
    };
    let answer = work.await;
    stop.store(true, Ordering::Relaxed);
    (answer, probe.await.expect("probe"))
}

/// `n`, median, 99th percentile and longest of `took`.
fn latencies(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |q: f64| {
        took.get(((took.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    format!(
        "n {}, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        took.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        took.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    )
}

// ---------------------------------------------------------------------------------------
// Statement counts

/// Counts `sqlx::query` events: sqlx records one per statement it executes.
struct StatementCounter;

static STATEMENTS: AtomicU64 = AtomicU64::new(0);

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if self.enabled(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[derive(Debug, Default, Clone)]
struct Counted {
    /// Statements per delivery, from sqlx's events.
    client: f64,
    /// Statements per delivery, from the server's counter, where there is one.
    server: Option<f64>,
}

/// Statements per delivery for the layer and the baseline, new events and duplicates, on a
/// one-connection pool (so MariaDB's session counter sees them all).
async fn round_trips<St: BenchStore>(kind: Kind) -> Option<BTreeMap<String, Counted>> {
    let db = kind.connect(1, true).await?;
    let store = St::open(&db, STORE_TABLE);
    let mut out = BTreeMap::new();
    for which in ["baseline", "layer"] {
        for path in ["new", "duplicate"] {
            let run = |n| {
                let keys = if path == "new" {
                    new_keys()
                } else {
                    dup_keys(DUP_KEYS)
                };
                let (db, store) = (db.clone(), store.clone());
                async move {
                    if which == "layer" {
                        drive(layered(store), 1, n, keys).await
                    } else {
                        drive(baseline(db), 1, n, keys).await
                    }
                }
            };
            // Warm up: sqlx prepares each statement once per connection.
            run(5).await;
            let _ = db.questions().await;
            let (q0, x0) = (db.questions().await, db.xact_commit().await);
            STATEMENTS.store(0, Ordering::Relaxed);
            run(COUNT_N).await;
            let client = STATEMENTS.load(Ordering::Relaxed) as f64 / COUNT_N as f64;
            let (q1, x1) = (db.questions().await, db.xact_commit().await);
            // The deltas include the counting's own statements: the second `SHOW` (MariaDB);
            // the first read and the second flush (PostgreSQL).
            let server = match (q0, q1, x0, x1) {
                (Some(a), Some(b), _, _) => Some((b - a - 1) as f64 / COUNT_N as f64),
                (_, _, Some(a), Some(b)) => Some((b - a - 2) as f64 / COUNT_N as f64),
                _ => None,
            };
            out.insert(format!("{path}/{which}"), Counted { client, server });
        }
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = Criterion::default().configure_from_args();
    let mut labels: Vec<&str> = Vec::new();
    let mut purges: Vec<(&str, Vec<Duration>)> = Vec::new();
    let mut reachable = Vec::new();
    for kind in [Kind::Postgres, Kind::Sqlite, Kind::MySql] {
        if kind == Kind::Sqlite && std::env::var_os("SQLITE_URL").is_none() {
            let file = std::env::temp_dir().join("tower-idempotency-bench.sqlite3");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
        let Some(db) = rt.block_on(kind.connect(POOL_SIZE, true)) else {
            continue;
        };
        reachable.push(kind);
        // Growth on a pool whose commits do not wait for the disk where the database allows
        // it, so that the latency shows the lookups rather than the disk's fsync.
        let growth_db = rt.block_on(kind.connect(2, false)).expect("second pool");
        let times = match kind {
            Kind::Postgres => {
                throughput::<PostgresStore>(&mut c, &rt, &db, "postgres");
                growth::<PostgresStore>(&mut c, &rt, &growth_db, full)
            }
            Kind::Sqlite => {
                throughput::<SqliteStore>(&mut c, &rt, &db, "sqlite");
                // SQLite has one writer at a time: a pool of one connection queues writers in
                // the application instead of in SQLite's busy handler (which sleeps).
                let single = rt.block_on(kind.connect(1, true)).expect("sqlite pool");
                throughput::<SqliteStore>(&mut c, &rt, &single, "sqlite-1conn");
                labels.push("sqlite");
                growth::<SqliteStore>(&mut c, &rt, &growth_db, full)
            }
            Kind::MySql => {
                throughput::<MySqlStore>(&mut c, &rt, &db, "mariadb");
                growth::<MySqlStore>(&mut c, &rt, &growth_db, full)
            }
        };
        labels.push(match kind {
            Kind::Postgres => "postgres",
            Kind::Sqlite => "sqlite-1conn",
            Kind::MySql => "mariadb",
        });
        purges.push((kind.name(), times));
    }
    if let Some(redis) = rt.block_on(redis::connect()) {
        redis::throughput(&mut c, &rt, &redis);
        labels.push("redis");
    }
    c.final_summary();

    // Statement counts last: the counting subscriber stays installed for the rest of the run.
    tracing::subscriber::set_global_default(StatementCounter).expect("subscriber");
    let mut counts = Vec::new();
    for &kind in &reachable {
        let counted = rt.block_on(async {
            match kind {
                Kind::Postgres => round_trips::<PostgresStore>(kind).await,
                Kind::Sqlite => round_trips::<SqliteStore>(kind).await,
                Kind::MySql => round_trips::<MySqlStore>(kind).await,
            }
        });
        if let Some(counted) = counted {
            counts.push((kind, counted));
        }
    }

    let redis_counts = rt.block_on(redis::round_trips());

    summary(&labels, &reachable, &purges, &counts);
    if let Some(counts) = redis_counts {
        println!("\nSUMMARY stores: Redis requests per delivery (counted at a proxy)");
        println!("| path | baseline | layer |");
        println!("|---|---:|---:|");
        for path in ["new", "duplicate"] {
            let show = |which: &str| {
                counts
                    .get(&format!("{path}/{which}"))
                    .map_or("-".to_owned(), |n| format!("{n:.2}"))
            };
            println!("| {path} | {} | {} |", show("baseline"), show("layer"));
        }
    }
}

/// Per sample, baseline time over layer time: the layer's throughput relative to the
/// baseline measured alongside it. The median over the samples.
fn paired_ratio(id: &str) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let base = samples.get(&format!("{id}/baseline"))?;
    let layer = samples.get(&format!("{id}/layer"))?;
    let n = base.len().min(layer.len()).min(SAMPLE_SIZE);
    let mut ratios: Vec<f64> = base[base.len() - n..]
        .iter()
        .zip(&layer[layer.len() - n..])
        .map(|(b, l)| b / l)
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios.get(ratios.len() / 2).copied()
}

fn summary(
    labels: &[&str],
    reachable: &[Kind],
    purges: &[(&str, Vec<Duration>)],
    counts: &[(Kind, BTreeMap<String, Counted>)],
) {
    let us = |ns: f64| format!("{:.0}", ns / 1000.0);
    println!(
        "\nSUMMARY stores: throughput, layer vs baseline on the same pool ({POOL_SIZE} connections unless named 1conn; redis: one multiplexed connection each)"
    );
    println!(
        "| pool | path | concurrency | baseline µs/delivery | layer µs/delivery | baseline deliveries/s | layer deliveries/s | layer / baseline |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for label in labels {
        for path in ["new", "duplicate"] {
            for concurrency in CONCURRENCY {
                let id = format!("{label}/{path}/c{concurrency}");
                let base = median(&format!("{id}/baseline"));
                let layer = median(&format!("{id}/layer"));
                if let (Some(base), Some(layer), Some(ratio)) = (base, layer, paired_ratio(&id)) {
                    println!(
                        "| {label} | {path} | {concurrency} | {} | {} | {:.0} | {:.0} | {ratio:.2} |",
                        us(base),
                        us(layer),
                        1e9 / base,
                        1e9 / layer,
                    );
                }
            }
        }
    }
    println!(
        "\nSUMMARY stores: growth (layer, concurrency 1; commits not waiting for fsync on postgres and sqlite, durable on mariadb)"
    );
    println!("| backend | done rows | new event µs | new event /s | duplicate µs | duplicate /s |");
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in reachable {
        let backend = kind.name();
        for size in GROWTH {
            let new = median(&format!("{backend}-growth/{size}/new"));
            let dup = median(&format!("{backend}-growth/{size}/duplicate"));
            if let (Some(new), Some(dup)) = (new, dup) {
                println!(
                    "| {backend} | {size} | {} | {:.0} | {} | {:.0} |",
                    us(new),
                    1e9 / new,
                    us(dup),
                    1e9 / dup
                );
            }
        }
    }

    println!("\nSUMMARY stores: purge_completed of expired rows (seconds, each run)");
    for (backend, times) in purges {
        let list: Vec<String> = times
            .iter()
            .map(|t| format!("{:.3}", t.as_secs_f64()))
            .collect();
        println!("| {backend} | {} |", list.join(" | "));
    }

    println!("\nSUMMARY stores: statements per delivery (sqlx events / server counter)");
    println!("| backend | path | baseline | layer |");
    println!("|---|---|---|---|");
    for (kind, counted) in counts {
        for path in ["new", "duplicate"] {
            let show = |which: &str| {
                counted
                    .get(&format!("{path}/{which}"))
                    .map_or("-".to_owned(), |c| match c.server {
                        Some(s) => format!("{:.2} / {:.2}", c.client, s),
                        None => format!("{:.2} / -", c.client),
                    })
            };
            println!(
                "| {} | {path} | {} | {} |",
                kind.name(),
                show("baseline"),
                show("layer")
            );
        }
    }
}
