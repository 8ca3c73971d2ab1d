//! Inbox mode against what it replaces, side by side in one run.
//!
//! 1. **Ingest**: deliveries of fresh keys through an axum `Router` (no socket) on a 2-worker
//!    runtime, at 1, 16 and 64 concurrent senders: the inbox layer (store the delivery, answer
//!    202) against the inline layer with a handler that does nothing, on the same store.
//!    Throughput ratio and each side's p50/p99 answer time; on SQLite and PostgreSQL also with
//!    the store's group commit off (`max_batch(1)`, shown as `-1by1`), the before of it.
//! 2. **End to end**: 2,000 events sent through the router (16 at a time) with workers
//!    running (64 entries at once, taken 16 at a time), timed until every handler (doing nothing) has run: the inbox
//!    against a hand-written queue on the same database (an axum handler that inserts the
//!    event, then 16 worker tasks looping over `SELECT … FOR UPDATE SKIP LOCKED LIMIT 16`,
//!    the handler, `UPDATE … SET state = 'done'` in one transaction; on SQLite, which has no
//!    row locks, one worker and `BEGIN IMMEDIATE`). Both are woken in-process when an event is
//!    stored.
//! 3. **Time to start**: one event at a time into idle workers; the time from the send to
//!    the handler's start, p50/p99.
//!
//! On memory, SQLite (a file in the temp directory, WAL, durable commits) and PostgreSQL
//! (`POSTGRES_URL`, default the local server; unreachable prints `SKIPPED`). Each part has an
//! inbox of its own, emptied before it runs (tables `bench_ingest`, `bench_e2e`, `bench_start`,
//! each with its `_inbox`), so that no part's workers meet another part's entries; and
//! `bench_queue` for the hand-written queue.
//!
//! ```sh
//! cargo bench --all-features --bench inbox
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use criterion::Criterion;
use http::{Request, StatusCode};
use sqlx::{PgPool, SqlitePool};
use tokio::runtime::Runtime;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::inbox::Inbox;
use tower_idempotency::store::inbox::{InboxStore, Settlement, Take};
use tower_idempotency::store::{MemoryStore, PostgresStore, SqliteStore, Store};
use tower_idempotency::{IdempotencyLayer, Stale, key};

const CONCURRENCY: [usize; 3] = [1, 16, 64];
const EVENTS: usize = 2000;
const STARTS: usize = 200;

static NEXT: AtomicU64 = AtomicU64::new(0);

fn fresh() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn delivery(id: &str) -> Request<Body> {
    Request::post("/hooks")
        .header("x-event-id", id)
        .body(Body::from("{}"))
        .unwrap()
}

/// Sends `n` fresh deliveries through `app`, `concurrency` at a time; the answer times.
async fn send(app: &Router, n: usize, concurrency: usize) -> Vec<Duration> {
    let times = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let left = Arc::new(AtomicUsize::new(n));
    let senders: Vec<_> = (0..concurrency.min(n))
        .map(|_| {
            let (app, times, left) = (app.clone(), times.clone(), left.clone());
            tokio::spawn(async move {
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                    .is_ok()
                {
                    let started = Instant::now();
                    let res = app.clone().oneshot(delivery(&fresh())).await.unwrap();
                    assert!(res.status().is_success(), "{}", res.status());
                    times.lock().unwrap().push(started.elapsed());
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    Arc::try_unwrap(times).unwrap().into_inner().unwrap()
}

fn percentile(times: &mut [Duration], p: f64) -> Duration {
    times.sort();
    times[((times.len() as f64 * p) as usize).min(times.len() - 1)]
}

/// What one store's part measured, for the summary.
#[derive(Default)]
struct Report {
    /// Concurrency, throughput ratio, inline p50/p99, inbox p50/p99, inbox µs per delivery.
    ingest: Vec<(usize, f64, Duration, Duration, Duration, Duration, f64)>,
    end_to_end: Option<(f64, f64)>,
    start: Option<(Duration, Duration)>,
}

fn ingest<St: InboxStore + Store + Clone>(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    store: St,
    report: &mut Report,
) {
    let inbox = Inbox::new(store.clone());
    let inbox_app = Router::new().route(
        "/hooks",
        post(|| async { StatusCode::NO_CONTENT })
            .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let inline_app = Router::new().route(
        "/hooks",
        post(|| async { StatusCode::NO_CONTENT })
            .layer(IdempotencyLayer::new(store).key(key::header("x-event-id"))),
    );
    for concurrency in CONCURRENCY {
        let mut group = c.benchmark_group(format!("inbox/{name}/ingest/c{concurrency}"));
        group.sample_size(10);
        let timed = Arc::new(Mutex::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())));
        for (side, app) in [("inline", &inline_app), ("inbox", &inbox_app)] {
            let timed = timed.clone();
            group.bench_function(side, |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    let times = rt.block_on(send(app, iters as usize, concurrency));
                    let took = started.elapsed();
                    let mut guard = timed.lock().unwrap();
                    let timed = &mut *guard;
                    let (spans, lat) = if side == "inline" {
                        (&mut timed.0, &mut timed.1)
                    } else {
                        (&mut timed.2, &mut timed.3)
                    };
                    spans.push(took.as_secs_f64() / iters as f64);
                    lat.extend(times);
                    took
                });
            });
        }
        group.finish();
        let mut guard = timed.lock().unwrap();
        let timed = &mut *guard;
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let inbox_each = median(&mut timed.2);
        let ratio = median(&mut timed.0) / inbox_each;
        let (p50_inline, p99_inline) = (
            percentile(&mut timed.1, 0.5),
            percentile(&mut timed.1, 0.99),
        );
        let (p50, p99) = (
            percentile(&mut timed.3, 0.5),
            percentile(&mut timed.3, 0.99),
        );
        report.ingest.push((
            concurrency,
            ratio,
            p50_inline,
            p99_inline,
            p50,
            p99,
            inbox_each * 1e6,
        ));
    }
}

/// The inbox end to end: events per second from the first send to the last handler's run.
fn inbox_end_to_end<St: InboxStore + Clone>(rt: &Runtime, store: St) -> f64 {
    rt.block_on(async {
        let inbox = Inbox::new(store);
        let ran = Arc::new(AtomicUsize::new(0));
        let counted = ran.clone();
        let app = Router::new().route(
            "/hooks",
            post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::NO_CONTENT }
            })
            .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
        );
        let workers = inbox.workers(app.clone()).concurrency(64).batch(16).spawn();
        let started = Instant::now();
        send(&app, EVENTS, 16).await;
        while ran.load(Ordering::SeqCst) < EVENTS {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rate = EVENTS as f64 / started.elapsed().as_secs_f64();
        workers.stop().await;
        rate
    })
}

/// Time from the send to the handler's start, one event at a time into idle workers.
fn time_to_start<St: InboxStore + Clone>(rt: &Runtime, store: St) -> (Duration, Duration) {
    rt.block_on(async {
        let inbox = Inbox::new(store);
        let started = Arc::new(tokio::sync::Mutex::new(None::<Instant>));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let app = Router::new().route(
            "/hooks",
            post(move || {
                let _ = tx.send(Instant::now());
                async { StatusCode::NO_CONTENT }
            })
            .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
        );
        let workers = inbox.workers(app.clone()).spawn();
        let mut times = Vec::with_capacity(STARTS);
        for _ in 0..STARTS {
            tokio::time::sleep(Duration::from_millis(5)).await; // idle
            let sent = Instant::now();
            *started.lock().await = Some(sent);
            app.clone().oneshot(delivery(&fresh())).await.unwrap();
            let ran = rx.recv().await.unwrap();
            times.push(ran.duration_since(sent));
        }
        workers.stop().await;
        (percentile(&mut times, 0.5), percentile(&mut times, 0.99))
    })
}

/// The hand-written queue on PostgreSQL: its rate, as [`inbox_end_to_end`] measures it.
fn postgres_queue(rt: &Runtime, pool: PgPool) -> f64 {
    rt.block_on(async {
        sqlx::query("DROP TABLE IF EXISTS bench_queue")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE bench_queue (id TEXT PRIMARY KEY, payload BYTEA NOT NULL, \
             state TEXT NOT NULL DEFAULT 'queued', created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "CREATE INDEX bench_queue_due ON bench_queue (created_at) WHERE state = 'queued'",
        )
        .execute(&pool)
        .await
        .unwrap();
        let wake = Arc::new(Notify::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route(
                "/hooks",
                post(
                    |State((pool, wake)): State<(PgPool, Arc<Notify>)>,
                     headers: http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        let id = headers["x-event-id"].to_str().unwrap().to_owned();
                        sqlx::query(
                            "INSERT INTO bench_queue (id, payload) VALUES ($1, $2) \
                             ON CONFLICT DO NOTHING",
                        )
                        .bind(id)
                        .bind(&body[..])
                        .execute(&pool)
                        .await
                        .unwrap();
                        wake.notify_waiters();
                        StatusCode::ACCEPTED
                    },
                ),
            )
            .with_state((pool.clone(), wake.clone()));
        let workers: Vec<_> = (0..16)
            .map(|_| {
                let (pool, wake, ran) = (pool.clone(), wake.clone(), ran.clone());
                tokio::spawn(async move {
                    while ran.load(Ordering::SeqCst) < EVENTS {
                        let woken = wake.notified();
                        tokio::pin!(woken);
                        woken.as_mut().enable();
                        let mut tx = pool.begin().await.unwrap();
                        let ids: Vec<(String, Vec<u8>)> = sqlx::query_as(
                            "SELECT id, payload FROM bench_queue WHERE state = 'queued' \
                             ORDER BY created_at LIMIT 16 FOR UPDATE SKIP LOCKED",
                        )
                        .fetch_all(&mut *tx)
                        .await
                        .unwrap();
                        if ids.is_empty() {
                            tx.commit().await.unwrap();
                            tokio::select! {
                                () = &mut woken => {}
                                () = tokio::time::sleep(Duration::from_millis(20)) => {}
                            }
                            continue;
                        }
                        let ids: Vec<String> = ids.into_iter().map(|(id, _)| id).collect();
                        ran.fetch_add(ids.len(), Ordering::SeqCst); // the handler: nothing
                        sqlx::query("UPDATE bench_queue SET state = 'done' WHERE id = ANY($1)")
                            .bind(&ids)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                })
            })
            .collect();
        let started = Instant::now();
        send(&app, EVENTS, 16).await;
        while ran.load(Ordering::SeqCst) < EVENTS {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rate = EVENTS as f64 / started.elapsed().as_secs_f64();
        for worker in workers {
            worker.await.unwrap();
        }
        rate
    })
}

/// The hand-written queue on SQLite: one worker, `BEGIN IMMEDIATE`.
fn sqlite_queue(rt: &Runtime, pool: SqlitePool) -> f64 {
    rt.block_on(async {
        sqlx::query("DROP TABLE IF EXISTS bench_queue")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE bench_queue (id TEXT PRIMARY KEY, payload BLOB NOT NULL, \
             state TEXT NOT NULL DEFAULT 'queued', seq INTEGER)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("CREATE INDEX bench_queue_due ON bench_queue (state, seq)")
            .execute(&pool)
            .await
            .unwrap();
        let wake = Arc::new(Notify::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route(
                "/hooks",
                post(
                    |State((pool, wake)): State<(SqlitePool, Arc<Notify>)>,
                     headers: http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        let id = headers["x-event-id"].to_str().unwrap().to_owned();
                        sqlx::query(
                            "INSERT INTO bench_queue (id, payload, seq) VALUES (?1, ?2, \
                             (SELECT COALESCE(MAX(seq), 0) + 1 FROM bench_queue)) \
                             ON CONFLICT DO NOTHING",
                        )
                        .bind(id)
                        .bind(&body[..])
                        .execute(&pool)
                        .await
                        .unwrap();
                        wake.notify_waiters();
                        StatusCode::ACCEPTED
                    },
                ),
            )
            .with_state((pool.clone(), wake.clone()));
        let worker = {
            let (pool, wake, ran) = (pool.clone(), wake.clone(), ran.clone());
            tokio::spawn(async move {
                while ran.load(Ordering::SeqCst) < EVENTS {
                    let woken = wake.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    let mut conn = pool.acquire().await.unwrap();
                    sqlx::query("BEGIN IMMEDIATE")
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                    let ids: Vec<(String,)> = sqlx::query_as(
                        "SELECT id FROM bench_queue WHERE state = 'queued' ORDER BY seq LIMIT 16",
                    )
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap();
                    for (id,) in &ids {
                        sqlx::query("UPDATE bench_queue SET state = 'done' WHERE id = ?1")
                            .bind(id)
                            .execute(&mut *conn)
                            .await
                            .unwrap();
                    }
                    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
                    ran.fetch_add(ids.len(), Ordering::SeqCst);
                    if ids.is_empty() {
                        tokio::select! {
                            () = &mut woken => {}
                            () = tokio::time::sleep(Duration::from_millis(20)) => {}
                        }
                    }
                }
            })
        };
        let started = Instant::now();
        send(&app, EVENTS, 16).await;
        while ran.load(Ordering::SeqCst) < EVENTS {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rate = EVENTS as f64 / started.elapsed().as_secs_f64();
        worker.await.unwrap();
        rate
    })
}

/// `store` migrated, its inbox emptied of an earlier run's entries.
async fn fresh_inbox<St: Store + InboxStore + Migrate>(store: St) -> St {
    store.migrate_inbox().await;
    let everything = Take {
        stale: Stale::reclaim_after(Duration::ZERO),
        max_attempts: u32::MAX,
        ..Take::up_to(10_000)
    };
    loop {
        let taken = store.take(&everything).await.unwrap();
        if taken.is_empty() {
            break;
        }
        for entry in taken {
            store
                .settle(&entry.lease, &Settlement::Done, &[])
                .await
                .unwrap();
        }
    }
    store
        .purge_inbox(Duration::ZERO, Duration::ZERO, 10_000_000)
        .await
        .unwrap();
    store
}

/// The stores' own `migrate`, named alike.
trait Migrate {
    async fn migrate_inbox(&self);
}

impl Migrate for SqliteStore {
    async fn migrate_inbox(&self) {
        self.migrate().await.unwrap();
    }
}

impl Migrate for PostgresStore {
    async fn migrate_inbox(&self) {
        self.migrate().await.unwrap();
    }
}

async fn sqlite_pool() -> SqlitePool {
    let path = std::env::temp_dir().join(format!("bench-inbox-{}.sqlite3", std::process::id()));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .unwrap()
}

async fn postgres_pool() -> Option<PgPool> {
    let url = std::env::var("POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .ok()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut reports: Vec<(&str, Report)> = Vec::new();

    // Before the ingest part, whose memory store frees millions of small allocations: each
    // runtime thread stalls once afterwards, for a second or more (the allocator, as far as
    // can be told), which would be measured here as a late start.
    let mut memory = Report {
        start: Some(time_to_start(&rt, MemoryStore::new())),
        ..Report::default()
    };
    ingest(&mut c, &rt, "memory", MemoryStore::new(), &mut memory);
    reports.push(("memory", memory));

    let mut sqlite = Report::default();
    let pool = rt.block_on(sqlite_pool());
    let table = |name: &str| {
        let store = SqliteStore::new(pool.clone())
            .with_table_name(name)
            .unwrap();
        rt.block_on(fresh_inbox(store))
    };
    ingest(&mut c, &rt, "sqlite", table("bench_ingest"), &mut sqlite);
    // The same with each write on its own: ingest before group commit.
    let mut unbatched = Report::default();
    let store = table("bench_ingest").max_batch(1);
    ingest(&mut c, &rt, "sqlite-1by1", store, &mut unbatched);
    reports.push(("sqlite-1by1", unbatched));
    let ours = inbox_end_to_end(&rt, table("bench_e2e"));
    let theirs = sqlite_queue(&rt, pool.clone());
    sqlite.end_to_end = Some((ours, theirs));
    sqlite.start = Some(time_to_start(&rt, table("bench_start")));
    reports.push(("sqlite", sqlite));

    match rt.block_on(postgres_pool()) {
        None => println!("SKIPPED: POSTGRES_URL unreachable"),
        Some(pool) => {
            let mut pg = Report::default();
            let table = |name: &str| {
                let store = PostgresStore::new(pool.clone())
                    .with_table_name(name)
                    .unwrap();
                rt.block_on(fresh_inbox(store))
            };
            ingest(&mut c, &rt, "postgres", table("bench_ingest"), &mut pg);
            let mut unbatched = Report::default();
            let store = table("bench_ingest").max_batch(1);
            ingest(&mut c, &rt, "postgres-1by1", store, &mut unbatched);
            reports.push(("postgres-1by1", unbatched));
            let ours = inbox_end_to_end(&rt, table("bench_e2e"));
            let theirs = postgres_queue(&rt, pool.clone());
            pg.end_to_end = Some((ours, theirs));
            pg.start = Some(time_to_start(&rt, table("bench_start")));
            reports.push(("postgres", pg));
        }
    }

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("\nSUMMARY inbox: ingest vs the inline layer (no-op handler), same store");
    println!(
        "(-1by1: the same store with max_batch(1), each write on its own, as before group commit)"
    );
    println!(
        "store          conc  throughput ratio (inbox/inline)  inbox µs/delivery  inline p50/p99 ms  inbox p50/p99 ms"
    );
    for (name, report) in &reports {
        for (conc, ratio, p50i, p99i, p50, p99, each) in &report.ingest {
            println!(
                "{name:<14} {conc:>4}  {ratio:>30.2}  {each:>17.0}  {:>8.2} / {:<7.2}  {:>7.2} / {:.2}",
                ms(*p50i),
                ms(*p99i),
                ms(*p50),
                ms(*p99)
            );
        }
    }
    println!(
        "\nSUMMARY inbox: end to end, {EVENTS} events (events/s; inbox vs hand-written queue)"
    );
    for (name, report) in &reports {
        if let Some((ours, theirs)) = report.end_to_end {
            println!(
                "{name:<9} inbox {ours:>8.0}  queue {theirs:>8.0}  ratio {:.2}",
                ours / theirs
            );
        }
    }
    println!("\nSUMMARY inbox: time from ingest to the handler's start, idle workers");
    for (name, report) in &reports {
        if let Some((p50, p99)) = report.start {
            println!("{name:<9} p50 {:.2} ms  p99 {:.2} ms", ms(p50), ms(p99));
        }
    }
    c.final_summary();
}
