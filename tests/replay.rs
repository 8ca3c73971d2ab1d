//! Response replay and request fingerprints through axum, on every store: what an API client
//! that sends `Idempotency-Key` gets.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::replay::Replay;
use tower_idempotency::store::{KeyState, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Outcome};

use common::unique_namespace;

/// How many times the handler ran.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// `POST /payments`: 201 with a JSON body naming the run, a session cookie, an `etag` and a
/// header outside the allowlist.
fn payments<St: Store + Clone>(
    layer: IdempotencyLayer<St, tower_idempotency::key::Header>,
) -> (Router, Runs) {
    let runs = Runs::default();
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/payments",
            post(move |body: Bytes| {
                let run = counted.next();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let mut headers = HeaderMap::new();
                    headers.insert(
                        header::SET_COOKIE,
                        HeaderValue::from_static("session=secret"),
                    );
                    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
                    headers.insert("x-internal", HeaderValue::from_static("1"));
                    let json = format!(r#"{{"run":{run},"request_bytes":{}}}"#, body.len());
                    (
                        StatusCode::CREATED,
                        headers,
                        [(header::CONTENT_TYPE, "application/json")],
                        json,
                    )
                        .into_response()
                }
            }),
        )
        .layer(layer);
    (app, runs)
}

fn pay(key: &str, body: &'static str) -> Request<Body> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap()
}

async fn body_of(res: Response) -> Bytes {
    res.into_body().collect().await.unwrap().to_bytes()
}

/// The retry gets the first answer again, byte for byte, with the allowlisted headers and
/// the replay header; the cookie and the unlisted header are not replayed; the handler ran
/// once. The quoted and the bare spelling of the key are the same key.
async fn the_first_answer_is_replayed<St: Store + Clone>(store: St) {
    let (app, runs) = payments(IdempotencyLayer::for_api(store));
    let key = unique_namespace("replay");
    let first = app
        .clone()
        .oneshot(pay(&format!("\"{key}\""), "{\"amount\":100}"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        first.headers()[header::SET_COOKIE],
        "session=secret",
        "the first answer is whole"
    );
    let first_body = body_of(first).await;
    assert_eq!(first_body, r#"{"run":1,"request_bytes":14}"#);

    for spelling in [format!("\"{key}\""), key.clone()] {
        let again = app
            .clone()
            .oneshot(pay(&spelling, "{\"amount\":100}"))
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{spelling}");
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(again.headers()[header::ETAG], "\"v1\"");
        assert!(
            again.headers().get(header::SET_COOKIE).is_none(),
            "a cookie is never replayed"
        );
        assert!(
            again.headers().get("x-internal").is_none(),
            "not in the allowlist"
        );
        assert_eq!(
            again.extensions().get::<Outcome>(),
            Some(&Outcome::Replayed)
        );
        assert_eq!(body_of(again).await, first_body, "byte for byte");
    }
    assert_eq!(runs.get(), 1);
}

/// The key used again for another request: 422 problem+json, the handler does not run, and
/// the stored answer stays.
async fn a_reused_key_is_422<St: Store + Clone>(store: St) {
    let (app, runs) = payments(IdempotencyLayer::for_api(store));
    let key = unique_namespace("reused");
    let first = app
        .clone()
        .oneshot(pay(&key, "{\"amount\":100}"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let reused = app
        .clone()
        .oneshot(pay(&key, "{\"amount\":999}"))
        .await
        .unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reused.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert_eq!(
        reused.extensions().get::<Outcome>(),
        Some(&Outcome::KeyReused)
    );
    let problem: serde_json::Value = serde_json::from_slice(&body_of(reused).await).unwrap();
    assert_eq!(problem["status"], 422);
    let same = app.oneshot(pay(&key, "{\"amount\":100}")).await.unwrap();
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.get(), 1);
}

/// 64 copies at once: one run; the others are 409 while it runs, or its replayed answer.
/// With a bounded wait for the first to settle, every copy gets the answer.
async fn concurrent_copies_run_once<St: Store + Clone>(store: St) {
    for wait in [None, Some(Duration::from_secs(10))] {
        let mut layer = IdempotencyLayer::for_api(store.clone());
        if let Some(wait) = wait {
            layer = layer.wait_in_flight(wait);
        }
        let (app, runs) = payments(layer);
        let key = unique_namespace("copies");
        let copies: Vec<_> = (0..64)
            .map(|_| tokio::spawn(app.clone().oneshot(pay(&key, "{\"amount\":1}"))))
            .collect();
        let (mut created, mut replayed) = (0, 0);
        for copy in copies {
            let res = copy.await.unwrap().unwrap();
            match res.status() {
                StatusCode::CREATED => {
                    created += 1;
                    replayed += usize::from(res.headers().contains_key("idempotent-replayed"));
                    assert_eq!(body_of(res).await, r#"{"run":1,"request_bytes":12}"#);
                }
                StatusCode::CONFLICT if wait.is_none() => {}
                other => panic!("unexpected {other} (wait {wait:?})"),
            }
        }
        assert_eq!(runs.get(), 1, "wait {wait:?}");
        assert_eq!(
            replayed,
            created - 1,
            "all but the first answer are replays"
        );
        if wait.is_some() {
            assert_eq!(created, 64, "every copy waited for the answer");
        } else {
            assert!(created >= 1);
        }
    }
}

/// A 500 is not stored: the claim is released and the retry runs; its 201 is then replayed.
async fn a_500_runs_again<St: Store + Clone>(store: St) {
    let runs = Runs::default();
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/payments",
            post(move || {
                let run = counted.next();
                async move {
                    if run == 1 {
                        (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response()
                    } else {
                        (StatusCode::CREATED, format!("run {run}")).into_response()
                    }
                }
            }),
        )
        .layer(IdempotencyLayer::for_api(store));
    let key = unique_namespace("five-hundred");
    let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let retry = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(body_of(retry).await, "run 2");
    let again = app.oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(again).await, "run 2");
    assert_eq!(runs.get(), 2);
}

/// A 5 MiB answer streamed with no length passes through as it comes (its first chunk
/// reaches the client before the handler makes the rest), is not stored, and its duplicate
/// gets the plain 200. An answer of known length past the limit is not stored either.
async fn long_answers_pass_through_unstored<St: Store + Clone>(store: St) {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 80; // 5 MiB
    let go_on = Arc::new(tokio::sync::Notify::new());
    let runs = Runs::default();
    let (counted, release) = (runs.clone(), go_on.clone());
    let app = Router::new()
        .route(
            "/stream",
            post(move || {
                counted.next();
                let release = release.clone();
                async move {
                    let chunks = futures_util::stream::unfold(0, move |n| {
                        let release = release.clone();
                        async move {
                            if n == CHUNKS {
                                return None;
                            }
                            if n == 1 {
                                release.notified().await;
                            }
                            Some((
                                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; CHUNK])),
                                n + 1,
                            ))
                        }
                    });
                    (StatusCode::OK, Body::from_stream(chunks)).into_response()
                }
            }),
        )
        .route(
            "/long",
            post(|| async { (StatusCode::OK, vec![b'y'; 300 * 1024]).into_response() }),
        )
        .layer(IdempotencyLayer::for_api(store.clone()));
    let key = unique_namespace("stream");
    let request = |path: &str| {
        Request::post(path)
            .header("idempotency-key", key.as_str())
            .body(Body::empty())
            .unwrap()
    };
    let res = app.clone().oneshot(request("/stream")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first chunk arrives before the rest is made: nothing buffers the stream")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap().len(), CHUNK);
    go_on.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest.len(), CHUNK * (CHUNKS - 1));

    let dup = app.clone().oneshot(request("/stream")).await.unwrap();
    assert_eq!(dup.status(), StatusCode::OK);
    assert_eq!(dup.extensions().get::<Outcome>(), Some(&Outcome::Duplicate));
    assert!(dup.headers().get("idempotent-replayed").is_none());
    assert!(body_of(dup).await.is_empty());
    assert_eq!(runs.get(), 1);

    let stored = IdempotencyKey::new("idempotency-key", key.as_str())
        .unwrap()
        .scoped("/stream")
        .unwrap();
    let record = store.describe(&stored).await.unwrap().expect("committed");
    assert_eq!(record.state, KeyState::Done);
    let receipt = record.receipt.expect("the fingerprint is kept");
    assert!(receipt.fingerprint.is_some());
    assert!(receipt.response.is_none(), "the answer was not stored");

    let long = app.clone().oneshot(request("/long")).await.unwrap();
    assert_eq!(body_of(long).await.len(), 300 * 1024);
    let dup = app.oneshot(request("/long")).await.unwrap();
    assert_eq!(dup.extensions().get::<Outcome>(), Some(&Outcome::Duplicate));
    assert!(body_of(dup).await.is_empty());
}

/// `Set-Cookie` and `Authorization` are never stored, even when the allowlist names them.
async fn credentials_are_never_replayed<St: Store + Clone>(store: St) {
    let layer = IdempotencyLayer::for_api(store).replay(
        Replay::new()
            .header("set-cookie")
            .header("authorization")
            .header("x-request-cost"),
    );
    let app = Router::new()
        .route(
            "/login",
            post(|| async {
                (
                    [
                        ("set-cookie", "session=secret"),
                        ("authorization", "Bearer secret"),
                        ("x-request-cost", "3"),
                    ],
                    "welcome",
                )
                    .into_response()
            }),
        )
        .layer(layer);
    let key = unique_namespace("cookie");
    let request = || {
        Request::post("/login")
            .header("idempotency-key", key.as_str())
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.headers()["set-cookie"], "session=secret");
    let again = app.oneshot(request()).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.headers()["x-request-cost"],
        "3",
        "an added header is replayed"
    );
    assert!(again.headers().get("set-cookie").is_none());
    assert!(again.headers().get("authorization").is_none());
    assert_eq!(body_of(again).await, "welcome");
}

/// A request without a key is 400, as the draft asks; nothing runs.
async fn a_missing_key_is_400<St: Store + Clone>(store: St) {
    let (app, runs) = payments(IdempotencyLayer::for_api(store));
    let res = app
        .oneshot(Request::post("/payments").body(Body::from("{}")).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert_eq!(runs.get(), 0);
}

/// A route answering `status` on its first run and 201 after, under `layer`, and a request
/// with `key` to it.
fn flaky_route<St: Store + Clone>(
    status: StatusCode,
    layer: IdempotencyLayer<St, tower_idempotency::key::Header>,
) -> (Router, Runs) {
    let runs = Runs::default();
    let counted = runs.clone();
    let handler = move || {
        let run = counted.next();
        async move {
            let status = if run == 1 {
                status
            } else {
                StatusCode::CREATED
            };
            (status, format!("run {run}")).into_response()
        }
    };
    (
        Router::new().route("/payments", post(handler).layer(layer)),
        runs,
    )
}

/// `for_api`: the answers that ask for the same request again, or for other credentials or
/// headers, are run again; any other 4xx is the request's answer and is replayed.
async fn which_answers_are_kept<St: Store + Clone>(store: St) {
    for status in [429, 409, 408, 401, 403, 415, 503] {
        let status = StatusCode::from_u16(status).unwrap();
        let (app, runs) = flaky_route(status, IdempotencyLayer::for_api(store.clone()));
        let key = unique_namespace("retried");
        let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
        assert_eq!(first.status(), status);
        let retry = app.oneshot(pay(&key, "{}")).await.unwrap();
        assert_eq!(retry.status(), StatusCode::CREATED, "{status} is run again");
        assert_eq!(runs.get(), 2, "{status}");
    }
    for status in [400, 402, 404, 422] {
        let status = StatusCode::from_u16(status).unwrap();
        let (app, runs) = flaky_route(status, IdempotencyLayer::for_api(store.clone()));
        let key = unique_namespace("kept");
        let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
        assert_eq!(first.status(), status);
        let again = app.oneshot(pay(&key, "{}")).await.unwrap();
        assert_eq!(again.status(), status, "{status} is replayed");
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(body_of(again).await, "run 1");
        assert_eq!(runs.get(), 1, "{status}");
    }
}

/// The method, the query and a chosen header are part of the fingerprint; a fingerprint
/// without the body lets the body change.
async fn what_the_fingerprint_covers<St: Store + Clone>(store: St) {
    use tower_idempotency::replay::RequestFingerprint;
    let runs = Runs::default();
    let counted = runs.clone();
    let handler = move || {
        let run = counted.next();
        async move { (StatusCode::CREATED, format!("run {run}")).into_response() }
    };
    let layer = IdempotencyLayer::for_api(store.clone())
        .fingerprint(RequestFingerprint::new().header("x-tenant"));
    let app = Router::new().route("/payments", post(handler.clone()).put(handler).layer(layer));
    let key = unique_namespace("covers");
    let request = |method: &str, uri: &str, tenant: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("idempotency-key", key.as_str())
            .header("x-tenant", tenant)
            .body(Body::from("{}"))
            .unwrap()
    };
    let first = app
        .clone()
        .oneshot(request("POST", "/payments", "a"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    for (method, uri, tenant) in [
        ("PUT", "/payments", "a"),
        ("POST", "/payments?retry=1", "a"),
        ("POST", "/payments", "b"),
    ] {
        let res = app
            .clone()
            .oneshot(request(method, uri, tenant))
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {uri} {tenant}"
        );
    }
    let same = app
        .oneshot(request("POST", "/payments", "a"))
        .await
        .unwrap();
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.get(), 1);

    let (app, runs) = payments(
        IdempotencyLayer::for_api(store).fingerprint(RequestFingerprint::new().without_body()),
    );
    let key = unique_namespace("no-body");
    app.clone()
        .oneshot(pay(&key, "{\"amount\":1}"))
        .await
        .unwrap();
    let other_body = app.oneshot(pay(&key, "{\"amount\":2}")).await.unwrap();
    assert_eq!(other_body.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.get(), 1);
}

/// A body exactly at the limit is stored; one byte more is not. An answer that varies on a
/// header the fingerprint leaves out is not stored; naming the header stores it.
async fn the_limit_and_vary<St: Store + Clone>(store: St) {
    use tower_idempotency::replay::RequestFingerprint;
    const LIMIT: usize = 1000;
    let route = |len: usize, vary: Option<&'static str>, layer| {
        let handler = move || async move {
            let mut res = (StatusCode::CREATED, vec![b'z'; len]).into_response();
            if let Some(vary) = vary {
                res.headers_mut()
                    .insert(header::VARY, HeaderValue::from_static(vary));
            }
            res
        };
        Router::new().route("/payments", post(handler).layer(layer))
    };
    let api = |store: &St| {
        IdempotencyLayer::for_api(store.clone()).replay(Replay::new().body_limit(LIMIT))
    };
    let cases = [
        (LIMIT, None, api(&store), true),
        (LIMIT + 1, None, api(&store), false),
        (10, Some("accept-encoding"), api(&store), false),
        (10, Some("*"), api(&store), false),
        (
            10,
            Some("Accept-Encoding"),
            api(&store).fingerprint(RequestFingerprint::new().header("accept-encoding")),
            true,
        ),
    ];
    for (len, vary, layer, stored) in cases {
        let app = route(len, vary, layer);
        let key = unique_namespace("limit");
        let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
        assert_eq!(body_of(first).await.len(), len);
        let again = app.oneshot(pay(&key, "{}")).await.unwrap();
        let replayed = again.headers().contains_key("idempotent-replayed");
        assert_eq!(replayed, stored, "{len} bytes, vary {vary:?}");
        let expected = if stored { len } else { 0 };
        assert_eq!(
            body_of(again).await.len(),
            expected,
            "{len} bytes, vary {vary:?}"
        );
    }
}

/// A body that knows its length, then fails while it is read to be stored: the handler's work
/// stands (the key commits, the handler does not run again); the client gets 500, then the
/// plain 200.
async fn a_body_that_fails_commits_without_the_answer<St: Store + Clone>(store: St) {
    let runs = Runs::default();
    let counted = runs.clone();
    let handler = move || {
        counted.next();
        async move { (StatusCode::CREATED, Body::new(Broken)).into_response() }
    };
    let app = Router::new().route(
        "/payments",
        post(handler).layer(IdempotencyLayer::for_api(store)),
    );
    let key = unique_namespace("broken");
    let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        first.extensions().get::<Outcome>(),
        Some(&Outcome::Processed)
    );
    let retry = app.oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(
        retry.extensions().get::<Outcome>(),
        Some(&Outcome::Duplicate)
    );
    assert_eq!(runs.get(), 1, "the work is not done twice");
}

/// A body of ten bytes, as it says, that fails at its first frame.
struct Broken;

impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(Some(Err(std::io::Error::other(
            "the connection to the backend broke",
        ))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(10)
    }
}

/// A memory store whose first commit fails: the layer retries it in the background, and the
/// receipt goes with the retry.
#[derive(Clone, Default)]
struct FirstCommitFails {
    inner: tower_idempotency::store::MemoryStore,
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl Store for FirstCommitFails {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        stale: tower_idempotency::Stale,
    ) -> Result<tower_idempotency::store::Claim, tower_idempotency::store::StoreError> {
        self.inner.claim(key, stale).await
    }
    async fn renew(
        &self,
        lease: &tower_idempotency::store::Lease,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.renew(lease).await
    }
    async fn commit(
        &self,
        lease: &tower_idempotency::store::Lease,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.commit(lease).await
    }
    async fn commit_with(
        &self,
        lease: &tower_idempotency::store::Lease,
        receipt: &tower_idempotency::store::Receipt,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(tower_idempotency::store::StoreError::backend(
                "the store blinked",
            ));
        }
        self.inner.commit_with(lease, receipt).await
    }
    async fn release(
        &self,
        lease: &tower_idempotency::store::Lease,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.release(lease).await
    }
    async fn give_back(
        &self,
        lease: &tower_idempotency::store::Lease,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.give_back(lease).await
    }
    async fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<tower_idempotency::store::KeyRecord>, tower_idempotency::store::StoreError>
    {
        self.inner.describe(key).await
    }
    async fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> Result<Vec<tower_idempotency::store::StuckClaim>, tower_idempotency::store::StoreError>
    {
        self.inner.stuck_claims(older_than).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        how: tower_idempotency::store::Resolution,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        self.inner.resolve(key, how).await
    }
    async fn purge_completed(
        &self,
        older_than: Duration,
    ) -> Result<u64, tower_idempotency::store::StoreError> {
        self.inner.purge_completed(older_than).await
    }
}

#[tokio::test]
async fn a_commit_retried_in_the_background_keeps_the_answer() {
    let store = FirstCommitFails::default();
    let (app, runs) = payments(IdempotencyLayer::for_api(store.clone()));
    let key = unique_namespace("retried-commit");
    let first = app.clone().oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(
        first.status(),
        StatusCode::CREATED,
        "the answer goes out while the commit is retried"
    );
    let stored = IdempotencyKey::new("idempotency-key", key.as_str())
        .unwrap()
        .scoped("/payments")
        .unwrap();
    for _ in 0..200 {
        let record = store.describe(&stored).await.unwrap().unwrap();
        if record.state == KeyState::Done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let again = app.oneshot(pay(&key, "{}")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(again).await, r#"{"run":1,"request_bytes":2}"#);
    assert_eq!(runs.get(), 1);
}

/// The per-client scope of the module docs: two clients with the same key are two requests;
/// a request without a principal is refused.
#[tokio::test]
async fn keys_are_scoped_per_client() {
    use tower_idempotency::key::Scope;
    #[derive(Clone)]
    struct Principal(&'static str);
    let layer = IdempotencyLayer::for_api(tower_idempotency::store::MemoryStore::new()).scope(
        Scope::from_fn(|parts| match parts.extensions.get::<Principal>() {
            Some(who) => format!("client={}{}", who.0, parts.uri.path()),
            None => String::new(),
        }),
    );
    let (app, runs) = payments(layer);
    let as_client = |who: Option<&'static str>| {
        let mut req = pay("same-key", "{}");
        if let Some(who) = who {
            req.extensions_mut().insert(Principal(who));
        }
        req
    };
    let alice = app.clone().oneshot(as_client(Some("alice"))).await.unwrap();
    let bob = app.clone().oneshot(as_client(Some("bob"))).await.unwrap();
    assert!(alice.headers().get("idempotent-replayed").is_none());
    assert!(
        bob.headers().get("idempotent-replayed").is_none(),
        "another client's key"
    );
    assert_eq!(runs.get(), 2);
    let alice = app.clone().oneshot(as_client(Some("alice"))).await.unwrap();
    assert_eq!(alice.headers()["idempotent-replayed"], "true");
    let nobody = app.oneshot(as_client(None)).await.unwrap();
    assert_eq!(nobody.status(), StatusCode::BAD_REQUEST);
    assert_eq!(runs.get(), 2);
}

macro_rules! replay_suite {
    ($backend:ident, $store:expr) => {
        mod $backend {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_first_answer_is_replayed() {
                let Some(store) = $store else { return };
                super::the_first_answer_is_replayed(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_reused_key_is_422() {
                let Some(store) = $store else { return };
                super::a_reused_key_is_422(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_copies_run_once() {
                let Some(store) = $store else { return };
                super::concurrent_copies_run_once(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_500_runs_again() {
                let Some(store) = $store else { return };
                super::a_500_runs_again(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn long_answers_pass_through_unstored() {
                let Some(store) = $store else { return };
                super::long_answers_pass_through_unstored(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn credentials_are_never_replayed() {
                let Some(store) = $store else { return };
                super::credentials_are_never_replayed(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn which_answers_are_kept() {
                let Some(store) = $store else { return };
                super::which_answers_are_kept(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn what_the_fingerprint_covers() {
                let Some(store) = $store else { return };
                super::what_the_fingerprint_covers(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_limit_and_vary() {
                let Some(store) = $store else { return };
                super::the_limit_and_vary(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_body_that_fails_commits_without_the_answer() {
                let Some(store) = $store else { return };
                super::a_body_that_fails_commits_without_the_answer(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_missing_key_is_400() {
                let Some(store) = $store else { return };
                super::a_missing_key_is_400(store).await;
            }
        }
    };
}

replay_suite!(memory, Some(tower_idempotency::store::MemoryStore::new()));
replay_suite!(sqlite, crate::common::db::sqlite_file_store("replay").await);
replay_suite!(postgres, crate::common::db::postgres_store().await);
replay_suite!(mysql, crate::common::db::mysql_store().await);
replay_suite!(redis, crate::common::redis_store().await);
