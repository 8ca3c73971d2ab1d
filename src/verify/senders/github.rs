//! GitHub's signature: `X-Hub-Signature-256`, of the body.

use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::Scheme;
use crate::key::senders::github::{SENDER, SIGNATURE};
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    mac::any_matches,
    parse::{from_hex, header},
};

pub(crate) static SCHEME: Scheme = Scheme {
    sender: &SENDER,
    tolerance: Duration::ZERO,
    check,
};

/// GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body keyed with the
/// webhook's secret. The delivery id is not signed: see the [module docs](crate::verify).
/// Pair it with [`key::github`](crate::key::github).
///
/// Source: docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries.
///
/// # Panics
///
/// If no secret, or an empty one, is given.
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&SCHEME, secrets.into())
}

fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Result<(), VerifyError> {
    let header = header(parts, SIGNATURE)?;
    let hex = header
        .strip_prefix("sha256=")
        .ok_or_else(|| VerifyError::malformed("expected `sha256=<hex>`"))?;
    any_matches(check, &[from_hex(hex)?], &[body])
}
