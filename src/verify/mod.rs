//! Verifying the sender's signature **before** the claim.
//!
//! A key is only as trustworthy as the request that carries it. Event ids leak (logs,
//! dashboards, a support ticket); an unsigned request sent first with a real id would claim
//! it, and the genuine delivery would then be answered "duplicate" and never run. With
//! [`verify`](crate::IdempotencyLayer::verify) set, the layer checks the signature through the
//! same body buffering the key extractors use (its limit and time limit), and answers a
//! missing, malformed, wrong or expired signature **401** problem+json without touching the
//! store: a forged request never claims a key.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The example of docs.github.com, "Validating webhook deliveries".
//! let secret = "It's a Secret to Everybody";
//! let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new())
//!         .key(key::github())
//!         .verify(verify::github(secret)))
//!     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
//! let delivery = |signature: &str| {
//!     Request::post("/webhooks/github")
//!         .header("x-github-delivery", "d-1")
//!         .header("x-hub-signature-256", signature)
//!         .body("Hello, World!".to_owned())
//!         .unwrap()
//! };
//!
//! // A forgery with the real delivery id is refused, and claims nothing...
//! let forged = svc.clone().oneshot(delivery("sha256=00")).await.unwrap();
//! assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
//! assert_eq!(forged.headers()["content-type"], "application/problem+json");
//! // ...so the genuine delivery still runs.
//! let genuine = svc.oneshot(delivery(signature)).await.unwrap();
//! assert_eq!(genuine.status(), StatusCode::OK);
//! assert_eq!(genuine.headers().get("idempotency-outcome"), None);
//! # }
//! ```
//!
//! # Providers, and what their signatures cover
//!
//! Each provider's function takes its secrets: one, or several while a secret is rotated (a
//! signature made with any of them passes). Signatures are compared in constant time.
//! Standard Webhooks also signs asymmetrically (`v1a`, Ed25519): its function takes the
//! sender's `whpk_` public keys beside, or instead of, `whsec_` secrets.
//!
//! | provider | headers | the signature covers | timestamp tolerance |
//! |---|---|---|---|
//! | [`stripe`] | `Stripe-Signature` (`t=`, one or more `v1=`) | timestamp and body (the event id is in the body) | 5 minutes |
//! | [`github`] | `X-Hub-Signature-256` | the body only | none: not signed |
//! | [`shopify`] | `X-Shopify-Hmac-Sha256` | the body only | none: not signed |
//! | [`standard_webhooks`] | `webhook-id`, `webhook-timestamp`, `webhook-signature` (`v1,` HMAC-SHA256 with a `whsec_` secret, `v1a,` Ed25519 with a `whpk_` public key), or the same with `svix-` | message id, timestamp and body | 5 minutes |
//! | [`slack`] | `X-Slack-Signature`, `X-Slack-Request-Timestamp` | timestamp and body (`event_id` is in the body) | 5 minutes |
//! | [`twitch`] | `Twitch-Eventsub-Message-Signature`, `-Id`, `-Timestamp` | message id, timestamp and body | 10 minutes |
//! | [`twilio`] | `X-Twilio-Signature` | the full URL and the POST parameters (or, for JSON, the URL with its `bodySHA256`; any other body is refused) | none: not signed |
//!
//! **Unsigned delivery ids.** GitHub, Shopify and Twilio do not sign the header their key
//! presets read (`X-GitHub-Delivery`, `X-Shopify-Webhook-Id`, `I-Twilio-Idempotency-Token`),
//! and sign no timestamp. Whoever captured one genuine delivery can send it again, at any
//! time, with a fresh id: both checks pass and the handler runs again. Verification still
//! stops forged content and stolen ids; against replays, key on something the signature
//! covers: a synthetic key from body fields
//! ([`key::json_fields`](crate::key::json_fields), e.g. Shopify's `/id` with
//! `/updated_at`, or a form field such as Twilio's `MessageSid` with
//! [`key::from_body_fn`](crate::key::from_body_fn)). The
//! [version guard](crate::version_guard) is no defence against such a replay: it answers a
//! copy older than the entity's applied version `outdated`, but a copy of the **newest**
//! delivery carries the applied version, and [equal versions
//! run](crate::version_guard#equal-versions). It keeps a replay from setting an entity back to
//! an older state, nothing more: a handler whose work is a side effect (an e-mail, a charge)
//! runs again.
//! Stripe, Standard Webhooks, Slack and Twitch sign their ids (or carry them in the signed
//! body) and a timestamp, so a replay within the tolerance carries the same key, and an older
//! one is refused. A signature does not cover the URL, though: a replay sent to another path
//! that reaches the same handler is the same event only because the key's scope is
//! configuration (the route the router matched, or a name), never the raw path; see
//! [`Scope`](crate::key::Scope). A service that no router reports a route for, and that shares
//! its namespace and store with another, needs [`Scope::named`](crate::key::Scope::named).
//!
//! **Lists of signatures.** Stripe and Standard Webhooks list one signature per secret they
//! sign with, several while one is rotated. Each listed signature costs a check of the whole
//! body per configured key (an HMAC, or an Ed25519 verification for `v1a`), asked for before
//! anything has shown the request genuine; so a header that lists more than 8 entries
//! (`Stripe-Signature` besides its `t=`; `webhook-signature` of any version, the ones a
//! verifier skips included) is refused as malformed, before any is decoded or checked. The
//! other senders send one signature, and only it is read.
//!
//! **Timestamps and clocks.** A timestamp is taken from the signed content and compared with
//! this machine's clock; it may be off by the tolerance in either direction, which absorbs the
//! clock skew between the sender and this machine (keep the clock synchronised: NTP). Change it
//! with [`Verifier::tolerance`].
//!
//! **Twilio's URL.** Twilio signs the URL it requested, scheme, host and port included. Give
//! its public base with [`Verifier::public_url`] (`https://hooks.example.com`, with the path
//! prefix a proxy removes): then the URL checked is that base and the request's path and
//! query. Without it, the layer rebuilds the URL as `https://` + the request's `Host` header +
//! the path and query, which works without a proxy but trusts the `Host` the client sent: a
//! request Twilio signed for another application of the same account (another host, the same
//! auth token) would pass here. Twilio's scheme also joins parameter names and values without
//! a separator, so `MessageSid=SM1&NumMedia=0` and `MessageSid=SM1N&umMedia=0` carry the same
//! signature: a key read from a form field should check the value's shape (Twilio's SIDs are
//! two letters and 32 hex digits).
//!
//! **Standard Webhooks `v1a`** signatures are Ed25519, checked with the sender's public keys
//! (`whpk_…`): only the sender holds the signing key, so a configuration that leaks lets
//! nobody forge a delivery, which a leaked `whsec_` secret does. A verifier checks the entries
//! of the kinds it has keys for: one given only `whpk_` keys refuses a delivery signed only
//! with `v1` (a mismatch), and the other way round; give both kinds while the sender moves
//! from one to the other.
//!
//! # With the `auto` extractor
//!
//! [`key::auto`](crate::key::auto) picks the sender by its headers; verification picks the
//! sender by the same rule, so the key claimed always belongs to the sender whose signature
//! passed: a sender's id header names it, else its signature header (a signed delivery
//! stripped of its id is still that sender's, and never falls back to `Idempotency-Key`).
//! Standard Webhooks' signature is read from the same header family (`webhook-` or `svix-`)
//! as its id. Configure every sender the route accepts with [`Verifier::or`]: a request that
//! looks like a sender without a configured secret is refused (401), never let through
//! unverified. With an explicit key extractor, pair each verifier with its sender's preset:
//! a key read from somewhere the sender does not sign is only as good as that header.
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, store::MemoryStore, verify};
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new()).verify(
//!     verify::stripe(["whsec_current", "whsec_previous"])
//!         .or(verify::github("github secret"))
//!         .or(verify::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")),
//! );
//! # let _ = layer;
//! ```

use std::fmt;
use std::time::SystemTime;

use http::request::Parts;

// Each sender's verifier, `verify::github(secret)` and the others, is defined with the docs of
// its scheme in the sender's own file, beside its record and key preset:
// `src/key/senders/<name>.rs`.
pub use crate::key::senders::signature::{Secrets, Verifier, VerifyError};
pub use crate::key::senders::verifiers::*;

/// Checks a delivery before the layer claims its key.
///
/// Implemented by [`Verifier`] (the providers of this module), by [`from_fn`], and by every
/// closure `Fn(&http::request::Parts, &[u8]) -> Result<(), VerifyError>`, for a sender this
/// module does not know. `body` is the whole buffered body.
pub trait Verify: Send + Sync + 'static {
    /// `Ok` when the delivery is genuine; the error is answered 401.
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError>;
}

impl<F> Verify for F
where
    F: Fn(&Parts, &[u8]) -> Result<(), VerifyError> + Send + Sync + 'static,
{
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        self(parts, body)
    }
}

/// Verifies with a closure, for a sender this module does not know: `f` answers `Ok` for a
/// genuine delivery. The closure's argument types need no annotation here, unlike a closure
/// given to `.verify(..)` as it is.
///
/// ```
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify::{self, VerifyError}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A sender that sends a shared token (weaker than a signature: it covers nothing).
/// let token = verify::from_fn(|parts, _body| match parts.headers.get("x-token") {
///     Some(token) if token == "s3cret" => Ok(()),
///     Some(_) => Err(VerifyError::Mismatch),
///     None => Err(VerifyError::missing("header `x-token`")),
/// });
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::header("x-id").namespace("acme")).verify(token))
///     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
/// let res = svc.oneshot(Request::post("/").header("x-id", "1").body(String::new()).unwrap()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
/// # }
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<(), VerifyError> + Send + Sync + 'static,
{
    FromFn(f)
}

/// A [`Verify`] made of a closure. Built by [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F>(F);

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

impl<F> Verify for FromFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<(), VerifyError> + Send + Sync + 'static,
{
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        (self.0)(parts, body)
    }
}

impl Verify for Verifier {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        self.verify_at(parts, body, SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use crate::key::senders::ALL;

    /// Each public verifier checks the sender it is named after, and every sender has one.
    #[test]
    fn every_sender_has_one_verifier() {
        let verifiers = [
            super::github("secret"),
            super::shopify("secret"),
            super::standard_webhooks("whsec_c2VjcmV0"),
            super::twilio("secret"),
            super::twitch("secret"),
            super::stripe("secret"),
            super::slack("secret"),
        ];
        let senders: Vec<_> = verifiers.iter().map(|v| v.only_sender()).collect();
        assert_eq!(senders, ALL);
    }
}
