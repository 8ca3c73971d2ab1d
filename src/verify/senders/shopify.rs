//! Shopify's signature: `X-Shopify-Hmac-Sha256`, of the body.

use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::Scheme;
use crate::key::senders::shopify::{SENDER, SIGNATURE};
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    mac::any_matches,
    parse::{from_base64, header},
};

pub(crate) static SCHEME: Scheme = Scheme {
    sender: &SENDER,
    tolerance: Duration::ZERO,
    check,
};

/// Shopify: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body keyed with the app's
/// client secret. The webhook id is not signed: see the [module docs](crate::verify). Pair it
/// with [`key::shopify`](crate::key::shopify).
///
/// Source: shopify.dev/docs/apps/build/webhooks/subscribe/https ("Verify the webhook").
///
/// # Panics
///
/// If no secret, or an empty one, is given.
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&SCHEME, secrets.into())
}

fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Result<(), VerifyError> {
    let signature = from_base64(header(parts, SIGNATURE)?)?;
    any_matches(check, &[signature], &[body])
}
