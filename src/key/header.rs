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
    /// Whether the value is read as an RFC 8941 String (bare text taken too).
    structured: bool,
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
        structured: false,
    }
}

impl Header {
    pub(crate) fn preset(name: &'static str, namespace: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
            namespace: Name::Static(namespace),
            structured: false,
        }
    }

    /// Reads the value as an RFC 8941 String item, as the `Idempotency-Key` draft defines
    /// its header: `"abc"` is the key `abc`, with `\"` and `\\` unescaped. Bare text (`abc`)
    /// is taken as it is, so the two spellings are the same key. A quoted value that is not
    /// a valid String, or one followed by parameters (`"abc";a=1`), is answered 400.
    /// [`key::idempotency_key`](super::idempotency_key) reads its header this way.
    pub fn structured(mut self) -> Self {
        self.structured = true;
        self
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
        let text = self.text(parts)?;
        if !self.structured {
            return IdempotencyKey::in_namespace(&self.namespace, text);
        }
        let value = sf_string(text).map_err(|why| {
            KeyError::invalid(format!(
                "{} is not an RFC 8941 String: {why}",
                self.expected()
            ))
        })?;
        IdempotencyKey::in_namespace(&self.namespace, &value)
    }
}

/// An RFC 8941 String item (`"…"`, with `\"` and `\\` escapes; the spaces around it are
/// not part of it), or bare text as it is.
fn sf_string(text: &str) -> Result<Cow<'_, str>, &'static str> {
    let Some(quoted) = text.trim_matches(' ').strip_prefix('"') else {
        return Ok(Cow::Borrowed(text));
    };
    let mut value = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    loop {
        match chars.next() {
            None => return Err("the closing quote is missing"),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some(c @ ('"' | '\\')) => value.push(c),
                _ => return Err("only \\\" and \\\\ may be escaped"),
            },
            Some(c @ ' '..='~') => value.push(c),
            Some(_) => return Err("it holds a character other than visible ASCII or space"),
        }
    }
    if !chars.as_str().is_empty() {
        return Err("parameters or text after the closing quote are not accepted");
    }
    Ok(Cow::Owned(value))
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
    fn a_structured_header_takes_quoted_and_bare_keys_alike() {
        let ex = header("idempotency-key").structured();
        let key_of = |value: &str| ex.extract(&parts(&[("idempotency-key", value)]), None);
        let bare = key_of("abc-1").unwrap();
        assert_eq!(key_of("\"abc-1\"").unwrap(), bare);
        assert_eq!(key_of(" \"abc-1\" ").unwrap(), bare);
        assert_eq!(key_of(r#""a\"b\\c""#).unwrap().value(), r#"a"b\c"#);
        for bad in [r#""abc"#, r#""a\bc""#, r#""abc";a=1"#, r#""abc" x"#] {
            let err = key_of(bad).unwrap_err();
            assert!(matches!(err, KeyError::Invalid { .. }), "{bad}: {err:?}");
        }
        assert!(key_of("\"\"").is_err(), "an empty key");
        // Without `structured`, the quotes are part of the key.
        let plain = header("idempotency-key");
        let quoted = plain.extract(&parts(&[("idempotency-key", "\"abc\"")]), None);
        assert_eq!(quoted.unwrap().value(), "\"abc\"");
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
