//! Promise: hostile deliveries get a 4xx `application/problem+json` answer through a real
//! server socket, never a panic, a 5xx or unbounded memory (README, "What every delivery gets":
//! the "no key", "key empty, longer than 255 bytes, or not visible text", "body over the
//! limit", "body not JSON, field absent, field not a string or integer" and "body that does not
//! arrive" rows). The handler never runs for any of them, but for a body that never ends under
//! a header key: that one reaches the handler, whose read fails once the body timeout passes,
//! and its claim is released.
//!
//! A hyper 1 server serves three routes, each behind the layer over a `MemoryStore`: `/body`
//! (key `json("/id")`, 1 MiB limit, 500 ms body timeout), `/header` (key `header("x-event-id")`,
//! 500 ms body timeout) and `/fields` (`json_fields(["/customer", "/order"])`). The client is a
//! raw TCP socket, so it can send what no well-behaved HTTP client would: a 64 MiB body, a
//! chunked body that never ends, a header that is not UTF-8.

#![cfg(feature = "memory")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::store::{Claim, KeyState, MemoryStore, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

const BODY_TIMEOUT: Duration = Duration::from_millis(500);
const MIB: usize = 1024 * 1024;

struct Server {
    addr: SocketAddr,
    store: MemoryStore,
    ns: String,
    runs: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let store = MemoryStore::new();
    let ns = common::unique_namespace("hostile");
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let handler = service_fn(move |req: Request<RequestBody<Incoming>>| {
        let runs = r.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            // A body it cannot read is answered 400, as an axum extractor answers it.
            let answer = match req.into_body().collect().await {
                Ok(body) => format!("handled {} bytes", body.to_bytes().len()),
                Err(error) => {
                    let mut res = Response::new(Full::new(Bytes::from(error.to_string())));
                    *res.status_mut() = http::StatusCode::BAD_REQUEST;
                    return Ok(res);
                }
            };
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(answer))))
        }
    });
    let body = IdempotencyLayer::new(store.clone())
        .key(key::json("/id").namespace(ns.clone()))
        .body_timeout(BODY_TIMEOUT)
        .layer(handler.clone());
    let header = IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace(ns.clone()))
        .body_timeout(BODY_TIMEOUT)
        .layer(handler.clone());
    let fields = IdempotencyLayer::new(store.clone())
        .key(key::json_fields(["/customer", "/order"]).namespace(ns.clone()))
        .body_timeout(BODY_TIMEOUT)
        .layer(handler);
    let app = service_fn(move |req: Request<Incoming>| {
        let (body, header, fields) = (body.clone(), header.clone(), fields.clone());
        async move {
            match req.uri().path() {
                "/body" => body.oneshot(req).await,
                "/header" => header.oneshot(req).await,
                _ => fields.oneshot(req).await,
            }
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Server {
        addr,
        store,
        ns,
        runs,
        task,
    }
}

/// What the client sends after the head.
enum Payload {
    Bytes(Vec<u8>),
    /// `len` bytes of `a`, in 64 KiB writes, raw or as chunks.
    Big {
        len: usize,
        chunked: bool,
    },
    /// A one-byte chunk every 50 ms, forever.
    Trickle,
    /// One chunk, then silence with the connection open.
    Stall,
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// From the first byte sent to the last byte of the answer.
    took: Duration,
    /// Whether the server closed the connection after answering.
    closed: bool,
    /// Bytes the client managed to write before it was answered (head included).
    sent: usize,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Asserts a 4xx problem+json whose JSON body names the same status.
    fn assert_problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some(&b"application/problem+json"[..]),
            "{self:?}"
        );
        let problem: serde_json::Value =
            serde_json::from_slice(&self.body).expect("a parseable problem+json body");
        assert_eq!(problem["status"], status, "{problem}");
        assert!(problem["detail"].is_string(), "{problem}");
        problem
    }
}

/// One request over a fresh raw socket: `head` (request line and headers, without the final
/// blank line), then `payload`, while the answer is read at the same time.
async fn exchange(addr: SocketAddr, head: &[u8], payload: Payload) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut request = head.to_vec();
    request.extend_from_slice(b"\r\n");
    let counter = sent.clone();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        wr.write_all(&request).await?;
        counter.fetch_add(request.len(), Ordering::SeqCst);
        match payload {
            Payload::Bytes(bytes) => {
                wr.write_all(&bytes).await?;
                counter.fetch_add(bytes.len(), Ordering::SeqCst);
            }
            Payload::Big { len, chunked } => {
                let piece = vec![b'a'; 64 * 1024];
                let mut left = len;
                while left > 0 {
                    let n = left.min(piece.len());
                    if chunked {
                        wr.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                    }
                    wr.write_all(&piece[..n]).await?;
                    if chunked {
                        wr.write_all(b"\r\n").await?;
                    }
                    counter.fetch_add(n, Ordering::SeqCst);
                    left -= n;
                }
                if chunked {
                    wr.write_all(b"0\r\n\r\n").await?;
                }
            }
            Payload::Trickle => loop {
                wr.write_all(b"1\r\n \r\n").await?;
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            },
            Payload::Stall => {
                wr.write_all(b"7\r\n{\"id\": \r\n").await?;
                std::future::pending::<()>().await;
            }
        }
        // Keep the write side open: a half-close could end the body early.
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(wr)
    });

    let read = async {
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            let n = rd.read(&mut chunk).await.expect("read the answer");
            assert!(n > 0, "the server closed without answering: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, Vec<u8>)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().as_bytes().to_vec()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
            .expect("the layer's answers have a length");
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            let n = rd.read(&mut chunk).await.expect("read the answer's body");
            assert!(n > 0, "the answer was cut short");
            body.extend_from_slice(&chunk[..n]);
        }
        let took = started.elapsed();
        let sent = sent.load(Ordering::SeqCst);
        let closed = matches!(
            tokio::time::timeout(Duration::from_secs(1), rd.read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        );
        Answer {
            status,
            headers,
            body,
            took,
            closed,
            sent,
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer within 10 s");
    writer.abort();
    answer
}

fn post(path: &str, extra: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{extra}")
        .into_bytes()
}

/// A complete request with a JSON body, closing the connection after the answer.
async fn json_to(server: &Server, path: &str, body: &[u8]) -> Answer {
    let head = post(
        path,
        &format!("content-length: {}\r\nconnection: close\r\n", body.len()),
    );
    exchange(server.addr, &head, Payload::Bytes(body.to_vec())).await
}

/// A bodiless request to `/header` with `x-event-id` set to the raw bytes `value`.
async fn header_key(server: &Server, value: &[u8]) -> Answer {
    let mut head = post("/header", "content-length: 0\r\nconnection: close\r\n");
    head.extend_from_slice(b"x-event-id: ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
    exchange(server.addr, &head, Payload::Bytes(Vec::new())).await
}

fn report(line: String) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "hostile: {line}");
}

/// The resident set size of this process, in KiB (Linux only).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples the RSS every millisecond while `f` runs; answers `f`'s result and the peak growth
/// over the RSS before it, in KiB.
async fn peak_rss_growth<T>(f: impl std::future::Future<Output = T>) -> (T, Option<u64>) {
    let Some(before) = rss_kib() else {
        return (f.await, None);
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = before;
        while !s.load(Ordering::SeqCst) {
            peak = peak.max(rss_kib().unwrap_or(0));
            std::thread::sleep(Duration::from_millis(1));
        }
        peak
    });
    let out = f.await;
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    (out, Some(peak.saturating_sub(before)))
}

/// The 64 MiB tests measure memory; they take turns.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Promise: a 64 MiB body declared by Content-Length is refused with 413 before it is read;
/// memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_of_64_mib_with_content_length_is_413_unread() {
    let _turn = HEAVY.lock().await;
    let server = start().await;
    let head = post("/body", &format!("content-length: {}\r\n", 64 * MIB));
    let (answer, growth) = peak_rss_growth(exchange(
        server.addr,
        &head,
        Payload::Big {
            len: 64 * MIB,
            chunked: false,
        },
    ))
    .await;
    answer.assert_problem(413);
    assert!(answer.closed, "the unread body ends the connection");
    assert!(answer.sent < 16 * MIB, "sent {} bytes", answer.sent);
    if let Some(growth) = growth {
        assert!(growth < 16 * 1024, "RSS grew by {growth} KiB");
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
    report(format!(
        "64 MiB with Content-Length: 413 after {:?}, {} KiB sent before the answer, peak RSS \
         growth {growth:?} KiB",
        answer.took,
        answer.sent / 1024
    ));
}

/// Promise: a 64 MiB chunked body (no Content-Length) is cut off at the 1 MiB limit with 413;
/// memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_of_64_mib_chunked_is_413_at_the_limit() {
    let _turn = HEAVY.lock().await;
    let server = start().await;
    let head = post("/body", "transfer-encoding: chunked\r\n");
    let (answer, growth) = peak_rss_growth(exchange(
        server.addr,
        &head,
        Payload::Big {
            len: 64 * MIB,
            chunked: true,
        },
    ))
    .await;
    answer.assert_problem(413);
    assert!(answer.closed, "the unread rest ends the connection");
    assert!(answer.sent < 16 * MIB, "sent {} bytes", answer.sent);
    if let Some(growth) = growth {
        assert!(growth < 16 * 1024, "RSS grew by {growth} KiB");
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
    report(format!(
        "64 MiB chunked: 413 after {:?}, {} KiB sent before the answer, peak RSS growth \
         {growth:?} KiB",
        answer.took,
        answer.sent / 1024
    ));
}

/// Promise: a chunked body that never ends (a byte every 50 ms, or silence after the first
/// chunk) is answered 408 once the body timeout passes, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_chunked_body_times_out_with_408() {
    let server = start().await;
    for (what, payload) in [("trickle", Payload::Trickle), ("stall", Payload::Stall)] {
        let head = post("/body", "transfer-encoding: chunked\r\n");
        let answer = exchange(server.addr, &head, payload).await;
        answer.assert_problem(408);
        assert_eq!(answer.header("connection"), Some(&b"close"[..]));
        assert!(answer.closed, "the server closed the connection");
        assert!(
            answer.took >= BODY_TIMEOUT && answer.took < BODY_TIMEOUT + Duration::from_secs(1),
            "{what}: 408 after {:?}",
            answer.took
        );
        report(format!(
            "endless chunked body ({what}): 408 after {:?} (body_timeout {BODY_TIMEOUT:?})",
            answer.took
        ));
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

/// Promise: with a header key, a chunked body that never ends (a byte every 50 ms, or silence
/// after the first chunk) holds the event's claim no longer than the body timeout: the
/// handler's read fails, its 400 releases the claim, and the genuine delivery of the same
/// event then runs instead of meeting a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_keyed_endless_body_releases_its_claim() {
    let server = start().await;
    for (what, payload) in [("trickle", Payload::Trickle), ("stall", Payload::Stall)] {
        let id = format!("evt-{what}");
        let mut head = post("/header", "transfer-encoding: chunked\r\n");
        head.extend_from_slice(format!("x-event-id: {id}\r\n").as_bytes());
        let answer = exchange(server.addr, &head, payload).await;
        assert_eq!(answer.status, 400, "{what}: {answer:?}");
        let said = String::from_utf8_lossy(&answer.body);
        assert!(said.contains("did not arrive within"), "{what}: {said}");
        assert!(
            answer.took >= BODY_TIMEOUT,
            "{what}: after {:?}",
            answer.took
        );
        let key = IdempotencyKey::new(server.ns.clone(), id.as_str()).unwrap();
        let record = server.store.describe(&key).await.unwrap().unwrap();
        assert_eq!(record.state, KeyState::Released, "{what}: {record:?}");

        let genuine = header_key(&server, id.as_bytes()).await;
        assert_eq!(genuine.status, 200, "{what}: {genuine:?}");
        report(format!(
            "endless chunked body on a header key ({what}): the handler's read failed after \
             {:?} (body_timeout {BODY_TIMEOUT:?}); the claim was released",
            answer.took
        ));
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 4);
}

/// Promise: bodies that are not JSON, or not the JSON expected, are 400 problem+json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400() {
    let server = start().await;
    let deep = format!("{{\"id\": {}", "[".repeat(100_000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", br#"{"id": "evt_1""#.to_vec()),
        ("trailing garbage", br#"{"id": "evt_1"} x"#.to_vec()),
        ("empty body", Vec::new()),
        ("not UTF-8", b"{\"id\": \"evt_\xff\xfe\"}".to_vec()),
        ("nested 100000 deep", deep.into_bytes()),
        ("a top-level array", br#"[{"id": "evt_1"}]"#.to_vec()),
        ("a top-level string", br#""evt_1""#.to_vec()),
        ("no id field", br#"{"type": "charge.succeeded"}"#.to_vec()),
        ("form-encoded", b"id=evt_1&type=charge".to_vec()),
    ];
    for (what, body) in cases {
        let answer = json_to(&server, "/body", &body).await;
        let problem = answer.assert_problem(400);
        report(format!("{what}: 400 {}", problem["detail"]));
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

/// Promise: ids that are JSON objects, arrays, null, booleans or fractions are 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_of_the_wrong_json_type_is_400() {
    let server = start().await;
    for id in [
        r#"{"a": 1}"#,
        "[1, 2]",
        "[]",
        "{}",
        "null",
        "true",
        "1.5",
        "1e3",
    ] {
        let body = format!(r#"{{"id": {id}, "type": "x"}}"#);
        let answer = json_to(&server, "/body", body.as_bytes()).await;
        answer.assert_problem(400);
        let body = format!(r#"{{"customer": "c", "order": {id}}}"#);
        let answer = json_to(&server, "/fields", body.as_bytes()).await;
        answer.assert_problem(400);
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

/// Promise: a JSON integer id is a valid key, its decimal text; so it is the same key as the
/// string of those digits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_id_is_its_decimal_text() {
    let server = start().await;
    for (id, text) in [
        ("12345", "12345"),
        ("-7", "-7"),
        ("18446744073709551615", "18446744073709551615"),
        ("0", "0"),
    ] {
        let answer = json_to(&server, "/body", format!(r#"{{"id": {id}}}"#).as_bytes()).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let key = IdempotencyKey::new(server.ns.clone(), text).unwrap();
        assert!(matches!(
            server.store.claim(&key, Stale::default()).await.unwrap(),
            Claim::Done(_)
        ));
        // The same event with its id as a string is a duplicate.
        let answer = json_to(
            &server,
            "/body",
            format!(r#"{{"id": "{text}"}}"#).as_bytes(),
        )
        .await;
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.header("idempotency-outcome"),
            Some(&b"duplicate"[..])
        );
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 4);
    let answer = json_to(&server, "/fields", br#"{"customer": "c", "order": 1001}"#).await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// Promise: keys that are empty, too long, not text, or hold control characters are 400,
/// whether they come in a header or in the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_400() {
    let server = start().await;
    let long = "k".repeat(10 * 1024);
    let header_cases: Vec<(&str, Vec<u8>)> = vec![
        ("10 KiB key", long.clone().into_bytes()),
        ("256-byte key", "k".repeat(256).into_bytes()),
        ("empty key", Vec::new()),
        ("blank key", b"   ".to_vec()),
        ("not UTF-8", b"evt_\xc3\x28\xff".to_vec()),
        ("Latin-1 text", "évènement".as_bytes().to_vec()),
        ("tab inside", b"evt\t\t1".to_vec()),
    ];
    for (what, value) in header_cases {
        let answer = header_key(&server, &value).await;
        let problem = answer.assert_problem(400);
        report(format!("header {what}: 400 {}", problem["detail"]));
    }
    let missing = exchange(
        server.addr,
        &post("/header", "content-length: 0\r\nconnection: close\r\n"),
        Payload::Bytes(Vec::new()),
    )
    .await;
    let problem = missing.assert_problem(400);
    assert_eq!(problem["expected"], "header `x-event-id`");

    let body_cases = [
        ("10 KiB key", format!(r#"{{"id": "{long}"}}"#)),
        ("empty key", r#"{"id": ""}"#.to_owned()),
        ("blank key", r#"{"id": " \t "}"#.to_owned()),
        ("NUL", r#"{"id": "evt\u0000"}"#.to_owned()),
        (
            "control characters",
            r#"{"id": "\u0007\u001b[31m\r\n\u007f"}"#.to_owned(),
        ),
        ("C1 control", r#"{"id": "evt\u0085"}"#.to_owned()),
    ];
    for (what, body) in body_cases {
        let answer = json_to(&server, "/body", body.as_bytes()).await;
        answer.assert_problem(400);
        let fields = body.replace(r#""id""#, r#""customer": "c", "order""#);
        let answer = json_to(&server, "/fields", fields.as_bytes()).await;
        let problem = answer.assert_problem(400);
        report(format!("body {what}: 400 {}", problem["detail"]));
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);

    // After all that, the server still serves a good delivery.
    let answer = header_key(&server, b"evt_ok").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, b"handled 0 bytes");
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
}

/// Promise: a key holding an invisible format character (a bidirectional override, a
/// zero-width space, a byte order mark), which could pass for another key on the admin page
/// and in logs, is 400 problem+json naming the character, in a header or in the body; the
/// handler never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_and_bidi_keys_are_400() {
    let server = start().await;
    for (what, value) in [
        ("U+202E in a header", "evt_\u{202E}1fed"),
        ("U+200B in a header", "evt\u{200B}1"),
    ] {
        let answer = header_key(&server, value.as_bytes()).await;
        let problem = answer.assert_problem(400);
        report(format!("{what}: 400 {}", problem["detail"]));
    }
    let body_cases = [
        ("escaped U+202E", r#""evt_\u202e1""#, "U+202E"),
        ("escaped U+200B", r#""evt\u200b1""#, "U+200B"),
        ("raw U+202E", "\"evt_\u{202E}1\"", "U+202E"),
        ("raw U+FEFF", "\"\u{FEFF}evt_1\"", "U+FEFF"),
        ("escaped U+2066", r#""evt\u20661\u2069""#, "U+2066"),
    ];
    for (what, id, code) in body_cases {
        for (path, body) in [
            ("/body", format!(r#"{{"id": {id}}}"#)),
            ("/fields", format!(r#"{{"customer": "c", "order": {id}}}"#)),
        ] {
            let answer = json_to(&server, path, body.as_bytes()).await;
            let problem = answer.assert_problem(400);
            let detail = problem["detail"].as_str().unwrap();
            assert!(detail.contains(code), "{path} {what}: {detail}");
            report(format!("{path} {what}: 400 {detail}"));
        }
    }
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
    let answer = json_to(&server, "/body", br#"{"id": "evt_\u00e91"}"#).await;
    assert_eq!(answer.status, 200, "visible text is a key: {answer:?}");
}

/// Promise: a request the server cannot even parse (a raw control character in a header) is
/// refused by hyper before the layer sees it; the server stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparseable_header_never_reaches_the_layer() {
    let server = start().await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"POST /header HTTP/1.1\r\nhost: x\r\nx-event-id: evt\x01\x00\r\n\
              content-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
    let good = header_key(&server, b"evt_ok").await;
    assert_eq!(good.status, 200);
}
