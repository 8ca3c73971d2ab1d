//! The testing kit's sender against apps: correct ones pass every scenario (memory, and
//! SQLite and PostgreSQL with a pool per instance); deliberately broken ones fail, each with a
//! message that names the bug.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use tower_idempotency::testing::{Delivery, Failure, Scenario, Sender, sign};
use tower_idempotency::version_guard::{self, VersionGuardLayer};
use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify};

const SECRET: &str = "whsec_kit";

/// A counter of side effects, and the sender's closure that reads it.
fn counter() -> (
    Arc<AtomicUsize>,
    impl Fn() -> std::future::Ready<usize> + Send + Sync + 'static,
) {
    let effects = Arc::new(AtomicUsize::new(0));
    let read = effects.clone();
    (effects, move || {
        std::future::ready(read.load(Ordering::SeqCst))
    })
}

/// A Stripe route whose handler works a little, then counts its effect.
fn stripe_app(store: MemoryStore, effects: Arc<AtomicUsize>) -> Router {
    let layer = IdempotencyLayer::new(store)
        .key(key::stripe())
        .verify(verify::stripe(SECRET));
    let handler = move || async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        effects.fetch_add(1, Ordering::SeqCst);
        "paid"
    };
    Router::new().route("/webhooks/stripe", post(handler).layer(layer))
}

fn paid(id: &str) -> Delivery {
    sign::stripe(SECRET)
        .delivery(format!(r#"{{"id":"{id}","type":"invoice.paid"}}"#))
        .to("/webhooks/stripe")
}

fn message(failure: Failure) -> String {
    failure.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_app_passes_every_scenario() {
    let (effects, read) = counter();
    let store = MemoryStore::new();
    let sender = Sender::instances(2, move |_| {
        std::future::ready(stripe_app(store.clone(), effects.clone()))
    })
    .effects(read)
    .retry_every(Duration::from_millis(10));

    let report = sender.assert(Scenario::in_a_row(&paid("evt_1"), 3)).await;
    assert_eq!(report.answers(), [http::StatusCode::OK; 3]);
    assert_eq!(report.effects(), Some(1));

    let report = sender.assert(Scenario::at_once(&paid("evt_2"), 8)).await;
    assert_eq!(report.effects(), Some(1));
    assert!(report.sent() >= 8, "{report}");
    assert!(
        report
            .answers()
            .iter()
            .all(|status| status.is_success() || *status == http::StatusCode::CONFLICT),
        "{report}"
    );
    assert!(
        report.scenario().ends_with("across 2 instances"),
        "{report}"
    );

    let report = sender.assert(Scenario::hang_up(&paid("evt_3"))).await;
    assert_eq!(report.effects(), Some(1));
    assert!(
        report.to_string().contains("answered hung up | "),
        "{report}"
    );
    let report = sender
        .assert(Scenario::hang_up_after(
            &paid("evt_4"),
            Duration::from_millis(5),
        ))
        .await;
    assert_eq!(report.effects(), Some(1));
}

/// No idempotency layer: every copy runs.
#[tokio::test]
async fn an_app_without_the_layer_fails_with_its_cause() {
    let (effects, read) = counter();
    let app = Router::new().route(
        "/webhooks/stripe",
        post(move || async move {
            effects.fetch_add(1, Ordering::SeqCst);
            "paid"
        }),
    );
    let sender = Sender::new(app).effects(read);
    let failure = sender
        .run(Scenario::in_a_row(&paid("evt_1"), 3))
        .await
        .unwrap_err();
    assert_eq!(failure.report().effects(), Some(3));
    let message = message(failure);
    assert!(
        message.starts_with(
            "3 effects for 1 event after 3 copies in a row: every copy ran the handler: the \
             route is not behind an idempotency layer"
        ),
        "{message}"
    );
    assert!(
        message.contains("delivery: Stripe delivery of evt_1 (POST /webhooks/stripe)"),
        "{message}"
    );
    assert!(message.contains("answers: 200 | 200 | 200"), "{message}");
    assert!(message.contains("deliveries sent: 3"), "{message}");
    assert!(message.contains("effects: 3"), "{message}");
}

/// A layer per instance, each over a memory store of its own: each instance runs the event
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_share_no_store_fail_with_their_cause() {
    let (effects, read) = counter();
    let sender = Sender::instances(2, move |_| {
        std::future::ready(stripe_app(MemoryStore::new(), effects.clone()))
    })
    .effects(read)
    .retry_every(Duration::from_millis(10));
    let failure = sender
        .run(Scenario::at_once(&paid("evt_1"), 8))
        .await
        .unwrap_err();
    assert_eq!(failure.report().effects(), Some(2));
    let message = message(failure);
    assert!(
        message.starts_with(
            "2 effects for 1 event after 8 concurrent copies across 2 instances: the route's \
             store is not shared between instances, or its unique index is missing"
        ),
        "{message}"
    );
    // One store alone passes: the instances scenario is what finds it.
    let (effects, read) = counter();
    let one = Sender::new(stripe_app(MemoryStore::new(), effects))
        .effects(read)
        .retry_every(Duration::from_millis(10));
    one.assert(Scenario::at_once(&paid("evt_1"), 8)).await;
}

/// A handler that answers 200 and does its work afterwards, in a task it spawns. The clock
/// is paused: the work waits for a timer, which fires only once every task waits.
#[tokio::test(start_paused = true)]
async fn an_app_that_answers_before_its_work_fails_with_its_cause() {
    let (effects, read) = counter();
    let handler = move || {
        let effects = effects.clone();
        async move {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                effects.fetch_add(1, Ordering::SeqCst);
            });
            "accepted"
        }
    };
    let layer = IdempotencyLayer::new(MemoryStore::new()).key(key::stripe());
    let app = Router::new().route("/webhooks/stripe", post(handler).layer(layer));
    let sender = Sender::new(app).effects(read);
    for scenario in [
        Scenario::in_a_row(&paid("evt_1"), 2),
        Scenario::at_once(&paid("evt_2"), 2),
    ] {
        let message = message(sender.run(scenario).await.unwrap_err());
        assert!(
            message.starts_with("copy 1 was answered 200 before the event's effect could be seen")
                || message
                    .starts_with("copy 2 was answered 200 before the event's effect could be seen"),
            "{message}"
        );
        assert!(
            message.contains("the handler answers before its work is done"),
            "{message}"
        );
    }
}

/// A subscription route: the handler stores the status of the event's subscription.
fn billing_app(guarded: bool, statuses: Arc<Mutex<HashMap<String, String>>>) -> Router {
    let handler = move |body: String| async move {
        let event: serde_json::Value = serde_json::from_str(&body).unwrap();
        let object = &event["data"]["object"];
        let (id, status) = (object["id"].as_str().unwrap(), object["status"].as_str());
        statuses
            .lock()
            .unwrap()
            .insert(id.to_owned(), status.unwrap().to_owned());
        "applied"
    };
    let route = post(handler);
    let route = if guarded {
        route.layer(
            VersionGuardLayer::new(MemoryStore::new())
                .entity(key::json("/data/object/id").namespace("subscription"))
                .version(version_guard::version::json("/data/object/updated_at")),
        )
    } else {
        route
    };
    let dedup = IdempotencyLayer::new(MemoryStore::new()).key(key::stripe());
    Router::new().route("/webhooks/billing", route.layer(dedup))
}

fn subscription(event: &str, status: &str, updated_at: &str) -> Delivery {
    let body = serde_json::json!({
        "id": event,
        "data": {"object": {"id": "sub_1", "status": status, "updated_at": updated_at}},
    });
    sign::stripe(SECRET)
        .delivery(body.to_string())
        .to("/webhooks/billing")
}

#[tokio::test]
async fn reversed_order_passes_with_a_version_guard_and_fails_without() {
    let older = subscription("evt_1", "active", "2024-05-01T14:00:01Z");
    let newer = subscription("evt_2", "cancelled", "2024-05-01T14:00:03Z");
    for guarded in [true, false] {
        let statuses = Arc::new(Mutex::new(HashMap::new()));
        let read = {
            let statuses = statuses.clone();
            move || std::future::ready(statuses.lock().unwrap().get("sub_1").cloned())
        };
        let sender = Sender::new(billing_app(guarded, statuses));
        let played = sender
            .run(Scenario::newer_first(&older, &newer, read))
            .await;
        if guarded {
            let report = played.unwrap();
            assert_eq!(report.answers(), [http::StatusCode::OK; 2]);
            assert!(report.to_string().contains("200 outdated"), "{report}");
        } else {
            let message = message(played.unwrap_err());
            assert!(
                message.starts_with(
                    "the older event overwrote the newer one's state (Some(\"cancelled\") \
                     became Some(\"active\")): the route applies events in the order they arrive"
                ),
                "{message}"
            );
            assert!(message.contains("VersionGuardLayer"), "{message}");
            assert!(
                message.contains("delivery: Stripe delivery of evt_2 (POST /webhooks/billing), then Stripe delivery of evt_1"),
                "{message}"
            );
        }
    }
}

/// A hand-written claim that the connection's future holds: it releases the event when the
/// future is dropped, so a sender that hangs up after the effect gets it run again. The first
/// run works until it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_tied_to_the_connection_fails_the_hang_up() {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Processing,
        Done,
    }
    struct Release(Arc<Mutex<HashMap<String, State>>>, String, bool);
    impl Drop for Release {
        fn drop(&mut self) {
            if !self.2 {
                self.0.lock().unwrap().remove(&self.1);
            }
        }
    }
    let (effects, read) = counter();
    let claims = Arc::new(Mutex::new(HashMap::<String, State>::new()));
    let handler = move |headers: http::HeaderMap| async move {
        let id = headers["x-github-delivery"].to_str().unwrap().to_owned();
        match claims.lock().unwrap().get(&id) {
            Some(State::Done) => return http::StatusCode::OK,
            Some(State::Processing) => return http::StatusCode::CONFLICT,
            None => {}
        }
        claims.lock().unwrap().insert(id.clone(), State::Processing);
        let mut release = Release(claims.clone(), id.clone(), false);
        let run = effects.fetch_add(1, Ordering::SeqCst) + 1; // the effect, then more work
        if run == 1 {
            std::future::pending::<()>().await;
        }
        claims.lock().unwrap().insert(id, State::Done);
        release.2 = true;
        http::StatusCode::OK
    };
    let app = Router::new().route("/webhooks/github", post(handler));
    let sender = Sender::new(app)
        .effects(read)
        .retry_every(Duration::from_millis(10));
    let delivery = sign::github("s")
        .delivery("d-1", "{}")
        .to("/webhooks/github");
    let failure = sender.run(Scenario::hang_up(&delivery)).await.unwrap_err();
    assert_eq!(failure.report().effects(), Some(2));
    let message = message(failure);
    assert!(
        message.starts_with(
            "2 effects for 1 event after a sender that hung up once the app was at work, then \
             sent again: the work ran again after the sender hung up"
        ),
        "{message}"
    );
    assert!(message.contains("answers: hung up | "), "{message}");
}

/// An app that refuses the deliveries (the wrong secret): the refusal is named with its
/// cause, and no effect is invented.
#[tokio::test]
async fn a_refused_delivery_is_named() {
    let (effects, read) = counter();
    let sender = Sender::new(stripe_app(MemoryStore::new(), effects)).effects(read);
    let forged = sign::stripe("whsec_other")
        .delivery(r#"{"id":"evt_1"}"#)
        .to("/webhooks/stripe");
    let message = message(sender.run(Scenario::at_once(&forged, 2)).await.unwrap_err());
    assert!(message.contains("was answered 401"), "{message}");
    assert!(message.contains("the signature was refused"), "{message}");
}

mod sql {
    use sqlx::{PgPool, Sqlite, SqlitePool};
    use tower_idempotency::store::{PostgresStore, SqliteStore};
    use tower_idempotency::transactional::{TransactionalLayer, Tx};

    use super::*;
    use crate::common::{self, db};

    /// The Stripe route of the example receiver: the order marked paid in the delivery's
    /// transaction, recorded in `kit_paid`.
    async fn order_paid(mut tx: Tx<Sqlite>, body: String) -> &'static str {
        let event: serde_json::Value = serde_json::from_str(&body).unwrap();
        sqlx::query("INSERT INTO kit_paid (event_id) VALUES (?)")
            .bind(event["id"].as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
        "paid"
    }

    /// Two instances of a transactional Stripe route, each on a pool of its own on one SQLite
    /// file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_transactional_instances_pass() {
        let file = db::sqlite_file("testing-kit");
        let store = SqliteStore::new(db::sqlite_file_pool(file).await);
        store.migrate().await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS kit_paid (event_id TEXT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        let ns = common::unique_namespace("kit");
        let pool: SqlitePool = store.pool().clone();
        let prefix = format!("{ns}%");
        let sender = Sender::instances(2, move |_| async move {
            let store = SqliteStore::new(db::sqlite_file_pool(file).await);
            let layer = TransactionalLayer::new(store)
                .key(key::stripe())
                .verify(verify::stripe(SECRET));
            Router::new().route("/webhooks/stripe", post(order_paid).layer(layer))
        })
        .effects(move || {
            let (pool, prefix) = (pool.clone(), prefix.clone());
            async move {
                let count: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM kit_paid WHERE event_id LIKE ?")
                        .bind(prefix)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                count as usize
            }
        });
        sender
            .assert(Scenario::in_a_row(&paid(&format!("{ns}-1")), 3))
            .await;
        sender
            .assert(Scenario::at_once(&paid(&format!("{ns}-2")), 8))
            .await;
        sender
            .assert(Scenario::hang_up(&paid(&format!("{ns}-3"))))
            .await;
    }

    /// Two instances of a claim-then-commit GitHub route over `SqliteStore`, each with a pool
    /// of its own on one file, the effect written through that pool.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_claim_then_commit_instances_pass() {
        let file = db::sqlite_file("testing-kit");
        let store = SqliteStore::new(db::sqlite_file_pool(file).await);
        store.migrate().await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS kit_noted (delivery TEXT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        let ns = common::unique_namespace("kit");
        let (pool, prefix) = (store.pool().clone(), format!("{ns}%"));
        let sender = Sender::instances(2, move |_| async move {
            let pool = db::sqlite_file_pool(file).await;
            let handler = {
                let pool = pool.clone();
                move |headers: http::HeaderMap| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    sqlx::query("INSERT INTO kit_noted (delivery) VALUES (?)")
                        .bind(headers["x-github-delivery"].to_str().unwrap())
                        .execute(&pool)
                        .await
                        .unwrap();
                    "noted"
                }
            };
            let layer = IdempotencyLayer::new(SqliteStore::new(pool))
                .key(key::github())
                .verify(verify::github(SECRET));
            Router::new().route("/webhooks/github", post(handler).layer(layer))
        })
        .effects(move || {
            let (pool, prefix) = (pool.clone(), prefix.clone());
            async move {
                let count: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM kit_noted WHERE delivery LIKE ?")
                        .bind(prefix)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                count as usize
            }
        })
        .retry_every(Duration::from_millis(20));
        let github = sign::github(SECRET);
        let delivery = |n: u32| {
            github
                .delivery(&format!("{ns}-{n}"), "{}")
                .to("/webhooks/github")
        };
        sender.assert(Scenario::in_a_row(&delivery(1), 3)).await;
        sender.assert(Scenario::at_once(&delivery(2), 8)).await;
        sender.assert(Scenario::hang_up(&delivery(3))).await;
    }

    /// Two instances of a claim-then-commit GitHub route, each with a PostgreSQL pool of its
    /// own, the effect written through that pool.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_claim_then_commit_instances_pass() {
        let Some(pool) = db::postgres_pool().await else {
            return;
        };
        PostgresStore::new(pool.clone()).migrate().await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS kit_notified (delivery TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let ns = common::unique_namespace("kit");
        let prefix = format!("{ns}%");
        let sender = Sender::instances(2, |_| async {
            let pool: PgPool = db::postgres_pool().await.expect("reachable a moment ago");
            let handler = {
                let pool = pool.clone();
                move |headers: http::HeaderMap| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    sqlx::query("INSERT INTO kit_notified (delivery) VALUES ($1)")
                        .bind(headers["x-github-delivery"].to_str().unwrap())
                        .execute(&pool)
                        .await
                        .unwrap();
                    "noted"
                }
            };
            let layer = IdempotencyLayer::new(PostgresStore::new(pool))
                .key(key::github())
                .verify(verify::github(SECRET));
            Router::new().route("/webhooks/github", post(handler).layer(layer))
        })
        .effects(move || {
            let (pool, prefix) = (pool.clone(), prefix.clone());
            async move {
                let count: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM kit_notified WHERE delivery LIKE $1")
                        .bind(prefix)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                count as usize
            }
        })
        .retry_every(Duration::from_millis(20));
        let github = sign::github(SECRET);
        let delivery = |n: u32| {
            github
                .delivery(&format!("{ns}-{n}"), "{}")
                .to("/webhooks/github")
        };
        sender.assert(Scenario::in_a_row(&delivery(1), 3)).await;
        sender.assert(Scenario::at_once(&delivery(2), 8)).await;
        sender.assert(Scenario::hang_up(&delivery(3))).await;
    }
}
