//! Twilio: the `I-Twilio-Idempotency-Token` id; the `X-Twilio-Signature` signature, of the URL
//! it requested and the POST parameters or the body's digest.

use super::{Id, Sender};
use crate::key::Header;

const ID: &str = "i-twilio-idempotency-token";
const SIGNATURE: &str = "x-twilio-signature";

pub(crate) static SENDER: Sender = Sender {
    name: "Twilio",
    namespace: "twilio",
    id: Id::Headers(&[ID]),
    signature: &[SIGNATURE],
    signature_precedence: 5,
    #[cfg(feature = "verify")]
    scheme: scheme::SCHEME,
};

/// Twilio: the `I-Twilio-Idempotency-Token` header, namespace `twilio`.
///
/// Twilio retries a webhook for seconds, not days (twilio.com/docs/usage/webhooks/webhooks-connection-overrides);
/// the IETF Idempotency-Key draft lists this header as Twilio's idempotency token for them.
pub fn key() -> Header {
    Header::preset(ID, SENDER.namespace)
}

/// Twilio's signature: `X-Twilio-Signature`, of the URL it requested and the POST parameters
/// or the body's digest.
#[cfg(feature = "verify")]
pub(crate) mod scheme {
    use std::time::SystemTime;

    use hmac::Hmac;
    use http::request::Parts;
    use sha1::Sha1;
    use sha2::{Digest, Sha256};

    use super::{SENDER, SIGNATURE};
    use crate::key::senders::signature::{
        Check, Scheme, Secrets, Verdict, Verifier, VerifyError,
        mac::{matched, signed_by},
        parse::{from_base64, from_hex, header},
    };

    /// The URL is signed, and no timestamp.
    pub(super) const SCHEME: Scheme = Scheme::new(check).signs_url();

    /// Twilio: `X-Twilio-Signature: <base64>`, HMAC-SHA1 keyed with the account's auth token of
    /// the full URL followed by the POST parameters sorted by name, each name then its value. A
    /// JSON body is signed through the URL's `bodySHA256` parameter instead, which must be the
    /// SHA-256 of the body. The URL is checked with and without the default port, as Twilio's
    /// libraries do. See the [module docs](crate::verify) for the URL behind a proxy
    /// ([`Verifier::public_url`]) and for the unsigned idempotency token. Pair it with
    /// [`key::twilio`](crate::key::twilio).
    ///
    /// Source: twilio.com/docs/usage/webhooks/webhooks-security.
    ///
    /// # Panics
    ///
    /// If no auth token, or an empty one, is given.
    pub fn verifier(auth_tokens: impl Into<Secrets>) -> Verifier {
        Verifier::of(&SENDER, auth_tokens.into())
    }

    pub(super) fn check(check: &Check, parts: &Parts, body: &[u8], _now: SystemTime) -> Verdict {
        let signature = from_base64(header(parts, SIGNATURE)?)?;
        let url = url(check, parts)?;
        let query = parts.uri.query().unwrap_or_default();
        let digest = pairs(query.as_bytes()).find(|(name, _)| name == b"bodySHA256");
        let params = match digest {
            // A JSON (or other non-form) body: the URL alone is signed, and names the body's
            // SHA-256.
            Some((_, expected)) => {
                let expected = from_hex(&String::from_utf8_lossy(&expected))?;
                if Sha256::digest(body).as_slice() != expected.as_slice() {
                    return Err(VerifyError::Mismatch);
                }
                Vec::new()
            }
            None if is_form(parts) => {
                let mut params: Vec<_> = pairs(body).collect();
                params.sort();
                params.dedup();
                params
            }
            // Only the URL is signed (a GET webhook, say): a body would be unsigned content.
            None if body.is_empty() => Vec::new(),
            None => {
                return Err(VerifyError::malformed(
                    "a body that is neither form-encoded nor named by a `bodySHA256` parameter is not signed",
                ));
            }
        };
        let signatures = [signature];
        matched(variants(&url).iter().any(|url| {
            let mut content: Vec<&[u8]> = vec![url.as_bytes()];
            for (name, value) in &params {
                content.extend([name.as_slice(), value.as_slice()]);
            }
            signed_by::<Hmac<Sha1>>(check, &signatures, &content)
        }))
    }

    /// The URL Twilio requested: the configured public base, or `https://` and the `Host`
    /// header, followed by the path and query.
    fn url(check: &Check, parts: &Parts) -> Result<String, VerifyError> {
        let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        if let Some(base) = &check.public_url {
            return Ok(format!("{base}{path}"));
        }
        let host = match parts.uri.authority() {
            Some(authority) => authority.as_str(),
            None => header(parts, "host").map_err(|_| {
                VerifyError::missing("a `Host` header, or a public URL (Verifier::public_url)")
            })?,
        };
        Ok(format!("https://{host}{path}"))
    }

    /// The URL as given, and as Twilio's libraries also accept it: without its port, and, when it
    /// names none, with the scheme's default port (Twilio does not always sign the port it used).
    fn variants(url: &str) -> Vec<String> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
        let (authority, path) = rest
            .find(['/', '?'])
            .map_or((rest, ""), |at| rest.split_at(at));
        let port_at = authority
            .rfind(':')
            .filter(|&colon| !authority[colon..].contains(']'));
        let mut urls = vec![url.to_owned()];
        match port_at {
            Some(colon) => urls.push(format!("{scheme}://{}{path}", &authority[..colon])),
            None => {
                let port = if scheme == "http" { "80" } else { "443" };
                urls.push(format!("{scheme}://{authority}:{port}{path}"));
            }
        }
        urls
    }

    fn is_form(parts: &Parts) -> bool {
        parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded")
            })
    }

    /// `application/x-www-form-urlencoded` pairs, decoded.
    fn pairs(encoded: &[u8]) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        encoded
            .split(|&b| b == b'&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let mut split = pair.splitn(2, |&b| b == b'=');
                let name = decode(split.next().unwrap_or_default());
                let value = decode(split.next().unwrap_or_default());
                (name, value)
            })
    }

    fn decode(encoded: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(encoded.len());
        let mut i = 0;
        while i < encoded.len() {
            match encoded[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < encoded.len() => match (hex(encoded[i + 1]), hex(encoded[i + 2])) {
                    (Some(high), Some(low)) => {
                        out.push(high << 4 | low);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                },
                byte => out.push(byte),
            }
            i += 1;
        }
        out
    }

    fn hex(b: u8) -> Option<u8> {
        char::from(b).to_digit(16).map(|d| d as u8)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn form_decoding() {
            let decoded: Vec<_> = pairs(b"a=1+2&b=%2B%41&c&d=%zz&e=%4").collect();
            assert_eq!(
                decoded,
                [
                    (b"a".to_vec(), b"1 2".to_vec()),
                    (b"b".to_vec(), b"+A".to_vec()),
                    (b"c".to_vec(), b"".to_vec()),
                    (b"d".to_vec(), b"%zz".to_vec()),
                    (b"e".to_vec(), b"%4".to_vec()),
                ]
            );
        }

        #[test]
        fn port_variants() {
            assert_eq!(
                variants("https://example.com/a?b=1"),
                ["https://example.com/a?b=1", "https://example.com:443/a?b=1"]
            );
            assert_eq!(
                variants("https://example.com:443/a"),
                ["https://example.com:443/a", "https://example.com/a"]
            );
            assert_eq!(
                variants("http://example.com:8080/a"),
                ["http://example.com:8080/a", "http://example.com/a"]
            );
            assert_eq!(
                variants("https://[::1]/a"),
                ["https://[::1]/a", "https://[::1]:443/a"]
            );
        }
    }
}
