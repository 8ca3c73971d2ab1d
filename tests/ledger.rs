//! Promise: a ledger's checkpoints pin its records. Records appended by many tasks at once,
//! numbered and signed while they keep coming, audit clean against every checkpoint ever
//! published (no false alarm); each kind of change made to the stored records afterwards is
//! found and named; a key's timeline reads back what happened to it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tower::Layer as _;

use tower_idempotency::ledger::{
    Event, Finding, LedgerError, LedgerStore, Logged, MemoryLedger, NoteSigner, Record, audit,
    publish,
};
use tower_idempotency::{IdempotencyKey, Outcome};

const ORIGIN: &str = "example.com/hooks";

fn signer() -> NoteSigner {
    NoteSigner::from_seed(ORIGIN, [11; 32]).unwrap()
}

fn delivery(id: &str, number: u64, outcome: Outcome) -> Record {
    Record {
        key: IdempotencyKey::new("github", id.to_owned()).unwrap(),
        at: SystemTime::now(),
        event: Event::Delivery {
            number: Some(number),
            outcome,
            replay: false,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_published_while_records_arrive_all_audit_clean() {
    let ledger = MemoryLedger::new();
    let signer = Arc::new(signer());
    let mut writers = Vec::new();
    for task in 0..8 {
        let ledger = ledger.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..250u64 {
                let id = format!("d-{task}-{}", n / 2);
                let outcome = if n % 2 == 0 {
                    Outcome::Processed
                } else {
                    Outcome::Duplicate
                };
                ledger
                    .append(&[delivery(&id, n % 2 + 1, outcome)])
                    .await
                    .unwrap();
                if n % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    let publisher = {
        let (ledger, signer) = (ledger.clone(), signer.clone());
        tokio::spawn(async move {
            let mut notes = Vec::new();
            for _ in 0..40 {
                let checkpoint = publish(&ledger, &signer, ORIGIN).await.unwrap();
                notes.push((checkpoint.size, checkpoint.sign(&signer).unwrap()));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            notes
        })
    };
    for writer in writers {
        writer.await.unwrap();
    }
    let mut notes = publisher.await.unwrap();
    let last = publish(&ledger, &signer, ORIGIN).await.unwrap();
    assert_eq!(last.size, 2000, "every record numbered once");
    notes.push((last.size, last.sign(&signer).unwrap()));
    assert!(
        notes.windows(2).all(|pair| pair[0].0 <= pair[1].0),
        "sizes never go back"
    );
    let verifier = signer.verifier();
    for (size, note) in &notes {
        let (checkpoint, verdict) = audit(&ledger, &verifier, Some(note)).await.unwrap();
        assert_eq!(checkpoint.size, *size);
        assert!(verdict.is_intact(), "size {size}: {:?}", verdict.findings);
    }
    let key = IdempotencyKey::new("github", "d-3-7").unwrap();
    let timeline = ledger.timeline(&key).await.unwrap();
    let outcomes: Vec<_> = timeline
        .iter()
        .map(|record| match &record.event {
            Event::Delivery { outcome, .. } => *outcome,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outcomes, [Outcome::Processed, Outcome::Duplicate]);
}

/// A ledger of ten records and the note of its checkpoint, kept by the auditor.
async fn signed_ledger() -> (MemoryLedger, String) {
    let ledger = MemoryLedger::new();
    for n in 0..10 {
        ledger
            .append(&[delivery(&format!("d-{n}"), 1, Outcome::Processed)])
            .await
            .unwrap();
    }
    let checkpoint = publish(&ledger, &signer(), ORIGIN).await.unwrap();
    (ledger, checkpoint.sign(&signer()).unwrap())
}

async fn findings_after(edit: impl FnOnce(&mut Vec<Logged>)) -> Vec<Finding> {
    let (ledger, note) = signed_ledger().await;
    ledger.edit_log(edit);
    let (_, verdict) = audit(&ledger, &signer().verifier(), Some(&note))
        .await
        .unwrap();
    verdict.findings
}

fn rewritten(logged: &Logged, outcome: Outcome) -> Vec<u8> {
    let mut record = Record::decode(&logged.record).unwrap();
    if let Event::Delivery { outcome: was, .. } = &mut record.event {
        *was = outcome;
    }
    record.encode()
}

#[tokio::test]
async fn each_change_to_the_stored_records_is_named() {
    let status_edited = findings_after(|log| {
        log[3].record = rewritten(&log[3], Outcome::Duplicate);
    });
    assert_eq!(status_edited.await, [Finding::Altered { seq: 3 }]);
    let deleted = findings_after(|log| {
        log.remove(5);
    });
    assert_eq!(deleted.await, [Finding::Deleted { seq: 5 }]);
    let swapped = findings_after(|log| {
        log[1].seq = 2;
        log[2].seq = 1;
    });
    assert_eq!(
        swapped.await,
        [
            Finding::Moved { seq: 1, was: 2 },
            Finding::Moved { seq: 2, was: 1 }
        ]
    );
    let inserted = findings_after(|log| {
        let forged = delivery("d-forged", 1, Outcome::Processed).encode();
        log.push(Logged::new(4, forged));
    });
    assert_eq!(inserted.await, [Finding::Inserted { seq: 4 }]);
    let truncated = findings_after(|log| log.truncate(8));
    assert_eq!(truncated.await, [Finding::Truncated { from: 8, size: 10 }]);
    let leaf_too = findings_after(|log| {
        log[6] = Logged::new(6, rewritten(&log[6], Outcome::Released));
    });
    assert_eq!(leaf_too.await, [Finding::Rewritten { size: 10 }]);
}

#[tokio::test]
async fn publishing_over_records_changed_since_the_last_checkpoint_is_refused() {
    let (ledger, _) = signed_ledger().await;
    ledger
        .append(&[delivery("d-late", 1, Outcome::Processed)])
        .await
        .unwrap();
    // Numbered by a publisher that stopped before it signed, then edited.
    assert_eq!(ledger.sequence(10).await.unwrap().len(), 1);
    ledger.edit_log(|log| log[10].record = b"edited".to_vec());
    assert!(matches!(
        publish(&ledger, &signer(), ORIGIN).await,
        Err(LedgerError::Diverged(_))
    ));
}

#[tokio::test]
async fn a_note_signed_by_another_key_is_refused() {
    let (ledger, note) = signed_ledger().await;
    let other = NoteSigner::from_seed(ORIGIN, [12; 32]).unwrap();
    assert!(matches!(
        audit(&ledger, &other.verifier(), Some(&note)).await,
        Err(LedgerError::Note(_))
    ));
}

mod through_the_layer {
    use std::time::Duration;

    use axum::Router;
    use axum::middleware::{self, Next};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use http::{Request, StatusCode};
    use tower::ServiceExt;
    use tower_idempotency::ledger::{
        Event, LedgerStore, MemoryLedger, NoteSigner, Recorder, audit, publish,
    };
    use tower_idempotency::store::MemoryStore;
    use tower_idempotency::{IdempotencyKey, IdempotencyLayer, key};

    /// An app-wide timeout shorter than the slow handler, answering 408.
    async fn timeout(req: axum::extract::Request, next: Next) -> Response {
        match tokio::time::timeout(Duration::from_millis(100), next.run(req)).await {
            Ok(res) => res,
            Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
        }
    }

    fn app(store: MemoryStore, recorder: &Recorder) -> Router {
        let hooks = Router::new().route(
            "/github",
            post(|req: Request<axum::body::Body>| async move {
                if req.headers().contains_key("x-slow") {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                StatusCode::NO_CONTENT
            })
            .layer(
                IdempotencyLayer::new(store)
                    .key(key::github())
                    .ledger(recorder),
            ),
        );
        Router::new()
            .nest("/hooks", hooks)
            .layer(middleware::from_fn(timeout))
    }

    fn delivery(id: &str, slow: bool) -> Request<axum::body::Body> {
        let mut req = Request::post("/hooks/github").header("x-github-delivery", id);
        if slow {
            req = req.header("x-slow", "1");
        }
        req.body(axum::body::Body::from("{}")).unwrap()
    }

    /// What the ledger says of `key`: each record as "delivery <outcome>" or "run <status>".
    async fn timeline(ledger: &MemoryLedger, key: &IdempotencyKey) -> Vec<String> {
        let records = ledger.timeline(key).await.unwrap();
        records
            .iter()
            .map(|record| match &record.event {
                Event::Delivery { outcome, .. } => format!("delivery {outcome}"),
                Event::Run {
                    delivery,
                    status,
                    instance,
                    ..
                } => format!(
                    "run {} on {instance} of delivery {}",
                    status.unwrap_or(0),
                    delivery.unwrap_or(0)
                ),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliveries_and_runs_are_recorded_even_when_the_sender_hangs_up() {
        let ledger = MemoryLedger::new();
        let recorder = Recorder::spawn(ledger.clone(), "web-1");
        let app = app(MemoryStore::new(), &recorder);

        let answer = app.clone().oneshot(delivery("d-1", false)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
        let answer = app.clone().oneshot(delivery("d-1", false)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        // The key as stored: scoped by the route the router matched.
        let first: IdempotencyKey = answer.extensions().get().cloned().unwrap();

        // The app-wide timeout cuts the sender off; the handler runs on to its end.
        let answer = app.clone().oneshot(delivery("d-2", true)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::REQUEST_TIMEOUT);
        // The sender's retry: 409 while the first run goes on, 200 once it committed.
        let answer = loop {
            let answer = app.clone().oneshot(delivery("d-2", false)).await.unwrap();
            if answer.status() != StatusCode::CONFLICT {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            answer.status(),
            StatusCode::OK,
            "a duplicate once it committed"
        );
        let second: IdempotencyKey = answer.extensions().get().cloned().unwrap();

        recorder.flush().await;
        assert_eq!(
            timeline(&ledger, &first).await,
            ["run 204 on web-1 of delivery 1", "delivery duplicate"],
            "sent twice, ran once: the delivery that ran is recorded by its run"
        );
        // The retries answered 409 while it ran are deliveries too; besides them, the run and
        // the retry answered as a duplicate. The delivery whose sender hung up got no answer.
        let second = timeline(&ledger, &second).await;
        let in_flight = second.iter().filter(|r| *r == "delivery in-flight").count();
        let rest: Vec<_> = second
            .iter()
            .filter(|r| *r != "delivery in-flight")
            .collect();
        assert_eq!(
            rest,
            ["run 204 on web-1 of delivery 1", "delivery duplicate"],
            "the run of the delivery whose sender hung up is recorded"
        );
        assert_eq!(recorder.dropped(), 0);

        let signer = NoteSigner::from_seed("example.com/hooks", [5; 32]).unwrap();
        let checkpoint = publish(&ledger, &signer, "example.com/hooks")
            .await
            .unwrap();
        assert_eq!(checkpoint.size as usize, 2 + in_flight + 2);
        let (_, verdict) = audit(&ledger, &signer.verifier(), None).await.unwrap();
        assert!(verdict.is_intact());
    }
}

/// A handler that panics is a run too, under either stale policy: recorded with its cause.
#[tokio::test]
async fn a_run_that_panicked_is_recorded_under_hold() {
    use http::Request;
    use tower::{ServiceExt, service_fn};
    use tower_idempotency::ledger::Recorder;
    use tower_idempotency::store::MemoryStore;
    use tower_idempotency::{IdempotencyLayer, Stale, key};

    let ledger = MemoryLedger::new();
    let recorder = Recorder::spawn(ledger.clone(), "web-2");
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .key(key::github())
        .stale(Stale::hold_after(Duration::from_secs(60)))
        .ledger(&recorder)
        .layer(service_fn(|_req: Request<_>| async {
            if true {
                panic!("the handler's bug");
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
    let req = Request::post("/")
        .header("x-github-delivery", "d-panic")
        .body(String::new())
        .unwrap();
    let joined = tokio::spawn(svc.oneshot(req)).await;
    assert!(joined.unwrap_err().is_panic());
    recorder.flush().await;
    let key = IdempotencyKey::new("github", "d-panic").unwrap();
    let timeline = ledger.timeline(&key).await.unwrap();
    assert_eq!(timeline.len(), 1, "{timeline:?}");
    let Event::Run {
        instance,
        status,
        error,
        ..
    } = &timeline[0].event
    else {
        panic!("{timeline:?}");
    };
    assert_eq!(
        (instance.as_str(), *status, error.as_deref()),
        ("web-2", None, Some("the handler panicked"))
    );
}
