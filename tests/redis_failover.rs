//! `RedisStore` on a Redis Cluster that loses a node while deliveries run.
//!
//! Each test starts a cluster of its own (six `redis-server` processes on free loopback ports
//! from 7101 and from 7201, three masters with one replica each, a node timeout of two
//! seconds so that a failover takes a few), so the cluster the other tests share is never
//! disturbed; dropping the test's [`Cluster`], a panic included, kills every node it started
//! by PID. Without `redis-server` and `redis-cli` the tests are skipped, or fail when `CI` is
//! set.
//!
//! - [`a_master_dies_mid_run`]: eight tasks deliver events, each event three times at once,
//!   through `IdempotencyLayer`; one master is killed (`SIGKILL`) in the middle, deliveries go
//!   on until its replica has taken over, then every event is delivered again until it is
//!   acknowledged. Every answer is 200, 409 or 503; no handler runs without a claim on its
//!   event; no event is lost; an event runs twice only where the store's docs say a failover
//!   can make it ("What a failure can lose": a write the dead master acknowledged and had not
//!   replicated), so only for keys in the dead master's slots, and only a few.
//! - [`a_claim_whose_answer_was_lost_is_given_back`]: on a server of its own, a claim script
//!   that runs after the client stopped waiting for it is given back once the server answers.
//! - [`waiting_for_replicas_fails_without_a_live_replica`]: with `wait_for_replicas(1, ..)`,
//!   a claim on a master whose replica was killed is an error, answered 503, and the handler
//!   does not run; a master with its replica still answers as usual.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::store::RedisStore;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, LeaseHandle, Stale, key};

/// Delivering tasks, and how often each event is delivered at once.
const TASKS: u64 = 8;
const COPIES: u64 = 3;
/// The namespace of the layer's key; the route is `/hook` (see [`common::delivery`]).
const NAMESPACE: &str = "test";
/// Longer than a failover takes, so that a live claim whose heartbeats failed while the slot
/// had no master is not taken over for that alone.
const STALE: Duration = Duration::from_secs(10);
/// At most this many events may run twice: a write is lost only if the dead master had
/// acknowledged it and not yet sent it to its replica, and each task has one write in flight
/// at a time (two per task leaves room for a replica lagging on a busy machine).
const MAX_DOUBLE_RUNS: usize = 2 * TASKS as usize;

// ---------------------------------------------------------------------------------------
// The test's own cluster

/// One node: its port, and its process until it is killed.
struct Node {
    port: u16,
    process: Option<Child>,
}

/// A Redis Cluster of the test's own, in a temporary directory. Dropped, it kills every node
/// it started (by PID) and removes the directory.
struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

/// A node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
struct NodeInfo {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master a replica follows.
    follows: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| (first..=last).contains(&slot))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut process) = node.process.take() {
                let _ = process.kill();
                let _ = process.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `redis-server` and `redis-cli` can be run; if not, the test is skipped (with a
/// line on stderr), or fails under `CI`.
fn tools_present(test: &str) -> bool {
    let missing: Vec<&str> = ["redis-server", "redis-cli"]
        .into_iter()
        .filter(|tool| {
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {missing:?} not found; CI is set, so this fails instead of skipping");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {test}: {missing:?} not found (install Redis to run it)"
    );
    false
}

/// Six consecutive loopback ports from `from` on (by tens), each free, with its cluster bus
/// port (`port + 10000`).
fn free_ports(from: u16) -> Vec<u16> {
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    (0..9)
        .map(|i| from + 10 * i)
        .map(|base| (base..base + 6).collect::<Vec<u16>>())
        .find(|ports| ports.iter().all(|&p| free(p) && free(p + 10000)))
        .unwrap_or_else(|| panic!("no six free ports from {from} on"))
}

/// `redis-cli -p port args…`: its output, or `None` when the node does not answer.
async fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// Writes `text` to stderr in one piece, past the test harness's capture, so that what a test
/// measured shows in every run, passed or not.
fn report(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Waits until `ready` answers true, checking every 100 ms; panics after `limit`.
async fn until<F, Fut>(what: &str, limit: Duration, mut ready: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !ready().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

impl Cluster {
    /// Starts six nodes on free ports from `from`, makes them a cluster of three masters with
    /// one replica each, and waits until every node has every slot served and every replica
    /// is in sync.
    async fn start(from: u16) -> Self {
        let ports = free_ports(from);
        let dir = std::env::temp_dir().join(format!(
            "tower-idempotency-failover-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir).expect("the cluster's directory");
        // The guard first: nodes started before a panic below are killed too.
        let mut cluster = Self {
            dir,
            nodes: Vec::new(),
        };
        for &port in &ports {
            let process = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&cluster.dir)
                .args(["--logfile", &format!("{port}.log")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            cluster.nodes.push(Node {
                port,
                process: Some(process),
            });
        }
        for &port in &ports {
            until(
                &format!("redis-server on {port}"),
                Duration::from_secs(10),
                || async move {
                    cli(port, &["ping"])
                        .await
                        .is_some_and(|r| r.trim() == "PONG")
                },
            )
            .await;
        }
        let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = tokio::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        until("the cluster", Duration::from_secs(30), || {
            cluster.healthy(6)
        })
        .await;
        cluster
    }

    /// The ports of the nodes still running.
    fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.process.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Every live node says `cluster_state:ok`, sees `known` nodes and all slots served, and
    /// every live replica is in sync with its master.
    async fn healthy(&self, known: usize) -> bool {
        for port in self.live() {
            let Some(info) = cli(port, &["cluster", "info"]).await else {
                return false;
            };
            let has = |line: &str| info.lines().any(|l| l.trim() == line);
            if !has("cluster_state:ok")
                || !has("cluster_slots_ok:16384")
                || !has(&format!("cluster_known_nodes:{known}"))
            {
                return false;
            }
            let Some(replication) = cli(port, &["info", "replication"]).await else {
                return false;
            };
            let line = |l: &str| replication.lines().any(|r| r.trim() == l);
            if line("role:slave") && !line("master_link_status:up") {
                return false;
            }
        }
        true
    }

    /// The cluster as a live node sees it.
    async fn topology(&self) -> Vec<NodeInfo> {
        for port in self.live() {
            if let Some(text) = cli(port, &["cluster", "nodes"]).await {
                return parse_nodes(&text);
            }
        }
        panic!("no node answers CLUSTER NODES");
    }

    /// Kills the node on `port` with `SIGKILL`, as a crash would; answers its PID.
    fn kill(&mut self, port: u16) -> u32 {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the cluster");
        let mut process = node.process.take().expect("a live node");
        let pid = process.id();
        process.kill().expect("kill -9");
        process.wait().expect("the node exits");
        pid
    }

    /// The cluster slot of the Redis key `key`, as a live node computes it.
    async fn slot(&self, key: &str) -> u16 {
        let port = self.live()[0];
        cli(port, &["cluster", "keyslot", key])
            .await
            .and_then(|r| r.trim().parse().ok())
            .expect("CLUSTER KEYSLOT")
    }

    /// A store on the cluster, connected through every node.
    async fn store(&self) -> RedisStore {
        let urls: Vec<String> = self
            .live()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        RedisStore::connect_cluster(urls)
            .await
            .expect("the test's cluster answers")
    }
}

/// `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link>
/// <slot> <slot>…`.
fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let address = fields[1].split(['@', ',']).next()?;
            let port = address.rsplit_once(':')?.1.parse().ok()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|one| (one, one)),
                })
                .collect();
            Some(NodeInfo {
                id: fields[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failed: flags.iter().any(|f| f.starts_with("fail")),
                follows: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Deliveries

/// The Redis key the store keeps event `id` under, as its docs lay it out:
/// `<prefix>:k:<namespace length>:<namespace>:<key>`, the namespace being the layer's (no
/// router reports a route here, so the namespace alone).
fn redis_key(id: &str) -> String {
    let key = IdempotencyKey::new(NAMESPACE, id).expect("a valid key");
    let ns = key.namespace();
    format!(
        "{}:k:{}:{ns}:{}",
        tower_idempotency::store::redis::DEFAULT_PREFIX,
        ns.len(),
        key.value()
    )
}

/// What the handler saw: runs per event, and runs without a claim on their own event.
#[derive(Default)]
struct Runs {
    per_event: Mutex<HashMap<String, u32>>,
    unclaimed: AtomicUsize,
}

impl Runs {
    fn of(&self, id: &str) -> u32 {
        self.per_event.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

/// The layer over a handler that counts its runs per event, and checks that each run holds a
/// claim on its own event.
fn service(
    store: RedisStore,
    runs: Arc<Runs>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(NAMESPACE))
        .stale(Stale::reclaim_after(STALE))
        .store_timeout(Duration::from_secs(2))
        .layer(service_fn(move |req: Request<_>| {
            let runs = runs.clone();
            async move {
                let id = req
                    .headers()
                    .get("x-event-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let claimed = req
                    .extensions()
                    .get::<LeaseHandle>()
                    .is_some_and(|handle| handle.lease().key().value() == id);
                if !claimed {
                    runs.unclaimed.fetch_add(1, Ordering::SeqCst);
                }
                *runs.per_event.lock().unwrap().entry(id).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }))
}

fn event(n: u64) -> String {
    format!("evt-{n}")
}

/// The stages of the run, for the tally of answers.
const BEFORE: u8 = 0;
const FAILOVER: u8 = 1;
const AFTER: u8 = 2;
const RETRIES: u8 = 3;
const REPLAY: u8 = 4;
const STAGES: [&str; 5] = [
    "before the kill",
    "during the failover",
    "after the failover",
    "retrying the unacknowledged",
    "delivering every event once more",
];

/// Answers by stage and status, and the events acknowledged with a 200.
#[derive(Default)]
struct Tally {
    answers: Mutex<BTreeMap<(u8, u16), u64>>,
    acked: Mutex<HashSet<String>>,
}

impl Tally {
    fn note(&self, stage: u8, id: &str, status: StatusCode) {
        *self
            .answers
            .lock()
            .unwrap()
            .entry((stage, status.as_u16()))
            .or_default() += 1;
        if status == StatusCode::OK {
            self.acked.lock().unwrap().insert(id.to_owned());
        }
    }
}

/// Delivers each of `ids` again and again, `TASKS` at a time, until each was answered 200 by
/// one of these deliveries, as a sender retries; answers how long that took. Fails after
/// several stale limits.
async fn acknowledge<S, B>(svc: &S, tally: &Arc<Tally>, stage: u8, ids: Vec<String>) -> Duration
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    let start = Instant::now();
    let mut left = ids;
    while !left.is_empty() {
        assert!(
            start.elapsed() < STALE * 6,
            "{} events still unacknowledged after {:?}: {:?}",
            left.len(),
            start.elapsed(),
            &left[..left.len().min(20)]
        );
        let mut unacked = Vec::new();
        for chunk in left.chunks(TASKS as usize) {
            let mut batch = tokio::task::JoinSet::new();
            for id in chunk {
                let (svc, tally, id) = (svc.clone(), tally.clone(), id.clone());
                batch.spawn(async move {
                    let res = svc.oneshot(common::delivery(&id)).await.unwrap();
                    tally.note(stage, &id, res.status());
                    (id, res.status())
                });
            }
            while let Some(done) = batch.join_next().await {
                let (id, status) = done.expect("a delivery");
                if status != StatusCode::OK {
                    unacked.push(id);
                }
            }
        }
        left = unacked;
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    start.elapsed()
}

// ---------------------------------------------------------------------------------------
// The tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_dies_mid_run() {
    if !tools_present("a_master_dies_mid_run") {
        return;
    }
    let mut cluster = Cluster::start(7101).await;
    let runs = Arc::new(Runs::default());
    let svc = service(cluster.store().await, runs.clone());
    let tally = Arc::new(Tally::default());
    let stage = Arc::new(AtomicU8::new(BEFORE));
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // Each position is one delivery; three positions in a row are one event, so its copies
    // go out at once from different tasks.
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (svc, tally, stage, next, stop) = (
            svc.clone(),
            tally.clone(),
            stage.clone(),
            next.clone(),
            stop.clone(),
        );
        senders.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let id = event(next.fetch_add(1, Ordering::SeqCst) / COPIES);
                let res = svc.clone().oneshot(common::delivery(&id)).await.unwrap();
                tally.note(stage.load(Ordering::SeqCst), &id, res.status());
            }
        });
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = cluster.topology().await;
    let victim = before
        .iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .min_by_key(|n| n.port)
        .cloned()
        .expect("a master");
    let heir = before
        .iter()
        .find(|n| n.follows.as_deref() == Some(victim.id.as_str()))
        .cloned()
        .expect("the master's replica");
    stage.store(FAILOVER, Ordering::SeqCst);
    let delivered_before = next.load(Ordering::SeqCst);
    let pid = cluster.kill(victim.port);
    // Deliveries go on while the replica is promoted.
    let promoted = until("the failover", Duration::from_secs(60), || async {
        let nodes = cluster.topology().await;
        let heir_now = nodes.iter().find(|n| n.id == heir.id);
        heir_now.is_some_and(|n| n.master && !n.failed && n.serves(victim.slots[0].0))
            && nodes.iter().any(|n| n.id == victim.id && n.failed)
            && cluster.healthy(6).await
    })
    .await;
    stage.store(AFTER, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    while let Some(done) = senders.join_next().await {
        done.expect("a sender");
    }
    let positions = next.load(Ordering::SeqCst);
    let events = positions.div_ceil(COPIES);

    // Every event not acknowledged yet is delivered again until it is, as a sender retries.
    let unacked: Vec<String> = {
        let acked = tally.acked.lock().unwrap();
        (0..events)
            .map(event)
            .filter(|id| !acked.contains(id))
            .collect()
    };
    let retried = unacked.len();
    let retrying = acknowledge(&svc, &tally, RETRIES, unacked).await;
    // Then every event once more (a sender that lost the 200, a replay from its dashboard):
    // an event whose done marker the failover lost runs again here.
    let replaying = acknowledge(&svc, &tally, REPLAY, (0..events).map(event).collect()).await;

    let answers = tally.answers.lock().unwrap().clone();
    let mut doubles = Vec::new();
    for n in 0..events {
        let id = event(n);
        let ran = runs.of(&id);
        assert!(ran >= 1, "{id} was acknowledged and never ran");
        if ran > 1 {
            let key = redis_key(&id);
            doubles.push((id, ran, cluster.slot(&key).await));
        }
    }
    let mut text = format!(
        "failover: {events} events in {positions} deliveries ({delivered_before} before the \
         kill); master 127.0.0.1:{} (PID {pid}, slots {:?}) killed, replica 127.0.0.1:{} \
         serving its slots {promoted:.1?} later; the {retried} events not yet acknowledged \
         were within {retrying:.1?} of retries, and every event delivered once more within \
         {replaying:.1?}",
        victim.port, victim.slots, heir.port,
    );
    for (stage, name) in STAGES.iter().enumerate() {
        let seen: Vec<String> = answers
            .iter()
            .filter(|((s, _), _)| usize::from(*s) == stage)
            .map(|((_, status), count)| format!("{status}: {count}"))
            .collect();
        text += &format!("\n  answers {name}: {}", seen.join(", "));
    }
    text += &format!(
        "\n  double runs: {} of {events} events {doubles:?} (event, runs, slot)\n",
        doubles.len()
    );
    report(&text);

    for &(_, status) in answers.keys() {
        assert!(
            [200, 409, 503].contains(&status),
            "an answer other than 200, 409 or 503: {answers:?}"
        );
    }
    assert_eq!(
        runs.unclaimed.load(Ordering::SeqCst),
        0,
        "a handler ran without a claim on its event"
    );
    for (id, _, slot) in &doubles {
        assert!(
            victim.serves(*slot),
            "{id} ran twice, and its slot {slot} was not the dead master's {:?}",
            victim.slots
        );
    }
    assert!(
        doubles.len() <= MAX_DOUBLE_RUNS,
        "{} events ran twice, more than the writes a failover can lose",
        doubles.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_fails_without_a_live_replica() {
    if !tools_present("waiting_for_replicas_fails_without_a_live_replica") {
        return;
    }
    let mut cluster = Cluster::start(7201).await;
    let store = cluster
        .store()
        .await
        // Well inside the 2 s store timeout, and long enough for a loaded machine's replica.
        .wait_for_replicas(1, Duration::from_millis(1500));
    let runs = Arc::new(Runs::default());
    let svc = service(store, runs.clone());

    let nodes = cluster.topology().await;
    let mut masters: Vec<NodeInfo> = nodes
        .iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .cloned()
        .collect();
    masters.sort_by_key(|n| n.port);
    let (alone, paired) = (&masters[0], &masters[1]);
    let replica = nodes
        .iter()
        .find(|n| n.follows.as_deref() == Some(alone.id.as_str()))
        .expect("the master's replica");
    // Events whose keys fall in each master's slots.
    let mut on_alone = Vec::new();
    let mut on_paired = Vec::new();
    for n in 0.. {
        if on_alone.len() >= 2 && !on_paired.is_empty() {
            break;
        }
        let id = event(n);
        let slot = cluster.slot(&redis_key(&id)).await;
        if alone.serves(slot) {
            on_alone.push(id);
        } else if paired.serves(slot) {
            on_paired.push(id);
        }
    }
    let answer = |id: String| {
        let svc = svc.clone();
        async move { svc.oneshot(common::delivery(&id)).await.unwrap() }
    };

    // With its replica, a master takes claims and commits as usual.
    let res = answer(on_alone[0].clone()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(runs.of(&on_alone[0]), 1);

    cluster.kill(replica.port);
    until(
        "the master to see its replica gone",
        Duration::from_secs(10),
        || async {
            cli(alone.port, &["info", "replication"])
                .await
                .is_some_and(|info| info.lines().any(|l| l.trim() == "connected_slaves:0"))
        },
    )
    .await;

    // Its next claim is written, but no replica confirms it: an error, 503, no run.
    let res = answer(on_alone[1].clone()).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(runs.of(&on_alone[1]), 0, "no run on an unconfirmed claim");
    // Its sender's retry finds that claim in flight: it does not run either.
    let again = answer(on_alone[1].clone()).await;
    assert!(
        [StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE].contains(&again.status()),
        "{:?}",
        again.status()
    );
    assert_eq!(runs.of(&on_alone[1]), 0);
    // A done key needs no write: its duplicate is answered as usual.
    let res = answer(on_alone[0].clone()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(runs.of(&on_alone[0]), 1);

    // A master that still has its replica goes on as usual.
    let res = answer(on_paired[0].clone()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(runs.of(&on_paired[0]), 1);
    report(&format!(
        "wait_for_replicas(1): 127.0.0.1:{} without its replica answered 503 to {}, then {}; \
         127.0.0.1:{} with its replica 200\n",
        alone.port,
        on_alone[1],
        again.status().as_u16(),
        paired.port
    ));
}

/// A claim whose answer is lost: the server runs the claim script, but only after the client
/// stopped waiting for it (a response timeout, here forced by pausing the server's writes for
/// longer than the client waits). The claim lands with a token nobody holds; the store gives
/// it back once the server answers again, its run taken back, so that the sender's retry runs
/// the handler instead of meeting a claim nobody will settle. On a server of the test's own,
/// since the pause stops every client's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_given_back() {
    use tower_idempotency::store::{Claim, KeyState, Store};

    if !tools_present("a_claim_whose_answer_was_lost_is_given_back") {
        return;
    }
    let port = free_ports(7301)[0];
    let dir = std::env::temp_dir().join(format!("tower-idempotency-lost-{port}"));
    std::fs::create_dir_all(&dir).expect("the server's directory");
    let process = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    // Killed and cleaned up whatever happens below.
    let _server = Cluster {
        dir,
        nodes: vec![Node {
            port,
            process: Some(process),
        }],
    };
    until(
        &format!("redis-server on {port}"),
        Duration::from_secs(10),
        || async move {
            cli(port, &["ping"])
                .await
                .is_some_and(|r| r.trim() == "PONG")
        },
    )
    .await;
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).unwrap();
    let impatient = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(100)));
    let conn = redis::aio::ConnectionManager::new_with_config(client, impatient)
        .await
        .expect("connects");
    let store = RedisStore::new(conn);
    let patient = RedisStore::connect(&url).await.expect("connects");
    let key = IdempotencyKey::new(NAMESPACE, "evt_lost").unwrap();
    // The server learns the scripts first: a script it does not know would come back
    // `NOSCRIPT` after the pause, not run.
    let warm = IdempotencyKey::new(NAMESPACE, "evt_warm").unwrap();
    let Claim::Acquired(lease) = store.claim(&warm, Stale::default()).await.unwrap() else {
        panic!("a new key");
    };
    store.give_back(&lease).await.unwrap();

    // Writes (scripts among them) wait 700 ms; the client gives up after 100.
    let paused = cli(port, &["client", "pause", "700", "write"]).await;
    assert_eq!(paused.as_deref().map(str::trim), Some("OK"));
    let claim = store.claim(&key, Stale::default()).await;
    assert!(claim.is_err(), "the answer was lost: {claim:?}");

    // The script ran once the pause ended; then the claim was given back.
    until("the lost claim given back", Duration::from_secs(10), || {
        let (patient, key) = (patient.clone(), key.clone());
        async move {
            patient
                .describe(&key)
                .await
                .ok()
                .flatten()
                .is_some_and(|r| r.state == KeyState::Released)
        }
    })
    .await;
    let record = patient.describe(&key).await.unwrap().unwrap();
    assert_eq!(
        (record.deliveries, record.runs),
        (1, 0),
        "no handler ran, so no run is counted"
    );
    assert!(matches!(
        patient.claim(&key, Stale::default()).await.unwrap(),
        Claim::Acquired(_)
    ));
}
