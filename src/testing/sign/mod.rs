//! Deliveries signed as each sender signs them, for the tests of a receiver.
//!
//! One function per sender that [`verify`](crate::verify) knows, named as there: given the
//! secret, it makes a signer, whose `delivery(..)` takes the body (and the event id, where the
//! sender puts one in a header) and returns the [`Delivery`] the sender would send: its
//! headers, timestamp and signature. The signatures are made here from each sender's
//! published scheme, apart from the crate's verifiers, and checked against the example
//! signatures the senders publish.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use tower_idempotency::testing::{Delivery, sign};
//! use tower_idempotency::verify::{self, VerifyError};
//!
//! let sent = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let stripe = sign::stripe("whsec_test").at(sent);
//! let paid = stripe.delivery(r#"{"id":"evt_1","type":"invoice.paid"}"#);
//! assert!(paid.headers()["stripe-signature"].to_str().unwrap().starts_with("t=1700000000,v1="));
//!
//! let verifier = verify::stripe("whsec_test");
//! let check = |delivery: &Delivery, now| verifier.verify_at(&delivery.parts(), delivery.body(), now);
//! assert_eq!(check(&paid, sent), Ok(()));
//! // What a test of the refusals needs:
//! assert_eq!(check(&paid.tampered(), sent), Err(VerifyError::Mismatch));
//! assert!(matches!(check(&paid.without_signature(), sent), Err(VerifyError::Missing { .. })));
//! assert!(matches!(check(&paid, sent + Duration::from_secs(301)), Err(VerifyError::Expired { .. })));
//! let other = sign::stripe("whsec_other").at(sent).delivery(r#"{"id":"evt_1"}"#);
//! assert_eq!(check(&other, sent), Err(VerifyError::Mismatch));
//! ```
//!
//! | sender | signer | `delivery(..)` takes | clock |
//! |---|---|---|---|
//! | Stripe | [`stripe`]`(secret)` | the body (the event id is its `/id`) | [`Stripe::at`] |
//! | GitHub | [`github`]`(secret)` | the delivery id, the body | — |
//! | Shopify | [`shopify`]`(secret)` | the webhook id, the body | — |
//! | Standard Webhooks, Svix | [`standard_webhooks`]`("whsec_…")` | the message id, the body | [`StandardWebhooks::at`] |
//! | Slack | [`slack`]`(secret)` | the body (the event id is its `/event_id`) | [`Slack::at`] |
//! | Twitch EventSub | [`twitch`]`(secret)` | the message id, the body | [`Twitch::at`] |
//! | Twilio | [`twilio`]`(auth_token, url)` | the idempotency token, the form parameters (or [`Twilio::json_delivery`]) | — |
//!
//! # The variants a test needs
//!
//! - **a genuine delivery**: `delivery(..)`;
//! - **a tampered body**: [`Delivery::tampered`], the same signature over another body;
//! - **no signature**: [`Delivery::without_signature`], the event id without its signature;
//! - **an old timestamp**: a delivery signed at an older time, `.at(then)`, or checked later
//!   with [`Verifier::verify_at`](crate::verify::Verifier::verify_at);
//! - **a wrong or rotated secret**: a signer of another secret; Stripe and Standard Webhooks,
//!   which list one signature per secret while a sender rotates its secret, also sign with a
//!   second one (`and_secret(..)`).
//!
//! A signer without a clock set signs at the time it is asked, `SystemTime::now()`: what an
//! app that verifies with the machine's clock accepts. An event id, a token or a timestamp is sent in a header
//! as it is given: `delivery(..)` panics if it is not a valid header value.

mod github;
mod shopify;
mod slack;
mod standard_webhooks;
mod stripe;
mod twilio;
mod twitch;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::Sha256;

use super::Delivery;
pub use github::{GitHub, github};
pub use shopify::{Shopify, shopify};
pub use slack::{Slack, slack};
pub use standard_webhooks::{StandardWebhooks, standard_webhooks};
pub use stripe::{Stripe, stripe};
pub use twilio::{Twilio, twilio};
pub use twitch::{Twitch, twitch};

/// HMAC-SHA256 of the concatenated `content` under `key`.
fn hmac_sha256(key: &[u8], content: &[&[u8]]) -> Vec<u8> {
    hmac_of::<Hmac<Sha256>>(key, content)
}

/// HMAC-SHA1 of the concatenated `content` under `key` (Twilio's).
fn hmac_sha1(key: &[u8], content: &[&[u8]]) -> Vec<u8> {
    hmac_of::<Hmac<Sha1>>(key, content)
}

/// The HMAC `M` of the concatenated `content` under `key`.
fn hmac_of<M: Mac + KeyInit>(key: &[u8], content: &[&[u8]]) -> Vec<u8> {
    let mut mac = <M as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    for part in content {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// Lower-case hexadecimal.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

/// Standard base64, padded.
fn base64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Whole seconds since the Unix epoch (0 before it).
fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// The time a signer signs at: its clock, or now.
fn signing_time(at: Option<SystemTime>) -> SystemTime {
    at.unwrap_or_else(SystemTime::now)
}

/// The text at a JSON pointer of `body`, if it is JSON and the value is a string: the event id
/// of the senders that put it in the body, for messages.
fn json_id(body: &[u8], pointer: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.pointer(pointer)?.as_str().map(str::to_owned)
}

/// A secret kept for signing, never shown by `Debug`.
#[derive(Clone)]
struct Secret(Box<[u8]>);

impl Secret {
    fn new(secret: &[u8], sender: &str) -> Self {
        assert!(!secret.is_empty(), "a {sender} secret cannot be empty");
        Self(secret.into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::detect;
    use crate::key::senders::ALL;

    /// Each sender the crate verifies has one signer here: the deliveries of the signers, one
    /// each in the order of `ALL`, are detected as those senders' and named after them.
    #[test]
    fn every_sender_has_one_signer() {
        let deliveries = [
            github("secret").delivery("d-1", "{}"),
            shopify("secret").delivery("w-1", "{}"),
            standard_webhooks("whsec_c2VjcmV0").delivery("msg_1", "{}"),
            twilio("secret", "https://example.com/sms").delivery("tok-1", [("Body", "hi")]),
            twitch("secret").delivery("m-1", "{}"),
            stripe("secret").delivery(r#"{"id":"evt_1"}"#),
            slack("secret").delivery(r#"{"event_id":"Ev1"}"#),
        ];
        let senders: Vec<_> = deliveries
            .iter()
            .map(|delivery| {
                detect(&delivery.parts()).unwrap_or_else(|| panic!("{delivery} names no sender"))
            })
            .collect();
        assert_eq!(senders, ALL);
        for (delivery, sender) in deliveries.iter().zip(ALL) {
            let named = format!("{} delivery", sender.name);
            assert!(delivery.to_string().starts_with(&named), "{delivery}");
        }
    }

    #[test]
    fn encodings() {
        assert_eq!(hex(&[0x00, 0xff, 0x1a]), "00ff1a");
        assert_eq!(base64(b"any carnal pleas"), "YW55IGNhcm5hbCBwbGVhcw==");
        // RFC 4231, test case 2.
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // RFC 2202, test case 2.
        assert_eq!(
            hex(&hmac_sha1(b"Jefe", &[b"what do ya want for nothing?"])),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            unix_seconds(UNIX_EPOCH - std::time::Duration::from_secs(5)),
            0
        );
        assert_eq!(
            json_id(br#"{"id":"evt_1"}"#, "/id").as_deref(),
            Some("evt_1")
        );
        assert_eq!(json_id(b"a=1", "/id"), None);
    }
}
