//! Idempotency keys and the extractors that find them in a delivery.
//!
//! A key is the id the *sender* gave an event, paired with a namespace naming the sender:
//! [`IdempotencyKey`]. An extractor ([`ExtractKey`]) pulls it out of a request. Header
//! extractors never touch the body; JSON extractors ask the layer to buffer the body (through
//! its size limit) and hand it back to the inner service intact.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Deliveries carry their id in `X-Event-Id`; the namespace keeps them apart from other senders.
//! let mut svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::header("x-event-id").namespace("acme")))
//!     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
//!
//! let delivery = || Request::post("/").header("x-event-id", "evt_1").body(String::new()).unwrap();
//! let first = svc.ready().await.unwrap().call(delivery()).await.unwrap();
//! let again = svc.ready().await.unwrap().call(delivery()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::OK);
//! assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
//!
//! // No key at all: a 400 naming the key that was expected.
//! let anonymous = Request::post("/").body(String::new()).unwrap();
//! let rejected = svc.ready().await.unwrap().call(anonymous).await.unwrap();
//! assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
//! # }
//! ```
//!
//! # Never a hash of the body
//!
//! Two genuinely different events (the same customer, the same amount, a second apart) can be
//! byte for byte identical; deduplicating on a hash of the body would drop the second one. When
//! a sender gives no id, build a synthetic key from business fields that really are unique
//! ([`json_fields`]) and say why in a comment.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

mod auto;
mod extract;
mod header;
pub(crate) mod json;
mod scope;
pub(crate) mod senders;

#[cfg(any(test, feature = "verify"))]
pub(crate) use auto::detect;
pub use auto::{Auto, auto, idempotency_key};
pub use extract::{ExtractKey, FromBodyFn, FromFn, Namespaced, Or, from_body_fn, from_fn};
pub use header::{Header, header};
pub use json::{Json, JsonFields, json, json_fields};
pub use scope::Scope;
// Each sender's key preset, `key::github()` and the others, from its own file.
pub use senders::keys::*;

/// The longest key value accepted, in bytes. Every store's column is sized for it.
pub const MAX_KEY_LEN: usize = 255;

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// The namespace of keys whose extractor was given none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Who sent an event, and the id the sender gave it.
///
/// Both parts are non-empty visible text: no control characters, and no invisible format
/// characters (zero-width spaces and joiners, bidirectional marks and overrides, the byte
/// order mark, soft hyphens: Unicode's category `Cf`), which could make one key look like
/// another on the admin page and in logs. The value is at most
/// [`MAX_KEY_LEN`] bytes, the namespace at most [`MAX_NAMESPACE_LEN`].
///
/// Cloning is cheap: both parts are shared, not copied.
#[derive(Clone)]
pub struct IdempotencyKey {
    namespace: Name,
    value: Arc<str>,
}

/// A namespace: a constant, or text shared by every key (and extractor) that carries it.
#[derive(Clone)]
pub(crate) enum Name {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Name {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Static(name) => name,
            Self::Shared(name) => name,
        }
    }
}

impl From<Cow<'static, str>> for Name {
    fn from(name: Cow<'static, str>) -> Self {
        match name {
            Cow::Borrowed(name) => Self::Static(name),
            Cow::Owned(name) => Self::Shared(name.into()),
        }
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl IdempotencyKey {
    /// Builds a key, checking both parts.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("github", "72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
    /// assert_eq!(key.namespace(), "github");
    /// assert!(IdempotencyKey::new("github", "").is_err());
    /// assert!(IdempotencyKey::new("github", "evt\n1").is_err());
    /// ```
    pub fn new(
        namespace: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Result<Self, KeyError> {
        let namespace = namespace.into();
        let value = value.into();
        check_text("namespace", &namespace, MAX_NAMESPACE_LEN)?;
        check_text("key", &value, MAX_KEY_LEN)?;
        Ok(Self {
            namespace: namespace.into(),
            value: value.into(),
        })
    }

    /// A key in a namespace an extractor checked once, when it was built: only `value` is
    /// checked.
    pub(crate) fn in_namespace(namespace: &Name, value: &str) -> Result<Self, KeyError> {
        check_text("key", value, MAX_KEY_LEN)?;
        Ok(Self {
            namespace: namespace.clone(),
            value: value.into(),
        })
    }

    /// The sender's namespace, such as `stripe`.
    pub fn namespace(&self) -> &str {
        self.namespace.as_str()
    }

    /// The sender's id for the event.
    pub fn value(&self) -> &str {
        &self.value
    }
}

// By text, as the parts read: a constant namespace and a shared one of the same text are one
// namespace.
impl PartialEq for IdempotencyKey {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value && self.namespace() == other.namespace()
    }
}

impl Eq for IdempotencyKey {}

impl Hash for IdempotencyKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.namespace().hash(state);
        self.value().hash(state);
    }
}

impl PartialOrd for IdempotencyKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IdempotencyKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.namespace(), self.value()).cmp(&(other.namespace(), other.value()))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.value)
    }
}

fn check_text(what: &'static str, text: &str, max: usize) -> Result<(), KeyError> {
    // The usual case, printable ASCII not starting or ending with a space, in one pass: it
    // has no control character, and `trim` (whose only printable ASCII whitespace is the
    // space) leaves it as it is, not empty. Anything else takes the checks below.
    let bytes = text.as_bytes();
    if text.len() <= max
        && bytes.first().is_some_and(|&b| b != b' ')
        && bytes.last().is_some_and(|&b| b != b' ')
        && bytes.iter().all(|b| matches!(b, b' '..=b'~'))
    {
        return Ok(());
    }
    if text.trim().is_empty() {
        return Err(KeyError::invalid(format!("the {what} is empty")));
    }
    if text.len() > max {
        return Err(KeyError::invalid(format!(
            "the {what} is {} bytes long; at most {max} are allowed",
            text.len()
        )));
    }
    if text.trim() != text {
        // Some databases compare text ignoring trailing spaces: `evt_1 ` would meet `evt_1`.
        return Err(KeyError::invalid(format!(
            "the {what} has leading or trailing whitespace"
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(KeyError::invalid(format!(
            "the {what} contains control characters"
        )));
    }
    if let Some((at, c, kind)) = text
        .chars()
        .enumerate()
        .find_map(|(at, c)| format_character(c).map(|kind| (at, c, kind)))
    {
        // The character itself is not repeated: the message is shown where it would hide.
        return Err(KeyError::invalid(format!(
            "the {what} contains U+{:04X} ({kind}) at character {}: an invisible format \
             character, which could make it look like another {what}",
            u32::from(c),
            at + 1
        )));
    }
    Ok(())
}

/// Unicode's format characters (general category `Cf`, as of Unicode 15.1), in order: each
/// range with what it is. They are invisible, or change how the text around them is shown
/// (`evt_\u{202E}1fed` reads `evt_def1`), so a key holding one could pass for another on the
/// admin page and in logs. Keys, namespaces and scopes refuse them.
const FORMAT_CHARACTERS: &[(char, char, &str)] = &[
    ('\u{00AD}', '\u{00AD}', "soft hyphen"),
    ('\u{0600}', '\u{0605}', "Arabic number sign"),
    ('\u{061C}', '\u{061C}', "Arabic letter mark, bidirectional"),
    ('\u{06DD}', '\u{06DD}', "Arabic end of ayah"),
    ('\u{070F}', '\u{070F}', "Syriac abbreviation mark"),
    ('\u{0890}', '\u{0891}', "Arabic currency mark above"),
    ('\u{08E2}', '\u{08E2}', "Arabic disputed end of ayah"),
    ('\u{180E}', '\u{180E}', "Mongolian vowel separator"),
    (
        '\u{200B}',
        '\u{200D}',
        "zero-width space, non-joiner or joiner",
    ),
    (
        '\u{200E}',
        '\u{200F}',
        "left-to-right or right-to-left mark",
    ),
    (
        '\u{202A}',
        '\u{202E}',
        "bidirectional embedding or override",
    ),
    ('\u{2060}', '\u{2064}', "word joiner or invisible operator"),
    ('\u{2066}', '\u{2069}', "bidirectional isolate"),
    ('\u{206A}', '\u{206F}', "deprecated shaping control"),
    (
        '\u{FEFF}',
        '\u{FEFF}',
        "zero-width no-break space, or byte order mark",
    ),
    ('\u{FFF9}', '\u{FFFB}', "interlinear annotation control"),
    ('\u{110BD}', '\u{110BD}', "Kaithi number sign"),
    ('\u{110CD}', '\u{110CD}', "Kaithi number sign above"),
    (
        '\u{13430}',
        '\u{1343F}',
        "Egyptian hieroglyph format control",
    ),
    ('\u{1BCA0}', '\u{1BCA3}', "shorthand format control"),
    ('\u{1D173}', '\u{1D17A}', "musical symbol format control"),
    ('\u{E0001}', '\u{E0001}', "language tag"),
    ('\u{E0020}', '\u{E007F}', "tag character"),
];

/// What `c` is, if it is one of the [`FORMAT_CHARACTERS`].
fn format_character(c: char) -> Option<&'static str> {
    for &(first, last, kind) in FORMAT_CHARACTERS {
        if c < first {
            return None;
        }
        if c <= last {
            return Some(kind);
        }
    }
    None
}

fn valid_namespace(namespace: Cow<'static, str>) -> Name {
    if let Err(err) = check_text("namespace", &namespace, MAX_NAMESPACE_LEN) {
        panic!("invalid idempotency key namespace {namespace:?}: {err}");
    }
    // The first `@` of a stored namespace ends the extractor's part and begins the scope:
    // `a@b` scoped `c` would meet `a` scoped `b@c`.
    assert!(
        !namespace.contains('@'),
        "invalid idempotency key namespace {namespace:?}: `@` separates a namespace from its scope"
    );
    namespace.into()
}

/// Why no usable key came out of a delivery. Each maps to a 4xx answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The delivery does not carry the key the extractor looks for.
    #[error("no idempotency key found: expected {expected}")]
    Missing {
        /// Where the key was expected, e.g. ``header `x-github-delivery` ``.
        expected: Cow<'static, str>,
    },
    /// A key was found but is empty, too long, or not visible text.
    #[error("invalid idempotency key: {reason}")]
    Invalid {
        /// What is wrong with it.
        reason: Cow<'static, str>,
    },
    /// The body the key is read from is not valid JSON.
    #[error("the request body is not valid JSON: {detail}")]
    NotJson {
        /// The parser's message.
        detail: String,
    },
    /// The body is larger than the layer's limit.
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body did not arrive completely within the layer's time limit.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    /// The body could not be read (the client went away, or sent a malformed stream).
    #[error("the request body could not be read: {detail}")]
    BodyUnreadable {
        /// What went wrong.
        detail: String,
    },
}

impl KeyError {
    /// A [`KeyError::Missing`] naming where the key was expected.
    pub fn missing(expected: impl Into<Cow<'static, str>>) -> Self {
        Self::Missing {
            expected: expected.into(),
        }
    }

    /// A [`KeyError::Invalid`] with the reason.
    pub fn invalid(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::Invalid {
            reason: reason.into(),
        }
    }

    /// The status the layer answers this error with: 413 for an oversized body, 408 for a body
    /// that never finished, 400 otherwise.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::BodyTooLarge { .. } => http::StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => http::StatusCode::REQUEST_TIMEOUT,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }
}

#[cfg(test)]
mod tests;
