//! Twitch EventSub: the `Twitch-Eventsub-Message-Id`, the `-Signature` of the id, timestamp
//! and body.

#[cfg(feature = "verify")]
use std::time::{Duration, SystemTime};

#[cfg(feature = "verify")]
use http::request::Parts;

use super::{Id, Provider};
use crate::key::Header;
#[cfg(feature = "verify")]
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    clock::fresh,
    mac::any_matches,
    parse::{from_hex, header},
};

const ID: &str = "twitch-eventsub-message-id";
const SIGNATURE: &str = "twitch-eventsub-message-signature";
#[cfg(feature = "verify")]
const TIMESTAMP: &str = "twitch-eventsub-message-timestamp";

pub(crate) static PROVIDER: Provider = Provider {
    name: "Twitch",
    namespace: "twitch",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 4,
    #[cfg(feature = "verify")]
    tolerance: Duration::from_secs(10 * 60),
    #[cfg(feature = "verify")]
    check,
};

/// Twitch EventSub: the `Twitch-Eventsub-Message-Id` header, namespace `twitch`.
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("if you receive a message
/// with the same ID, … you've already processed it").
pub fn key() -> Header {
    Header::preset(ID, PROVIDER.namespace)
}

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
#[cfg(feature = "verify")]
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&PROVIDER, secrets.into())
}

#[cfg(feature = "verify")]
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
