//! Promise: whatever a sender puts in a delivery, the key extractors and the layer neither
//! panic nor answer 5xx, and every key they accept keeps the key rules (README, "What every
//! delivery gets"; `IdempotencyKey`: non-empty visible text, at most 255 bytes).
//!
//! Property tests (proptest, 256 cases each):
//! - header extractors over arbitrary header bytes: accepted exactly when the value is
//!   visible ASCII, non-blank, at most 255 bytes, and then the key is the value as sent;
//! - `key::json(pointer)` over arbitrary JSON documents and RFC 6901 pointers: the same
//!   verdict as `serde_json::Value::pointer` (absent -> missing; string or integer -> the key;
//!   anything else -> invalid);
//! - `key::json_fields` over the same: the same verdict, field by field;
//! - every body extractor over arbitrary bytes: no panic, accepted keys keep the rules;
//! - string and integer ids round-trip;
//! - the layer with a `MemoryStore` over arbitrary request shapes (method, headers, body)
//!   answers 2xx or 4xx, never 5xx; every 4xx is problem+json; a processed event's
//!   redelivery is a duplicate.

#![cfg(feature = "memory")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use serde_json::Value;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::key::{self, ExtractKey, KeyError, MAX_KEY_LEN};
use tower_idempotency::store::MemoryStore;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Outcome};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The key rules every accepted key keeps.
fn assert_key_rules(key: &IdempotencyKey) {
    let value = key.value();
    assert!(!value.trim().is_empty(), "blank key {key:?}");
    assert_eq!(value.trim(), value, "key with outer whitespace {key:?}");
    assert!(value.len() <= MAX_KEY_LEN, "{} bytes", value.len());
    assert!(!value.chars().any(char::is_control), "control in {key:?}");
    assert!(!key.namespace().is_empty());
}

fn check(result: &Result<IdempotencyKey, KeyError>) {
    match result {
        Ok(key) => assert_key_rules(key),
        Err(err) => assert!(err.status().is_client_error(), "{err:?}"),
    }
}

fn parts_with(headers: &[(&str, &HeaderValue)]) -> Parts {
    let mut req = Request::post("/hook").body(()).unwrap();
    for (name, value) in headers {
        req.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            (*value).clone(),
        );
    }
    req.into_parts().0
}

fn bare_parts() -> Parts {
    Request::post("/hook").body(()).unwrap().into_parts().0
}

/// Header bytes: anything, or mostly visible ASCII (where the interesting edges are).
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        "[ -~\t]{0,300}".prop_map(String::into_bytes),
        "[ -~]{250,260}".prop_map(String::into_bytes),
        Just(Vec::new()),
        "[ \t]{1,4}".prop_map(String::into_bytes),
    ]
}

/// Text for JSON strings: control characters, escapes, multi-byte, lengths about the limit.
fn json_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_]{0,12}",
        "\\PC{0,20}",
        "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f} a~/\"\\\\]{0,8}",
        "[a-z]{250,260}",
        "[é€😀]{60,70}",
        Just(" ".to_owned()),
    ]
}

/// The headers the header extractors under test read.
const HEADER_NAMES: [&str; 5] = [
    "x-event-id",
    "x-github-delivery",
    "webhook-id",
    "svix-id",
    "idempotency-key",
];

/// Object member names and pointer tokens share a small alphabet, so pointers often hit.
const NAMES: &[&str] = &["id", "a", "b", "", "0", "1", "~", "/", "a/b", "m~n", "é"];
const TOKENS: &[&str] = &[
    "id", "a", "b", "", "0", "1", "2", "~", "/", "a/b", "m~n", "é", "00", "01", "+1", "-", " 1",
    "1 ",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e9f64..1.0e9).prop_map(Value::from),
        json_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(NAMES), inner), 0..6).prop_map(
                |members| Value::Object(
                    members
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect()
                )
            ),
        ]
    })
}

/// An RFC 6901 pointer: empty, or `/`-separated escaped tokens.
fn pointer() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(TOKENS), 0..4).prop_map(|tokens| {
        tokens
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect()
    })
}

#[derive(Debug, PartialEq)]
enum Verdict {
    Key(String),
    Missing,
    Invalid,
    NotJson,
    Other,
}

fn verdict(result: Result<IdempotencyKey, KeyError>) -> Verdict {
    match result {
        Ok(key) => {
            assert_key_rules(&key);
            Verdict::Key(key.value().to_owned())
        }
        Err(KeyError::Missing { .. }) => Verdict::Missing,
        Err(KeyError::Invalid { .. }) => Verdict::Invalid,
        Err(KeyError::NotJson { .. }) => Verdict::NotJson,
        Err(_) => Verdict::Other,
    }
}

/// What a field's value makes, per the README: a string or an integer is the key text.
fn field_text(value: Option<&Value>) -> Result<String, Verdict> {
    match value {
        None => Err(Verdict::Missing),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(_) => Err(Verdict::Invalid),
    }
}

fn expected_key(text: String) -> Verdict {
    match IdempotencyKey::new("ns", text.clone()) {
        Ok(_) => Verdict::Key(text),
        Err(_) => Verdict::Invalid,
    }
}

/// RFC 8941 §4.2.5 for a value that is quoted (after the spaces around it): `Some` of the
/// unescaped text, or `Some(None)` when it is no valid String; `None` for a bare value.
fn sf_string_model(text: &str) -> Option<Option<String>> {
    let inner = text.trim_matches(' ').strip_prefix('"')?;
    let mut out = String::new();
    let mut escaped = false;
    for (at, c) in inner.char_indices() {
        if escaped {
            if c != '"' && c != '\\' {
                return Some(None);
            }
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            // Nothing may follow the closing quote: no parameters.
            return Some((at + 1 == inner.len()).then_some(out));
        } else if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            return Some(None);
        }
    }
    Some(None)
}

proptest! {
    #![proptest_config(config())]

    /// Header extractors: accepted exactly when the value is visible, non-blank ASCII of at
    /// most 255 bytes without leading or trailing spaces, and then the key is the value as sent.
    #[test]
    fn header_extractors_accept_exactly_valid_text(bytes in header_bytes()) {
        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            // Not a header value hyper would hand over at all.
            return Ok(());
        };
        let visible = bytes.iter().all(|b| (0x20..0x7f).contains(b));
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let valid = visible
            && !text.trim().is_empty()
            && text.trim() == text
            && bytes.len() <= MAX_KEY_LEN;
        for name in HEADER_NAMES {
            let parts = parts_with(&[(name, &value)]);
            let standard = name == "webhook-id" || name == "svix-id";
            // (extractor's verdict, whether it looks at this header, whether it reads the
            // value as an RFC 8941 String: `Idempotency-Key` in `key::auto()`)
            let results = [
                (key::header(name).extract(&parts, None), true, false),
                (key::auto().extract(&parts, None), name != "x-event-id", name == "idempotency-key"),
                (key::standard_webhooks().extract(&parts, None), standard, false),
                (key::header(name).or(key::json("/id")).extract(&parts, None), true, false),
                (key::header(name).structured().extract(&parts, None), true, true),
            ];
            for (result, applies, structured) in results {
                check(&result);
                // A quoted value read as a String is its unescaped text; anything else, and
                // a bare value, is the value as sent.
                let (valid, expected) = match structured.then(|| sf_string_model(&text)).flatten() {
                    Some(Some(unquoted)) => {
                        (visible && IdempotencyKey::new("ns", unquoted.clone()).is_ok(), unquoted)
                    }
                    Some(None) => (false, String::new()),
                    None => (valid, text.clone()),
                };
                match result {
                    Err(KeyError::Missing { .. }) => prop_assert!(!applies),
                    Ok(key) => {
                        prop_assert!(applies && valid, "accepted {:?}", bytes);
                        prop_assert_eq!(key.value(), expected.as_str());
                    }
                    Err(err) => {
                        prop_assert!(applies && !valid, "refused {:?}: {}", bytes, err);
                        prop_assert!(matches!(err, KeyError::Invalid { .. }), "{:?}", err);
                    }
                }
            }
        }
    }

    /// `key::json(pointer)` reaches the same verdict as `serde_json::Value::pointer`.
    #[test]
    fn json_pointer_agrees_with_serde_json(doc in json_value(), pointer in pointer()) {
        let body = serde_json::to_vec(&doc).unwrap();
        let got = verdict(key::json(&pointer).extract(&bare_parts(), Some(&body)));
        let expected = match field_text(doc.pointer(&pointer)) {
            Ok(text) => expected_key(text),
            Err(verdict) => verdict,
        };
        prop_assert_eq!(got, expected, "pointer {:?} in {}", pointer, doc);
    }

    /// Array indexes in pointers are RFC 6901's: `0` or digits without a leading zero; no sign,
    /// no spaces. (`/+1` once found the second element.)
    #[test]
    fn array_index_tokens_follow_rfc_6901(
        items in proptest::collection::vec("[a-z]{1,4}", 0..12),
        token in "[-+ 0-9a]{0,3}",
    ) {
        let doc = Value::from(items);
        let body = serde_json::to_vec(&doc).unwrap();
        let pointer = format!("/{token}");
        let got = verdict(key::json(&pointer).extract(&bare_parts(), Some(&body)));
        let expected = match field_text(doc.pointer(&pointer)) {
            Ok(text) => expected_key(text),
            Err(verdict) => verdict,
        };
        prop_assert_eq!(got, expected, "pointer {:?} in {}", pointer, doc);
    }

    /// `key::json_fields` reaches the same verdict, field by field, and joins the parts as a
    /// JSON array.
    #[test]
    fn json_fields_agree_with_serde_json(
        doc in json_value(),
        pointers in proptest::collection::vec(pointer(), 1..4),
    ) {
        let body = serde_json::to_vec(&doc).unwrap();
        let got = verdict(key::json_fields(&pointers).extract(&bare_parts(), Some(&body)));
        let mut parts = Vec::new();
        let mut expected = None;
        for pointer in &pointers {
            match field_text(doc.pointer(pointer)) {
                Ok(text) if IdempotencyKey::new("ns", text.clone()).is_ok() => parts.push(text),
                Ok(_) => {
                    expected = Some(Verdict::Invalid);
                    break;
                }
                Err(verdict) => {
                    expected = Some(verdict);
                    break;
                }
            }
        }
        let expected = expected
            .unwrap_or_else(|| expected_key(serde_json::to_string(&parts).unwrap()));
        prop_assert_eq!(got, expected, "pointers {:?} in {}", pointers, doc);
    }

    /// Body extractors over arbitrary bytes (and over JSON-looking bytes): no panic, and an
    /// accepted key keeps the rules.
    #[test]
    fn body_extractors_never_panic(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..512),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            (json_value(), 0usize..64).prop_map(|(v, cut)| {
                let mut b = serde_json::to_vec(&v).unwrap();
                b.truncate(b.len().saturating_sub(cut));
                b
            }),
        ],
    ) {
        let stripe = parts_with(&[("stripe-signature", &HeaderValue::from_static("t=1,v1=x"))]);
        let slack = parts_with(&[
            ("x-slack-signature", &HeaderValue::from_static("v0=x")),
            ("content-type", &HeaderValue::from_static("application/json")),
        ]);
        check(&key::json("/id").extract(&bare_parts(), Some(&bytes)));
        check(&key::json("").extract(&bare_parts(), Some(&bytes)));
        check(&key::json("/a/0/~1").extract(&bare_parts(), Some(&bytes)));
        check(&key::stripe().extract(&bare_parts(), Some(&bytes)));
        check(&key::slack().extract(&bare_parts(), Some(&bytes)));
        check(&key::json_fields(["/id", "/a/0"]).extract(&bare_parts(), Some(&bytes)));
        check(&key::auto().extract(&stripe, Some(&bytes)));
        check(&key::auto().extract(&slack, Some(&bytes)));
    }

    /// String ids are the key as sent; integer ids are their decimal text.
    #[test]
    fn string_and_integer_ids_round_trip(
        text in "[^\\p{Cc}\\p{Cf}]{1,80}".prop_filter("a valid key", |t| {
            !t.trim().is_empty()
                && t.trim() == t
                && t.len() <= MAX_KEY_LEN
                && IdempotencyKey::new("x", t.as_str()).is_ok()
        }),
        signed in any::<i64>(),
        unsigned in any::<u64>(),
    ) {
        let parts = bare_parts();
        let body = serde_json::json!({ "id": text, "type": "x" }).to_string();
        let key = key::stripe().extract(&parts, Some(body.as_bytes())).unwrap();
        prop_assert_eq!(key.value(), text.as_str());
        for n in [Value::from(signed), Value::from(unsigned)] {
            let body = serde_json::json!({ "id": n }).to_string();
            let key = key::stripe().extract(&parts, Some(body.as_bytes())).unwrap();
            prop_assert_eq!(key.value(), n.to_string());
        }
    }

    /// The layer over arbitrary requests: 2xx or 4xx, never 5xx; 4xx is problem+json; a
    /// processed event's redelivery is a duplicate and does not run the handler again.
    #[test]
    fn layer_answers_2xx_or_4xx(request in request_shape()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(layer_case(request));
    }
}

#[derive(Debug, Clone)]
struct Shape {
    route: u8,
    method: &'static str,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
}

fn request_shape() -> impl Strategy<Value = Shape> {
    let names = proptest::sample::select(vec![
        "x-github-delivery",
        "x-shopify-webhook-id",
        "webhook-id",
        "svix-id",
        "idempotency-key",
        "x-event-id",
        "stripe-signature",
        "x-slack-signature",
        "content-type",
        "content-length",
    ]);
    let value = prop_oneof![
        header_bytes(),
        Just(b"application/json".to_vec()),
        "[0-9]{1,8}".prop_map(String::into_bytes),
    ];
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        (json_text(), json_value()).prop_map(|(id, v)| {
            serde_json::to_vec(&serde_json::json!({ "id": id, "event_id": id, "a": [v] })).unwrap()
        }),
        any::<i64>().prop_map(|n| format!(r#"{{"id": {n}, "event_id": {n}}}"#).into_bytes()),
    ];
    (
        0u8..3,
        proptest::sample::select(vec!["POST", "PUT", "GET", "DELETE", "PATCH"]),
        proptest::collection::vec((names, value), 0..4),
        body,
    )
        .prop_map(|(route, method, headers, body)| Shape {
            route,
            method,
            headers,
            body,
        })
}

fn build(shape: &Shape) -> Option<Request<Full<Bytes>>> {
    let mut req = Request::builder().method(shape.method).uri("/hook");
    for (name, value) in &shape.headers {
        req = req.header(*name, HeaderValue::from_bytes(value).ok()?);
    }
    req.body(Full::new(Bytes::from(shape.body.clone()))).ok()
}

async fn layer_case(shape: Shape) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let handler = service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
        let runs = r.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let body = req.into_body().collect().await.unwrap().to_bytes();
            Ok::<_, Infallible>(Response::new(Full::new(body)))
        }
    });
    let store = MemoryStore::new();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let Some(req) = build(&shape) else { return };
        let res = match shape.route {
            0 => {
                IdempotencyLayer::new(store.clone())
                    .body_limit(512)
                    .layer(handler.clone())
                    .oneshot(req)
                    .await
            }
            1 => {
                IdempotencyLayer::new(store.clone())
                    .key(key::stripe())
                    .body_limit(512)
                    .layer(handler.clone())
                    .oneshot(req)
                    .await
            }
            _ => {
                IdempotencyLayer::new(store.clone())
                    .key(key::json_fields(["/id", "/a/0"]).or(key::header("x-event-id")))
                    .body_limit(512)
                    .layer(handler.clone())
                    .oneshot(req)
                    .await
            }
        }
        .unwrap();
        let status = res.status();
        let outcome = *res.extensions().get::<Outcome>().unwrap();
        assert!(
            status.is_success() || status.is_client_error(),
            "{status} for {shape:?}"
        );
        if status.is_client_error() {
            assert_eq!(
                res.headers()["content-type"],
                "application/problem+json",
                "{shape:?}"
            );
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let problem: Value = serde_json::from_slice(&body).expect("problem+json");
            assert_eq!(problem["status"], status.as_u16());
        } else if outcome == Outcome::Processed {
            let body = res.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, shape.body, "the handler read the body as sent");
        }
        answers.push(outcome);
    }
    if answers[0] == Outcome::Processed {
        assert_eq!(answers[1], Outcome::Duplicate, "{shape:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    } else {
        assert_eq!(answers[0], answers[1], "{shape:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
