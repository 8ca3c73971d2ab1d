//! Several app instances (one store handle each, on one backend) claiming at once: one winner
//! per key, one handler run per event.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower_layer::Layer;
use tower_service::Service;

use crate::store::{Claim, Store};
use crate::{IdempotencyLayer, key};

use super::{LONG, key_in, unique_namespace};

/// 64 claims of one key at once, spread over `stores` (handles on one backend, each as its own
/// app instance would hold it): exactly one acquires, every other finds it in flight.
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

/// 64 deliveries of one event spread over several instances (one store handle each, behind an
/// [`IdempotencyLayer`]): exactly one handler run, every other answer 200 (duplicate) or 409
/// (in flight).
pub async fn race_one_event<S: Store + Clone>(stores: Vec<S>) {
    let ns = unique_namespace("race-one");
    let runs = Arc::new(AtomicUsize::new(0));
    let statuses = deliver(stores, &ns, &runs, (0..64).map(|_| "evt_race".to_owned())).await;
    let mut ok = 0;
    for status in statuses {
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one handler run");
    assert!(ok >= 1);
}

/// 200 distinct events, each delivered twice at once over several instances (one store handle
/// each, behind an [`IdempotencyLayer`]): exactly 200 handler runs.
pub async fn race_many_events<S: Store + Clone>(stores: Vec<S>) {
    let ns = unique_namespace("race-many");
    let runs = Arc::new(AtomicUsize::new(0));
    let events = (0..400).map(|i| format!("evt_{}", i / 2));
    for status in deliver(stores, &ns, &runs, events).await {
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "unexpected {status}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 200, "one run per event");
}

/// Delivers each of `events` at once, in a task of its own, through one instance of `stores`
/// after the other (an [`IdempotencyLayer`] keyed by the header `x-event-id` in namespace `ns`,
/// around a [`Counting`] handler): the statuses answered, in order.
async fn deliver<S: Store + Clone>(
    stores: Vec<S>,
    ns: &str,
    runs: &Arc<AtomicUsize>,
    events: impl Iterator<Item = String>,
) -> Vec<StatusCode> {
    let services: Vec<_> = stores
        .into_iter()
        .map(|store| {
            IdempotencyLayer::new(store)
                .key(key::header("x-event-id").namespace(ns.to_owned()))
                .layer(Counting(runs.clone()))
        })
        .collect();
    let tasks: Vec<_> = events
        .enumerate()
        .map(|(i, event)| {
            let mut svc = services[i % services.len()].clone();
            let delivery = Request::post("/hook")
                .header("x-event-id", event)
                .body(Full::new(Bytes::new()))
                .unwrap();
            tokio::spawn(async move {
                poll_fn(|cx| Service::<Request<Full<Bytes>>>::poll_ready(&mut svc, cx))
                    .await
                    .unwrap();
                svc.call(delivery).await.unwrap().status()
            })
        })
        .collect();
    let mut statuses = Vec::with_capacity(tasks.len());
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

/// A webhook handler that counts its runs and sleeps a little, so that concurrent deliveries
/// overlap.
#[derive(Clone)]
struct Counting(Arc<AtomicUsize>);

impl<B> Service<Request<B>> for Counting {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<B>) -> Self::Future {
        let runs = self.0.clone();
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}
