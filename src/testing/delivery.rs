//! [`Delivery`]: one request as a sender sends it, which a test can send again and again.

use std::fmt;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::Full;

/// One delivery as its sender sends it: method, URI, headers and body, kept so that it can be
/// sent any number of times (an `http::Request` cannot be cloned; a `Delivery` can).
///
/// The [signers](super::sign) make signed ones; [`Delivery::new`] takes any request, for a
/// sender that signs nothing (an `Idempotency-Key` client, a queue). A delivery goes to `/`
/// unless [`to`](Delivery::to) says otherwise.
///
/// ```
/// use http::Request;
/// use tower_idempotency::testing::Delivery;
///
/// let delivery = Delivery::new(
///     Request::post("/orders").header("idempotency-key", "k-1").body("{}").unwrap(),
/// );
/// let first = delivery.request();
/// let second = delivery.request();
/// assert_eq!(first.uri(), second.uri());
/// assert_eq!(second.headers()["idempotency-key"], "k-1");
/// assert_eq!(delivery.body().as_ref(), b"{}");
/// ```
#[derive(Clone)]
pub struct Delivery {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    /// Who signed it (`Stripe`), or `None`.
    sender: Option<&'static str>,
    /// The headers that carry its signature.
    signature: &'static [&'static str],
    /// The event id it carries, for messages.
    event: Option<String>,
}

impl Delivery {
    /// A delivery of `request`, sent as it is: its method, URI, headers and body.
    ///
    /// ```
    /// use http::{Method, Request};
    /// use tower_idempotency::testing::Delivery;
    ///
    /// let delivery = Delivery::new(Request::put("/things/1").body("x").unwrap());
    /// assert_eq!(delivery.method(), Method::PUT);
    /// assert_eq!(delivery.uri(), "/things/1");
    /// ```
    pub fn new(request: Request<impl Into<Bytes>>) -> Self {
        let (parts, body) = request.into_parts();
        Self {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body: body.into(),
            sender: None,
            signature: &[],
            event: None,
        }
    }

    /// A delivery made by a signer: a POST to `/` with these headers.
    pub(super) fn signed(
        sender: &'static str,
        signature: &'static [&'static str],
        headers: Vec<(&'static str, String)>,
        body: Bytes,
        event: Option<String>,
    ) -> Self {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let value = HeaderValue::try_from(value)
                .unwrap_or_else(|_| panic!("the value of header `{name}` is not valid in HTTP"));
            map.append(HeaderName::from_static(name), value);
        }
        Self {
            method: Method::POST,
            uri: Uri::from_static("/"),
            headers: map,
            body,
            sender: Some(sender),
            signature,
            event,
        }
    }

    /// The same delivery sent to `uri` (a path, with a query if need be): the route under test.
    ///
    /// A signature covers no path, except Twilio's, which covers the whole URL: a Twilio
    /// delivery is sent to the URL its signer was given, and moving it elsewhere makes its
    /// signature wrong.
    ///
    /// # Panics
    ///
    /// If `uri` is not a valid URI.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::github("secret").delivery("d-1", "{}").to("/webhooks/github");
    /// assert_eq!(delivery.uri(), "/webhooks/github");
    /// ```
    pub fn to(mut self, uri: &str) -> Self {
        self.uri = uri
            .parse()
            .unwrap_or_else(|error| panic!("{uri:?} is not a URI: {error}"));
        self
    }

    /// The same delivery with one more header (replacing any of that name): what a sender
    /// adds beside its signature, such as GitHub's `X-GitHub-Event`.
    ///
    /// # Panics
    ///
    /// If the name or the value is not valid in HTTP.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let push = sign::github("secret").delivery("d-1", "{}").header("x-github-event", "push");
    /// assert_eq!(push.headers()["x-github-event"], "push");
    /// ```
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::try_from(name)
            .unwrap_or_else(|error| panic!("{name:?} is not a header name: {error}"));
        let value = HeaderValue::try_from(value)
            .unwrap_or_else(|error| panic!("{value:?} is not a header value: {error}"));
        self.headers.insert(name, value);
        self
    }

    /// A forgery of this delivery: the same headers and signature over a body with one more
    /// byte (a trailing space, which keeps a JSON body JSON). A verifier answers
    /// [`Mismatch`](crate::verify::VerifyError::Mismatch).
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let genuine = sign::shopify("secret").delivery("w-1", r#"{"id":1}"#);
    /// let forged = genuine.tampered();
    /// assert_eq!(forged.body().as_ref(), br#"{"id":1} "#);
    /// assert_eq!(forged.headers(), genuine.headers());
    /// ```
    pub fn tampered(&self) -> Self {
        let mut body = self.body.to_vec();
        body.push(b' ');
        Self {
            body: body.into(),
            ..self.clone()
        }
    }

    /// This delivery without the headers that carry its signature (its id and timestamp
    /// stay): an unsigned request with a real event id. A verifier answers
    /// [`Missing`](crate::verify::VerifyError::Missing).
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let unsigned = sign::github("secret").delivery("d-1", "{}").without_signature();
    /// assert!(unsigned.headers().get("x-hub-signature-256").is_none());
    /// assert_eq!(unsigned.headers()["x-github-delivery"], "d-1");
    /// ```
    pub fn without_signature(&self) -> Self {
        let mut unsigned = self.clone();
        for name in self.signature {
            unsigned.headers.remove(*name);
        }
        unsigned
    }

    /// A new request of this delivery, with a `Full<Bytes>` body: what `oneshot` takes for an
    /// axum `Router` or a service behind this crate's layers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use http_body_util::BodyExt;
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::github("secret").delivery("d-1", "{}").to("/hooks");
    /// let request = delivery.request();
    /// assert_eq!(request.uri(), "/hooks");
    /// assert_eq!(request.into_body().collect().await.unwrap().to_bytes(), "{}");
    /// # }
    /// ```
    pub fn request(&self) -> Request<Full<Bytes>> {
        self.request_with_body()
    }

    /// A new request of this delivery with any body made from bytes.
    pub(crate) fn request_with_body<B: From<Bytes>>(&self) -> Request<B> {
        Request::from_parts(self.parts(), B::from(self.body.clone()))
    }

    /// The request's head: what a verifier's
    /// [`verify_at`](crate::verify::Verifier::verify_at) takes beside the [body](Self::body).
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::github("secret").delivery("d-1", "{}");
    /// assert_eq!(delivery.parts().headers["x-github-delivery"], "d-1");
    /// ```
    pub fn parts(&self) -> Parts {
        let mut request = Request::new(());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request.into_parts().0
    }

    /// Its method (`POST` for the signers' deliveries).
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// assert_eq!(sign::github("secret").delivery("d-1", "{}").method(), http::Method::POST);
    /// ```
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Its URI.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// assert_eq!(sign::github("secret").delivery("d-1", "{}").uri(), "/");
    /// ```
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// Its headers, the signature's among them.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::github("secret").delivery("d-1", "{}");
    /// assert!(delivery.headers()["x-hub-signature-256"].to_str().unwrap().starts_with("sha256="));
    /// ```
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Its body.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// assert_eq!(sign::github("secret").delivery("d-1", "{}").body().as_ref(), b"{}");
    /// ```
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl<B: Into<Bytes>> From<Request<B>> for Delivery {
    fn from(request: Request<B>) -> Self {
        Self::new(request)
    }
}

/// One line: who sent it, its event, where to: `Stripe delivery of evt_1 (POST
/// /webhooks/stripe)`.
impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sender {
            Some(sender) => write!(f, "{sender} delivery")?,
            None => f.write_str("delivery")?,
        }
        if let Some(event) = &self.event {
            write!(f, " of {event}")?;
        }
        write!(f, " ({} {})", self.method, self.uri)
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("method", &self.method)
            .field("uri", &self.uri)
            .field("headers", &self.headers)
            .field("body", &self.body)
            .finish()
    }
}
