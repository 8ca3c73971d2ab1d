//! [`Auto`], which recognises the sender by its headers, and the generic `Idempotency-Key`
//! header it falls back to. The senders themselves are the records of [`senders`](super::senders), which
//! signature verification reads too.

use http::request::Parts;

use super::senders::{ALL, Id, Sender};
use super::{ExtractKey, Header, IdempotencyKey, Json, KeyError};
use std::sync::LazyLock;

/// A client-chosen `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header),
/// namespace `idempotency-key`, read as the draft defines it: an RFC 8941 String (`"abc"`),
/// bare text (`abc`) accepted as the same key ([`Header::structured`]).
pub fn idempotency_key() -> Header {
    Header::preset("idempotency-key", "idempotency-key").structured()
}

/// Recognises the sender by its headers and uses its key, with the sender as namespace.
/// The default extractor of [`IdempotencyLayer::new`](crate::IdempotencyLayer::new). Built by
/// [`auto`].
#[derive(Debug, Clone)]
pub struct Auto {
    /// Each sender's key, in the order of the sender records.
    senders: Box<[SenderKey]>,
    generic: Header,
}

#[derive(Debug, Clone)]
struct SenderKey {
    sender: &'static Sender,
    key: Key,
}

#[derive(Debug, Clone)]
enum Key {
    /// One header, or a family of them: the first present, else the last.
    Headers(Box<[Header]>),
    Body {
        json: Json,
        if_not_json: Option<&'static str>,
    },
}

/// Recognises, in this order: GitHub (`X-GitHub-Delivery`), Shopify (`X-Shopify-Webhook-Id`),
/// Standard Webhooks (`webhook-id`, `svix-id`), Twilio (`I-Twilio-Idempotency-Token`), Twitch
/// (`Twitch-Eventsub-Message-Id`), Stripe (a `Stripe-Signature` header: the key is the body's
/// `/id`), Slack (an `X-Slack-Signature` header: the JSON body's `/event_id`; a slash command's
/// form body has none), then a sender by its signature header alone (its key is then
/// missing), and last a plain `Idempotency-Key` header. The body is read only for Stripe and
/// Slack. A request that carries a sender's id or signature header never falls back to
/// `Idempotency-Key`.
///
/// Slack's one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
pub fn auto() -> Auto {
    let senders = ALL
        .iter()
        .map(|&sender| {
            let key = match sender.id {
                Id::Headers(names) => Key::Headers(
                    names
                        .iter()
                        .map(|name| Header::preset(name, sender.namespace))
                        .collect(),
                ),
                Id::Body {
                    pointer,
                    if_not_json,
                } => Key::Body {
                    json: Json::preset(pointer, sender.namespace),
                    if_not_json,
                },
            };
            SenderKey { sender, key }
        })
        .collect();
    Auto {
        senders,
        generic: idempotency_key(),
    }
}

/// [`ALL`] in the order of [`Sender::signature_precedence`], sorted once: detection by a
/// signature header stops at the first sender whose header is there.
static BY_SIGNATURE: LazyLock<Vec<&'static Sender>> = LazyLock::new(|| {
    let mut senders = ALL.to_vec();
    senders.sort_by_key(|sender| sender.signature_precedence);
    senders
});

/// The sender whose key [`auto`] uses for this request, if any. Signature
/// verification asks the same question, so that the key claimed always belongs to the sender
/// verified.
///
/// A sender's id header names it first, in the order of [`ALL`]; then its signature header,
/// in the order of [`Sender::signature_precedence`]. A request that carries a sender's
/// signature is that sender's, so that a signed delivery stripped of its id header cannot
/// fall through to the generic `Idempotency-Key`.
pub(crate) fn detect(parts: &Parts) -> Option<&'static Sender> {
    let any = |names: &[&str]| names.iter().any(|name| parts.headers.contains_key(*name));
    ALL.iter()
        .copied()
        .find(|sender| matches!(sender.id, Id::Headers(names) if any(names)))
        .or_else(|| {
            BY_SIGNATURE
                .iter()
                .copied()
                .find(|sender| any(sender.signature))
        })
}

enum Detected<'a> {
    Header(&'a Header),
    Body(&'a Json, Option<&'static str>),
    Nothing,
}

impl Auto {
    fn detect(&self, parts: &Parts) -> Detected<'_> {
        let sender = detect(parts)
            .and_then(|sender| self.senders.iter().find(|s| std::ptr::eq(s.sender, sender)));
        match sender.map(|sender| &sender.key) {
            Some(Key::Headers(headers)) => headers
                .iter()
                .find(|header| parts.headers.contains_key(&header.name))
                .or(headers.last())
                .map_or(Detected::Nothing, Detected::Header),
            Some(Key::Body { json, if_not_json }) => Detected::Body(json, *if_not_json),
            None if parts.headers.contains_key(&self.generic.name) => {
                Detected::Header(&self.generic)
            }
            None => Detected::Nothing,
        }
    }
}

impl ExtractKey for Auto {
    fn reads_body(&self, parts: &Parts) -> bool {
        matches!(self.detect(parts), Detected::Body(..))
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        match self.detect(parts) {
            Detected::Header(header) => header.extract(parts, None),
            Detected::Body(json, if_not_json) => match (json.extract(parts, body), if_not_json) {
                (Err(KeyError::NotJson { .. }), Some(expected)) => Err(KeyError::missing(expected)),
                (other, _) => other,
            },
            Detected::Nothing => Err(KeyError::missing(NOTHING)),
        }
    }
}

/// What [`Auto`] expected of a request that names no sender.
const NOTHING: &str = "a webhook id header (X-GitHub-Delivery, X-Shopify-Webhook-Id, webhook-id, \
                       svix-id, I-Twilio-Idempotency-Token, Twitch-Eventsub-Message-Id), a signed \
                       Stripe or Slack body, or an Idempotency-Key header";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::tests::{key, parts};

    #[test]
    fn auto_keys_slack_by_its_signature_and_leaves_forms_keyless() {
        let ex = auto();
        let form = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        // A signed Slack request is Slack's whatever its content type says: its body is read,
        // and a slash command's form has no event id (missing, not 400 "not JSON").
        assert!(ex.reads_body(&form));
        assert!(matches!(
            ex.extract(&form, Some(b"token=x&command=%2Fdeploy")),
            Err(KeyError::Missing { .. })
        ));
        let relabelled = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(
            ex.extract(&relabelled, Some(br#"{"event_id":"Ev1"}"#))
                .unwrap(),
            key("slack", "Ev1")
        );
    }

    #[test]
    fn auto_recognises_each_provider() {
        let ex = auto();
        let cases = [
            ("x-github-delivery", "github"),
            ("x-shopify-webhook-id", "shopify"),
            ("webhook-id", "standard-webhooks"),
            ("svix-id", "standard-webhooks"),
            ("i-twilio-idempotency-token", "twilio"),
            ("twitch-eventsub-message-id", "twitch"),
            ("idempotency-key", "idempotency-key"),
        ];
        for (name, ns) in cases {
            let p = parts(&[(name, "id-1")]);
            assert!(!ex.reads_body(&p), "{name} is a header key");
            assert_eq!(ex.extract(&p, None).unwrap(), key(ns, "id-1"), "{name}");
        }
        let stripe = parts(&[("stripe-signature", "t=1,v1=abc")]);
        assert!(ex.reads_body(&stripe));
        assert_eq!(
            ex.extract(&stripe, Some(br#"{"id":"evt_9","object":"event"}"#))
                .unwrap(),
            key("stripe", "evt_9")
        );
        let slack = parts(&[
            ("x-slack-signature", "v0=abc"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(
            ex.extract(&slack, Some(br#"{"event_id":"Ev1"}"#)).unwrap(),
            key("slack", "Ev1")
        );
        let nothing = ex.extract(&parts(&[("content-type", "application/json")]), None);
        assert!(matches!(nothing, Err(KeyError::Missing { .. })));
        // A provider's own id wins over a generic Idempotency-Key header.
        let both = parts(&[("idempotency-key", "k"), ("x-github-delivery", "g")]);
        assert_eq!(ex.extract(&both, None).unwrap(), key("github", "g"));
    }
    #[test]
    fn a_request_naming_no_sender_is_told_every_sender() {
        let message = NOTHING.to_ascii_lowercase();
        for sender in ALL {
            match sender.id {
                Id::Headers(names) => {
                    for name in names {
                        assert!(message.contains(name), "{name}: {NOTHING}");
                    }
                }
                Id::Body { .. } => {
                    let name = sender.name.to_ascii_lowercase();
                    assert!(message.contains(&name), "{name}: {NOTHING}");
                }
            }
        }
        assert!(message.contains("idempotency-key"));
    }
}
