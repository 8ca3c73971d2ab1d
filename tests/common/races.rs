//! Several app instances (one store handle each, on one database) claiming at once: one
//! winner per key, one handler run per event.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
use tower::ServiceExt;
use tower_idempotency::store::{Claim, Store};
use tower_idempotency::{IdempotencyLayer, key};

use super::{LONG, counting_layer_service, delivery, key_in, unique_namespace};

pub async fn concurrent_claims_have_one_winner<S: Store + Clone>(stores: Vec<S>) {
    let key = key_in(&unique_namespace("claims"), "evt_1");
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let key = key.clone();
            tokio::spawn(async move { store.claim(&key, LONG).await.unwrap() })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        match task.await.unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::InFlight(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1);
}

/// 64 deliveries of one event spread over several instances (one store handle each): exactly
/// one handler run, every other answer 200 (duplicate) or 409 (in flight).
pub async fn race_one_event<St: Store + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("race-one");
    let runs = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let layer =
                IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns.clone()));
            counting_layer_service(layer, runs.clone())
        })
        .collect();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = delivery("evt_race");
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one handler run");
    assert!(ok >= 1);
}

/// 200 distinct events, each delivered twice at once over several instances: exactly 200
/// handler runs.
pub async fn race_many_events<St: Store + Clone>(stores: Vec<St>) {
    let ns = unique_namespace("race-many");
    let runs = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let layer =
                IdempotencyLayer::new(store).key(key::header("x-event-id").namespace(ns.clone()));
            counting_layer_service(layer, runs.clone())
        })
        .collect();
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = delivery(&format!("evt_{}", i / 2));
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 200, "one run per event");
}

/// The `races` arm of [`backend_suite!`](crate::backend_suite): module `races`, where each test
/// calls `$make` four times for four app instances (each its own pool), or skips on `None`.
#[macro_export]
macro_rules! races_suite {
    ($make:expr) => {
        mod races {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $make.await else { return };
                    stores.push(store);
                }
                $crate::common::races::concurrent_claims_have_one_winner(stores).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn race_one_event_over_four_instances() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $make.await else { return };
                    stores.push(store);
                }
                $crate::common::races::race_one_event(stores).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn race_200_events_over_four_instances() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let mut stores = Vec::new();
                for _ in 0..4 {
                    let Some(store) = $make.await else { return };
                    stores.push(store);
                }
                $crate::common::races::race_many_events(stores).await;
            }
        }
    };
}
