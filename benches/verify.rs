//! What verifying a signature adds to a delivery, with the in-process `MemoryStore`.
//!
//! Two layers over the same handler, both keyed by `key::stripe()` on a 4 KiB event: one
//! without verification, one with `verify::stripe(secret)`. New events, requests built
//! outside the timed loop; the two sides alternate chunk by chunk within every sample, and
//! the summary gives the median of the per-sample ratios.
//!
//! ```sh
//! cargo bench --features verify --bench verify
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::Criterion;
use hmac::{Hmac, KeyInit, Mac};
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use sha2::Sha256;
use tokio::runtime::Runtime;
use tower::{Layer, Service, service_fn};
use tower_idempotency::store::{MemoryStore, Store};
use tower_idempotency::{IdempotencyLayer, key, verify};

const CHUNK: usize = 512;
const BODY_LEN: usize = 4096;
const SECRET: &str = "whsec_bench_secret";

type Req = Request<Full<Bytes>>;

static UNIQUE: AtomicU64 = AtomicU64::new(0);
/// Per sample: (plain ns per delivery, verified ns per delivery).
static SAMPLES: Mutex<Vec<(f64, f64)>> = Mutex::new(Vec::new());

async fn handler<B>(_req: Request<B>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

/// A signed Stripe-like event of `BODY_LEN` bytes with a fresh id.
fn request() -> Req {
    let id = format!("evt_{:016x}", UNIQUE.fetch_add(1, Ordering::Relaxed));
    let head = format!(
        r#"{{"id":"{id}","object":"event","type":"charge.succeeded","data":{{"object":{{"description":""#
    );
    let tail = r#""}}}"#;
    let mut body = head;
    body.extend(std::iter::repeat_n('x', BODY_LEN - body.len() - tail.len()));
    body.push_str(tail);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body.as_bytes());
    let v1: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Request::post("/webhooks/stripe")
        .header("content-type", "application/json")
        .header("stripe-signature", format!("t={t},v1={v1}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Runs `chunk` through `svc`, timing only the calls.
fn run<S, B>(rt: &Runtime, svc: &mut S, chunk: Vec<Req>) -> Duration
where
    S: Service<Req, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = Instant::now();
        for req in chunk {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            let res = svc.call(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            black_box(res);
        }
        start.elapsed()
    })
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plain_store = MemoryStore::new();
    let verified_store = MemoryStore::new();
    let mut plain = IdempotencyLayer::new(plain_store.clone())
        .key(key::stripe())
        .layer(service_fn(handler::<_>));
    let mut verified = IdempotencyLayer::new(verified_store.clone())
        .key(key::stripe())
        .verify(verify::stripe(SECRET))
        .layer(service_fn(handler::<_>));

    let mut c = Criterion::default().sample_size(40).configure_from_args();
    c.bench_function("stripe-4KiB/new: verified and plain, alternating", |b| {
        b.iter_custom(|iters| {
            let (mut plain_time, mut verified_time) = (Duration::ZERO, Duration::ZERO);
            let mut left = iters as usize;
            while left > 0 {
                let n = left.min(CHUNK);
                left -= n;
                let chunk: Vec<_> = (0..n).map(|_| request()).collect();
                plain_time += run(&rt, &mut plain, chunk);
                let chunk: Vec<_> = (0..n).map(|_| request()).collect();
                verified_time += run(&rt, &mut verified, chunk);
                rt.block_on(async {
                    plain_store.purge_completed(Duration::ZERO).await.unwrap();
                    verified_store
                        .purge_completed(Duration::ZERO)
                        .await
                        .unwrap();
                });
            }
            let per = |t: Duration| t.as_nanos() as f64 / iters as f64;
            SAMPLES
                .lock()
                .unwrap()
                .push((per(plain_time), per(verified_time)));
            plain_time + verified_time
        });
    });
    c.final_summary();

    let samples = SAMPLES.lock().unwrap().clone();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let plain_ns = median(samples.iter().map(|s| s.0).collect());
    let verified_ns = median(samples.iter().map(|s| s.1).collect());
    let ratio = median(samples.iter().map(|s| s.1 / s.0).collect());
    let added = median(samples.iter().map(|s| s.1 - s.0).collect());
    println!(
        "\nSUMMARY verify: key::stripe(), 4 KiB, new events, {} samples: plain {plain_ns:.0} ns, \
         verified {verified_ns:.0} ns per delivery; verified / plain = {ratio:.2} (median of \
         per-sample ratios), added {added:.0} ns",
        samples.len()
    );
}
