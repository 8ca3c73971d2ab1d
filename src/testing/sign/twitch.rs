//! Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>`, of the message id, the
//! timestamp and the body.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{Delivery, Secret, hex, hmac_sha256, signing_time};

/// Signs deliveries as Twitch EventSub does. Made by [`twitch`]; one signer makes any number
/// of deliveries.
///
/// ```
/// use tower_idempotency::testing::sign::{self, Twitch};
///
/// let twitch: Twitch = sign::twitch("secret");
/// let (a, b) = (twitch.delivery("m-1", "{}"), twitch.delivery("m-2", "{}"));
/// // The message id is signed.
/// assert_ne!(a.headers()["twitch-eventsub-message-signature"], b.headers()["twitch-eventsub-message-signature"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Twitch {
    secret: Secret,
    at: Option<SystemTime>,
}

/// A signer of Twitch EventSub deliveries with the subscription's secret. Its deliveries carry
/// `Twitch-Eventsub-Message-Id`, `Twitch-Eventsub-Message-Timestamp` (RFC 3339, in
/// nanoseconds), `Twitch-Eventsub-Message-Type: notification`,
/// `Twitch-Eventsub-Message-Signature: sha256=<hex>` (the HMAC-SHA256 of the id, the timestamp
/// and the body, joined as they are) and `Content-Type: application/json`.
///
/// # Panics
///
/// If the secret is empty.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::testing::sign;
///
/// let delivery = sign::twitch("s3cRe7s3cRe7s3cRe7")
///     .at(UNIX_EPOCH + Duration::new(1_573_899_072, 634_234_626))
///     .delivery("e76c6bd4-55c9-4987-8304-da1588d8988b", "{}");
/// assert_eq!(delivery.headers()["twitch-eventsub-message-timestamp"], "2019-11-16T10:11:12.634234626Z");
/// ```
pub fn twitch(secret: impl AsRef<[u8]>) -> Twitch {
    Twitch {
        secret: Secret::new(secret.as_ref(), "Twitch"),
        at: None,
    }
}

impl Twitch {
    /// Signs as if the clock read `time` (instead of the time of each `delivery`).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_idempotency::testing::sign;
    ///
    /// let delivery = sign::twitch("s").at(UNIX_EPOCH + Duration::from_secs(86_400)).delivery("m-1", "{}");
    /// assert_eq!(delivery.headers()["twitch-eventsub-message-timestamp"], "1970-01-02T00:00:00.000000000Z");
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
    /// let delivery = sign::twitch("s").delivery("m-1", "{}");
    /// assert_eq!(delivery.headers()["twitch-eventsub-message-id"], "m-1");
    /// assert_eq!(delivery.headers()["twitch-eventsub-message-type"], "notification");
    /// ```
    pub fn delivery(&self, message_id: &str, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let timestamp = rfc3339(signing_time(self.at));
        let content = [message_id.as_bytes(), timestamp.as_bytes(), &body];
        let signature = hex(&hmac_sha256(&self.secret.0, &content));
        Delivery::signed(
            "Twitch",
            &["twitch-eventsub-message-signature"],
            vec![
                ("content-type", "application/json".to_owned()),
                ("twitch-eventsub-message-id", message_id.to_owned()),
                ("twitch-eventsub-message-timestamp", timestamp),
                ("twitch-eventsub-message-type", "notification".to_owned()),
                (
                    "twitch-eventsub-message-signature",
                    format!("sha256={signature}"),
                ),
            ],
            body,
            Some(message_id.to_owned()),
        )
    }
}

/// `time` in UTC as RFC 3339 with nine fractional digits: `2019-11-16T10:11:12.634234626Z`
/// (the Unix epoch for a time before it).
fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (year, month, day) = civil_date(seconds / 86_400);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        since.subsec_nanos()
    )
}

/// The Gregorian date `days` after 1970-01-01 (the inverse of counting days from the epoch, in
/// 400-year eras that start on 1 March).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468; // days from 0000-03-01
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(59), (1970, 3, 1));
        // 2000 was a leap year, 2100 is not.
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(47_540), (2100, 2, 28));
        assert_eq!(civil_date(47_541), (2100, 3, 1));
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::new(1_700_000_000, 5)),
            "2023-11-14T22:13:20.000000005Z"
        );
    }
}
