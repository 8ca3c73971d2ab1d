//! What the test binaries share: connections, namespaces, small stores and services, and the
//! contract every backend keeps, written once.
//!
//! A backend's test file (`tests/store_<backend>.rs`) runs the whole contract with one
//! [`backend_suite!`](crate::backend_suite) (in `suite.rs`). The checks of the `Store` contract
//! are the crate's public conformance suite (`tower_idempotency::conformance`, feature
//! `conformance`), the same a store of another crate runs; the helpers below that it holds
//! (`key_in`, `unique_namespace`, `acquire`, the stale settings, `SHARED_TABLE`) are
//! re-exported here. The other arms, which need the HTTP layer's harness or a SQL database,
//! are files here: `trust.rs`, `versions.rs`, and for SQL backends `advance.rs`,
//! `transactional.rs`, `sql_store.rs` (with the statements of `sql.rs`) and `tables.rs`.
//!
//! A store maker (`$make`) yields `Option<S>`: `None` when the backend's database cannot be
//! reached and the test is skipped (see [`connect`]; under `CI` it panics instead).
//!
//! Each test works in a namespace of its own, so backends that share one database between
//! tests (and between runs) need no cleaning.

#![allow(dead_code, unreachable_pub)]

pub mod advance;
pub mod db;
pub mod hot_path;
pub mod inbox;
pub mod proxy;
pub mod receipts;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod sql;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod sql_store;
pub mod suite;
pub mod tables;
pub mod transactional;
pub mod trust;
pub mod versions;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::store::{Claim, KeyState, Lease, Resolution, Store, StoreError};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

/// The database URL in the environment variable `var`, or `default`.
pub fn database_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Connects with `connect` to the database at `url` (from the environment variable `var`).
/// If it cannot be reached, the test fails under `CI` and is skipped (loudly) otherwise; after
/// one failure the other tests of the binary do not wait for the connect timeout again.
pub async fn connect<T, E: std::fmt::Display>(
    var: &str,
    url: &str,
    connect: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    static UNREACHABLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let err = match UNREACHABLE.get() {
        Some(err) => err.clone(),
        None => match connect.await {
            Ok(pool) => return Some(pool),
            Err(err) => UNREACHABLE.get_or_init(|| err.to_string()).clone(),
        },
    };
    if std::env::var_os("CI").is_some() {
        panic!(
            "{var}={url} cannot be reached ({err}); CI is set, so this fails instead of skipping"
        );
    }
    // Straight to stderr, not `eprintln!`, which the test harness captures for passing tests.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {var}={url} cannot be reached ({err}); set {var} to a reachable database"
    );
    None
}

/// A `RedisStore` on a connection of its own, at `REDIS_URL` (default the local server).
#[cfg(feature = "redis")]
pub async fn redis_store() -> Option<tower_idempotency::store::RedisStore> {
    let url = database_url("REDIS_URL", "redis://127.0.0.1:6379");
    let store = tower_idempotency::store::RedisStore::connect(&url);
    Some(
        connect("REDIS_URL", &url, store)
            .await?
            .with_prefix("tower-idempotency-test")
            .expect("prefix"),
    )
}

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use tower_idempotency::conformance::{
    LONG, PAST_SHORT, SHARED_TABLE, SHORT, acquire, key_in, unique_namespace,
};

/// A webhook handler that counts its runs per event id and sleeps a little, so concurrent
/// deliveries overlap.
pub fn counting_layer_service<St>(
    layer: IdempotencyLayer<St, key::Header>,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static
where
    St: Store + Clone,
{
    layer.layer(service_fn(move |_req| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    }))
}

pub fn delivery(id: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", id)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The problem+json body of a response the layer answered by itself: its content type is
/// `application/problem+json`, and its body a JSON object.
pub async fn problem<B>(res: Response<B>) -> serde_json::Value
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt as _;
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// A store whose backend is gone (a closed pool): a claim fails with a backend error that keeps
/// its source, and the layer answers 503 without running the handler.
pub async fn store_down_is_503<St: Store + Clone>(store: St) -> StoreError {
    let ns = unique_namespace("down");
    let err = store.claim(&key_in(&ns, "evt_1"), LONG).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the backend error is kept as the source"
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns));
    let svc = counting_layer_service(layer, runs.clone());
    let res = svc.oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler never runs unguarded"
    );
    err
}

/// After `migrate()` upgraded a table of the first release holding two rows of namespace `ns`
/// (`done`: done with 3 deliveries; `processing`: claimed an hour ago, never renewed), the rows
/// are all there and behave as they should, and the new states are accepted.
pub async fn upgraded_table_keeps_its_rows<S: Store>(store: S, ns: &str) {
    let done = key_in(ns, "done");
    let record = store
        .describe(&done)
        .await
        .unwrap()
        .expect("the done row was kept");
    assert_eq!(record.state, KeyState::Done);
    assert_eq!((record.deliveries, record.runs), (3, 1));
    assert!(
        record.first_seen_ago >= Duration::from_secs(3500),
        "{record:?}"
    );
    match store.claim(&done, LONG).await.unwrap() {
        Claim::Done(done) => assert_eq!(done.deliveries, 4),
        other => panic!("expected done, got {other:?}"),
    }

    let processing = key_in(ns, "processing");
    let record = store.describe(&processing).await.unwrap().unwrap();
    assert_eq!(record.state, KeyState::Processing);
    assert!(
        record.renewed_ago.unwrap() >= Duration::from_secs(3500),
        "{record:?}"
    );
    let stuck = store.stuck_claims(Duration::from_secs(600)).await.unwrap();
    assert!(stuck.iter().any(|s| s.key == processing), "{stuck:?}");
    // Not renewed for an hour: stale under a ten-minute limit.
    let lease = acquire(&store, &processing, LONG).await;
    assert!(lease.reclaimed());
    store.renew(&lease).await.unwrap();
    store.release(&lease).await.unwrap();
    assert_eq!(
        store.describe(&processing).await.unwrap().unwrap().state,
        KeyState::Released,
        "the upgraded table accepts `released`"
    );
    let lease = acquire(&store, &processing, LONG).await;
    store.commit(&lease).await.unwrap();
    let record = store.describe(&processing).await.unwrap().unwrap();
    assert_eq!((record.state, record.runs), (KeyState::Done, 3));
}

/// A store that counts every call before passing it on: a test of what happens *before* the
/// claim asserts that the count stays zero.
#[derive(Clone)]
pub struct Counting<S> {
    pub inner: S,
    pub calls: Arc<AtomicUsize>,
}

impl<S> Counting<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl<S: Store> Store for Counting<S> {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        self.count();
        self.inner.claim(key, stale).await
    }
    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.renew(lease).await
    }
    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.commit(lease).await
    }
    async fn commit_with(
        &self,
        lease: &Lease,
        receipt: &tower_idempotency::store::Receipt,
    ) -> Result<(), StoreError> {
        self.count();
        self.inner.commit_with(lease, receipt).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.release(lease).await
    }
    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.count();
        self.inner.give_back(lease).await
    }
    async fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<tower_idempotency::store::KeyRecord>, StoreError> {
        self.count();
        self.inner.describe(key).await
    }
    async fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> Result<Vec<tower_idempotency::store::StuckClaim>, StoreError> {
        self.count();
        self.inner.stuck_claims(older_than).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.resolve(key, resolution).await
    }
    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge_completed(older_than).await
    }
}

/// A Stripe-shaped delivery of event `id` to `path`, signed with `secret` (no signature when
/// `None`) at the current time.
#[cfg(feature = "verify")]
pub fn stripe_delivery(path: &str, id: &str, secret: Option<&str>) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"id":"{id}","object":"event","type":"invoice.paid"}}"#);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = match secret {
        Some(secret) => stripe_v1(secret, now, body.as_bytes()),
        None => "0".repeat(64),
    };
    Request::post(path)
        .header("content-type", "application/json")
        .header("stripe-signature", format!("t={now},v1={signature}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// The hex `v1` signature Stripe would send: HMAC-SHA256 of `<t>.<body>`, computed here with
/// the same RFC 2104 construction as any HMAC library, on `sha2`.
#[cfg(feature = "verify")]
pub fn stripe_v1(secret: &str, t: u64, body: &[u8]) -> String {
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(body);
    hmac_sha256_hex(secret.as_bytes(), &message)
}

/// HMAC-SHA256 written out from RFC 2104 over `sha2`, so that the tests do not check the
/// crate's signatures with the crate's own HMAC code.
#[cfg(feature = "verify")]
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// A handler that counts its runs, behind a layer with any extractor.
pub fn counting_body_service<St, K>(
    layer: IdempotencyLayer<St, K>,
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static
where
    St: Store + Clone,
    K: key::ExtractKey + Clone,
{
    layer.layer(service_fn(move |_req| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    }))
}

/// Takes its turn among the tests of this process that create a table of their own
/// (`CREATE TABLE IF NOT EXISTS`): two such statements racing on a new PostgreSQL table can
/// fail one of them with a unique violation in the catalog.
pub async fn schema_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
