//! Stripe's signature: `Stripe-Signature`, of the timestamp and body (the event id is in it).

use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::Scheme;
use crate::key::senders::stripe::{SENDER, SIGNATURE};
use crate::verify::{
    Check, Secrets, Verifier, VerifyError,
    clock::{fresh, seconds},
    mac::any_matches,
    parse::{from_hex, header},
};

pub(crate) static SCHEME: Scheme = Scheme {
    sender: &SENDER,
    tolerance: Duration::from_secs(5 * 60),
    check,
};

/// Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 of
/// `<t>.<body>` keyed with the endpoint's signing secret (`whsec_…`, used as it is). Any `v1`
/// matching any secret passes; other schemes (`v0`) are ignored. Tolerance: 5 minutes, as
/// Stripe's libraries. Pair it with [`key::stripe`](crate::key::stripe).
///
/// Source: docs.stripe.com/webhooks ("Verify webhook signatures manually").
///
/// # Panics
///
/// If no secret, or an empty one, is given.
pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
    Verifier::of(&SCHEME, secrets.into())
}

fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let header = header(parts, SIGNATURE)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    // As Stripe's libraries: items this scheme does not know, and `v1` values that are not
    // hex, are skipped; one timestamp only.
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
