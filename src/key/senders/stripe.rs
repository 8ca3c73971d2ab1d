//! Stripe: the event id in the body's `/id`; the `Stripe-Signature` signature, of the
//! timestamp and body.

#[cfg(feature = "verify")]
use std::time::Duration;

use super::{Id, Sender};
use crate::key::Json;

const POINTER: &str = "/id";
const SIGNATURE: &str = "stripe-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Stripe",
    namespace: "stripe",
    id: Id::Body {
        pointer: POINTER,
        if_not_json: None,
    },
    signature: &[SIGNATURE],
    signature_precedence: 0,
    #[cfg(feature = "verify")]
    tolerance: Duration::from_secs(5 * 60),
    #[cfg(feature = "verify")]
    signs_url: false,
    #[cfg(feature = "verify")]
    check: scheme::check,
};

/// Stripe: the event id (`evt_…`) in the body field `/id`, namespace `stripe`.
///
/// Stripe: "Webhook endpoints might occasionally receive the same event more than once. You
/// can guard against duplicated event receipts by logging the event IDs you've processed"
/// (docs.stripe.com/webhooks, "Handle duplicate events").
pub fn key() -> Json {
    Json::preset(POINTER, SENDER.namespace)
}

/// Stripe's signature: `Stripe-Signature`, of the timestamp and body (the event id is in it).
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use http::request::Parts;

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Secrets, Verifier, VerifyError,
        clock::{fresh, seconds},
        mac::any_matches,
        parse::{from_hex, header},
    };

    /// Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 of
    /// `<t>.<body>` keyed with the endpoint's signing secret (`whsec_…`, used as it is). Any
    /// `v1` matching any secret passes; other schemes (`v0`) are ignored. Tolerance: 5
    /// minutes, as Stripe's libraries. Pair it with [`key::stripe`](crate::key::stripe).
    ///
    /// Source: docs.stripe.com/webhooks ("Verify webhook signatures manually").
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
        let header = header(parts, SIGNATURE)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        // As Stripe's libraries: items this scheme does not know, and `v1` values that are
        // not hex, are skipped; one timestamp only.
        for item in header.split(',') {
            match item.trim().split_once('=') {
                Some(("t", t)) if timestamp.is_none() => timestamp = Some(t),
                Some(("t", _)) => return Err(VerifyError::malformed("more than one `t=`")),
                Some(("v1", hex)) => signatures.extend(from_hex(hex).ok()),
                _ => {}
            }
        }
        let t = timestamp.ok_or_else(|| VerifyError::malformed("no `t=` timestamp"))?;
        if signatures.is_empty() {
            return Err(VerifyError::malformed("no `v1=` signature"));
        }
        fresh(seconds(t)?, now, check.tolerance)?;
        any_matches(check, &signatures, &[t.as_bytes(), b".", body])
    }
}
