//! Shopify: the `X-Shopify-Webhook-Id` id; the `X-Shopify-Hmac-Sha256` signature.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "x-shopify-webhook-id";
pub(crate) const SIGNATURE: &str = "x-shopify-hmac-sha256";

pub(crate) static SENDER: Sender = Sender {
    name: "Shopify",
    namespace: "shopify",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 3,
};

/// Shopify: the `X-Shopify-Webhook-Id` header, namespace `shopify`.
///
/// Source: shopify.dev/docs/apps/build/webhooks/delivery-structure, which names this header
/// for detecting duplicates. Shopify's older "ignore duplicates" page names
/// `X-Shopify-Event-Id` instead, which is shared by every subscription fired by one merchant
/// action; use `key::header("x-shopify-event-id").namespace("shopify")` to dedupe per action.
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}
