//! Playing a scenario: the ones without a socket here, and the verdict every scenario that
//! counts effects shares.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::Barrier;
use tokio::time::Instant;

use super::report::{
    Attempt, EARLY_ANSWER, Failure, Report, effects_cause, endless_cause, plural, status_cause,
};
use super::scenario::ReadState;
use super::{Call, Count};
use crate::response::OUTCOME_HEADER;
use crate::testing::Delivery;

/// A scenario about to be played: the instances built, the sender's settings.
pub(super) struct Play<'a> {
    pub(super) label: String,
    pub(super) apps: Vec<Call>,
    pub(super) effects: Option<&'a Count>,
    pub(super) retry_every: Duration,
    pub(super) give_up_after: Duration,
}

/// What went wrong with one delivery (`who`: "copy 3").
pub(super) struct Trouble {
    pub(super) who: String,
    pub(super) what: What,
}

pub(super) enum What {
    /// Answered 2xx before its effect could be seen.
    Early(StatusCode),
    /// Answered with a status a sender cannot act on.
    Refused(StatusCode),
    /// Answered 409 until the sender gave up.
    Endless,
    /// Not answered: the app's error, a panic, a closed connection.
    NoAnswer,
}

/// The effects of a scenario: the sender's counter, and what it read before the scenario.
#[derive(Clone)]
pub(super) struct Tally {
    count: Count,
    before: usize,
}

impl Tally {
    /// How many effects there were since the scenario began.
    pub(super) async fn seen(&self) -> usize {
        (self.count)().await.saturating_sub(self.before)
    }
}

impl Play<'_> {
    /// Reads the effect counter before the scenario begins.
    pub(super) async fn tally(&self) -> Tally {
        let count = self
            .effects
            .cloned()
            .expect("this scenario counts effects: give the sender `.effects(..)`");
        let before = count().await;
        Tally { count, before }
    }

    /// The instance that copy `n` goes to: each in turn.
    fn app(&self, n: usize) -> &Call {
        &self.apps[n % self.apps.len()]
    }

    pub(super) async fn in_a_row(
        self,
        delivery: &Delivery,
        copies: usize,
    ) -> Result<Report, Failure> {
        let tally = self.tally().await;
        let mut report = Report::new(self.label.clone(), delivery.to_string());
        let mut troubles = Vec::new();
        for copy in 0..copies {
            let attempt = send(self.app(copy), delivery).await;
            report.chains.push(vec![attempt.clone()]);
            let what = match attempt {
                Attempt::Answer(status, _) if status.is_success() => match tally.seen().await {
                    0 => What::Early(status),
                    _ => continue,
                },
                Attempt::Answer(status, _) => What::Refused(status),
                Attempt::HungUp | Attempt::Error(_) => What::NoAnswer,
            };
            troubles.push(Trouble {
                who: format!("copy {}", copy + 1),
                what,
            });
            break;
        }
        self.verdict(report, &tally, troubles, Verdict::InARow)
            .await
    }

    pub(super) async fn at_once(
        self,
        delivery: &Delivery,
        copies: usize,
    ) -> Result<Report, Failure> {
        let tally = self.tally().await;
        let mut report = Report::new(self.label.clone(), delivery.to_string());
        let start = Arc::new(Barrier::new(copies));
        let tasks: Vec<_> = (0..copies)
            .map(|copy| {
                let (app, delivery, tally) =
                    (self.app(copy).clone(), delivery.clone(), tally.clone());
                let start = start.clone();
                let (retry_every, give_up_after) = (self.retry_every, self.give_up_after);
                tokio::spawn(async move {
                    start.wait().await;
                    let deadline = Instant::now() + give_up_after;
                    let mut tries = Vec::new();
                    loop {
                        let attempt = send(&app, &delivery).await;
                        let next = until_2xx(&attempt, &tally, deadline).await;
                        tries.push(attempt);
                        match next {
                            Next::Again => tokio::time::sleep(retry_every).await,
                            Next::Done => break (tries, None),
                            Next::Wrong(what) => break (tries, Some(what)),
                        }
                    }
                })
            })
            .collect();
        let mut troubles = Vec::new();
        for (copy, task) in tasks.into_iter().enumerate() {
            let (tries, what) = task.await.unwrap_or_else(|error| {
                let error = Attempt::Error(format!(
                    "the copy's task failed (the app or the effect counter panicked): {error}"
                ));
                (vec![error], Some(What::NoAnswer))
            });
            report.chains.push(tries);
            if let Some(what) = what {
                let who = format!("copy {}", copy + 1);
                troubles.push(Trouble { who, what });
            }
        }
        self.verdict(report, &tally, troubles, Verdict::AtOnce)
            .await
    }

    pub(super) async fn newer_first(
        self,
        older: &Delivery,
        newer: &Delivery,
        state: ReadState,
    ) -> Result<Report, Failure> {
        let mut report = Report::new(self.label.clone(), format!("{newer}, then {older}"));
        let label = self.label.clone();
        let first = state().await;
        let mut applied = None;
        for (n, (who, delivery)) in [("the newer event", newer), ("the older event", older)]
            .into_iter()
            .enumerate()
        {
            let attempt = send(self.app(n), delivery).await;
            report.chains.push(vec![attempt.clone()]);
            match attempt {
                Attempt::Answer(status, _) if status.is_success() => {}
                Attempt::Answer(status, _) => {
                    let problem = format!("{who} was answered {}, in {label}", status.as_u16());
                    return Err(report.fail(problem, status_cause(status, false)));
                }
                Attempt::HungUp | Attempt::Error(_) => {
                    let problem = format!("{who} got no answer, in {label}");
                    return Err(report.fail(problem, "the app failed instead of answering"));
                }
            }
            if applied.is_none() {
                let newer_state = state().await;
                if newer_state.same(&*first) {
                    let problem = format!("the newer event left the state as it was ({first:?})");
                    return Err(report.fail(
                        problem,
                        "the route did not apply it, or the state reader does not read what \
                         the route writes",
                    ));
                }
                applied = Some(newer_state);
            }
        }
        let applied = applied.expect("the newer event was applied");
        let last = state().await;
        if !last.same(&*applied) {
            let problem = format!(
                "the older event overwrote the newer one's state ({applied:?} became {last:?})"
            );
            return Err(report.fail(
                problem,
                "the route applies events in the order they arrive: guard the write with the \
                 sender's version (`WHERE version < $new`), or put a VersionGuardLayer on the \
                 route",
            ));
        }
        Ok(report)
    }

    /// Judges a scenario that counts effects, once it is over: one effect, and no trouble.
    /// The most telling problem is named: a second effect first, an early answer before a
    /// refusal.
    pub(super) async fn verdict(
        &self,
        mut report: Report,
        tally: &Tally,
        troubles: Vec<Trouble>,
        kind: Verdict,
    ) -> Result<Report, Failure> {
        let effects = tally.seen().await;
        report.effects = Some(effects);
        let label = &self.label;
        let effects_problem = || format!("{} for 1 event after {label}", plural(effects, "effect"));
        if effects > 1 {
            let cause = effects_cause(&report, effects, self.apps.len(), kind == Verdict::HangUp);
            return Err(report.fail(effects_problem(), cause));
        }
        let rank = |what: &What| match what {
            What::NoAnswer => 0,
            What::Early(_) => 1,
            What::Refused(_) => 2,
            What::Endless => 3,
        };
        if let Some(Trouble { who, what }) = troubles.into_iter().min_by_key(|t| rank(&t.what)) {
            let (problem, cause) = match what {
                What::NoAnswer => (
                    format!("{who} got no answer, in {label}"),
                    "the app failed instead of answering".to_owned(),
                ),
                What::Early(status) => (
                    format!(
                        "{who} was answered {} before the event's effect could be seen, in {label}",
                        status.as_u16()
                    ),
                    EARLY_ANSWER.to_owned(),
                ),
                What::Refused(status) => (
                    format!("{who} was answered {}, in {label}", status.as_u16()),
                    status_cause(status, kind == Verdict::InARow).to_owned(),
                ),
                What::Endless => (
                    format!("{who} was never answered 2xx, in {label}"),
                    endless_cause(self.give_up_after),
                ),
            };
            return Err(report.fail(problem, cause));
        }
        if effects == 0 {
            let cause = effects_cause(&report, 0, self.apps.len(), false);
            return Err(report.fail(effects_problem(), cause));
        }
        Ok(report)
    }
}

/// Which scenario a verdict is about.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    InARow,
    AtOnce,
    HangUp,
}

/// What follows an attempt of a delivery sent again until it is answered 2xx.
pub(super) enum Next {
    /// Answered 2xx, its effect seen.
    Done,
    /// Answered 409 before the deadline: sent again after a pause.
    Again,
    /// Gone wrong.
    Wrong(What),
}

/// Judges `attempt` of a delivery sent again until it is answered 2xx, answered 409 until
/// `deadline`; `tally`: the scenario's effects.
pub(super) async fn until_2xx(attempt: &Attempt, tally: &Tally, deadline: Instant) -> Next {
    match attempt {
        Attempt::Answer(status, _) if status.is_success() => match tally.seen().await {
            0 => Next::Wrong(What::Early(*status)),
            _ => Next::Done,
        },
        Attempt::Answer(StatusCode::CONFLICT, _) if Instant::now() < deadline => Next::Again,
        Attempt::Answer(StatusCode::CONFLICT, _) => Next::Wrong(What::Endless),
        Attempt::Answer(status, _) => Next::Wrong(What::Refused(*status)),
        Attempt::HungUp | Attempt::Error(_) => Next::Wrong(What::NoAnswer),
    }
}

/// Sends `delivery` to `app` and reads its whole answer.
async fn send(app: &Call, delivery: &Delivery) -> Attempt {
    let response = match app(delivery.request_with_body::<Bytes>()).await {
        Ok(response) => response,
        Err(error) => return Attempt::Error(format!("the app failed: {error}")),
    };
    let status = response.status();
    let outcome = response
        .headers()
        .get(OUTCOME_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    match response.into_body().collect().await {
        Ok(_) => Attempt::Answer(status, outcome),
        Err(error) => Attempt::Error(format!("the answer's body failed: {error}")),
    }
}
