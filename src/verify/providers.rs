//! Each sender's signature scheme.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::Hmac;
use http::request::Parts;
use sha2::Sha256;

use super::mac::signed_by;
use super::parse::{from_base64, from_hex, header};
use super::{Check, VerifyError, twilio};
use crate::key::Sender;

pub(super) type HmacSha256 = Hmac<Sha256>;

/// The header that carries the sender's signature.
pub(super) fn signature_header(sender: Sender) -> &'static str {
    match sender {
        Sender::Stripe => "stripe-signature",
        Sender::GitHub => "x-hub-signature-256",
        Sender::Shopify => "x-shopify-hmac-sha256",
        Sender::StandardWebhooks => "webhook-signature",
        Sender::Slack => "x-slack-signature",
        Sender::Twitch => "twitch-eventsub-message-signature",
        Sender::Twilio => "x-twilio-signature",
    }
}

pub(super) fn check(
    check: &Check,
    parts: &Parts,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    match check.sender {
        Sender::Stripe => stripe(check, parts, body, now),
        Sender::GitHub => github(check, parts, body),
        Sender::Shopify => shopify(check, parts, body),
        Sender::StandardWebhooks => standard_webhooks(check, parts, body, now),
        Sender::Slack => slack(check, parts, body, now),
        Sender::Twitch => twitch(check, parts, body, now),
        Sender::Twilio => twilio::check(check, parts, body),
    }
}

fn stripe(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let header = header(parts, "stripe-signature")?;
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

fn github(check: &Check, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
    let header = header(parts, "x-hub-signature-256")?;
    let hex = header
        .strip_prefix("sha256=")
        .ok_or_else(|| VerifyError::malformed("expected `sha256=<hex>`"))?;
    any_matches(check, &[from_hex(hex)?], &[body])
}

fn shopify(check: &Check, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
    let signature = from_base64(header(parts, "x-shopify-hmac-sha256")?)?;
    any_matches(check, &[signature], &[body])
}

fn standard_webhooks(
    check: &Check,
    parts: &Parts,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    // The headers of the family whose id the key presets read: `webhook-id` first. A
    // delivery signed with the other family's headers does not vouch for this id.
    let prefix = if parts.headers.contains_key("webhook-id") {
        "webhook"
    } else {
        "svix"
    };
    let named = |suffix: &str| format!("{prefix}-{suffix}");
    let id = header(parts, &named("id"))?;
    let timestamp = header(parts, &named("timestamp"))?;
    let listed = header(parts, &named("signature"))?;
    // As Stripe's: entries of other versions (`v1a`) and `v1` entries that are not base64 (or
    // empty) are skipped, so that any `v1` that matches passes whatever else is listed.
    let mut listed_v1 = false;
    let signatures: Vec<Vec<u8>> = listed
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .inspect(|_| listed_v1 = true)
        .filter_map(|signature| from_base64(signature).ok())
        .filter(|signature| !signature.is_empty())
        .collect();
    if signatures.is_empty() {
        return Err(VerifyError::malformed(if listed_v1 {
            "no `v1,` signature is base64"
        } else {
            "no `v1,` signature (asymmetric `v1a` signatures are not supported)"
        }));
    }
    fresh(seconds(timestamp)?, now, check.tolerance)?;
    let content = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
    any_matches(check, &signatures, &content)
}

fn slack(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let timestamp = header(parts, "x-slack-request-timestamp")?;
    let hex = header(parts, "x-slack-signature")?
        .strip_prefix("v0=")
        .ok_or_else(|| VerifyError::malformed("expected `v0=<hex>`"))?;
    let signature = from_hex(hex)?;
    fresh(seconds(timestamp)?, now, check.tolerance)?;
    let content = [b"v0:", timestamp.as_bytes(), b":", body];
    any_matches(check, &[signature], &content)
}

fn twitch(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Result<(), VerifyError> {
    let id = header(parts, "twitch-eventsub-message-id")?;
    let timestamp = header(parts, "twitch-eventsub-message-timestamp")?;
    let hex = header(parts, "twitch-eventsub-message-signature")?
        .strip_prefix("sha256=")
        .ok_or_else(|| VerifyError::malformed("expected `sha256=<hex>`"))?;
    let signature = from_hex(hex)?;
    let micros = crate::timestamp::parse_timestamp(timestamp)
        .map_err(|error| VerifyError::malformed(error.to_string()))?;
    fresh(micros.div_euclid(1_000_000), now, check.tolerance)?;
    let content = [id.as_bytes(), timestamp.as_bytes(), body];
    any_matches(check, &[signature], &content)
}

/// Whether any signature is the HMAC-SHA256 of `content` under any of the check's secrets,
/// each comparison in constant time.
fn any_matches(
    check: &Check,
    signatures: &[Vec<u8>],
    content: &[&[u8]],
) -> Result<(), VerifyError> {
    if signed_by::<HmacSha256>(check, signatures, content) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// A Unix timestamp in whole seconds.
fn seconds(text: &str) -> Result<i64, VerifyError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::malformed(
            "the timestamp is not a number of seconds",
        ));
    }
    text.parse()
        .map_err(|_| VerifyError::malformed("the timestamp is out of range"))
}

/// Refuses a timestamp further than `tolerance` from `now`, in either direction.
fn fresh(timestamp: i64, now: SystemTime, tolerance: Duration) -> Result<(), VerifyError> {
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(since) => i128::from(since.as_secs()),
        Err(before) => -i128::from(before.duration().as_secs()),
    };
    let skew = (now - i128::from(timestamp)).unsigned_abs();
    if skew > u128::from(tolerance.as_secs()) {
        return Err(VerifyError::Expired {
            skew_secs: u64::try_from(skew).unwrap_or(u64::MAX),
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

/// The key of a Standard Webhooks secret: the base64 after its optional `whsec_` prefix.
pub(super) fn webhook_secret(secret: &[u8]) -> Box<[u8]> {
    let secret = secret.strip_prefix(b"whsec_").unwrap_or(secret);
    match BASE64.decode(secret) {
        Ok(key) => key.into(),
        Err(error) => panic!("a Standard Webhooks secret is base64 after `whsec_`: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_tolerance() {
        assert_eq!(from_hex("00ff10").unwrap(), [0, 255, 16]);
        assert!(from_hex("0").is_err());
        assert!(from_hex("zz").is_err());
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        let five = Duration::from_secs(300);
        assert!(fresh(1000, at(1300), five).is_ok());
        assert!(fresh(1300, at(1000), five).is_ok(), "skew into the future");
        assert_eq!(
            fresh(1000, at(1301), five),
            Err(VerifyError::Expired {
                skew_secs: 301,
                tolerance_secs: 300
            })
        );
        assert!(fresh(i64::MAX, at(0), five).is_err());
        assert!(seconds("-5").is_err());
        assert!(seconds("99999999999999999999999").is_err());
    }
}
