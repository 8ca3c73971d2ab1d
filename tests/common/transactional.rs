//! Transactional mode on a SQL backend: the marker and the handler's own write commit together
//! or not at all. Also the deliveries the transactional tests of `tests/transactional.rs` send.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower_idempotency::Outcome;
use tower_idempotency::body::ResponseBody;

pub type Res = Response<ResponseBody<Full<Bytes>>>;

pub fn delivery(id: &str, behave: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", id)
        .header("x-behave", behave)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

pub fn outcome(res: &Res) -> Outcome {
    *res.extensions().get::<Outcome>().unwrap()
}

/// The `transactional` arm of [`backend_suite!`](crate::backend_suite): module
/// `transactional`, transactional mode's marker and the handler's own write committing together
/// or not at all, on a SQL store of type `$store` (its statements from
/// [`SqlBackend`](super::sql::SqlBackend)). `$make` builds a store, one app instance (its own
/// pool), or `None` to skip.
#[macro_export]
macro_rules! transactional_suite {
    ($store:ty, $make:expr) => {
        mod transactional {
            #[allow(unused_imports)]
            use super::*;

            use std::sync::Arc;
            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::time::Duration;

            use bytes::Bytes;
            use http::{Request, Response, StatusCode};
            use http_body_util::Full;
            use tokio::sync::{Semaphore, mpsc};
            use tower::{Layer, Service, ServiceExt, service_fn};
            use tower_idempotency::body::RequestBody;
            use tower_idempotency::store::TransactionalStore;
            use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
            use tower_idempotency::{Outcome, key};
            use $crate::common;
            use $crate::common::sql::SqlBackend;
            use $crate::common::transactional::{Res, delivery, outcome};

            const CREATE: &str =
                "CREATE TABLE IF NOT EXISTS tx_effects (event VARCHAR(255) NOT NULL)";

            struct App {
                store: $store,
                ns: String,
                gate: Arc<Semaphore>,
                started: mpsc::UnboundedSender<()>,
                runs: Arc<AtomicUsize>,
            }

            /// The webhook handler: writes one business row in the delivery's transaction, then
            /// behaves as `x-behave` says (`ok`, `500`, `panic`, `block`, `slow`).
            fn service(
                app: &App,
            ) -> impl Service<
                Request<Full<Bytes>>,
                Response = Res,
                Error = sqlx::Error,
                Future = impl Send,
            > + Clone
            + Send
            + 'static {
                let (gate, started, runs) =
                    (app.gate.clone(), app.started.clone(), app.runs.clone());
                let ns = app.ns.clone();
                TransactionalLayer::new(app.store.clone())
                    .key(key::header("x-event-id").namespace(ns.clone()))
                    .lock_timeout(Duration::from_secs(10))
                    .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                        let (gate, started, runs, ns) =
                            (gate.clone(), started.clone(), runs.clone(), ns.clone());
                        async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let event =
                                format!("{ns}/{}", req.headers()["x-event-id"].to_str().unwrap());
                            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
                            let handle = req
                                .extensions()
                                .get::<TxHandle<<$store as TransactionalStore>::Database>>()
                                .unwrap()
                                .clone();
                            {
                                let mut tx = handle.lock().unwrap();
                                sqlx::query(<$store as SqlBackend>::INSERT_EFFECT)
                                    .bind(&event)
                                    .execute(&mut *tx)
                                    .await?;
                            }
                            let mut res = Response::new(Full::new(Bytes::new()));
                            match behave.as_str() {
                                "500" => *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
                                "panic" => panic!("handler panicked after its write"),
                                "block" => {
                                    let _ = started.send(());
                                    gate.acquire().await.unwrap().forget();
                                }
                                "slow" => tokio::time::sleep(Duration::from_millis(100)).await,
                                _ => {}
                            }
                            Ok(res)
                        }
                    }))
            }

            async fn setup(test: &str) -> Option<(App, mpsc::UnboundedReceiver<()>)> {
                let store: $store = $make.await?;
                {
                    let _turn = common::schema_turn().await;
                    sqlx::query(CREATE).execute(store.pool()).await.unwrap();
                }
                let (tx, rx) = mpsc::unbounded_channel();
                let app = App {
                    store,
                    ns: common::unique_namespace(test),
                    gate: Arc::new(Semaphore::new(0)),
                    started: tx,
                    runs: Arc::new(AtomicUsize::new(0)),
                };
                Some((app, rx))
            }

            async fn effects(app: &App, id: &str) -> i64 {
                sqlx::query_scalar(<$store as SqlBackend>::COUNT_EFFECTS)
                    .bind(format!("{}/{id}", app.ns))
                    .fetch_one(app.store.pool())
                    .await
                    .unwrap()
            }

            async fn markers(app: &App) -> i64 {
                sqlx::query_scalar(<$store as SqlBackend>::COUNT_MARKERS)
                    .bind(&app.ns)
                    .fetch_one(app.store.pool())
                    .await
                    .unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failure_rolls_back_the_write_and_the_marker() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some((app, _rx)) = setup("tx-500").await else {
                    return;
                };
                let svc = service(&app);
                let res = svc.clone().oneshot(delivery("e1", "500")).await.unwrap();
                assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(outcome(&res), Outcome::Released);
                assert_eq!(
                    effects(&app, "e1").await,
                    0,
                    "the business row was rolled back"
                );
                assert_eq!(markers(&app).await, 0, "and so was the marker");

                let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
                assert_eq!(outcome(&res), Outcome::Processed);
                let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(outcome(&res), Outcome::Duplicate);
                assert_eq!(effects(&app, "e1").await, 1, "the retry wrote the row once");
                assert_eq!(markers(&app).await, 1);
                assert_eq!(app.runs.load(Ordering::SeqCst), 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn panic_rolls_back_and_the_retry_runs() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some((app, _rx)) = setup("tx-panic").await else {
                    return;
                };
                let svc = service(&app);
                let join = tokio::spawn(svc.clone().oneshot(delivery("e1", "panic"))).await;
                assert!(join.unwrap_err().is_panic());
                assert_eq!(effects(&app, "e1").await, 0);
                assert_eq!(markers(&app).await, 0);
                let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
                assert_eq!(outcome(&res), Outcome::Processed);
                assert_eq!(effects(&app, "e1").await, 1);
            }

            /// The client goes away mid-transaction: the handler runs on, and its
            /// transaction commits with the marker when it answers.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dropped_future_runs_on_and_commits() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some((app, mut started)) = setup("tx-drop").await else {
                    return;
                };
                let svc = service(&app);
                let mut fut = Box::pin(svc.clone().oneshot(delivery("e1", "block")));
                tokio::select! {
                    _ = &mut fut => panic!("the handler should block"),
                    s = started.recv() => s.unwrap(),
                }
                drop(fut);
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(markers(&app).await, 0, "not committed while it runs");
                app.gate.add_permits(1);
                for _ in 0..400 {
                    if markers(&app).await == 1 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert_eq!(
                    markers(&app).await,
                    1,
                    "committed once the handler answered"
                );
                let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
                assert_eq!(outcome(&res), Outcome::Duplicate);
                assert_eq!(effects(&app, "e1").await, 1, "the first run's row, once");
                assert_eq!(app.runs.load(Ordering::SeqCst), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_duplicates_over_four_pools_write_once() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some((first, _rx)) = setup("tx-race").await else {
                    return;
                };
                let mut services = vec![service(&first)];
                for _ in 0..3 {
                    let store: $store = $make.await.unwrap();
                    let app = App {
                        store,
                        ns: first.ns.clone(),
                        gate: first.gate.clone(),
                        started: first.started.clone(),
                        runs: first.runs.clone(),
                    };
                    services.push(service(&app));
                }
                let tasks: Vec<_> = (0..32)
                    .map(|i| tokio::spawn(services[i % 4].clone().oneshot(delivery("e1", "slow"))))
                    .collect();
                let mut statuses = Vec::new();
                for task in tasks {
                    statuses.push(task.await.unwrap().unwrap().status());
                }
                assert!(
                    statuses.iter().all(|s| *s == StatusCode::OK),
                    "{statuses:?}"
                );
                assert_eq!(
                    effects(&first, "e1").await,
                    1,
                    "the business row was written once"
                );
                assert_eq!(markers(&first).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn distinct_events_each_write_once() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some((app, _rx)) = setup("tx-many").await else {
                    return;
                };
                let svc = service(&app);
                let tasks: Vec<_> = (0..40)
                    .map(|i| {
                        tokio::spawn(svc.clone().oneshot(delivery(&format!("e{}", i / 2), "ok")))
                    })
                    .collect();
                for task in tasks {
                    assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
                }
                for i in 0..20 {
                    assert_eq!(effects(&app, &format!("e{i}")).await, 1);
                }
                assert_eq!(markers(&app).await, 20);
            }
        }
    };
}
