//! [`SharedSettings`]: the settings several layers have in common, given once and applied to
//! each layer with `.with(&shared)`.

use std::time::Duration;

use super::drain::Drain;
use super::settings::Settings;
use crate::journal::Journal;
use crate::key::{MAX_KEY_LEN, Scope};

/// The setters of the settings a layer takes as they are given: each keeps its value for
/// [`SharedSettings::apply`].
macro_rules! plain_settings {
    ($($(#[$doc:meta])* $name:ident($value:ident: $ty:ty);)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $value: $ty) -> Self {
                self.$name = Some($value);
                self
            }
        )*
    };
}

/// What the layers of one service have in common, said once: the drain that stops them, the
/// journal they note deliveries in, their body limits, their timeouts, their scope.
///
/// Build it with the same methods the layers have, then give it to each layer with
/// `.with(&shared)` ([`IdempotencyLayer::with`](crate::IdempotencyLayer::with),
/// `TransactionalLayer::with`, [`VersionGuardLayer::with`](crate::version_guard::VersionGuardLayer::with)).
/// `.with` sets each setting this value holds, as if the layer's own method were called at
/// that point, and leaves the others as they were: a setting never given here keeps the
/// layer's default (the version guard's scope stays [`Scope::shared`]). A later call on the
/// layer overrides, for that layer alone.
///
/// What a route decides for itself stays on its layer: its key, its stale policy, which
/// answers commit, what a request without a key gets, and its signature check (each sender has
/// its own secret; `maybe_verify` takes one that may be absent).
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{
///     Drain, IdempotencyKey, IdempotencyLayer, Journal, SharedSettings, key, store::MemoryStore,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let drain = Drain::new();
/// let journal = Journal::default();
/// // What every route of this service has in common.
/// let shared = SharedSettings::new()
///     .drain(&drain)
///     .journal(&journal)
///     .body_limit(64 * 1024)
///     .store_timeout(Duration::from_secs(2));
///
/// let store = MemoryStore::new();
/// let handler = || {
///     service_fn(|_req| async {
///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///     })
/// };
/// let stripe = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(store.clone()).key(key::stripe()).with(&shared))
///     .service(handler());
/// let github = ServiceBuilder::new()
///     // A call after `with` overrides the shared value, for this route alone.
///     .layer(IdempotencyLayer::new(store).key(key::github()).with(&shared).body_limit(1024))
///     .service(handler());
///
/// // The shared body limit: a Stripe body above 64 KiB is refused before anything is claimed.
/// let big = Request::post("/").body(format!(r#"{{"id":"evt_1","pad":"{}"}}"#, "x".repeat(65 * 1024))).unwrap();
/// let refused = stripe.clone().oneshot(big).await.unwrap();
/// assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
///
/// // The shared journal: the GitHub route notes its deliveries in it.
/// let delivery = |id: &str| Request::post("/").header("x-github-delivery", id).body(String::new()).unwrap();
/// assert_eq!(github.clone().oneshot(delivery("d-1")).await.unwrap().status(), StatusCode::OK);
/// assert!(journal.last(&IdempotencyKey::new("github", "d-1").unwrap()).is_some());
///
/// // The shared drain: one shutdown stops both routes.
/// drain.close();
/// assert_eq!(github.oneshot(delivery("d-2")).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
/// let small = Request::post("/").body(r#"{"id":"evt_2"}"#.to_owned()).unwrap();
/// assert_eq!(stripe.oneshot(small).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct SharedSettings {
    drain: Option<Drain>,
    journal: Option<Journal>,
    body_limit: Option<usize>,
    body_timeout: Option<Duration>,
    retry_after: Option<Duration>,
    store_timeout: Option<Duration>,
    max_key_len: Option<usize>,
    scope: Option<Scope>,
}

impl SharedSettings {
    /// Settings that set nothing yet: `.with` of it leaves a layer as it was.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tracks the deliveries of every layer given these settings in `drain`, so that one
    /// shutdown stops them all. See the layers' `drain` and [`Drain`].
    pub fn drain(mut self, drain: &Drain) -> Self {
        self.drain = Some(drain.clone());
        self
    }

    /// Notes the deliveries of every layer that journals (the claim-then-commit
    /// [`IdempotencyLayer`](crate::IdempotencyLayer)) in `journal`. Transactional mode and the
    /// version guard journal nothing, and ignore it. See
    /// [`IdempotencyLayer::journal`](crate::IdempotencyLayer::journal).
    pub fn journal(mut self, journal: &Journal) -> Self {
        self.journal = Some(journal.clone());
        self
    }

    plain_settings! {
        /// The largest body a layer buffers, in bytes; larger bodies get 413. See
        /// [`IdempotencyLayer::body_limit`](crate::IdempotencyLayer::body_limit).
        body_limit(bytes: usize);
        /// How long a body may take to arrive. See
        /// [`IdempotencyLayer::body_timeout`](crate::IdempotencyLayer::body_timeout).
        body_timeout(timeout: Duration);
        /// The `Retry-After` sent with the in-flight 409 and with 503. See
        /// [`IdempotencyLayer::retry_after`](crate::IdempotencyLayer::retry_after).
        retry_after(after: Duration);
        /// How long one store call may take. See
        /// [`IdempotencyLayer::store_timeout`](crate::IdempotencyLayer::store_timeout).
        store_timeout(timeout: Duration);
    }

    /// Rejects key values (entity ids) longer than `bytes` with 400. See
    /// [`IdempotencyLayer::max_key_len`](crate::IdempotencyLayer::max_key_len).
    ///
    /// # Panics
    ///
    /// If `bytes` is above [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN), as the layers' method.
    #[track_caller]
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        assert!(
            bytes <= MAX_KEY_LEN,
            "max_key_len({bytes}) is above the longest key a store keeps, MAX_KEY_LEN ({MAX_KEY_LEN})",
        );
        self.max_key_len = Some(bytes);
        self
    }

    /// Which deliveries may meet as duplicates. Given here, it replaces the version guard's
    /// default ([`Scope::shared`]) too: call the guard's own `scope` after `with` to keep
    /// another. See [`IdempotencyLayer::scope`](crate::IdempotencyLayer::scope).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Sets in `settings` each setting given here.
    pub(crate) fn apply(&self, settings: &mut Settings) {
        fn set<T: Clone>(given: &Option<T>, setting: &mut T) {
            if let Some(value) = given {
                *setting = value.clone();
            }
        }
        set(&self.drain, &mut settings.drain);
        set(&self.body_limit, &mut settings.body_limit);
        set(&self.body_timeout, &mut settings.body_timeout);
        set(&self.retry_after, &mut settings.retry_after);
        set(&self.store_timeout, &mut settings.store_timeout);
        set(&self.max_key_len, &mut settings.max_key_len);
        if let Some(scope) = &self.scope {
            settings.scope = scope.for_another_layer();
        }
    }

    /// The journal given, for the layers that journal.
    pub(crate) fn journal_given(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }
}

#[cfg(test)]
mod tests;
