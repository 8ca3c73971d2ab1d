//! Transactional mode with the version guard: `version_guard::advance` moves an entity's
//! version in the delivery's transaction, together with the business write, on a SQL backend.

/// The `advance` arm of [`backend_suite!`](crate::backend_suite): module `advance`,
/// transactional mode with `version_guard::advance` in the delivery's transaction, on a SQL
/// store of type `$store` (its statements from [`SqlBackend`](super::sql::SqlBackend)).
/// `$make` builds a store, one app instance (its own pool), or `None` to skip.
#[macro_export]
macro_rules! advance_suite {
    ($store:ty, $make:expr) => {
        mod advance {
            #[allow(unused_imports)]
            use super::*;

            use std::convert::Infallible;
            use std::time::Duration;

            use bytes::Bytes;
            use http::{Request, Response, StatusCode};
            use http_body_util::{BodyExt, Full};
            use tower::{Layer, Service, ServiceExt, service_fn};
            use tower_idempotency::body::{RequestBody, ResponseBody};
            use tower_idempotency::store::TransactionalStore;
            use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
            use tower_idempotency::version_guard::{self, Advance, VersionStore};
            use tower_idempotency::{IdempotencyKey, key};
            use $crate::common::sql::SqlBackend;
            use $crate::common::versions::{
                Shuffle, deliver_until_acknowledged, delivery, outcome_header,
            };
            use $crate::common::{key_in, unique_namespace};

            const CREATE: &str = "CREATE TABLE IF NOT EXISTS order_subscriptions (\
                id VARCHAR(255) NOT NULL PRIMARY KEY, status VARCHAR(64) NOT NULL, \
                version BIGINT NOT NULL, writes BIGINT NOT NULL)";

            /// Transactional mode keyed by `x-event-id`; the handler advances the entity's
            /// version in the delivery's transaction and writes the business row only if it is
            /// newer, then behaves as `x-behave` says (`ok`, `slow`, `500` after its writes).
            fn service(
                store: $store,
                ns: &str,
            ) -> impl Service<
                Request<Full<Bytes>>,
                Response = Response<ResponseBody<Full<Bytes>>>,
                Error = Infallible,
                Future = impl Send,
            > + Clone
            + Send
            + 'static {
                let ns = ns.to_owned();
                let handler_store = store.clone();
                let handler_ns = ns.clone();
                TransactionalLayer::new(store)
                    .key(key::header("x-event-id").namespace(ns))
                    .lock_timeout(Duration::from_secs(10))
                    .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                        let (store, ns) = (handler_store.clone(), handler_ns.clone());
                        async move {
                            let answer = |status: StatusCode, body: &'static str| {
                                let mut res =
                                    Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                                *res.status_mut() = status;
                                Ok::<_, Infallible>(res)
                            };
                            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
                            let handle = req
                                .extensions()
                                .get::<TxHandle<<$store as TransactionalStore>::Database>>()
                                .unwrap()
                                .clone();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            let object = &event["data"]["object"];
                            let id = format!("{ns}/{}", object["id"].as_str().unwrap());
                            let status = object["status"].as_str().unwrap().to_owned();
                            let version = object["version"].as_i64().unwrap();
                            let entity =
                                IdempotencyKey::new(ns.clone(), object["id"].as_str().unwrap())
                                    .unwrap();

                            let mut tx = handle.lock().unwrap();
                            match version_guard::advance(&mut *tx, &store, &entity, version).await {
                                Ok(Advance::Applied) => {}
                                Ok(Advance::Outdated { .. }) => {
                                    return answer(StatusCode::OK, "outdated");
                                }
                                // A deadlock or lock timeout: the sender retries.
                                Err(_) => {
                                    return answer(
                                        StatusCode::INTERNAL_SERVER_ERROR,
                                        "advance failed",
                                    );
                                }
                            }
                            let written = sqlx::query(<$store as SqlBackend>::UPSERT_SUBSCRIPTION)
                                .bind(&id)
                                .bind(&status)
                                .bind(version)
                                .execute(&mut *tx)
                                .await;
                            if written.is_err() {
                                return answer(StatusCode::INTERNAL_SERVER_ERROR, "write failed");
                            }
                            drop(tx);
                            match behave.as_str() {
                                "500" => answer(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "failed after writing",
                                ),
                                "slow" => {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    answer(StatusCode::OK, "applied")
                                }
                                _ => answer(StatusCode::OK, "applied"),
                            }
                        }
                    }))
            }

            async fn setup(store: &$store) {
                let _turn = $crate::common::schema_turn().await;
                sqlx::query(CREATE).execute(store.pool()).await.unwrap();
            }

            async fn business(store: &$store, ns: &str, id: &str) -> Option<(String, i64, i64)> {
                sqlx::query_as(<$store as SqlBackend>::SELECT_SUBSCRIPTION)
                    .bind(format!("{ns}/{id}"))
                    .fetch_optional(store.pool())
                    .await
                    .unwrap()
            }

            async fn body_text(res: Response<ResponseBody<Full<Bytes>>>) -> String {
                let bytes = res.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(bytes.to_vec()).unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_reverse_order_newer_wins_and_a_500_rolls_back_both() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                setup(&store).await;
                let ns = unique_namespace("advance");
                let svc = service(store.clone(), &ns);
                let entity = key_in(&ns, "sub_1");

                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2", "sub_1", "cancelled", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("cancelled".into(), 2, 1))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

                // Another change with the same version under a new event id: it applies, as
                // the version guard runs it; the applied version stays.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                // A redelivery of that event is the marker's duplicate: the handler does not run.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(outcome_header(&res), Some("duplicate"));
                // An older version under a new event id is outdated, nothing written.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1b", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );

                // A 500 after both writes: the version and the business row roll back together.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "500"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                // The sender's retry applies it.
                let res = svc
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("past_due".into(), 3, 3))
                );
            }

            /// `advance` directly, in two transactions on the store's database: an equal
            /// version counts as advanced, and the entity's row keeps the second transaction
            /// waiting until the first ends; an older version is outdated.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_equal_version_applies_one_transaction_at_a_time() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                let ns = unique_namespace("advance-equal");
                let entity = key_in(&ns, "sub_1");

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.commit().await.unwrap();

                let mut first = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *first, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied,
                    "an equal version advances"
                );
                let (second_store, second_entity) = (store.clone(), entity.clone());
                let mut second = tokio::spawn(async move {
                    let mut tx = second_store.pool().begin().await.unwrap();
                    let advanced =
                        version_guard::advance(&mut *tx, &second_store, &second_entity, 5)
                            .await
                            .unwrap();
                    tx.commit().await.unwrap();
                    advanced
                });
                assert!(
                    tokio::time::timeout(Duration::from_millis(300), &mut second)
                        .await
                        .is_err(),
                    "the second transaction waits for the entity's row"
                );
                first.commit().await.unwrap();
                assert_eq!(second.await.unwrap(), Advance::Applied);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 4)
                        .await
                        .unwrap(),
                    Advance::Outdated { applied: 5 }
                );
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 6)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.rollback().await.unwrap();
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn advance_sixteen_versions_in_random_order_over_four_instances() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores: Vec<$store> = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $make.await else { return };
                    stores.push(store);
                }
                setup(&stores[0]).await;
                let ns = unique_namespace("advance-random");
                let services: Vec<_> = stores.iter().map(|s| service(s.clone(), &ns)).collect();
                let mut versions: Vec<i64> = (1..=16).collect();
                let mut rng = Shuffle::seeded();
                let seed = rng.0;
                rng.shuffle(&mut versions);
                let tasks: Vec<_> = versions
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let svc = services[i % services.len()].clone();
                        tokio::spawn(deliver_until_acknowledged(svc, move || {
                            delivery(
                                &format!("evt_{v}"),
                                "sub_1",
                                &format!("status-{v}"),
                                v,
                                "slow",
                            )
                        }))
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                let context = format!("seed {seed}, order {versions:?}");
                let (status, version, writes) = business(&stores[0], &ns, "sub_1").await.unwrap();
                assert_eq!((status.as_str(), version), ("status-16", 16), "{context}");
                assert!((1..=16).contains(&writes), "{writes} writes ({context})");
                let entity = key_in(&ns, "sub_1");
                assert_eq!(
                    stores[0].applied_version(&entity).await.unwrap(),
                    Some(16),
                    "{context}"
                );
            }
        }
    };
}
