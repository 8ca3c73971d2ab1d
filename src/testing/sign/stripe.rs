//! Stripe: `Stripe-Signature: t=<seconds>,v1=<hex>`, of the timestamp and the body.

use std::time::SystemTime;

use bytes::Bytes;

use super::{Delivery, Secret, hex, hmac_sha256, json_id, signing_time, unix_seconds};

/// Signs deliveries as Stripe does. Made by [`stripe`]; one signer makes any number of
/// deliveries.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign::{self, Stripe};
///
/// let stripe: Stripe = sign::stripe("whsec_x").at(UNIX_EPOCH + Duration::from_secs(1));
/// let (paid, refunded) = (stripe.delivery(r#"{"id":"evt_1"}"#), stripe.delivery(r#"{"id":"evt_2"}"#));
/// assert_ne!(paid.headers()["stripe-signature"], refunded.headers()["stripe-signature"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Stripe {
    secrets: Vec<Secret>,
    at: Option<SystemTime>,
}

/// A signer of Stripe deliveries with the endpoint's signing secret (`whsec_…`, whose text is
/// the key). Its deliveries carry `Stripe-Signature: t=<unix seconds>,v1=<hex>`, the
/// HMAC-SHA256 of `<t>.<body>`, and `Content-Type: application/json`; the event id is the
/// body's `/id`.
///
/// # Panics
///
/// If the secret is empty.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign;
///
/// let delivery = sign::stripe("whsec_test_secret")
///     .at(UNIX_EPOCH + Duration::from_secs(1_492_774_577))
///     .delivery("{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}");
/// assert_eq!(
///     delivery.headers()["stripe-signature"],
///     "t=1492774577,v1=c2f890decbc5ede7c5060bb9a6d31e0626a4342bacb9aeae2adb1bcea72f9812",
/// );
/// ```
pub fn stripe(secret: impl AsRef<[u8]>) -> Stripe {
    Stripe {
        secrets: vec![Secret::new(secret.as_ref(), "Stripe")],
        at: None,
    }
}

impl Stripe {
    /// Signs with this secret too, as Stripe does while an endpoint's secret is rolled: one
    /// `v1=` per secret in the header, any of which a receiver may hold.
    ///
    /// # Panics
    ///
    /// If the secret is empty.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::stripe("whsec_new").and_secret("whsec_old").delivery(r#"{"id":"evt_1"}"#);
    /// let header = delivery.headers()["stripe-signature"].to_str().unwrap();
    /// assert_eq!(header.matches(",v1=").count(), 2);
    /// ```
    pub fn and_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secrets.push(Secret::new(secret.as_ref(), "Stripe"));
        self
    }

    /// Signs as if the clock read `time` (instead of the time of each `delivery`): for
    /// deterministic tests, and for an old delivery.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::stripe("whsec_x").at(UNIX_EPOCH + Duration::from_secs(10)).delivery("{}");
    /// assert!(delivery.headers()["stripe-signature"].to_str().unwrap().starts_with("t=10,"));
    /// ```
    pub fn at(mut self, time: SystemTime) -> Self {
        self.at = Some(time);
        self
    }

    /// The delivery of `body`, signed.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    /// use tower_idempotency::verify;
    ///
    /// let delivery = sign::stripe("whsec_x").delivery(r#"{"id":"evt_1"}"#);
    /// let verifier = verify::stripe("whsec_x");
    /// assert_eq!(verifier.verify_at(&delivery.parts(), delivery.body(), std::time::SystemTime::now()), Ok(()));
    /// assert_eq!(delivery.to_string(), "Stripe delivery of evt_1 (POST /)");
    /// ```
    pub fn delivery(&self, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let t = unix_seconds(signing_time(self.at)).to_string();
        let mut header = format!("t={t}");
        for Secret(key) in &self.secrets {
            let signature = hmac_sha256(key, &[t.as_bytes(), b".", &body]);
            header.push_str(",v1=");
            header.push_str(&hex(&signature));
        }
        let event = json_id(&body, "/id");
        Delivery::signed(
            "Stripe",
            &["stripe-signature"],
            vec![
                ("content-type", "application/json".to_owned()),
                ("stripe-signature", header),
            ],
            body,
            event,
        )
    }
}
