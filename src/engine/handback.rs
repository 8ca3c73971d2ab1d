//! A delivery handed back through the app: how an inbox worker's request reaches its route's
//! handler, and how the handler's own answer gets back to the worker.
//!
//! A worker rebuilds a stored delivery and sends it through the whole app, so that routing,
//! path parameters and extractors work as they did for the sender. What the app does around the
//! route must not decide the entry's fate: an app-wide timeout that gives up half way, another
//! guard in front that answers by itself, a fallback's 404. So the request carries a
//! [`HandBack`]. The layer of its route takes it ([`HandBack::reach`]), runs the handler
//! detached ([`run_reported`]) and sends the handler's status, error or panic through it; the
//! worker waits for that [`Report`]. When the app answers and nothing reached the route, the
//! worker closes the hand-back ([`HandBack::close`]), and a route reached after that (the
//! request kept alive somewhere and sent on late) refuses to run: the worker has already
//! counted the attempt as failed.
//!
//! Guards in front of the route (any layer of this crate that sees the request before its
//! route does) let a pending hand-back through: the inbox already settled who runs the event.
//! Guards behind the route's layer see it reached, and guard it as any other delivery.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use http::{Response, StatusCode};
use tokio::sync::oneshot;
use tower_service::Service;

use super::run::{Detach, Ran, call};
use crate::body::ResponseBody;

/// How the handler of a handed-back delivery answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// It answered with this status.
    Answered(StatusCode),
    /// Its service returned an error; the text says which.
    Failed(String),
    /// It panicked; the text is the panic's message.
    Panicked(String),
}

/// In the extensions of a delivery an inbox worker sends back through the app. Cheap to clone;
/// every clone is the same hand-back.
#[derive(Clone)]
pub(crate) struct HandBack(Arc<Mutex<Slot>>);

enum Slot {
    /// Nothing reached the route yet; the worker waits for the report.
    Waiting(oneshot::Sender<Report>),
    /// The route's layer took it: its handler runs, and reports.
    Reached,
    /// The worker stopped waiting: the app answered without reaching the route.
    Closed,
}

/// What the layer of a route finds when it [reaches](HandBack::reach) a hand-back.
pub(crate) enum Reach {
    /// It is the first: run the handler and report through this.
    Run(Reporter),
    /// Another layer of the kind reached it first (one inbox layer inside another): the
    /// handler runs under that one.
    Reached,
    /// The worker gave up on the request before it arrived: the handler must not run.
    Closed,
}

/// Sends the handler's answer to the worker, once.
pub(crate) struct Reporter(oneshot::Sender<Report>);

impl Reporter {
    fn send(self, report: Report) {
        // The worker may be gone (its runtime shut down); the entry then turns stale.
        let _ = self.0.send(report);
    }
}

impl HandBack {
    /// A hand-back, and where its report arrives.
    pub(crate) fn new() -> (Self, oneshot::Receiver<Report>) {
        let (sender, receiver) = oneshot::channel();
        (Self(Arc::new(Mutex::new(Slot::Waiting(sender)))), receiver)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Each critical section leaves the slot whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the request is still on its way to its route: a guard in front of the route
    /// lets it through.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(*self.slot(), Slot::Waiting(_))
    }

    /// The route's layer takes the hand-back.
    pub(crate) fn reach(&self) -> Reach {
        let mut slot = self.slot();
        match std::mem::replace(&mut *slot, Slot::Reached) {
            Slot::Waiting(sender) => Reach::Run(Reporter(sender)),
            Slot::Reached => Reach::Reached,
            Slot::Closed => {
                *slot = Slot::Closed;
                Reach::Closed
            }
        }
    }

    /// The worker stops waiting for the route (the app answered): `true` if the route was
    /// reached, and its handler's report is still to come; `false` if it never was, and now
    /// never will be.
    pub(crate) fn close(&self) -> bool {
        let mut slot = self.slot();
        match *slot {
            Slot::Reached => true,
            Slot::Waiting(_) | Slot::Closed => {
                *slot = Slot::Closed;
                false
            }
        }
    }
}

impl fmt::Debug for HandBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match *self.slot() {
            Slot::Waiting(_) => "waiting",
            Slot::Reached => "reached",
            Slot::Closed => "closed",
        };
        f.debug_tuple("HandBack").field(&state).finish()
    }
}

/// Runs the route's handler for a delivery handed back to it, and reports its answer: to
/// completion whoever still waits, as a claimed delivery's run (an app-wide timeout that stops
/// waiting moves it into a task of its own; the worker waits for the report, not for the app).
/// The app then hears the handler's answer, its error or its panic, as it would inline.
/// `describe` says what the service's error was.
pub(crate) async fn run_reported<S, Req, ResB>(
    inner: S,
    request: Req,
    reporter: Reporter,
    describe: fn(&S::Error) -> String,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Req, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    Req: Send + 'static,
    ResB: Send + 'static,
{
    let run = async move {
        let ran = call(inner, request).await;
        reporter.send(report_of(&ran, describe));
        ran
    };
    match Detach::new(run, drop).await {
        Ok(Ok(res)) => Ok(res.map(ResponseBody::new)),
        Ok(Err(error)) => Err(error),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn report_of<T, E>(ran: &Ran<Response<T>, E>, describe: fn(&E) -> String) -> Report {
    match ran {
        Ok(Ok(res)) => Report::Answered(res.status()),
        Ok(Err(error)) => Report::Failed(describe(error)),
        Err(panic) => Report::Panicked(panic_message(&**panic)),
    }
}

/// What a panic said, or a stand-in when it carried no text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
        .to_owned()
}

/// What a mode does with a request that carries a [`HandBack`].
pub(crate) enum HandedBack {
    /// Lets it through unguarded: a guard in front of the route.
    PassThrough,
    /// Guards it as any other delivery: a guard behind the route's layer.
    Guard,
    /// Runs the handler and reports: the route's own layer.
    Run(Reporter),
    /// Answers 409 and runs nothing: the worker gave up on this request already.
    Refuse,
}

/// What a guard that is not the route's own layer does: in front of the route (the hand-back
/// still pending), it lets the request through; behind it, it guards it.
pub(crate) fn in_front_or_behind(hand_back: &HandBack) -> HandedBack {
    if hand_back.is_pending() {
        HandedBack::PassThrough
    } else {
        HandedBack::Guard
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    #[test]
    fn the_first_reach_runs_later_ones_do_not_and_a_closed_one_refuses() {
        let (hand_back, _report) = HandBack::new();
        assert!(hand_back.is_pending());
        assert!(matches!(hand_back.clone().reach(), Reach::Run(_)));
        assert!(!hand_back.is_pending());
        assert!(matches!(hand_back.reach(), Reach::Reached));
        assert!(hand_back.close(), "reached: the report is still to come");

        let (hand_back, _report) = HandBack::new();
        assert!(!hand_back.close(), "never reached");
        assert!(matches!(hand_back.reach(), Reach::Closed));
        assert!(matches!(hand_back.reach(), Reach::Closed), "stays closed");
    }

    #[tokio::test]
    async fn the_report_says_how_the_handler_answered() {
        let (hand_back, report) = HandBack::new();
        let Reach::Run(reporter) = hand_back.reach() else {
            panic!("first reach");
        };
        let handler = tower::service_fn(|_: ()| async {
            Ok::<_, Infallible>(Response::builder().status(202).body(()).unwrap())
        });
        let res = run_reported(handler, (), reporter, ToString::to_string)
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        assert_eq!(
            report.await.unwrap(),
            Report::Answered(StatusCode::ACCEPTED)
        );

        let (hand_back, report) = HandBack::new();
        let Reach::Run(reporter) = hand_back.reach() else {
            panic!("first reach");
        };
        let failing = tower::service_fn(|_: ()| async { Err::<Response<()>, _>("no database") });
        assert_eq!(
            run_reported(failing, (), reporter, |e: &&str| e.to_string())
                .await
                .unwrap_err(),
            "no database"
        );
        assert_eq!(report.await.unwrap(), Report::Failed("no database".into()));
    }

    #[tokio::test]
    async fn a_run_whose_caller_stops_waiting_finishes_and_reports() {
        let (hand_back, report) = HandBack::new();
        let Reach::Run(reporter) = hand_back.reach() else {
            panic!("first reach");
        };
        let slow = tower::service_fn(|_: ()| async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Ok::<_, Infallible>(Response::new(()))
        });
        let run = run_reported(slow, (), reporter, ToString::to_string);
        // An app-wide timeout far shorter than the handler.
        let cut = tokio::time::timeout(std::time::Duration::from_millis(1), run).await;
        assert!(cut.is_err(), "the caller gave up");
        assert_eq!(report.await.unwrap(), Report::Answered(StatusCode::OK));
    }

    #[test]
    fn a_panic_message_is_kept() {
        assert_eq!(panic_message(&"boom"), "boom");
        assert_eq!(panic_message(&String::from("bang")), "bang");
        assert_eq!(panic_message(&7u8), "(no message)");
    }
}
