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
/// - [`Scope::path`], the default: the request's path, without the query. That is the URL
///   registered with the sender, so each endpoint is a scope of its own.
/// - [`Scope::named`]: a name chosen once, which survives moving the route to another path.
///   Two routes given the same name share their keys on purpose.
/// - [`Scope::from_fn`]: computed from the request head, e.g. per tenant.
/// - [`Scope::shared`]: no scope, the namespace alone: every route with the same namespace
///   shares its keys (the behaviour, and the stored keys, of releases before the scope).
///
/// A scoped namespace longer than [`MAX_NAMESPACE_LEN`] is cut and ends in `#` and 16 hex
/// digits of its SHA-256, so that long paths still tell apart.
///
/// **The path is what this layer sees.** Equivalent spellings of one path are one scope
/// (`/hooks/%67ithub` is `/hooks/github`). Under axum's `Router::nest`, a layer inside the
/// nested router sees the path without the prefix, so two nested copies of one router
/// (`/billing/hook` and `/analytics/hook`, both `/hook` inside) share a scope: layer the
/// outer routes instead, or give each copy a [`Scope::named`]. A name is also what keeps
/// stored keys when a route moves.
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
/// // The same delivery id on two paths: two events for two endpoints, both run.
/// let first = route(Scope::path()).oneshot(delivery("/hooks/ci")).await.unwrap();
/// let other = route(Scope::path()).oneshot(delivery("/hooks/deploys")).await.unwrap();
/// assert_eq!(first.headers().get("idempotency-outcome"), None);
/// assert_eq!(other.headers().get("idempotency-outcome"), None);
/// assert_eq!(
///     first.extensions().get::<IdempotencyKey>().unwrap().namespace(),
///     "github@/hooks/ci",
/// );
///
/// // A name shared on purpose: the second route sees the first one's key.
/// let a = route(Scope::named("ci")).oneshot(delivery("/v1/hooks")).await.unwrap();
/// let b = route(Scope::named("ci")).oneshot(delivery("/v2/hooks")).await.unwrap();
/// assert_eq!(a.status(), StatusCode::OK);
/// assert_eq!(b.headers()["idempotency-outcome"], "duplicate");
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
    Path,
    Named(Cow<'static, str>),
    Shared,
    FromFn(Arc<dyn Fn(&Parts) -> String + Send + Sync>),
}

impl Scope {
    /// The request's path, without the query: one scope per endpoint. The default.
    pub fn path() -> Self {
        Self::of(Kind::Path)
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

    /// Joins this scope to the namespace of `key`.
    pub(crate) fn apply(
        &self,
        key: IdempotencyKey,
        parts: &Parts,
    ) -> Result<IdempotencyKey, KeyError> {
        let scope: Cow<'_, str> = match &self.kind {
            Kind::Shared => return Ok(key),
            Kind::Path => normalized(parts.uri.path()),
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
    /// default [`Scope::path`], `scope` is the route's path, written as the route is (the path
    /// scope also decodes percent-escapes of unreserved characters; this does not).
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

/// A path as scope: `/` for none (a `CONNECT` request), and percent-encoded unreserved
/// characters decoded (RFC 3986, section 6.2.2.2), so that `/hooks/%67ithub` and
/// `/hooks/github` are one endpoint; other escapes keep their meaning, in upper case.
fn normalized(path: &str) -> Cow<'_, str> {
    if path.is_empty() {
        return Cow::Borrowed("/");
    }
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let hex = |b: u8| char::from(b).to_digit(16);
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&high), Some(&low)) => {
                hex(high).zip(hex(low)).map(|(h, l)| (h * 16 + l) as u8)
            }
            _ => None,
        };
        match escape {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) => out.push(byte),
            Some(byte) => out.extend_from_slice(format!("%{byte:02X}").as_bytes()),
            // `%` without two hex digits, and every other byte, stay as they are.
            None => {
                out.push(bytes[i]);
                i += 1;
                continue;
            }
        }
        i += 3;
    }
    // Only ASCII escapes were replaced, by ASCII: still the UTF-8 the path was.
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Path => f.write_str("Scope::path()"),
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

    fn key() -> IdempotencyKey {
        IdempotencyKey::new("stripe", "evt_1").unwrap()
    }

    #[test]
    fn path_scope_ignores_the_query() {
        let scoped = Scope::path()
            .apply(key(), &parts("/hooks/stripe?attempt=2"))
            .unwrap();
        assert_eq!(scoped.namespace(), "stripe@/hooks/stripe");
        assert_eq!(scoped.value(), "evt_1");
    }

    #[test]
    fn equivalent_paths_are_one_scope() {
        let scope = |uri: &str| Scope::path().apply(key(), &parts(uri)).unwrap();
        assert_eq!(scope("/hooks/%67ithub"), scope("/hooks/github"));
        assert_eq!(scope("/a%2fb").namespace(), "stripe@/a%2Fb");
        assert_eq!(scope("/a%2Fb"), scope("/a%2fb"));
        assert_ne!(
            scope("/a%2Fb"),
            scope("/a/b"),
            "an escaped slash is not a slash"
        );
        assert_eq!(scope("/100%").namespace(), "stripe@/100%");
        assert_eq!(scope("/%4").namespace(), "stripe@/%4");
        assert_eq!(normalized(""), "/");
    }

    #[test]
    fn shared_scope_keeps_the_key() {
        let scoped = Scope::shared().apply(key(), &parts("/a")).unwrap();
        assert_eq!(scoped, key());
    }

    #[test]
    fn long_scopes_are_cut_with_a_hash_that_tells_them_apart() {
        let long = format!("/{}", "a".repeat(100));
        let a = Scope::path()
            .apply(key(), &parts(&format!("{long}/x")))
            .unwrap();
        let b = Scope::path()
            .apply(key(), &parts(&format!("{long}/y")))
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
        let scope = Scope::path();
        let first = scope.apply(key(), &parts("/a")).unwrap();
        let again = scope.apply(key(), &parts("/a")).unwrap();
        assert_eq!(first, again);
        assert_eq!(again.namespace(), "stripe@/a");
        // Another path, another namespace, then the first path again: each its own.
        let other = scope.apply(key(), &parts("/b")).unwrap();
        assert_eq!(other.namespace(), "stripe@/b");
        let github = IdempotencyKey::new("github", "evt_1").unwrap();
        assert_eq!(
            scope.apply(github, &parts("/b")).unwrap().namespace(),
            "github@/b"
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
            Scope::path().apply(at, &parts("/x")).is_err(),
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
