use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::key::json::{Pointer, seek};

/// The answer, and whether the scan gave it; where it does, serde_json's must be the same.
fn both(body: &[u8], pointer: &str) -> (Option<Found<'static>>, bool) {
    let pointer = Pointer::parse(pointer);
    let quick = find(body, &pointer.tokens).map(owned);
    let slow = seek::find(body, &pointer).map(owned);
    if let Some(found) = &quick {
        assert_eq!(
            slow.as_ref().ok(),
            Some(found),
            "{:?} at {:?}: serde_json says {slow:?}",
            String::from_utf8_lossy(body),
            pointer.source
        );
    }
    let taken = quick.is_some();
    (quick.or(slow.ok()), taken)
}

fn owned(found: Found<'_>) -> Found<'static> {
    match found {
        Found::Text(text) => Found::Text(Cow::Owned(text.into_owned())),
        Found::Absent => Found::Absent,
        Found::Integer(n) => Found::Integer(n),
        Found::Other(kind) => Found::Other(kind),
    }
}

#[test]
fn takes_on_what_senders_send() {
    let body = r#" {"id":"evt_1","object":"event","created":1718000000,"livemode":false,
        "request":{"id":null,"idempotency_key":"ik-\u00e9\n"},"amount":-20.5e-1,
        "data":{"object":{"id":"ch_3","tags":["a","b",[],{}],"description":"Café ☕"}}} "#
        .as_bytes();
    for (pointer, expected) in [
        ("/id", Found::Text("evt_1".into())),
        ("/created", Found::Integer(1718000000)),
        ("/data/object/id", Found::Text("ch_3".into())),
        ("/data/object/tags/1", Found::Text("b".into())),
        ("/data/object/tags/3", Found::Other("an object")),
        ("/data/object/tags", Found::Other("an array")),
        ("/data/object/description", Found::Text("Café ☕".into())),
        ("/livemode", Found::Other("a boolean")),
        ("/request/id", Found::Other("null")),
        ("/missing", Found::Absent),
        ("/id/deeper", Found::Absent),
        ("/data/object/tags/01", Found::Absent),
    ] {
        assert_eq!(both(body, pointer), (Some(expected), true), "{pointer}");
    }
    assert_eq!(
        both(br#"[1, -7, 0]"#, "/1"),
        (Some(Found::Integer(-7)), true)
    );
}

#[test]
fn leaves_to_serde_json_what_it_does_not_take_on() {
    for (body, pointer) in [
        (&br#"{"id":"a\"b"}"#[..], "/id"),
        (br#"{"i\u0064":"a"}"#, "/id"),
        (br#"{"id":1.5}"#, "/id"),
        (br#"{"id":1e400}"#, "/id/x"),
        (br#"{"id":-0}"#, "/id"),
        (br#"{"id":12345678901234567890}"#, "/id"),
        (br#"{"x":"\ud83d\ude00","id":"a"}"#, "/id"),
        (b"{\"x\":\"\xff\",\"id\":\"a\"}", "/id"),
        (br#"{"id":"a"} x"#, "/id"),
        (br#"{"id":"a",}"#, "/id"),
        (br#"{"id":01}"#, "/id"),
        (b"{\"x\":\"a\tb\",\"id\":\"a\"}", "/id"),
        (b"", "/id"),
    ] {
        assert!(
            !both(body, pointer).1,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert!(!both(deep.as_bytes(), "/id").1);
    let deep = format!(r#"{{"x":{}1{},"id":"a"}}"#, "[".repeat(65), "]".repeat(65));
    assert!(!both(deep.as_bytes(), "/id").1);
    let nested = format!(r#"{{"x":{}1{},"id":"a"}}"#, "[".repeat(64), "]".repeat(64));
    assert_eq!(
        both(nested.as_bytes(), "/id"),
        (Some(Found::Text("a".into())), true)
    );
}

fn value() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        "[a-z0-9_]{0,12}",
        "\\PC{0,12}",
        "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{d7ff}\\u{e000}\\u{10000} a\"\\\\/]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e300f64..1.0e300).prop_map(Value::from),
        text.prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("[ab0é~/]{0,2}", inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn pointer() -> impl Strategy<Value = String> {
    proptest::collection::vec("[ab0é~/]{0,2}|0|1|01|-1", 0..4).prop_map(|tokens| {
        tokens
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect()
    })
}

/// A document, or one spoilt: cut short, a byte changed, inserted or removed, or pretty.
fn document() -> impl Strategy<Value = Vec<u8>> {
    (value(), 0usize..6, any::<usize>(), any::<u8>()).prop_map(|(v, how, at, byte)| {
        let mut body = if how == 5 {
            serde_json::to_vec_pretty(&v).unwrap()
        } else {
            serde_json::to_vec(&v).unwrap()
        };
        let at = at % (body.len() + 1);
        match how {
            1 => body.truncate(at),
            2 if at < body.len() => body[at] = byte,
            3 => body.insert(at, byte),
            4 if at < body.len() => {
                body.remove(at);
            }
            _ => {}
        }
        body
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    /// Wherever the scan answers, serde_json answers the same; documents serialised
    /// without escapes in their names are all taken on.
    #[test]
    fn answers_as_serde_json(body in document(), pointer in pointer()) {
        both(&body, &pointer);
    }

    #[test]
    fn answers_as_serde_json_on_any_bytes(body in proptest::collection::vec(any::<u8>(), 0..64), pointer in pointer()) {
        both(&body, &pointer);
    }
}
