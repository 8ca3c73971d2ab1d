//! Slack Events API: the body's `/event_id`; the `X-Slack-Signature` signature, of the
//! timestamp and body.

use super::{Id, Sender};
use crate::key::Json;

const POINTER: &str = "/event_id";
const SIGNATURE: &str = "x-slack-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Slack",
    namespace: "slack",
    id: Id::Body {
        pointer: POINTER,
        // Slack signs its form-encoded slash commands too; they carry no event id.
        if_not_json: Some("a Slack Events API body with an `event_id` (this body is not JSON)"),
    },
    signature: &[SIGNATURE],
    signature_precedence: 1,
    #[cfg(feature = "verify")]
    scheme: scheme::SCHEME,
};

/// Slack Events API: the body field `/event_id`, namespace `slack`.
///
/// The one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
///
/// Slack retries a failed event three times within minutes, marking each retry with
/// `X-Slack-Retry-Num`; the outer wrapper's `event_id` names the event (api.slack.com/apis/events-api).
pub fn key() -> Json {
    Json::preset(POINTER, SENDER.namespace)
}

/// Slack's signature: `X-Slack-Signature`, of the timestamp and body.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::{Duration, SystemTime};

    use http::request::Parts;

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier,
        clock::{fresh, seconds},
        mac::any_matches,
        parse::{header, prefixed_hex},
    };

    const TIMESTAMP: &str = "x-slack-request-timestamp";

    /// A signed timestamp, at most 5 minutes from now as Slack advises; not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check).tolerance(Duration::from_secs(5 * 60));

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
        Verifier::of(&SENDER, secrets.into())
    }

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Verdict {
        let timestamp = header(parts, TIMESTAMP)?;
        let signature = prefixed_hex(parts, SIGNATURE, "v0=")?;
        fresh(seconds(timestamp)?, now, check.tolerance)?;
        let content = [b"v0:", timestamp.as_bytes(), b":", body];
        any_matches(check, &[signature], &content)
    }
}
