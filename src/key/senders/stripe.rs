//! Stripe: the event id in the body's `/id`; the `Stripe-Signature` signature, of the
//! timestamp and body.

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
    scheme: scheme::SCHEME,
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
    use std::time::{Duration, SystemTime};

    use http::request::Parts;

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier, VerifyError,
        clock::{fresh, seconds},
        mac::any_matches,
        parse::{entries, from_hex, header},
    };

    /// A signed timestamp, at most 5 minutes from now as in Stripe's libraries; not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check).tolerance(Duration::from_secs(5 * 60));

    /// Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 of
    /// `<t>.<body>` keyed with the endpoint's signing secret (`whsec_…`, used as it is). Any
    /// `v1` matching any secret passes; other schemes (`v0`) are ignored. A header that lists
    /// more than 8 items besides `t=`, of any scheme, is malformed, refused before any is
    /// decoded or checked: Stripe lists one `v1` per secret it signs with. Tolerance: 5
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

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], now: SystemTime) -> Verdict {
        // Every item but the timestamp counted before anything is decoded: each `v1` may
        // cost a check of the body.
        let items = entries(header(parts, SIGNATURE)?, ',', |item| {
            item.split_once('=').map(|(name, _)| name) != Some("t")
        })?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        // As Stripe's libraries: items this scheme does not know, and `v1` values that are
        // not hex, are skipped; one timestamp only.
        for item in items {
            match item.split_once('=') {
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

    #[cfg(test)]
    mod tests {
        use std::time::{Duration, UNIX_EPOCH};

        use super::*;
        use crate::key::senders::signature::parse::MAX_SIGNATURES;

        // stripe-node's test secret and event, as in tests/verify.rs.
        const SECRET: &str = "whsec_test_secret";
        const BODY: &[u8] = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";
        const V1: &str = "v1=c2f890decbc5ede7c5060bb9a6d31e0626a4342bacb9aeae2adb1bcea72f9812";

        fn delivery(items: &[String]) -> Parts {
            let header = format!("t=1492774577,{}", items.join(","));
            http::Request::post("/")
                .header(SIGNATURE, header)
                .body(())
                .unwrap()
                .into_parts()
                .0
        }

        /// Up to the bound's worth of items besides `t=`, the valid `v1` last, passes: other
        /// `v1`s, `v0`s, values that are not hex, items of no scheme each count. One item more
        /// is malformed.
        #[test]
        fn a_list_up_to_the_bound_verifies_and_one_more_is_malformed() {
            let now = UNIX_EPOCH + Duration::from_secs(1_492_774_577);
            let verifier = verifier(SECRET);
            let configured = verifier.only_check();
            let kinds = [
                format!("v1={}", "00".repeat(32)),
                format!("v0={}", "00".repeat(32)),
                "v1=zz".to_owned(),
                "x=y".to_owned(),
            ];
            let listed = |n: usize| {
                let mut items: Vec<_> = kinds.iter().cycle().take(n - 1).cloned().collect();
                items.push(V1.to_owned());
                delivery(&items)
            };
            assert_eq!(
                check(configured, &listed(MAX_SIGNATURES), BODY, now),
                Ok(())
            );
            assert_eq!(
                check(configured, &listed(MAX_SIGNATURES + 1), BODY, now),
                Err(VerifyError::malformed(format!(
                    "it lists {} signature entries; at most {MAX_SIGNATURES} are read",
                    MAX_SIGNATURES + 1
                )))
            );
        }
    }
}
