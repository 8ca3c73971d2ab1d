//! Slack's signature: `X-Slack-Signature`, of the timestamp and body.

use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::Scheme;
use crate::key::senders::slack::{SENDER, SIGNATURE};
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    clock::{fresh, seconds},
    mac::any_matches,
    parse::{from_hex, header},
};

const TIMESTAMP: &str = "x-slack-request-timestamp";

pub(crate) static SCHEME: Scheme = Scheme {
    sender: &SENDER,
    tolerance: Duration::from_secs(5 * 60),
    check,
};

/// Slack: `X-Slack-Signature: v0=<hex>` and `X-Slack-Request-Timestamp`, HMAC-SHA256 of
/// `v0:<timestamp>:<body>` keyed with the app's signing secret. Tolerance: 5 minutes, as
/// Slack advises. Pair it with [`key::slack`](crate::key::slack).
///
/// Source: api.slack.com/authentication/verifying-requests-from-slack.
///
/// # Panics
///
/// If no secret, or an empty one, is given.
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&SCHEME, secrets.into())
}

fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let timestamp = header(parts, TIMESTAMP)?;
    let hex = header(parts, SIGNATURE)?
        .strip_prefix("v0=")
        .ok_or_else(|| VerifyError::malformed("expected `v0=<hex>`"))?;
    let signature = from_hex(hex)?;
    fresh(seconds(timestamp)?, now, check.tolerance)?;
    let content = [b"v0:", timestamp.as_bytes(), b":", body];
    any_matches(check, &[signature], &content)
}
