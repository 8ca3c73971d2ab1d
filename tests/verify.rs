//! Signature verification: each provider against the examples its documentation publishes,
//! the ways a signature fails, and the layer refusing before the claim.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::{Counting, counting_body_service, hmac_sha256_hex};
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_idempotency::store::MemoryStore;
use tower_idempotency::verify::{self, Verifier, VerifyError};
use tower_idempotency::{IdempotencyLayer, key};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut req = Request::post(uri);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(()).unwrap().into_parts().0
}

/// Every way to spoil a valid delivery that a check must refuse.
fn assert_refuses_spoiled(
    verifier: &Verifier,
    headers: &[(&str, &str)],
    uri: &str,
    body: &[u8],
    now: SystemTime,
) {
    let ok = parts(uri, headers);
    assert_eq!(
        verifier.verify_at(&ok, body, now),
        Ok(()),
        "the genuine one passes"
    );
    let mut tampered = body.to_vec();
    tampered.push(b' ');
    assert_eq!(
        verifier.verify_at(&ok, &tampered, now),
        Err(VerifyError::Mismatch),
        "a tampered body"
    );
    for (i, (name, _)) in headers.iter().enumerate() {
        let without: Vec<_> = headers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, h)| *h)
            .collect();
        let result = verifier.verify_at(&parts(uri, &without), body, now);
        assert!(result.is_err(), "without `{name}`: {result:?}");
    }
}

// docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries, "Testing the
// webhook payload validation".
#[test]
fn github_published_example() {
    let secret = "It's a Secret to Everybody";
    let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let headers = [
        ("x-github-delivery", "d-1"),
        ("x-hub-signature-256", signature),
    ];
    let v = verify::github(secret);
    // The delivery id is not signed: only the signature header is needed.
    assert_refuses_spoiled(&v, &headers[1..], "/", b"Hello, World!", SystemTime::now());
    let fresh_id = [("x-github-delivery", "another id"), headers[1]];
    assert_eq!(
        v.verify_at(&parts("/", &fresh_id), b"Hello, World!", SystemTime::now()),
        Ok(()),
        "a captured delivery re-sent with a fresh id passes: the docs say so"
    );
    let wrong = verify::github("another secret");
    assert_eq!(
        wrong.verify_at(&parts("/", &headers), b"Hello, World!", SystemTime::now()),
        Err(VerifyError::Mismatch)
    );
    let rotated = verify::github(["the new secret", secret]);
    assert_eq!(
        rotated.verify_at(&parts("/", &headers), b"Hello, World!", SystemTime::now()),
        Ok(())
    );
    let malformed = [
        ("x-github-delivery", "d-1"),
        ("x-hub-signature-256", "md5=00"),
    ];
    assert!(matches!(
        v.verify_at(&parts("/", &malformed), b"Hello, World!", SystemTime::now()),
        Err(VerifyError::Malformed { .. })
    ));
}

// docs.svix.com/receiving/verifying-payloads/how (all language tabs), also pinned by the
// Standard Webhooks JavaScript library's test "sign function works".
const SVIX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SVIX_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SVIX_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

#[test]
fn standard_webhooks_published_examples() {
    let v = verify::standard_webhooks(SVIX_SECRET);
    for prefix in ["webhook", "svix"] {
        let headers = [
            (format!("{prefix}-id"), "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            (format!("{prefix}-timestamp"), "1614265330"),
            (format!("{prefix}-signature"), SVIX_SIGNATURE),
        ];
        let headers: Vec<_> = headers.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        assert_refuses_spoiled(&v, &headers, "/", SVIX_BODY, at(1_614_265_330));
    }
    // docs.svix.com/receiving/verifying-payloads/how-manual, "Example signatures".
    let manual = verify::standard_webhooks("whsec_plJ3nmyCDGBKInavdOK15jsl");
    let headers = [
        ("webhook-id", "msg_loFOjxBNrRLzqYUf"),
        ("webhook-timestamp", "1731705121"),
        (
            "webhook-signature",
            "v1,rAvfW3dJ/X/qxhsaXPOyyCGmRKsaKWcsNccKXlIktD0=",
        ),
    ];
    let body = br#"{"event_type":"ping","data":{"success":true}}"#;
    assert_refuses_spoiled(&manual, &headers, "/", body, at(1_731_705_121));
}

#[test]
fn standard_webhooks_rotation_tolerance_and_versions() {
    let headers = |signature: &'static str| {
        parts(
            "/",
            &[
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", signature),
            ],
        )
    };
    let now = at(1_614_265_330);
    // Several signatures, the sender signing with an old and a new secret: any one passes.
    let listed = headers(
        "v1a,ZmFrZQ== v1,bm9ldHUjISQlJiooKSstLzAxMjM0NTY3ODk6Ozw9Pj8= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    );
    let v = verify::standard_webhooks(SVIX_SECRET);
    assert_eq!(v.verify_at(&listed, SVIX_BODY, now), Ok(()));
    // Our side rotating: the old secret still listed.
    let rotated = verify::standard_webhooks(["whsec_plJ3nmyCDGBKInavdOK15jsl", SVIX_SECRET]);
    assert_eq!(
        rotated.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, now),
        Ok(())
    );
    // Five minutes either way, then refused.
    assert_eq!(
        v.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, at(1_614_265_630)),
        Ok(())
    );
    assert_eq!(
        v.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, at(1_614_265_631)),
        Err(VerifyError::Expired {
            skew_secs: 301,
            tolerance_secs: 300
        })
    );
    assert!(
        v.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, at(1_614_265_029))
            .is_err()
    );
    let wide = verify::standard_webhooks(SVIX_SECRET).tolerance(Duration::from_secs(3600));
    assert_eq!(
        wide.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, at(1_614_267_000)),
        Ok(())
    );
    // Only an asymmetric entry that is not a signature (4 bytes, not 64): nothing to check.
    assert!(matches!(
        v.verify_at(&headers("v1a,ZmFrZQ=="), SVIX_BODY, now),
        Err(VerifyError::Malformed { .. })
    ));
    // The raw secret text is not the key: the base64 after `whsec_` is.
    let wrong = verify::standard_webhooks("whsec_plJ3nmyCDGBKInavdOK15jsl");
    assert_eq!(
        wrong.verify_at(&headers(SVIX_SIGNATURE), SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
}

/// Standard Webhooks: "any matching `v1` passes", whatever else the header lists. An entry
/// that is not `v1,<base64>` is skipped, before or after the valid one, as Stripe's parser
/// skips bad `v1=` values; only a header with no usable entry at all is malformed (401
/// through the layer).
#[tokio::test]
async fn standard_webhooks_skips_entries_it_cannot_read() {
    let headers = |signature: &str| {
        parts(
            "/",
            &[
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", signature),
            ],
        )
    };
    let now = at(1_614_265_330);
    let v = verify::standard_webhooks(SVIX_SECRET);
    for listed in [
        format!("v1,not*base64! {SVIX_SIGNATURE}"),
        format!("{SVIX_SIGNATURE} v1,not*base64!"),
        format!("v1,%%% garbage v1, {SVIX_SIGNATURE} v2,abc v1,===="),
        format!("  {SVIX_SIGNATURE}  v1a,ZmFrZQ=="),
    ] {
        assert_eq!(
            v.verify_at(&headers(&listed), SVIX_BODY, now),
            Ok(()),
            "{listed}"
        );
    }
    for garbage in [
        "v1,not*base64!",
        "v1,not*base64! v1,%%%",
        "garbage",
        "v1, v1",
    ] {
        let refused = v.verify_at(&headers(garbage), SVIX_BODY, now);
        assert!(
            matches!(refused, Err(VerifyError::Malformed { .. })),
            "{garbage}: {refused:?}"
        );
    }
    // A readable signature that does not match is still a mismatch, not skipped into a pass.
    assert_eq!(
        v.verify_at(&headers("v1,not*base64! v1,ZmFrZQ=="), SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );

    // Through the layer: the garbage-only header is 401 problem+json and claims nothing; the
    // valid one listed after garbage is a delivery (signed in 2021: checked with a wide
    // tolerance).
    let store = Counting::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone()).verify(
        verify::standard_webhooks(SVIX_SECRET).tolerance(Duration::from_secs(100 * 365 * 86_400)),
    );
    let svc = counting_body_service(layer, runs.clone());
    let send = |signature: String| {
        let req = Request::post("/std")
            .header("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
            .header("webhook-timestamp", "1614265330")
            .header("webhook-signature", signature)
            .body(Full::new(Bytes::from_static(SVIX_BODY)))
            .unwrap();
        svc.clone().oneshot(req)
    };
    let refused = send("v1,not*base64! v1,%%%".to_owned()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(store.calls(), 0);
    let passed = send(format!("v1,not*base64! {SVIX_SIGNATURE}"))
        .await
        .unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// Standard Webhooks `v1a`: the specification shows a `v1a` header but publishes no key pair
// behind it. These signatures of the Svix example above (same id, timestamp and body) are
// made with the private keys of RFC 8032's TEST 1 and TEST 2, by OpenSSL and by another
// Ed25519 implementation, which agree; Ed25519 signing is deterministic.
const V1A_KEY: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
const V1A_SIGNATURE: &str =
    "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";
const V1A_OTHER_KEY: &str = "whpk_PUAXw+hDiVqStwqnTRt+vJyYLM8uxJaMwM1V8Sr0Zgw=";
const V1A_OTHER_SIGNATURE: &str =
    "v1a,7anDmyOh9LNskt5GJUTacHmbvyUkT0/S1jnxFAp+h2hcVXnQLWhtWA2+wP6vO0AUwEYP23IIZVuneGRhNj7hDQ==";

/// The Svix example's headers with `signature` in `webhook-signature`.
fn svix_example(signature: &str) -> Parts {
    parts(
        "/",
        &[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", signature),
        ],
    )
}

#[test]
fn standard_webhooks_v1a_signatures() {
    let now = at(1_614_265_330);
    let v = verify::standard_webhooks(V1A_KEY);
    for prefix in ["webhook", "svix"] {
        let headers = [
            (format!("{prefix}-id"), "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            (format!("{prefix}-timestamp"), "1614265330"),
            (format!("{prefix}-signature"), V1A_SIGNATURE),
        ];
        let headers: Vec<_> = headers.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        assert_refuses_spoiled(&v, &headers, "/", SVIX_BODY, now);
    }
    // The id and the timestamp are signed too.
    let other_id = parts(
        "/",
        &[
            ("webhook-id", "msg_another"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", V1A_SIGNATURE),
        ],
    );
    assert_eq!(
        v.verify_at(&other_id, SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
    let other_time = parts(
        "/",
        &[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265331"),
            ("webhook-signature", V1A_SIGNATURE),
        ],
    );
    assert_eq!(
        v.verify_at(&other_time, SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
    // Five minutes, as `v1`.
    let genuine = svix_example(V1A_SIGNATURE);
    assert_eq!(
        v.verify_at(&genuine, SVIX_BODY, at(1_614_265_631)),
        Err(VerifyError::Expired {
            skew_secs: 301,
            tolerance_secs: 300
        })
    );
    // Signed by another key than the one configured.
    assert_eq!(
        verify::standard_webhooks(V1A_OTHER_KEY).verify_at(&genuine, SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
    // Entries of unknown versions are skipped, and so is a `v1a` that is not 64 bytes.
    let listed = svix_example(&format!("v2,abc v1a,ZmFrZQ== {V1A_SIGNATURE} v1a,%%%"));
    assert_eq!(v.verify_at(&listed, SVIX_BODY, now), Ok(()));
}

#[test]
fn standard_webhooks_v1a_rotation_on_either_side() {
    let now = at(1_614_265_330);
    let genuine = svix_example(V1A_SIGNATURE);
    // Ours: the old and the new public key configured, in either order or joined with `or`.
    for v in [
        verify::standard_webhooks([V1A_OTHER_KEY, V1A_KEY]),
        verify::standard_webhooks([V1A_KEY, V1A_OTHER_KEY]),
        verify::standard_webhooks(V1A_OTHER_KEY).or(verify::standard_webhooks(V1A_KEY)),
    ] {
        assert_eq!(v.verify_at(&genuine, SVIX_BODY, now), Ok(()), "{v:?}");
        assert_eq!(
            v.verify_at(&svix_example(V1A_OTHER_SIGNATURE), SVIX_BODY, now),
            Ok(()),
            "{v:?}"
        );
    }
    // The sender's: a signature by each key, space-separated; either key alone passes it.
    let both = svix_example(&format!("{V1A_OTHER_SIGNATURE} {V1A_SIGNATURE}"));
    for key in [V1A_KEY, V1A_OTHER_KEY] {
        assert_eq!(
            verify::standard_webhooks(key).verify_at(&both, SVIX_BODY, now),
            Ok(()),
            "{key}"
        );
    }
}

/// A verifier checks the entries of the kinds it holds keys for: `v1` with `whsec_` secrets,
/// `v1a` with `whpk_` public keys. A header of the other kind only is a mismatch, not a
/// pass; a header with both passes either verifier.
#[test]
fn standard_webhooks_v1_and_v1a_side_by_side() {
    let now = at(1_614_265_330);
    let symmetric = verify::standard_webhooks(SVIX_SECRET);
    let asymmetric = verify::standard_webhooks(V1A_KEY);
    let v1 = svix_example(SVIX_SIGNATURE);
    let v1a = svix_example(V1A_SIGNATURE);
    assert_eq!(
        symmetric.verify_at(&v1a, SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        asymmetric.verify_at(&v1, SVIX_BODY, now),
        Err(VerifyError::Mismatch)
    );
    for mixed in [
        format!("{SVIX_SIGNATURE} {V1A_SIGNATURE}"),
        format!("{V1A_SIGNATURE} {SVIX_SIGNATURE}"),
    ] {
        let mixed = svix_example(&mixed);
        for v in [&symmetric, &asymmetric] {
            assert_eq!(v.verify_at(&mixed, SVIX_BODY, now), Ok(()), "{v:?}");
            let mut tampered = SVIX_BODY.to_vec();
            tampered.push(b' ');
            assert_eq!(
                v.verify_at(&mixed, &tampered, now),
                Err(VerifyError::Mismatch)
            );
        }
    }
    // One verifier holding both kinds, given together or joined: each kind alone passes.
    let together = verify::standard_webhooks([SVIX_SECRET, V1A_KEY]);
    let joined = verify::standard_webhooks(SVIX_SECRET).or(verify::standard_webhooks(V1A_KEY));
    for v in [together, joined] {
        assert_eq!(format!("{v:?}").matches("Standard Webhooks").count(), 1);
        assert!(
            format!("{v:?}").contains("1 secrets, 1 public keys"),
            "{v:?}"
        );
        assert_eq!(v.verify_at(&v1, SVIX_BODY, now), Ok(()));
        assert_eq!(v.verify_at(&v1a, SVIX_BODY, now), Ok(()));
        assert_eq!(
            v.verify_at(&svix_example(V1A_OTHER_SIGNATURE), SVIX_BODY, now),
            Err(VerifyError::Mismatch)
        );
    }
}

/// A key that cannot verify anything is a configuration error, found when the verifier is
/// made, as an empty secret is.
#[test]
fn standard_webhooks_unusable_public_keys_panic() {
    let cases = [
        ("whpk_not*base64", "base64 after `whpk_`"),
        ("whpk_", "32 bytes, not 0"),
        // 31 bytes.
        (
            "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHUQ==",
            "32 bytes, not 31",
        ),
        // y = 2: no point of the curve has it.
        (
            "whpk_AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "no point",
        ),
        // The identity, of order 1.
        (
            "whpk_AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "small order",
        ),
        // The private key of RFC 8032's TEST 1, in the specification's format.
        (
            "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=",
            "stays with the sender",
        ),
    ];
    for (key, expected) in cases {
        let panicked =
            std::panic::catch_unwind(|| verify::standard_webhooks([V1A_KEY, key])).expect_err(key);
        let message = panicked
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panicked.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap();
        assert!(message.contains(expected), "{key}: {message}");
    }
}

/// Through the layer: a forged `v1a` is 401 and claims nothing; the genuine one runs once,
/// and its retry is a duplicate.
#[tokio::test]
async fn standard_webhooks_v1a_through_the_layer() {
    let store = Counting::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    // Signed in 2021: checked with a wide tolerance.
    let layer = IdempotencyLayer::new(store.clone())
        .key(key::standard_webhooks())
        .verify(
            verify::standard_webhooks(V1A_KEY).tolerance(Duration::from_secs(100 * 365 * 86_400)),
        );
    let svc = counting_body_service(layer, runs.clone());
    let send = |signature: &str| {
        let req = Request::post("/std")
            .header("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
            .header("svix-timestamp", "1614265330")
            .header("svix-signature", signature)
            .body(Full::new(Bytes::from_static(SVIX_BODY)))
            .unwrap();
        svc.clone().oneshot(req)
    };
    let forged = send(V1A_OTHER_SIGNATURE).await.unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(forged.headers()["content-type"], "application/problem+json");
    assert_eq!(store.calls(), 0, "a forgery never reaches the store");
    let genuine = send(V1A_SIGNATURE).await.unwrap();
    assert_eq!(genuine.status(), StatusCode::OK);
    assert_eq!(genuine.headers().get("idempotency-outcome"), None);
    let retry = send(V1A_SIGNATURE).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// api.slack.com/authentication/verifying-requests-from-slack, the worked example (also in
// python-slack-sdk's signature verifier test).
#[test]
fn slack_published_example() {
    let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let headers = [
        ("x-slack-request-timestamp", "1531420618"),
        (
            "x-slack-signature",
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
        ),
    ];
    let v = verify::slack("8f742231b10e8888abcd99yyyzzz85a5");
    assert_refuses_spoiled(&v, &headers, "/slack", body, at(1_531_420_618));
    assert!(matches!(
        v.verify_at(&parts("/", &headers), body, at(1_531_420_618 + 301)),
        Err(VerifyError::Expired { .. })
    ));
}

// twilio.com/docs/usage/webhooks/webhooks-security: auth token 12345, the example URL and
// call parameters. The first row is the version pinned by Twilio's own library tests
// (twilio-python tests/unit/test_request_validator.py); the others are the documentation's
// later versions of the same example.
#[test]
fn twilio_published_examples() {
    let examples = [
        (
            "mycompany.com",
            "+14158675309",
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
        ),
        (
            "mycompany.com",
            "+12349013030",
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ=",
        ),
        (
            "example.com",
            "+14158675310",
            "L/OH5YylLD5NRKLltdqwSvS0BnU=",
        ),
    ];
    for (host, number, signature) in examples {
        let body = format!(
            "CallSid=CA1234567890ABCDE&Caller={n}&Digits=1234&From={n}&To=%2B18005551212",
            n = number.replace('+', "%2B")
        );
        let headers = [
            ("host", host),
            ("content-type", "application/x-www-form-urlencoded"),
            ("x-twilio-signature", signature),
        ];
        let v = verify::twilio("12345");
        let ok = parts("/myapp.php?foo=1&bar=2", &headers);
        assert_eq!(
            v.verify_at(&ok, body.as_bytes(), SystemTime::now()),
            Ok(()),
            "{host}"
        );
        // The parameters' order on the wire does not matter: Twilio sorts them.
        let shuffled = body.split('&').rev().collect::<Vec<_>>().join("&");
        assert_eq!(
            v.verify_at(&ok, shuffled.as_bytes(), SystemTime::now()),
            Ok(())
        );
        let tampered = body.replace("Digits=1234", "Digits=9999");
        assert_eq!(
            v.verify_at(&ok, tampered.as_bytes(), SystemTime::now()),
            Err(VerifyError::Mismatch)
        );
        let elsewhere = parts("/myapp.php?foo=1&bar=3", &headers);
        assert_eq!(
            v.verify_at(&elsewhere, body.as_bytes(), SystemTime::now()),
            Err(VerifyError::Mismatch),
            "the URL is signed"
        );
    }
}

#[test]
fn twilio_behind_a_proxy_ports_and_json_bodies() {
    let body = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    let form = ("content-type", "application/x-www-form-urlencoded");
    // Behind a proxy the request reaches us on another host and path prefix.
    let inside = parts(
        "/myapp.php?foo=1&bar=2",
        &[
            ("host", "10.0.0.7:8080"),
            form,
            ("x-twilio-signature", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
        ],
    );
    assert_eq!(
        verify::twilio("12345").verify_at(&inside, body, SystemTime::now()),
        Err(VerifyError::Mismatch)
    );
    let public = verify::twilio("12345").public_url("https://mycompany.com/");
    assert_eq!(public.verify_at(&inside, body, SystemTime::now()), Ok(()));
    // Signed with the default port (twilio-python's test vector): accepted without it.
    let with_port = parts(
        "/myapp.php?foo=1&bar=2",
        &[
            ("host", "mycompany.com"),
            form,
            ("x-twilio-signature", "kvajT1Ptam85bY51eRf/AJRuM3w="),
        ],
    );
    assert_eq!(
        verify::twilio("12345").verify_at(&with_port, body, SystemTime::now()),
        Ok(())
    );
    // A JSON body: the URL carries its SHA-256 (twilio-python's bodySHA256 test vector).
    let json = br#"{"property": "value", "boolean": true}"#;
    let digest = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    let uri = format!("/myapp.php?foo=1&bar=2&bodySHA256={digest}");
    let headers = [
        ("host", "mycompany.com"),
        ("content-type", "application/json"),
        ("x-twilio-signature", "a9nBmqA0ju/hNViExpshrM61xv4="),
    ];
    let v = verify::twilio(["a rotated token", "12345"]);
    assert_eq!(
        v.verify_at(&parts(&uri, &headers), json, SystemTime::now()),
        Ok(())
    );
    assert_eq!(
        v.verify_at(
            &parts(&uri, &headers),
            br#"{"property": "other"}"#,
            SystemTime::now()
        ),
        Err(VerifyError::Mismatch),
        "the body must match its signed digest"
    );
}

// Stripe's documentation publishes a header (t=1492774577,v1=5257a869…) but neither the
// secret nor the payload behind it, and its libraries' tests sign at run time. This vector
// is ours: stripe-node's test secret and event, checked with stripe-python's verify_header.
#[test]
fn stripe_scheme_several_signatures_and_tolerance() {
    let body = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";
    let v1 = "c2f890decbc5ede7c5060bb9a6d31e0626a4342bacb9aeae2adb1bcea72f9812";
    assert_eq!(
        common::stripe_v1("whsec_test_secret", 1_492_774_577, body),
        v1
    );
    let header = format!("t=1492774577,v1={v1}");
    let v = verify::stripe("whsec_test_secret");
    let now = at(1_492_774_577);
    assert_refuses_spoiled(&v, &[("stripe-signature", &header)], "/", body, now);
    // During a rotation Stripe sends one v1 per secret, with v0 alongside.
    let both = format!(
        "t=1492774577,v1={},v1={v1},v0=6ffbb59b",
        "5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd"
    );
    assert_eq!(
        v.verify_at(&parts("/", &[("stripe-signature", &both)]), body, now),
        Ok(())
    );
    // A v0 alone is not accepted.
    let v0 = "t=1492774577,v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39";
    assert!(
        v.verify_at(&parts("/", &[("stripe-signature", v0)]), body, now)
            .is_err()
    );
    assert!(matches!(
        v.verify_at(
            &parts("/", &[("stripe-signature", &header)]),
            body,
            at(1_492_774_877 + 1)
        ),
        Err(VerifyError::Expired { .. })
    ));
    let rotated = verify::stripe(vec!["whsec_new".to_owned(), "whsec_test_secret".to_owned()]);
    assert_eq!(
        rotated.verify_at(&parts("/", &[("stripe-signature", &header)]), body, now),
        Ok(())
    );
    for garbage in [
        "v1=00",
        "t=abc,v1=00",
        "t=1,t=2,v1=00",
        "t=1,v1=zz",
        "nonsense",
    ] {
        assert!(
            matches!(
                v.verify_at(&parts("/", &[("stripe-signature", garbage)]), body, now),
                Err(VerifyError::Malformed { .. })
            ),
            "{garbage}"
        );
    }
}

// Shopify publishes no webhook example (its pages use a placeholder secret): our vector,
// computed with Python's hmac and openssl.
#[test]
fn shopify_scheme() {
    let body = br#"{"id":820982911946154508,"email":"jon@doe.ca"}"#;
    let headers = [
        ("x-shopify-webhook-id", "b54557e4"),
        (
            "x-shopify-hmac-sha256",
            "fp5HwmAHEVGQQwJU1KRpk57Ts2YHF6/TLOCczCtB5bs=",
        ),
    ];
    let v = verify::shopify("hush");
    // The webhook id is not signed.
    assert_refuses_spoiled(&v, &headers[1..], "/", body, SystemTime::now());
    assert_eq!(
        v.verify_at(&parts("/", &headers), body, SystemTime::now()),
        Ok(())
    );
    assert_eq!(
        verify::shopify("HUSH").verify_at(&parts("/", &headers), body, SystemTime::now()),
        Err(VerifyError::Mismatch)
    );
}

// Twitch publishes the scheme without an example: our vector, computed with Python's hmac
// and openssl.
#[test]
fn twitch_scheme() {
    let body = br#"{"subscription":{"type":"channel.follow","version":"2"},"event":{"user_id":"1234","broadcaster_user_id":"1337"}}"#;
    let headers = [
        (
            "twitch-eventsub-message-id",
            "e76c6bd4-55c9-4987-8304-da1588d8988b",
        ),
        (
            "twitch-eventsub-message-timestamp",
            "2019-11-16T10:11:12.634234626Z",
        ),
        (
            "twitch-eventsub-message-signature",
            "sha256=e3c1d7055c8a712f76baa0b101fee472923ae1d0ac84a3ffd314192d2522b278",
        ),
    ];
    let v = verify::twitch("s3cRe7s3cRe7s3cRe7");
    let sent = at(1_573_899_072);
    assert_refuses_spoiled(&v, &headers, "/", body, sent);
    assert_eq!(
        v.verify_at(&parts("/", &headers), body, sent + Duration::from_secs(600)),
        Ok(())
    );
    assert!(matches!(
        v.verify_at(&parts("/", &headers), body, sent + Duration::from_secs(602)),
        Err(VerifyError::Expired { .. })
    ));
}

#[test]
fn a_sender_without_a_secret_is_refused() {
    let v = verify::stripe("whsec_x").or(verify::github("g"));
    // Looks like Shopify, which has no secret here.
    let shopify = parts(
        "/",
        &[
            ("x-shopify-webhook-id", "1"),
            ("x-shopify-hmac-sha256", "AA=="),
        ],
    );
    assert_eq!(
        v.verify_at(&shopify, b"{}", SystemTime::now()),
        Err(VerifyError::NoSecret { sender: "Shopify" })
    );
    // Nothing signed at all: the configured headers are named.
    let plain = parts("/", &[("idempotency-key", "k")]);
    match v.verify_at(&plain, b"{}", SystemTime::now()) {
        Err(VerifyError::Missing { expected }) => {
            assert!(
                expected.contains("stripe-signature") && expected.contains("x-hub-signature-256"),
                "{expected}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A closure verifies a sender this crate does not know.
    let custom = |parts: &Parts, _body: &[u8]| match parts.headers.get("x-token") {
        Some(token) if token == "let me in" => Ok(()),
        _ => Err(VerifyError::Mismatch),
    };
    assert_eq!(
        tower_idempotency::verify::Verify::verify(
            &custom,
            &parts("/", &[("x-token", "let me in")]),
            b""
        ),
        Ok(())
    );
}

fn signed_github(id: &str, body: &'static [u8], secret: &str) -> Request<Full<Bytes>> {
    Request::post("/hooks")
        .header("x-github-delivery", id)
        .header(
            "x-hub-signature-256",
            format!("sha256={}", hmac_sha256_hex(secret.as_bytes(), body)),
        )
        .body(Full::new(Bytes::from_static(body)))
        .unwrap()
}

/// With `key::auto`, the key claimed belongs to the sender whose signature passed. A genuine
/// Twilio signature (Twilio signs neither its token header nor a time) does not let another
/// sender's id be claimed: the request is judged as the sender its key says.
#[tokio::test]
async fn auto_claims_only_the_verified_senders_key() {
    let store = Counting::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone()).verify(
        verify::twilio("12345")
            .public_url("https://mycompany.com")
            .or(verify::github("g")),
    );
    let svc = counting_body_service(layer, runs.clone());
    let body = "CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    let captured = || {
        Request::post("/myapp.php?foo=1&bar=2")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-twilio-signature", "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    };
    // The captured Twilio request, its token dropped, with a Twitch event id added.
    let smuggled = captured()
        .header("twitch-eventsub-message-id", "victim")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let res = svc.clone().oneshot(smuggled).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(store.calls(), 0);
    // The genuine Twilio request with its token is verified as Twilio and runs.
    let genuine = captured()
        .header("i-twilio-idempotency-token", "tok-1")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let res = svc.clone().oneshot(genuine).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A GitHub delivery is verified with GitHub's secret.
    let res = svc
        .clone()
        .oneshot(signed_github("d-1", b"{}", "g"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = svc
        .oneshot(signed_github("d-2", b"{}", "not g"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The body read for the signature goes through the layer's limit, like a key's: 413, not a
/// buffer without bound, and the handler still receives the body intact when it passes.
#[tokio::test]
async fn verification_buffers_through_the_limit_and_hands_the_body_on() {
    let store = Counting::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone())
        .key(key::github())
        .verify(verify::github("g"))
        .body_limit(16);
    let svc = layer.layer(tower::service_fn(
        |req: Request<tower_idempotency::body::RequestBody<Full<Bytes>>>| async move {
            let body = http_body_util::BodyExt::collect(req.into_body())
                .await
                .unwrap()
                .to_bytes();
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
        },
    ));
    let res = svc
        .clone()
        .oneshot(signed_github("d-1", b"{\"far\":\"too long a body\"}", "g"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let res = svc
        .oneshot(signed_github("d-2", b"{\"a\":1}", "g"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let echoed = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&echoed[..], b"{\"a\":1}");
    assert_eq!(
        store.calls(),
        2,
        "one claim and one commit, for the delivery that passed"
    );
}

/// The version guard verifies before it takes the entity's pending slot: a forged newer
/// version never becomes the applied one.
#[tokio::test]
async fn the_version_guard_verifies_before_its_claim() {
    use tower_idempotency::version_guard::{self, VersionGuardLayer, VersionStore};
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let svc = VersionGuardLayer::new(store.clone())
        .entity(key::json("/id").namespace("sub"))
        .version(version_guard::version::json("/version"))
        .verify(verify::github("g"))
        .layer(tower::service_fn(move |_req| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            }
        }));
    let forged = signed_github("d-1", br#"{"id":"sub_1","version":9}"#, "not g");
    let res = svc.clone().oneshot(forged).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let entity = key::IdempotencyKey::new("sub", "sub_1").unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);
    let genuine = signed_github("d-2", br#"{"id":"sub_1","version":2}"#, "g");
    assert_eq!(svc.oneshot(genuine).await.unwrap().status(), StatusCode::OK);
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Transactional mode verifies before `BEGIN`: a forged delivery opens no transaction and
/// leaves no marker.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn transactional_mode_verifies_before_it_begins() {
    use tower_idempotency::store::{SqliteStore, Store};
    use tower_idempotency::transactional::TransactionalLayer;
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    let store = SqliteStore::new(pool);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let svc = TransactionalLayer::new(store.clone())
        .key(key::github())
        .verify(verify::github("g"))
        .layer(tower::service_fn(move |_req| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, sqlx::Error>(http::Response::new(Full::new(Bytes::new()))) }
        }));
    let res = svc
        .clone()
        .oneshot(signed_github("d-1", b"{}", "forger"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let stored = key::IdempotencyKey::new("github", "d-1").unwrap();
    assert!(
        store.describe(&stored).await.unwrap().is_none(),
        "no marker"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let res = svc.oneshot(signed_github("d-1", b"{}", "g")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(store.describe(&stored).await.unwrap().is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Standard Webhooks: a captured Svix-headed delivery with a `webhook-id` added cannot claim
/// that id: the signature is read from the family of the id the key uses.
#[test]
fn standard_webhooks_checks_the_headers_of_the_id_it_keys_on() {
    let v = verify::standard_webhooks(SVIX_SECRET);
    let smuggled = parts(
        "/",
        &[
            ("webhook-id", "msg_victim"),
            ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("svix-timestamp", "1614265330"),
            ("svix-signature", SVIX_SIGNATURE),
        ],
    );
    assert!(matches!(
        v.verify_at(&smuggled, SVIX_BODY, at(1_614_265_330)),
        Err(VerifyError::Missing { .. })
    ));
    let key = key::ExtractKey::extract(&key::standard_webhooks(), &smuggled, None).unwrap();
    assert_eq!(
        key.value(),
        "msg_victim",
        "the id the key would have claimed"
    );
}

/// Twilio signs only the URL of a request whose body is neither a form nor named by its
/// `bodySHA256`: such a body would be unsigned, and is refused.
#[test]
fn twilio_refuses_a_body_it_did_not_sign() {
    let url_only = hmac_sha1_base64(b"12345", b"https://mycompany.com/status?CallSid=CA1");
    let headers = [
        ("host", "mycompany.com"),
        ("content-type", "application/json"),
        ("x-twilio-signature", url_only.as_str()),
    ];
    let v = verify::twilio("12345");
    let now = SystemTime::now();
    assert_eq!(
        v.verify_at(&parts("/status?CallSid=CA1", &headers), b"", now),
        Ok(())
    );
    assert!(matches!(
        v.verify_at(
            &parts("/status?CallSid=CA1", &headers),
            br#"{"any":"thing"}"#,
            now
        ),
        Err(VerifyError::Malformed { .. })
    ));
}

fn hmac_sha1_base64(key: &[u8], message: &[u8]) -> String {
    use base64::Engine;
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(key).unwrap();
    mac.update(message);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn signed_slack(
    body: &'static [u8],
    content_type: &str,
    extra: Option<(&str, &str)>,
) -> Request<Full<Bytes>> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let mut message = format!("v0:{ts}:").into_bytes();
    message.extend_from_slice(body);
    let signature = format!("v0={}", hmac_sha256_hex(b"slack secret", &message));
    let mut req = Request::post("/slack")
        .header("content-type", content_type)
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", signature);
    if let Some((name, value)) = extra {
        req = req.header(name, value);
    }
    req.body(Full::new(Bytes::from_static(body))).unwrap()
}

/// A signed Slack event re-sent with another content type, or with an `Idempotency-Key`
/// added, is still Slack's event: keyed by its signed `event_id`, so a replay is a
/// duplicate, even with key-less requests let through. A slash command (a form) has no key
/// and passes through.
#[tokio::test]
async fn a_signed_delivery_is_keyed_by_its_sender_however_it_is_dressed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .missing_key(tower_idempotency::MissingKey::PassThrough)
        .verify(verify::slack("slack secret"));
    let svc = counting_body_service(layer, runs.clone());
    let event: &[u8] = br#"{"type":"event_callback","event_id":"Ev1","event":{}}"#;
    let first = svc
        .clone()
        .oneshot(signed_slack(event, "application/json", None))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    for (content_type, extra) in [
        ("text/plain", None),
        ("application/vnd.x+json", None),
        ("application/json", Some(("idempotency-key", "fresh"))),
    ] {
        let replay = svc
            .clone()
            .oneshot(signed_slack(event, content_type, extra))
            .await
            .unwrap();
        assert_eq!(
            replay.headers()["idempotency-outcome"],
            "duplicate",
            "{content_type} {extra:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let command: &[u8] = b"token=x&command=%2Fdeploy&text=now";
    let res = svc
        .oneshot(signed_slack(
            command,
            "application/x-www-form-urlencoded",
            None,
        ))
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<tower_idempotency::Outcome>(),
        Some(&tower_idempotency::Outcome::PassedThrough)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A GitHub-signed body without its delivery id does not fall back to a client's
/// `Idempotency-Key`: it has no key (400), and claims nothing.
#[tokio::test]
async fn a_signature_without_its_id_does_not_borrow_another_key() {
    let store = Counting::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone()).verify(verify::github("g"));
    let svc = counting_body_service(layer, runs.clone());
    let body: &[u8] = b"{}";
    let req = Request::post("/hooks")
        .header(
            "x-hub-signature-256",
            format!("sha256={}", hmac_sha256_hex(b"g", body)),
        )
        .header("idempotency-key", "chosen-by-whoever-replays-it")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(store.calls(), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Serves `app` on a loopback port for the rest of the test.
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Serves a plain tower service through hyper, with no router, on a loopback port.
async fn serve_plain<S>(svc: S) -> std::net::SocketAddr
where
    S: tower::Service<
            Request<hyper::body::Incoming>,
            Response = http::Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// Posts one captured Stripe delivery, byte for byte, to `path`: its outcome header, or the
/// status when it has none.
async fn replay_to(addr: std::net::SocketAddr, path: &str, signature: &str, body: &str) -> String {
    use hyper_util::rt::TokioIo;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("stripe-signature", signature)
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    match res.headers().get("idempotency-outcome") {
        Some(outcome) => outcome.to_str().unwrap().to_owned(),
        None => res.status().as_str().to_owned(),
    }
}

/// A captured Stripe delivery, its body and `Stripe-Signature` untouched and within the
/// tolerance, replayed to other paths that reach the same handler, over real sockets: a
/// parameter and wildcard route, a router's fallback, and a plain hyper service with no
/// router. The signature covers the body and the time, not the URL, so the scope must not come
/// from the path: each replay is a duplicate and the handler runs once. Two routes that each
/// receive the event still run it once each.
#[tokio::test]
async fn a_signed_replay_to_another_path_is_a_duplicate() {
    use axum::routing::post;

    const SECRET: &str = "whsec_replayed";
    let body = r#"{"id":"evt_replayed","object":"event"}"#;
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = format!("t={t},v1={}", common::stripe_v1(SECRET, t, body.as_bytes()));
    let layer = || {
        IdempotencyLayer::new(MemoryStore::new())
            .key(key::stripe())
            .verify(verify::stripe(SECRET))
    };
    let counted = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "paid"
        })
    };

    // A parameter route and a wildcard route: every path they match is one route.
    let runs = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/webhooks/{provider}/{*rest}", counted(&runs))
        .layer(layer());
    let addr = serve(app).await;
    let answers = [
        replay_to(addr, "/webhooks/stripe/x", &signature, body).await,
        replay_to(addr, "/webhooks/stripe/x", &signature, body).await,
        replay_to(addr, "/webhooks/%73tripe/y", &signature, body).await,
        replay_to(addr, "/webhooks/stripe/y?again=1", &signature, body).await,
    ];
    assert_eq!(answers, ["200", "duplicate", "duplicate", "duplicate"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "wildcard route");

    // A router's fallback: no route matched, no scope taken from the path.
    let runs = Arc::new(AtomicUsize::new(0));
    let fallback = runs.clone();
    let app = axum::Router::new()
        .fallback(post(move || async move {
            fallback.fetch_add(1, Ordering::SeqCst);
            "paid"
        }))
        .layer(layer());
    let addr = serve(app).await;
    let answers = [
        replay_to(addr, "/webhooks/stripe", &signature, body).await,
        replay_to(addr, "/anything/else", &signature, body).await,
    ];
    assert_eq!(answers, ["200", "duplicate"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "fallback");

    // A plain hyper service answers every path.
    let runs = Arc::new(AtomicUsize::new(0));
    let plain = runs.clone();
    let svc = tower::ServiceBuilder::new()
        .layer(layer())
        .service(tower::service_fn(
            move |_req: Request<tower_idempotency::body::RequestBody<hyper::body::Incoming>>| {
                let runs = plain.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
                }
            },
        ));
    let addr = serve_plain(svc).await;
    let answers = [
        replay_to(addr, "/webhooks/stripe", &signature, body).await,
        replay_to(addr, "/webhooks/%73tripe/y", &signature, body).await,
        replay_to(addr, "/x", &signature, body).await,
    ];
    assert_eq!(answers, ["200", "duplicate", "duplicate"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "plain hyper service");

    // Two endpoints subscribed to the same event, in one store: each runs it once.
    let (billing, analytics) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let app = axum::Router::new()
        .route("/webhooks/billing", counted(&billing))
        .route("/webhooks/analytics", counted(&analytics))
        .layer(layer());
    let addr = serve(app).await;
    let answers = [
        replay_to(addr, "/webhooks/billing", &signature, body).await,
        replay_to(addr, "/webhooks/analytics", &signature, body).await,
        replay_to(addr, "/webhooks/billing", &signature, body).await,
        replay_to(addr, "/webhooks/analytics", &signature, body).await,
    ];
    assert_eq!(answers, ["200", "200", "duplicate", "duplicate"]);
    assert_eq!(billing.load(Ordering::SeqCst), 1);
    assert_eq!(analytics.load(Ordering::SeqCst), 1);
}

/// Through the layer, every refusal is a 401 problem+json that never reaches the store: a
/// wrong secret, a tampered body, an old timestamp, a missing header, for each sender (with
/// `key::auto()`, the default extractor). The published examples of the senders that sign no
/// time still pass.
#[tokio::test]
async fn every_refusal_is_a_401_that_never_reaches_the_store() {
    let twilio_form = "CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    let slack_form = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    // (verifier, uri, headers, body, whether the published example itself passes today)
    type Case<'a> = (Verifier, &'a str, Vec<(&'a str, &'a str)>, &'a str, bool);
    let cases: Vec<Case<'_>> = vec![
        (
            verify::github("It's a Secret to Everybody"),
            "/gh",
            vec![
                ("x-github-delivery", "d-1"),
                (
                    "x-hub-signature-256",
                    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
                ),
            ],
            "Hello, World!",
            true,
        ),
        (
            verify::shopify("hush"),
            "/shop",
            vec![
                ("x-shopify-webhook-id", "w-1"),
                (
                    "x-shopify-hmac-sha256",
                    "fp5HwmAHEVGQQwJU1KRpk57Ts2YHF6/TLOCczCtB5bs=",
                ),
            ],
            r#"{"id":820982911946154508,"email":"jon@doe.ca"}"#,
            true,
        ),
        (
            verify::twilio("12345"),
            "/myapp.php?foo=1&bar=2",
            vec![
                ("host", "mycompany.com"),
                ("i-twilio-idempotency-token", "tok-1"),
                ("content-type", "application/x-www-form-urlencoded"),
                ("x-twilio-signature", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
            ],
            twilio_form,
            true,
        ),
        (
            verify::standard_webhooks(SVIX_SECRET),
            "/std",
            vec![
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", SVIX_SIGNATURE),
            ],
            r#"{"test": 2432232314}"#,
            false,
        ),
        (
            verify::slack("8f742231b10e8888abcd99yyyzzz85a5"),
            "/slack",
            vec![
                ("x-slack-request-timestamp", "1531420618"),
                (
                    "x-slack-signature",
                    "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
                ),
            ],
            slack_form,
            false,
        ),
    ];
    for (verifier, uri, headers, body, passes) in cases {
        let store = Counting::new(MemoryStore::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(store.clone())
            .missing_key(tower_idempotency::MissingKey::PassThrough)
            .verify(verifier);
        let svc = counting_body_service(layer, runs.clone());
        let send = |headers: &[(&str, &str)], body: String| {
            let mut req = Request::post(uri);
            for (name, value) in headers {
                req = req.header(*name, *value);
            }
            svc.clone()
                .oneshot(req.body(Full::new(Bytes::from(body))).unwrap())
        };
        let signature = headers.len() - 1;
        let mut wrong = headers.clone();
        wrong[signature].1 = "sha256=00";
        let spoiled = [
            (headers.clone(), format!("{body} ")),
            (headers[..signature].to_vec(), body.to_owned()),
            (wrong, body.to_owned()),
        ];
        for (headers, body) in spoiled {
            let res = send(&headers, body).await.unwrap();
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{uri}");
            assert_eq!(res.headers()["content-type"], "application/problem+json");
        }
        assert_eq!(store.calls(), 0, "{uri}: no refusal reached the store");
        let res = send(&headers, body.to_owned()).await.unwrap();
        if passes {
            assert_eq!(res.status(), StatusCode::OK, "{uri}");
            assert_eq!(store.calls(), 2, "{uri}: one claim, one commit");
        } else {
            // Signed years ago: too old today.
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{uri}");
            assert_eq!(store.calls(), 0, "{uri}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), usize::from(passes), "{uri}");
    }
}

/// One sender configured twice accepts the secrets of both: `stripe(old).or(stripe(new))`
/// during a rotation refuses nothing that either signed.
#[test]
fn one_sender_twice_accepts_both_secrets() {
    let body: &[u8] = b"{}";
    let signed = |secret: &[u8]| {
        let signature = format!("sha256={}", hmac_sha256_hex(secret, body));
        parts(
            "/",
            &[
                ("x-github-delivery", "d"),
                ("x-hub-signature-256", signature.as_str()),
            ],
        )
    };
    let v = verify::github("old").or(verify::github("new"));
    assert_eq!(
        v.verify_at(&signed(b"old"), body, SystemTime::now()),
        Ok(())
    );
    assert_eq!(
        v.verify_at(&signed(b"new"), body, SystemTime::now()),
        Ok(())
    );
    assert_eq!(
        v.verify_at(&signed(b"other"), body, SystemTime::now()),
        Err(VerifyError::Mismatch)
    );
}

/// The most entries a signature header may list (`Stripe-Signature` besides its `t=`;
/// `webhook-signature` and `svix-signature`, of any version): a sender lists one per secret it
/// signs with.
const MAX_SIGNATURES: usize = 8;

/// A `v1` entry that decodes and matches nothing.
const V1_DECOY: &str = "v1,bm9ldHUjISQlJiooKSstLzAxMjM0NTY3ODk6Ozw9Pj8=";

/// Through the layer, a signature header listing the bound's worth of entries, the valid one
/// last, is a delivery, as during a rotation; one entry more is refused 401 problem+json that
/// says how many the header lists, before the store is touched. Stripe's `v1=`, and Standard
/// Webhooks' `v1,` and `v1a,` in either header family.
#[tokio::test]
async fn a_signature_list_longer_than_the_bound_is_a_401() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stripe_body = r#"{"id":"evt_listed","object":"event","type":"invoice.paid"}"#;
    let stripe_valid = format!(
        "v1={}",
        common::stripe_v1("whsec_listed", now, stripe_body.as_bytes())
    );
    // Signed in 2021: checked with a wide tolerance.
    let wide = Duration::from_secs(100 * 365 * 86_400);
    let svix_body = std::str::from_utf8(SVIX_BODY).unwrap();
    // A list of `n` entries, the decoys in turn and the valid one last.
    let list = |decoys: Vec<String>, valid: String, separator: &'static str| {
        move |n: usize| {
            let mut entries: Vec<_> = decoys.iter().cycle().take(n - 1).cloned().collect();
            entries.push(valid.clone());
            entries.join(separator)
        }
    };
    // (verifier, the headers but the signature, the signature header, its value for n entries,
    // body)
    type Case<'a> = (
        Verifier,
        Vec<(&'a str, &'a str)>,
        &'a str,
        Box<dyn Fn(usize) -> String>,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            verify::stripe("whsec_listed"),
            vec![("content-type", "application/json")],
            "stripe-signature",
            Box::new({
                let listed = list(
                    vec![
                        format!("v1={}", "00".repeat(32)),
                        format!("v0={}", "00".repeat(32)),
                        "v1=zz".to_owned(),
                    ],
                    stripe_valid,
                    ",",
                );
                move |n| format!("t={now},{}", listed(n))
            }),
            stripe_body,
        ),
        (
            verify::standard_webhooks(SVIX_SECRET).tolerance(wide),
            vec![
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
            ],
            "webhook-signature",
            Box::new(list(
                vec![
                    V1_DECOY.to_owned(),
                    V1A_OTHER_SIGNATURE.to_owned(),
                    "v2,abc".to_owned(),
                ],
                SVIX_SIGNATURE.to_owned(),
                " ",
            )),
            svix_body,
        ),
        (
            verify::standard_webhooks(SVIX_SECRET).tolerance(wide),
            vec![
                ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("svix-timestamp", "1614265330"),
            ],
            "svix-signature",
            Box::new(list(
                vec![V1_DECOY.to_owned(), "garbage".to_owned()],
                SVIX_SIGNATURE.to_owned(),
                " ",
            )),
            svix_body,
        ),
        (
            verify::standard_webhooks(V1A_KEY).tolerance(wide),
            vec![
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
            ],
            "webhook-signature",
            Box::new(list(
                vec![V1A_OTHER_SIGNATURE.to_owned(), V1_DECOY.to_owned()],
                V1A_SIGNATURE.to_owned(),
                " ",
            )),
            svix_body,
        ),
    ];
    for (verifier, headers, signature, listed, body) in cases {
        let store = Counting::new(MemoryStore::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(store.clone()).verify(verifier);
        let svc = counting_body_service(layer, runs.clone());
        let send = |n: usize| {
            let mut req = Request::post("/listed").header(signature, listed(n));
            for (name, value) in &headers {
                req = req.header(*name, *value);
            }
            svc.clone()
                .oneshot(req.body(Full::new(Bytes::from(body))).unwrap())
        };
        let over = send(MAX_SIGNATURES + 1).await.unwrap();
        assert_eq!(over.status(), StatusCode::UNAUTHORIZED, "{signature}");
        let problem = common::problem(over).await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!(
                "lists {} signature entries; at most {MAX_SIGNATURES} are read",
                MAX_SIGNATURES + 1
            )),
            "{signature}: {detail}"
        );
        assert_eq!(store.calls(), 0, "{signature}: the refusal claims nothing");
        let full = send(MAX_SIGNATURES).await.unwrap();
        assert_eq!(full.status(), StatusCode::OK, "{signature}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{signature}");
    }
}

/// Hundreds of `v1a` entries beside a large body are refused as malformed before any is
/// verified: each is a well-formed signature, whose verification would hash the whole body,
/// and one of them is even genuine for the small body.
#[test]
fn hundreds_of_v1a_entries_are_refused_before_any_is_verified() {
    let v = verify::standard_webhooks(V1A_KEY);
    let listed = svix_example(&vec![V1A_SIGNATURE; 500].join(" "));
    let large = vec![b'x'; 1 << 20];
    for body in [&large[..], SVIX_BODY] {
        assert_eq!(
            v.verify_at(&listed, body, at(1_614_265_330)),
            Err(VerifyError::malformed(
                "it lists 500 signature entries; at most 8 are read"
            )),
            "a body of {} bytes",
            body.len()
        );
    }
}
