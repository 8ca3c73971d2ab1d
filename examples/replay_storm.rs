//! An at-least-once sender in a bad mood: it delivers every event several times, many at
//! once and out of order, retries what was not acknowledged, then asks the receiver how many
//! side effects each event had. The answer must be exactly one each.
//!
//! Start the receiver, then the storm:
//!
//! ```sh
//! cargo run --example webhook_receiver --all-features
//! cargo run --example replay_storm
//! ```
//!
//! `RECEIVER` (default `127.0.0.1:3000`), `EVENTS` (default 40) and `COPIES` (default 4) set
//! the target and the size of the storm; the exit code is non-zero if any event had no side
//! effect or more than one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

/// One event, in the shape its sender uses.
#[derive(Clone)]
struct Event {
    provider: &'static str,
    id: String,
}

impl Event {
    fn request(&self) -> Request<Full<Bytes>> {
        let builder = Request::post(format!("/webhooks/{}", self.provider))
            .header("host", "localhost")
            .header("content-type", "application/json");
        let (builder, body) = match self.provider {
            "stripe" => (
                builder.header("stripe-signature", "t=0,v1=unchecked"),
                format!(
                    r#"{{"id":"{}","type":"checkout.session.completed","data":{{"object":{{"metadata":{{"order_id":"ord_{}"}}}}}}}}"#,
                    self.id, self.id
                ),
            ),
            "github" => (
                builder
                    .header("x-github-delivery", &self.id)
                    .header("x-github-event", "push"),
                "{}".to_owned(),
            ),
            "shopify" => (
                builder.header("x-shopify-webhook-id", &self.id),
                r#"{"id":1}"#.to_owned(),
            ),
            _ => (builder.header("webhook-id", &self.id), "{}".to_owned()),
        };
        builder
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let receiver = std::env::var("RECEIVER").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let events: usize = std::env::var("EVENTS").map_or(Ok(40), |n| n.parse())?;
    let copies: usize = std::env::var("COPIES").map_or(Ok(4), |n| n.parse())?;

    // Ids unique to this run, so storms can be repeated against the same receiver.
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let providers = ["stripe", "github", "shopify", "standard"];
    let all: Vec<Event> = (0..events)
        .map(|i| Event {
            provider: providers[i % providers.len()],
            id: format!("storm-{run}-{i}"),
        })
        .collect();

    // Every event `copies` times, shuffled: duplicates arrive out of order, and many at once.
    let mut deliveries: Vec<Event> = all.iter().flat_map(|e| vec![e.clone(); copies]).collect();
    shuffle(&mut deliveries, run as u64);
    println!(
        "sending {} deliveries of {events} events to {receiver}, 16 at a time",
        deliveries.len()
    );

    let limit = Arc::new(Semaphore::new(16));
    let receiver = Arc::new(receiver);
    let mut tasks = Vec::new();
    for event in deliveries {
        let permit = limit.clone().acquire_owned().await?;
        let receiver = receiver.clone();
        tasks.push(tokio::spawn(async move {
            let answers = deliver_until_acknowledged(&receiver, &event).await;
            drop(permit);
            answers
        }));
    }
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        for answer in task.await?? {
            *answers.entry(answer).or_default() += 1;
        }
    }
    println!("answers the sender saw:");
    for (answer, n) in &answers {
        println!("  {n:>5}  {answer}");
    }

    // What the receiver did.
    let (status, body) = send(
        &receiver,
        Request::get("/side-effects")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))?,
    )
    .await?;
    if status != StatusCode::OK {
        return Err(format!("GET /side-effects answered {status}").into());
    }
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&body)?;
    let counts: HashMap<(String, String), i64> = listed
        .iter()
        .map(|row| {
            let field = |name: &str| row[name].as_str().unwrap_or_default().to_owned();
            (
                (field("provider"), field("event")),
                row["count"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let mut per_event: BTreeMap<i64, usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for event in &all {
        let n = counts
            .get(&(event.provider.to_owned(), event.id.clone()))
            .copied()
            .unwrap_or(0);
        *per_event.entry(n).or_default() += 1;
        if n != 1 {
            wrong.push(format!("{} {}: {n} side effects", event.provider, event.id));
        }
    }
    println!("side effects per event:");
    for (n, events) in &per_event {
        println!("  {events:>5} events had {n}");
    }
    if wrong.is_empty() {
        println!("OK: each of the {events} events had exactly one side effect");
        Ok(())
    } else {
        Err(format!(
            "{} events did not have exactly one side effect:\n{}",
            wrong.len(),
            wrong.join("\n")
        )
        .into())
    }
}

/// Delivers `event` the way an at-least-once sender does: again, after `Retry-After` (capped
/// at a second to keep the demonstration short), until it is acknowledged with a 2xx.
async fn deliver_until_acknowledged(receiver: &str, event: &Event) -> Result<Vec<String>, String> {
    let mut seen = Vec::new();
    for _ in 0..30 {
        let answer = send_with_outcome(receiver, event.request()).await;
        let (status, outcome, retry_after) = match answer {
            Ok(answer) => answer,
            Err(err) => {
                seen.push(format!("connection error ({err})"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        seen.push(format!("{} {}", status.as_u16(), outcome));
        if status.is_success() {
            return Ok(seen);
        }
        tokio::time::sleep(retry_after.min(Duration::from_secs(1))).await;
    }
    Err(format!(
        "{} {} was never acknowledged: {seen:?}",
        event.provider, event.id
    ))
}

async fn send_with_outcome(
    receiver: &str,
    req: Request<Full<Bytes>>,
) -> Result<(StatusCode, String, Duration), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(receiver).await?;
    let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let res = client.send_request(req).await?;
    let outcome = res
        .headers()
        .get("idempotency-outcome")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("processed (the handler's answer)")
        .to_owned();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(Duration::from_millis(100), Duration::from_secs);
    Ok((res.status(), outcome, retry_after))
}

async fn send(
    receiver: &str,
    req: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(receiver).await?;
    let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let res = client.send_request(req).await?;
    let status = res.status();
    Ok((status, res.into_body().collect().await?.to_bytes()))
}

/// Fisher-Yates with a small xorshift generator: a different order every run, no dependency.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}
