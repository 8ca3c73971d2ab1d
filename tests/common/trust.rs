//! Which deliveries a key may be trusted from, and how far it reaches: a forged delivery
//! claims nothing, and one event sent to two routes runs on each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::store::Store;
use tower_idempotency::{IdempotencyLayer, key};

use super::unique_namespace;
#[cfg(feature = "verify")]
use super::{Counting, counting_body_service, stripe_delivery};

/// A forged delivery with a real event id, sent first, claims nothing (401, the store never
/// called); the genuine delivery that follows runs, once.
#[cfg(feature = "verify")]
pub async fn forged_first_then_genuine_runs<St: Store + Clone>(store: St) {
    use tower_idempotency::verify;
    // No router here, so the key has no scope: the id alone keeps runs apart.
    let path = "/webhooks/stripe";
    let counting = Counting::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(counting.clone())
        .key(key::stripe())
        .verify(verify::stripe("whsec_genuine"));
    let svc = counting_body_service(layer, runs.clone());
    let id = format!("evt_leaked_in_a_log_{}", unique_namespace("forged"));
    let (path, id) = (path, id.as_str());

    for forged in [
        stripe_delivery(path, id, None),
        stripe_delivery(path, id, Some("whsec_guessed")),
    ] {
        let res = svc.clone().oneshot(forged).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["idempotency-outcome"], "unverified");
    }
    assert_eq!(
        counting.calls(),
        0,
        "a forged delivery never reaches the store"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let genuine = svc
        .clone()
        .oneshot(stripe_delivery(path, id, Some("whsec_genuine")))
        .await
        .unwrap();
    assert_eq!(genuine.status(), StatusCode::OK);
    assert_eq!(genuine.headers().get("idempotency-outcome"), None);
    let again = svc
        .oneshot(stripe_delivery(path, id, Some("whsec_genuine")))
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the genuine delivery ran, once"
    );
}

/// One event delivered to two routes of one axum router, on one store, both keyed by
/// `key::stripe()`: each route runs it once (the scope is the route the router matched), and
/// each route's redelivery is its own duplicate.
pub async fn two_routes_each_run_once<St: Store + Clone>(store: St) {
    use axum::routing::post;
    let id = format!("evt_{}", unique_namespace("two-routes"));
    let delivery = |path: &str| {
        let body = format!(r#"{{"id":"{id}","object":"event"}}"#);
        Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap()
    };
    let routes = ["/webhooks/billing", "/webhooks/analytics"];
    let runs = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let counted = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "ok"
        })
    };
    let app = axum::Router::new()
        .route(routes[0], counted(&runs[0]))
        .route(routes[1], counted(&runs[1]))
        .layer(IdempotencyLayer::new(store.clone()).key(key::stripe()));
    // Both endpoints at once, as the sender fans out.
    let (a, b) = tokio::join!(
        app.clone().oneshot(delivery(routes[0])),
        app.clone().oneshot(delivery(routes[1])),
    );
    for res in [a.unwrap(), b.unwrap()] {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers().get("idempotency-outcome"),
            None,
            "each route runs"
        );
    }
    for route in routes {
        let again = app.clone().oneshot(delivery(route)).await.unwrap();
        assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
    }
    assert_eq!(runs[0].load(Ordering::SeqCst), 1);
    assert_eq!(runs[1].load(Ordering::SeqCst), 1);
}

/// The `trust` arm of [`backend_suite!`](crate::backend_suite): module `trust`, the tests of
/// keys' trust and scope, each with a store made by `$make`.
#[macro_export]
macro_rules! trust_suite {
    ($make:expr) => {
        mod trust {
            #[allow(unused_imports)]
            use super::*;

            #[cfg(feature = "verify")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn forged_first_delivery_then_the_genuine_one_runs() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::trust::forged_first_then_genuine_runs(store).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_event_to_two_routes_runs_on_each() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::trust::two_routes_each_run_once(store).await;
            }
        }
    };
}
