//! Slack Events API: the body's `/event_id`; the `X-Slack-Signature` signature.

use super::{Id, Sender};
use crate::key::Json;

const POINTER: &str = "/event_id";
pub(crate) const SIGNATURE: &str = "x-slack-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Slack",
    namespace: "slack",
    id: Id::Body {
        pointer: POINTER,
        // Slack signs its form-encoded slash commands too; they carry no event id.
        if_not_json: Some("a Slack Events API body with an `event_id` (this body is not JSON)"),
    },
    signature: &[SIGNATURE],
    signature_precedence: 1,
};

/// Slack Events API: the body field `/event_id`, namespace `slack`.
///
/// The one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
///
/// Slack retries a failed event three times within minutes, marking each retry with
/// `X-Slack-Retry-Num`; the outer wrapper's `event_id` names the event (api.slack.com/apis/events-api).
pub fn key() -> Json {
    Json::preset(POINTER, SENDER.namespace)
}
