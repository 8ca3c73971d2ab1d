//! One attempt at an entry: the request rebuilt and sent through the app under the entry's
//! lease, the route's handler heard, and the entry settled as the handler answered.

use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, Uri};
use tokio::sync::oneshot;
use tower_service::Service;
use tracing::Instrument;

use super::Inbox;
use super::backoff::Backoff;
use super::delivery::InboxDelivery;
use super::settle::Settler;
use crate::body::BoxError;
use crate::engine::mode::{
    Configured, HandBack, LeaseGuard, Owner, Ran, Report, Settings, Settle, Ticket, call,
    heartbeat, panic_message,
};
use crate::response::Outcome;
use crate::store::inbox::{Attempt, AttemptResult, InboxStore, Settlement, Settling, Taken};
use crate::store::{Lease, Receipt, Stale, StoreError};

/// What the workers of one [`Workers::spawn`](super::Workers::spawn) share.
pub(crate) struct WorkerSettings<St> {
    pub(super) inbox: Inbox<St>,
    /// The store timeout, the commit predicate and the drain, as the lease guard reads them.
    pub(super) settings: Settings,
    pub(super) stale: Stale,
    pub(super) backoff: Backoff,
    /// Writes the settlements in batches.
    pub(super) settler: Settler,
}

/// The owner of one entry's lease: the guard renews and settles through it.
struct Attempting<St> {
    shared: Arc<WorkerSettings<St>>,
    /// The attempts so far, written with the settlement, and how a failure settles.
    plan: Mutex<Plan>,
}

struct Plan {
    history: Vec<Attempt>,
    failure: Settlement,
}

impl<St> Attempting<St> {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<St> Configured for Attempting<St> {
    fn settings(&self) -> &Settings {
        &self.shared.settings
    }
}

impl<St: InboxStore> Owner for Attempting<St> {
    type Lease = Lease;
    const WHAT: &'static str = "inbox entry";

    fn stale(&self) -> Stale {
        self.shared.stale
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.shared.inbox.store().renew_entry(lease).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        action: Settle,
        _receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let (settlement, history) = {
            let plan = self.plan();
            let settlement = match action {
                Settle::Commit => Settlement::Done,
                Settle::Release => plan.failure,
                Settle::GiveBack => Settlement::GiveBack,
            };
            (settlement, plan.history.clone())
        };
        let settling = Settling {
            lease: lease.clone(),
            settlement,
            history,
        };
        self.shared.settler.write(settling).await
    }
}

/// How an attempt ended.
struct Ended {
    result: AttemptResult,
    /// The route was never reached: the handler did not run.
    unreached: bool,
}

/// Runs one taken entry through `service` and settles it. Answers once the settlement landed
/// (or was given up), so that the worker's slot is held until then.
pub(super) async fn attempt<St, S, B, ResB>(
    shared: Arc<WorkerSettings<St>>,
    service: S,
    taken: Taken,
    entry: Ticket,
) where
    St: InboxStore,
    S: Service<Request<B>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: From<Bytes> + Send + 'static,
{
    let Taken {
        lease,
        request,
        attempt,
        crashes,
        received_at,
        mut history,
    } = taken;
    if lease.reclaimed() {
        history.push(Attempt::new(Attempt::now_ms(), 0, AttemptResult::Crashed));
    }
    let failure = if attempt >= shared.backoff.max_attempts() {
        Settlement::Dead
    } else {
        Settlement::Retry {
            after: shared.backoff.delay(attempt),
        }
    };
    let key = lease.key().clone();
    let span = tracing::info_span!(
        "inbox_attempt",
        namespace = key.namespace(),
        key = key.value(),
        attempt,
        lease = %lease.token(),
        status = tracing::field::Empty,
        result = tracing::field::Empty,
    );
    let owner = Arc::new(Attempting {
        shared,
        plan: Mutex::new(Plan { history, failure }),
    });
    let mut guard = LeaseGuard::claimed(owner.clone(), lease, entry);
    guard.retry_in_place();
    let run = async move {
        let started_ms = Attempt::now_ms();
        let started = Instant::now();
        let ended = match request.uri.parse::<Uri>() {
            Ok(uri) => {
                let (hand_back, report) = HandBack::new();
                let mut req = Request::new(B::from(request.body.clone()));
                *req.method_mut() = request.method.clone();
                *req.uri_mut() = uri;
                *req.headers_mut() = request.header_map();
                let delivery = InboxDelivery::new(key.clone(), attempt, crashes, received_at);
                req.extensions_mut().insert(delivery);
                req.extensions_mut().insert(guard.handle());
                req.extensions_mut().insert(hand_back.clone());
                guard.start();
                let ended = through_the_app(&mut guard, service, req, &hand_back, report).await;
                guard.handler_answered(None);
                ended
            }
            Err(error) => {
                // A stored path that no longer parses can never run: dead at once.
                owner.plan().failure = Settlement::Dead;
                Ended {
                    result: AttemptResult::Error(format!("the stored path is not a URI: {error}")),
                    unreached: true,
                }
            }
        };
        let success = match ended.result {
            AttemptResult::Status(status) => http::StatusCode::from_u16(status)
                .is_ok_and(|status| owner.shared.settings.commit_when.commits(status)),
            _ => false,
        };
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let failure = {
            let mut plan = owner.plan();
            plan.history
                .push(Attempt::new(started_ms, took_ms, ended.result.clone()));
            plan.failure
        };
        let outcome = guard
            .settle(if success {
                Settle::Commit
            } else {
                Settle::Release
            })
            .await;
        let label = match (outcome, success, failure) {
            (Outcome::LeaseLost, ..) => "lease-lost",
            (_, true, _) => "done",
            (_, false, Settlement::Dead) => "dead",
            _ => "retry",
        };
        let span = tracing::Span::current();
        if let AttemptResult::Status(status) = ended.result {
            span.record("status", status);
        }
        span.record("result", label);
        crate::metrics::inbox_attempt(key.namespace(), label);
        let result = &ended.result;
        match label {
            _ if ended.unreached => tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                attempt,
                result = ?result,
                next = label,
                "an inbox delivery did not reach its route's handler: the attempt failed; check \
                 that the workers' service is the app that serves the route, and that nothing in \
                 front of the route answers for it",
            ),
            "dead" => tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                attempt,
                result = ?result,
                "inbox entry dead after its last attempt; it waits for a person",
            ),
            "retry" => tracing::info!(
                namespace = key.namespace(),
                key = key.value(),
                attempt,
                result = ?result,
                "inbox attempt failed; it is tried again later",
            ),
            _ => {}
        }
    };
    run.instrument(span).await;
}

/// Sends the request through the app and hears how the route's handler answered: its report,
/// whatever the app made of it (an app-wide timeout's 408 while the handler still runs, say).
/// An app that answers without reaching the route is a failed attempt that says so.
async fn through_the_app<O, S, B, ResB>(
    guard: &mut LeaseGuard<O>,
    service: S,
    req: Request<B>,
    hand_back: &HandBack,
    mut report: oneshot::Receiver<Report>,
) -> Ended
where
    O: Owner,
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    enum Heard<T> {
        Report(Option<Report>),
        App(T),
    }
    let mut app = pin!(call(service, req));
    let first = async {
        tokio::select! {
            biased;
            report = &mut report => Heard::Report(report.ok()),
            answered = &mut app => Heard::App(answered),
        }
    };
    let report = match heartbeat(guard, pin!(first)).await {
        Heard::Report(report) => report,
        Heard::App(answered) => {
            if !hand_back.close() {
                return unreached(answered);
            }
            // The route runs its handler detached: the app answered without waiting for it.
            heartbeat(guard, pin!(async { report.await.ok() })).await
        }
    };
    match report {
        Some(Report::Answered(status)) => Ended {
            result: AttemptResult::Status(status.as_u16()),
            unreached: false,
        },
        Some(Report::Failed(error)) => failed(error),
        Some(Report::Panicked(said)) => failed(format!("the handler panicked: {said}")),
        None => failed("the handler's run ended without an answer (its runtime shut down)".into()),
    }
}

fn failed(error: String) -> Ended {
    Ended {
        result: AttemptResult::Error(error),
        unreached: false,
    }
}

/// The attempt whose request never reached its route, from what the app answered instead.
fn unreached<ResB, E: Into<BoxError>>(answered: Ran<Response<ResB>, E>) -> Ended {
    let said = match answered {
        Ok(Ok(res)) => format!("the app answered {}", res.status()),
        Ok(Err(error)) => format!("the app failed: {}", error.into()),
        Err(panic) => format!("the app panicked: {}", panic_message(&*panic)),
    };
    Ended {
        result: AttemptResult::Error(format!("did not reach its inbox route: {said}")),
        unreached: true,
    }
}
