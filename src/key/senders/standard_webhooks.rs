//! Standard Webhooks (and Svix): the `webhook-id` (or `svix-id`); the `webhook-signature` (or
//! `svix-signature`) signature.

use super::{Id, Sender};
use crate::key::{Header, Or};

/// The two header families, each `<family>-id`, `<family>-timestamp`, `<family>-signature`:
/// the specification's, then Svix's.
pub(crate) const ID: &[&str] = &["webhook-id", "svix-id"];
const SIGNATURE: &[&str] = &["webhook-signature", "svix-signature"];

pub(crate) static SENDER: Sender = Sender {
    name: "Standard Webhooks",
    namespace: "standard-webhooks",
    id: Id::Headers(ID),
    signature: SIGNATURE,
    signature_precedence: 6,
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
