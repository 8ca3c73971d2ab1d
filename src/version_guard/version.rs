//! Versions: what makes one delivery about an entity newer than another.
//!
//! A version is an `i64` that the *sender* increases with every change of the entity: a
//! revision counter, or the time of the change, converted to microseconds since the Unix
//! epoch. Never the receiver's clock: a delivery that arrives late is still old. Only an older
//! version is outdated; an equal one runs, because a timestamp in whole seconds gives two
//! changes within one second the same version. Prefer the finest version the sender offers (a
//! revision counter, a sub-second timestamp): see [equal versions](super#equal-versions).
//!
//! - [`json`]: a JSON integer, or an RFC 3339 timestamp string, at a pointer in the body.
//! - [`header`]: an integer, or an RFC 3339 timestamp, in a header.
//! - [`from_fn`], [`from_body_fn`], or any closure `Fn(&Parts) -> Result<i64, KeyError>`.
//!
//! Keep one representation per entity namespace: a counter and a timestamp do not compare.
//!
//! ```
//! use tower_idempotency::version_guard::version::{self, ExtractVersion};
//!
//! let (parts, ()) = http::Request::new(()).into_parts();
//! let updated = version::json("/data/object/updated");
//! let body = br#"{"data": {"object": {"id": "sub_1", "updated": "2024-05-01T14:00:03.25Z"}}}"#;
//! assert_eq!(updated.extract(&parts, Some(body)).unwrap(), 1_714_572_003_250_000);
//! assert_eq!(version::parse_timestamp("1970-01-01T01:00:00+01:00").unwrap(), 0);
//! ```

use std::fmt;

use http::HeaderName;
use http::request::Parts;

use crate::key::json::Found;
use crate::key::{self, KeyError};
/// The extractors are the key module's own: one type per place a value is read from, a key or
/// a version as the extractor is asked.
pub use crate::key::{FromBodyFn, FromFn, Header, Json};
pub use crate::timestamp::{TimestampError, parse_timestamp};

/// Finds the version of a delivery: the sender's revision or change time of the entity.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&http::request::Parts) -> Result<i64, KeyError>`. Errors use [`KeyError`]'s variants:
/// [`KeyError::Missing`] (the layer answers 400, or lets the delivery through under
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough)), [`KeyError::Invalid`] and
/// [`KeyError::NotJson`] (400).
pub trait ExtractVersion: Send + Sync + 'static {
    /// Whether [`extract`](ExtractVersion::extract) needs the body of this request. Only then
    /// does the layer buffer it. The default is `false`.
    fn reads_body(&self, parts: &Parts) -> bool {
        let _ = parts;
        false
    }

    /// Finds the version. `body` holds the whole buffered body exactly when
    /// [`reads_body`](ExtractVersion::reads_body) answered `true` for these `parts`.
    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError>;
}

impl<F> ExtractVersion for F
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        self(parts)
    }
}

/// The version is the value at `pointer` (RFC 6901, e.g. `"/data/object/updated"`) in the JSON
/// body: an integer (a revision, or a Unix time such as Stripe's `created`), or a string holding
/// an RFC 3339 timestamp (converted to microseconds since the Unix epoch, see
/// [`parse_timestamp`]). The body is buffered through the layer's limit and passed on intact.
///
/// It is the key module's [`Json`] extractor, which reads a version as well as a key: the same
/// single pass over the body, which builds no tree. (Its namespace plays no part in a version.)
///
/// # Panics
///
/// If `pointer` is neither empty nor starts with `/`.
pub fn json(pointer: &str) -> Json {
    key::json(pointer)
}

impl ExtractVersion for Json {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError> {
        let pointer = self.pointer();
        let wrong = |kind: &str| {
            KeyError::invalid(format!(
                "{} is {kind}; expected an integer or an RFC 3339 timestamp",
                pointer.expected()
            ))
        };
        match pointer.seek(body.unwrap_or_default())? {
            Found::Absent => Err(KeyError::missing(pointer.expected())),
            Found::Integer(n) => {
                i64::try_from(n).map_err(|_| wrong("an integer too large for 64 bits"))
            }
            Found::Text(text) => parse_timestamp(&text)
                .map_err(|err| KeyError::invalid(format!("{}: {err}", pointer.expected()))),
            Found::Other(kind) => Err(wrong(kind)),
        }
    }
}

/// The version is the value of the header `name`: a decimal integer, or an RFC 3339 timestamp
/// (converted to microseconds since the Unix epoch, see [`parse_timestamp`]). The body is never
/// read.
///
/// It is the key module's [`Header`] extractor, which reads a version as well as a key. (Its
/// namespace plays no part in a version.)
///
/// # Panics
///
/// If `name` is not a valid header name.
pub fn header<N>(name: N) -> Header
where
    N: TryInto<HeaderName>,
    N::Error: fmt::Debug,
{
    key::header(name)
}

impl ExtractVersion for Header {
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        let text = self.text(parts)?;
        if let Some(version) = parse_integer(text) {
            return Ok(version);
        }
        parse_timestamp(text).map_err(|err| {
            KeyError::invalid(format!(
                "{}: neither an integer nor an RFC 3339 timestamp ({err})",
                self.expected()
            ))
        })
    }
}

/// `-?[0-9]+` as an `i64`; nothing else (no `+`, no spaces).
fn parse_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The version is whatever `f` makes of the request head.
///
/// ```
/// use tower_idempotency::{key::KeyError, version_guard::version};
///
/// // This sender puts a revision in the query string: `/hook?rev=7`.
/// let revision = version::from_fn(|parts: &http::request::Parts| {
///     parts.uri.query().unwrap_or_default()
///         .split('&')
///         .find_map(|pair| pair.strip_prefix("rev="))
///         .ok_or_else(|| KeyError::missing("query parameter `rev`"))?
///         .parse::<i64>()
///         .map_err(|e| KeyError::invalid(format!("query parameter `rev`: {e}")))
/// });
/// # let _ = revision;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    FromFn { f }
}

impl<F> ExtractVersion for FromFn<F>
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        (self.f)(parts)
    }
}

/// The version is whatever `f` makes of the request head and its whole body. The body is
/// buffered through the layer's limit and passed on intact.
pub fn from_body_fn<F>(f: F) -> FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    FromBodyFn { f }
}

impl<F> ExtractVersion for FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError> {
        (self.f)(parts, body.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::post("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn json_versions() {
        let p = parts(&[]);
        let ex = json("/data/updated");
        let get = |body: &str| ex.extract(&p, Some(body.as_bytes()));
        assert!(ex.reads_body(&p));
        assert_eq!(get(r#"{"data":{"updated":7}}"#), Ok(7));
        assert_eq!(get(r#"{"data":{"updated":-7}}"#), Ok(-7));
        assert_eq!(get(r#"{"data":{"updated":"1970-01-01T00:00:01Z"}}"#), Ok(S));
        assert!(matches!(
            get(r#"{"data":{}}"#),
            Err(KeyError::Missing { .. })
        ));
        assert!(matches!(get("not json"), Err(KeyError::NotJson { .. })));
        for body in [
            r#"{"data":{"updated":1.5}}"#,
            r#"{"data":{"updated":18446744073709551615}}"#,
            r#"{"data":{"updated":"7"}}"#,
            r#"{"data":{"updated":null}}"#,
            r#"{"data":{"updated":true}}"#,
            r#"{"data":{"updated":[]}}"#,
            r#"{"data":{"updated":{}}}"#,
        ] {
            assert!(matches!(get(body), Err(KeyError::Invalid { .. })), "{body}");
        }
    }

    #[test]
    fn header_versions() {
        let ex = header("x-version");
        assert!(!ex.reads_body(&parts(&[])));
        assert_eq!(ex.extract(&parts(&[("x-version", "42")]), None), Ok(42));
        assert_eq!(ex.extract(&parts(&[("x-version", "-3")]), None), Ok(-3));
        assert_eq!(
            ex.extract(&parts(&[("x-version", "1970-01-01T00:00:02Z")]), None),
            Ok(2 * S)
        );
        assert!(matches!(
            ex.extract(&parts(&[]), None),
            Err(KeyError::Missing { .. })
        ));
        for bad in ["+4", " 4", "4.0", "99999999999999999999", "yesterday", "-"] {
            assert!(
                matches!(
                    ex.extract(&parts(&[("x-version", bad)]), None),
                    Err(KeyError::Invalid { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn closures_are_extractors() {
        let ex = |p: &Parts| Ok(p.uri.path().len() as i64);
        assert_eq!(ExtractVersion::extract(&ex, &parts(&[]), None), Ok(1));
        let body = from_body_fn(|_, body| Ok(body.len() as i64));
        assert!(body.reads_body(&parts(&[])));
        assert_eq!(body.extract(&parts(&[]), Some(b"abc")), Ok(3));
    }
}
