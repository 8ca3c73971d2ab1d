//! GitHub: the `X-GitHub-Delivery` id; the `X-Hub-Signature-256` signature, of the body.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "x-github-delivery";
const SIGNATURE: &str = "x-hub-signature-256";

pub(crate) static SENDER: Sender = Sender {
    name: "GitHub",
    namespace: "github",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 2,
    #[cfg(feature = "verify")]
    scheme: scheme::SCHEME,
};

/// GitHub: the `X-GitHub-Delivery` header (a GUID, kept on redelivery), namespace `github`.
///
/// GitHub does not retry on its own; a redelivery asked for by hand "will be the same as in
/// the original delivery" (docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks).
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}

/// GitHub's signature: `X-Hub-Signature-256`, of the body.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use http::request::Parts;

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier, mac::any_matches, parse::prefixed_hex,
    };

    /// The body alone is signed: no timestamp, and not the URL.
    pub(super) const SCHEME: Scheme = Scheme::new(check);

    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body keyed with the
    /// webhook's secret. The delivery id is not signed: see the [module docs](crate::verify).
    /// Pair it with [`key::github`](crate::key::github).
    ///
    /// Source: docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries.
    ///
    /// # Panics
    ///
    /// If no secret, or an empty one, is given.
    pub fn verifier(secrets: impl Into<Secrets>) -> Verifier {
        Verifier::of(&SENDER, secrets.into())
    }

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Verdict {
        let signature = prefixed_hex(parts, SIGNATURE, "sha256=")?;
        any_matches(check, &[signature], &[body])
    }
}
