//! Shopify: the `X-Shopify-Webhook-Id` id, the `X-Shopify-Hmac-Sha256` signature of the body.

#[cfg(feature = "verify")]
use std::time::{Duration, SystemTime};

#[cfg(feature = "verify")]
use http::request::Parts;

use super::{Id, Provider};
use crate::key::Header;
#[cfg(feature = "verify")]
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    mac::any_matches,
    parse::{from_base64, header},
};

const ID: &str = "x-shopify-webhook-id";
const SIGNATURE: &str = "x-shopify-hmac-sha256";

pub(crate) static PROVIDER: Provider = Provider {
    name: "Shopify",
    namespace: "shopify",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 3,
    #[cfg(feature = "verify")]
    tolerance: Duration::ZERO,
    #[cfg(feature = "verify")]
    check,
};

/// Shopify: the `X-Shopify-Webhook-Id` header, namespace `shopify`.
///
/// Source: shopify.dev/docs/apps/build/webhooks/delivery-structure, which names this header
/// for detecting duplicates. Shopify's older "ignore duplicates" page names
/// `X-Shopify-Event-Id` instead, which is shared by every subscription fired by one merchant
/// action; use `key::header("x-shopify-event-id").namespace("shopify")` to dedupe per action.
pub fn key() -> Header {
    Header::preset(ID, PROVIDER.namespace)
}

/// Shopify: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body keyed with the app's
/// client secret. The webhook id is not signed: see the [module docs](crate::verify). Pair it
/// with [`key::shopify`](crate::key::shopify).
///
/// Source: shopify.dev/docs/apps/build/webhooks/subscribe/https ("Verify the webhook").
///
/// # Panics
///
/// If no secret, or an empty one, is given.
#[cfg(feature = "verify")]
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&PROVIDER, secrets.into())
}

#[cfg(feature = "verify")]
fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Result<(), VerifyError> {
    let signature = from_base64(header(parts, SIGNATURE)?)?;
    any_matches(check, &[signature], &[body])
}
