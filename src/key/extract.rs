//! The extractor trait, its blanket impl for closures, and the extractors built from other
//! extractors ([`Namespaced`], [`Or`]) or from closures ([`FromFn`], [`FromBodyFn`]).

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

use super::{Auto, Header, IdempotencyKey, Json, JsonFields, KeyError, Name, valid_namespace};

/// Finds the idempotency key of a delivery.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&http::request::Parts) -> Result<IdempotencyKey, KeyError>`; such closures only see the
/// head of the request. To read the body, use [`from_body_fn`] or implement the trait with
/// [`reads_body`](ExtractKey::reads_body) answering `true`.
pub trait ExtractKey: Send + Sync + 'static {
    /// Whether [`extract`](ExtractKey::extract) needs the body of this request. Only then does
    /// the layer buffer it. The default is `false`.
    fn reads_body(&self, parts: &Parts) -> bool {
        let _ = parts;
        false
    }

    /// Finds the key. `body` holds the whole buffered body exactly when
    /// [`reads_body`](ExtractKey::reads_body) answered `true` for these `parts`.
    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError>;

    /// Puts every key this extractor finds into `namespace`.
    ///
    /// # Panics
    ///
    /// If `namespace` is not a valid namespace (empty, longer than
    /// [`MAX_NAMESPACE_LEN`](super::MAX_NAMESPACE_LEN), holding control characters,
    /// invisible format characters (see [`IdempotencyKey`]) or `@`, which separates it from
    /// its [`Scope`](super::Scope)): a configuration mistake, caught when the layer is built.
    fn namespace(self, namespace: impl Into<Cow<'static, str>>) -> Namespaced<Self>
    where
        Self: Sized,
    {
        Namespaced {
            inner: self,
            namespace: valid_namespace(namespace.into()),
        }
    }

    /// Uses `other` when this extractor finds no key. An invalid key is not retried: it is
    /// reported as it is.
    fn or<O: ExtractKey>(self, other: O) -> Or<Self, O>
    where
        Self: Sized,
    {
        Or {
            first: self,
            second: other,
        }
    }
}

impl<F> ExtractKey for F
where
    F: Fn(&Parts) -> Result<IdempotencyKey, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        self(parts)
    }
}

/// Re-labels the keys of another extractor. Built by [`ExtractKey::namespace`].
#[derive(Debug, Clone)]
pub struct Namespaced<E> {
    inner: E,
    namespace: Name,
}

impl<E: ExtractKey> ExtractKey for Namespaced<E> {
    fn reads_body(&self, parts: &Parts) -> bool {
        self.inner.reads_body(parts)
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let key = self.inner.extract(parts, body)?;
        Ok(IdempotencyKey {
            namespace: self.namespace.clone(),
            value: key.value,
        })
    }
}

/// Tries one extractor, then another. Built by [`ExtractKey::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A: ExtractKey, B: ExtractKey> ExtractKey for Or<A, B> {
    fn reads_body(&self, parts: &Parts) -> bool {
        if self.first.reads_body(parts) {
            return true;
        }
        // The body is buffered only when the head-only first extractor finds nothing: a
        // delivery keyed by its header must not be refused for the size of its body.
        matches!(
            self.first.extract(parts, None),
            Err(KeyError::Missing { .. })
        ) && self.second.reads_body(parts)
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let first_body = if self.first.reads_body(parts) {
            body
        } else {
            None
        };
        match self.first.extract(parts, first_body) {
            Err(KeyError::Missing { expected: first }) => {
                let second_body = if self.second.reads_body(parts) {
                    body
                } else {
                    None
                };
                match self.second.extract(parts, second_body) {
                    Err(KeyError::Missing { expected: second }) => {
                        Err(KeyError::missing(format!("{first} or {second}")))
                    }
                    other => other,
                }
            }
            other => other,
        }
    }
}

/// Inherent `or`, so that chaining needs no trait import.
macro_rules! inherent_or {
    ($($ty:ty),*) => {$(
        impl $ty {
            /// Uses `other` when this extractor finds no key; see [`ExtractKey::or`].
            pub fn or<O: ExtractKey>(self, other: O) -> Or<Self, O> {
                ExtractKey::or(self, other)
            }
        }
    )*};
}

inherent_or!(Header, Json, JsonFields, Auto);

/// A key (or, built by [`version::from_fn`](crate::version_guard::version::from_fn), a
/// version) computed from the head of the request by a closure. Built by [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F> {
    pub(crate) f: F,
}

/// The key is whatever `f` makes of the request head (method, URI, headers, extensions).
///
/// ```
/// use tower_idempotency::{IdempotencyKey, key::{self, KeyError}};
///
/// // This sender puts the event id in the query string: `/hook?event=123`.
/// let extractor = key::from_fn(|parts: &http::request::Parts| {
///     let query = parts.uri.query().unwrap_or_default();
///     let id = query
///         .split('&')
///         .find_map(|pair| pair.strip_prefix("event="))
///         .ok_or_else(|| KeyError::missing("query parameter `event`"))?;
///     IdempotencyKey::new("queue", id)
/// });
/// # let _ = extractor;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Result<IdempotencyKey, KeyError> + Send + Sync + 'static,
{
    FromFn { f }
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

impl<F> ExtractKey for FromFn<F>
where
    F: Fn(&Parts) -> Result<IdempotencyKey, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        (self.f)(parts)
    }
}

/// A key (or, built by [`version::from_body_fn`](crate::version_guard::version::from_body_fn),
/// a version) computed by a closure from the head and the buffered body. Built by
/// [`from_body_fn`].
#[derive(Clone)]
pub struct FromBodyFn<F> {
    pub(crate) f: F,
}

/// The key is whatever `f` makes of the request head and its whole body. The body is buffered
/// through the layer's limit and passed on intact.
pub fn from_body_fn<F>(f: F) -> FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<IdempotencyKey, KeyError> + Send + Sync + 'static,
{
    FromBodyFn { f }
}

impl<F> fmt::Debug for FromBodyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromBodyFn").finish_non_exhaustive()
    }
}

impl<F> ExtractKey for FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<IdempotencyKey, KeyError> + Send + Sync + 'static,
{
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        (self.f)(parts, body.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::tests::{key, parts};
    use crate::key::{header, json};

    #[test]
    fn or_falls_back_only_when_missing() {
        let ex = header("a")
            .namespace("first")
            .or(header("b").namespace("second"));
        assert_eq!(
            ex.extract(&parts(&[("b", "2")]), None).unwrap(),
            key("second", "2")
        );
        assert_eq!(
            ex.extract(&parts(&[("a", "1"), ("b", "2")]), None).unwrap(),
            key("first", "1")
        );
        let err = ex.extract(&parts(&[]), None).unwrap_err();
        assert_eq!(err, KeyError::missing("header `a` or header `b`"));
        let invalid = ex
            .extract(&parts(&[("a", " "), ("b", "2")]), None)
            .unwrap_err();
        assert!(matches!(invalid, KeyError::Invalid { .. }));
    }

    #[test]
    fn or_buffers_the_body_only_when_the_header_is_missing() {
        let ex = header("x-id").or(json("/id"));
        assert!(!ex.reads_body(&parts(&[("x-id", "h")])));
        assert!(ex.reads_body(&parts(&[])));
    }

    #[test]
    fn or_hands_the_body_only_to_body_readers() {
        let ex = header("x-id").or(json("/id").namespace("body"));
        let p = parts(&[]);
        assert!(ex.reads_body(&p));
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":"j"}"#)).unwrap(),
            key("body", "j")
        );
    }

    #[test]
    fn closures_are_extractors() {
        let ex = |p: &Parts| IdempotencyKey::new("path", p.uri.path().to_owned());
        assert_eq!(ex.extract(&parts(&[]), None).unwrap(), key("path", "/"));
        let renamed = ex.namespace("other");
        assert_eq!(
            renamed.extract(&parts(&[]), None).unwrap(),
            key("other", "/")
        );
    }
}
