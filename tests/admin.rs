//! The operators' router on every store: what it lists and describes, what resolving and
//! purging do to the next delivery, its errors, its refusal of cross-site requests, and its
//! place behind the application's authentication.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response as AxumResponse;
use bytes::Bytes;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_idempotency::admin::Admin;
use tower_idempotency::store::{
    Claim, Fingerprint, KeyRecord, Lease, Receipt, Resolution, Store, StoreError, StoredResponse,
    StuckClaim,
};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

use common::{PAST_SHORT, SHORT, counting_layer_service, delivery, key_in, unique_namespace};

/// The table (and Redis prefix) of this binary: its purges forget no other binary's rows.
const TABLE: &str = "admin_test_keys";

/// Whether a backend's table was migrated: once per binary, not by every test at once.
type Migrated = tokio::sync::Mutex<bool>;

async fn migrated<F>(flag: &Migrated, migrate: F)
where
    F: std::future::Future<Output = Result<(), StoreError>>,
{
    let mut done = flag.lock().await;
    if !*done {
        migrate.await.expect("migrate");
        *done = true;
    }
}

async fn postgres() -> Option<tower_idempotency::store::PostgresStore> {
    let pool = common::db::postgres_pool().await?;
    let store = tower_idempotency::store::PostgresStore::new(pool)
        .with_table_name(TABLE)
        .unwrap();
    static MIGRATED: Migrated = Migrated::const_new(false);
    migrated(&MIGRATED, store.migrate()).await;
    Some(store)
}

async fn mysql() -> Option<tower_idempotency::store::MySqlStore> {
    let pool = common::db::mysql_pool().await?;
    let store = tower_idempotency::store::MySqlStore::new(pool)
        .with_table_name(TABLE)
        .unwrap();
    static MIGRATED: Migrated = Migrated::const_new(false);
    migrated(&MIGRATED, store.migrate()).await;
    Some(store)
}

async fn sqlite() -> Option<tower_idempotency::store::SqliteStore> {
    let pool = common::db::sqlite_file_pool(common::db::sqlite_file("admin")).await;
    let store = tower_idempotency::store::SqliteStore::new(pool);
    static MIGRATED: Migrated = Migrated::const_new(false);
    migrated(&MIGRATED, store.migrate()).await;
    Some(store)
}

async fn redis() -> Option<tower_idempotency::store::RedisStore> {
    let url = common::database_url("REDIS_URL", "redis://127.0.0.1:6379");
    let store = tower_idempotency::store::RedisStore::connect(&url);
    let store = common::connect("REDIS_URL", &url, store).await?;
    Some(store.with_prefix(TABLE).unwrap())
}

/// The admin router mounted at `/admin`.
fn mounted<St: Store + Clone>(admin: Admin<St>) -> Router {
    Router::new().nest("/admin", admin.router())
}

/// What a route answered: status, headers, and the body as JSON (`null` if it is none).
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
    text: String,
}

async fn send(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    }
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

fn post_json(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header("sec-fetch-site", "same-origin")
        .body(body.into())
        .unwrap()
}

fn describe_uri(key: &IdempotencyKey) -> String {
    format!(
        "/admin/keys?namespace={}&key={}",
        encode(key.namespace()),
        encode(key.value())
    )
}

/// Percent-encodes everything but unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn resolve_body(key: &IdempotencyKey, resolution: &str) -> String {
    json!({ "namespace": key.namespace(), "key": key.value(), "resolution": resolution })
        .to_string()
}

#[track_caller]
fn assert_problem(answer: &Answer, status: StatusCode) {
    assert_eq!(answer.status, status, "{}", answer.text);
    assert_eq!(
        answer.headers[header::CONTENT_TYPE],
        "application/problem+json",
        "{}",
        answer.text
    );
    assert_eq!(answer.body["status"], status.as_u16(), "{}", answer.text);
    assert!(answer.body["title"].is_string(), "{}", answer.text);
    assert!(answer.body["detail"].is_string(), "{}", answer.text);
}

/// The layer's stale policy in these tests: hold a claim not renewed for `SHORT`.
const HOLD: Stale = Stale::hold_after(SHORT);

/// A stale policy under which a claim taken during a test stays running (not stale) for the
/// rest of it.
const LIVE: Stale = Stale::hold_after(Duration::from_secs(600));

/// A delivery of event `id` in namespace `ns` to `/hook` through the layer (holding stale
/// claims); answers the response's outcome header and whether the handler ran.
async fn deliver<St: Store + Clone>(store: &St, ns: &str, id: &str) -> (StatusCode, String, bool) {
    deliver_under(store, ns, id, HOLD).await
}

/// [`deliver`] through a layer with the stale policy `stale`.
async fn deliver_under<St: Store + Clone>(
    store: &St,
    ns: &str,
    id: &str,
    stale: Stale,
) -> (StatusCode, String, bool) {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace(ns.to_owned()))
        .stale(stale);
    let res = counting_layer_service(layer, runs.clone())
        .oneshot(delivery(id))
        .await
        .unwrap();
    let outcome = res
        .headers()
        .get("idempotency-outcome")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (res.status(), outcome, runs.load(Ordering::SeqCst) == 1)
}

/// A claim on event `id` of namespace `ns`, as the layer stores it without a router, whose
/// owner died at once: claimed, never renewed, never settled. Held once `PAST_SHORT` passed.
async fn held_claim<St: Store>(store: &St, ns: &str, id: &str) -> IdempotencyKey {
    let key = key_in(ns, id);
    let lease: Lease = match store.claim(&key, HOLD).await.unwrap() {
        Claim::Acquired(lease) => lease,
        other => panic!("expected to claim {key}, got {other:?}"),
    };
    drop(lease);
    tokio::time::sleep(PAST_SHORT).await;
    key
}

async fn held_claim_is_listed_and_described<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-list");
    let key = held_claim(&store, &ns, "evt_1").await;
    let app = mounted(Admin::new(store.clone()));

    // The layer holds it: 409, the handler does not run.
    let (status, outcome, ran) = deliver(&store, &ns, "evt_1").await;
    assert_eq!(
        (status, outcome.as_str(), ran),
        (StatusCode::CONFLICT, "held", false)
    );

    let listed = send(&app, get("/admin/claims?older_than_s=0.3")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(listed.headers[header::CONTENT_TYPE], "application/json");
    let mine: Vec<&Value> = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter(|claim| claim["namespace"] == key.namespace())
        .collect();
    assert_eq!(mine.len(), 1, "{}", listed.text);
    let claim = mine[0];
    assert_eq!(claim["key"], "evt_1");
    assert_eq!(claim["deliveries"], 2, "the claim and the held delivery");
    assert_eq!(claim["runs"], 1);
    assert!(claim["age_s"].as_f64().unwrap() >= 0.3, "{claim}");
    assert!(claim["since_renewal_s"].as_f64().unwrap() >= 0.3, "{claim}");
    assert!(claim["renewed_ago_s"].as_f64().unwrap() >= 0.3, "{claim}");

    // Not renewed for an hour: not listed. Without `older_than_s`, the router's
    // `stuck_after` (a minute by default) applies.
    let older = send(&app, get("/admin/claims?older_than_s=3600")).await;
    assert!(
        !older.text.contains(key.namespace()),
        "listed although younger: {}",
        older.text
    );
    let default = send(&app, get("/admin/claims")).await;
    assert!(!default.text.contains(key.namespace()), "{}", default.text);
    let short = mounted(Admin::new(store.clone()).stuck_after(SHORT));
    let listed = send(&short, get("/admin/claims")).await;
    assert!(listed.text.contains(key.namespace()), "{}", listed.text);

    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.status, StatusCode::OK, "{}", described.text);
    let record = &described.body;
    assert_eq!(record["namespace"], key.namespace());
    assert_eq!(record["key"], "evt_1");
    assert_eq!(record["state"], "processing");
    assert_eq!(
        (&record["deliveries"], &record["runs"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(record["reclaimed"], false);
    assert!(record["renewed_ago_s"].as_f64().unwrap() >= 0.3, "{record}");
    assert!(record["claimed_ago_s"].as_f64().unwrap() >= 0.3, "{record}");
    assert!(
        record["first_seen_ago_s"].as_f64() >= record["last_seen_ago_s"].as_f64(),
        "{record}"
    );
    assert_eq!(record["settled_ago_s"], Value::Null);
    assert_eq!(record["receipt"], Value::Null);

    let unknown = key_in(&ns, "never-sent");
    assert_problem(
        &send(&app, get(&describe_uri(&unknown))).await,
        StatusCode::NOT_FOUND,
    );
}

async fn a_receipt_is_described<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-receipt");
    let app = mounted(Admin::new(store.clone()));
    let mut print = [0u8; 32];
    print[0] = 0xab;
    print[31] = 0x01;
    let answered = StoredResponse::new(StatusCode::CREATED, vec![], Bytes::from_static(b"{}"));
    for (id, receipt, expected) in [
        (
            "with-answer",
            Receipt::new(Some(Fingerprint::from_bytes(print)), Some(answered)),
            json!({ "fingerprint": format!("ab{}01", "00".repeat(30)), "status": 201 }),
        ),
        (
            "fingerprint-only",
            Receipt::new(Some(Fingerprint::from_bytes(print)), None),
            json!({ "fingerprint": format!("ab{}01", "00".repeat(30)), "status": null }),
        ),
    ] {
        let key = key_in(&ns, id);
        let Claim::Acquired(lease) = store.claim(&key, HOLD).await.unwrap() else {
            panic!("claim {key}")
        };
        store.commit_with(&lease, &receipt).await.unwrap();
        let described = send(&app, get(&describe_uri(&key))).await;
        assert_eq!(described.status, StatusCode::OK, "{}", described.text);
        assert_eq!(described.body["state"], "done");
        assert_eq!(described.body["receipt"], expected, "{id}");
    }
}

async fn resolve_done_makes_the_next_delivery_a_duplicate<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-done");
    let key = held_claim(&store, &ns, "evt_1").await;
    let app = mounted(Admin::new(store.clone()).stale(HOLD));

    let resolved = send(
        &app,
        post_json("/admin/keys/resolve", resolve_body(&key, "done")),
    )
    .await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);
    assert_eq!(resolved.body, json!({ "resolved": true }));

    let (status, outcome, ran) = deliver(&store, &ns, "evt_1").await;
    assert_eq!(
        (status, outcome.as_str(), ran),
        (StatusCode::OK, "duplicate", false)
    );
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "done");
    assert!(
        described.body["settled_ago_s"].is_number(),
        "{}",
        described.text
    );
    assert_eq!(described.body["renewed_ago_s"], Value::Null);

    // Nothing is processing any more: nothing to resolve.
    let again = send(
        &app,
        post_json("/admin/keys/resolve", resolve_body(&key, "release")),
    )
    .await;
    assert_eq!(again.body, json!({ "resolved": false }));
    let listed = send(&app, get("/admin/claims?older_than_s=0")).await;
    assert!(!listed.text.contains(key.namespace()), "{}", listed.text);
}

async fn resolve_release_lets_the_next_delivery_run<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-release");
    let key = held_claim(&store, &ns, "evt_1").await;
    let app = mounted(Admin::new(store.clone()).stale(HOLD));

    let resolved = send(
        &app,
        post_json("/admin/keys/resolve", resolve_body(&key, "release")),
    )
    .await;
    assert_eq!(
        resolved.body,
        json!({ "resolved": true }),
        "{}",
        resolved.text
    );
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "released");

    let (status, outcome, ran) = deliver(&store, &ns, "evt_1").await;
    assert_eq!((status, outcome.as_str(), ran), (StatusCode::OK, "", true));
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "done");
    assert_eq!(described.body["runs"], 2, "{}", described.text);
}

async fn purge_removes_an_old_done_key<St: Store + Clone>(store: St) {
    // A purge forgets the done keys of every test of this binary: it runs alone.
    let _alone = common::SHARED_TABLE.write().await;
    let ns = unique_namespace("admin-purge");
    let (status, _, ran) = deliver(&store, &ns, "evt_old").await;
    assert_eq!((status, ran), (StatusCode::OK, true));
    let old = key_in(&ns, "evt_old");
    let held = held_claim(&store, &ns, "evt_held").await;
    let app = mounted(Admin::new(store.clone()).retention(SHORT));

    // Past an hour: nothing of ours.
    let kept = send(&app, post_json("/admin/purge", r#"{"older_than_s": 3600}"#)).await;
    assert_eq!(kept.status, StatusCode::OK, "{}", kept.text);
    assert!(kept.body["purged"].is_u64(), "{}", kept.text);
    assert_eq!(
        send(&app, get(&describe_uri(&old))).await.status,
        StatusCode::OK
    );

    // Without `older_than_s`: the router's retention, here `SHORT`.
    let purged = send(&app, post_json("/admin/purge", "{}")).await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text);
    assert!(
        purged.body["purged"].as_u64().unwrap() >= 1,
        "{}",
        purged.text
    );
    assert_problem(
        &send(&app, get(&describe_uri(&old))).await,
        StatusCode::NOT_FOUND,
    );
    // A processing claim is never purged.
    let described = send(&app, get(&describe_uri(&held))).await;
    assert_eq!(described.body["state"], "processing", "{}", described.text);

    // Forgotten: the next delivery of the purged event runs again.
    let (_, _, ran) = deliver(&store, &ns, "evt_old").await;
    assert!(ran);
    let zero = send(&app, post_json("/admin/purge", r#"{"older_than_s": null}"#)).await;
    assert_eq!(zero.status, StatusCode::OK, "{}", zero.text);
}

async fn bad_input_is_a_problem<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-bad");
    let key = held_claim(&store, &ns, "evt_1").await;
    let app = mounted(Admin::new(store.clone()));
    let resolve = |body: &str| post_json("/admin/keys/resolve", body.to_owned());

    let not_json = send(&app, resolve(r#"{"namespace": "#)).await;
    assert_problem(&not_json, StatusCode::BAD_REQUEST);
    let trailing = send(&app, resolve(r#"{} {}"#)).await;
    assert_problem(&trailing, StatusCode::BAD_REQUEST);
    assert_problem(&send(&app, resolve("")).await, StatusCode::BAD_REQUEST);

    let shapes = [
        json!([]).to_string(),
        json!({ "namespace": key.namespace(), "resolution": "done" }).to_string(),
        json!({ "namespace": key.namespace(), "key": 1, "resolution": "done" }).to_string(),
        json!({ "namespace": key.namespace(), "key": "evt_1", "resolution": "maybe" }).to_string(),
        json!({ "namespace": key.namespace(), "key": "evt_1", "resolution": "done", "forced": true })
            .to_string(),
        json!({ "namespace": key.namespace(), "key": "evt_1", "resolution": "done", "force": "yes" })
            .to_string(),
        json!({ "namespace": key.namespace(), "key": "evt_1", "resolution": "done", "force": 1 })
            .to_string(),
        json!({ "namespace": key.namespace(), "key": "evt\n1", "resolution": "done" }).to_string(),
        json!({ "namespace": "", "key": "evt_1", "resolution": "done" }).to_string(),
    ];
    for body in shapes {
        let answer = send(&app, resolve(&body)).await;
        assert_problem(&answer, StatusCode::UNPROCESSABLE_ENTITY);
    }
    for body in [
        r#"{"older_than_s": -1}"#,
        r#"{"older_than_s": "60"}"#,
        r#"{"older_tan_s": 60}"#,
        r#"{"older_than_s": 1e300}"#,
    ] {
        let answer = send(&app, post_json("/admin/purge", body)).await;
        assert_problem(&answer, StatusCode::UNPROCESSABLE_ENTITY);
    }
    let huge = format!(r#"{{"namespace": "{}"}}"#, "x".repeat(100 * 1024));
    assert_problem(
        &send(&app, resolve(&huge)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    );

    for uri in [
        "/admin/claims?older_than_s=soon",
        "/admin/claims?older_than_s=-5",
        "/admin/keys",
        "/admin/keys?namespace=github",
        "/admin/keys?namespace=github&key=evt%0A1",
    ] {
        assert_problem(&send(&app, get(uri)).await, StatusCode::BAD_REQUEST);
    }
    assert_problem(&send(&app, get("/admin/nope")).await, StatusCode::NOT_FOUND);
    assert_problem(
        &send(&app, get("/admin/purge")).await,
        StatusCode::METHOD_NOT_ALLOWED,
    );
    let delete = Request::delete("/admin/claims")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{}"))
        .unwrap();
    assert_problem(&send(&app, delete).await, StatusCode::METHOD_NOT_ALLOWED);

    // None of it touched the claim.
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "processing", "{}", described.text);
}

async fn cross_site_posts_are_refused<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-csrf");
    let key = held_claim(&store, &ns, "evt_1").await;
    let app = mounted(Admin::new(store.clone()).stale(HOLD));
    let form = format!(
        "namespace={}&key=evt_1&resolution=done",
        encode(key.namespace())
    );

    // What an HTML form on another site can send.
    for content_type in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ] {
        let req = Request::post("/admin/keys/resolve")
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(form.clone()))
            .unwrap();
        let answer = send(&app, req).await;
        assert_problem(&answer, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    let plain_json = Request::post("/admin/keys/resolve")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(resolve_body(&key, "done")))
        .unwrap();
    assert_problem(
        &send(&app, plain_json).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
    );
    let purge = Request::post("/admin/purge")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("older_than_s=0"))
        .unwrap();
    assert_problem(&send(&app, purge).await, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // JSON that the browser says another site sent.
    for site in ["cross-site", "same-site"] {
        for (uri, body) in [
            ("/admin/keys/resolve", resolve_body(&key, "done")),
            ("/admin/purge", r#"{"older_than_s": 0}"#.to_owned()),
        ] {
            let req = Request::post(uri)
                .header(header::CONTENT_TYPE, "application/json")
                .header("sec-fetch-site", site)
                .body(Body::from(body))
                .unwrap();
            assert_problem(&send(&app, req).await, StatusCode::FORBIDDEN);
        }
    }

    // The claim is still held; the page's own request (same origin) resolves it.
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "processing", "{}", described.text);
    let own = send(
        &app,
        post_json("/admin/keys/resolve", resolve_body(&key, "done")),
    )
    .await;
    assert_eq!(own.body, json!({ "resolved": true }), "{}", own.text);
}

async fn require_token(req: AxumRequest, next: Next) -> Result<AxumResponse, StatusCode> {
    match req.headers().get(header::AUTHORIZATION) {
        Some(value) if value == "Bearer let-me-in" => Ok(next.run(req).await),
        _ => Err(StatusCode::UNAUTHORIZED),
    }
}

async fn every_route_is_behind_the_auth_layer<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-auth");
    let key = held_claim(&store, &ns, "evt_1").await;
    let routes = || {
        [
            (Method::GET, "/admin".to_owned(), String::new()),
            (Method::GET, "/admin/claims".to_owned(), String::new()),
            (Method::GET, describe_uri(&key), String::new()),
            (
                Method::POST,
                "/admin/keys/resolve".to_owned(),
                resolve_body(&key, "release"),
            ),
            (
                Method::POST,
                "/admin/purge".to_owned(),
                r#"{"older_than_s": 3600}"#.to_owned(),
            ),
        ]
    };
    let request = |method: &Method, uri: &str, body: &str, token: Option<&str>| {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, token);
        }
        req.body(Body::from(body.to_owned())).unwrap()
    };

    // `.layer` on the application's router: every path under it, unknown ones too.
    let layered = Router::new()
        .nest("/admin", Admin::new(store.clone()).stale(HOLD).router())
        .layer(middleware::from_fn(require_token));
    // `.route_layer` on the admin router: every route it has.
    let route_layered = Router::new().nest(
        "/admin",
        Admin::new(store.clone())
            .stale(HOLD)
            .router()
            .route_layer(middleware::from_fn(require_token)),
    );
    for app in [&layered, &route_layered] {
        for (method, uri, body) in routes() {
            for token in [None, Some("Bearer wrong")] {
                let answer = send(app, request(&method, &uri, &body, token)).await;
                assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
            }
        }
    }
    let unknown = send(&layered, request(&Method::GET, "/admin/x", "", None)).await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    // Nothing of it resolved the claim.
    let described = send(
        &layered,
        request(
            &Method::GET,
            &describe_uri(&key),
            "",
            Some("Bearer let-me-in"),
        ),
    )
    .await;
    assert_eq!(described.body["state"], "processing", "{}", described.text);

    for app in [&layered, &route_layered] {
        // Each pass releases the claim, then claims it again for the next.
        let (Claim::Acquired(_) | Claim::Held(_)) = store.claim(&key, HOLD).await.unwrap() else {
            panic!("the key is free or held")
        };
        // Not renewed past the stale limit: held, so resolving needs no force.
        tokio::time::sleep(PAST_SHORT).await;
        for (method, uri, body) in routes() {
            let answer = send(app, request(&method, &uri, &body, Some("Bearer let-me-in"))).await;
            assert_eq!(
                answer.status,
                StatusCode::OK,
                "{method} {uri}: {}",
                answer.text
            );
        }
    }
}

/// The entry of `key` in `GET /claims?older_than_s=0` of `app`.
async fn listed_entry(app: &Router, key: &IdempotencyKey) -> Value {
    let listed = send(app, get("/admin/claims?older_than_s=0")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let entry = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|claim| claim["namespace"] == key.namespace() && claim["key"] == key.value())
        .cloned();
    entry.unwrap_or_else(|| panic!("{key} not listed: {}", listed.text))
}

async fn a_running_claim_is_resolved_only_when_forced<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-running");
    let key = key_in(&ns, "evt_1");
    // A live owner: claimed just now under a limit the test never reaches.
    let Claim::Acquired(lease) = store.claim(&key, LIVE).await.unwrap() else {
        panic!("claim {key}")
    };
    let app = mounted(Admin::new(store.clone()).stale(LIVE));

    let entry = listed_entry(&app, &key).await;
    assert_eq!(entry["state"], "running", "{entry}");
    assert!(
        entry["why"].as_str().unwrap().contains("renewed it within"),
        "{entry}"
    );
    let left = entry["stale_in_s"].as_f64().unwrap();
    assert!(left > 500.0 && left <= 600.0, "{entry}");

    // Refused, without `force` or with it false; the claim is untouched.
    for resolution in ["release", "done"] {
        for body in [
            resolve_body(&key, resolution),
            json!({
                "namespace": key.namespace(), "key": key.value(),
                "resolution": resolution, "force": false,
            })
            .to_string(),
        ] {
            let refused = send(&app, post_json("/admin/keys/resolve", body)).await;
            assert_problem(&refused, StatusCode::CONFLICT);
            let detail = refused.body["detail"].as_str().unwrap();
            assert!(detail.contains("running"), "{detail}");
            assert!(detail.contains("renewed it"), "{detail}");
            assert!(detail.contains("force"), "{detail}");
        }
    }
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "processing", "{}", described.text);
    let (status, outcome, ran) = deliver_under(&store, &ns, "evt_1", LIVE).await;
    assert_eq!(
        (status, outcome.as_str(), ran),
        (StatusCode::CONFLICT, "in-flight", false),
        "the next delivery still sees it in flight"
    );
    store
        .renew(&lease)
        .await
        .expect("the owner still holds its lease");

    // Forced: released, the owner's lease is fenced off, the next delivery runs.
    let forced = json!({
        "namespace": key.namespace(), "key": key.value(),
        "resolution": "release", "force": true,
    });
    let resolved = send(&app, post_json("/admin/keys/resolve", forced.to_string())).await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);
    assert_eq!(resolved.body, json!({ "resolved": true }));
    let described = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(described.body["state"], "released", "{}", described.text);
    assert!(
        matches!(store.commit(&lease).await, Err(StoreError::LeaseLost)),
        "the owner's later commit fails"
    );
    let (status, outcome, ran) = deliver_under(&store, &ns, "evt_1", LIVE).await;
    assert_eq!((status, outcome.as_str(), ran), (StatusCode::OK, "", true));
}

async fn a_stale_claim_is_listed_as_such_and_resolved<St: Store + Clone>(store: St) {
    let _shared = common::SHARED_TABLE.read().await;
    let ns = unique_namespace("admin-stale");
    let key = held_claim(&store, &ns, "evt_1").await;

    // Under the hold policy it is held; under reclaim, stale (the next delivery takes it).
    let held = listed_entry(&mounted(Admin::new(store.clone()).stale(HOLD)), &key).await;
    assert_eq!(held["state"], "held", "{held}");
    assert!(
        held["why"].as_str().unwrap().contains("hold policy"),
        "{held}"
    );
    assert_eq!(held["stale_in_s"], Value::Null, "{held}");
    let reclaim = Stale::reclaim_after(SHORT);
    let stale = listed_entry(&mounted(Admin::new(store.clone()).stale(reclaim)), &key).await;
    assert_eq!(stale["state"], "stale", "{stale}");
    assert!(
        stale["why"].as_str().unwrap().contains("reclaims"),
        "{stale}"
    );
    // Under the default limit of 30 s, the same claim is still running.
    let default = listed_entry(&mounted(Admin::new(store.clone())), &key).await;
    assert_eq!(default["state"], "running", "{default}");

    // Past the limit: resolved without `force`.
    let app = mounted(Admin::new(store.clone()).stale(HOLD));
    let resolved = send(
        &app,
        post_json("/admin/keys/resolve", resolve_body(&key, "done")),
    )
    .await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);
    assert_eq!(resolved.body, json!({ "resolved": true }));
    let (status, outcome, ran) = deliver(&store, &ns, "evt_1").await;
    assert_eq!(
        (status, outcome.as_str(), ran),
        (StatusCode::OK, "duplicate", false)
    );
}

macro_rules! admin_suite {
    ($name:ident, $store:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn held_claim_is_listed_and_described() {
                let Some(store) = $store else { return };
                super::held_claim_is_listed_and_described(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_receipt_is_described() {
                let Some(store) = $store else { return };
                super::a_receipt_is_described(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resolve_done_makes_the_next_delivery_a_duplicate() {
                let Some(store) = $store else { return };
                super::resolve_done_makes_the_next_delivery_a_duplicate(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resolve_release_lets_the_next_delivery_run() {
                let Some(store) = $store else { return };
                super::resolve_release_lets_the_next_delivery_run(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_running_claim_is_resolved_only_when_forced() {
                let Some(store) = $store else { return };
                super::a_running_claim_is_resolved_only_when_forced(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stale_claim_is_listed_as_such_and_resolved() {
                let Some(store) = $store else { return };
                super::a_stale_claim_is_listed_as_such_and_resolved(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn purge_removes_an_old_done_key() {
                let Some(store) = $store else { return };
                super::purge_removes_an_old_done_key(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bad_input_is_a_problem() {
                let Some(store) = $store else { return };
                super::bad_input_is_a_problem(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cross_site_posts_are_refused() {
                let Some(store) = $store else { return };
                super::cross_site_posts_are_refused(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_route_is_behind_the_auth_layer() {
                let Some(store) = $store else { return };
                super::every_route_is_behind_the_auth_layer(store).await;
            }
        }
    };
}

admin_suite!(memory, Some(tower_idempotency::store::MemoryStore::new()));
admin_suite!(sqlite, crate::sqlite().await);
admin_suite!(postgres, crate::postgres().await);
admin_suite!(mysql, crate::mysql().await);
admin_suite!(redis, crate::redis().await);

/// The page, at the mount path with and without its trailing slash: HTML under a policy that
/// runs only its own script and forbids framing.
#[tokio::test]
async fn the_page_is_served_with_its_policy() {
    let app = mounted(Admin::new(tower_idempotency::store::MemoryStore::new()));
    let answer = send(&app, get("/admin")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.headers[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    assert!(answer.text.contains("Held and stuck claims"));
    let policy = answer.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(policy.contains("default-src 'none'"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("script-src 'sha256-"), "{policy}");
    assert_eq!(answer.headers[header::X_FRAME_OPTIONS], "DENY");
    assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");

    // axum 0.8 routes `/admin/` into no router nested at `/admin`; `nest_service` hands it
    // both, and the page's relative URLs work from either.
    let store = tower_idempotency::store::MemoryStore::new();
    let service: Router = Router::new().nest_service("/admin", Admin::new(store).router());
    for uri in ["/admin", "/admin/"] {
        let answer = send(&service, get(uri)).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}");
        assert!(answer.text.contains("Held and stuck claims"), "{uri}");
    }
    assert_eq!(send(&service, get("/admin/claims")).await.body, json!([]));
}

/// A store that always fails, as one whose database is down.
#[derive(Clone)]
struct Down;

fn down() -> StoreError {
    StoreError::backend(std::io::Error::other("connection refused"))
}

impl Store for Down {
    async fn claim(&self, _: &IdempotencyKey, _: Stale) -> Result<Claim, StoreError> {
        Err(down())
    }
    async fn renew(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
    async fn commit(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
    async fn commit_with(&self, _: &Lease, _: &Receipt) -> Result<(), StoreError> {
        Err(down())
    }
    async fn release(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
    async fn give_back(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
    async fn describe(&self, _: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        Err(down())
    }
    async fn stuck_claims(&self, _: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        Err(down())
    }
    async fn resolve(&self, _: &IdempotencyKey, _: Resolution) -> Result<bool, StoreError> {
        Err(down())
    }
    async fn purge_completed(&self, _: Duration) -> Result<u64, StoreError> {
        Err(down())
    }
}

async fn every_route_is_503_when_the_store_fails<St: Store + Clone>(store: St) {
    let app = mounted(Admin::new(store));
    let key = key_in("github@/hook", "evt_1");
    for req in [
        get("/admin/claims"),
        get(&describe_uri(&key)),
        post_json("/admin/keys/resolve", resolve_body(&key, "done")),
        post_json("/admin/purge", "{}"),
    ] {
        let answer = send(&app, req).await;
        assert_problem(&answer, StatusCode::SERVICE_UNAVAILABLE);
    }
    // The page itself needs no store.
    assert_eq!(send(&app, get("/admin")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_failing_store_is_503() {
    every_route_is_503_when_the_store_fails(Down).await;
    let answer = send(&mounted(Admin::new(Down)), get("/admin/claims")).await;
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(detail.contains("connection refused"), "{detail}");
}

/// A real backend whose connections are gone: the SQLite store on a closed pool.
#[tokio::test]
async fn a_closed_pool_is_503() {
    let pool = common::db::sqlite_file_pool(common::db::sqlite_file("admin")).await;
    let store = tower_idempotency::store::SqliteStore::new(pool.clone());
    pool.close().await;
    every_route_is_503_when_the_store_fails(store).await;
}

/// The router is `Router<()>`: it nests into any application, and answers as a service.
#[tokio::test]
async fn the_router_is_a_plain_service() {
    let store = tower_idempotency::store::MemoryStore::new();
    let merged: Router = Router::new().merge(Admin::new(store.clone()).router());
    let answer = send(&merged, get("/claims")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, json!([]));
    let _: Result<AxumResponse, Infallible> = Admin::new(store).router().oneshot(get("/")).await;
}

/// With the layer's journal, a key's description also tells its latest outcome in this
/// process and the sender's attempt number.
#[tokio::test]
async fn the_journal_adds_the_latest_outcome_and_attempt() {
    let store = tower_idempotency::store::MemoryStore::new();
    let journal = tower_idempotency::Journal::new(64);
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace("journaled"))
        .journal(&journal);
    let svc = counting_layer_service(layer, runs.clone());
    for attempt in ["0", "1"] {
        let mut req = delivery("evt_1");
        req.headers_mut()
            .insert("x-slack-retry-num", http::HeaderValue::from_static(attempt));
        svc.clone().oneshot(req).await.unwrap();
    }
    let key = IdempotencyKey::new("journaled", "evt_1").unwrap();
    let app = mounted(Admin::new(store.clone()).journal(&journal));
    let answer = send(&app, get(&describe_uri(&key))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.body["deliveries"], 2);
    assert_eq!(answer.body["last"]["outcome"], "duplicate");
    assert_eq!(answer.body["last"]["attempt"], 1);
    // Without the journal, `last` is null.
    let answer = send(&mounted(Admin::new(store)), get(&describe_uri(&key))).await;
    assert_eq!(answer.body["last"], Value::Null);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A long list is cut at its limit (the longest stuck first), and says how long it was.
#[tokio::test]
async fn a_long_list_of_claims_is_cut_at_its_limit() {
    let store = tower_idempotency::store::MemoryStore::new();
    let ns = unique_namespace("admin-limit");
    for i in 0..5 {
        let key = key_in(&ns, &format!("evt_{i}"));
        assert!(matches!(
            store.claim(&key, HOLD).await.unwrap(),
            Claim::Acquired(_)
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let app = mounted(Admin::new(store));
    let keys = |answer: &Answer| -> Vec<String> {
        let listed = answer.body.as_array().expect("a list");
        listed
            .iter()
            .map(|c| c["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let cut = send(&app, get("/admin/claims?older_than_s=0&limit=2")).await;
    assert_eq!(cut.status, StatusCode::OK, "{}", cut.text);
    assert_eq!(cut.headers["x-total-count"], "5");
    assert_eq!(keys(&cut), ["evt_0", "evt_1"], "the longest stuck first");
    let all = send(&app, get("/admin/claims?older_than_s=0")).await;
    assert_eq!(all.headers["x-total-count"], "5");
    assert_eq!(keys(&all).len(), 5, "under the default limit");
    for limit in ["0", "1001", "two", "-1", ""] {
        let uri = format!("/admin/claims?older_than_s=0&limit={limit}");
        assert_problem(&send(&app, get(&uri)).await, StatusCode::BAD_REQUEST);
    }
}
