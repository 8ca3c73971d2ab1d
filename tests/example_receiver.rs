//! Promises: the example receiver's fulfilments go through the inbox (below); and its operators' routes (`/admin/`, `/stuck`, `/metrics`) answer
//! only the admin token, given as the Basic password; a wrong password, one of another length
//! (a prefix of the token, the token with more after it) or none gets 401 with a Basic
//! challenge. The webhook routes need no password.
//!
//! Starts the `webhook_receiver` example (built by `cargo test`, next to this test binary) on
//! a free loopback port, its claims in a SQLite file of its own.

#![cfg(all(
    unix,
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis",
    feature = "axum",
    feature = "verify",
    feature = "admin",
    feature = "metrics"
))]

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "s3cret-admin-token";

/// The receiver process and its database file; both gone when dropped.
struct Receiver {
    child: std::process::Child,
    file: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.file.display()));
        }
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

async fn start_receiver() -> (Receiver, SocketAddr) {
    let binary = receiver_binary();
    assert!(
        binary.exists(),
        "{} is missing: run `cargo test --all-features` (which builds the examples) or set \
         TOWER_IDEMPOTENCY_RECEIVER",
        binary.display()
    );
    let file = std::env::temp_dir().join(format!(
        "tower-idempotency-{}.sqlite3",
        common::unique_namespace("receiver")
    ));
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let child = Command::new(&binary)
        .env("DATABASE_URL", format!("sqlite:{}", file.display()))
        .env("PORT", port.to_string())
        .env("ADMIN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example receiver");
    let mut receiver = Receiver { child, file };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).await.is_err() {
        if let Some(status) = receiver.child.try_wait().unwrap() {
            panic!("the receiver exited: {status}");
        }
        assert!(Instant::now() < deadline, "the receiver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (receiver, addr)
}

/// One request on a fresh connection: the status and the whole answer's head.
async fn send(addr: SocketAddr, head: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("{head}host: localhost\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned();
    (status, head)
}

fn get(path: &str, password: Option<&str>) -> String {
    let auth = password.map_or_else(String::new, |password| {
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("admin:{password}"));
        format!("authorization: Basic {pair}\r\n")
    });
    format!("GET {path} HTTP/1.1\r\n{auth}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_routes_need_the_admin_token() {
    let (_receiver, addr) = start_receiver().await;
    let longer = format!("{TOKEN}x");
    let wrong = [
        None,
        Some(""),
        Some("wrong"),
        Some(&TOKEN[..TOKEN.len() - 1]),
        Some(longer.as_str()),
    ];
    for path in ["/metrics", "/stuck", "/admin/"] {
        for password in wrong {
            let (status, head) = send(addr, &get(path, password)).await;
            assert_eq!(status, 401, "{path} with {password:?}: {head}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: basic realm=\"admin\""),
                "{path}: {head}"
            );
        }
        let (status, head) = send(addr, &get(path, Some(TOKEN))).await;
        assert_eq!(status, 200, "{path} with the token: {head}");
    }
    // The senders' routes take no password.
    let delivery = format!(
        "POST /webhooks/github HTTP/1.1\r\nhost: localhost\r\nx-github-delivery: {}\r\n\
         x-github-event: push\r\ncontent-length: 2\r\n\r\n{{}}",
        common::unique_namespace("d")
    );
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(delivery.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (status, _) = send(addr, &get("/side-effects", None)).await;
    assert_eq!(status, 200, "the demo sender's check stays open");
}

/// One request with a body on a fresh connection: the status, the head and the body.
async fn exchange(addr: SocketAddr, request: String) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    (status, head.to_owned(), body.to_owned())
}

fn fulfilment(id: &str, body: &str) -> String {
    format!(
        "POST /webhooks/shopify/fulfilment HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         x-shopify-webhook-id: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn admin(method: &str, path: &str, body: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("admin:{TOKEN}"));
    format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         authorization: Basic {pair}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// How many side effects `event` had, once it had one.
async fn effects_of(addr: SocketAddr, event: &str) -> Option<i64> {
    let side_effects = get("/side-effects", None) + "connection: close\r\n\r\n";
    let (_, _, body) = exchange(addr, side_effects).await;
    let effects: serde_json::Value = serde_json::from_str(&body).ok()?;
    effects
        .as_array()?
        .iter()
        .find(|e| e["event"] == event)
        .map(|e| e["count"].as_i64().unwrap())
}

/// Polls `check` every 100 ms for up to 60 s.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Promise: the receiver's fulfilments go through the inbox. A delivery is answered 202
/// (`queued`) and its copy 200 (`duplicate`) while the work runs later, once. A poison one is
/// tried 3 times, then listed dead on the admin API, and "retry" runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfilments_go_through_the_inbox() {
    let (_receiver, addr) = start_receiver().await;
    let id = common::unique_namespace("f");
    let (status, head, _) = exchange(addr, fulfilment(&id, "{}")).await;
    assert_eq!(status, 202, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("idempotency-outcome: queued"),
        "{head}"
    );
    let (status, head, _) = exchange(addr, fulfilment(&id, "{}")).await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("idempotency-outcome: duplicate"),
        "{head}"
    );
    let count = eventually("the fulfilment to run", async || {
        effects_of(addr, &id).await
    })
    .await;
    assert_eq!(count, 1);

    // A Standard Webhooks sender's route behind the inbox answers the same way.
    let svix = common::unique_namespace("msg");
    let standard = format!(
        "POST /webhooks/standard/inbox HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         webhook-id: {svix}\r\nwebhook-timestamp: 1700000000\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    let (status, head, _) = exchange(addr, standard).await;
    assert_eq!(status, 202, "{head}");
    let ran = eventually("the Standard Webhooks event", async || {
        effects_of(addr, &svix).await
    })
    .await;
    assert_eq!(ran, 1);

    let poison = common::unique_namespace("p");
    let (status, _, _) = exchange(addr, fulfilment(&poison, r#"{"poison":true}"#)).await;
    assert_eq!(status, 202);
    let dead = eventually("the poison fulfilment to die", async || {
        let (status, _, body) = exchange(addr, admin("GET", "/admin/inbox?state=dead", "")).await;
        assert_eq!(status, 200, "{body}");
        let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
        listed["entries"]
            .as_array()?
            .iter()
            .find(|e| e["key"] == poison.as_str())
            .cloned()
    })
    .await;
    assert_eq!(dead["attempts"], 3, "{dead}");
    let retry = serde_json::json!({"namespace": dead["namespace"], "key": poison}).to_string();
    let (status, _, body) = exchange(addr, admin("POST", "/admin/inbox/retry", &retry)).await;
    assert_eq!(status, 200, "{body}");
    let retried = eventually("the retried fulfilment to run again", async || {
        let path = "/admin/inbox?state=dead,queued,running";
        let (_, _, body) = exchange(addr, admin("GET", path, "")).await;
        let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
        let entry = listed["entries"]
            .as_array()?
            .iter()
            .find(|e| e["key"] == poison.as_str())?
            .clone();
        // A person's retry starts the attempts over; the entry fails again.
        (entry["history"].as_array()?.len() > 3).then_some(entry)
    })
    .await;
    assert!(
        retried["history"].as_array().unwrap().len() > 3,
        "{retried}"
    );
}
