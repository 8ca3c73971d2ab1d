//! Twitch EventSub: the `Twitch-Eventsub-Message-Id`; the `-Signature` signature.

use super::{Id, Sender};
use crate::key::Header;

pub(crate) const ID: &str = "twitch-eventsub-message-id";
pub(crate) const SIGNATURE: &str = "twitch-eventsub-message-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Twitch",
    namespace: "twitch",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 4,
};

/// Twitch EventSub: the `Twitch-Eventsub-Message-Id` header, namespace `twitch`.
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("if you receive a message
/// with the same ID, … you've already processed it").
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}
