//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, of the body.

use bytes::Bytes;

use super::{Delivery, Secret, hex, hmac_sha256};

/// Signs deliveries as GitHub does. Made by [`github`]; one signer makes any number of
/// deliveries.
///
/// ```
/// use tower_idempotency::testing::sign::{self, GitHub};
///
/// let github: GitHub = sign::github("secret");
/// let (a, b) = (github.delivery("d-1", "{}"), github.delivery("d-2", "{}"));
/// // The body alone is signed: the same body, the same signature.
/// assert_eq!(a.headers()["x-hub-signature-256"], b.headers()["x-hub-signature-256"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct GitHub {
    secret: Secret,
}

/// A signer of GitHub deliveries with the webhook's secret. Its deliveries carry the delivery
/// id in `X-GitHub-Delivery`, `X-Hub-Signature-256: sha256=<hex>` (the HMAC-SHA256 of the
/// body) and `Content-Type: application/json`. GitHub signs no time, and not the delivery id.
/// Add the event's name with [`Delivery::header`]`("x-github-event", "push")` where the app
/// reads it.
///
/// # Panics
///
/// If the secret is empty.
///
/// ```
/// use tower_idempotency::testing::sign;
///
/// // The example of GitHub's documentation, "Validating webhook deliveries".
/// let delivery = sign::github("It's a Secret to Everybody").delivery("d-1", "Hello, World!");
/// assert_eq!(
///     delivery.headers()["x-hub-signature-256"],
///     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
/// );
/// ```
pub fn github(secret: impl AsRef<[u8]>) -> GitHub {
    GitHub {
        secret: Secret::new(secret.as_ref(), "GitHub"),
    }
}

impl GitHub {
    /// The delivery `delivery_id` of `body`, signed.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::github("secret").delivery("72d3162e", "{}");
    /// assert_eq!(delivery.headers()["x-github-delivery"], "72d3162e");
    /// assert_eq!(delivery.to_string(), "GitHub delivery of 72d3162e (POST /)");
    /// ```
    pub fn delivery(&self, delivery_id: &str, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let signature = hex(&hmac_sha256(&self.secret.0, &[&body]));
        Delivery::signed(
            "GitHub",
            &["x-hub-signature-256"],
            vec![
                ("content-type", "application/json".to_owned()),
                ("x-github-delivery", delivery_id.to_owned()),
                ("x-hub-signature-256", format!("sha256={signature}")),
            ],
            body,
            Some(delivery_id.to_owned()),
        )
    }
}
