//! GitHub: the `X-GitHub-Delivery` id; the `X-Hub-Signature-256` signature, of the body.

#[cfg(feature = "verify")]
use std::time::Duration;

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
    tolerance: Duration::ZERO,
    #[cfg(feature = "verify")]
    signs_url: false,
    #[cfg(feature = "verify")]
    check: scheme::check,
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
        Check, Secrets, Verifier, VerifyError,
        mac::any_matches,
        parse::{from_hex, header},
    };

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

    pub(super) fn check(
        check: &Check,
        parts: &Parts,
        body: &[u8],
        _now: SystemTime,
    ) -> Result<(), VerifyError> {
        let header = header(parts, SIGNATURE)?;
        let hex = header
            .strip_prefix("sha256=")
            .ok_or_else(|| VerifyError::malformed("expected `sha256=<hex>`"))?;
        any_matches(check, &[from_hex(hex)?], &[body])
    }
}
