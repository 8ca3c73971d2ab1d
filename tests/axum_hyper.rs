//! The layer under axum (`Router::layer`, `Router::route_layer`, `MethodRouter::layer`) and
//! under a plain hyper 1.x server, with header and body keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_idempotency::body::RequestBody;
use tower_idempotency::store::MemoryStore;
use tower_idempotency::{IdempotencyLayer, key};

fn counter() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let c = Arc::new(AtomicUsize::new(0));
    (c.clone(), c)
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Option<String>, Bytes) {
    let res = app.clone().oneshot(req).await.unwrap();
    let outcome = res
        .headers()
        .get("idempotency-outcome")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = res.status();
    (
        status,
        outcome,
        res.into_body().collect().await.unwrap().to_bytes(),
    )
}

fn stripe(id: &str) -> Request<Body> {
    Request::post("/stripe")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            r#"{{"id":"{id}","type":"charge.succeeded"}}"#
        )))
        .unwrap()
}

fn github(id: &str) -> Request<Body> {
    Request::post("/github")
        .header("x-github-delivery", id)
        .body(Body::empty())
        .unwrap()
}

fn custom(id: &str) -> Request<Body> {
    Request::post("/custom")
        .header("x-event-id", id)
        .body(Body::empty())
        .unwrap()
}

/// A new user's app: three routes, three senders, each deduplicated on its own key.
#[tokio::test]
async fn three_routes_dedupe_independently() {
    let store = MemoryStore::new();
    let (stripe_runs, s) = counter();
    let (github_runs, g) = counter();
    let (custom_runs, c) = counter();

    let app = Router::new()
        .route(
            "/custom",
            post(move || {
                let runs = c.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::ACCEPTED
                }
            }),
        )
        // Router::route_layer covers the routes added before it: here just /custom.
        .route_layer(
            IdempotencyLayer::new(store.clone()).key(key::header("x-event-id").namespace("acme")),
        )
        // MethodRouter::layer, with a body key: the handler still reads the whole body.
        .route(
            "/stripe",
            post(move |body: String| {
                let runs = s.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    assert!(
                        body.contains("charge.succeeded"),
                        "the handler gets the body intact"
                    );
                    body
                }
            })
            .layer(IdempotencyLayer::new(store.clone()).key(key::stripe())),
        )
        .route(
            "/github",
            post(move || {
                let runs = g.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    "thanks"
                }
            })
            .layer(IdempotencyLayer::new(store.clone()).key(key::github())),
        );

    // The same id at each route is three different events.
    let (status, outcome, body) = send(&app, stripe("same")).await;
    assert_eq!((status, outcome), (StatusCode::OK, None));
    assert!(body.starts_with(br#"{"id":"same""#));
    assert_eq!(send(&app, github("same")).await.0, StatusCode::OK);
    assert_eq!(send(&app, custom("same")).await.0, StatusCode::ACCEPTED);

    for _ in 0..2 {
        for req in [stripe("same"), github("same"), custom("same")] {
            let (status, outcome, body) = send(&app, req).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(outcome.as_deref(), Some("duplicate"));
            assert!(body.is_empty());
        }
    }
    let runs = |c: &Arc<AtomicUsize>| c.load(Ordering::SeqCst);
    assert_eq!(
        (runs(&stripe_runs), runs(&github_runs), runs(&custom_runs)),
        (1, 1, 1)
    );

    // Missing keys are each route's own 400.
    let (status, _, body) = send(&app, github_without_header()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("x-github-delivery"));
}

fn github_without_header() -> Request<Body> {
    Request::post("/github").body(Body::empty()).unwrap()
}

#[tokio::test]
async fn router_layer_with_auto_detection() {
    let (runs, r) = counter();
    let app = Router::new()
        .route(
            "/webhooks",
            post(move |body: Bytes| {
                let runs = r.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    body
                }
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    let signed = || {
        Request::post("/webhooks")
            .header("stripe-signature", "t=1,v1=abc")
            .body(Body::from(r#"{"id":"evt_1"}"#))
            .unwrap()
    };
    let (status, _, body) = send(&app, signed()).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &br#"{"id":"evt_1"}"#[..])
    );
    let (_, outcome, _) = send(&app, signed()).await;
    assert_eq!(outcome.as_deref(), Some("duplicate"));
    let svix = || {
        Request::post("/webhooks")
            .header("svix-id", "msg_1")
            .body(Body::empty())
            .unwrap()
    };
    send(&app, svix()).await;
    send(&app, svix()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A plain hyper 1.x server over TCP, with a body key, through `TowerToHyperService`.
#[tokio::test]
async fn plain_hyper_server_with_a_body_key() {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;

    let (runs, r) = counter();
    let svc = tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::stripe()))
        .service(tower::service_fn(
            move |req: Request<RequestBody<Incoming>>| {
                let runs = r.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // A body that cannot be read is answered 400, as an axum extractor does.
                    let res = match req.into_body().collect().await {
                        Ok(body) => http::Response::new(Full::new(body.to_bytes())),
                        Err(error) => {
                            let mut res =
                                http::Response::new(Full::new(Bytes::from(error.to_string())));
                            *res.status_mut() = StatusCode::BAD_REQUEST;
                            res
                        }
                    };
                    Ok::<_, std::convert::Infallible>(res)
                }
            },
        ));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });

    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let event = r#"{"id":"evt_42","object":"event"}"#;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let req = Request::post("/")
            .header("host", "localhost")
            .body(Full::new(Bytes::from_static(event.as_bytes())))
            .unwrap();
        let res = client.send_request(req).await.unwrap();
        let outcome = res.headers().get("idempotency-outcome").cloned();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        answers.push((status, outcome, body));
    }
    assert_eq!(answers[0].0, StatusCode::OK);
    assert_eq!(
        answers[0].2, event,
        "the handler read the same body the client sent"
    );
    assert_eq!(answers[1].0, StatusCode::OK);
    assert_eq!(answers[1].1.as_ref().unwrap(), "duplicate");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.abort();
}

/// An axum handler's body extractor fails once a header-keyed delivery's body has kept it
/// waiting for the body timeout: axum answers 400, the claim is released, and the genuine
/// delivery of the same event runs instead of meeting a 409.
#[tokio::test(start_paused = true)]
async fn axum_extractor_of_a_stalled_body_fails_and_the_claim_is_released() {
    let (runs, r) = counter();
    let app = Router::new().route(
        "/github",
        post(move |body: Bytes| {
            let runs = r.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                body
            }
        })
        .layer(
            IdempotencyLayer::new(MemoryStore::new())
                .key(key::github())
                .body_timeout(std::time::Duration::from_millis(200)),
        ),
    );
    let stalled = futures_util::stream::pending::<Result<Bytes, std::convert::Infallible>>();
    let req = Request::post("/github")
        .header("x-github-delivery", "d-1")
        .body(Body::from_stream(stalled))
        .unwrap();
    let sent = tokio::time::timeout(std::time::Duration::from_secs(60), send(&app, req));
    let (status, _, body) = sent.await.expect("the delivery ends");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
    assert!(
        String::from_utf8_lossy(&body).contains("did not arrive within 200ms"),
        "{body:?}"
    );

    let req = Request::post("/github")
        .header("x-github-delivery", "d-1")
        .body(Body::from("payload"))
        .unwrap();
    let (status, outcome, body) = send(&app, req).await;
    assert_eq!(
        (status, outcome, &body[..]),
        (StatusCode::OK, None, &b"payload"[..])
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the extractor refused the stalled delivery before the handler's code"
    );
}
