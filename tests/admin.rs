//! The operators' router on every store: what it lists and describes, what resolving and
//! purging do to the next delivery, its errors, its refusal of cross-site requests, and its
//! place behind the application's authentication; and, on the memory store, the inbox's
//! routes: its entries and their history, their stored requests, retrying and discarding.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response as AxumResponse;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_idempotency::admin::Admin;
use tower_idempotency::body::BoxError;
use tower_idempotency::inbox::{Backoff, Inbox};
use tower_idempotency::store::MemoryStore;
use tower_idempotency::store::inbox::{
    Attempt, AttemptResult, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running,
    Settlement, StoredRequest, Take, Taken,
};
use tower_idempotency::store::{
    Claim, Fingerprint, KeyRecord, Lease, LeaseToken, Receipt, Resolution, Store, StoreError,
    StoredResponse, StuckClaim,
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

// The inbox's routes, on the memory store (the store that holds an inbox).

/// The admin router with the inbox's routes, at `/admin`.
fn with_inbox(store: &MemoryStore) -> Router {
    mounted(Admin::new(store.clone()).inbox())
}

fn entry_uri(key: &IdempotencyKey) -> String {
    format!(
        "/admin/inbox/entry?namespace={}&key={}",
        encode(key.namespace()),
        encode(key.value())
    )
}

fn key_body(key: &IdempotencyKey) -> String {
    json!({ "namespace": key.namespace(), "key": key.value() }).to_string()
}

/// The listed entries' keys, in order.
fn listed_keys(answer: &Answer) -> Vec<&str> {
    answer.body["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("a list of entries: {}", answer.text))
        .iter()
        .map(|entry| entry["key"].as_str().unwrap())
        .collect()
}

/// The entry of `key`, as the store describes it now.
async fn inbox_entry(store: &MemoryStore, key: &IdempotencyKey) -> Entry {
    store.entry(key).await.unwrap().expect("an entry")
}

/// Waits until the workers (tasks of their own) brought the entry of `key` to `state`.
async fn until_state(store: &MemoryStore, key: &IdempotencyKey, state: EntryState) {
    for _ in 0..12_000 {
        if store.entry(key).await.unwrap().map(|e| e.state) == Some(state) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{key} never became {state:?}");
}

fn stored(body: impl Into<Bytes>) -> StoredRequest {
    StoredRequest::new(http::Method::POST, "/hooks", Vec::new(), body.into())
}

/// Stores a delivery of `id` in `ns`, as an inbox layer does.
async fn enqueue(
    store: &MemoryStore,
    ns: &str,
    id: &str,
    request: &StoredRequest,
) -> IdempotencyKey {
    let key = key_in(ns, id);
    assert_eq!(
        store.enqueue(&key, request).await.unwrap(),
        Enqueued::Stored
    );
    key
}

/// Takes the one due entry, which must be `key`'s, and starts it.
async fn take(store: &MemoryStore, key: &IdempotencyKey) -> Taken {
    let mut taken = store.take(&Take::up_to(1)).await.unwrap();
    assert_eq!(taken.len(), 1, "one entry due");
    let taken = taken.remove(0);
    assert_eq!(taken.lease.key(), key);
    // Started, as a worker starts what it takes.
    let started = store.start(std::slice::from_ref(&taken.lease)).await;
    assert_eq!(started.unwrap(), [true]);
    taken
}

/// A delivery to the inbox app's `/hooks`.
fn hook(id: &str, body: &'static str) -> Request<Body> {
    Request::post("/hooks")
        .header("x-event-id", id)
        .header(header::AUTHORIZATION, "Bearer sender-secret")
        .body(Body::from(body))
        .unwrap()
}

/// Entries stored by an inbox layer and run by its workers: failed attempts end dead, listed
/// with their history (a status, an error); retried by hand, they run; the stored request is
/// shown without the credentials the layer never keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_entry_shows_its_history_is_retried_and_runs() {
    let store = MemoryStore::new();
    let inbox = Inbox::new(store.clone());
    let broken = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let app = {
        let (broken, runs) = (broken.clone(), runs.clone());
        Router::new().route(
            "/hooks",
            post(move |body: String| async move {
                if broken.load(Ordering::SeqCst) && body == "fail" {
                    return StatusCode::INTERNAL_SERVER_ERROR;
                }
                runs.fetch_add(1, Ordering::SeqCst);
                StatusCode::NO_CONTENT
            })
            .layer(
                inbox
                    .layer()
                    .unverified()
                    .key(key::header("x-event-id").namespace("shop")),
            ),
        )
    };
    // The workers' service fails `evt_err` while broken, as a service whose dependency is down.
    let service = {
        let (app, broken) = (app.clone(), broken.clone());
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let (app, broken) = (app.clone(), broken.clone());
            async move {
                if broken.load(Ordering::SeqCst) && req.headers()["x-event-id"] == "evt_err" {
                    return Err::<AxumResponse, BoxError>("the ledger is unreachable".into());
                }
                app.oneshot(req).await.map_err(BoxError::from)
            }
        })
    };
    for (id, body) in [
        ("evt_err", "{}"),
        ("evt_500", "fail"),
        ("evt_ok", "{\"ok\":true}"),
    ] {
        let res = app.clone().oneshot(hook(id, body)).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{id}");
    }
    let ns = "shop@/hooks";
    let (err, failing, ok) = (
        key_in(ns, "evt_err"),
        key_in(ns, "evt_500"),
        key_in(ns, "evt_ok"),
    );
    let workers = inbox
        .workers(service)
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
            2,
        ))
        .poll_interval(Duration::from_millis(5))
        .spawn();
    until_state(&store, &err, EntryState::Dead).await;
    until_state(&store, &failing, EntryState::Dead).await;
    until_state(&store, &ok, EntryState::Done).await;
    let app = with_inbox(&store);

    // Listed by default: the dead, not the done; the oldest first.
    let listed = send(&app, get("/admin/inbox")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(listed.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(
        listed.body["stats"],
        json!({ "queued": 0, "running": 0, "dead": 2, "oldest_due_s": null })
    );
    assert_eq!(listed_keys(&listed), ["evt_err", "evt_500"]);
    let dead = &listed.body["entries"][0];
    assert_eq!(dead["namespace"], ns);
    assert_eq!(dead["state"], "dead");
    assert_eq!(
        (&dead["attempts"], &dead["crashes"]),
        (&json!(2), &json!(0))
    );
    assert_eq!(
        (&dead["due_in_s"], &dead["since_renewal_s"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(
        (&dead["stuck"], &dead["has_request"]),
        (&json!(false), &json!(true))
    );
    assert!(dead["age_s"].is_number(), "{dead}");
    let history = dead["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{dead}");
    for attempt in history {
        // The service failed before the request reached its route.
        assert_eq!(
            attempt["error"],
            "did not reach its inbox route: the app failed: the ledger is unreachable",
            "{attempt}"
        );
        assert!(attempt["at_ms"].as_u64().unwrap() > 0, "{attempt}");
        assert!(attempt["duration_ms"].is_u64(), "{attempt}");
        assert!(attempt.get("status").is_none(), "{attempt}");
    }
    assert_eq!(dead["last"], history[1]);
    let failed = &listed.body["entries"][1];
    assert_eq!(failed["last"]["status"], 500, "{failed}");
    let done = send(&app, get("/admin/inbox?state=done")).await;
    assert_eq!(listed_keys(&done), ["evt_ok"]);
    assert_eq!(done.body["entries"][0]["history"][0]["status"], 204);

    // The request the workers ran, as the layer stored it: no credentials.
    let shown = send(&app, get(&entry_uri(&ok))).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
    assert_eq!(shown.body["state"], "done");
    let request = &shown.body["request"];
    assert_eq!(
        (&request["method"], &request["uri"]),
        (&json!("POST"), &json!("/hooks"))
    );
    let headers = request["headers"].as_array().unwrap();
    assert!(
        headers.contains(&json!(["x-event-id", "evt_ok"])),
        "{request}"
    );
    assert!(
        headers.iter().all(|pair| pair[0] != "authorization"),
        "{request}"
    );
    assert_eq!(request["body"], "{\"ok\":true}");
    assert_eq!(request["body_encoding"], "utf-8");
    assert_eq!(
        (&request["body_bytes"], &request["truncated"]),
        (&json!(11), &json!(false))
    );

    // Retried by hand once its dependency is back: it runs, its attempts counted anew.
    broken.store(false, Ordering::SeqCst);
    let retried = send(&app, post_json("/admin/inbox/retry", key_body(&err))).await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.text);
    assert_eq!(retried.body, json!({ "retried": true }));
    until_state(&store, &err, EntryState::Done).await;
    let entry = send(&app, get(&entry_uri(&err))).await;
    assert_eq!(entry.body["state"], "done", "{}", entry.text);
    assert_eq!(entry.body["attempts"], 1);
    assert_eq!(entry.body["history"].as_array().unwrap().len(), 3);
    assert_eq!(entry.body["last"]["status"], 204);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "evt_ok, then evt_err");

    // The namespace's dead, all at once: the one left runs.
    let all = json!({ "namespace": ns }).to_string();
    let retried = send(&app, post_json("/admin/inbox/retry-dead", all.clone())).await;
    assert_eq!(retried.body, json!({ "retried": 1 }), "{}", retried.text);
    until_state(&store, &failing, EntryState::Done).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let none = send(&app, post_json("/admin/inbox/retry-dead", all)).await;
    assert_eq!(none.body, json!({ "retried": 0 }));

    // A done entry is neither retried nor discarded.
    for route in ["/admin/inbox/retry", "/admin/inbox/discard"] {
        let refused = send(&app, post_json(route, key_body(&err))).await;
        assert_problem(&refused, StatusCode::NOT_FOUND);
        let detail = refused.body["detail"].as_str().unwrap();
        assert!(detail.contains("is done"), "{detail}");
    }
    workers.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// Discarding marks a queued entry done without running it: no worker takes it, and its
/// next copy is a duplicate. A running entry whose worker renews it is refused (409) unless
/// forced; forced, its worker's lease is spent.
#[tokio::test]
async fn discard_marks_an_entry_done() {
    let store = MemoryStore::new();
    let inbox = Inbox::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let hooks = Router::new().route(
        "/hooks",
        post(move || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::NO_CONTENT
        })
        .layer(
            inbox
                .layer()
                .unverified()
                .key(key::header("x-event-id").namespace("shop")),
        ),
    );
    let res = hooks.clone().oneshot(hook("evt_1", "{}")).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let key = key_in("shop@/hooks", "evt_1");
    let app = with_inbox(&store);

    let discarded = send(&app, post_json("/admin/inbox/discard", key_body(&key))).await;
    assert_eq!(discarded.status, StatusCode::OK, "{}", discarded.text);
    assert_eq!(discarded.body, json!({ "discarded": true }));
    let entry = send(&app, get(&entry_uri(&key))).await;
    assert_eq!(entry.body["state"], "done", "{}", entry.text);
    assert_eq!(entry.body["attempts"], 0);
    assert_eq!(entry.body["last"], Value::Null);
    assert!(
        store.take(&Take::default()).await.unwrap().is_empty(),
        "nothing to run"
    );
    let again = hooks.clone().oneshot(hook("evt_1", "{}")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK, "a duplicate");
    let refused = send(&app, post_json("/admin/inbox/discard", key_body(&key))).await;
    assert_problem(&refused, StatusCode::NOT_FOUND);

    // A running entry: its worker holds it, and renews it.
    let running = enqueue(&store, "shop@/hooks", "evt_2", &stored("{}")).await;
    let taken = take(&store, &running).await;
    for route in ["/admin/inbox/discard", "/admin/inbox/retry"] {
        let refused = send(&app, post_json(route, key_body(&running))).await;
        assert_problem(&refused, StatusCode::CONFLICT);
        let detail = refused.body["detail"].as_str().unwrap();
        assert!(detail.contains("is running"), "{detail}");
    }
    assert_eq!(
        inbox_entry(&store, &running).await.state,
        EntryState::Running
    );
    let forced = json!({ "namespace": running.namespace(), "key": running.value(), "force": true });
    let discarded = send(&app, post_json("/admin/inbox/discard", forced.to_string())).await;
    assert_eq!(discarded.status, StatusCode::OK, "{}", discarded.text);
    assert_eq!(inbox_entry(&store, &running).await.state, EntryState::Done);
    let settled = store
        .settle(
            &taken.lease,
            &tower_idempotency::store::inbox::Settlement::Done,
            &[],
        )
        .await;
    assert!(
        matches!(
            settled,
            Err(tower_idempotency::store::StoreError::LeaseLost)
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The list: its default states, its filters by state and namespace, its limit, the oldest
/// first; a history of each kind; a queued entry waiting for its retry; a running entry
/// stuck past the stale limit.
#[tokio::test]
async fn the_inbox_is_listed_filtered_and_cut() {
    let store = MemoryStore::new();
    let running = enqueue(&store, "beta", "b_running", &stored("{}")).await;
    let _held = take(&store, &running).await;
    let dead = enqueue(&store, "alpha", "a_dead", &stored("{}")).await;
    let taken = take(&store, &dead).await;
    let history = [
        Attempt::new(1_000, 40, AttemptResult::Status(503)),
        Attempt::new(2_000, 7, AttemptResult::Error("boom".into())),
        Attempt::new(3_000, 0, AttemptResult::Crashed),
    ];
    store
        .settle(&taken.lease, &Settlement::Dead, &history)
        .await
        .unwrap();
    let retrying = enqueue(&store, "alpha", "a_retrying", &stored("{}")).await;
    let taken = take(&store, &retrying).await;
    let later = Settlement::Retry {
        after: Duration::from_secs(3600),
    };
    store
        .settle(&taken.lease, &later, &history[..1])
        .await
        .unwrap();
    for id in ["a_1", "a_2", "a_3"] {
        enqueue(&store, "alpha", id, &stored("{}")).await;
    }
    let app = with_inbox(&store);

    let all = send(&app, get("/admin/inbox")).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    assert_eq!(
        listed_keys(&all),
        ["b_running", "a_dead", "a_retrying", "a_1", "a_2", "a_3"]
    );
    let stats = &all.body["stats"];
    assert_eq!(
        (&stats["queued"], &stats["running"], &stats["dead"]),
        (&json!(4), &json!(1), &json!(1))
    );
    assert!(stats["oldest_due_s"].is_number(), "{stats}");
    let entries = all.body["entries"].as_array().unwrap();
    let (b_running, a_dead, a_retrying) = (&entries[0], &entries[1], &entries[2]);
    assert_eq!(b_running["state"], "running");
    assert_eq!(b_running["attempts"], 1);
    assert!(b_running["since_renewal_s"].is_number(), "{b_running}");
    assert_eq!(b_running["stuck"], false, "renewed within the default 30 s");
    assert_eq!(b_running["due_in_s"], Value::Null);
    assert_eq!(
        a_dead["history"],
        json!([
            { "at_ms": 1000, "duration_ms": 40, "status": 503 },
            { "at_ms": 2000, "duration_ms": 7, "error": "boom" },
            { "at_ms": 3000, "duration_ms": 0, "crashed": true },
        ])
    );
    assert_eq!(
        a_dead["last"],
        json!({ "at_ms": 3000, "duration_ms": 0, "crashed": true })
    );
    assert_eq!(
        (&a_retrying["state"], &a_retrying["attempts"]),
        (&json!("queued"), &json!(1))
    );
    let due_in = a_retrying["due_in_s"].as_f64().unwrap();
    assert!(due_in > 3000.0 && due_in <= 3600.0, "{a_retrying}");
    assert_eq!(entries[3]["due_in_s"], 0.0, "a new entry is due at once");

    // Past the stale limit the router is told: stuck.
    let strict = mounted(
        Admin::new(store.clone())
            .stale(Stale::hold_after(Duration::ZERO))
            .inbox(),
    );
    let listed = send(&strict, get("/admin/inbox?state=running")).await;
    assert_eq!(listed_keys(&listed), ["b_running"]);
    assert_eq!(listed.body["entries"][0]["stuck"], true);

    let alpha = send(&app, get("/admin/inbox?namespace=alpha")).await;
    assert_eq!(
        listed_keys(&alpha),
        ["a_dead", "a_retrying", "a_1", "a_2", "a_3"]
    );
    assert_eq!(alpha.body["stats"]["running"], 0);
    assert_eq!(alpha.body["stats"]["queued"], 4);
    let some = send(&app, get("/admin/inbox?state=dead,running")).await;
    assert_eq!(listed_keys(&some), ["b_running", "a_dead"]);
    let queued = send(
        &app,
        get("/admin/inbox?state=queued&namespace=alpha&limit=2"),
    )
    .await;
    assert_eq!(listed_keys(&queued), ["a_retrying", "a_1"]);
    let cut = send(&app, get("/admin/inbox?limit=1")).await;
    assert_eq!(listed_keys(&cut), ["b_running"]);
    let most = send(&app, get("/admin/inbox?limit=1000")).await;
    assert_eq!(listed_keys(&most).len(), 6);
    let done = send(&app, get("/admin/inbox?state=done")).await;
    assert_eq!(done.body["entries"], json!([]));
    let nobody = send(&app, get("/admin/inbox?namespace=gamma")).await;
    assert_eq!(nobody.body["entries"], json!([]));
    assert_eq!(nobody.body["stats"]["queued"], 0);
}

/// A stored request: header values read as UTF-8 whatever their bytes, a body of bytes as
/// base64, a long body cut at 64 KiB, and none once retention deleted it.
#[tokio::test]
async fn the_stored_request_is_shown() {
    let store = MemoryStore::new();
    let app = with_inbox(&store);
    let headers = vec![
        (
            http::HeaderName::from_static("x-note"),
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        ),
        (
            http::HeaderName::from_static("x-event-id"),
            http::HeaderValue::from_static("bin"),
        ),
    ];
    let binary = StoredRequest::new(
        http::Method::PUT,
        "/hooks?source=test",
        headers,
        Bytes::from_static(&[0xff, 0xfe, 0x00, 0x01]),
    );
    let key = enqueue(&store, "alpha", "bin", &binary).await;
    let shown = send(&app, get(&entry_uri(&key))).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
    assert_eq!(shown.body["state"], "queued");
    assert_eq!(
        shown.body["request"],
        json!({
            "method": "PUT",
            "uri": "/hooks?source=test",
            "headers": [["x-note", "caf\u{fffd}"], ["x-event-id", "bin"]],
            "body": "//4AAQ==",
            "body_encoding": "base64",
            "body_bytes": 4,
            "truncated": false,
        })
    );

    let long = enqueue(&store, "alpha", "long", &stored("x".repeat(100 * 1024))).await;
    let shown = send(&app, get(&entry_uri(&long))).await;
    let request = &shown.body["request"];
    assert_eq!(request["body"].as_str().unwrap().len(), 64 * 1024);
    assert_eq!(request["body_encoding"], "utf-8");
    assert_eq!(
        (&request["body_bytes"], &request["truncated"]),
        (&json!(100 * 1024), &json!(true))
    );

    // Done, and its request deleted by retention: the entry stays, its request is null.
    let discarded = send(&app, post_json("/admin/inbox/discard", key_body(&key))).await;
    assert_eq!(discarded.status, StatusCode::OK, "{}", discarded.text);
    store
        .purge_inbox(Duration::ZERO, Duration::from_secs(3600), 100)
        .await
        .unwrap();
    let shown = send(&app, get(&entry_uri(&key))).await;
    assert_eq!(shown.body["state"], "done", "{}", shown.text);
    assert_eq!(
        (&shown.body["has_request"], &shown.body["request"]),
        (&json!(false), &Value::Null)
    );

    let unknown = send(&app, get(&entry_uri(&key_in("alpha", "never")))).await;
    assert_problem(&unknown, StatusCode::NOT_FOUND);
}

/// Bad queries and bodies are 4xx problems, cross-site writes are refused, and the routes are
/// unknown to a router without the inbox.
#[tokio::test]
async fn bad_inbox_input_is_a_problem() {
    let store = MemoryStore::new();
    let key = enqueue(&store, "alpha", "evt_1", &stored("{}")).await;
    let app = with_inbox(&store);

    for uri in [
        "/admin/inbox?state=bogus",
        "/admin/inbox?state=",
        "/admin/inbox?state=dead,",
        "/admin/inbox?state=retrying",
        "/admin/inbox?limit=0",
        "/admin/inbox?limit=1001",
        "/admin/inbox?limit=ten",
        "/admin/inbox?namespace=",
        "/admin/inbox?namespace=%0A",
        "/admin/inbox/entry",
        "/admin/inbox/entry?namespace=alpha",
        "/admin/inbox/entry?key=evt_1",
        "/admin/inbox/entry?namespace=alpha&key=evt%0A1",
        "/admin/inbox/entry?namespace=alpha&key=",
    ] {
        assert_problem(&send(&app, get(uri)).await, StatusCode::BAD_REQUEST);
    }
    for route in ["/admin/inbox/retry", "/admin/inbox/discard"] {
        for body in [r#"{"namespace": "#, "", "{} {}"] {
            let answer = send(&app, post_json(route, body)).await;
            assert_problem(&answer, StatusCode::BAD_REQUEST);
        }
        for body in [
            json!([]),
            json!({}),
            json!({ "namespace": "alpha" }),
            json!({ "namespace": "alpha", "key": 1 }),
            json!({ "namespace": "alpha", "key": "evt_1", "force": "yes" }),
            json!({ "namespace": "alpha", "key": "evt_1", "other": true }),
            json!({ "namespace": "alpha", "key": "evt\n1" }),
            json!({ "namespace": "", "key": "evt_1" }),
        ] {
            let answer = send(&app, post_json(route, body.to_string())).await;
            assert_problem(&answer, StatusCode::UNPROCESSABLE_ENTITY);
        }
        let unknown = send(&app, post_json(route, key_body(&key_in("alpha", "never")))).await;
        assert_problem(&unknown, StatusCode::NOT_FOUND);
        let huge = format!(r#"{{"namespace": "{}"}}"#, "x".repeat(100 * 1024));
        assert_problem(
            &send(&app, post_json(route, huge)).await,
            StatusCode::PAYLOAD_TOO_LARGE,
        );
    }
    for body in [
        json!({}),
        json!({ "namespace": "" }),
        json!({ "namespace": 5 }),
        json!({ "namespace": "alpha", "key": "evt_1" }),
    ] {
        let answer = send(&app, post_json("/admin/inbox/retry-dead", body.to_string())).await;
        assert_problem(&answer, StatusCode::UNPROCESSABLE_ENTITY);
    }

    // Wrong methods.
    assert_problem(
        &send(&app, get("/admin/inbox/retry")).await,
        StatusCode::METHOD_NOT_ALLOWED,
    );
    assert_problem(
        &send(&app, post_json("/admin/inbox", "{}")).await,
        StatusCode::METHOD_NOT_ALLOWED,
    );

    // Writes another site sent, or a form could.
    for route in [
        "/admin/inbox/retry",
        "/admin/inbox/discard",
        "/admin/inbox/retry-dead",
    ] {
        let cross = Request::post(route)
            .header(header::CONTENT_TYPE, "application/json")
            .header("sec-fetch-site", "cross-site")
            .body(Body::from(key_body(&key)))
            .unwrap();
        assert_problem(&send(&app, cross).await, StatusCode::FORBIDDEN);
        let form = Request::post(route)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("namespace=alpha&key=evt_1"))
            .unwrap();
        assert_problem(&send(&app, form).await, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }

    // None of it touched the entry.
    let entry = inbox_entry(&store, &key).await;
    assert_eq!((entry.state, entry.attempts), (EntryState::Queued, 0));

    // Without `inbox()`, the routes do not exist, the store's inbox notwithstanding.
    let plain = mounted(Admin::new(store.clone()));
    assert_problem(
        &send(&plain, get("/admin/inbox")).await,
        StatusCode::NOT_FOUND,
    );
    let retry = post_json("/admin/inbox/retry", key_body(&key));
    assert_problem(&send(&plain, retry).await, StatusCode::NOT_FOUND);
}

impl InboxStore for Down {
    async fn enqueue(&self, _: &IdempotencyKey, _: &StoredRequest) -> Result<Enqueued, StoreError> {
        Err(down())
    }
    async fn take(&self, _: &Take) -> Result<Vec<Taken>, StoreError> {
        Err(down())
    }
    async fn renew_entry(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
    async fn settle(&self, _: &Lease, _: &Settlement, _: &[Attempt]) -> Result<(), StoreError> {
        Err(down())
    }
    async fn entries(
        &self,
        _: Option<&str>,
        _: &[EntryState],
        _: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        Err(down())
    }
    async fn entry(&self, _: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        Err(down())
    }
    async fn stored_request(
        &self,
        _: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        Err(down())
    }
    async fn start(&self, _: &[Lease]) -> Result<Vec<bool>, StoreError> {
        Err(down())
    }
    async fn give_back(&self, _: &[LeaseToken]) -> Result<u64, StoreError> {
        Err(down())
    }
    async fn retry_now(&self, _: &IdempotencyKey, _: Running) -> Result<bool, StoreError> {
        Err(down())
    }
    async fn retry_dead(&self, _: &str) -> Result<u64, StoreError> {
        Err(down())
    }
    async fn discard(&self, _: &IdempotencyKey, _: Running) -> Result<bool, StoreError> {
        Err(down())
    }
    async fn inbox_stats(&self, _: Option<&str>) -> Result<InboxStats, StoreError> {
        Err(down())
    }
    async fn purge_inbox(&self, _: Duration, _: Duration, _: usize) -> Result<Purged, StoreError> {
        Err(down())
    }
}

#[tokio::test]
async fn the_inbox_routes_are_503_when_the_store_fails() {
    let app = mounted(Admin::new(Down).inbox());
    let key = key_in("alpha", "evt_1");
    for req in [
        get("/admin/inbox"),
        get(&entry_uri(&key)),
        post_json("/admin/inbox/retry", key_body(&key)),
        post_json("/admin/inbox/retry-dead", r#"{"namespace": "alpha"}"#),
        post_json("/admin/inbox/discard", key_body(&key)),
    ] {
        let answer = send(&app, req).await;
        assert_problem(&answer, StatusCode::SERVICE_UNAVAILABLE);
        let detail = answer.body["detail"].as_str().unwrap();
        assert!(detail.contains("connection refused"), "{detail}");
    }
}
