//! Provider presets. Each names the id the sender keeps the same across its retries.
//!
//! Also [`Auto`], which recognises the sender by its headers, and the crate-internal
//! `detect` that signature verification shares with it.

use http::request::Parts;

use super::{ExtractKey, Header, IdempotencyKey, Json, KeyError, Or};

/// Stripe: the event id (`evt_…`) in the body field `/id`, namespace `stripe`.
///
/// Stripe: "Webhook endpoints might occasionally receive the same event more than once. You
/// can guard against duplicated event receipts by logging the event IDs you've processed"
/// (docs.stripe.com/webhooks, "Handle duplicate events").
pub fn stripe() -> Json {
    Json::preset("/id", "stripe")
}

/// GitHub: the `X-GitHub-Delivery` header (a GUID, kept on redelivery), namespace `github`.
///
/// GitHub does not retry on its own; a redelivery asked for by hand "will be the same as in
/// the original delivery" (docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks).
pub fn github() -> Header {
    Header::preset("x-github-delivery", "github")
}

/// Shopify: the `X-Shopify-Webhook-Id` header, namespace `shopify`.
///
/// Source: shopify.dev/docs/apps/build/webhooks/delivery-structure, which names this header
/// for detecting duplicates. Shopify's older "ignore duplicates" page names
/// `X-Shopify-Event-Id` instead, which is shared by every subscription fired by one merchant
/// action; use `key::header("x-shopify-event-id").namespace("shopify")` to dedupe per action.
pub fn shopify() -> Header {
    Header::preset("x-shopify-webhook-id", "shopify")
}

/// Standard Webhooks senders: the `webhook-id` header, or `svix-id` from senders using the
/// Svix-branded headers; namespace `standard-webhooks`.
///
/// Source: the Standard Webhooks specification (github.com/standard-webhooks,
/// `spec/standard-webhooks.md`: "webhook-id: the unique webhook identifier. This is the same
/// on retries"), and docs.svix.com/receiving/verifying-payloads/how-manual.
pub fn standard_webhooks() -> Or<Header, Header> {
    Header::preset("webhook-id", "standard-webhooks")
        .or(Header::preset("svix-id", "standard-webhooks"))
}

/// Twilio: the `I-Twilio-Idempotency-Token` header, namespace `twilio`.
///
/// Twilio retries a webhook for seconds, not days (twilio.com/docs/usage/webhooks/webhooks-connection-overrides);
/// the IETF Idempotency-Key draft lists this header as Twilio's idempotency token for them.
pub fn twilio() -> Header {
    Header::preset("i-twilio-idempotency-token", "twilio")
}

/// Twitch EventSub: the `Twitch-Eventsub-Message-Id` header, namespace `twitch`.
///
/// Source: dev.twitch.tv/docs/eventsub/handling-webhook-events ("if you receive a message
/// with the same ID, … you've already processed it").
pub fn twitch() -> Header {
    Header::preset("twitch-eventsub-message-id", "twitch")
}

/// Slack Events API: the body field `/event_id`, namespace `slack`.
///
/// The one-time `url_verification` handshake carries no `event_id`: answer it before this
/// layer, or let key-less requests through with
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough).
///
/// Slack retries a failed event three times within minutes, marking each retry with
/// `X-Slack-Retry-Num`; the outer wrapper's `event_id` names the event (api.slack.com/apis/events-api).
pub fn slack() -> Json {
    Json::preset("/event_id", "slack")
}

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
    headers: [Header; 7],
    stripe: Json,
    slack: Json,
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
    Auto {
        headers: [
            github(),
            shopify(),
            Header::preset("webhook-id", "standard-webhooks"),
            Header::preset("svix-id", "standard-webhooks"),
            twilio(),
            twitch(),
            idempotency_key(),
        ],
        stripe: stripe(),
        slack: slack(),
    }
}

/// A webhook sender, as [`auto`] recognises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    GitHub,
    Shopify,
    StandardWebhooks,
    Twilio,
    Twitch,
    Stripe,
    Slack,
}

impl Sender {
    /// The sender's name, as in messages.
    #[cfg_attr(not(feature = "verify"), allow(dead_code))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::GitHub => "GitHub",
            Self::Shopify => "Shopify",
            Self::StandardWebhooks => "Standard Webhooks",
            Self::Twilio => "Twilio",
            Self::Twitch => "Twitch",
            Self::Stripe => "Stripe",
            Self::Slack => "Slack",
        }
    }
}

/// The sender whose key [`auto`] uses for this request, if any. Signature verification asks
/// the same question, so that the key claimed always belongs to the sender verified.
///
/// A sender's id header names it first, in a fixed order; then its signature header. A
/// request that carries a sender's signature is that sender's, so that a signed delivery
/// stripped of its id header cannot fall through to the generic `Idempotency-Key`.
pub(crate) fn detect(parts: &Parts) -> Option<Sender> {
    const BY_HEADER: [(&str, Sender); 12] = [
        ("x-github-delivery", Sender::GitHub),
        ("x-shopify-webhook-id", Sender::Shopify),
        ("webhook-id", Sender::StandardWebhooks),
        ("svix-id", Sender::StandardWebhooks),
        ("i-twilio-idempotency-token", Sender::Twilio),
        ("twitch-eventsub-message-id", Sender::Twitch),
        ("stripe-signature", Sender::Stripe),
        ("x-slack-signature", Sender::Slack),
        ("x-hub-signature-256", Sender::GitHub),
        ("x-shopify-hmac-sha256", Sender::Shopify),
        ("twitch-eventsub-message-signature", Sender::Twitch),
        ("x-twilio-signature", Sender::Twilio),
    ];
    let signed_webhook = || {
        parts.headers.contains_key("webhook-signature")
            || parts.headers.contains_key("svix-signature")
    };
    BY_HEADER
        .iter()
        .find(|(name, _)| parts.headers.contains_key(*name))
        .map(|(_, sender)| *sender)
        .or_else(|| signed_webhook().then_some(Sender::StandardWebhooks))
}

enum Detected<'a> {
    Header(&'a Header),
    Body(&'a Json),
    /// Slack signs its form-encoded slash commands too; they carry no event id.
    Slack(&'a Json),
    Nothing,
}

impl Auto {
    fn detect(&self, parts: &Parts) -> Detected<'_> {
        let [
            github,
            shopify,
            webhook_id,
            svix_id,
            twilio,
            twitch,
            generic,
        ] = &self.headers;
        match detect(parts) {
            Some(Sender::GitHub) => Detected::Header(github),
            Some(Sender::Shopify) => Detected::Header(shopify),
            Some(Sender::StandardWebhooks) if parts.headers.contains_key(&webhook_id.name) => {
                Detected::Header(webhook_id)
            }
            Some(Sender::StandardWebhooks) => Detected::Header(svix_id),
            Some(Sender::Twilio) => Detected::Header(twilio),
            Some(Sender::Twitch) => Detected::Header(twitch),
            Some(Sender::Stripe) => Detected::Body(&self.stripe),
            Some(Sender::Slack) => Detected::Slack(&self.slack),
            None if parts.headers.contains_key(&generic.name) => Detected::Header(generic),
            None => Detected::Nothing,
        }
    }
}

impl ExtractKey for Auto {
    fn reads_body(&self, parts: &Parts) -> bool {
        matches!(self.detect(parts), Detected::Body(_) | Detected::Slack(_))
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        match self.detect(parts) {
            Detected::Header(header) => header.extract(parts, None),
            Detected::Slack(json) => match json.extract(parts, body) {
                Err(KeyError::NotJson { .. }) => Err(KeyError::missing(
                    "a Slack Events API body with an `event_id` (this body is not JSON)",
                )),
                other => other,
            },
            Detected::Body(json) => json.extract(parts, body),
            Detected::Nothing => Err(KeyError::missing(
                "a webhook id header (X-GitHub-Delivery, X-Shopify-Webhook-Id, webhook-id, \
                 svix-id, I-Twilio-Idempotency-Token, Twitch-Eventsub-Message-Id), a signed \
                 Stripe or Slack body, or an Idempotency-Key header",
            )),
        }
    }
}

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
}
