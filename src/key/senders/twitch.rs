//! Twitch EventSub: the `Twitch-Eventsub-Message-Id`; the `-Signature` signature, of the id,
//! timestamp and body.

#[cfg(feature = "verify")]
use std::time::Duration;

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "twitch-eventsub-message-id";
const SIGNATURE: &str = "twitch-eventsub-message-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Twitch",
    namespace: "twitch",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 4,
    #[cfg(feature = "verify")]
    tolerance: Duration::from_secs(10 * 60),
    #[cfg(feature = "verify")]
    signs_url: false,
    #[cfg(feature = "verify")]
    check: scheme::check,
};

/// Twitch EventSub: the `Twitch-Eventsub-Message-Id` header, namespace `twitch`.
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("if you receive a message
/// with the same ID, … you've already processed it").
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}

/// Twitch EventSub's signature: `Twitch-Eventsub-Message-Signature`, of the id, timestamp and
/// body.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use http::request::Parts;

    use super::{ID, SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Secrets, Verifier, VerifyError,
        clock::fresh,
        mac::any_matches,
        parse::{from_hex, header},
    };

    const TIMESTAMP: &str = "twitch-eventsub-message-timestamp";

    /// Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>`, HMAC-SHA256 of the
    /// message id, the timestamp (RFC 3339, as sent) and the body, keyed with the
    /// subscription's secret. Tolerance: 10 minutes, as Twitch advises. Pair it with
    /// [`key::twitch`](crate::key::twitch).
    ///
    /// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("Verifying the event
    /// message").
    ///
    /// # Panics
    ///
    /// If no secret, or an empty one, is given.
    pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
        Verifier::of(&SENDER, secrets.into())
    }

    pub(super) fn check(
        check: &Check,
        parts: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
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
}
