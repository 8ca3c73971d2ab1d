//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, of the body.

use bytes::Bytes;

use super::{Delivery, Secret, base64, hmac_sha256};

/// Signs deliveries as Shopify does. Made by [`shopify`]; one signer makes any number of
/// deliveries.
///
/// ```
/// use tower_idempotency::testing::sign::{self, Shopify};
///
/// let shopify: Shopify = sign::shopify("secret");
/// let (a, b) = (shopify.delivery("w-1", "{}"), shopify.delivery("w-1", "[]"));
/// assert_ne!(a.headers()["x-shopify-hmac-sha256"], b.headers()["x-shopify-hmac-sha256"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Shopify {
    secret: Secret,
}

/// A signer of Shopify deliveries with the app's client secret. Its deliveries carry the
/// webhook id in `X-Shopify-Webhook-Id`, `X-Shopify-Hmac-Sha256: <base64>` (the HMAC-SHA256
/// of the body) and `Content-Type: application/json`. Shopify signs no time, and not the
/// webhook id.
///
/// # Panics
///
/// If the secret is empty.
///
/// ```
/// use tower_idempotency::testing::sign;
///
/// let delivery = sign::shopify("hush").delivery("b54557e4", r#"{"id":820982911946154508,"email":"jon@doe.ca"}"#);
/// assert_eq!(delivery.headers()["x-shopify-hmac-sha256"], "fp5HwmAHEVGQQwJU1KRpk57Ts2YHF6/TLOCczCtB5bs=");
/// ```
pub fn shopify(secret: impl AsRef<[u8]>) -> Shopify {
    Shopify {
        secret: Secret::new(secret.as_ref(), "Shopify"),
    }
}

impl Shopify {
    /// The delivery `webhook_id` of `body`, signed.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::shopify("hush").delivery("w-1", "{}");
    /// assert_eq!(delivery.headers()["x-shopify-webhook-id"], "w-1");
    /// ```
    pub fn delivery(&self, webhook_id: &str, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let signature = base64(&hmac_sha256(&self.secret.0, &[&body]));
        Delivery::signed(
            "Shopify",
            &["x-shopify-hmac-sha256"],
            vec![
                ("content-type", "application/json".to_owned()),
                ("x-shopify-webhook-id", webhook_id.to_owned()),
                ("x-shopify-hmac-sha256", signature),
            ],
            body,
            Some(webhook_id.to_owned()),
        )
    }
}
