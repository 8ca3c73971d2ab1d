//! Twitch EventSub: the `Twitch-Eventsub-Message-Id`; the `-Signature` signature, of the id,
//! timestamp and body.

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
    scheme: scheme::SCHEME,
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
    use std::time::{Duration, SystemTime};

    use http::request::Parts;

    use super::{ID, SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier, VerifyError,
        clock::fresh,
        mac::any_matches,
        parse::{header, prefixed_hex},
    };

    const TIMESTAMP: &str = "twitch-eventsub-message-timestamp";

    /// A signed timestamp, at most 10 minutes from now as Twitch advises; not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check).tolerance(Duration::from_secs(10 * 60));

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

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Verdict {
        let id = header(parts, ID)?;
        let timestamp = header(parts, TIMESTAMP)?;
        let signature = prefixed_hex(parts, SIGNATURE, "sha256=")?;
        let micros = crate::timestamp::parse_timestamp(timestamp)
            .map_err(|error| VerifyError::malformed(error.to_string()))?;
        fresh(micros.div_euclid(1_000_000), now, check.tolerance)?;
        let content = [id.as_bytes(), timestamp.as_bytes(), body];
        any_matches(check, &[signature], &content)
    }
}
