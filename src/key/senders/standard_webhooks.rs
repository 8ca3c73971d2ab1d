//! Standard Webhooks (and Svix): the `webhook-id` (or `svix-id`); the `webhook-signature` (or
//! `svix-signature`) signature, of the id, timestamp and body.

#[cfg(feature = "verify")]
use std::time::Duration;

use super::{Id, Sender};
use crate::key::{Header, Or};

/// The two header families, each `<family>-id`, `<family>-timestamp`, `<family>-signature`:
/// the specification's, then Svix's.
const ID: &[&str] = &["webhook-id", "svix-id"];
const SIGNATURE: &[&str] = &["webhook-signature", "svix-signature"];

pub(crate) static SENDER: Sender = Sender {
    name: "Standard Webhooks",
    namespace: "standard-webhooks",
    id: Id::Headers(ID),
    signature: SIGNATURE,
    signature_precedence: 6,
    #[cfg(feature = "verify")]
    tolerance: Duration::from_secs(5 * 60),
    #[cfg(feature = "verify")]
    signs_url: false,
    #[cfg(feature = "verify")]
    check: scheme::check,
};

/// Standard Webhooks senders: the `webhook-id` header, or `svix-id` from senders using the
/// Svix-branded headers; namespace `standard-webhooks`.
///
/// Source: the Standard Webhooks specification (github.com/standard-webhooks,
/// `spec/standard-webhooks.md`: "webhook-id: the unique webhook identifier. This is the same
/// on retries"), and docs.svix.com/receiving/verifying-payloads/how-manual.
pub fn key() -> Or<Header, Header> {
    Header::preset(ID[0], SENDER.namespace).or(Header::preset(ID[1], SENDER.namespace))
}

/// The signature of Standard Webhooks (and Svix): `webhook-signature` (or `svix-signature`),
/// of the id, timestamp and body.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use http::request::Parts;

    use super::{ID, SENDER};
    use crate::key::senders::signature::{
        Check, Secrets, Verifier, VerifyError,
        clock::{fresh, seconds},
        mac::any_matches,
        parse::{from_base64, header},
    };

    /// Standard Webhooks and Svix: `webhook-id`, `webhook-timestamp` and `webhook-signature:
    /// v1,<base64> [v1,<base64>…]` (or the same headers with `svix-`), HMAC-SHA256 of
    /// `<id>.<timestamp>.<body>` keyed with the secret's bytes: the base64 after `whsec_`. Any
    /// `v1` matching any secret passes; entries that are not `v1,<base64>` (another version such
    /// as `v1a`, or text that does not decode) are skipped, and the header is malformed only when
    /// no entry is usable. Tolerance: 5 minutes, as the specification. Pair it with
    /// [`key::standard_webhooks`](crate::key::standard_webhooks).
    ///
    /// Source: the Standard Webhooks specification (github.com/standard-webhooks,
    /// `spec/standard-webhooks.md`, "Verifying webhook authenticity") and
    /// docs.svix.com/receiving/verifying-payloads/how-manual.
    ///
    /// # Panics
    ///
    /// If no secret is given, or one is not base64 after its optional `whsec_` prefix.
    #[doc(alias = "svix")]
    pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
        let Secrets(secrets) = secrets.into();
        let decoded = secrets.iter().map(|secret| key_of(secret)).collect();
        Verifier::of(&SENDER, Secrets(decoded))
    }

    /// The key of a Standard Webhooks secret: the base64 after its optional `whsec_` prefix.
    fn key_of(secret: &[u8]) -> Box<[u8]> {
        let secret = secret.strip_prefix(b"whsec_").unwrap_or(secret);
        match BASE64.decode(secret) {
            Ok(key) => key.into(),
            Err(error) => panic!("a Standard Webhooks secret is base64 after `whsec_`: {error}"),
        }
    }

    pub(super) fn check(
        check: &Check,
        parts: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        // The headers of the family whose id the key presets read: `webhook-id` first. A
        // delivery signed with the other family's headers does not vouch for this id.
        let prefix = if parts.headers.contains_key(ID[0]) {
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
}
