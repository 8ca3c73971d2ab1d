//! Standard Webhooks (and Svix): the `webhook-id` (or `svix-id`); the `webhook-signature` (or
//! `svix-signature`) signature, of the id, timestamp and body.

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
    scheme: scheme::SCHEME,
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

/// The signatures of Standard Webhooks (and Svix): `webhook-signature` (or `svix-signature`),
/// of the id, timestamp and body, symmetric (`v1`) or asymmetric (`v1a`).
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::{Duration, SystemTime};

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use hmac::Hmac;
    use http::request::Parts;
    use sha2::Sha256;

    use super::{ID, SENDER};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier, VerifyError,
        clock::{fresh, seconds},
        ed25519::{self, PublicKey},
        mac::{matched, signed_by},
        parse::{entries, from_base64, header},
    };

    /// A signed timestamp, at most 5 minutes from now as the specification says; not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check).tolerance(Duration::from_secs(5 * 60));

    /// Standard Webhooks and Svix: `webhook-id`, `webhook-timestamp` and `webhook-signature`
    /// (or the same headers with `svix-`), a space-separated list of signatures of
    /// `<id>.<timestamp>.<body>`, each `<version>,<base64>`:
    ///
    /// - `v1`: HMAC-SHA256 keyed with a secret's bytes, the base64 after `whsec_` (the prefix
    ///   may be left out);
    /// - `v1a`: an Ed25519 signature (64 bytes), checked with a public key given as `whpk_`
    ///   and the base64 of its 32 bytes. Only the sender holds the signing key (`whsk_`), so a
    ///   public key that leaks lets nobody forge a delivery.
    ///
    /// Give the endpoint's keys, one or several of either kind: the prefix says which. Several
    /// keep deliveries passing while one is rotated; the sender, rotating its own, lists a
    /// signature by each. Any listed signature that one of the configured keys verifies
    /// passes. Entries this verifier cannot read (another version, text that does not decode,
    /// a `v1a` that is not 64 bytes) are skipped, and the header is malformed when no entry
    /// is usable; a usable entry of a kind with no configured key is a mismatch. A header that
    /// lists more than 8 entries, of any version, is malformed too, refused before any is
    /// decoded or checked: a sender lists one per secret it signs with. The
    /// timestamp must be within 5 minutes of now, as the specification says. Pair it with
    /// [`key::standard_webhooks`](crate::key::standard_webhooks).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_idempotency::verify;
    ///
    /// // The sender's public key, and the endpoint's secret while `v1` is still signed too.
    /// let verifier = verify::standard_webhooks([
    ///     "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
    ///     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    /// ]);
    /// let (parts, body) = http::Request::post("/webhooks")
    ///     .header("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
    ///     .header("webhook-timestamp", "1614265330")
    ///     .header("webhook-signature", "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==")
    ///     .body(r#"{"test": 2432232314}"#)
    ///     .unwrap()
    ///     .into_parts();
    /// let signed_at = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
    /// assert_eq!(verifier.verify_at(&parts, body.as_bytes(), signed_at), Ok(()));
    /// ```
    ///
    /// Source: the Standard Webhooks specification (github.com/standard-webhooks,
    /// `spec/standard-webhooks.md`, "Signature scheme", "Webhook headers" and "Verifying
    /// webhook authenticity") and docs.svix.com/receiving/verifying-payloads/how-manual.
    ///
    /// # Panics
    ///
    /// If no key is given; if a secret is not base64 after its optional `whsec_` prefix; if a
    /// `whpk_` key is not base64 of 32 bytes that encode a usable Ed25519 public key; or if a
    /// `whsk_` signing key is given, which belongs to the sender alone.
    #[doc(alias = "svix")]
    #[doc(alias = "ed25519")]
    pub fn verifier(keys: impl Into<Secrets>) -> Verifier {
        let Secrets(keys) = keys.into();
        let mut secrets = Vec::new();
        let mut public_keys = Vec::new();
        for key in &keys {
            if let Some(public) = key.strip_prefix(b"whpk_") {
                public_keys.push(public_key_of(public));
            } else {
                secrets.push(secret_of(key));
            }
        }
        Verifier::of_keys(&SENDER, Secrets(secrets), public_keys)
    }

    /// The key of a Standard Webhooks secret: the base64 after its optional `whsec_` prefix.
    fn secret_of(secret: &[u8]) -> Box<[u8]> {
        assert!(
            !secret.starts_with(b"whsk_"),
            "a `whsk_` key signs Standard Webhooks deliveries and stays with the sender: give \
             its `whpk_` public key"
        );
        let secret = secret.strip_prefix(b"whsec_").unwrap_or(secret);
        match BASE64.decode(secret) {
            Ok(key) => key.into(),
            Err(error) => panic!("a Standard Webhooks secret is base64 after `whsec_`: {error}"),
        }
    }

    /// A Standard Webhooks public key: the base64 after `whpk_`.
    fn public_key_of(encoded: &[u8]) -> PublicKey {
        let bytes = BASE64.decode(encoded).unwrap_or_else(|error| {
            panic!("a Standard Webhooks public key is base64 after `whpk_`: {error}")
        });
        PublicKey::from_bytes(&bytes).unwrap_or_else(|reason| {
            panic!("a `whpk_` key is no usable Standard Webhooks public key: {reason}")
        })
    }

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Verdict {
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
        // Counted before anything is decoded: each entry may cost a check of the body.
        let listed = entries(header(parts, &named("signature"))?, ' ', |_| true)?;
        // As Stripe's: entries of other versions, and entries that do not decode, are
        // skipped, so that any signature that verifies passes whatever else is listed.
        let mut known = false;
        let mut symmetric = Vec::new();
        let mut asymmetric = Vec::new();
        for entry in listed {
            if let Some(signature) = entry.strip_prefix("v1,") {
                known = true;
                symmetric.extend(from_base64(signature).ok().filter(|s| !s.is_empty()));
            } else if let Some(signature) = entry.strip_prefix("v1a,") {
                known = true;
                let decoded = from_base64(signature).ok();
                asymmetric.extend(decoded.as_deref().and_then(ed25519::signature));
            }
        }
        if symmetric.is_empty() && asymmetric.is_empty() {
            return Err(VerifyError::malformed(if known {
                "no `v1,` or `v1a,` signature can be read"
            } else {
                "no `v1,` or `v1a,` signature"
            }));
        }
        fresh(seconds(timestamp)?, now, check.tolerance)?;
        let content = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        // The HMAC first, the cheaper.
        matched(
            signed_by::<Hmac<Sha256>>(check, &symmetric, &content)
                || ed25519::signed_by(check, &asymmetric, &content),
        )
    }

    #[cfg(test)]
    mod tests {
        use std::time::{Duration, UNIX_EPOCH};

        use super::*;
        use crate::key::senders::signature::parse::MAX_SIGNATURES;

        // The Svix documentation's example, and a `v1a` signature of it by RFC 8032's TEST 1
        // key (as in tests/verify.rs).
        const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        const V1: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        const PUBLIC_KEY: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
        const V1A: &str = "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";
        const BODY: &[u8] = br#"{"test": 2432232314}"#;

        fn delivery(family: &str, listed: &str) -> Parts {
            http::Request::post("/")
                .header(format!("{family}-id"), "msg_p5jXN8AQM9LWM0D4loKWxJek")
                .header(format!("{family}-timestamp"), "1614265330")
                .header(format!("{family}-signature"), listed)
                .body(())
                .unwrap()
                .into_parts()
                .0
        }

        /// Entries a verifier skips or that do not match, of every kind: each counts.
        fn decoys(n: usize) -> Vec<String> {
            let kinds = [
                format!("v1,{}", BASE64.encode([7; 32])),
                format!("v1a,{}", BASE64.encode([7; 64])),
                "v2,abc".to_owned(),
                "v1,not*base64!".to_owned(),
                "garbage".to_owned(),
            ];
            kinds.iter().cycle().take(n).cloned().collect()
        }

        /// A sender rotating its secrets lists up to the bound's worth of signatures, the
        /// valid one last, and it passes; one entry more is malformed, in either header
        /// family, for `v1` and `v1a` alike.
        #[test]
        fn a_list_up_to_the_bound_verifies_and_one_more_is_malformed() {
            let now = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
            for (key, valid) in [(SECRET, V1), (PUBLIC_KEY, V1A)] {
                let verifier = verifier(key);
                let configured = verifier.only_check();
                for family in ["webhook", "svix"] {
                    let listed = |n: usize| {
                        let mut entries = decoys(n - 1);
                        entries.push(valid.to_owned());
                        delivery(family, &entries.join(" "))
                    };
                    let full = listed(MAX_SIGNATURES);
                    assert_eq!(check(configured, &full, BODY, now), Ok(()), "{family}: {key}");
                    let over = listed(MAX_SIGNATURES + 1);
                    assert_eq!(
                        check(configured, &over, BODY, now),
                        Err(VerifyError::malformed(format!(
                            "it lists {} signature entries; at most {MAX_SIGNATURES} are read",
                            MAX_SIGNATURES + 1
                        ))),
                        "{family}: {key}"
                    );
                }
            }
        }
    }
}
