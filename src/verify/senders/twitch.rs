//! Twitch EventSub's signature: `Twitch-Eventsub-Message-Signature`, of the id, timestamp and
//! body.

use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::Scheme;
use crate::key::senders::twitch::{ID, SENDER, SIGNATURE};
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    clock::fresh,
    mac::any_matches,
    parse::{from_hex, header},
};

const TIMESTAMP: &str = "twitch-eventsub-message-timestamp";

pub(crate) static SCHEME: Scheme = Scheme {
    sender: &SENDER,
    tolerance: Duration::from_secs(10 * 60),
    check,
};

/// Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>`, HMAC-SHA256 of the
/// message id, the timestamp (RFC 3339, as sent) and the body, keyed with the subscription's
/// secret. Tolerance: 10 minutes, as Twitch advises. Pair it with
/// [`key::twitch`](crate::key::twitch).
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("Verifying the event
/// message").
///
/// # Panics
///
/// If no secret, or an empty one, is given.
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&SCHEME, secrets.into())
}

fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let id = header(parts, ID)?;
    let timestamp = header(parts, TIMESTAMP)?;
    let hex = header(parts, SIGNATURE)?
        .strip_prefix("sha256=")
        .ok_or_else(|| VerifyError::malformed("expected `sha256=<hex>`"))?;
    let signature = from_hex(hex)?;
    let micros = crate::timestamp::parse_timestamp(timestamp)
        .map_err(|error| VerifyError::malformed(error.to_string()))?;
    fresh(micros.div_euclid(1_000_000), now, check.tolerance)?;
    let content = [id.as_bytes(), timestamp.as_bytes(), body];
    any_matches(check, &[signature], &content)
}
