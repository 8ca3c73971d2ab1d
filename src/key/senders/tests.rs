//! The sender records agree with each other, with the key extractors that read them, and with
//! the signature checks they name.

use http::request::Parts;

use super::*;
use crate::key::detect;
use crate::key::{self, ExtractKey, IdempotencyKey};

fn parts(headers: &[&str]) -> Parts {
    let mut builder = http::Request::post("/").header("content-type", "application/json");
    for name in headers {
        builder = builder.header(*name, "1");
    }
    builder.body(()).unwrap().into_parts().0
}

fn id_headers(sender: &Sender) -> &'static [&'static str] {
    match sender.id {
        Id::Headers(names) => names,
        Id::Body { .. } => &[],
    }
}

#[test]
fn the_records_are_distinct_and_complete() {
    for (i, a) in ALL.iter().enumerate() {
        assert!(!a.signature.is_empty(), "{a:?} names its signature header");
        if let Id::Headers(names) = a.id {
            assert!(!names.is_empty(), "{a:?} names its id header");
            assert!(
                a.signature.len() == 1 || a.signature.len() == names.len(),
                "{a:?}: one signature header per id header family"
            );
        }
        for b in &ALL[i + 1..] {
            assert_ne!(a.name, b.name);
            assert_ne!(a.namespace, b.namespace);
            assert_ne!(
                a.signature_precedence, b.signature_precedence,
                "{a:?}, {b:?}"
            );
        }
    }
}

/// Detection by a sender's id header and by its signature header names that same sender.
#[test]
fn each_sender_is_detected_by_its_id_and_by_its_signature() {
    for &sender in ALL {
        for name in id_headers(sender).iter().chain(sender.signature) {
            assert_eq!(detect(&parts(&[name])), Some(sender), "{name}");
        }
    }
    assert_eq!(detect(&parts(&["idempotency-key"])), None);
    assert_eq!(detect(&parts(&[])), None);
}

/// The precedence of detection, as one ordered list of headers: of two headers on one
/// request, the earlier names the sender.
#[test]
fn detection_keeps_its_precedence() {
    const ORDER: [(&str, &str); 14] = [
        ("x-github-delivery", "github"),
        ("x-shopify-webhook-id", "shopify"),
        ("webhook-id", "standard-webhooks"),
        ("svix-id", "standard-webhooks"),
        ("i-twilio-idempotency-token", "twilio"),
        ("twitch-eventsub-message-id", "twitch"),
        ("stripe-signature", "stripe"),
        ("x-slack-signature", "slack"),
        ("x-hub-signature-256", "github"),
        ("x-shopify-hmac-sha256", "shopify"),
        ("twitch-eventsub-message-signature", "twitch"),
        ("x-twilio-signature", "twilio"),
        ("webhook-signature", "standard-webhooks"),
        ("svix-signature", "standard-webhooks"),
    ];
    let every: usize = ALL
        .iter()
        .map(|p| id_headers(p).len() + p.signature.len())
        .sum();
    assert_eq!(
        every,
        ORDER.len(),
        "every sender's headers are in the order"
    );
    for (i, (first, namespace)) in ORDER.iter().enumerate() {
        for (later, _) in &ORDER[i..] {
            let detected = detect(&parts(&[first, later])).map(|p| p.namespace);
            assert_eq!(detected, Some(*namespace), "{first} with {later}");
        }
    }
}

/// Each sender's key preset finds what [`key::auto`] finds for that sender.
#[test]
fn the_presets_and_auto_read_the_same_id() {
    let presets: [(&Sender, Box<dyn ExtractKey>); 7] = [
        (&github::SENDER, Box::new(key::github())),
        (&shopify::SENDER, Box::new(key::shopify())),
        (
            &standard_webhooks::SENDER,
            Box::new(key::standard_webhooks()),
        ),
        (&twilio::SENDER, Box::new(key::twilio())),
        (&twitch::SENDER, Box::new(key::twitch())),
        (&stripe::SENDER, Box::new(key::stripe())),
        (&slack::SENDER, Box::new(key::slack())),
    ];
    assert!(ALL.iter().all(|p| presets.iter().any(|(q, _)| *p == *q)));
    let auto = key::auto();
    for (sender, preset) in &presets {
        let expected = IdempotencyKey::new(sender.namespace, "id-1").unwrap();
        let cases: Vec<(Parts, Option<Vec<u8>>)> = match sender.id {
            Id::Headers(names) => names
                .iter()
                .map(|name| {
                    let mut p = parts(&[]);
                    p.headers.insert(*name, "id-1".parse().unwrap());
                    (p, None)
                })
                .collect(),
            Id::Body { pointer, .. } => {
                let field = pointer.strip_prefix('/').unwrap();
                let body = format!(r#"{{"{field}":"id-1"}}"#).into_bytes();
                vec![(parts(&[sender.signature[0]]), Some(body))]
            }
        };
        for (p, body) in cases {
            assert_eq!(preset.reads_body(&p), body.is_some(), "{sender:?}");
            assert_eq!(auto.reads_body(&p), body.is_some(), "{sender:?}");
            let body = body.as_deref();
            assert_eq!(preset.extract(&p, body), Ok(expected.clone()), "{sender:?}");
            assert_eq!(auto.extract(&p, body), Ok(expected.clone()), "{sender:?}");
        }
    }
}

/// Each sender's check reads the signature header that names the sender: asked for one header
/// after another, it asks for that one. A Standard Webhooks check reads the signature header
/// of its id's family.
#[cfg(feature = "verify")]
#[test]
fn each_check_reads_the_signature_header_detection_uses() {
    use super::signature::{Secrets, Verifier, VerifyError};

    let now = std::time::SystemTime::now();
    for &sender in ALL {
        let verifier = Verifier::of(sender, Secrets::from("secret"));
        let check = verifier.only_check();
        let seeds: Vec<(Vec<&str>, &str)> = match sender.id {
            Id::Headers(names) => names
                .iter()
                .enumerate()
                .map(|(k, name)| {
                    let signature = sender.signature[k.min(sender.signature.len() - 1)];
                    (vec![*name], signature)
                })
                .collect(),
            Id::Body { .. } => vec![(vec![], sender.signature[0])],
        };
        for (mut headers, signature) in seeds {
            let wanted = format!("header `{signature}`");
            loop {
                let asked = match (sender.scheme.check)(check, &parts(&headers), b"", now) {
                    Err(VerifyError::Missing { expected }) if expected == wanted => break,
                    Err(VerifyError::Missing { expected }) => expected,
                    other => panic!("{sender:?} never asks for {wanted}: {other:?}"),
                };
                let name = asked
                    .strip_prefix("header `")
                    .and_then(|rest| rest.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{sender:?} asks for {asked}"));
                assert!(headers.len() < 8, "{sender:?} asks for {headers:?}");
                headers.push(name.to_owned().leak());
            }
        }
    }
}
