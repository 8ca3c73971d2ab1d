//! What recording into the ledger costs the layer, as users run it: an axum `Router` with one
//! `post` route under `IdempotencyLayer` on PostgreSQL, on a 2-worker runtime, 64 deliveries
//! at once, each of a fresh key; and duplicates of done keys. Two sides over the same store
//! and pool: the layer alone, and the layer with `.ledger(&recorder)` recording into a
//! `PostgresLedger` beside it (its own pool). Each criterion sample runs the two sides in turn;
//! the summary gives each side's µs per delivery and the median of the per-sample ratios of
//! throughput (ledger on ÷ off).
//!
//! ```sh
//! cargo bench --features ledger,postgres,axum --bench ledger_layer
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use criterion::Criterion;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::ledger::{LedgerStore, PostgresLedger, Recorder};
use tower_idempotency::store::PostgresStore;
use tower_idempotency::{IdempotencyLayer, key};

const CONCURRENCY: usize = 64;

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn fresh() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn delivery(id: &str) -> Request<Body> {
    Request::post("/hooks")
        .header("x-event-id", id)
        .body(Body::from("{}"))
        .unwrap()
}

/// Sends `n` deliveries through `app`, 64 at a time: fresh keys, or keys drawn from `done`.
async fn send(app: &Router, n: usize, done: Option<Arc<Vec<String>>>) {
    let left = Arc::new(AtomicUsize::new(n));
    let senders: Vec<_> = (0..CONCURRENCY.min(n))
        .map(|_| {
            let (app, left, done) = (app.clone(), left.clone(), done.clone());
            tokio::spawn(async move {
                while let Ok(l) =
                    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                {
                    let id = match &done {
                        Some(done) => done[l % done.len()].clone(),
                        None => fresh(),
                    };
                    let res = app.clone().oneshot(delivery(&id)).await.unwrap();
                    assert!(res.status().is_success(), "{}", res.status());
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
}

fn app(store: PostgresStore, recorder: Option<&Recorder>) -> Router {
    let mut layer = IdempotencyLayer::new(store).key(key::header("x-event-id"));
    if let Some(recorder) = recorder {
        layer = layer.ledger(recorder);
    }
    Router::new().route(
        "/hooks",
        post(|| async { StatusCode::NO_CONTENT }).layer(layer),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = std::env::var("POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let Some((store, ledger)) = rt.block_on(connect(&url)) else {
        println!("SKIPPED: POSTGRES_URL unreachable");
        return;
    };
    // `BENCH_LEDGER=null`: records are made, handed over and encoded, and the store drops
    // them: what recording costs the process, without the database's share.
    let null = std::env::var("BENCH_LEDGER").is_ok_and(|v| v == "null");
    let recorder = rt.block_on(async {
        if null {
            Recorder::spawn(Null, "bench")
        } else {
            Recorder::spawn(ledger.clone(), "bench")
        }
    });
    let off = app(store.clone(), None);
    let on = app(store, Some(&recorder));
    let done: Arc<Vec<String>> = Arc::new((0..2000).map(|_| fresh()).collect());
    rt.block_on(async {
        for id in done.iter() {
            off.clone().oneshot(delivery(id)).await.unwrap();
        }
    });

    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    let mut summary = Vec::new();
    for (path, keys) in [("new", None), ("duplicate", Some(done.clone()))] {
        let ratios = Arc::new(Mutex::new(Vec::new()));
        let totals = Arc::new(Mutex::new((Duration::ZERO, Duration::ZERO, 0u64)));
        let (off, on, keys2) = (off.clone(), on.clone(), keys.clone());
        let (ratios2, totals2) = (ratios.clone(), totals.clone());
        criterion.bench_function(
            &format!("ledger_layer/postgres/{path}/c{CONCURRENCY}"),
            |b| {
                b.iter_custom(|iters| {
                    let n = (iters as usize).max(CONCURRENCY);
                    let started = Instant::now();
                    rt.block_on(send(&off, n, keys2.clone()));
                    let took_off = started.elapsed();
                    let started = Instant::now();
                    rt.block_on(send(&on, n, keys2.clone()));
                    let took_on = started.elapsed();
                    ratios2
                        .lock()
                        .unwrap()
                        .push(took_off.as_secs_f64() / took_on.as_secs_f64());
                    let mut totals = totals2.lock().unwrap();
                    totals.0 += took_off;
                    totals.1 += took_on;
                    totals.2 += n as u64;
                    took_on
                })
            },
        );
        let mut ratios = ratios.lock().unwrap().clone();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        let (off_total, on_total, n) = *totals.lock().unwrap();
        summary.push((
            path,
            off_total.as_secs_f64() * 1e6 / n as f64,
            on_total.as_secs_f64() * 1e6 / n as f64,
            median,
        ));
    }
    rt.block_on(recorder.flush());
    println!(
        "SUMMARY ledger_layer: postgres, {CONCURRENCY} at once, µs per delivery; ratio = \
         throughput with the ledger ÷ without (median of the per-sample ratios)"
    );
    println!("| path | ledger off µs | ledger on µs | on ÷ off |");
    println!("|---|---:|---:|---:|");
    for (path, off, on, ratio) in summary {
        println!("| {path} | {off:.1} | {on:.1} | {ratio:.2} |");
    }
    println!("records dropped: {}", recorder.dropped());
    criterion.final_summary();
}

/// A ledger that keeps nothing.
#[derive(Clone)]
struct Null;

impl LedgerStore for Null {
    async fn append(
        &self,
        records: &[tower_idempotency::ledger::Record],
    ) -> Result<(), tower_idempotency::store::StoreError> {
        for record in records {
            std::hint::black_box(record.encode());
        }
        Ok(())
    }
    async fn sequence(
        &self,
        _: usize,
    ) -> Result<Vec<tower_idempotency::ledger::Logged>, tower_idempotency::store::StoreError> {
        Ok(Vec::new())
    }
    async fn records(
        &self,
        _: u64,
        _: u64,
    ) -> Result<Vec<tower_idempotency::ledger::Logged>, tower_idempotency::store::StoreError> {
        Ok(Vec::new())
    }
    async fn timeline(
        &self,
        _: &tower_idempotency::IdempotencyKey,
    ) -> Result<Vec<tower_idempotency::ledger::Record>, tower_idempotency::store::StoreError> {
        Ok(Vec::new())
    }
    async fn save_checkpoint(
        &self,
        _: &tower_idempotency::ledger::StoredCheckpoint,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        Ok(())
    }
    async fn latest_checkpoint(
        &self,
    ) -> Result<
        Option<tower_idempotency::ledger::StoredCheckpoint>,
        tower_idempotency::store::StoreError,
    > {
        Ok(None)
    }
}

async fn connect(url: &str) -> Option<(PostgresStore, PostgresLedger)> {
    let pool = || {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
    };
    let store = PostgresStore::new(pool().await.ok()?)
        .with_table_name("bench_ledger_layer")
        .ok()?;
    store.migrate().await.ok()?;
    let ledger = PostgresLedger::new(pool().await.ok()?)
        .with_table_name("bench_ledger_layer")
        .ok()?;
    ledger.migrate().await.ok()?;
    let _ = ledger.latest_checkpoint().await.ok()?;
    Some((store, ledger))
}
