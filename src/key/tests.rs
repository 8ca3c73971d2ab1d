use http::request::Parts;

use super::*;

pub(super) fn parts(headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::post("/");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

pub(super) fn key(ns: &str, value: &str) -> IdempotencyKey {
    IdempotencyKey::new(ns.to_owned(), value).unwrap()
}

#[test]
fn key_validation() {
    assert!(IdempotencyKey::new("ns", "evt_1").is_ok());
    assert!(IdempotencyKey::new("ns", "a".repeat(MAX_KEY_LEN)).is_ok());
    let too_long = IdempotencyKey::new("ns", "a".repeat(MAX_KEY_LEN + 1)).unwrap_err();
    assert!(too_long.to_string().contains("at most 255"), "{too_long}");
    assert!(IdempotencyKey::new("ns", "").is_err());
    assert!(IdempotencyKey::new("ns", "   ").is_err());
    assert!(
        IdempotencyKey::new("ns", "evt_1 ").is_err(),
        "would equal `evt_1` in MySQL"
    );
    assert!(IdempotencyKey::new("ns", " evt_1").is_err());
    assert!(IdempotencyKey::new("ns", "a\u{7}b").is_err());
    assert!(IdempotencyKey::new("", "evt").is_err());
    assert!(
        IdempotencyKey::new("ns", "ключ 1").is_ok(),
        "visible unicode is text"
    );
}

#[test]
fn invisible_format_characters_are_refused_by_name_and_place() {
    let err = IdempotencyKey::new("ns", "evt_\u{202E}1fed").unwrap_err();
    let KeyError::Invalid { reason } = &err else {
        panic!("{err:?}")
    };
    assert!(reason.contains("the key contains U+202E"), "{reason}");
    assert!(reason.contains("override"), "{reason}");
    assert!(reason.contains("at character 5"), "{reason}");
    assert!(
        !reason.contains('\u{202E}'),
        "the message does not repeat it: {reason}"
    );
    for (value, code) in [
        ("evt\u{200B}1", "U+200B"),
        ("\u{FEFF}evt_1", "U+FEFF"),
        ("evt_1\u{200D}", "U+200D"),
        ("evt\u{00AD}1", "U+00AD"),
        ("evt\u{061C}1", "U+061C"),
        ("evt\u{180E}1", "U+180E"),
        ("evt\u{2066}1\u{2069}", "U+2066"),
        ("evt\u{2060}1", "U+2060"),
        ("evt\u{2064}1", "U+2064"),
        ("evt\u{FFFA}1", "U+FFFA"),
        ("evt\u{E0001}1", "U+E0001"),
        ("evt\u{E0041}1", "U+E0041"),
    ] {
        let err = IdempotencyKey::new("ns", value).unwrap_err();
        assert!(err.to_string().contains(code), "{value:?}: {err}");
    }
    let err = IdempotencyKey::new("str\u{200B}ipe".to_owned(), "evt_1").unwrap_err();
    assert!(
        err.to_string().contains("the namespace contains U+200B"),
        "{err}"
    );
    // Visible text next to them is text.
    for visible in ["evt\u{2010}1", "évènement", "ключ", "evt\u{2070}", "日本"] {
        assert!(IdempotencyKey::new("ns", visible).is_ok(), "{visible:?}");
    }
}

#[test]
fn the_format_table_is_ordered_and_covers_its_ranges() {
    for pair in FORMAT_CHARACTERS.windows(2) {
        assert!(pair[0].1 < pair[1].0, "{:?} before {:?}", pair[0], pair[1]);
    }
    for &(first, last, kind) in FORMAT_CHARACTERS {
        assert!(first <= last);
        assert_eq!(format_character(first), Some(kind));
        assert_eq!(format_character(last), Some(kind));
    }
    assert_eq!(format_character('\u{AC}'), None);
    assert_eq!(
        format_character('\u{2065}'),
        None,
        "unassigned, not a format character"
    );
    assert_eq!(format_character('\u{E0080}'), None);
    assert_eq!(format_character(char::MAX), None);
}

#[test]
#[should_panic(expected = "U+202E")]
fn a_namespace_with_a_bidi_override_is_a_configuration_error() {
    let _ = header("x").namespace("acme\u{202E}");
}

/// The checks as they read before the single-pass fast path: `check_text` must agree.
fn check_text_plainly(text: &str, max: usize) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty".into());
    }
    if text.len() > max {
        return Err("long".into());
    }
    if text.trim() != text {
        return Err("whitespace".into());
    }
    if text.chars().any(char::is_control) {
        return Err("control".into());
    }
    if text.chars().any(|c| format_character(c).is_some()) {
        return Err("format".into());
    }
    Ok(())
}

proptest::proptest! {
    #[test]
    fn check_text_agrees_with_the_plain_checks(
        text in proptest::prop_oneof![
            "[ -~]{0,12}",
            "[\\x00-\\x20\\x7e-\\u{a0}a\\u{2028}\\u{3000}é]{0,6}",
            "\\PC{0,8}",
            "[a\\u{ad}\\u{200b}-\\u{2010}\\u{202e}\\u{2065}\\u{feff}\\u{e0041}]{0,6}",
            "[a-z]{250,260}",
        ]
    ) {
        let plain = check_text_plainly(&text, MAX_KEY_LEN);
        let got = check_text("key", &text, MAX_KEY_LEN);
        proptest::prop_assert_eq!(got.is_ok(), plain.is_ok(), "{:?}: {:?}", text, got);
        if let (Err(KeyError::Invalid { reason }), Err(why)) = (got, plain) {
            let word = match why.as_str() {
                "empty" => "is empty",
                "long" => "bytes long",
                "whitespace" => "whitespace",
                "format" => "invisible format character",
                _ => "control",
            };
            proptest::prop_assert!(reason.contains(word), "{:?}: {}", text, reason);
        }
    }
}

#[test]
fn keys_are_equal_by_text_whatever_holds_it() {
    use std::hash::BuildHasher;
    let constant = IdempotencyKey::new("ns", "evt_1").unwrap();
    let owned = IdempotencyKey::new("ns".to_owned(), "evt_1".to_owned()).unwrap();
    let extracted = IdempotencyKey::in_namespace(&Name::Static("ns"), "evt_1").unwrap();
    assert_eq!(constant, owned);
    assert_eq!(constant, extracted);
    let hasher = std::hash::RandomState::new();
    assert_eq!(hasher.hash_one(&constant), hasher.hash_one(&owned));
    assert_eq!(constant.cmp(&owned), std::cmp::Ordering::Equal);
    assert!(key("a", "z") < key("b", "a"), "namespace first");
    assert!(key("a", "a") < key("a", "b"));
    assert_ne!(key("ns", "evt_1"), key("ns", "evt_2"));
    assert_eq!(format!("{owned:?}"), "IdempotencyKey(ns/evt_1)");
    assert_eq!(
        format!("{:?}", header("x").namespace("acme".to_owned())),
        format!("{:?}", header("x").namespace("acme")),
        "a namespace prints as its text"
    );
}

#[test]
#[should_panic(expected = "invalid idempotency key namespace")]
fn empty_namespace_is_a_configuration_error() {
    let _ = header("x").namespace("");
}
