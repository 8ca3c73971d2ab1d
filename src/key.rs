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
use std::fmt;

use http::HeaderName;
use http::request::Parts;

mod scope;
pub use scope::Scope;

/// The longest key value accepted, in bytes. Every store's column is sized for it.
pub const MAX_KEY_LEN: usize = 255;

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// The namespace of keys whose extractor was given none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Who sent an event, and the id the sender gave it.
///
/// Both parts are non-empty visible text (no control characters); the value is at most
/// [`MAX_KEY_LEN`] bytes, the namespace at most [`MAX_NAMESPACE_LEN`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey {
    namespace: Cow<'static, str>,
    value: String,
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
        Ok(Self { namespace, value })
    }

    /// The sender's namespace, such as `stripe`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The sender's id for the event.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.value)
    }
}

fn check_text(what: &'static str, text: &str, max: usize) -> Result<(), KeyError> {
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
    Ok(())
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
    /// If `namespace` is not a valid namespace (empty, longer than [`MAX_NAMESPACE_LEN`],
    /// holding control characters or `@`, which separates it from its [`Scope`]): a
    /// configuration mistake, caught when the layer is built.
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

fn valid_namespace(namespace: Cow<'static, str>) -> Cow<'static, str> {
    if let Err(err) = check_text("namespace", &namespace, MAX_NAMESPACE_LEN) {
        panic!("invalid idempotency key namespace {namespace:?}: {err}");
    }
    // The first `@` of a stored namespace ends the extractor's part and begins the scope:
    // `a@b` scoped `c` would meet `a` scoped `b@c`.
    assert!(
        !namespace.contains('@'),
        "invalid idempotency key namespace {namespace:?}: `@` separates a namespace from its scope"
    );
    namespace
}

/// Re-labels the keys of another extractor. Built by [`ExtractKey::namespace`].
#[derive(Debug, Clone)]
pub struct Namespaced<E> {
    inner: E,
    namespace: Cow<'static, str>,
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

/// The key in a request header. Built by [`header`].
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    namespace: Cow<'static, str>,
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
        .unwrap_or_else(|err| panic!("invalid header name for an idempotency key: {err:?}"));
    Header {
        name,
        namespace: Cow::Borrowed(DEFAULT_NAMESPACE),
    }
}

impl Header {
    fn preset(name: &'static str, namespace: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
            namespace: Cow::Borrowed(namespace),
        }
    }

    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }

    fn expected(&self) -> String {
        format!("header `{}`", self.name)
    }
}

impl ExtractKey for Header {
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let value = parts
            .headers
            .get(&self.name)
            .ok_or_else(|| KeyError::missing(self.expected()))?;
        let value = value.to_str().map_err(|_| {
            KeyError::invalid(format!("{} is not visible ASCII text", self.expected()))
        })?;
        IdempotencyKey::new(self.namespace.clone(), value)
    }
}

/// The key in a field of a JSON body, found by an RFC 6901 pointer. Built by [`json`].
#[derive(Debug, Clone)]
pub struct Json {
    pointer: Pointer,
    namespace: Cow<'static, str>,
}

/// The key is the JSON string or integer at `pointer` (RFC 6901, e.g. `"/id"` or
/// `"/event/id"`) in the request body. An integer becomes its decimal text. The body is
/// buffered through the layer's limit and passed on intact.
///
/// # Panics
///
/// If `pointer` is neither empty nor starts with `/`.
pub fn json(pointer: &str) -> Json {
    Json {
        pointer: Pointer::parse(pointer),
        namespace: Cow::Borrowed(DEFAULT_NAMESPACE),
    }
}

impl Json {
    fn preset(pointer: &str, namespace: &'static str) -> Self {
        Self {
            pointer: Pointer::parse(pointer),
            namespace: Cow::Borrowed(namespace),
        }
    }

    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }
}

impl ExtractKey for Json {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let body = body.unwrap_or_default();
        let value = json_seek::find(body, &self.pointer)?;
        IdempotencyKey::new(self.namespace.clone(), value)
    }
}

/// A synthetic key made of several JSON fields. Built by [`json_fields`].
#[derive(Debug, Clone)]
pub struct JsonFields {
    pointers: Vec<Pointer>,
    namespace: Cow<'static, str>,
}

/// A synthetic key for senders that give no event id: the JSON strings or integers at each of
/// `pointers`, written as a JSON array (so `["a:b", "c"]` and `["a", "b:c"]` stay distinct).
///
/// Choose fields that really are unique per event (an order number, not an amount), and say
/// why in a comment where you build the layer.
///
/// ```
/// use tower_idempotency::key::{self, ExtractKey};
///
/// // The legacy sender has no event id, but an order number is unique per customer.
/// let extractor = key::json_fields(["/customer", "/order_number"]).namespace("legacy");
/// let (parts, ()) = http::Request::new(()).into_parts();
/// let body = br#"{"customer": "cus_9", "order_number": 1001, "amount": 500}"#;
/// let key = extractor.extract(&parts, Some(body)).unwrap();
/// assert_eq!(key.value(), r#"["cus_9","1001"]"#);
/// ```
///
/// # Panics
///
/// If a pointer is neither empty nor starts with `/`, or `pointers` is empty.
pub fn json_fields<I, P>(pointers: I) -> JsonFields
where
    I: IntoIterator<Item = P>,
    P: AsRef<str>,
{
    let pointers: Vec<Pointer> = pointers
        .into_iter()
        .map(|p| Pointer::parse(p.as_ref()))
        .collect();
    assert!(
        !pointers.is_empty(),
        "json_fields needs at least one pointer"
    );
    JsonFields {
        pointers,
        namespace: Cow::Borrowed(DEFAULT_NAMESPACE),
    }
}

impl JsonFields {
    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }
}

impl ExtractKey for JsonFields {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let body = body.unwrap_or_default();
        let document: serde_json::Value =
            serde_json::from_slice(body).map_err(|err| KeyError::NotJson {
                detail: err.to_string(),
            })?;
        let parts = self
            .pointers
            .iter()
            .map(|pointer| {
                let field = document
                    .pointer(&pointer.source)
                    .ok_or_else(|| KeyError::missing(pointer.expected()))?;
                let text = json_seek::key_text(field, pointer)?;
                // Each part is checked like a key of its own: an empty order number must not
                // merge every such event into one.
                check_text("key", &text, MAX_KEY_LEN)
                    .map_err(|err| KeyError::invalid(format!("{}: {err}", pointer.expected())))?;
                Ok(text)
            })
            .collect::<Result<Vec<String>, KeyError>>()?;
        // Serialising a list of strings cannot fail.
        let value = serde_json::to_string(&parts).unwrap_or_default();
        IdempotencyKey::new(self.namespace.clone(), value)
    }
}

/// A key computed from the head of the request by a closure. Built by [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F> {
    f: F,
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

/// A key computed by a closure from the head and the buffered body. Built by [`from_body_fn`].
#[derive(Clone)]
pub struct FromBodyFn<F> {
    f: F,
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

// Provider presets. Each names the id the sender keeps the same across its retries.

/// Stripe: the event id (`evt_…`) in the body field `/id`, namespace `stripe`.
///
/// Stripe: "Webhook endpoints might occasionally receive the same event more than once. You
/// can guard against duplicated event receipts by logging the event IDs you've processed"
/// (docs.stripe.com/webhooks, "Handle duplicate events").
pub fn stripe() -> Json {
    Json::preset("/id", "stripe")
}

/// GitHub: the `X-GitHub-Delivery` header (a GUID, kept on redelivery), namespace `github`.
///
/// GitHub does not retry on its own; a redelivery asked for by hand "will be the same as in
/// the original delivery" (docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks).
pub fn github() -> Header {
    Header::preset("x-github-delivery", "github")
}

/// Shopify: the `X-Shopify-Webhook-Id` header, namespace `shopify`.
///
/// Source: shopify.dev/docs/apps/build/webhooks/delivery-structure, which names this header
/// for detecting duplicates. Shopify's older "ignore duplicates" page names
/// `X-Shopify-Event-Id` instead, which is shared by every subscription fired by one merchant
/// action; use `key::header("x-shopify-event-id").namespace("shopify")` to dedupe per action.
pub fn shopify() -> Header {
    Header::preset("x-shopify-webhook-id", "shopify")
}

/// Standard Webhooks senders: the `webhook-id` header, or `svix-id` from senders using the
/// Svix-branded headers; namespace `standard-webhooks`.
///
/// Source: the Standard Webhooks specification (github.com/standard-webhooks,
/// `spec/standard-webhooks.md`: "webhook-id: the unique webhook identifier. This is the same
/// on retries"), and docs.svix.com/receiving/verifying-payloads/how-manual.
pub fn standard_webhooks() -> Or<Header, Header> {
    Header::preset("webhook-id", "standard-webhooks")
        .or(Header::preset("svix-id", "standard-webhooks"))
}

/// Twilio: the `I-Twilio-Idempotency-Token` header, namespace `twilio`.
///
/// Twilio retries a webhook for seconds, not days (twilio.com/docs/usage/webhooks/webhooks-connection-overrides);
/// the IETF Idempotency-Key draft lists this header as Twilio's idempotency token for them.
pub fn twilio() -> Header {
    Header::preset("i-twilio-idempotency-token", "twilio")
}

/// Twitch EventSub: the `Twitch-Eventsub-Message-Id` header, namespace `twitch`.
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("if you receive a message
/// with the same ID, … you've already processed it").
pub fn twitch() -> Header {
    Header::preset("twitch-eventsub-message-id", "twitch")
}

/// Slack Events API: the body field `/event_id`, namespace `slack`.
///
/// The one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
///
/// Slack retries a failed event three times within minutes, marking each retry with
/// `X-Slack-Retry-Num`; the outer wrapper's `event_id` names the event (api.slack.com/apis/events-api).
pub fn slack() -> Json {
    Json::preset("/event_id", "slack")
}

/// A client-chosen `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header),
/// namespace `idempotency-key`.
pub fn idempotency_key() -> Header {
    Header::preset("idempotency-key", "idempotency-key")
}

/// Recognises the sender by its headers and uses its key, with the sender as namespace.
/// The default extractor of [`IdempotencyLayer::new`](crate::IdempotencyLayer::new). Built by
/// [`auto`].
#[derive(Debug, Clone)]
pub struct Auto {
    headers: [Header; 7],
    stripe: Json,
    slack: Json,
}

/// Recognises, in this order: GitHub (`X-GitHub-Delivery`), Shopify (`X-Shopify-Webhook-Id`),
/// Standard Webhooks (`webhook-id`, `svix-id`), Twilio (`I-Twilio-Idempotency-Token`), Twitch
/// (`Twitch-Eventsub-Message-Id`), Stripe (a `Stripe-Signature` header: the key is the body's
/// `/id`), Slack (an `X-Slack-Signature` header: the JSON body's `/event_id`; a slash command's
/// form body has none), then a sender by its signature header alone (its key is then
/// missing), and last a plain `Idempotency-Key` header. The body is read only for Stripe and
/// Slack. A request that carries a sender's id or signature header never falls back to
/// `Idempotency-Key`.
///
/// Slack's one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
pub fn auto() -> Auto {
    Auto {
        headers: [
            github(),
            shopify(),
            Header::preset("webhook-id", "standard-webhooks"),
            Header::preset("svix-id", "standard-webhooks"),
            twilio(),
            twitch(),
            idempotency_key(),
        ],
        stripe: stripe(),
        slack: slack(),
    }
}

/// A webhook sender, as [`auto`] recognises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    GitHub,
    Shopify,
    StandardWebhooks,
    Twilio,
    Twitch,
    Stripe,
    Slack,
}

impl Sender {
    /// The sender's name, as in messages.
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::GitHub => "GitHub",
            Self::Shopify => "Shopify",
            Self::StandardWebhooks => "Standard Webhooks",
            Self::Twilio => "Twilio",
            Self::Twitch => "Twitch",
            Self::Stripe => "Stripe",
            Self::Slack => "Slack",
        }
    }
}

/// The sender whose key [`auto`] uses for this request, if any. Signature verification asks
/// the same question, so that the key claimed always belongs to the sender verified.
///
/// A sender's id header names it first, in a fixed order; then its signature header. A
/// request that carries a sender's signature is that sender's, so that a signed delivery
/// stripped of its id header cannot fall through to the generic `Idempotency-Key`.
pub(crate) fn detect(parts: &Parts) -> Option<Sender> {
    const BY_HEADER: [(&str, Sender); 12] = [
        ("x-github-delivery", Sender::GitHub),
        ("x-shopify-webhook-id", Sender::Shopify),
        ("webhook-id", Sender::StandardWebhooks),
        ("svix-id", Sender::StandardWebhooks),
        ("i-twilio-idempotency-token", Sender::Twilio),
        ("twitch-eventsub-message-id", Sender::Twitch),
        ("stripe-signature", Sender::Stripe),
        ("x-slack-signature", Sender::Slack),
        ("x-hub-signature-256", Sender::GitHub),
        ("x-shopify-hmac-sha256", Sender::Shopify),
        ("twitch-eventsub-message-signature", Sender::Twitch),
        ("x-twilio-signature", Sender::Twilio),
    ];
    let signed_webhook = || {
        parts.headers.contains_key("webhook-signature")
            || parts.headers.contains_key("svix-signature")
    };
    BY_HEADER
        .iter()
        .find(|(name, _)| parts.headers.contains_key(*name))
        .map(|(_, sender)| *sender)
        .or_else(|| signed_webhook().then_some(Sender::StandardWebhooks))
}

enum Detected<'a> {
    Header(&'a Header),
    Body(&'a Json),
    Nothing,
}

impl Auto {
    fn detect(&self, parts: &Parts) -> Detected<'_> {
        let [
            github,
            shopify,
            webhook_id,
            svix_id,
            twilio,
            twitch,
            generic,
        ] = &self.headers;
        match detect(parts) {
            Some(Sender::GitHub) => Detected::Header(github),
            Some(Sender::Shopify) => Detected::Header(shopify),
            Some(Sender::StandardWebhooks) if parts.headers.contains_key(&webhook_id.name) => {
                Detected::Header(webhook_id)
            }
            Some(Sender::StandardWebhooks) => Detected::Header(svix_id),
            Some(Sender::Twilio) => Detected::Header(twilio),
            Some(Sender::Twitch) => Detected::Header(twitch),
            Some(Sender::Stripe) => Detected::Body(&self.stripe),
            Some(Sender::Slack) => Detected::Body(&self.slack),
            None if parts.headers.contains_key(&generic.name) => Detected::Header(generic),
            None => Detected::Nothing,
        }
    }
}

impl ExtractKey for Auto {
    fn reads_body(&self, parts: &Parts) -> bool {
        matches!(self.detect(parts), Detected::Body(_))
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        match self.detect(parts) {
            Detected::Header(header) => header.extract(parts, None),
            // Slack signs its form-encoded slash commands too; they carry no event id.
            Detected::Body(json) if std::ptr::eq(json, &self.slack) => {
                match json.extract(parts, body) {
                    Err(KeyError::NotJson { .. }) => Err(KeyError::missing(
                        "a Slack Events API body with an `event_id` (this body is not JSON)",
                    )),
                    other => other,
                }
            }
            Detected::Body(json) => json.extract(parts, body),
            Detected::Nothing => Err(KeyError::missing(
                "a webhook id header (X-GitHub-Delivery, X-Shopify-Webhook-Id, webhook-id, \
                 svix-id, I-Twilio-Idempotency-Token, Twitch-Eventsub-Message-Id), a signed \
                 Stripe or Slack body, or an Idempotency-Key header",
            )),
        }
    }
}

/// An RFC 6901 JSON pointer, split into its unescaped tokens.
#[derive(Debug, Clone)]
struct Pointer {
    source: String,
    tokens: Vec<String>,
}

impl Pointer {
    fn parse(source: &str) -> Self {
        assert!(
            source.is_empty() || source.starts_with('/'),
            "a JSON pointer is empty or starts with `/`, got {source:?}"
        );
        let tokens = source
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        Self {
            source: source.to_owned(),
            tokens,
        }
    }

    fn expected(&self) -> String {
        format!("JSON field `{}`", self.source)
    }
}

/// Finds one field in a JSON document in a single pass, skipping everything else without
/// building a tree, and checks that the whole document is valid JSON.
mod json_seek {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::{KeyError, Pointer};

    enum Found {
        Absent,
        Text(String),
        Other(&'static str),
    }

    pub(super) fn find(body: &[u8], pointer: &Pointer) -> Result<String, KeyError> {
        let not_json = |err: serde_json::Error| KeyError::NotJson {
            detail: err.to_string(),
        };
        let mut de = serde_json::Deserializer::from_slice(body);
        let found = Seek(&pointer.tokens)
            .deserialize(&mut de)
            .map_err(not_json)?;
        de.end().map_err(not_json)?;
        match found {
            Found::Text(text) => Ok(text),
            Found::Absent => Err(KeyError::missing(pointer.expected())),
            Found::Other(kind) => Err(wrong_type(pointer, kind)),
        }
    }

    pub(super) fn key_text(
        value: &serde_json::Value,
        pointer: &Pointer,
    ) -> Result<String, KeyError> {
        use serde_json::Value;
        match value {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            Value::Number(_) => Err(wrong_type(pointer, "a fractional number")),
            Value::Null => Err(wrong_type(pointer, "null")),
            Value::Bool(_) => Err(wrong_type(pointer, "a boolean")),
            Value::Array(_) => Err(wrong_type(pointer, "an array")),
            Value::Object(_) => Err(wrong_type(pointer, "an object")),
        }
    }

    fn wrong_type(pointer: &Pointer, kind: &str) -> KeyError {
        KeyError::invalid(format!(
            "{} is {kind}; expected a string or an integer",
            pointer.expected()
        ))
    }

    /// Walks `tokens` down the document; at the end of the path, reads the value.
    struct Seek<'p>(&'p [String]);

    impl<'de> DeserializeSeed<'de> for Seek<'_> {
        type Value = Found;

        fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<Found, D::Error> {
            de.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = Found;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Text(v.to_owned())))
        }

        fn visit_string<E: de::Error>(self, v: String) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Text(v)))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Text(v.to_string())))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Text(v.to_string())))
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Other("a fractional number")))
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Other("a boolean")))
        }

        fn visit_unit<E: de::Error>(self) -> Result<Found, E> {
            Ok(self.leaf(|| Found::Other("null")))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
            let Some((token, rest)) = self.0.split_first() else {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(Found::Other("an object"));
            };
            // Like most JSON readers, the last of duplicated names wins.
            let mut found = Found::Absent;
            while let Some(matches) = map.next_key_seed(NameIs(token))? {
                if matches {
                    found = map.next_value_seed(Seek(rest))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
            let Some((token, rest)) = self.0.split_first() else {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(Found::Other("an array"));
            };
            // RFC 6901: an array index is `0` or digits without a leading zero (no sign,
            // which `usize::from_str` would accept).
            let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
            let index = (digits && (token == "0" || !token.starts_with('0')))
                .then(|| token.parse::<usize>().ok())
                .flatten();
            let mut found = Found::Absent;
            let mut at = 0usize;
            loop {
                if Some(at) == index {
                    match seq.next_element_seed(Seek(rest))? {
                        Some(value) => found = value,
                        None => break,
                    }
                } else if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                at += 1;
            }
            Ok(found)
        }
    }

    impl Seek<'_> {
        /// A scalar: the answer if the path ends here, absent if it goes deeper.
        fn leaf(&self, found: impl FnOnce() -> Found) -> Found {
            if self.0.is_empty() {
                found()
            } else {
                Found::Absent
            }
        }
    }

    /// Compares an object member's name to one token without allocating.
    struct NameIs<'t>(&'t str);

    impl<'de> DeserializeSeed<'de> for NameIs<'_> {
        type Value = bool;

        fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
            de.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for NameIs<'_> {
        type Value = bool;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object member name")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            Ok(v == self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::post("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn key(ns: &str, value: &str) -> IdempotencyKey {
        IdempotencyKey::new(ns.to_owned(), value).unwrap()
    }

    #[test]
    fn key_validation() {
        assert!(IdempotencyKey::new("ns", "evt_1").is_ok());
        assert!(IdempotencyKey::new("ns", "a".repeat(MAX_KEY_LEN)).is_ok());
        let too_long = IdempotencyKey::new("ns", "a".repeat(MAX_KEY_LEN + 1)).unwrap_err();
        assert!(too_long.to_string().contains("at most 255"), "{too_long}");
        assert!(IdempotencyKey::new("ns", "").is_err());
        assert!(IdempotencyKey::new("ns", "   ").is_err());
        assert!(
            IdempotencyKey::new("ns", "evt_1 ").is_err(),
            "would equal `evt_1` in MySQL"
        );
        assert!(IdempotencyKey::new("ns", " evt_1").is_err());
        assert!(IdempotencyKey::new("ns", "a\u{7}b").is_err());
        assert!(IdempotencyKey::new("", "evt").is_err());
        assert!(
            IdempotencyKey::new("ns", "ключ 1").is_ok(),
            "visible unicode is text"
        );
    }

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

    #[test]
    fn json_pointer_lookup() {
        let p = parts(&[]);
        let body = br#"{"type":"x","data":{"object":{"id":"in_1"}},"list":[{"id":7},{"id":"b"}],"id":"evt_1","a/b":{"m~n":"esc"}}"#;
        let find = |ptr: &str| json(ptr).extract(&p, Some(body));
        assert_eq!(find("/id").unwrap().value(), "evt_1");
        assert_eq!(find("/data/object/id").unwrap().value(), "in_1");
        assert_eq!(find("/list/0/id").unwrap().value(), "7");
        assert_eq!(find("/list/1/id").unwrap().value(), "b");
        assert_eq!(find("/a~1b/m~0n").unwrap().value(), "esc");
        assert!(matches!(find("/nope"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/list/2/id"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/list/01/id"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/data"), Err(KeyError::Invalid { .. })));
        assert!(matches!(find("/list"), Err(KeyError::Invalid { .. })));
        assert!(matches!(
            find("/type/deeper"),
            Err(KeyError::Missing { .. })
        ));
    }

    #[test]
    fn json_rejects_bad_documents_and_types() {
        let p = parts(&[]);
        let ex = json("/id");
        for body in [
            &b"not json"[..],
            b"{\"id\":\"a\"",
            b"{\"id\":\"a\"} trailing",
            b"",
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::NotJson { .. }), "{body:?}: {err:?}");
        }
        for body in [
            &br#"{"id":null}"#[..],
            br#"{"id":true}"#,
            br#"{"id":1.5}"#,
            br#"{"id":""}"#,
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::Invalid { .. }), "{body:?}: {err:?}");
        }
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":-42}"#)).unwrap().value(),
            "-42"
        );
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":"a","id":"b"}"#))
                .unwrap()
                .value(),
            "b",
            "the last duplicate wins, as in serde_json::Value"
        );
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":"\u00e9v\"t"}"#))
                .unwrap()
                .value(),
            "év\"t"
        );
    }

    #[test]
    fn json_fields_is_unambiguous() {
        let p = parts(&[]);
        let ex = json_fields(["/a", "/b"]);
        let one = ex.extract(&p, Some(br#"{"a":"x:y","b":"z"}"#)).unwrap();
        let two = ex.extract(&p, Some(br#"{"a":"x","b":"y:z"}"#)).unwrap();
        assert_ne!(one, two);
        let missing = ex.extract(&p, Some(br#"{"a":"x"}"#)).unwrap_err();
        assert_eq!(missing, KeyError::missing("JSON field `/b`"));
    }

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
    fn json_fields_checks_each_part() {
        let ex = json_fields(["/customer", "/order"]);
        let p = parts(&[]);
        for body in [
            &br#"{"customer":"c1","order":""}"#[..],
            br#"{"customer":"c1","order":"a\u0000"}"#,
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::Invalid { .. }), "{err:?}");
        }
    }

    #[test]
    fn auto_keys_slack_by_its_signature_and_leaves_forms_keyless() {
        let ex = auto();
        let form = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        // A signed Slack request is Slack's whatever its content type says: its body is read,
        // and a slash command's form has no event id (missing, not 400 "not JSON").
        assert!(ex.reads_body(&form));
        assert!(matches!(
            ex.extract(&form, Some(b"token=x&command=%2Fdeploy")),
            Err(KeyError::Missing { .. })
        ));
        let relabelled = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(
            ex.extract(&relabelled, Some(br#"{"event_id":"Ev1"}"#))
                .unwrap(),
            key("slack", "Ev1")
        );
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
    fn auto_recognises_each_provider() {
        let ex = auto();
        let cases = [
            ("x-github-delivery", "github"),
            ("x-shopify-webhook-id", "shopify"),
            ("webhook-id", "standard-webhooks"),
            ("svix-id", "standard-webhooks"),
            ("i-twilio-idempotency-token", "twilio"),
            ("twitch-eventsub-message-id", "twitch"),
            ("idempotency-key", "idempotency-key"),
        ];
        for (name, ns) in cases {
            let p = parts(&[(name, "id-1")]);
            assert!(!ex.reads_body(&p), "{name} is a header key");
            assert_eq!(ex.extract(&p, None).unwrap(), key(ns, "id-1"), "{name}");
        }
        let stripe = parts(&[("stripe-signature", "t=1,v1=abc")]);
        assert!(ex.reads_body(&stripe));
        assert_eq!(
            ex.extract(&stripe, Some(br#"{"id":"evt_9","object":"event"}"#))
                .unwrap(),
            key("stripe", "evt_9")
        );
        let slack = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(
            ex.extract(&slack, Some(br#"{"event_id":"Ev1"}"#)).unwrap(),
            key("slack", "Ev1")
        );
        let nothing = ex.extract(&parts(&[("content-type", "application/json")]), None);
        assert!(matches!(nothing, Err(KeyError::Missing { .. })));
        // A provider's own id wins over a generic Idempotency-Key header.
        let both = parts(&[("idempotency-key", "k"), ("x-github-delivery", "g")]);
        assert_eq!(ex.extract(&both, None).unwrap(), key("github", "g"));
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

    #[test]
    #[should_panic(expected = "invalid idempotency key namespace")]
    fn empty_namespace_is_a_configuration_error() {
        let _ = header("x").namespace("");
    }
}
