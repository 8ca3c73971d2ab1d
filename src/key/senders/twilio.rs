//! Twilio: the `I-Twilio-Idempotency-Token` id; the `X-Twilio-Signature` signature.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "i-twilio-idempotency-token";
pub(crate) const SIGNATURE: &str = "x-twilio-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Twilio",
    namespace: "twilio",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 5,
};

/// Twilio: the `I-Twilio-Idempotency-Token` header, namespace `twilio`.
///
/// Twilio retries a webhook for seconds, not days (twilio.com/docs/usage/webhooks/webhooks-connection-overrides);
/// the IETF Idempotency-Key draft lists this header as Twilio's idempotency token for them.
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}
