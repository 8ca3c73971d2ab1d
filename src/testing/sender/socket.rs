//! The hang-up scenario, over a real socket: each instance served by hyper on `127.0.0.1`, a
//! sender that closes its connection while the app works, then sends again.

use std::future::poll_fn;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::play::{Next, Play, Trouble, Verdict, What, until_2xx};
use super::report::{Attempt, Failure, Report};
use super::{Answer, Call};
use crate::body::BoxError;
use crate::response::OUTCOME_HEADER;
use crate::testing::Delivery;

/// Sends `delivery` to the first instance and hangs up `after` the app started on it, then
/// sends it again, to each instance in turn, until it is answered 2xx.
pub(super) async fn hang_up(
    play: Play<'_>,
    delivery: &Delivery,
    after: Duration,
) -> Result<Report, Failure> {
    let tally = play.tally().await;
    let mut servers = Vec::with_capacity(play.apps.len());
    for app in &play.apps {
        let server = Server::start(app.clone()).await;
        servers.push(server.unwrap_or_else(|error| panic!("cannot listen on 127.0.0.1: {error}")));
    }
    let mut report = Report::new(play.label.clone(), delivery.to_string());
    let deadline = Instant::now() + play.give_up_after;
    let first = servers[0].hang_up(delivery, after, deadline).await;
    let mut troubles = Vec::new();
    if let Attempt::Error(_) = first {
        let who = "the first delivery".to_owned();
        troubles.push(Trouble {
            who,
            what: What::NoAnswer,
        });
    }
    report.chains.push(vec![first]);
    let mut tries = Vec::new();
    for n in 1.. {
        if !troubles.is_empty() {
            break;
        }
        let attempt = servers[n % servers.len()]
            .send(delivery, play.give_up_after)
            .await;
        let next = until_2xx(&attempt, &tally, deadline).await;
        tries.push(attempt);
        match next {
            Next::Again => tokio::time::sleep(play.retry_every).await,
            Next::Done => break,
            Next::Wrong(what) => {
                let who = "the delivery sent again".to_owned();
                troubles.push(Trouble { who, what });
            }
        }
    }
    report.chains.push(tries);
    // A run the hang-up did not stop ends before the effects are counted.
    for server in &servers {
        server.settled(deadline, play.retry_every).await;
    }
    play.verdict(report, &tally, troubles, Verdict::HangUp)
        .await
}

/// One instance, served on a loopback port.
struct Server {
    addr: SocketAddr,
    /// How many requests the app has started on (polled once).
    started: watch::Receiver<usize>,
    /// How many requests the app is working on.
    running: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl Server {
    async fn start(app: Call) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (started_tx, started) = watch::channel(0);
        let started_tx = Arc::new(started_tx);
        let running = Arc::new(AtomicUsize::new(0));
        let counted = running.clone();
        let accept = tokio::spawn(async move {
            // Dropped with this task: the connections end with the server.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                while connections.try_join_next().is_some() {}
                let (app, started, running) = (app.clone(), started_tx.clone(), counted.clone());
                let service = hyper::service::service_fn(move |request| {
                    serve(app.clone(), started.clone(), running.clone(), request)
                });
                connections.spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = connection.await;
                });
            }
        });
        Ok(Self {
            addr,
            started,
            running,
            accept,
        })
    }

    /// Sends `delivery`, waits until the app has started on it and `after`, and hangs up.
    async fn hang_up(&self, delivery: &Delivery, after: Duration, deadline: Instant) -> Attempt {
        let mut started = self.started.clone();
        let before = *started.borrow_and_update();
        let mut stream = match TcpStream::connect(self.addr).await {
            Ok(stream) => stream,
            Err(error) => return Attempt::Error(format!("cannot connect: {error}")),
        };
        if let Err(error) = stream.write_all(&request_bytes(delivery, self.addr)).await {
            return Attempt::Error(format!("cannot send: {error}"));
        }
        let began = tokio::time::timeout_at(deadline, started.wait_for(|n| *n > before)).await;
        if !matches!(began, Ok(Ok(_))) {
            return Attempt::Error("the app never started on the delivery".to_owned());
        }
        tokio::time::sleep(after).await;
        drop(stream);
        Attempt::HungUp
    }

    /// Sends `delivery` on a connection of its own and reads the answer, waiting up to
    /// `patience`.
    async fn send(&self, delivery: &Delivery, patience: Duration) -> Attempt {
        let exchange = async {
            let mut stream = TcpStream::connect(self.addr).await?;
            stream
                .write_all(&request_bytes(delivery, self.addr))
                .await?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await?;
            Ok::<_, io::Error>(answer)
        };
        match tokio::time::timeout(patience, exchange).await {
            Err(_) => Attempt::Error(format!("no answer within {patience:?}")),
            Ok(Err(error)) => Attempt::Error(format!("the connection failed: {error}")),
            Ok(Ok(answer)) => parse(&answer),
        }
    }

    /// Waits until the app works on nothing (or the deadline).
    async fn settled(&self, deadline: Instant, every: Duration) {
        while self.running.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(every).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One request on the server: the body read, then the app called; `started` told once the
/// app was polled, `running` counting until its future ends or is dropped.
async fn serve(
    app: Call,
    started: Arc<watch::Sender<usize>>,
    running: Arc<AtomicUsize>,
    request: Request<Incoming>,
) -> Result<Answer, BoxError> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let _running = Running::enter(running);
    let mut call = app(Request::from_parts(parts, body));
    let mut told = false;
    poll_fn(|cx| {
        let poll = call.as_mut().poll(cx);
        if !told {
            told = true;
            started.send_modify(|n| *n += 1);
        }
        poll
    })
    .await
}

/// Counts a request the app works on while it lives.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn enter(running: Arc<AtomicUsize>) -> Self {
        running.fetch_add(1, Ordering::SeqCst);
        Self(running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The delivery as HTTP/1.1 bytes, on a connection that closes after the answer.
fn request_bytes(delivery: &Delivery, addr: SocketAddr) -> Vec<u8> {
    let target = delivery
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let mut bytes = format!("{} {target} HTTP/1.1\r\n", delivery.method()).into_bytes();
    if !delivery.headers().contains_key(HOST) {
        bytes.extend_from_slice(format!("host: {addr}\r\n").as_bytes());
    }
    for (name, value) in delivery.headers() {
        if [CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION].contains(name) {
            continue;
        }
        bytes.extend_from_slice(name.as_str().as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    let length = delivery.body().len();
    bytes.extend_from_slice(
        format!("content-length: {length}\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    bytes.extend_from_slice(delivery.body());
    bytes
}

/// The status and outcome of an HTTP/1.1 answer.
fn parse(answer: &[u8]) -> Attempt {
    let head_end = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let head = String::from_utf8_lossy(&answer[..head_end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok());
    let Some(status) = status else {
        return Attempt::Error(if answer.is_empty() {
            "the connection closed without an answer".to_owned()
        } else {
            format!("not an HTTP answer: {head:?}")
        });
    };
    let outcome = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(OUTCOME_HEADER.as_str())
            .then(|| value.trim().to_owned())
    });
    Attempt::Answer(status, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed() {
        let answer =
            b"HTTP/1.1 409 Conflict\r\nretry-after: 5\r\nIdempotency-Outcome: in-flight\r\n\r\n";
        assert!(matches!(
            parse(answer),
            Attempt::Answer(StatusCode::CONFLICT, Some(outcome)) if outcome == "in-flight"
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\n\r\nbody"),
            Attempt::Answer(StatusCode::OK, None)
        ));
        assert!(matches!(parse(b""), Attempt::Error(_)));
        assert!(matches!(parse(b"garbage"), Attempt::Error(_)));
    }

    #[test]
    fn requests_close_their_connection() {
        let delivery = Delivery::new(
            Request::post("/hooks?a=1")
                .header("x-id", "1")
                .header("content-length", "99")
                .body("abc")
                .unwrap(),
        );
        let bytes = request_bytes(&delivery, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "POST /hooks?a=1 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nx-id: 1\r\n\
             content-length: 3\r\nconnection: close\r\n\r\nabc"
        );
    }
}
