//! A webhook receiver that processes each event once, however often it arrives.
//!
//! ```sh
//! cargo run --example webhook_receiver --all-features
//! ```
//!
//! Claims live in an embedded SQLite file by default; set `DATABASE_URL` to a `postgres://`
//! or `mysql://` (`mariadb://`) URL to share them between several instances instead, or to
//! another `sqlite:` file: `AnyStore::connect` picks the store by the scheme. `PORT` picks the port
//! (default 3000).
//!
//! `DATABASE_URL` may also be a `redis://` URL (or `redis+cluster://host:port,host:port` for a
//! Redis Cluster): the claims of every claim-then-commit route (GitHub, Shopify, Standard
//! Webhooks, payments) then live in Redis. Redis has no SQL transaction, so the two parts that
//! need one stay on the embedded SQLite file of the default setup: the Stripe route, whose
//! marker commits in the same transaction as its write, and the receiver's own table of side
//! effects. The start-up line says where each lives. Every delivery prints one line: provider, key, outcome, and for processed
//! events the side effect it had. `GET /side-effects` lists every side effect recorded, so a
//! sender (see the `replay_storm` example) can check that each event had exactly one.
//! `WORK_MS` makes the Standard Webhooks handler that much slower, like a slow downstream: a
//! sender that times out sooner retries while it runs, and the work still happens once.
//!
//! `POST /webhooks/shopify/fulfilment` (and `POST /webhooks/standard/inbox`, for a Standard
//! Webhooks sender such as Svix, whose handler `WORK_MS` makes slow) goes through the inbox: the receiver stores the delivery
//! and answers 202 at once, and its workers run the fulfilment (`FULFILMENT_MS`, default 3000 ms
//! of work) later, exactly once. A fulfilment whose body says `"poison": true` always fails: it
//! is tried 3 times, a second apart, then it is dead, listed on the admin page, where "Retry
//! now" runs it again.
//!
//! Ctrl-C (or SIGTERM) shuts the receiver down cleanly: new deliveries get 503 with
//! `Retry-After`, the deliveries in flight finish and commit (handlers whose sender already
//! hung up included), then the receiver prints what the drain saw and exits.
//!
//! Set `STRIPE_WEBHOOK_SECRET`, `GITHUB_WEBHOOK_SECRET`, `SHOPIFY_WEBHOOK_SECRET` or
//! `STANDARD_WEBHOOK_SECRET` (a `whsec_…` secret, or the `whpk_…` public key of a sender that
//! signs with Ed25519) and that route verifies the sender's signature before it claims the
//! key: a forgery gets 401 and claims nothing. Without them the routes take unsigned
//! deliveries, which the curl demo below sends; a real receiver sets every secret.
//!
//! The operators' routes, `/admin/` (which settles claims), `GET /stuck` (keys in flight) and
//! `GET /metrics`, ask for HTTP Basic credentials: any user name, the admin token as the
//! password (`ADMIN_TOKEN`, or the one printed at start). Give Prometheus the same in its
//! scrape config (`basic_auth`). `GET /side-effects` stays open: it is the demo sender's check
//! (see `replay_storm`), listing event ids and counts, not something a real receiver serves.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::StatusCode;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};
use tower_idempotency::admin::Admin;
use tower_idempotency::inbox::{Backoff, Inbox, InboxDelivery, IngestLayer, WorkerHandle};
use tower_idempotency::journal::Journal as DeliveryJournal;
use tower_idempotency::store::inbox::InboxStore;
use tower_idempotency::store::{AnyStore, SqliteStore, Store};
use tower_idempotency::transactional::{TransactionalLayer, TransactionalStore, Tx};
use tower_idempotency::{
    Drain, IdempotencyKey, IdempotencyLayer, LeaseHandle, Outcome, SharedSettings, Stale, key,
    verify,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let default_file = std::env::temp_dir().join("tower-idempotency-webhook-receiver.sqlite3");
    let (store, mut storage) = match std::env::var("DATABASE_URL") {
        Ok(url) => {
            let store = AnyStore::connect(&url).await?;
            let storage = format!("{} (DATABASE_URL)", store.backend());
            (store, storage)
        }
        Err(_) => {
            let store = AnyStore::from(SqliteStore::open(&default_file).await?);
            (store, format!("SQLite file {}", default_file.display()))
        }
    };
    store.migrate().await?;
    let drain = Drain::new();
    // What the admin page shows beyond the store: each key's latest outcome here.
    let deliveries = DeliveryJournal::default();
    // The layer's metrics, rendered at GET /metrics for Prometheus.
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let ops = Ops {
        journal: deliveries,
        prometheus,
        admin_token: admin_token(),
    };
    // The one place that needs the concrete database: the Stripe route runs in the marker's
    // transaction, whose type names the database, and the receiver's own table of side
    // effects is SQL on that database. The claim-then-commit layers and GET /stuck take the
    // `AnyStore` itself.
    let (app, workers) = match &store {
        AnyStore::Sqlite(sqlite) => {
            app(&store, sqlite.clone(), sqlite.pool(), &drain, &ops).await?
        }
        AnyStore::Postgres(pg) => app(&store, pg.clone(), pg.pool(), &drain, &ops).await?,
        AnyStore::MySql(mysql) => app(&store, mysql.clone(), mysql.pool(), &drain, &ops).await?,
        // Claims in Redis; what needs SQL (the Stripe route's transaction, the side effects)
        // on the default SQLite file.
        AnyStore::Redis(_) => {
            let sqlite = SqliteStore::open(&default_file).await?;
            storage = format!(
                "{storage}; the Stripe route's transactional claims, the inbox and the side \
                 effects in SQLite file {}",
                default_file.display()
            );
            app(&store, sqlite.clone(), sqlite.pool(), &drain, &ops).await?
        }
        _ => {
            return Err(format!(
                "the receiver records its side effects in SQL, which the {} store is not: \
                 set DATABASE_URL to a sqlite:, postgres://, mysql:// or redis:// URL",
                store.backend()
            )
            .into());
        }
    };
    serve(app, addr, &storage, drain, &ops.admin_token).await?;
    // The drain waited for the running fulfilments; the workers have stopped taking.
    workers.stop().await;
    Ok(())
}

/// A route's signing secret, from the environment.
fn secret(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|secret| !secret.is_empty())
}

/// An inbox route of the demo without its secret: it stores unsigned deliveries, said out
/// loud. An inbox must verify (a forgery sent first would be the copy it keeps), so a real
/// receiver sets every secret.
fn demo_unverified<St, K>(layer: IngestLayer<St, K>, route: &str) -> IngestLayer<St, K> {
    eprintln!("{route}: no secret set; the demo's inbox stores unsigned deliveries");
    layer.unverified()
}

/// Builds the routes, one per sender, each with its own key and stale policy (and, where its
/// secret is set, its signature check), all tracked by one drain. `sql` is the store inside
/// `store` (with Redis, a SQLite store beside it), for the transactional route and the inbox;
/// `pool` its pool, for the table of side effects. The inbox's workers run on the app it
/// answers.
async fn app<S>(
    store: &AnyStore,
    sql: S,
    pool: &Pool<S::Database>,
    drain: &Drain,
    ops: &Ops,
) -> Result<(Router, WorkerHandle), Box<dyn std::error::Error>>
where
    S: TransactionalStore + InboxStore + Clone,
    S::Database: Journal,
{
    S::Database::create_table(pool).await?;
    // What every route shares: the drain that stops them all at shutdown, and the journal
    // the admin page reads (transactional mode journals nothing). Each route adds its own key
    // and stale policy, and its signature check where its secret is set.
    let shared = SharedSettings::new().drain(drain).journal(&ops.journal);
    // Stripe: the work is a database write (the order is paid), so it runs in the marker's
    // transaction: all or nothing, and a crash leaves no stale claim to decide.
    let stripe_layer = TransactionalLayer::new(sql.clone())
        .key(key::stripe())
        .with(&shared)
        .maybe_verify(secret("STRIPE_WEBHOOK_SECRET").map(verify::stripe));
    // GitHub: a notification goes out, which no transaction can take back. A claim whose
    // process died (no heartbeat for 30 s) is reclaimed: a possible duplicate message beats a
    // missing one.
    let github_layer = IdempotencyLayer::new(store.clone())
        .key(key::github())
        .stale(Stale::reclaim_after(Duration::from_secs(30)))
        .with(&shared)
        .maybe_verify(secret("GITHUB_WEBHOOK_SECRET").map(verify::github));
    // Shopify: a fulfilment ships goods. A claim whose process died is held for a person (see
    // GET /stuck); shipping twice costs more than a late shipment.
    let shopify_layer = IdempotencyLayer::new(store.clone())
        .key(key::shopify())
        .stale(Stale::hold_after(Duration::from_secs(30)))
        .on_held(|key, pending| {
            println!(
                "ALERT    {key} has not been renewed for {:?}",
                pending.since_renewal
            );
        })
        .with(&shared)
        .maybe_verify(secret("SHOPIFY_WEBHOOK_SECRET").map(verify::shopify));
    // A Standard Webhooks sender: a cache refresh, harmless to repeat: reclaim soon.
    let standard_layer = IdempotencyLayer::new(store.clone())
        .key(key::standard_webhooks())
        .stale(Stale::reclaim_after(Duration::from_secs(10)))
        .with(&shared)
        .maybe_verify(secret("STANDARD_WEBHOOK_SECRET").map(verify::standard_webhooks));
    // Shopify fulfilments take seconds, longer than Shopify waits (5 s, and 8 failures in a
    // row cancel the subscription): the inbox stores each and answers 202 at once, and the
    // workers below run it. The same signature check and key as the route above.
    let inbox = Inbox::new(sql);
    let fulfilment_layer = match secret("SHOPIFY_WEBHOOK_SECRET") {
        Some(secret) => inbox.layer().verify(verify::shopify(secret)),
        None => demo_unverified(inbox.layer(), "/webhooks/shopify/fulfilment"),
    }
    .key(key::shopify())
    .with(&shared);
    // A Standard Webhooks sender (Svix) whose handler is slow (`WORK_MS`) may go through the
    // inbox too: the same handler as /webhooks/standard, answered 202 at once.
    let standard_inbox_layer = match secret("STANDARD_WEBHOOK_SECRET") {
        Some(secret) => inbox.layer().verify(verify::standard_webhooks(secret)),
        None => demo_unverified(inbox.layer(), "/webhooks/standard/inbox"),
    }
    .key(key::standard_webhooks())
    .with(&shared);
    // An API for clients that send `Idempotency-Key`: a retried payment gets the answer the
    // first one got (replayed), and the key reused for another payment gets 422.
    let payments_layer = IdempotencyLayer::for_api(store.clone()).with(&shared);
    // The operators' page and its JSON, behind a token: it settles claims. Its stale policy
    // is the Shopify route's, whose claims wait for a person; it refuses to settle a claim
    // renewed within those 30 s (a running handler) unless told to force it.
    // It lists the inbox too (with Redis, whose claims it shows, the inbox's entries stay
    // in the SQLite file and the page says it cannot list them).
    let admin = Admin::new(store.clone())
        .stale(Stale::hold_after(Duration::from_secs(30)))
        .journal(&ops.journal)
        .stuck_after(Duration::from_secs(30))
        .inbox()
        .router()
        .layer(middleware::from_fn_with_state(
            ops.admin_token.clone(),
            require_admin_token,
        ));
    // What else only operators see: the keys in flight, and the metrics. Behind the same
    // check.
    let prometheus = ops.prometheus.clone();
    let operators = Router::new()
        .route("/stuck", get(stuck))
        .with_state(store.clone())
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        )
        .route_layer(middleware::from_fn_with_state(
            ops.admin_token.clone(),
            require_admin_token,
        ));
    let app = Router::new()
        .route(
            "/webhooks/stripe",
            post(stripe::<S::Database>).layer(stripe_layer),
        )
        .route(
            "/webhooks/github",
            post(github::<S::Database>).layer(github_layer),
        )
        .route(
            "/webhooks/shopify",
            post(shopify::<S::Database>).layer(shopify_layer),
        )
        .route(
            "/webhooks/standard",
            post(standard::<S::Database>).layer(standard_layer),
        )
        .route(
            "/webhooks/shopify/fulfilment",
            post(fulfilment::<S::Database>).layer(fulfilment_layer),
        )
        .route(
            "/webhooks/standard/inbox",
            post(standard::<S::Database>).layer(standard_inbox_layer),
        )
        .route(
            "/api/payments",
            post(payment::<S::Database>).layer(payments_layer),
        )
        // One log line per delivery, whatever answered it.
        .route_layer(middleware::from_fn(log_delivery))
        .route("/side-effects", get(side_effects::<S::Database>))
        .with_state(pool.clone())
        .nest_service("/admin", admin)
        .merge(operators);
    // The inbox's workers send each stored fulfilment through the app, to the route above:
    // a poison one is tried 3 times, a second apart, then left dead for a person.
    let workers = inbox
        .workers(app.clone())
        .backoff(Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
            3,
        ))
        .drain(drain)
        .spawn();
    Ok((app, workers))
}

/// What the operators get: the journal the layers write and the page reads, the metrics
/// recorder, the admin page's token.
struct Ops {
    journal: DeliveryJournal,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    admin_token: String,
}

/// `ADMIN_TOKEN`, or a new one for this run (printed at start).
fn admin_token() -> String {
    use std::hash::{BuildHasher, RandomState};
    std::env::var("ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| format!("{:016x}", RandomState::new().hash_one(std::process::id())))
}

/// The operators' routes (the admin page, `/stuck`, `/metrics`) ask for HTTP Basic
/// credentials: any user name, the token as password. A real service puts its own
/// authentication here.
async fn require_admin_token(State(token): State<String>, req: Request, next: Next) -> Response {
    use base64::Engine as _;
    let given = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .and_then(|raw| String::from_utf8(raw).ok());
    let password = given
        .as_deref()
        .and_then(|pair| pair.split_once(':'))
        .map(|(_, p)| p);
    if password.is_some_and(|password| same_secret(password, &token)) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(http::header::WWW_AUTHENTICATE, "Basic realm=\"admin\"")],
        "the operators' routes need the admin token (ADMIN_TOKEN) as the password\n",
    )
        .into_response()
}

/// Whether `given` is `secret`, in a time that tells nothing about either: both are hashed
/// (SHA-256) first, so the comparison always runs over 32 bytes whatever their lengths, and
/// every byte is compared, with no early exit at the first difference (which `==` has, and
/// which would let a client find the token byte by byte from the answer times).
fn same_secret(given: &str, secret: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (given, secret) = (Sha256::digest(given), Sha256::digest(secret));
    // Each step kept opaque, so that the compiler cannot stop at the first difference.
    let difference = given
        .iter()
        .zip(secret.iter())
        .fold(0u8, |difference, (a, b)| {
            std::hint::black_box(difference | (a ^ b))
        });
    difference == 0
}

async fn serve(
    app: Router,
    addr: SocketAddr,
    storage: &str,
    drain: Drain,
    admin_token: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("webhook receiver on http://{addr}, claims in {storage}");
    println!("  POST /webhooks/stripe    key: body /id                transactional");
    println!("  POST /webhooks/github    key: X-GitHub-Delivery       reclaim after 30 s silent");
    println!("  POST /webhooks/shopify   key: X-Shopify-Webhook-Id    hold after 30 s silent");
    println!("  POST /webhooks/standard  key: webhook-id / svix-id    reclaim after 10 s silent");
    println!("  POST /webhooks/shopify/fulfilment  inbox: 202 now, the work later, once");
    println!("  POST /webhooks/standard/inbox      the same for a Standard Webhooks sender");
    println!("  POST /api/payments       key: Idempotency-Key         answers replayed");
    println!("  GET  /side-effects       every side effect recorded (the demo sender's check)");
    println!("  GET  /admin/             the operators' page: user admin, password {admin_token}");
    println!("  GET  /stuck, /metrics    with the same password");
    let signed: Vec<_> = [
        ("stripe", "STRIPE_WEBHOOK_SECRET"),
        ("github", "GITHUB_WEBHOOK_SECRET"),
        ("shopify", "SHOPIFY_WEBHOOK_SECRET"),
        ("standard", "STANDARD_WEBHOOK_SECRET"),
    ]
    .into_iter()
    .map(|(route, var)| match secret(var) {
        Some(_) => format!("{route}: verified"),
        None => format!("{route}: unsigned accepted ({var} not set)"),
    })
    .collect();
    println!("  signatures: {}", signed.join(", "));
    println!();
    // A delivery id of this run: the claims file outlives the receiver, and an id sent
    // before would be answered as a duplicate.
    let fresh = {
        use std::hash::{BuildHasher, RandomState};
        format!(
            "{:016x}",
            RandomState::new().hash_one(std::time::SystemTime::now())
        )
    };
    println!("Send the same GitHub event twice; it is processed once:");
    println!(
        "  for i in 1 2; do curl -s -o /dev/null -D - -X POST http://{addr}/webhooks/github \
         -H 'X-GitHub-Delivery: {fresh}' \
         -H 'X-GitHub-Event: push' -d '{{}}' | grep -iE '^(HTTP|idempotency-outcome)'; done"
    );
    println!("Pay twice with one Idempotency-Key; the retry gets the first answer again:");
    println!(
        "  for i in 1 2; do curl -s -D - -X POST http://{addr}/api/payments \
         -H 'Idempotency-Key: \"order-{fresh}\"' -d '{{\"amount\":2500}}'; echo; done"
    );
    println!("  curl -s http://{addr}/side-effects");
    println!("A fulfilment is answered 202 in milliseconds; its work takes seconds, once:");
    println!(
        "  curl -s -o /dev/null -w '%{{http_code}} in %{{time_total}}s\\n' -X POST \
         http://{addr}/webhooks/shopify/fulfilment -H 'X-Shopify-Webhook-Id: f-{fresh}' -d '{{}}'"
    );
    println!("A poison fulfilment fails 3 times, then waits dead on the admin page:");
    println!(
        "  curl -s -X POST http://{addr}/webhooks/shopify/fulfilment \
         -H 'X-Shopify-Webhook-Id: p-{fresh}' -d '{{\"poison\":true}}'"
    );
    println!();
    let closing = drain.clone();
    let shutdown = async move {
        shutdown_signal().await;
        println!("shutting down: new deliveries get 503, running ones finish");
        closing.close();
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    // The connections are closed; handlers whose sender hung up may still run.
    let report = drain.drain(Duration::from_secs(25)).await;
    println!("{report}");
    Ok(())
}

/// Ctrl-C, or SIGTERM (what a deploy sends).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The side effect a handler had, carried in its response for the log line.
#[derive(Clone)]
struct SideEffect(String);

async fn log_delivery(req: Request, next: Next) -> Response {
    let provider = req.uri().path().trim_start_matches("/webhooks/").to_owned();
    if let Some(delivery) = req.extensions().get::<InboxDelivery>().cloned() {
        // The inbox's worker runs a stored delivery.
        let res = next.run(req).await;
        let effect = res
            .extensions()
            .get::<SideEffect>()
            .map_or("", |e| e.0.as_str());
        let ran = format!("run {} -> {}", delivery.attempt(), res.status().as_u16());
        println!(
            "{provider:<9} {:<40} {ran:<17} {effect}",
            delivery.key().value()
        );
        return res;
    }
    let res = next.run(req).await;
    let outcome = res
        .extensions()
        .get::<Outcome>()
        .map_or("-", Outcome::as_str);
    let key = res
        .extensions()
        .get::<IdempotencyKey>()
        .map_or_else(|| "-".to_owned(), |k| k.value().to_owned());
    let effect = res
        .extensions()
        .get::<SideEffect>()
        .filter(|_| outcome == "processed")
        .map_or("", |e| e.0.as_str());
    println!("{provider:<9} {key:<40} {outcome:<17} {effect}");
    res
}

type Answer = Result<(Extension<SideEffect>, &'static str), (StatusCode, String)>;

fn failed(err: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
}

fn event_id(key: Option<Extension<IdempotencyKey>>) -> String {
    key.map(|Extension(k)| k.value().to_owned())
        .unwrap_or_default()
}

/// Marks the order paid, in the delivery's transaction.
async fn stripe<DB: Journal>(mut tx: Tx<DB>, body: String) -> Answer {
    let event: serde_json::Value = serde_json::from_str(&body).map_err(failed)?;
    let order = event
        .pointer("/data/object/metadata/order_id")
        .and_then(|o| o.as_str())
        .unwrap_or("unknown");
    let id = event["id"].as_str().unwrap_or_default();
    let effect = format!("order {order} marked paid");
    DB::record(&mut tx, "stripe", id, &effect)
        .await
        .map_err(failed)?;
    Ok((Extension(SideEffect(effect)), "paid"))
}

/// Sends a notification (here: records that it was sent).
async fn github<DB: Journal>(State(pool): State<Pool<DB>>, headers: http::HeaderMap) -> Answer {
    let id = headers
        .get("x-github-delivery")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = headers
        .get("x-github-event")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| "an event".to_owned(), |kind| format!("a {kind} event"));
    let effect = format!("notification sent for {kind}");
    record(&pool, "github", id, &effect).await?;
    Ok((Extension(SideEffect(effect)), "noted"))
}

/// Requests a fulfilment.
async fn shopify<DB: Journal>(State(pool): State<Pool<DB>>, headers: http::HeaderMap) -> Answer {
    let id = headers
        .get("x-shopify-webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // `WORK_MS` makes it slow too: kill the receiver meanwhile, start it again, and the
    // held claim waits on the admin page for a person.
    let work = std::env::var("WORK_MS").ok().and_then(|ms| ms.parse().ok());
    tokio::time::sleep(Duration::from_millis(work.unwrap_or(0))).await;
    let effect = "fulfilment requested".to_owned();
    record(&pool, "shopify", id, &effect).await?;
    Ok((Extension(SideEffect(effect)), "shipping"))
}

/// Ships an order, behind the inbox: seconds of work (`FULFILMENT_MS`, default 3000), run
/// by a worker after the sender got its 202. An order the warehouse refuses (`"poison":
/// true`) fails every time.
async fn fulfilment<DB: Journal>(
    State(pool): State<Pool<DB>>,
    headers: http::HeaderMap,
    body: String,
) -> Answer {
    let id = headers
        .get("x-shopify-webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let order: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    if order["poison"] == serde_json::Value::Bool(true) {
        return Err(failed("the warehouse refuses this order"));
    }
    let work = std::env::var("FULFILMENT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok());
    tokio::time::sleep(Duration::from_millis(work.unwrap_or(3000))).await;
    let effect = "order shipped".to_owned();
    record(&pool, "fulfilment", id, &effect).await?;
    Ok((Extension(SideEffect(effect)), "shipped"))
}

/// Refreshes a cache; `WORK_MS` makes it slow.
async fn standard<DB: Journal>(
    State(pool): State<Pool<DB>>,
    key: Option<Extension<IdempotencyKey>>,
    headers: http::HeaderMap,
) -> Answer {
    let id = headers
        .get("webhook-id")
        .or_else(|| headers.get("svix-id"))
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| event_id(key), str::to_owned);
    let work = std::env::var("WORK_MS").ok().and_then(|ms| ms.parse().ok());
    tokio::time::sleep(Duration::from_millis(work.unwrap_or(0))).await;
    let effect = "cache refreshed".to_owned();
    record(&pool, "standard", &id, &effect).await?;
    Ok((Extension(SideEffect(effect)), "refreshed"))
}

/// Charges a payment (here: records that it was charged) and answers 201 with its id: what a
/// retry of the request must get again.
async fn payment<DB: Journal>(
    State(pool): State<Pool<DB>>,
    Extension(claim): Extension<LeaseHandle>,
    body: String,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let request: serde_json::Value = serde_json::from_str(&body).map_err(failed)?;
    let amount = request["amount"].as_u64().unwrap_or(0);
    let id = claim.lease().key().value().to_owned();
    let effect = format!("charged {amount}");
    record(&pool, "api", &id, &effect).await?;
    let payment =
        serde_json::json!({"id": format!("pay_{id}"), "amount": amount, "status": "paid"});
    Ok((
        StatusCode::CREATED,
        Extension(SideEffect(effect)),
        Json(payment),
    ))
}

/// Every side effect recorded: `[{"provider", "event", "count"}]`.
async fn side_effects<DB: Journal>(
    State(pool): State<Pool<DB>>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let rows = DB::effects(&pool).await.map_err(failed)?;
    let list: Vec<_> = rows
        .into_iter()
        .map(|(provider, event, count)| serde_json::json!({"provider": provider, "event": event, "count": count}))
        .collect();
    Ok(Json(list))
}

/// Claims stuck for more than a minute: what a person looks at for held claims.
async fn stuck(State(store): State<AnyStore>) -> Result<impl IntoResponse, (StatusCode, String)> {
    let stuck = store
        .stuck_claims(Duration::from_secs(60))
        .await
        .map_err(failed)?;
    let list: Vec<_> = stuck
        .into_iter()
        .map(|s| serde_json::json!({"key": s.key.to_string(), "age_seconds": s.age.as_secs(), "deliveries": s.deliveries}))
        .collect();
    Ok(Json(list))
}

/// Records a side effect through the pool (the claim-then-commit routes).
async fn record<DB: Journal>(
    pool: &Pool<DB>,
    provider: &str,
    event: &str,
    effect: &str,
) -> Result<(), (StatusCode, String)> {
    let mut conn = pool.acquire().await.map_err(failed)?;
    DB::record(&mut conn, provider, event, effect)
        .await
        .map_err(failed)
}

/// The receiver's own table of side effects. Written once for every sqlx database: the query
/// builder writes each one's placeholders, and the bounds of the one `impl` below are what the
/// SQL needs of a driver (SQLite, PostgreSQL and MySQL all have it).
trait Journal: Database {
    /// Creates the table if it does not exist.
    fn create_table(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records a side effect on `conn`: a pooled connection, or the delivery's transaction.
    fn record(
        conn: &mut Self::Connection,
        provider: &str,
        event: &str,
        effect: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// `(provider, event, how many side effects)`, for every event recorded.
    fn effects(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, String, i64)>>> + Send;
}

impl<DB> Journal for DB
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> (String, String, i64): FromRow<'r, DB::Row>,
{
    async fn create_table(pool: &Pool<DB>) -> sqlx::Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS side_effects (
                provider VARCHAR(32) NOT NULL,
                event VARCHAR(255) NOT NULL,
                effect VARCHAR(255) NOT NULL)",
        )
        .execute(pool)
        .await
        .map(drop)
    }

    async fn record(
        conn: &mut DB::Connection,
        provider: &str,
        event: &str,
        effect: &str,
    ) -> sqlx::Result<()> {
        let mut insert =
            QueryBuilder::<DB>::new("INSERT INTO side_effects (provider, event, effect) VALUES (");
        insert
            .separated(", ")
            .push_bind(provider)
            .push_bind(event)
            .push_bind(effect);
        insert.push(")").build().execute(conn).await.map(drop)
    }

    async fn effects(pool: &Pool<DB>) -> sqlx::Result<Vec<(String, String, i64)>> {
        sqlx::query_as(
            "SELECT provider, event, COUNT(*) FROM side_effects \
             GROUP BY provider, event ORDER BY provider, event",
        )
        .fetch_all(pool)
        .await
    }
}
