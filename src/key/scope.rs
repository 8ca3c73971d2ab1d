//! Which deliveries may meet as duplicates: the scope joined to every key's namespace.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};

use http::request::Parts;
use sha2::{Digest, Sha256};

use super::{IdempotencyKey, KeyError, MAX_NAMESPACE_LEN, Name, check_text};

/// Which deliveries may meet as duplicates of each other.
///
/// A sender delivers one event to **every** endpoint subscribed to it: two Stripe endpoints
/// both receive `evt_123`. Were both routes to use the namespace `stripe` in one store, the
/// second route would see the first one's claim and answer "duplicate", and its work would
/// never run. So the layer joins a scope to the namespace of every key it finds, as
/// `namespace@scope` (`stripe@/webhooks/billing`), and only keys of the same scope meet.
///
/// **A scope is configuration, never bytes the sender chose.** A signature covers the body
/// and a timestamp, not the URL: a captured delivery replayed, signature intact, to another
/// path that reaches the same handler (a parameter or wildcard route, a fallback, a plain
/// hyper service that answers every path) must meet the first delivery as a duplicate. So no
/// scope is ever taken from the raw request path.
///
/// - [`Scope::route`], the default: the route the router matched, as it was written
///   (`/webhooks/{provider}`, not `/webhooks/stripe`), read from axum's
///   [`MatchedPath`](https://docs.rs/axum/0.8/axum/extract/struct.MatchedPath.html) (feature
///   `axum`, on by default). Each route is a scope of its own, and every path one route
///   matches is that one scope. Where no router says which route matched (a plain hyper or
///   tower service, a router's fallback, the `axum` feature off), the key has no scope: the
///   namespace alone.
/// - [`Scope::named`]: a name chosen once, which survives moving the route to another path.
///   Two routes given the same name share their keys on purpose. Give each layer a name
///   where no router reports a route and two services share a namespace and a store.
/// - [`Scope::from_fn`]: computed from the request head, e.g. per tenant.
/// - [`Scope::shared`]: no scope, the namespace alone: every route with the same namespace
///   shares its keys.
///
/// A scoped namespace longer than [`MAX_NAMESPACE_LEN`] is cut and ends in `#` and 16 hex
/// digits of its SHA-256, so that long routes still tell apart.
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let layer = IdempotencyLayer::new(store).key(key::github());
/// let app = Router::new()
///     .route("/hooks/ci", post(|| async { "built" }))
///     .route("/hooks/deploy/{env}", post(|| async { "deployed" }))
///     .layer(layer);
/// let delivery = |path: &str| {
///     Request::post(path).header("x-github-delivery", "d-1").body(Body::empty()).unwrap()
/// };
/// let outcome = |res: &http::Response<_>| res.headers().get("idempotency-outcome").cloned();
///
/// // The same delivery id on two routes: two endpoints, both run.
/// let ci = app.clone().oneshot(delivery("/hooks/ci")).await.unwrap();
/// let deploy = app.clone().oneshot(delivery("/hooks/deploy/prod")).await.unwrap();
/// assert_eq!((ci.status(), outcome(&ci)), (StatusCode::OK, None));
/// assert_eq!((deploy.status(), outcome(&deploy)), (StatusCode::OK, None));
///
/// // Replayed to another path of the same route: one route, one scope, a duplicate.
/// let replay = app.oneshot(delivery("/hooks/deploy/staging")).await.unwrap();
/// assert_eq!(replay.headers()["idempotency-outcome"], "duplicate");
/// # }
/// ```
///
/// Without a router, name the scope:
///
/// ```
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyKey, IdempotencyLayer, key::{self, Scope}, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let route = |scope: Scope| {
///     ServiceBuilder::new()
///         .layer(IdempotencyLayer::new(store.clone()).key(key::github()).scope(scope))
///         .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }))
/// };
/// let delivery = |path: &str| Request::post(path).header("x-github-delivery", "d-1").body(String::new()).unwrap();
///
/// // Two services, two names: the same delivery id runs on each.
/// let ci = route(Scope::named("ci")).oneshot(delivery("/hooks/ci")).await.unwrap();
/// let deploys = route(Scope::named("deploys")).oneshot(delivery("/hooks/deploys")).await.unwrap();
/// assert_eq!(ci.headers().get("idempotency-outcome"), None);
/// assert_eq!(deploys.headers().get("idempotency-outcome"), None);
/// assert_eq!(ci.extensions().get::<IdempotencyKey>().unwrap().namespace(), "github@ci");
///
/// // Whatever path the request names, the same service's name is the same scope.
/// let replay = route(Scope::named("ci")).oneshot(delivery("/hooks/%63i/x")).await.unwrap();
/// assert_eq!(replay.status(), StatusCode::OK);
/// assert_eq!(replay.headers()["idempotency-outcome"], "duplicate");
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Scope {
    kind: Kind,
    /// The namespace scoped last, so that a route's deliveries share one joined namespace
    /// instead of building and checking it each time. Shared by the clones of the scope.
    last: Arc<Mutex<Option<Joined>>>,
}

/// A namespace joined to a scope, and what it was made of.
struct Joined {
    namespace: Name,
    scope: Box<str>,
    joined: Arc<str>,
}

#[derive(Clone, Default)]
enum Kind {
    #[default]
    Route,
    Named(Cow<'static, str>),
    Shared,
    FromFn(Arc<dyn Fn(&Parts) -> String + Send + Sync>),
}

impl Scope {
    /// The route the router matched, as written in the router (axum's `MatchedPath`, feature
    /// `axum`): one scope per route, whatever path reached it. No scope where no router says
    /// which route matched. The default.
    pub fn route() -> Self {
        Self::of(Kind::Route)
    }

    /// A fixed name. Routes given the same name share their keys.
    ///
    /// # Panics
    ///
    /// If `name` is empty, has leading or trailing whitespace, control characters or
    /// invisible format characters (see [`IdempotencyKey`]), or is longer than
    /// [`MAX_NAMESPACE_LEN`]: a configuration mistake, caught when the layer is built.
    pub fn named(name: impl Into<Cow<'static, str>>) -> Self {
        let name = name.into();
        if let Err(err) = check_text("scope", &name, MAX_NAMESPACE_LEN) {
            panic!("invalid scope {name:?}: {err}");
        }
        Self::of(Kind::Named(name))
    }

    /// No scope: keys are the extractor's namespace and value alone, shared by every route
    /// that uses the same namespace in the same store.
    pub fn shared() -> Self {
        Self::of(Kind::Shared)
    }

    /// A scope computed from the request head, e.g. the tenant a route serves. A request for
    /// which `f` answers an empty string is rejected with 400.
    ///
    /// Compute it from what the application trusts (a value an authentication layer put in
    /// the extensions, a path the router matched), not from a header any client can set.
    ///
    /// ```
    /// use tower_idempotency::key::Scope;
    ///
    /// /// Put in the extensions by the layer that authenticates the tenant's endpoint.
    /// #[derive(Clone)]
    /// struct Tenant(String);
    ///
    /// // Tenants share one route; their senders' ids never meet. No tenant: rejected (400).
    /// let per_tenant = Scope::from_fn(|parts| {
    ///     parts.extensions.get::<Tenant>().map(|t| format!("tenant={}", t.0)).unwrap_or_default()
    /// });
    /// # let _ = per_tenant;
    /// ```
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        Self::of(Kind::FromFn(Arc::new(f)))
    }

    fn of(kind: Kind) -> Self {
        Self {
            kind,
            last: Arc::default(),
        }
    }

    /// The same scope with a cache of its own, for another layer: layers whose keys have
    /// different namespaces, sharing one cache, would keep replacing each other's joined
    /// namespace.
    pub(crate) fn for_another_layer(&self) -> Self {
        Self::of(self.kind.clone())
    }

    /// Joins this scope to the namespace of `key`.
    pub(crate) fn apply(
        &self,
        key: IdempotencyKey,
        parts: &Parts,
    ) -> Result<IdempotencyKey, KeyError> {
        let scope: Cow<'_, str> = match &self.kind {
            Kind::Shared => return Ok(key),
            Kind::Route => match matched_route(parts) {
                Some(route) => Cow::Borrowed(route),
                None => return Ok(key),
            },
            Kind::Named(name) => Cow::Borrowed(name),
            Kind::FromFn(f) => Cow::Owned(f(parts)),
        };
        // Another delivery holding the lock only means this one joins its own.
        let mut last = self.last.try_lock().ok();
        if let Some(Some(hit)) = last.as_deref()
            && hit.namespace.as_str() == key.namespace()
            && *hit.scope == *scope
        {
            return Ok(key.renamed(Name::Shared(hit.joined.clone())));
        }
        let joined = join(key.namespace(), &scope)?;
        if let Some(last) = last.as_deref_mut() {
            *last = Some(Joined {
                namespace: key.namespace.clone(),
                scope: scope.into(),
                joined: joined.clone(),
            });
        }
        Ok(key.renamed(Name::Shared(joined)))
    }
}

/// `namespace@scope`, checked: the namespace of a key scoped `scope`.
fn join(namespace: &str, scope: &str) -> Result<Arc<str>, KeyError> {
    if namespace.contains('@') {
        // Only an extractor of one's own can get here (`.namespace(..)` refuses `@`).
        return Err(KeyError::invalid(
            "the key's namespace contains `@`, which separates a namespace from its scope",
        ));
    }
    if scope.is_empty() {
        return Err(KeyError::invalid("the key's scope is empty"));
    }
    let namespace = scoped(namespace, scope);
    check_text("scoped namespace", &namespace, MAX_NAMESPACE_LEN)?;
    Ok(namespace.into())
}

impl IdempotencyKey {
    /// The same value in another namespace.
    fn renamed(self, namespace: Name) -> Self {
        Self {
            namespace,
            value: self.value,
        }
    }
}

impl IdempotencyKey {
    /// This key as a layer with a scope of `scope` stores it: what to give
    /// [`Store::describe`](crate::store::Store::describe) or
    /// [`Store::resolve`](crate::store::Store::resolve) for a key a route claimed. Under the
    /// default [`Scope::route`], `scope` is the route as written in the router
    /// (`/webhooks/{provider}`); under [`Scope::named`], the name.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyKey;
    ///
    /// let sent = IdempotencyKey::new("stripe", "evt_1").unwrap();
    /// let stored = sent.scoped("/webhooks/stripe").unwrap();
    /// assert_eq!(stored.namespace(), "stripe@/webhooks/stripe");
    /// assert_eq!(stored.value(), "evt_1");
    /// ```
    pub fn scoped(&self, scope: &str) -> Result<IdempotencyKey, KeyError> {
        let joined = join(self.namespace(), scope)?;
        Ok(self.clone().renamed(Name::Shared(joined)))
    }
}

/// `namespace@scope`, cut to [`MAX_NAMESPACE_LEN`] with a digest of the whole when longer.
fn scoped(namespace: &str, scope: &str) -> String {
    let mut full = String::with_capacity(namespace.len() + 1 + scope.len());
    full.push_str(namespace);
    full.push('@');
    full.push_str(scope);
    if full.len() <= MAX_NAMESPACE_LEN {
        return full;
    }
    // 64 bits of SHA-256: stable across releases and platforms, as stored keys need, and
    // not to be matched by a path chosen to collide with another route's.
    let digest = Sha256::digest(full.as_bytes());
    let mut cut = MAX_NAMESPACE_LEN - 17;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    full.truncate(cut);
    full.push('#');
    for byte in &digest[..8] {
        full.push_str(&format!("{byte:02x}"));
    }
    full
}

/// The route template the router matched, where a router says so.
#[cfg(feature = "axum")]
fn matched_route(parts: &Parts) -> Option<&str> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str)
}

#[cfg(not(feature = "axum"))]
fn matched_route(_parts: &Parts) -> Option<&str> {
    None
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Route => f.write_str("Scope::route()"),
            Kind::Named(name) => write!(f, "Scope::named({name:?})"),
            Kind::Shared => f.write_str("Scope::shared()"),
            Kind::FromFn(_) => f.write_str("Scope::from_fn(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        http::Request::post(uri).body(()).unwrap().into_parts().0
    }

    /// A request head as axum's router hands it on after matching `route`.
    #[cfg(feature = "axum")]
    fn routed(uri: &str, route: &str) -> Parts {
        use axum::{Router, extract::MatchedPath, routing::post};
        use tower::ServiceExt;
        let seen = Arc::new(Mutex::new(None));
        let keep = seen.clone();
        let app = Router::new().route(
            route,
            post(move |matched: MatchedPath| async move {
                *keep.lock().unwrap() = Some(matched);
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let request = http::Request::post(uri)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = runtime.block_on(app.oneshot(request)).unwrap();
        assert_eq!(
            response.status(),
            http::StatusCode::OK,
            "{uri} matches {route}"
        );
        let mut parts = parts(uri);
        parts
            .extensions
            .insert(seen.lock().unwrap().take().unwrap());
        parts
    }

    fn key() -> IdempotencyKey {
        IdempotencyKey::new("stripe", "evt_1").unwrap()
    }

    #[test]
    fn without_a_matched_route_the_raw_path_is_never_a_scope() {
        for uri in ["/webhooks/stripe", "/webhooks/%73tripe/y", "/x?a=1", "/"] {
            let scoped = Scope::route().apply(key(), &parts(uri)).unwrap();
            assert_eq!(scoped, key(), "{uri}: the namespace alone");
        }
    }

    #[cfg(feature = "axum")]
    #[test]
    fn the_matched_route_is_the_scope_whatever_path_reached_it() {
        let scope =
            |uri: &str, route: &str| Scope::route().apply(key(), &routed(uri, route)).unwrap();
        let literal = scope("/webhooks/stripe?attempt=2", "/webhooks/stripe");
        assert_eq!(literal.namespace(), "stripe@/webhooks/stripe");
        let a = scope("/hooks/stripe/x", "/hooks/{provider}/{*rest}");
        let b = scope("/hooks/%73tripe/y", "/hooks/{provider}/{*rest}");
        assert_eq!(a, b);
        assert_eq!(a.namespace(), "stripe@/hooks/{provider}/{*rest}");
        assert_ne!(literal, a, "two routes, two scopes");
    }

    #[test]
    fn shared_scope_keeps_the_key() {
        let scoped = Scope::shared().apply(key(), &parts("/a")).unwrap();
        assert_eq!(scoped, key());
    }

    #[test]
    fn long_scopes_are_cut_with_a_hash_that_tells_them_apart() {
        let long = format!("/{}", "a".repeat(100));
        let named = |name: String| Scope::from_fn(move |_| name.clone());
        let a = named(format!("{long}/x"))
            .apply(key(), &parts("/"))
            .unwrap();
        let b = named(format!("{long}/y"))
            .apply(key(), &parts("/"))
            .unwrap();
        assert_eq!(a.namespace().len(), MAX_NAMESPACE_LEN);
        assert_ne!(a.namespace(), b.namespace());
        assert!(a.namespace().starts_with("stripe@/aaaa"));
        // Stable: the same input gives the same stored namespace in every release.
        let cut = scoped("ns", &"é".repeat(40));
        assert_eq!(cut, scoped("ns", &"é".repeat(40)));
        assert!(cut.len() <= MAX_NAMESPACE_LEN);
        assert_eq!(
            scoped("stripe", &format!("/{}", "a".repeat(60))),
            "stripe@/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa#eea73871f16349c6"
        );
    }

    #[test]
    fn the_last_joined_namespace_is_shared_only_with_its_own() {
        let scope = Scope::from_fn(|p| p.uri.path().trim_start_matches('/').to_owned());
        let first = scope.apply(key(), &parts("/a")).unwrap();
        let again = scope.apply(key(), &parts("/a")).unwrap();
        assert_eq!(first, again);
        assert_eq!(again.namespace(), "stripe@a");
        // Another scope, another namespace, then the first again: each its own.
        let other = scope.apply(key(), &parts("/b")).unwrap();
        assert_eq!(other.namespace(), "stripe@b");
        let github = IdempotencyKey::new("github", "evt_1").unwrap();
        assert_eq!(
            scope.apply(github, &parts("/b")).unwrap().namespace(),
            "github@b"
        );
        assert_eq!(scope.clone().apply(key(), &parts("/a")).unwrap(), first);
        // A namespace that cannot be scoped is refused every time, cached or not.
        let at = || IdempotencyKey::new("a@b", "evt_1").unwrap();
        assert!(scope.apply(at(), &parts("/a")).is_err());
        assert!(scope.apply(at(), &parts("/a")).is_err());
        let named = Scope::named("ci");
        for _ in 0..2 {
            assert_eq!(
                named.apply(key(), &parts("/x")).unwrap().namespace(),
                "stripe@ci"
            );
        }
    }

    #[test]
    fn computed_scopes_are_checked() {
        let empty = Scope::from_fn(|_| String::new());
        assert!(empty.apply(key(), &parts("/")).is_err());
        let at = IdempotencyKey::new("a@b", "evt_1").unwrap();
        assert!(
            Scope::named("x").apply(at, &parts("/x")).is_err(),
            "`@` is the separator"
        );
        let control = Scope::from_fn(|_| "a\u{7}b".to_owned());
        assert!(control.apply(key(), &parts("/")).is_err());
        let tenant = Scope::from_fn(|p| format!("t-{}", p.uri.path().len()));
        assert_eq!(
            tenant.apply(key(), &parts("/ab")).unwrap().namespace(),
            "stripe@t-3"
        );
    }
}
