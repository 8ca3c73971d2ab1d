//! Standard Webhooks and Svix: `webhook-signature: v1,<base64>` (or `v1a,<base64>`, signed
//! with an Ed25519 key), of the message id, the timestamp and the body.

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
    /// A symmetric secret: `v1`, HMAC-SHA256 keyed with the secret's bytes.
    Symmetric(Box<[u8]>),
    /// An Ed25519 signing key: `v1a`, its signature of the content.
    Asymmetric(Box<ed25519_dalek::SigningKey>),
}

impl Key {
    /// The signature header's entry for `content`.
    fn entry(&self, content: &[&[u8]]) -> String {
        match self {
            Self::Symmetric(secret) => format!("v1,{}", base64(&hmac_sha256(secret, content))),
            Self::Asymmetric(key) => {
                use ed25519_dalek::Signer as _;
                let signature = key.sign(&content.concat());
                format!("v1a,{}", base64(&signature.to_bytes()))
            }
        }
    }
}

/// A signer of Standard Webhooks deliveries with the endpoint's secret, `whsec_` followed by
/// the key in base64 (the prefix is optional). Its deliveries carry `webhook-id`,
/// `webhook-timestamp` (Unix seconds) and `webhook-signature: v1,<base64>`, the HMAC-SHA256 of
/// `<id>.<timestamp>.<body>` keyed with the decoded key, and `Content-Type:
/// application/json`. [`svix`](StandardWebhooks::svix) names the headers as Svix does.
///
/// A key that starts `whsk_` is an Ed25519 signing key instead (the 32 bytes of its seed in
/// base64, or 64 bytes whose first 32 are the seed): its deliveries carry `v1a,<base64>`, the
/// Ed25519 signature of the same content, which a receiver checks with the matching
/// [`public_key`](StandardWebhooks::public_key) (`whpk_…`).
///
/// # Panics
///
/// If the secret is not base64 after its optional `whsec_`, or is empty; or if a `whsk_` key
/// is not base64 of 32 or 64 bytes.
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

/// The key of a `whsec_` secret, or of a `whsk_` signing key.
fn symmetric(secret: &str) -> Key {
    if let Some(encoded) = secret.strip_prefix("whsk_") {
        let bytes = BASE64.decode(encoded).unwrap_or_else(|error| {
            panic!("a Standard Webhooks signing key is base64 after `whsk_`: {error}")
        });
        let seed: [u8; 32] = bytes
            .get(..32)
            .filter(|_| bytes.len() == 32 || bytes.len() == 64)
            .and_then(|seed| seed.try_into().ok())
            .unwrap_or_else(|| {
                panic!(
                    "a Standard Webhooks signing key holds 32 or 64 bytes, not {}",
                    bytes.len()
                )
            });
        return Key::Asymmetric(Box::new(ed25519_dalek::SigningKey::from_bytes(&seed)));
    }
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
    /// Signs with this secret (or `whsk_` signing key) too, as a sender does while the
    /// endpoint's secret is rotated: one entry per key, space-separated, any of which a
    /// receiver may hold.
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

    /// The public key (`whpk_` and the 32 bytes in base64) that checks the `v1a` signatures of
    /// the first `whsk_` signing key given, for the receiver's verifier; `None` when every key
    /// is a `whsec_` secret.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    /// use tower_idempotency::verify;
    ///
    /// // The seed of RFC 8032's first test vector, as a Standard Webhooks signing key.
    /// let sender = sign::standard_webhooks("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=");
    /// let public = sender.public_key().unwrap();
    /// assert_eq!(public, "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=");
    ///
    /// let delivery = sender.delivery("msg_1", "{}");
    /// let header = delivery.headers()["webhook-signature"].to_str().unwrap();
    /// assert!(header.starts_with("v1a,"));
    /// let verifier = verify::standard_webhooks(public.as_str());
    /// assert_eq!(verifier.verify_at(&delivery.parts(), delivery.body(), std::time::SystemTime::now()), Ok(()));
    /// ```
    pub fn public_key(&self) -> Option<String> {
        self.keys.iter().find_map(|key| match key {
            Key::Asymmetric(key) => {
                Some(format!("whpk_{}", base64(key.verifying_key().as_bytes())))
            }
            Key::Symmetric(_) => None,
        })
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
            .field("keys", &format_args!("{} redacted", self.keys.len()))
            .field("at", &self.at)
            .field("svix", &self.svix)
            .finish()
    }
}
