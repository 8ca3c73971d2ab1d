//! Stripe: the event id in the body's `/id`; the `Stripe-Signature` signature.

use super::{Id, Sender};
use crate::key::Json;

const POINTER: &str = "/id";
pub(crate) const SIGNATURE: &str = "stripe-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Stripe",
    namespace: "stripe",
    id: Id::Body {
        pointer: POINTER,
        if_not_json: None,
    },
    signature: &[SIGNATURE],
    signature_precedence: 0,
};

/// Stripe: the event id (`evt_…`) in the body field `/id`, namespace `stripe`.
///
/// Stripe: "Webhook endpoints might occasionally receive the same event more than once. You
/// can guard against duplicated event receipts by logging the event IDs you've processed"
/// (docs.stripe.com/webhooks, "Handle duplicate events").
pub fn key() -> Json {
    Json::preset(POINTER, SENDER.namespace)
}
