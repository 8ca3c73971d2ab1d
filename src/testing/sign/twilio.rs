//! Twilio: `X-Twilio-Signature: <base64>`, of the URL and the POST parameters (or of the URL
//! naming the body's digest).

use bytes::Bytes;
use http::Uri;
use sha2::{Digest, Sha256};

use super::{Delivery, Secret, base64, hex, hmac_sha1};

/// Signs deliveries as Twilio does. Made by [`twilio`]; one signer makes any number of
/// deliveries to its URL.
///
/// ```
/// use tower_idempotency::testing::sign::{self, Twilio};
///
/// let twilio: Twilio = sign::twilio("token", "https://example.com/sms");
/// let (a, b) = (twilio.delivery("tok-1", [("Body", "a")]), twilio.delivery("tok-2", [("Body", "a")]));
/// // The token is not signed: the same parameters, the same signature.
/// assert_eq!(a.headers()["x-twilio-signature"], b.headers()["x-twilio-signature"]);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Twilio {
    auth_token: Secret,
    url: String,
}

/// A signer of Twilio requests with the account's auth token, for the webhook at `url`: the
/// full URL Twilio requests, scheme, host and query included (`https://example.com/sms`).
/// Twilio signs that URL, so its deliveries go to its path and query, with its host in the
/// `Host` header: a receiver behind a proxy checks it with
/// [`public_url`](crate::verify::Verifier::public_url).
///
/// Its deliveries carry `X-Twilio-Signature: <base64>`, the HMAC-SHA1 of the URL followed by
/// each POST parameter's name and value, sorted by name; the idempotency token is in
/// `I-Twilio-Idempotency-Token`.
///
/// # Panics
///
/// If the auth token is empty, or `url` is not an absolute `http` or `https` URL.
///
/// ```
/// use tower_idempotency::testing::sign;
///
/// // The example of Twilio's documentation, "Webhooks security".
/// let twilio = sign::twilio("12345", "https://mycompany.com/myapp.php?foo=1&bar=2");
/// let call = twilio.delivery("tok-1", [
///     ("CallSid", "CA1234567890ABCDE"),
///     ("Caller", "+14158675309"),
///     ("Digits", "1234"),
///     ("From", "+14158675309"),
///     ("To", "+18005551212"),
/// ]);
/// assert_eq!(call.headers()["x-twilio-signature"], "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
/// assert_eq!(call.headers()["host"], "mycompany.com");
/// assert_eq!(call.uri(), "/myapp.php?foo=1&bar=2");
/// ```
pub fn twilio(auth_token: impl AsRef<[u8]>, url: &str) -> Twilio {
    let parsed: Uri = url
        .parse()
        .unwrap_or_else(|error| panic!("{url:?} is not a URL: {error}"));
    assert!(
        matches!(parsed.scheme_str(), Some("https" | "http")) && parsed.authority().is_some(),
        "Twilio signs the full URL it requests: {url:?} is not an absolute http(s) URL"
    );
    Twilio {
        auth_token: Secret::new(auth_token.as_ref(), "Twilio"),
        url: url.to_owned(),
    }
}

impl Twilio {
    /// A form-encoded request of these POST parameters, the way Twilio sends its webhooks,
    /// with the idempotency token `token`.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let sms = sign::twilio("token", "https://example.com/sms").delivery("tok-1", [("Body", "hi there")]);
    /// assert_eq!(sms.body().as_ref(), b"Body=hi+there");
    /// assert_eq!(sms.headers()["content-type"], "application/x-www-form-urlencoded");
    /// assert_eq!(sms.headers()["i-twilio-idempotency-token"], "tok-1");
    /// ```
    pub fn delivery<K, V>(&self, token: &str, params: impl IntoIterator<Item = (K, V)>) -> Delivery
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut pairs: Vec<(String, String)> = params
            .into_iter()
            .map(|(name, value)| (name.as_ref().to_owned(), value.as_ref().to_owned()))
            .collect();
        let body = pairs
            .iter()
            .map(|(name, value)| format!("{}={}", form_encode(name), form_encode(value)))
            .collect::<Vec<_>>()
            .join("&");
        // Signed in name order; a parameter given twice with one value counts once.
        pairs.sort();
        pairs.dedup();
        let mut content: Vec<&[u8]> = vec![self.url.as_bytes()];
        for (name, value) in &pairs {
            content.extend([name.as_bytes(), value.as_bytes()]);
        }
        let signature = base64(&hmac_sha1(&self.auth_token.0, &content));
        self.signed(
            &self.url,
            token,
            "application/x-www-form-urlencoded",
            signature,
            Bytes::from(body),
        )
    }

    /// A request with a JSON `body`, the way Twilio sends one: the URL gains a `bodySHA256`
    /// parameter, the SHA-256 of the body in hex, and the signature covers that URL alone.
    ///
    /// ```
    /// use tower_idempotency::testing::sign;
    ///
    /// let event = sign::twilio("token", "https://example.com/events").json_delivery("tok-1", "{}");
    /// assert_eq!(
    ///     event.uri(),
    ///     "/events?bodySHA256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    /// );
    /// ```
    pub fn json_delivery(&self, token: &str, body: impl Into<Bytes>) -> Delivery {
        let body = body.into();
        let separator = if self.url.contains('?') { '&' } else { '?' };
        let url = format!(
            "{}{separator}bodySHA256={}",
            self.url,
            hex(&Sha256::digest(&body))
        );
        let signature = base64(&hmac_sha1(&self.auth_token.0, &[url.as_bytes()]));
        self.signed(&url, token, "application/json", signature, body)
    }

    fn signed(
        &self,
        url: &str,
        token: &str,
        content_type: &str,
        signature: String,
        body: Bytes,
    ) -> Delivery {
        let uri: Uri = url.parse().expect("checked by `twilio`");
        let host = uri.authority().expect("checked by `twilio`").to_string();
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), ToString::to_string);
        Delivery::signed(
            "Twilio",
            &["x-twilio-signature"],
            vec![
                ("host", host),
                ("content-type", content_type.to_owned()),
                ("i-twilio-idempotency-token", token.to_owned()),
                ("x-twilio-signature", signature),
            ],
            body,
            Some(token.to_owned()),
        )
        .to(&path)
    }
}

/// `application/x-www-form-urlencoded`: unreserved bytes as they are, a space as `+`, any
/// other byte as `%XX`.
fn form_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                encoded.push(char::from(byte));
            }
            b' ' => encoded.push('+'),
            other => encoded.push_str(&format!("%{other:02X}")),
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(form_encode("+1 415/é"), "%2B1+415%2F%C3%A9");
        assert_eq!(form_encode("a-b.c_d~e"), "a-b.c_d~e");
    }
}
