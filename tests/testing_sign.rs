//! The testing kit's signers: each against the example signatures its sender publishes (the
//! vectors the verifiers' tests hold), and each through the crate's verifier, made apart from
//! it: a genuine delivery passes, every forgery the kit makes fails with its own error.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::testing::{Delivery, sign};
use tower_idempotency::verify::{self, Verifier, VerifyError};
use tower_idempotency::{IdempotencyLayer, store::MemoryStore};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn check(verifier: &Verifier, delivery: &Delivery, now: SystemTime) -> Result<(), VerifyError> {
    verifier.verify_at(&delivery.parts(), delivery.body(), now)
}

fn header<'a>(delivery: &'a Delivery, name: &str) -> &'a str {
    delivery.headers()[name].to_str().unwrap()
}

// docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries.
#[test]
fn github_signs_its_published_example() {
    let delivery = sign::github("It's a Secret to Everybody").delivery("d-1", "Hello, World!");
    assert_eq!(
        header(&delivery, "x-hub-signature-256"),
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    );
    assert_eq!(header(&delivery, "x-github-delivery"), "d-1");
}

// docs.svix.com/receiving/verifying-payloads/how, and the manual page's "Example signatures".
#[test]
fn standard_webhooks_signs_the_published_examples() {
    let delivery = sign::standard_webhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .at(at(1_614_265_330))
        .delivery("msg_p5jXN8AQM9LWM0D4loKWxJek", r#"{"test": 2432232314}"#);
    assert_eq!(
        header(&delivery, "webhook-signature"),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    );
    assert_eq!(header(&delivery, "webhook-timestamp"), "1614265330");
    assert_eq!(
        header(&delivery, "webhook-id"),
        "msg_p5jXN8AQM9LWM0D4loKWxJek"
    );

    let manual = sign::standard_webhooks("whsec_plJ3nmyCDGBKInavdOK15jsl")
        .svix()
        .at(at(1_731_705_121))
        .delivery(
            "msg_loFOjxBNrRLzqYUf",
            r#"{"event_type":"ping","data":{"success":true}}"#,
        );
    assert_eq!(
        header(&manual, "svix-signature"),
        "v1,rAvfW3dJ/X/qxhsaXPOyyCGmRKsaKWcsNccKXlIktD0="
    );
    assert_eq!(header(&manual, "svix-id"), "msg_loFOjxBNrRLzqYUf");
}

// api.slack.com/authentication/verifying-requests-from-slack, the worked example.
#[test]
fn slack_signs_its_published_example() {
    let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let delivery = sign::slack("8f742231b10e8888abcd99yyyzzz85a5")
        .at(at(1_531_420_618))
        .delivery(body);
    assert_eq!(
        header(&delivery, "x-slack-signature"),
        "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    );
    assert_eq!(header(&delivery, "x-slack-request-timestamp"), "1531420618");
}

// twilio.com/docs/usage/webhooks/webhooks-security: auth token 12345, the example URL and
// call parameters (the first row is the version twilio-python's tests pin, the others the
// documentation's later versions); then twilio-python's vectors for a URL with its port and
// for a JSON body (`bodySHA256`).
#[test]
fn twilio_signs_the_published_examples() {
    for (host, number, signature) in [
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
    ] {
        let twilio = sign::twilio("12345", &format!("https://{host}/myapp.php?foo=1&bar=2"));
        // Given in another order than Twilio signs them: the signer sorts them.
        let delivery = twilio.delivery(
            "tok-1",
            [
                ("To", "+18005551212"),
                ("From", number),
                ("Digits", "1234"),
                ("Caller", number),
                ("CallSid", "CA1234567890ABCDE"),
            ],
        );
        assert_eq!(header(&delivery, "x-twilio-signature"), signature, "{host}");
        assert_eq!(header(&delivery, "host"), host);
        assert_eq!(delivery.uri(), "/myapp.php?foo=1&bar=2");
    }
    let with_port = sign::twilio("12345", "https://mycompany.com:443/myapp.php?foo=1&bar=2")
        .delivery(
            "tok-1",
            [
                ("CallSid", "CA1234567890ABCDE"),
                ("Caller", "+14158675309"),
                ("Digits", "1234"),
                ("From", "+14158675309"),
                ("To", "+18005551212"),
            ],
        );
    assert_eq!(
        header(&with_port, "x-twilio-signature"),
        "kvajT1Ptam85bY51eRf/AJRuM3w="
    );
    let json = sign::twilio("12345", "https://mycompany.com/myapp.php?foo=1&bar=2")
        .json_delivery("tok-1", r#"{"property": "value", "boolean": true}"#);
    assert_eq!(
        json.uri(),
        "/myapp.php?foo=1&bar=2&bodySHA256=0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620"
    );
    assert_eq!(
        header(&json, "x-twilio-signature"),
        "a9nBmqA0ju/hNViExpshrM61xv4="
    );
}

// Stripe, Shopify and Twitch publish no example with its secret: the vectors of the
// verifiers' tests, computed apart (Stripe's with Stripe's own library).
#[test]
fn stripe_shopify_and_twitch_sign_the_verifiers_vectors() {
    let stripe = sign::stripe("whsec_test_secret")
        .at(at(1_492_774_577))
        .delivery("{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}");
    assert_eq!(
        header(&stripe, "stripe-signature"),
        "t=1492774577,v1=c2f890decbc5ede7c5060bb9a6d31e0626a4342bacb9aeae2adb1bcea72f9812"
    );
    assert_eq!(
        stripe.to_string(),
        "Stripe delivery of evt_test_webhook (POST /)"
    );
    let shopify = sign::shopify("hush").delivery(
        "b54557e4",
        r#"{"id":820982911946154508,"email":"jon@doe.ca"}"#,
    );
    assert_eq!(
        header(&shopify, "x-shopify-hmac-sha256"),
        "fp5HwmAHEVGQQwJU1KRpk57Ts2YHF6/TLOCczCtB5bs="
    );
    let twitch = sign::twitch("s3cRe7s3cRe7s3cRe7")
        .at(UNIX_EPOCH + Duration::new(1_573_899_072, 634_234_626))
        .delivery(
            "e76c6bd4-55c9-4987-8304-da1588d8988b",
            r#"{"subscription":{"type":"channel.follow","version":"2"},"event":{"user_id":"1234","broadcaster_user_id":"1337"}}"#,
        );
    assert_eq!(
        header(&twitch, "twitch-eventsub-message-timestamp"),
        "2019-11-16T10:11:12.634234626Z"
    );
    assert_eq!(
        header(&twitch, "twitch-eventsub-message-signature"),
        "sha256=e3c1d7055c8a712f76baa0b101fee472923ae1d0ac84a3ffd314192d2522b278"
    );
}

/// One sender's case: its verifier, a delivery signed at `sent` with its secret and one
/// signed with another secret, and its tolerance (zero: it signs no time).
struct Case {
    name: &'static str,
    verifier: Verifier,
    genuine: Delivery,
    other_secret: Delivery,
    /// The sender's tolerance, and the same delivery signed one second past it before `sent`.
    old: Option<(u64, Delivery)>,
}

const SENT: u64 = 1_700_000_000;
const SVIX: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SVIX_OTHER: &str = "whsec_plJ3nmyCDGBKInavdOK15jsl";

fn cases() -> Vec<Case> {
    let old = |tolerance: u64| at(SENT - tolerance - 1);
    let twilio = |token: &str| sign::twilio(token, "https://hooks.example.com/sms?x=1");
    let params = [("MessageSid", "SM0123"), ("Body", "Hello & goodbye +1")];
    vec![
        Case {
            name: "Stripe",
            verifier: verify::stripe("whsec_a"),
            genuine: sign::stripe("whsec_a")
                .at(at(SENT))
                .delivery(r#"{"id":"evt_1"}"#),
            other_secret: sign::stripe("whsec_b")
                .at(at(SENT))
                .delivery(r#"{"id":"evt_1"}"#),
            old: Some((
                300,
                sign::stripe("whsec_a")
                    .at(old(300))
                    .delivery(r#"{"id":"evt_1"}"#),
            )),
        },
        Case {
            name: "GitHub",
            verifier: verify::github("a"),
            genuine: sign::github("a").delivery("d-1", "{}"),
            other_secret: sign::github("b").delivery("d-1", "{}"),
            old: None,
        },
        Case {
            name: "Shopify",
            verifier: verify::shopify("a"),
            genuine: sign::shopify("a").delivery("w-1", "{}"),
            other_secret: sign::shopify("b").delivery("w-1", "{}"),
            old: None,
        },
        Case {
            name: "Standard Webhooks",
            verifier: verify::standard_webhooks(SVIX),
            genuine: sign::standard_webhooks(SVIX)
                .at(at(SENT))
                .delivery("msg_1", "{}"),
            other_secret: sign::standard_webhooks(SVIX_OTHER)
                .at(at(SENT))
                .delivery("msg_1", "{}"),
            old: Some((
                300,
                sign::standard_webhooks(SVIX)
                    .at(old(300))
                    .delivery("msg_1", "{}"),
            )),
        },
        Case {
            name: "Svix",
            verifier: verify::standard_webhooks(SVIX),
            genuine: sign::standard_webhooks(SVIX)
                .svix()
                .at(at(SENT))
                .delivery("msg_1", "{}"),
            other_secret: sign::standard_webhooks(SVIX_OTHER)
                .svix()
                .at(at(SENT))
                .delivery("msg_1", "{}"),
            old: Some((
                300,
                sign::standard_webhooks(SVIX)
                    .svix()
                    .at(old(300))
                    .delivery("msg_1", "{}"),
            )),
        },
        Case {
            name: "Slack",
            verifier: verify::slack("a"),
            genuine: sign::slack("a")
                .at(at(SENT))
                .delivery(r#"{"event_id":"Ev1"}"#),
            other_secret: sign::slack("b")
                .at(at(SENT))
                .delivery(r#"{"event_id":"Ev1"}"#),
            old: Some((
                300,
                sign::slack("a")
                    .at(old(300))
                    .delivery(r#"{"event_id":"Ev1"}"#),
            )),
        },
        Case {
            name: "Twitch",
            verifier: verify::twitch("a"),
            genuine: sign::twitch("a").at(at(SENT)).delivery("m-1", "{}"),
            other_secret: sign::twitch("b").at(at(SENT)).delivery("m-1", "{}"),
            old: Some((600, sign::twitch("a").at(old(600)).delivery("m-1", "{}"))),
        },
        Case {
            name: "Twilio form",
            verifier: verify::twilio("a"),
            genuine: twilio("a").delivery("tok-1", params),
            other_secret: twilio("b").delivery("tok-1", params),
            old: None,
        },
        Case {
            name: "Twilio JSON",
            verifier: verify::twilio("a"),
            genuine: twilio("a").json_delivery("tok-1", r#"{"a":1}"#),
            other_secret: twilio("b").json_delivery("tok-1", r#"{"a":1}"#),
            old: None,
        },
    ]
}

/// The kit's deliveries against the crate's verifiers: the genuine one passes; a tampered
/// body, another secret, no signature and an old timestamp each fail with their own error.
#[test]
fn every_signer_round_trips_through_its_verifier() {
    let now = at(SENT);
    for case in cases() {
        let Case { name, verifier, .. } = &case;
        assert_eq!(check(verifier, &case.genuine, now), Ok(()), "{name}");
        assert_eq!(
            check(verifier, &case.genuine.tampered(), now),
            Err(VerifyError::Mismatch),
            "{name}: tampered"
        );
        assert_eq!(
            check(verifier, &case.other_secret, now),
            Err(VerifyError::Mismatch),
            "{name}: another secret"
        );
        let unsigned = check(verifier, &case.genuine.without_signature(), now);
        assert!(
            matches!(unsigned, Err(VerifyError::Missing { .. })),
            "{name}: no signature: {unsigned:?}"
        );
        if let Some((tolerance, old)) = &case.old {
            let expired = check(verifier, old, now);
            assert_eq!(
                expired,
                Err(VerifyError::Expired {
                    skew_secs: tolerance + 1,
                    tolerance_secs: *tolerance
                }),
                "{name}: old"
            );
            // The same delivery was genuine when it was sent.
            assert_eq!(
                check(verifier, old, at(SENT - tolerance - 1)),
                Ok(()),
                "{name}"
            );
        }
    }
}

/// A secret rotated: a receiver holding both secrets accepts a delivery signed with either;
/// Stripe and Standard Webhooks, which list one signature per secret, sign with both, and a
/// receiver holding either accepts it.
#[test]
fn rotated_secrets() {
    let now = at(SENT);
    let github = verify::github(["new", "old"]);
    for secret in ["new", "old"] {
        let delivery = sign::github(secret).delivery("d-1", "{}");
        assert_eq!(check(&github, &delivery, now), Ok(()), "{secret}");
    }
    assert_eq!(
        check(&github, &sign::github("other").delivery("d-1", "{}"), now),
        Err(VerifyError::Mismatch)
    );

    let both = sign::stripe("whsec_new")
        .and_secret("whsec_old")
        .at(at(SENT))
        .delivery(r#"{"id":"evt_1"}"#);
    assert_eq!(header(&both, "stripe-signature").matches("v1=").count(), 2);
    for secret in ["whsec_new", "whsec_old"] {
        assert_eq!(
            check(&verify::stripe(secret), &both, now),
            Ok(()),
            "{secret}"
        );
    }
    assert_eq!(
        check(&verify::stripe("whsec_other"), &both, now),
        Err(VerifyError::Mismatch)
    );

    let both = sign::standard_webhooks(SVIX)
        .and_secret(SVIX_OTHER)
        .at(at(SENT))
        .delivery("msg_1", "{}");
    for secret in [SVIX, SVIX_OTHER] {
        let verifier = verify::standard_webhooks(secret);
        assert_eq!(check(&verifier, &both, now), Ok(()), "{secret}");
    }
}

/// Through the layer, with `key::auto()`: each sender's delivery is recognised, verified and
/// run once (its copy a duplicate); its forgery is refused 401 and runs nothing.
#[tokio::test]
async fn every_signer_passes_the_layer_and_its_forgeries_do_not() {
    let twilio = sign::twilio("a", "https://hooks.example.com/sms");
    let deliveries = [
        (
            verify::stripe("a"),
            sign::stripe("a").delivery(r#"{"id":"evt_1"}"#),
        ),
        (verify::github("a"), sign::github("a").delivery("d-1", "{}")),
        (
            verify::shopify("a"),
            sign::shopify("a").delivery("w-1", "{}"),
        ),
        (
            verify::standard_webhooks(SVIX),
            sign::standard_webhooks(SVIX).delivery("msg_1", "{}"),
        ),
        (
            verify::standard_webhooks(SVIX),
            sign::standard_webhooks(SVIX).svix().delivery("msg_2", "{}"),
        ),
        (
            verify::slack("a"),
            sign::slack("a").delivery(r#"{"event_id":"Ev1"}"#),
        ),
        (verify::twitch("a"), sign::twitch("a").delivery("m-1", "{}")),
        (
            verify::twilio("a"),
            twilio.delivery("tok-1", [("Body", "hi")]),
        ),
        (verify::twilio("a"), twilio.json_delivery("tok-2", "{}")),
    ];
    for (verifier, delivery) in deliveries {
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let app = IdempotencyLayer::new(MemoryStore::new())
            .verify(verifier)
            .layer(service_fn(move |_req| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::<Bytes>::default()))
                }
            }));
        for forged in [delivery.tampered(), delivery.without_signature()] {
            let res = app.clone().oneshot(forged.request()).await.unwrap();
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{delivery}");
        }
        let first = app.clone().oneshot(delivery.request()).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "{delivery}");
        let again = app.clone().oneshot(delivery.request()).await.unwrap();
        assert_eq!(
            again.headers()["idempotency-outcome"],
            "duplicate",
            "{delivery}"
        );
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{delivery}"
        );
    }
}

/// Standard Webhooks' asymmetric scheme: a `whsk_` signing key signs `v1a` entries, which
/// the verifier checks with the matching `whpk_` public key. The seeds are RFC 8032's first
/// two test vectors; its published public keys are what the signer derives.
#[test]
fn standard_webhooks_signs_v1a_with_an_ed25519_key() {
    let first = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
    let second = "whsk_TM0Imyj/ltqdtsNG7BFOD1uKMZ81q6Yk2oz27U+4pvs=";
    let sender = sign::standard_webhooks(first).at(at(1_614_265_330));
    let public = sender.public_key().expect("a signing key");
    assert_eq!(public, "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=");
    let public_second = sign::standard_webhooks(second).public_key().unwrap();
    assert_eq!(
        public_second,
        "whpk_PUAXw+hDiVqStwqnTRt+vJyYLM8uxJaMwM1V8Sr0Zgw="
    );

    let now = at(1_614_265_330);
    let verifier = verify::standard_webhooks(public.as_str());
    let delivery = sender.delivery("msg_p5jXN8AQM9LWM0D4loKWxJek", r#"{"test": 2432232314}"#);
    assert!(header(&delivery, "webhook-signature").starts_with("v1a,"));
    assert_eq!(check(&verifier, &delivery, now), Ok(()));
    assert_eq!(
        check(&verifier, &delivery.tampered(), now),
        Err(VerifyError::Mismatch)
    );
    assert!(matches!(
        check(&verifier, &delivery.without_signature(), now),
        Err(VerifyError::Missing { .. })
    ));
    assert!(matches!(
        check(&verifier, &delivery, at(1_614_265_330 + 3600)),
        Err(VerifyError::Expired { .. })
    ));
    // Signed by another key: refused by this one, passed by a verifier that holds both.
    let other = sign::standard_webhooks(second)
        .at(at(1_614_265_330))
        .delivery("msg_1", "{}");
    assert_eq!(check(&verifier, &other, now), Err(VerifyError::Mismatch));
    let both = verify::standard_webhooks([public.as_str(), public_second.as_str()]);
    assert_eq!(check(&both, &other, now), Ok(()));
    // Rotation from a secret to a signing key: one header, a `v1` and a `v1a` entry, which
    // either kind of verifier accepts.
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let rotating = sign::standard_webhooks(secret)
        .and_secret(first)
        .at(at(1_614_265_330))
        .svix()
        .delivery("msg_2", "{}");
    let signature = header(&rotating, "svix-signature");
    assert!(
        signature.starts_with("v1,") && signature.contains(" v1a,"),
        "{signature}"
    );
    assert_eq!(
        check(&verify::standard_webhooks(secret), &rotating, now),
        Ok(())
    );
    assert_eq!(check(&verifier, &rotating, now), Ok(()));
}
