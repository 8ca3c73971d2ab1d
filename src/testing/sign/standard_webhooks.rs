//! Standard Webhooks and Svix: `webhook-signature: v1,<base64>`, of the message id, the
//! timestamp and the body.

use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;

use super::{Delivery, base64, hmac_sha256, signing_time, unix_seconds};

/// Signs deliveries as a Standard Webhooks sender (Svix among them) does. Made by
/// [`standard_webhooks`]; one signer makes any number of deliveries.
///
/// ```
/// use tower_idempotency::testing::sign::{self, StandardWebhooks};
///
/// let sender: StandardWebhooks = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
/// let (a, b) = (sender.delivery("msg_1", "{}"), sender.delivery("msg_2", "{}"));
/// // The message id is signed.
/// assert_ne!(a.headers()["webhook-signature"], b.headers()["webhook-signature"]);
/// ```
#[derive(Clone)]
#[must_use]
pub struct StandardWebhooks {
    keys: Vec<Key>,
    at: Option<SystemTime>,
    /// Whether the headers are named `svix-…` rather than `webhook-…`.
    svix: bool,
}

/// One key a delivery is signed with: each gives one entry of the signature header,
/// `<version>,<base64>`.
#[derive(Clone)]
enum Key {
    /// A symmetric secret: `v1`, HMAC-SHA256 keyed with the secret's bytes. (The asymmetric
    /// scheme, `v1a` with Ed25519, would be another kind of key here.)
    Symmetric(Box<[u8]>),
}

impl Key {
    /// The signature header's entry for `content`.
    fn entry(&self, content: &[&[u8]]) -> String {
        match self {
            Self::Symmetric(secret) => format!("v1,{}", base64(&hmac_sha256(secret, content))),
        }
    }
}

/// A signer of Standard Webhooks deliveries with the endpoint's secret, `whsec_` followed by
/// the key in base64 (the prefix is optional). Its deliveries carry `webhook-id`,
/// `webhook-timestamp` (Unix seconds) and `webhook-signature: v1,<base64>`, the HMAC-SHA256 of
/// `<id>.<timestamp>.<body>` keyed with the decoded key, and `Content-Type:
/// application/json`. [`svix`](StandardWebhooks::svix) names the headers as Svix does.
///
/// Only the symmetric `v1` signature is made.
///
/// # Panics
///
/// If the secret is not base64 after its optional `whsec_`, or is empty.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign;
///
/// // The example of Svix's documentation.
/// let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///     .at(UNIX_EPOCH + Duration::from_secs(1_614_265_330))
///     .delivery("msg_p5jXN8AQM9LWM0D4loKWxJek", r#"{"test": 2432232314}"#);
/// assert_eq!(delivery.headers()["webhook-signature"], "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
/// ```
#[doc(alias = "svix")]
pub fn standard_webhooks(secret: &str) -> StandardWebhooks {
    StandardWebhooks {
        keys: vec![symmetric(secret)],
        at: None,
        svix: false,
    }
}

/// The key of a `whsec_` secret.
fn symmetric(secret: &str) -> Key {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = BASE64.decode(encoded).unwrap_or_else(|error| {
        panic!("a Standard Webhooks secret is base64 after `whsec_`: {error}")
    });
    assert!(
        !key.is_empty(),
        "a Standard Webhooks secret cannot be empty"
    );
    Key::Symmetric(key.into())
}

impl StandardWebhooks {
    /// Signs with this secret too, as a sender does while the endpoint's secret is rotated:
    /// one `v1,` entry per secret, space-separated, any of which a receiver may hold.
    ///
    /// # Panics
    ///
    /// As [`standard_webhooks`].
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    ///     .and_secret("whsec_plJ3nmyCDGBKInavdOK15jsl")
    ///     .delivery("msg_1", "{}");
    /// let header = delivery.headers()["webhook-signature"].to_str().unwrap();
    /// assert_eq!(header.split(' ').filter(|entry| entry.starts_with("v1,")).count(), 2);
    /// ```
    pub fn and_secret(mut self, secret: &str) -> Self {
        self.keys.push(symmetric(secret));
        self
    }

    /// Names the headers `svix-id`, `svix-timestamp` and `svix-signature`, as Svix sends them.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").svix().delivery("msg_1", "{}");
    /// assert_eq!(delivery.headers()["svix-id"], "msg_1");
    /// assert!(delivery.headers().get("webhook-id").is_none());
    /// ```
    pub fn svix(mut self) -> Self {
        self.svix = true;
        self
    }

    /// Signs as if the clock read `time` (instead of the time of each `delivery`).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    ///     .at(UNIX_EPOCH + Duration::from_secs(99))
    ///     .delivery("msg_1", "{}");
    /// assert_eq!(delivery.headers()["webhook-timestamp"], "99");
    /// ```
    pub fn at(mut self, time: SystemTime) -> Self {
        self.at = Some(time);
        self
    }

    /// The delivery `message_id` of `body`, signed.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").delivery("msg_1", "{}");
    /// assert_eq!(delivery.headers()["webhook-id"], "msg_1");
    /// assert_eq!(delivery.to_string(), "Standard Webhooks delivery of msg_1 (POST /)");
    /// ```
    pub fn delivery(&self, message_id: &str, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let timestamp = unix_seconds(signing_time(self.at)).to_string();
        let content = [
            message_id.as_bytes(),
            b".",
            timestamp.as_bytes(),
            b".",
            &body,
        ];
        let entries: Vec<String> = self.keys.iter().map(|key| key.entry(&content)).collect();
        let (id, time, signature) = if self.svix {
            ("svix-id", "svix-timestamp", "svix-signature")
        } else {
            ("webhook-id", "webhook-timestamp", "webhook-signature")
        };
        Delivery::signed(
            "Standard Webhooks",
            &["webhook-signature", "svix-signature"],
            vec![
                ("content-type", "application/json".to_owned()),
                (id, message_id.to_owned()),
                (time, timestamp),
                (signature, entries.join(" ")),
            ],
            body,
            Some(message_id.to_owned()),
        )
    }
}

impl std::fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("secrets", &format_args!("{} redacted", self.keys.len()))
            .field("at", &self.at)
            .field("svix", &self.svix)
            .finish()
    }
}
