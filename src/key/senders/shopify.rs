//! Shopify: the `X-Shopify-Webhook-Id` id; the `X-Shopify-Hmac-Sha256` signature, of the body.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "x-shopify-webhook-id";
const SIGNATURE: &str = "x-shopify-hmac-sha256";

pub(crate) static SENDER: Sender = Sender {
    name: "Shopify",
    namespace: "shopify",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 3,
    #[cfg(feature = "verify")]
    scheme: scheme::SCHEME,
};

/// Shopify: the `X-Shopify-Webhook-Id` header, namespace `shopify`.
///
/// Source: shopify.dev/docs/apps/build/webhooks/delivery-structure, which names this header
/// for detecting duplicates. Shopify's older "ignore duplicates" page names
/// `X-Shopify-Event-Id` instead, which is shared by every subscription fired by one merchant
/// action; use `key::header("x-shopify-event-id").namespace("shopify")` to dedupe per action.
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}

/// Shopify's signature: `X-Shopify-Hmac-Sha256`, of the body.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use http::request::Parts;

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier,
        mac::any_matches,
        parse::{from_base64, header},
    };

    /// The body alone is signed: no timestamp, and not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check);

    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body keyed with the
    /// app's client secret. The webhook id is not signed: see the [module docs](crate::verify).
    /// Pair it with [`key::shopify`](crate::key::shopify).
    ///
    /// Source: shopify.dev/docs/apps/build/webhooks/subscribe/https ("Verify the webhook").
    ///
    /// # Panics
    ///
    /// If no secret, or an empty one, is given.
    pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
        Verifier::of(&SENDER, secrets.into())
    }

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Verdict {
        let signature = from_base64(header(parts, SIGNATURE)?)?;
        any_matches(check, &[signature], &[body])
    }
}
