//! The key in a request header: [`Header`], built by [`header`].

use std::borrow::Cow;
use std::fmt;

use http::HeaderName;
use http::request::Parts;

use super::{DEFAULT_NAMESPACE, ExtractKey, IdempotencyKey, KeyError, Name, valid_namespace};

/// The key in a request header. Built by [`header`].
///
/// The version guard reads versions with it too, built by
/// [`version::header`](crate::version_guard::version::header).
#[derive(Debug, Clone)]
pub struct Header {
    pub(super) name: HeaderName,
    namespace: Name,
}

/// The key is the value of the header `name`, in the [`DEFAULT_NAMESPACE`] unless
/// [`namespace`](ExtractKey::namespace) says otherwise. The body is never read.
///
/// # Panics
///
/// If `name` is not a valid header name.
pub fn header<N>(name: N) -> Header
where
    N: TryInto<HeaderName>,
    N::Error: fmt::Debug,
{
    let name = name
        .try_into()
        .unwrap_or_else(|err| panic!("invalid header name: {err:?}"));
    Header {
        name,
        namespace: Name::Static(DEFAULT_NAMESPACE),
    }
}

impl Header {
    pub(super) fn preset(name: &'static str, namespace: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
            namespace: Name::Static(namespace),
        }
    }

    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }

    /// Where the value was expected, for messages: ``header `x-github-delivery` ``.
    pub(crate) fn expected(&self) -> String {
        format!("header `{}`", self.name)
    }
}

impl Header {
    /// The header's value, which must be visible ASCII text: what a key or a version is read
    /// from.
    pub(crate) fn text<'p>(&self, parts: &'p Parts) -> Result<&'p str, KeyError> {
        let value = parts
            .headers
            .get(&self.name)
            .ok_or_else(|| KeyError::missing(self.expected()))?;
        value.to_str().map_err(|_| {
            KeyError::invalid(format!("{} is not visible ASCII text", self.expected()))
        })
    }
}

impl ExtractKey for Header {
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        IdempotencyKey::in_namespace(&self.namespace, self.text(parts)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::tests::{key, parts};

    #[test]
    fn header_extractor() {
        let ex = header("X-Event-Id").namespace("acme");
        let got = ex.extract(&parts(&[("x-event-id", "e1")]), None).unwrap();
        assert_eq!(got, key("acme", "e1"));
        assert!(!ex.reads_body(&parts(&[])));
        let missing = ex.extract(&parts(&[]), None).unwrap_err();
        assert_eq!(missing, KeyError::missing("header `x-event-id`"));
        assert_eq!(
            header("x-event-id")
                .extract(&parts(&[("x-event-id", "e1")]), None)
                .unwrap(),
            key(DEFAULT_NAMESPACE, "e1")
        );
    }

    #[test]
    fn non_ascii_header_is_invalid_not_missing() {
        let mut p = parts(&[]);
        p.headers.insert(
            "x-event-id",
            http::HeaderValue::from_bytes(b"\xffabc").unwrap(),
        );
        let err = header("x-event-id").extract(&p, None).unwrap_err();
        assert!(matches!(err, KeyError::Invalid { .. }), "{err:?}");
    }
}
