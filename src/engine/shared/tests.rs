//! Each setting given through [`SharedSettings`] reaches every kind of layer, and only the
//! settings given.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::util::ServiceFn;
use tower::{Layer, Service, ServiceExt, service_fn};

use super::*;
use crate::IdempotencyLayer;
use crate::body::RequestBody;
use crate::key;
use crate::store::MemoryStore;
use crate::version_guard::{VersionGuardLayer, version};

/// The inner service of every layer here: 200, whatever the delivery.
type Handler =
    ServiceFn<fn(Request<RequestBody<String>>) -> Ready<Result<Response<String>, Infallible>>>;

fn handler() -> Handler {
    fn answer(_req: Request<RequestBody<String>>) -> Ready<Result<Response<String>, Infallible>> {
        ready(Ok(Response::new(String::new())))
    }
    service_fn(answer as fn(_) -> _)
}

/// The status and `Retry-After` that `layer` answers to a delivery of `body`.
async fn answer<L, S, B>(layer: &L, body: String) -> (StatusCode, Option<String>)
where
    L: Layer<Handler, Service = S>,
    S: Service<Request<String>, Response = Response<B>, Error = Infallible>,
{
    let res = layer
        .layer(handler())
        .oneshot(Request::post("/hook").body(body).unwrap())
        .await
        .unwrap();
    let retry_after = res
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    (res.status(), retry_after)
}

/// A delivery of event `id` at version 1, keyed by its body.
fn event(id: &str) -> String {
    format!(r#"{{"id":"{id}","version":1}}"#)
}

fn claims(shared: &SharedSettings) -> IdempotencyLayer<MemoryStore, key::Json> {
    IdempotencyLayer::new(MemoryStore::new())
        .key(key::json("/id").namespace("claims"))
        .with(shared)
}

fn versions(shared: &SharedSettings) -> VersionGuardLayer<MemoryStore, key::Json, key::Json> {
    VersionGuardLayer::new(MemoryStore::new())
        .entity(key::json("/id").namespace("versions"))
        .version(version::json("/version"))
        .with(shared)
}

/// A SQLite store in memory: one connection the pool keeps open.
#[cfg(feature = "sqlite")]
async fn sqlite() -> crate::store::SqliteStore {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    let store = crate::store::SqliteStore::new(pool);
    store.migrate().await.unwrap();
    store
}

#[cfg(feature = "sqlite")]
async fn transactional(
    shared: &SharedSettings,
) -> crate::transactional::TransactionalLayer<crate::store::SqliteStore, key::Json> {
    crate::transactional::TransactionalLayer::new(sqlite().await)
        .key(key::json("/id").namespace("transactional"))
        .with(shared)
}

#[tokio::test]
async fn a_drain_given_once_stops_every_kind_of_layer() {
    let drain = Drain::new();
    let shared = SharedSettings::new()
        .drain(&drain)
        .retry_after(Duration::from_secs(42));
    let claims = claims(&shared);
    let versions = versions(&shared);
    #[cfg(feature = "sqlite")]
    let transactional = transactional(&shared).await;

    let running = (StatusCode::OK, None);
    assert_eq!(answer(&claims, event("a")).await, running);
    assert_eq!(answer(&versions, event("a")).await, running);
    #[cfg(feature = "sqlite")]
    assert_eq!(answer(&transactional, event("a")).await, running);

    // The drain begins: each layer turns new deliveries away, with the shared Retry-After.
    drain.close();
    let draining = (StatusCode::SERVICE_UNAVAILABLE, Some("42".to_owned()));
    assert_eq!(answer(&claims, event("b")).await, draining);
    assert_eq!(answer(&versions, event("b")).await, draining);
    #[cfg(feature = "sqlite")]
    assert_eq!(answer(&transactional, event("b")).await, draining);
}

#[tokio::test]
async fn a_body_limit_given_once_refuses_larger_bodies_in_every_kind_of_layer() {
    let shared = SharedSettings::new().body_limit(16);
    let large = || event("an-event-id-longer-than-the-limit");
    assert!(large().len() > 16);
    let claims = claims(&shared);
    let versions = versions(&shared);
    let too_large = (StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(answer(&claims, large()).await, too_large);
    assert_eq!(answer(&versions, large()).await, too_large);
    #[cfg(feature = "sqlite")]
    assert_eq!(
        answer(&transactional(&shared).await, large()).await,
        too_large
    );

    // A call on the layer after `with` overrides the shared limit, for that layer alone.
    let roomier = claims.clone().body_limit(1024);
    assert_eq!(answer(&roomier, large()).await, (StatusCode::OK, None));
    assert_eq!(answer(&claims, large()).await, too_large);
    let roomier = versions.clone().body_limit(1024);
    assert_eq!(answer(&roomier, large()).await, (StatusCode::OK, None));
}

#[test]
fn only_the_settings_given_are_applied() {
    // The version guard's own default scope, and a limit set on the layer before `with`.
    let mut settings = Settings {
        scope: Scope::shared(),
        body_limit: 2048,
        ..Settings::default()
    };
    let defaults = Settings::default();
    SharedSettings::new()
        .store_timeout(Duration::from_secs(1))
        .apply(&mut settings);
    assert_eq!(settings.store_timeout, Duration::from_secs(1));
    assert_eq!(format!("{:?}", settings.scope), "Scope::shared()");
    assert_eq!(settings.body_limit, 2048);
    assert_eq!(settings.body_timeout, defaults.body_timeout);
    assert_eq!(settings.retry_after, defaults.retry_after);
    assert_eq!(settings.max_key_len, defaults.max_key_len);

    // Given, each replaces what the layer had.
    let drain = Drain::new();
    SharedSettings::new()
        .drain(&drain)
        .body_limit(10)
        .body_timeout(Duration::from_secs(3))
        .retry_after(Duration::from_secs(4))
        .max_key_len(100)
        .scope(Scope::named("billing"))
        .apply(&mut settings);
    assert_eq!(settings.body_limit, 10);
    assert_eq!(settings.body_timeout, Duration::from_secs(3));
    assert_eq!(settings.retry_after, Duration::from_secs(4));
    assert_eq!(settings.max_key_len, 100);
    assert_eq!(
        format!("{:?}", settings.scope),
        r#"Scope::named("billing")"#
    );
    drain.close();
    assert!(
        settings.drain.is_closed(),
        "the layer's drain is the one given"
    );
}

#[test]
#[should_panic(expected = "MAX_KEY_LEN")]
fn a_key_length_above_what_stores_keep_is_refused_as_on_the_layers() {
    let _ = SharedSettings::new().max_key_len(MAX_KEY_LEN + 1);
}

#[cfg(feature = "verify")]
#[tokio::test]
async fn maybe_verify_checks_signatures_only_when_given_a_check() {
    let secret = |given: bool| given.then(|| "a secret".to_owned());
    let unsigned =
        claims(&SharedSettings::new()).maybe_verify(secret(false).map(crate::verify::github));
    assert_eq!(answer(&unsigned, event("a")).await, (StatusCode::OK, None));
    let signed =
        claims(&SharedSettings::new()).maybe_verify(secret(true).map(crate::verify::github));
    assert_eq!(
        answer(&signed, event("a")).await,
        (StatusCode::UNAUTHORIZED, None)
    );
}
