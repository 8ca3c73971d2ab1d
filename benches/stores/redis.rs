//! The Redis rows: the layer over `RedisStore` against the usual hand-written Redis in the
//! handler (`SET key 1 NX PX ttl`; a duplicate if nothing was set; else the work, then
//! `SET key done PX ttl`), each on a multiplexed connection of its own to the same server, made
//! alike (the connection manager, 5 s timeouts, as `RedisStore::connect` makes it).
//!
//! The server is `REDIS_URL` (default `redis://127.0.0.1:6379`). Every key of a run is under
//! a prefix of its own and lives [`TTL`], so that a shared server forgets the bench's keys soon
//! after it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use criterion::Criterion;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Empty;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tower::service_fn;
use tower_idempotency::IdempotencyKey;
use tower_idempotency::store::{RedisStore, Stale, Store};

use super::{
    DUP_KEYS, NAMESPACE, PATH, Report, Req, Shell, Side, answer_times, event_id, fixed_count, keys,
    work,
};

/// How long the bench's keys live (the store's retention, the baseline's `PX`).
const TTL: Duration = Duration::from_secs(15 * 60);

/// What the Redis rows run on: the store, and the baseline's connection and key prefix.
pub(crate) struct Redis {
    store: RedisStore,
    conn: ConnectionManager,
    seed: Arc<str>,
}

fn info() -> Result<ConnectionInfo, String> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    url.into_connection_info().map_err(|e| e.to_string())
}

/// A connection as `RedisStore::connect` makes its own.
async fn connection(info: ConnectionInfo) -> Result<ConnectionManager, String> {
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| e.to_string())
}

/// The store and the baseline on connections made from `info`, each under a prefix of this
/// run, with [`DUP_KEYS`] done keys each for the duplicates.
async fn open(info: ConnectionInfo, run: &str) -> Result<Redis, String> {
    let store_conn = connection(info.clone()).await?;
    let conn = connection(info).await?;
    let pid = std::process::id();
    let store = RedisStore::new(store_conn)
        .with_prefix(format!("bench-{run}-{pid}"))
        .map_err(|e| e.to_string())?
        .with_retention(TTL);
    let redis = Redis {
        store,
        conn,
        seed: format!("bench-seed-{run}-{pid}").into(),
    };
    redis.fill().await?;
    Ok(redis)
}

/// The Redis of `REDIS_URL`, or `None` (and a line saying so) if it cannot be reached.
pub(crate) async fn connect() -> Option<Redis> {
    match async { open(info()?, "redis").await }.await {
        Ok(redis) => Some(redis),
        Err(error) => {
            println!("SKIPPED: REDIS_URL unreachable ({error})");
            None
        }
    }
}

impl Redis {
    /// Deletes the keys this run wrote, the store's and the baseline's.
    async fn forget(&self) -> Result<(), String> {
        let mut conn = self.conn.clone();
        let pattern = format!("bench-*-{}:*", std::process::id());
        let mut cursor = 0_u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if !keys.is_empty() {
                let _unlinked: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The done keys the duplicates cycle through, `dup-0`…: committed through the store, and
    /// set to `done` for the baseline.
    async fn fill(&self) -> Result<(), String> {
        let ttl = ttl_ms();
        for chunk in (0..DUP_KEYS).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("SET")
                    .arg(format!("{}:{NAMESPACE}:dup-{i}", self.seed))
                    .arg("done")
                    .arg("PX")
                    .arg(ttl)
                    .ignore();
            }
            pipe.query_async::<()>(&mut self.conn.clone())
                .await
                .map_err(|e| e.to_string())?;
        }
        let mut filling = tokio::task::JoinSet::new();
        for task in 0..64 {
            let store = self.store.clone();
            filling.spawn(async move {
                for i in (task..DUP_KEYS).step_by(64) {
                    let key = IdempotencyKey::new(NAMESPACE, format!("dup-{i}")).expect("key");
                    match store.claim(&key, Stale::default()).await {
                        Ok(tower_idempotency::store::Claim::Acquired(lease)) => {
                            store.commit(&lease).await.map_err(|e| e.to_string())?
                        }
                        Ok(_) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Ok(())
            });
        }
        while let Some(done) = filling.join_next().await {
            done.map_err(|e| e.to_string())??;
        }
        Ok(())
    }
}

fn ttl_ms() -> u64 {
    TTL.as_millis() as u64
}

/// The usual hand-written Redis in the handler: `SET key 1 NX PX ttl`, 200 to a duplicate
/// (nothing set), else the work, then `SET key done PX ttl`.
async fn answer(mut conn: ConnectionManager, prefix: &str, id: &str) -> StatusCode {
    let key = format!("{prefix}:{NAMESPACE}:{id}");
    let claimed: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms())
        .query_async(&mut conn)
        .await;
    match claimed {
        Ok(Some(_)) => {}
        Ok(None) => return StatusCode::OK,
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
    }
    work().await;
    let done: redis::RedisResult<()> = redis::cmd("SET")
        .arg(&key)
        .arg("done")
        .arg("PX")
        .arg(ttl_ms())
        .query_async(&mut conn)
        .await;
    match done {
        Ok(()) => StatusCode::OK,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn baseline_handler(
    State((conn, prefix)): State<(ConnectionManager, Arc<str>)>,
    headers: HeaderMap,
) -> StatusCode {
    answer(conn, &prefix, event_id(&headers)).await
}

impl Redis {
    /// The hand-written baseline, or with `BENCH_BASELINE=store` the store called by hand,
    /// then the layer: the sides of the Redis rows.
    fn sides(&self) -> Vec<Side> {
        let shell = Shell::from_env();
        let layer = shell.layer("layer", self.store.clone());
        let base = if std::env::var("BENCH_BASELINE").is_ok_and(|v| v == "store") {
            shell.by_hand(self.store.clone())
        } else {
            let state = (self.conn.clone(), self.seed.clone());
            match shell {
                Shell::Router => Side::new(
                    "baseline",
                    true,
                    Router::new()
                        .route(PATH, post(baseline_handler))
                        .with_state(state),
                ),
                Shell::Tower => Side::new(
                    "baseline",
                    true,
                    service_fn(move |req: Req| {
                        let (conn, prefix) = state.clone();
                        async move {
                            let mut res = Response::new(Empty::<Bytes>::new());
                            *res.status_mut() =
                                answer(conn, &prefix, event_id(req.headers())).await;
                            Ok::<_, Infallible>(res)
                        }
                    }),
                ),
            }
        };
        vec![base, layer]
    }
}

/// Throughput and answer times of the baseline and the layer, new events and duplicates, at
/// each concurrency, as the SQL rows.
pub(crate) fn throughput(c: &mut Criterion, rt: &Runtime, redis: &Redis, report: &mut Report) {
    let sides = redis.sides();
    super::throughput(c, rt, "redis", &sides, report);
    answer_times(rt, "redis", &sides, report);
    // A shared server's `SCAN` walks every key it holds: the store's maintenance calls (and
    // their tests) should not walk this run's for the next quarter of an hour.
    if let Err(error) = rt.block_on(redis.forget()) {
        println!("redis: this run's keys are left to expire ({error})");
    }
}

/// Requests per delivery (each a round trip: one delivery at a time), for the baseline and
/// the layer, new events and duplicates, counted in the bytes the client sends, at a proxy
/// between it and the server: `"{path}/{baseline|layer}"`.
pub(crate) async fn round_trips() -> Option<BTreeMap<String, f64>> {
    let info = info().ok()?;
    let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        println!("Redis round trips: skipped, REDIS_URL is no TCP address");
        return None;
    };
    let (proxy, requests) = counting_proxy((host, port)).await.ok()?;
    let proxied = info.set_addr(ConnectionAddr::Tcp(proxy.ip().to_string(), proxy.port()));
    let redis = match open(proxied, "redis-count").await {
        Ok(redis) => redis,
        Err(error) => {
            println!("Redis round trips: skipped ({error})");
            return None;
        }
    };
    let n = fixed_count();
    let mut out = BTreeMap::new();
    for side in redis.sides() {
        let which = if side.baseline { "baseline" } else { "layer" };
        for path in ["new", "duplicate"] {
            // Warm up: the first call of each script loads it.
            side.run(1, 5, keys(path), false).await;
            let before = requests.load(Ordering::SeqCst);
            side.run(1, n, keys(path), false).await;
            let sent = requests.load(Ordering::SeqCst) - before;
            out.insert(format!("{path}/{which}"), sent as f64 / n as f64);
        }
    }
    let _ = redis.forget().await;
    Some(out)
}

/// A TCP proxy on loopback to `upstream` that counts the commands clients send through it.
async fn counting_proxy(upstream: (String, u16)) -> std::io::Result<(SocketAddr, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect((upstream.0.as_str(), upstream.1)).await else {
                continue;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut commands = Commands::default();
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    counted.fetch_add(commands.feed(&buf[..n]), Ordering::SeqCst);
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok((addr, count))
}

/// Counts the commands in a client's byte stream: RESP arrays of bulk strings (an inline
/// command, one line, counts as one).
#[derive(Default)]
struct Commands {
    /// The header line read so far.
    line: Vec<u8>,
    /// Bulk strings left in the current command.
    items: i64,
    /// Bytes left of the current bulk string, its CRLF included.
    skip: usize,
}

impl Commands {
    /// Reads `bytes`; answers how many commands ended in them.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        let mut ended = 0;
        let mut at = 0;
        while at < bytes.len() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len() - at);
                (self.skip, at) = (self.skip - n, at + n);
                if self.skip == 0 {
                    self.items -= 1;
                    ended += u64::from(self.items == 0);
                }
                continue;
            }
            let byte = bytes[at];
            at += 1;
            self.line.push(byte);
            if byte != b'\n' {
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let text = String::from_utf8_lossy(&line);
            let number = || text[1..].trim().parse::<i64>().unwrap_or(0);
            match line.first() {
                Some(b'*') if number() > 0 => self.items = number(),
                Some(b'$') => self.skip = usize::try_from(number()).unwrap_or(0) + 2,
                _ => ended += 1,
            }
        }
        ended
    }
}
