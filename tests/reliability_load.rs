//! Promise: under sustained concurrent load with duplicates, the example receiver on
//! PostgreSQL has exactly one side effect per event: none doubled, none lost (DESIGN.md,
//! "Tests that matter" 1 and 2, end to end).
//!
//! Starts the `webhook_receiver` example (built by `cargo test`, next to this test binary) on
//! a free loopback port with `DATABASE_URL` set to the test PostgreSQL, then runs a bounded
//! load: 16 senders, each taking fresh events (Stripe, GitHub, Shopify and Standard Webhooks in
//! turn) and delivering every event three times at once over three keep-alive connections, each
//! copy retried (after 10-50 ms, an impatient sender) until it is answered 2xx. Afterwards it
//! counts the side effects the receiver recorded for this run's events, in the database.
//!
//! `TOWER_IDEMPOTENCY_LOAD_SECS` sets the duration (default 5); `TOWER_IDEMPOTENCY_RECEIVER`
//! the receiver binary (default: the example built for this profile). Latency percentiles
//! are printed; BENCHMARKS.md has the numbers of a release build.

#![cfg(all(
    unix,
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "axum"
))]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const SENDERS: usize = 16;
const COPIES: usize = 3;
const PROVIDERS: [&str; 4] = ["stripe", "github", "shopify", "standard"];

/// The receiver process; killed when dropped.
struct Receiver(std::process::Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn receiver_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOWER_IDEMPOTENCY_RECEIVER") {
        return path.into();
    }
    // target/<profile>/deps/<this test> -> target/<profile>/examples/webhook_receiver
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join("webhook_receiver")
}

async fn start_receiver(url: &str) -> (Receiver, std::net::SocketAddr) {
    let binary = receiver_binary();
    assert!(
        binary.exists(),
        "{} is missing: run `cargo test --all-features` (which builds the examples) or set \
         TOWER_IDEMPOTENCY_RECEIVER",
        binary.display()
    );
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let child = Command::new(&binary)
        .env("DATABASE_URL", url)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example receiver");
    let mut receiver = Receiver(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).await.is_err() {
        if let Some(status) = receiver.0.try_wait().unwrap() {
            panic!("the receiver exited: {status}");
        }
        assert!(Instant::now() < deadline, "the receiver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (receiver, addr)
}

fn request(provider: &str, id: &str) -> Request<Full<Bytes>> {
    let builder = Request::post(format!("/webhooks/{provider}"))
        .header("host", "localhost")
        .header("content-type", "application/json");
    let (builder, body) = match provider {
        "stripe" => (
            builder.header("stripe-signature", "t=0,v1=unchecked"),
            serde_json::json!({
                "id": id,
                "type": "checkout.session.completed",
                "data": { "object": { "metadata": { "order_id": format!("ord_{id}") } } },
            })
            .to_string(),
        ),
        "github" => (
            builder
                .header("x-github-delivery", id)
                .header("x-github-event", "push"),
            "{}".to_owned(),
        ),
        "shopify" => (builder.header("x-shopify-webhook-id", id), "{}".to_owned()),
        _ => (builder.header("webhook-id", id), "{}".to_owned()),
    };
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

#[derive(Default)]
struct Stats {
    /// Every attempt's latency, request sent to whole answer read, by provider.
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    /// Answers by status, and 2xx answers split into processed and duplicate.
    statuses: BTreeMap<u16, usize>,
    processed: usize,
    duplicates: usize,
    transport_errors: usize,
    unacknowledged: usize,
}

/// One keep-alive connection, reopened when it breaks.
struct Connection {
    addr: std::net::SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    async fn send(&mut self, req: Request<Full<Bytes>>) -> Option<(StatusCode, bool)> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = TcpStream::connect(self.addr).await.ok()?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().unwrap();
        let answer = async {
            sender.ready().await?;
            let res = sender.send_request(req).await?;
            let duplicate = res.headers().get("idempotency-outcome").is_some();
            let status = res.status();
            res.into_body().collect().await?;
            Ok::<_, hyper::Error>((status, duplicate))
        };
        match answer.await {
            Ok(answer) => Some(answer),
            Err(_) => {
                self.sender = None;
                None
            }
        }
    }
}

/// Delivers one copy until it is acknowledged (or `give_up` passes).
async fn deliver(
    conn: &mut Connection,
    provider: &'static str,
    id: &str,
    give_up: Instant,
    stats: &Mutex<Stats>,
) {
    loop {
        let started = Instant::now();
        let answer = conn.send(request(provider, id)).await;
        let took = started.elapsed();
        let pause = {
            let mut stats = stats.lock().unwrap();
            match answer {
                None => {
                    stats.transport_errors += 1;
                    50
                }
                Some((status, layer_answer)) => {
                    stats.latencies.entry(provider).or_default().push(took);
                    *stats.statuses.entry(status.as_u16()).or_default() += 1;
                    if status.is_success() {
                        if layer_answer {
                            stats.duplicates += 1;
                        } else {
                            stats.processed += 1;
                        }
                        return;
                    }
                    if Instant::now() > give_up {
                        stats.unacknowledged += 1;
                        return;
                    }
                    if status == StatusCode::CONFLICT {
                        10
                    } else {
                        50
                    }
                }
            }
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

/// Promise: no double side effect and no lost event under a bounded loopback load against
/// the example receiver on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_against_the_example_receiver_on_postgres() {
    let url = common::db::postgres_url();
    let Some(pool) = common::db::postgres_pool().await else {
        return;
    };
    let seconds: u64 = std::env::var("TOWER_IDEMPOTENCY_LOAD_SECS")
        .map_or(5, |s| s.parse().expect("TOWER_IDEMPOTENCY_LOAD_SECS"));
    let (_receiver, addr) = start_receiver(&url).await;

    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let prefix = format!("load-{run:x}-");
    let next = Arc::new(AtomicUsize::new(0));
    let stats = Arc::new(Mutex::new(Stats::default()));
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let give_up = end + Duration::from_secs(30);
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (next, stats, prefix) = (next.clone(), stats.clone(), prefix.clone());
            tokio::spawn(async move {
                let mut conns: Vec<Connection> = (0..COPIES)
                    .map(|_| Connection { addr, sender: None })
                    .collect();
                while Instant::now() < end {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let provider = PROVIDERS[i % PROVIDERS.len()];
                    let id = format!("{prefix}{i}");
                    let [a, b, c] = &mut conns[..] else {
                        unreachable!()
                    };
                    tokio::join!(
                        deliver(a, provider, &id, give_up, &stats),
                        deliver(b, provider, &id, give_up, &stats),
                        deliver(c, provider, &id, give_up, &stats),
                    );
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let elapsed = started.elapsed();
    let events = next.load(Ordering::SeqCst);

    let effects: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT provider, event, COUNT(*) FROM side_effects WHERE event LIKE $1 \
         GROUP BY provider, event",
    )
    .bind(format!("{prefix}%"))
    .fetch_all(&pool)
    .await
    .unwrap();
    // This run's rows are not needed once counted.
    sqlx::query("DELETE FROM side_effects WHERE event LIKE $1")
        .bind(format!("{prefix}%"))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM idempotency_keys WHERE \"key\" LIKE $1")
        .bind(format!("{prefix}%"))
        .execute(&pool)
        .await
        .unwrap();

    let stats = stats.lock().unwrap();
    let mut latencies: Vec<Duration> = stats.latencies.values().flatten().copied().collect();
    latencies.sort();
    let by_provider: Vec<String> = stats
        .latencies
        .iter()
        .map(|(provider, l)| {
            let mut l = l.clone();
            l.sort();
            format!(
                "{provider} p50 {:?} p99 {:?}",
                percentile(&l, 0.50),
                percentile(&l, 0.99)
            )
        })
        .collect();
    let doubled: Vec<_> = effects.iter().filter(|e| e.2 > 1).collect();
    let lost = events - effects.len();
    let line = format!(
        "{events} events x {COPIES} copies in {elapsed:.1?} ({:.0} answers/s) by {SENDERS} \
         senders: {} answers {:?}, {} processed, {} duplicates, {} transport errors, {} \
         unacknowledged; latency p50 {:?} p99 {:?} max {:?} ({}); side effects: {} doubled, \
         {lost} lost",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        latencies.len(),
        stats.statuses,
        stats.processed,
        stats.duplicates,
        stats.transport_errors,
        stats.unacknowledged,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        by_provider.join(", "),
        doubled.len(),
    );
    {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "load: {line}");
    }
    assert!(events > 0);
    assert!(doubled.is_empty(), "double side effects: {doubled:?}");
    assert_eq!(lost, 0, "events without a side effect");
    assert_eq!(stats.unacknowledged, 0, "every copy was acknowledged");
    assert_eq!(
        stats.processed, events,
        "exactly one copy of each event was processed"
    );
}
