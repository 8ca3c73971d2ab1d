//! Every sender has a scheme, and each scheme reads the headers its sender's record names.

use http::request::Parts;

use super::*;
use crate::key::senders::{self, Id};
use crate::verify::{Secrets, Verifier, VerifyError};

/// Every scheme, in the order of the sender records.
const SCHEMES: [&Scheme; 7] = [
    &github::SCHEME,
    &shopify::SCHEME,
    &standard_webhooks::SCHEME,
    &twilio::SCHEME,
    &twitch::SCHEME,
    &stripe::SCHEME,
    &slack::SCHEME,
];

fn parts(headers: &[&str]) -> Parts {
    let mut builder = http::Request::post("/").header("content-type", "application/json");
    for name in headers {
        builder = builder.header(*name, "1");
    }
    builder.body(()).unwrap().into_parts().0
}

#[test]
fn every_sender_has_one_scheme() {
    let senders: Vec<_> = SCHEMES.iter().map(|scheme| scheme.sender).collect();
    assert_eq!(senders, senders::ALL);
}

/// Each sender's check reads the signature header that names the sender: asked for one header
/// after another, it asks for that one. A Standard Webhooks check reads the signature header
/// of its id's family.
#[test]
fn each_check_reads_the_signature_header_detection_uses() {
    let now = std::time::SystemTime::now();
    for &scheme in &SCHEMES {
        let sender = scheme.sender;
        let verifier = Verifier::of(scheme, Secrets::from("secret"));
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
                let asked = match (scheme.check)(check, &parts(&headers), b"", now) {
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
