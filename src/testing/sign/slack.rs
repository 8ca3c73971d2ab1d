//! Slack: `X-Slack-Signature: v0=<hex>`, of the timestamp and the body.

use std::time::SystemTime;

use bytes::Bytes;

use super::{Delivery, Secret, hex, hmac_sha256, json_id, signing_time, unix_seconds};

/// Signs deliveries as Slack does. Made by [`slack`]; one signer makes any number of
/// deliveries.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign::{self, Slack};
///
/// let slack: Slack = sign::slack("secret");
/// let early = slack.clone().at(UNIX_EPOCH + Duration::from_secs(1)).delivery("{}");
/// let late = slack.at(UNIX_EPOCH + Duration::from_secs(2)).delivery("{}");
/// // The timestamp is signed.
/// assert_ne!(early.headers()["x-slack-signature"], late.headers()["x-slack-signature"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Slack {
    secret: Secret,
    at: Option<SystemTime>,
}

/// A signer of Slack deliveries with the app's signing secret. Its deliveries carry
/// `X-Slack-Request-Timestamp` (Unix seconds), `X-Slack-Signature: v0=<hex>` (the
/// HMAC-SHA256 of `v0:<timestamp>:<body>`) and `Content-Type: application/json`, as the Events
/// API sends; the event id is the body's `/event_id`. For a slash command's form, set
/// [`Delivery::header`]`("content-type", "application/x-www-form-urlencoded")`: the signature
/// covers the bytes, whatever they are.
///
/// # Panics
///
/// If the secret is empty.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign;
///
/// let delivery = sign::slack("secret")
///     .at(UNIX_EPOCH + Duration::from_secs(1_531_420_618))
///     .delivery(r#"{"event_id":"Ev1"}"#);
/// assert_eq!(delivery.headers()["x-slack-request-timestamp"], "1531420618");
/// assert!(delivery.headers()["x-slack-signature"].to_str().unwrap().starts_with("v0="));
/// ```
pub fn slack(secret: impl AsRef<[u8]>) -> Slack {
    Slack {
        secret: Secret::new(secret.as_ref(), "Slack"),
        at: None,
    }
}

impl Slack {
    /// Signs as if the clock read `time` (instead of the time of each `delivery`).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::slack("s").at(UNIX_EPOCH + Duration::from_secs(7)).delivery("{}");
    /// assert_eq!(delivery.headers()["x-slack-request-timestamp"], "7");
    /// ```
    pub fn at(mut self, time: SystemTime) -> Self {
        self.at = Some(time);
        self
    }

    /// The delivery of `body`, signed.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::slack("s").delivery(r#"{"event_id":"Ev1"}"#);
    /// assert_eq!(delivery.to_string(), "Slack delivery of Ev1 (POST /)");
    /// ```
    pub fn delivery(&self, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let timestamp = unix_seconds(signing_time(self.at)).to_string();
        let signature = hmac_sha256(&self.secret.0, &[b"v0:", timestamp.as_bytes(), b":", &body]);
        let event = json_id(&body, "/event_id");
        Delivery::signed(
            "Slack",
            &["x-slack-signature"],
            vec![
                ("content-type", "application/json".to_owned()),
                ("x-slack-request-timestamp", timestamp),
                ("x-slack-signature", format!("v0={}", hex(&signature))),
            ],
            body,
            event,
        )
    }
}
