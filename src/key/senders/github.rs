//! GitHub: the `X-GitHub-Delivery` id; the `X-Hub-Signature-256` signature.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "x-github-delivery";
pub(crate) const SIGNATURE: &str = "x-hub-signature-256";

pub(crate) static SENDER: Sender = Sender {
    name: "GitHub",
    namespace: "github",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 2,
};

/// GitHub: the `X-GitHub-Delivery` header (a GUID, kept on redelivery), namespace `github`.
///
/// GitHub does not retry on its own; a redelivery asked for by hand "will be the same as in
/// the original delivery" (docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks).
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}
