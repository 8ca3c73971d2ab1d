//! The stores on real databases, each against hand-written SQL in the handler on the same pool
//! (and, for Redis, the usual hand-written Redis on the same kind of connection).
//!
//! Every SQL row runs three sides, all through an axum `Router` with one `post` route (the
//! route's handler does nothing: only the cost of idempotency is measured), on a 2-worker
//! runtime, with fresh keys for new events and random ones among 10,000 done keys for
//! duplicates (`stores/patterns.rs` has the SQL):
//!
//! - **pattern 3**, the baseline of record, the layer's contract written by hand: `INSERT …
//!   (status 'processing') ON CONFLICT DO NOTHING` (MariaDB: `INSERT IGNORE`); if nothing was
//!   inserted, `SELECT status` and answer 200 for `done`, 409 otherwise; else the work, then
//!   `UPDATE … SET status = 'done'`;
//! - **pattern 1**, the floor: the same without the read, 200 whenever nothing was inserted.
//!   It acknowledges a duplicate of an event still running, and so loses the event if that run
//!   fails;
//! - **layer**: `IdempotencyLayer` on the route (`key::header`), over the backend's store.
//!
//! Commits are durable on every side. For each of PostgreSQL, SQLite and MariaDB/MySQL:
//!
//! 1. throughput of new events and of duplicates at 1, 16 and 64 concurrent deliveries: each
//!    criterion sample runs the sides in turn, in blocks, so that they share the machine's
//!    load; the summary gives each side's µs per delivery, layer ÷ pattern 3 (the ratio of
//!    record) and layer ÷ pattern 1, each the median of the per-sample ratios;
//! 2. the answer time of one delivery, p50 and p99, over a fixed count of deliveries per side
//!    at each concurrency, the sides again in turn;
//! 3. per delivery, from the servers' counters over a fixed count of deliveries, each side
//!    alone (`stores/counts.rs`): statements (sqlx's events, every backend), transactions and
//!    WAL writes and flushes (PostgreSQL), statements, writes, reads, commits, redo log writes
//!    and fsyncs (MariaDB);
//! 4. delivery latency through the layer (a bare tower service) as the table grows to 1e6
//!    done rows, and the time `purge_completed` takes for 1e5 expired rows.
//!
//! The second and third run on one pool per backend: PostgreSQL's and MariaDB's of 16
//! connections, SQLite's of one (`sqlite-1conn`; SQLite's pool of 16 gets the first part
//! only). Redis (`stores/redis.rs`) gets the first two parts, against `SET key 1 NX PX`, the
//! work, `SET key done PX`, and its requests per delivery, counted at a proxy between the
//! client and the server.
//!
//! URLs come from `POSTGRES_URL`, `MYSQL_URL`, `SQLITE_URL` and `REDIS_URL` (defaults: the
//! local servers and a file in the temp directory). An unreachable database prints `SKIPPED: <VAR>
//! unreachable` and the others go on. Tables used: `bench_idempotency`, `bench_seed`,
//! `bench_growth` (dropped and made afresh by the bench).
//!
//! Knobs: `BENCH_ONLY=postgres,sqlite,mariadb,redis` runs the backends named; `BENCH_QUICK=1`
//! makes every part short (samples of a fraction of a second, 200 deliveries per count, the
//! smallest growth), as a run as a test does: to check that the bench runs, not to measure; `BENCH_GROWTH=0` skips the
//! growth and purge part; `BENCH_SHELL=tower` drives the bare tower services instead of the
//! `Router`; `BENCH_BASELINE=store` replaces the patterns with the store called by hand
//! (claim, work, commit) to isolate what the layer adds; `BENCH_COUNT_INTERVAL_S=3600` keeps
//! the stores from writing the counts of duplicates while they are timed, to show what writing
//! them costs; `BENCH_STUCK_INDEX=1` gives the store's table the index of processing rows
//! that the store once kept (PostgreSQL, SQLite), to show what it costs a commit.
//!
//! ```sh
//! cargo bench --all-features --bench stores
//! BENCH_QUICK=1 BENCH_ONLY=postgres BENCH_GROWTH=0 cargo bench --all-features --bench stores
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use criterion::{Criterion, SamplingMode};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Empty;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, SqlitePool};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::store::{
    Claim, DEFAULT_RETENTION, MySqlStore, PostgresStore, SqliteStore, Store, StoreError,
};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Scope, Stale, key};

use patterns::Pattern;

#[path = "stores/counts.rs"]
mod counts;
#[path = "stores/patterns.rs"]
mod patterns;
#[path = "stores/redis.rs"]
mod redis;

/// Connections per pool, for the layer and the patterns alike.
const POOL_SIZE: u32 = 16;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Done keys the duplicate benches cycle through.
const DUP_KEYS: u64 = 10_000;
const NAMESPACE: &str = "bench";
/// The route every side answers on.
const PATH: &str = "/webhooks/acme";
const STORE_TABLE: &str = "bench_idempotency";
const SEED_TABLE: &str = "bench_seed";
const GROWTH_TABLE: &str = "bench_growth";
const GROWTH: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];
const PURGE_ROWS: u64 = 100_000;
const PURGE_REPEATS: usize = 3;
/// Rows per bulk `INSERT`.
const FILL_CHUNK: u64 = 100_000;
const SAMPLE_SIZE: usize = 10;

/// `BENCH_QUICK=1`, or a run as a test (`cargo test --benches`, without `--bench`): every
/// part short, to see that the bench runs.
fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1")
        || !std::env::args().any(|a| a == "--bench")
}

/// Whether `BENCH_ONLY` (a comma-separated list of backends) names `backend`; unset, all.
fn only(backend: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |list| {
        list.split(',')
            .map(str::trim)
            .any(|name| name == backend || (name == "mysql" && backend == "mariadb"))
    })
}

/// Deliveries per side for the answer times and for the counts.
fn fixed_count() -> u64 {
    if quick() { 200 } else { 2_000 }
}

type Req = Request<Empty<Bytes>>;

/// The handler's work: nothing, so that only the cost of idempotency is measured.
async fn work() {}

/// The layer's handler, on the route.
async fn handler() -> StatusCode {
    work().await;
    StatusCode::OK
}

fn request(id: &str) -> Req {
    Request::post(PATH)
        .header("x-event-id", id)
        .body(Empty::new())
        .expect("request")
}

/// The event's id, as a handler reads it.
fn event_id(headers: &HeaderMap) -> &str {
    headers
        .get("x-event-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
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

/// What the bench needs of a store beyond [`Store`]: to be made on a `Db`, migrated, and
/// asked what it holds back.
trait BenchStore: Store + Clone + Sized {
    fn open(db: &Db, table: &str) -> Self;
    fn create(&self) -> impl Future<Output = Result<(), StoreError>>;
    /// Writes the counts of duplicates the store holds back.
    fn write_counts(&self) -> impl Future<Output = Result<(), StoreError>>;
    /// The sizes of the batches the store's statements carried since it was last asked, for
    /// the counts' summary; `None` where the store does not tell them.
    fn batch_sizes(&self) -> Option<String> {
        counts::batch_sizes()
    }
    /// The same store with each write sent on its own (`max_batch(1)`).
    fn unbatched(self) -> Self;
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
    fn write_counts(&self) -> impl Future<Output = Result<(), StoreError>> {
        PostgresStore::write_counts(self)
    }
    fn unbatched(self) -> Self {
        self.max_batch(1)
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
    fn write_counts(&self) -> impl Future<Output = Result<(), StoreError>> {
        SqliteStore::write_counts(self)
    }
    fn unbatched(self) -> Self {
        self.max_batch(1)
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
    fn write_counts(&self) -> impl Future<Output = Result<(), StoreError>> {
        MySqlStore::write_counts(self)
    }
    fn unbatched(self) -> Self {
        self.max_batch(1)
    }
}

/// The store called by hand in the handler, without the layer (`BENCH_BASELINE=store`):
/// separates what the layer adds from what the store's SQL costs.
async fn claim_by_hand<St: Store>(store: &St, id: &str) -> StatusCode {
    let key = IdempotencyKey::new(NAMESPACE, id).expect("key");
    match store.claim(&key, Stale::default()).await {
        Ok(Claim::Acquired(lease)) => {
            work().await;
            match store.commit(&lease).await {
                Ok(()) => StatusCode::OK,
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
            }
        }
        Ok(Claim::Done(_)) => StatusCode::OK,
        Ok(_) => StatusCode::CONFLICT,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn by_hand_handler<St: Store + Clone>(
    State(store): State<St>,
    headers: HeaderMap,
) -> StatusCode {
    claim_by_hand(&store, event_id(&headers)).await
}

fn store_by_hand<St: Store + Clone>(
    store: St,
) -> impl Service<Req, Response = Response<Empty<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: Req| {
        let store = store.clone();
        async move {
            let mut res = Response::new(Empty::new());
            *res.status_mut() = claim_by_hand(&store, event_id(req.headers())).await;
            Ok(res)
        }
    })
}

/// The layer as configured for every side that has it: the key alone, as the patterns and
/// the prefilled rows have it (no route scope).
fn idempotency<St: Store + Clone>(store: St) -> IdempotencyLayer<St, key::Header> {
    IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(NAMESPACE))
        .scope(Scope::shared())
}

/// The layer around the handler's work, as a bare tower service.
fn layered<St: Store + Clone>(
    store: St,
) -> impl Service<Req, Response = Response<impl Send>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    idempotency(store).layer(service_fn(bare_handler))
}

/// The layer's handler as a bare tower service.
async fn bare_handler<B>(_req: Request<B>) -> Result<Response<Empty<Bytes>>, Infallible> {
    work().await;
    Ok(Response::new(Empty::new()))
}

// ---------------------------------------------------------------------------------------
// Sides

/// What the sides run in: an axum `Router` with one `post` route at [`PATH`], as users run the
/// layer (the default), or the bare tower services (`BENCH_SHELL=tower`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shell {
    Router,
    Tower,
}

impl Shell {
    fn from_env() -> Shell {
        if std::env::var("BENCH_SHELL").is_ok_and(|v| v == "tower") {
            Shell::Tower
        } else {
            Shell::Router
        }
    }

    /// The layer over `store` around the handler, called `name`.
    fn layer<St: Store + Clone>(self, name: &'static str, store: St) -> Side {
        match self {
            Shell::Router => Side::new(
                name,
                false,
                Router::new().route(PATH, post(handler).layer(idempotency(store))),
            ),
            Shell::Tower => Side::new(name, false, layered(store)),
        }
    }

    /// A hand-written pattern on `db`.
    fn pattern(self, pattern: Pattern, db: &Db) -> Side {
        match self {
            Shell::Router => Side::new(pattern.name(), true, pattern.router(db.clone())),
            Shell::Tower => Side::new(pattern.name(), true, pattern.service(db.clone())),
        }
    }

    /// The store called by hand in the handler (`BENCH_BASELINE=store`).
    fn by_hand<St: Store + Clone>(self, store: St) -> Side {
        let name = "store by hand";
        match self {
            Shell::Router => Side::new(
                name,
                true,
                Router::new()
                    .route(PATH, post(by_hand_handler::<St>))
                    .with_state(store),
            ),
            Shell::Tower => Side::new(name, true, store_by_hand(store)),
        }
    }
}

/// `n` deliveries at `concurrency` over the given keys, each timed if asked.
type Run = Box<dyn Fn(usize, u64, Keys, bool) -> Pin<Box<dyn Future<Output = Driven>>>>;

/// One side of a comparison: a way to answer deliveries, run in turn with the others.
struct Side {
    /// Its name in the summaries.
    name: &'static str,
    /// A hand-written baseline, which the other sides are measured against.
    baseline: bool,
    run: Run,
    /// Writes what the side's store holds back (the counts of duplicates); nothing for a
    /// hand-written side.
    settle: Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>,
    /// The sizes of the batches its store's statements carried, where the store tells them.
    batches: Box<dyn Fn() -> Option<String>>,
}

impl Side {
    fn new<S, B>(name: &'static str, baseline: bool, svc: S) -> Side
    where
        S: Service<Req, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
        S::Future: Send,
        B: Send + 'static,
    {
        Side {
            name,
            baseline,
            run: Box::new(move |concurrency, n, keys, each| {
                Box::pin(drive(svc.clone(), concurrency, n, keys, each))
            }),
            settle: Box::new(|| Box::pin(async {})),
            batches: Box::new(|| None),
        }
    }

    fn with_store<St: BenchStore>(self, store: St) -> Side {
        let settled = store.clone();
        Side {
            settle: Box::new(move || {
                let store = settled.clone();
                Box::pin(async move { store.write_counts().await.expect("write counts") })
            }),
            batches: Box::new(move || store.batch_sizes()),
            ..self
        }
    }

    fn run(
        &self,
        concurrency: usize,
        n: u64,
        keys: Keys,
        each: bool,
    ) -> impl Future<Output = Driven> {
        (self.run)(concurrency, n, keys, each)
    }
}

/// The sides of an SQL row, in the summaries' order: the baselines first (pattern 3, the one
/// of record, then pattern 1, the floor), then the layer. Another side (the layer over a
/// store built another way, say) is one more entry here; the summaries take their columns
/// from this list.
fn sql_sides<St: BenchStore>(db: &Db, store: &St) -> Vec<Side> {
    let shell = Shell::from_env();
    let layer = shell
        .layer("layer", store.clone())
        .with_store(store.clone());
    if std::env::var("BENCH_BASELINE").is_ok_and(|v| v == "store") {
        return vec![
            shell.by_hand(store.clone()).with_store(store.clone()),
            layer,
        ];
    }
    let unbatched = store.clone().unbatched();
    vec![
        shell.pattern(Pattern::Three, db),
        shell.pattern(Pattern::One, db),
        layer,
        shell
            .layer("layer, batching off", unbatched.clone())
            .with_store(unbatched),
    ]
}

/// What a run of deliveries took: in all, and each delivery if asked.
#[derive(Debug, Default)]
struct Driven {
    took: Duration,
    each: Vec<Duration>,
}

/// Runs `iters` deliveries over `concurrency` tasks; the key of delivery `i` is `key(i)`. With
/// `each`, every delivery's answer time is kept too.
async fn drive<S, B>(svc: S, concurrency: usize, iters: u64, key: Keys, each: bool) -> Driven
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
            let mut times = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= iters {
                    break;
                }
                let req = request(&key(i));
                let sent = each.then(Instant::now);
                let res = svc.ready().await.unwrap().call(req).await.unwrap();
                if let Some(sent) = sent {
                    times.push(sent.elapsed());
                }
                assert_eq!(res.status(), StatusCode::OK, "delivery {i}");
            }
            times
        });
    }
    let mut times = Vec::new();
    while let Some(done) = tasks.join_next().await {
        times.extend(done.expect("delivery task"));
    }
    Driven {
        took: start.elapsed(),
        each: times,
    }
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

/// Fresh keys for new events, done ones for duplicates.
fn keys(path: &str) -> Keys {
    if path == "new" {
        new_keys()
    } else {
        dup_keys(DUP_KEYS)
    }
}

fn group_config<'c>(
    c: &'c mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    let (warm_up, measurement) = if quick() {
        (Duration::from_millis(100), Duration::from_millis(400))
    } else {
        (Duration::from_millis(500), Duration::from_secs(2))
    };
    group
        .sample_size(SAMPLE_SIZE)
        .warm_up_time(warm_up)
        .measurement_time(measurement)
        .sampling_mode(SamplingMode::Flat);
    group
}

/// `n` deliveries through every side at `concurrency`, the sides in turn in blocks: each
/// block starts with the side after the one the previous block started with (`turn` counts
/// the blocks), so that every side meets the same load from the rest of the machine and
/// takes every place in the order as often. Answers each side's sum.
fn alternate(
    rt: &Runtime,
    sides: &[Side],
    path: &str,
    concurrency: usize,
    n: u64,
    turn: &AtomicUsize,
    each: bool,
) -> Vec<Driven> {
    let block = (concurrency as u64 * 8).max(128);
    let mut out: Vec<Driven> = sides.iter().map(|_| Driven::default()).collect();
    let mut left = n;
    while left > 0 {
        let m = left.min(block);
        left -= m;
        let first = turn.fetch_add(1, Ordering::Relaxed);
        rt.block_on(async {
            for k in 0..sides.len() {
                let at = (first + k) % sides.len();
                let driven = sides[at].run(concurrency, m, keys(path), each).await;
                out[at].took += driven.took;
                out[at].each.extend(driven.each);
            }
        });
    }
    out
}

/// Tables made afresh for a pool: the store's and the patterns', each with [`DUP_KEYS`] done
/// rows for the duplicates.
async fn prepare<St: BenchStore>(db: &Db, store: &St) {
    // Made afresh, so that nothing left by an earlier run changes their shape.
    db.drop_table(STORE_TABLE).await;
    db.drop_table(SEED_TABLE).await;
    store.create().await.expect("migrate");
    db.create_seed_table().await;
    if std::env::var("BENCH_STUCK_INDEX").is_ok_and(|v| v == "1")
        && !matches!(db.kind(), Kind::MySql)
    {
        // The index of processing rows the store kept until it was found to cost every
        // commit (MySQL has no partial index).
        db.exec(format!(
            "CREATE INDEX {STORE_TABLE}_stuck_idx ON {STORE_TABLE} (claimed_at) \
             WHERE state = 'processing'"
        ))
        .await;
    }
    db.fill(STORE_TABLE, "dup-", 0, DUP_KEYS, 60).await;
    db.fill(SEED_TABLE, "dup-", 0, DUP_KEYS, 60).await;
}

/// Throughput of `sides`, new events and duplicates, at each concurrency (see [`compare`]),
/// as `label` in the summary.
fn throughput(c: &mut Criterion, rt: &Runtime, label: &str, sides: &[Side], report: &mut Report) {
    report.compared.push((
        label.to_owned(),
        sides.iter().map(|s| (s.name, s.baseline)).collect(),
    ));
    let mut group = group_config(c, label);
    for path in ["new", "duplicate"] {
        for concurrency in CONCURRENCY {
            compare(&mut group, rt, label, path, concurrency, sides);
        }
    }
    group.finish();
}

/// The bench `label/path/c{concurrency}`: each criterion iteration is one delivery through
/// every side, the sides in turn (see [`alternate`]); each side's time is recorded for the
/// summary.
fn compare(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    label: &str,
    path: &str,
    concurrency: usize,
    sides: &[Side],
) {
    let id = format!("{path}/c{concurrency}");
    let full = format!("{label}/{id}");
    let turn = AtomicUsize::new(0);
    group.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            let driven = alternate(rt, sides, path, concurrency, iters, &turn, false);
            for (side, driven) in sides.iter().zip(&driven) {
                record(&format!("{full}/{}", side.name), driven.took, iters);
            }
            driven.iter().map(|d| d.took).sum()
        })
    });
}

/// Each side's answer times, p50 and p99, over [`fixed_count`] deliveries of each path at each
/// concurrency, the sides in turn as in [`compare`].
fn answer_times(rt: &Runtime, label: &str, sides: &[Side], report: &mut Report) {
    let turn = AtomicUsize::new(0);
    for path in ["new", "duplicate"] {
        for concurrency in CONCURRENCY {
            let driven = alternate(rt, sides, path, concurrency, fixed_count(), &turn, true);
            for (side, mut driven) in sides.iter().zip(driven) {
                driven.each.sort();
                let at = |q: f64| {
                    let i = ((driven.each.len() as f64 - 1.0) * q).round() as usize;
                    driven.each.get(i).copied().unwrap_or_default()
                };
                report.answers.insert(
                    format!("{label}/{path}/c{concurrency}/{}", side.name),
                    (at(0.5), at(0.99)),
                );
            }
        }
    }
}

/// One SQL pool's rows: throughput, and on the pool of record the answer times. Answers the
/// store, for the counts at the end of the run.
fn sql_pool<St: BenchStore>(
    c: &mut Criterion,
    rt: &Runtime,
    db: &Db,
    label: &str,
    of_record: bool,
    report: &mut Report,
) -> St {
    let store = St::open(db, STORE_TABLE);
    rt.block_on(prepare(db, &store));
    let sides = sql_sides(db, &store);
    throughput(c, rt, label, &sides, report);
    if of_record {
        answer_times(rt, label, &sides, report);
    }
    store
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
                    let keys: Keys = if path == "new" {
                        new_keys()
                    } else {
                        Arc::new(move |i| format!("g-{}", splitmix(i) % size))
                    };
                    let elapsed = rt
                        .block_on(drive(layered(store.clone()), 1, iters, keys, false))
                        .took;
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

/// What the run measured beyond criterion's samples, for the summaries.
#[derive(Default)]
struct Report {
    /// Each compared pool, in the order run.
    compared: Vec<Compared>,
    /// Answer times, p50 and p99, by `label/path/c{concurrency}/side`.
    answers: BTreeMap<String, (Duration, Duration)>,
    /// Per delivery, counted on each SQL pool of record.
    counts: Vec<(String, Kind, Vec<counts::Row>)>,
}

/// The counts of a pool, to run once the timed parts are over.
type Counting = Box<dyn FnOnce(&Runtime, &mut Report)>;

fn count_later<St: BenchStore>(label: &'static str, db: Db, store: St) -> Counting {
    Box::new(move |rt, report| {
        let sides = sql_sides(&db, &store);
        let rows = counts::count(rt, &db, &sides);
        report.counts.push((label.to_owned(), db.kind(), rows));
    })
}

fn main() {
    let full = !quick();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = Criterion::default().configure_from_args();
    let mut report = Report::default();
    let mut counting: Vec<Counting> = Vec::new();
    let mut purges: Vec<(&str, Vec<Duration>)> = Vec::new();
    let mut reachable = Vec::new();
    for kind in [Kind::Postgres, Kind::Sqlite, Kind::MySql] {
        if !only(kind.name()) {
            continue;
        }
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
                let store: PostgresStore =
                    sql_pool(&mut c, &rt, &db, "postgres", true, &mut report);
                counting.push(count_later("postgres", db, store));
                growth::<PostgresStore>(&mut c, &rt, &growth_db, full)
            }
            Kind::Sqlite => {
                let _: SqliteStore = sql_pool(&mut c, &rt, &db, "sqlite", false, &mut report);
                // SQLite has one writer at a time: a pool of one connection queues writers in
                // the application instead of in SQLite's busy handler (which sleeps).
                let single = rt.block_on(kind.connect(1, true)).expect("sqlite pool");
                let store: SqliteStore =
                    sql_pool(&mut c, &rt, &single, "sqlite-1conn", true, &mut report);
                counting.push(count_later("sqlite-1conn", single, store));
                growth::<SqliteStore>(&mut c, &rt, &growth_db, full)
            }
            Kind::MySql => {
                let store: MySqlStore = sql_pool(&mut c, &rt, &db, "mariadb", true, &mut report);
                counting.push(count_later("mariadb", db, store));
                growth::<MySqlStore>(&mut c, &rt, &growth_db, full)
            }
        };
        purges.push((kind.name(), times));
    }
    if only("redis")
        && let Some(redis) = rt.block_on(redis::connect())
    {
        redis::throughput(&mut c, &rt, &redis, &mut report);
    }
    c.final_summary();

    // Counts last: the counting subscriber stays installed for the rest of the run, and a
    // subscriber makes sqlx format every statement it runs.
    tracing::subscriber::set_global_default(counts::StatementCounter).expect("subscriber");
    for count in counting {
        count(&rt, &mut report);
    }
    let redis_counts = if only("redis") {
        rt.block_on(redis::round_trips())
    } else {
        None
    };

    summary(&report, &reachable, &purges);
    if let Some(counts) = redis_counts {
        println!(
            "\nSUMMARY stores: Redis requests per delivery (counted at a proxy, one delivery at a time)"
        );
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

/// Per sample, `base`'s time over `side`'s time: `side`'s throughput relative to `base`'s,
/// measured alongside it. The median over the samples.
fn paired_ratio(id: &str, base: &str, side: &str) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let base = samples.get(&format!("{id}/{base}"))?;
    let side = samples.get(&format!("{id}/{side}"))?;
    let n = base.len().min(side.len()).min(SAMPLE_SIZE);
    let mut ratios: Vec<f64> = base[base.len() - n..]
        .iter()
        .zip(&side[side.len() - n..])
        .map(|(b, s)| b / s)
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios.get(ratios.len() / 2).copied()
}

/// A compared pool's label and its sides (name, whether a baseline).
type Compared = (String, Vec<(&'static str, bool)>);

/// The compared pools, in runs of the same sides: one table each.
fn tables(compared: &[Compared]) -> Vec<&[Compared]> {
    let mut out = Vec::new();
    let mut from = 0;
    for at in 1..=compared.len() {
        if at == compared.len() || compared[at].1 != compared[from].1 {
            out.push(&compared[from..at]);
            from = at;
        }
    }
    out
}

fn summary(report: &Report, reachable: &[Kind], purges: &[(&str, Vec<Duration>)]) {
    let us = |ns: f64| format!("{:.0}", ns / 1000.0);
    for table in tables(&report.compared) {
        let sides = &table[0].1;
        // Each side that is no baseline, over each baseline, in the sides' order.
        let ratios: Vec<(&str, &str)> = sides
            .iter()
            .filter(|(_, baseline)| !baseline)
            .flat_map(|(side, _)| {
                sides
                    .iter()
                    .filter(|(_, baseline)| *baseline)
                    .map(move |(base, _)| (*side, *base))
            })
            .collect();
        println!(
            "\nSUMMARY stores: throughput, every side on the same pool, in turn ({POOL_SIZE} connections unless named 1conn; redis: one multiplexed connection each); µs per delivery, and throughput ratios (median of the per-sample ratios)"
        );
        let mut head = "| pool | path | concurrency |".to_owned();
        let mut rule = "|---|---|---:|".to_owned();
        for (side, _) in sides {
            head += &format!(" {side} µs |");
            rule += "---:|";
        }
        for (side, base) in &ratios {
            head += &format!(" {side} ÷ {base} |");
            rule += "---:|";
        }
        println!("{head}\n{rule}");
        for (label, _) in table {
            for path in ["new", "duplicate"] {
                for concurrency in CONCURRENCY {
                    let id = format!("{label}/{path}/c{concurrency}");
                    let times: Option<Vec<f64>> = sides
                        .iter()
                        .map(|(side, _)| median(&format!("{id}/{side}")))
                        .collect();
                    let shares: Option<Vec<f64>> = ratios
                        .iter()
                        .map(|(side, base)| paired_ratio(&id, base, side))
                        .collect();
                    let (Some(times), Some(shares)) = (times, shares) else {
                        continue;
                    };
                    let mut line = format!("| {label} | {path} | {concurrency} |");
                    for t in times {
                        line += &format!(" {} |", us(t));
                    }
                    for r in shares {
                        line += &format!(" {r:.2} |");
                    }
                    println!("{line}");
                }
            }
        }
    }

    for table in tables(&report.compared) {
        let sides = &table[0].1;
        let rows: Vec<String> = table
            .iter()
            .flat_map(|(label, _)| {
                ["new", "duplicate"].into_iter().flat_map(move |path| {
                    CONCURRENCY.into_iter().filter_map(move |concurrency| {
                        let id = format!("{label}/{path}/c{concurrency}");
                        let mut line = format!("| {label} | {path} | {concurrency} |");
                        for (side, _) in sides {
                            let (p50, p99) = report.answers.get(&format!("{id}/{side}"))?;
                            line += &format!(
                                " {:.0} | {:.0} |",
                                p50.as_secs_f64() * 1e6,
                                p99.as_secs_f64() * 1e6
                            );
                        }
                        Some(line)
                    })
                })
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        println!(
            "\nSUMMARY stores: answer time of one delivery, µs ({} deliveries per side at each concurrency, the sides in turn)",
            fixed_count()
        );
        let mut head = "| pool | path | concurrency |".to_owned();
        let mut rule = "|---|---|---:|".to_owned();
        for (side, _) in sides {
            head += &format!(" {side} p50 | {side} p99 |");
            rule += "---:|---:|";
        }
        println!("{head}\n{rule}");
        for row in rows {
            println!("{row}");
        }
    }

    for (label, kind, rows) in &report.counts {
        println!(
            "\nSUMMARY stores: per delivery on {label}, from the counters ({} deliveries per side, each side alone)",
            fixed_count()
        );
        counts::table(*kind, rows);
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
}
