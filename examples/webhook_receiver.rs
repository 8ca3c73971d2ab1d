//! A webhook receiver that processes each event once, however often it arrives.
//!
//! ```sh
//! cargo run --example webhook_receiver --all-features
//! ```
//!
//! Claims live in an embedded SQLite file by default; set `DATABASE_URL` to a `postgres://`
//! or `mysql://` URL to share them between several instances instead. `PORT` picks the port
//! (default 3000). Every delivery prints one line: provider, key, outcome, and for processed
//! events the side effect it had. `GET /side-effects` lists every side effect recorded, so a
//! sender (see the `replay_storm` example) can check that each event had exactly one.
//! `WORK_MS` makes the Standard Webhooks handler that much slower, like a slow downstream: a
//! sender that times out sooner retries while it runs, and the work still happens once.
//!
//! Ctrl-C (or SIGTERM) shuts the receiver down cleanly: new deliveries get 503 with
//! `Retry-After`, the deliveries in flight finish and commit (handlers whose sender already
//! hung up included), then the receiver prints what the drain saw and exits.
//!
//! Set `STRIPE_WEBHOOK_SECRET`, `GITHUB_WEBHOOK_SECRET`, `SHOPIFY_WEBHOOK_SECRET` or
//! `STANDARD_WEBHOOK_SECRET` (a `whsec_…` secret) and that route verifies the sender's
//! signature before it claims the key: a forgery gets 401 and claims nothing. Without them
//! the routes take unsigned deliveries, which the curl demo below sends; a real receiver sets
//! every secret.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::StatusCode;
use tower_idempotency::store::{MySqlStore, PostgresStore, SqliteStore, StoreError};
use tower_idempotency::transactional::{TransactionalLayer, TransactionalStore, Tx};
use tower_idempotency::{Drain, IdempotencyKey, IdempotencyLayer, Outcome, Stale, key, verify};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let store = PostgresStore::new(sqlx::PgPool::connect(&url).await?);
            serve(store, addr, &format!("PostgreSQL at {url}")).await
        }
        Ok(url) if url.starts_with("mysql") || url.starts_with("mariadb") => {
            let store = MySqlStore::new(sqlx::MySqlPool::connect(&url).await?);
            serve(store, addr, &format!("MySQL at {url}")).await
        }
        Ok(url) => {
            let store = SqliteStore::new(sqlx::SqlitePool::connect(&url).await?);
            serve(store, addr, &format!("SQLite at {url}")).await
        }
        Err(_) => {
            let path = std::env::temp_dir().join("tower-idempotency-webhook-receiver.sqlite3");
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
            let store = SqliteStore::new(sqlx::SqlitePool::connect_with(options).await?);
            serve(store, addr, &format!("SQLite file {}", path.display())).await
        }
    }
}

/// A route's signing secret, from the environment.
fn secret(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|secret| !secret.is_empty())
}

/// Builds the routes, one per sender, each with its own key and stale policy (and, where its
/// secret is set, its signature check), all tracked by one drain.
fn app<B: Backend>(store: B, drain: &Drain) -> Router {
    // Stripe: the work is a database write (the order is paid), so it runs in the marker's
    // transaction: all or nothing, and a crash leaves no stale claim to decide.
    let stripe_layer = TransactionalLayer::new(store.clone())
        .key(key::stripe())
        .drain(drain);
    let stripe_layer = match secret("STRIPE_WEBHOOK_SECRET") {
        Some(secret) => stripe_layer.verify(verify::stripe(secret)),
        None => stripe_layer,
    };
    // GitHub: a notification goes out, which no transaction can take back. A claim whose
    // process died (no heartbeat for 30 s) is reclaimed: a possible duplicate message beats a
    // missing one.
    let github_layer = IdempotencyLayer::new(store.clone())
        .key(key::github())
        .stale(Stale::reclaim_after(Duration::from_secs(30)))
        .drain(drain);
    let github_layer = match secret("GITHUB_WEBHOOK_SECRET") {
        Some(secret) => github_layer.verify(verify::github(secret)),
        None => github_layer,
    };
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
        .drain(drain);
    let shopify_layer = match secret("SHOPIFY_WEBHOOK_SECRET") {
        Some(secret) => shopify_layer.verify(verify::shopify(secret)),
        None => shopify_layer,
    };
    // A Standard Webhooks sender: a cache refresh, harmless to repeat: reclaim soon.
    let standard_layer = IdempotencyLayer::new(store.clone())
        .key(key::standard_webhooks())
        .stale(Stale::reclaim_after(Duration::from_secs(10)))
        .drain(drain);
    let standard_layer = match secret("STANDARD_WEBHOOK_SECRET") {
        Some(secret) => standard_layer.verify(verify::standard_webhooks(secret)),
        None => standard_layer,
    };
    Router::new()
        .route("/webhooks/stripe", post(stripe::<B>).layer(stripe_layer))
        .route("/webhooks/github", post(github::<B>).layer(github_layer))
        .route("/webhooks/shopify", post(shopify::<B>).layer(shopify_layer))
        .route(
            "/webhooks/standard",
            post(standard::<B>).layer(standard_layer),
        )
        // One log line per delivery, whatever answered it.
        .route_layer(middleware::from_fn(log_delivery))
        .route("/side-effects", get(side_effects::<B>))
        .route("/stuck", get(stuck::<B>))
        .with_state(store)
}

async fn serve<B: Backend>(
    store: B,
    addr: SocketAddr,
    storage: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    store.migrate().await?;
    store.create_effects_table().await?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("webhook receiver on http://{addr}, claims in {storage}");
    println!("  POST /webhooks/stripe    key: body /id                transactional");
    println!("  POST /webhooks/github    key: X-GitHub-Delivery       reclaim after 30 s silent");
    println!("  POST /webhooks/shopify   key: X-Shopify-Webhook-Id    hold after 30 s silent");
    println!("  POST /webhooks/standard  key: webhook-id / svix-id    reclaim after 10 s silent");
    println!("  GET  /side-effects, GET /stuck");
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
    println!("Send the same GitHub event twice; it is processed once:");
    println!(
        "  for i in 1 2; do curl -s -o /dev/null -D - -X POST http://{addr}/webhooks/github \
         -H 'X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958' \
         -H 'X-GitHub-Event: push' -d '{{}}' | grep -iE '^(HTTP|idempotency-outcome)'; done"
    );
    println!("  curl -s http://{addr}/side-effects");
    println!();
    let drain = Drain::new();
    let closing = drain.clone();
    let shutdown = async move {
        shutdown_signal().await;
        println!("shutting down: new deliveries get 503, running ones finish");
        closing.close();
    };
    axum::serve(listener, app(store, &drain))
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
async fn stripe<B: Backend>(mut tx: Tx<B::Database>, body: String) -> Answer {
    let event: serde_json::Value = serde_json::from_str(&body).map_err(failed)?;
    let order = event
        .pointer("/data/object/metadata/order_id")
        .and_then(|o| o.as_str())
        .unwrap_or("unknown");
    let id = event["id"].as_str().unwrap_or_default();
    let effect = format!("order {order} marked paid");
    B::record_in(&mut tx, "stripe", id, &effect)
        .await
        .map_err(failed)?;
    Ok((Extension(SideEffect(effect)), "paid"))
}

/// Sends a notification (here: records that it was sent).
async fn github<B: Backend>(State(store): State<B>, headers: http::HeaderMap) -> Answer {
    let id = headers
        .get("x-github-delivery")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = headers
        .get("x-github-event")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| "an event".to_owned(), |kind| format!("a {kind} event"));
    let effect = format!("notification sent for {kind}");
    store.record("github", id, &effect).await.map_err(failed)?;
    Ok((Extension(SideEffect(effect)), "noted"))
}

/// Requests a fulfilment.
async fn shopify<B: Backend>(State(store): State<B>, headers: http::HeaderMap) -> Answer {
    let id = headers
        .get("x-shopify-webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let effect = "fulfilment requested".to_owned();
    store.record("shopify", id, &effect).await.map_err(failed)?;
    Ok((Extension(SideEffect(effect)), "shipping"))
}

/// Refreshes a cache; `WORK_MS` makes it slow.
async fn standard<B: Backend>(
    State(store): State<B>,
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
    store
        .record("standard", &id, &effect)
        .await
        .map_err(failed)?;
    Ok((Extension(SideEffect(effect)), "refreshed"))
}

/// Every side effect recorded: `[{"provider", "event", "count"}]`.
async fn side_effects<B: Backend>(
    State(store): State<B>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let rows = store.effects().await.map_err(failed)?;
    let list: Vec<_> = rows
        .into_iter()
        .map(|(provider, event, count)| serde_json::json!({"provider": provider, "event": event, "count": count}))
        .collect();
    Ok(Json(list))
}

/// Claims stuck for more than a minute: what a person looks at for held claims.
async fn stuck<B: Backend>(
    State(store): State<B>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
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

/// What differs between the databases the receiver runs on: only the SQL of its own table.
trait Backend: TransactionalStore + Clone + Send + Sync + 'static {
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn create_effects_table(&self) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records a side effect through the pool (claim-then-commit routes).
    fn record(
        &self,
        provider: &str,
        event: &str,
        effect: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records a side effect in the delivery's transaction (the transactional route).
    fn record_in(
        tx: &mut Tx<Self::Database>,
        provider: &str,
        event: &str,
        effect: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn effects(&self) -> impl Future<Output = sqlx::Result<Vec<(String, String, i64)>>> + Send;
}

/// The same code for each database; only the placeholders differ.
macro_rules! backend {
    ($store:ty, $insert:literal) => {
        impl Backend for $store {
            async fn migrate(&self) -> Result<(), StoreError> {
                <$store>::migrate(self).await
            }

            async fn create_effects_table(&self) -> sqlx::Result<()> {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS side_effects (
                        provider VARCHAR(32) NOT NULL,
                        event VARCHAR(255) NOT NULL,
                        effect VARCHAR(255) NOT NULL)",
                )
                .execute(self.pool())
                .await
                .map(drop)
            }

            async fn record(&self, provider: &str, event: &str, effect: &str) -> sqlx::Result<()> {
                let insert = sqlx::query($insert).bind(provider).bind(event).bind(effect);
                insert.execute(self.pool()).await.map(drop)
            }

            async fn record_in(
                tx: &mut Tx<Self::Database>,
                provider: &str,
                event: &str,
                effect: &str,
            ) -> sqlx::Result<()> {
                let insert = sqlx::query($insert).bind(provider).bind(event).bind(effect);
                insert.execute(&mut **tx).await.map(drop)
            }

            async fn effects(&self) -> sqlx::Result<Vec<(String, String, i64)>> {
                sqlx::query_as(
                    "SELECT provider, event, COUNT(*) FROM side_effects \
                     GROUP BY provider, event ORDER BY provider, event",
                )
                .fetch_all(self.pool())
                .await
            }
        }
    };
}

backend!(
    SqliteStore,
    "INSERT INTO side_effects (provider, event, effect) VALUES (?, ?, ?)"
);
backend!(
    PostgresStore,
    "INSERT INTO side_effects (provider, event, effect) VALUES ($1, $2, $3)"
);
backend!(
    MySqlStore,
    "INSERT INTO side_effects (provider, event, effect) VALUES (?, ?, ?)"
);
