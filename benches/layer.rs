//! What the layer adds to a request, with the in-process `MemoryStore`.
//!
//! Each case runs the same prebuilt requests through a bare `service_fn` and through the
//! layer around that same `service_fn`, on a current-thread tokio runtime; the difference of
//! the medians is what the layer adds per request. Requests are built outside the timed loop.
//! After the timings, allocations per request are counted for every case.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-bench cargo bench --bench layer
//! ```

use std::alloc::System;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode};
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::runtime::Runtime;
use tower::{Layer, Service, service_fn};
use tower_idempotency::store::{MemoryStore, Store};
use tower_idempotency::{IdempotencyLayer, key};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Requests built, then run, this many at a time: bounds the memory of prebuilt requests
/// and lets the new-event case empty the store between chunks, outside the timed loop.
const CHUNK: u64 = 1024;
/// Size of the JSON body of the `key::stripe()` cases.
const STRIPE_BODY_LEN: usize = 4096;
const SAMPLE_SIZE: usize = 60;

type Req = Request<Full<Bytes>>;

/// The inner service: does nothing, answers 200.
async fn handler<B>(_req: Request<B>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

/// Per-sample times (ns per request) of every case, for the summary.
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());
static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique_id() -> String {
    format!("evt_{:016x}", UNIQUE.fetch_add(1, Ordering::Relaxed))
}

/// A request whose key is in the `x-event-id` header; a small JSON body.
fn header_request(id: &str) -> Req {
    Request::post("/webhooks/acme")
        .header("x-event-id", id)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"type":"ping"}"#)))
        .expect("request")
}

/// A Stripe-like event of exactly `STRIPE_BODY_LEN` bytes whose `/id` is `id`.
fn stripe_request(id: &str) -> Req {
    let head = format!(
        r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":1718000000,"type":"charge.succeeded","livemode":false,"pending_webhooks":1,"request":{{"id":null,"idempotency_key":null}},"data":{{"object":{{"id":"ch_3PQ","object":"charge","amount":2000,"currency":"usd","paid":true,"metadata":{{"order":"6735"}},"description":""#
    );
    let tail = r#""}}}"#;
    let pad = STRIPE_BODY_LEN - head.len() - tail.len();
    let mut body = head;
    body.extend(std::iter::repeat_n('x', pad));
    body.push_str(tail);
    debug_assert_eq!(body.len(), STRIPE_BODY_LEN);
    Request::post("/webhooks/stripe")
        .header("content-type", "application/json")
        .header("content-length", STRIPE_BODY_LEN)
        .header(
            "stripe-signature",
            "t=1718000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd",
        )
        .body(Full::new(Bytes::from(body)))
        .expect("request")
}

/// Calls `svc` once with `req`; checks the answer is 200.
async fn deliver<S, B>(svc: &mut S, req: Req)
where
    S: Service<Req, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| svc.poll_ready(cx))
        .await
        .expect("ready");
    let res = svc.call(req).await.expect("call");
    assert_eq!(res.status(), StatusCode::OK);
    black_box(res);
}

/// One bench case: a service, how to make its requests, and what to do between chunks.
struct Case<S> {
    name: &'static str,
    svc: S,
    request: fn(&str) -> Req,
    /// `Some(id)`: every request carries this id (a duplicate); `None`: a new id each time.
    fixed_id: Option<String>,
    store: Option<MemoryStore>,
}

impl<S, B> Case<S>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    fn requests(&self, n: u64) -> Vec<Req> {
        (0..n)
            .map(|_| match &self.fixed_id {
                Some(id) => (self.request)(id),
                None => (self.request)(&unique_id()),
            })
            .collect()
    }

    /// Empties the store of done rows (new-event cases), so that the map stays small.
    fn reset(&self, rt: &Runtime) {
        if let (Some(store), None) = (&self.store, &self.fixed_id) {
            rt.block_on(store.purge_completed(Duration::ZERO))
                .expect("purge");
        }
    }

    /// Runs `iters` requests, building them untimed, and answers the time spent in the layer.
    fn run(&mut self, rt: &Runtime, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(CHUNK);
            left -= n;
            self.reset(rt);
            let requests = self.requests(n);
            total += rt.block_on(async {
                let start = Instant::now();
                for req in requests {
                    deliver(&mut self.svc, req).await;
                }
                start.elapsed()
            });
        }
        total
    }

    /// Allocations (allocs + reallocs) and bytes per request, over `n` requests.
    fn allocations(&mut self, rt: &Runtime, n: u64) -> (f64, f64) {
        // Warm up: first-time initialisation (thread locals, tracing callsites) is not per
        // request.
        self.run(rt, 64);
        self.reset(rt);
        let requests = self.requests(n);
        let region = Region::new(GLOBAL);
        rt.block_on(async {
            for req in requests {
                deliver(&mut self.svc, req).await;
            }
        });
        let change = region.change();
        let allocs = (change.allocations + change.reallocations) as f64 / n as f64;
        let bytes = change.bytes_allocated as f64 / n as f64;
        (allocs, bytes)
    }
}

/// Bench `layered` against `bare`, alternating chunks of requests between the two so that
/// both meet the same load from the rest of the machine. A criterion iteration is one bare
/// request plus one layered request; each side's time is recorded for the summary.
fn bench_pair<S1, B1, S2, B2>(
    c: &mut Criterion,
    rt: &Runtime,
    bare: &mut Case<S1>,
    layered: &mut Case<S2>,
) where
    S1: Service<Req, Response = Response<B1>>,
    S1::Error: std::fmt::Debug,
    S2: Service<Req, Response = Response<B2>>,
    S2::Error: std::fmt::Debug,
{
    let mut group = c.benchmark_group("layer");
    group
        .sample_size(SAMPLE_SIZE)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    let bare_id = format!("{}/bare", layered.name);
    group.bench_function(layered.name, |b| {
        b.iter_custom(|iters| {
            let (mut t_bare, mut t_layer) = (Duration::ZERO, Duration::ZERO);
            let mut left = iters;
            let mut layer_first = false;
            while left > 0 {
                let n = left.min(CHUNK);
                left -= n;
                if layer_first {
                    t_layer += layered.run(rt, n);
                }
                t_bare += bare.run(rt, n);
                if !layer_first {
                    t_layer += layered.run(rt, n);
                }
                layer_first = !layer_first;
            }
            record(&bare_id, t_bare, iters);
            record(layered.name, t_layer, iters);
            t_bare + t_layer
        })
    });
    group.finish();
}

fn record(name: &str, elapsed: Duration, iters: u64) {
    SAMPLES
        .lock()
        .unwrap()
        .entry(name.to_owned())
        .or_default()
        .push(elapsed.as_nanos() as f64 / iters as f64);
}

/// The median over criterion's measurement samples (the last `SAMPLE_SIZE` runs; earlier
/// ones are its warm-up) of `f(sample)`.
fn median_of(name: &str, f: impl Fn(usize, &[f64]) -> f64) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let all = samples.get(name)?;
    let first = all.len().saturating_sub(SAMPLE_SIZE);
    let mut values: Vec<f64> = (first..all.len()).map(|i| f(i, all)).collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let header_key = || key::header("x-event-id").namespace("acme");
    let layered = |store: &MemoryStore| IdempotencyLayer::new(store.clone()).key(header_key());
    let stripe = |store: &MemoryStore| IdempotencyLayer::new(store.clone()).key(key::stripe());

    let header_new_store = MemoryStore::new();
    let header_dup_store = MemoryStore::new();
    let stripe_new_store = MemoryStore::new();
    let stripe_dup_store = MemoryStore::new();

    let mut header_bare = Case {
        name: "header/bare",
        svc: service_fn(handler::<Full<Bytes>>),
        request: header_request,
        fixed_id: None,
        store: None,
    };
    let mut header_new = Case {
        name: "header/new",
        svc: layered(&header_new_store).layer(service_fn(handler)),
        request: header_request,
        fixed_id: None,
        store: Some(header_new_store),
    };
    let mut header_dup = Case {
        name: "header/duplicate",
        svc: layered(&header_dup_store).layer(service_fn(handler)),
        request: header_request,
        fixed_id: Some("evt_duplicate".to_owned()),
        store: Some(header_dup_store),
    };
    let mut stripe_bare = Case {
        name: "stripe-4KiB/bare",
        svc: service_fn(handler::<Full<Bytes>>),
        request: stripe_request,
        fixed_id: None,
        store: None,
    };
    let mut stripe_new = Case {
        name: "stripe-4KiB/new",
        svc: stripe(&stripe_new_store).layer(service_fn(handler)),
        request: stripe_request,
        fixed_id: None,
        store: Some(stripe_new_store),
    };
    let mut stripe_dup = Case {
        name: "stripe-4KiB/duplicate",
        svc: stripe(&stripe_dup_store).layer(service_fn(handler)),
        request: stripe_request,
        fixed_id: Some("evt_duplicate".to_owned()),
        store: Some(stripe_dup_store),
    };
    // The duplicate cases meet a key processed once already.
    header_dup.run(&rt, 1);
    stripe_dup.run(&rt, 1);

    // `LAYER_PROFILE=<case>`: run `LAYER_PROFILE_N` requests of one case and stop, for an
    // instruction count under `valgrind --tool=callgrind` (independent of the machine's load).
    if let Ok(case) = std::env::var("LAYER_PROFILE") {
        let n = std::env::var("LAYER_PROFILE_N").map_or(2000, |n| n.parse().expect("a number"));
        match case.as_str() {
            "header/bare" => header_bare.run(&rt, n),
            "header/new" => header_new.run(&rt, n),
            "header/duplicate" => header_dup.run(&rt, n),
            "stripe-4KiB/bare" => stripe_bare.run(&rt, n),
            "stripe-4KiB/new" => stripe_new.run(&rt, n),
            "stripe-4KiB/duplicate" => stripe_dup.run(&rt, n),
            other => panic!("unknown case {other}"),
        };
        return;
    }

    let mut c = Criterion::default().configure_from_args();
    bench_pair(&mut c, &rt, &mut header_bare, &mut header_new);
    bench_pair(&mut c, &rt, &mut header_bare, &mut header_dup);
    bench_pair(&mut c, &rt, &mut stripe_bare, &mut stripe_new);
    bench_pair(&mut c, &rt, &mut stripe_bare, &mut stripe_dup);
    c.final_summary();

    const N: u64 = 10_000;
    let table = [
        ("header/bare", header_bare.allocations(&rt, N)),
        ("header/new", header_new.allocations(&rt, N)),
        ("header/duplicate", header_dup.allocations(&rt, N)),
        ("stripe-4KiB/bare", stripe_bare.allocations(&rt, N)),
        ("stripe-4KiB/new", stripe_new.allocations(&rt, N)),
        ("stripe-4KiB/duplicate", stripe_dup.allocations(&rt, N)),
    ];

    println!("\nSUMMARY layer (MemoryStore, current-thread runtime, no tracing subscriber)");
    println!(
        "| case | bare ns/request | layer ns/request | added ns (median of paired samples) | added ns (fastest samples) | layer / bare time | allocations/request (bare) | added allocations | bytes allocated/request |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, (allocs, bytes)) in &table[..] {
        if name.ends_with("/bare") {
            continue;
        }
        let bare = format!("{name}/bare");
        let bare_allocs = if name.starts_with("header") {
            allocs_of(&table, "header/bare")
        } else {
            allocs_of(&table, "stripe-4KiB/bare")
        };
        let layer = median_of(name, |i, all| all[i]);
        let base = median_of(&bare, |i, all| all[i]);
        let paired = |f: fn(f64, f64) -> f64| {
            let samples = SAMPLES.lock().unwrap();
            let l = samples.get(*name)?.clone();
            let b = samples.get(&bare)?.clone();
            drop(samples);
            let n = l.len().min(b.len()).min(SAMPLE_SIZE);
            let mut v: Vec<f64> = l[l.len() - n..]
                .iter()
                .zip(&b[b.len() - n..])
                .map(|(l, b)| f(*l, *b))
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let fastest = |id: &str| {
            let samples = SAMPLES.lock().unwrap();
            let all = samples.get(id)?;
            all[all.len().saturating_sub(SAMPLE_SIZE)..]
                .iter()
                .copied()
                .min_by(f64::total_cmp)
        };
        let best = fastest(name).zip(fastest(&bare)).map(|(l, b)| l - b);
        let fmt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
        println!(
            "| {name} | {} | {} | {} | {} | {} | {bare_allocs:.1} | {:+.1} | {bytes:.0} |",
            fmt(base, 0),
            fmt(layer, 0),
            fmt(paired(|l, b| l - b), 0),
            fmt(best, 0),
            fmt(paired(|l, b| l / b), 2),
            allocs - bare_allocs,
        );
    }
}

fn allocs_of(table: &[(&str, (f64, f64))], wanted: &str) -> f64 {
    table
        .iter()
        .find(|(name, _)| *name == wanted)
        .map_or(0.0, |(_, (a, _))| *a)
}
