//! `GET /`: the page, and the policy that lets it run nothing but its own script.

use std::sync::OnceLock;

use axum::body::Body;
use axum::response::Response;
use http::HeaderValue;
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use sha2::{Digest, Sha256};

use super::problem::NO_STORE;

/// The page: plain HTML with one inline script and one inline style, nothing loaded from
/// elsewhere.
const PAGE: &str = include_str!("page.html");

pub(super) async fn page() -> Response {
    let mut res = Response::new(Body::from(PAGE));
    let headers = res.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CONTENT_SECURITY_POLICY, policy().clone());
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, NO_STORE);
    res
}

/// The page's `Content-Security-Policy`: its own script and style by their SHA-256, requests
/// to its own origin, no frames around it, no forms sent anywhere.
fn policy() -> &'static HeaderValue {
    static POLICY: OnceLock<HeaderValue> = OnceLock::new();
    POLICY.get_or_init(|| {
        let policy = format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash_source(inline(PAGE, "script")),
            hash_source(inline(PAGE, "style")),
        );
        HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
    })
}

/// The text of the first `<tag>` element of `page`: what a browser hashes.
fn inline<'a>(page: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    page.split_once(&open)
        .and_then(|(_, rest)| rest.split_once(&close))
        .map_or("", |(text, _)| text)
}

/// A CSP hash source: `sha256-` and the base64 of the digest.
fn hash_source(text: &str) -> String {
    format!("sha256-{}", base64(&Sha256::digest(text.as_bytes())))
}

/// Standard base64 with padding (RFC 4648, section 4).
pub(super) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, byte)| n | u32::from(*byte) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_as_rfc_4648_says() {
        // The test vectors of RFC 4648, section 10.
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (text, encoded) in vectors {
            assert_eq!(base64(text.as_bytes()), encoded, "{text:?}");
        }
    }

    #[test]
    fn the_policy_allows_the_page_own_script_and_style() {
        assert!(inline(PAGE, "script").contains("fetch("));
        assert!(!inline(PAGE, "style").is_empty());
        let policy = policy().to_str().unwrap();
        assert!(policy.contains(&hash_source(inline(PAGE, "script"))));
        assert!(policy.contains("frame-ancestors 'none'"));
        // A hash the browser would compute for the empty script allows nothing of ours.
        assert!(!policy.contains(&hash_source("")));
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_writes_no_html() {
        for outside in ["http:", "https:", "src=", "<link", "@import", "url("] {
            assert!(!PAGE.contains(outside), "page.html has {outside:?}");
        }
        for unsafe_sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!PAGE.contains(unsafe_sink), "page.html uses {unsafe_sink}");
        }
    }
}
