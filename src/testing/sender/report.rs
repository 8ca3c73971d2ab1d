//! What a scenario saw ([`Report`]), and why it failed ([`Failure`]), with the usual cause.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

/// One try of a delivery, as the sender saw it.
#[derive(Clone, Debug)]
pub(super) enum Attempt {
    /// An answer: its status and the layer's `idempotency-outcome`, if any.
    Answer(StatusCode, Option<String>),
    /// The sender hung up before the answer.
    HungUp,
    /// No answer: the app's error, a panic, a connection closed.
    Error(String),
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Answer(status, None) => write!(f, "{}", status.as_u16()),
            Self::Answer(status, Some(outcome)) => write!(f, "{} {outcome}", status.as_u16()),
            Self::HungUp => f.write_str("hung up"),
            Self::Error(_) => f.write_str("error"),
        }
    }
}

/// What a scenario sent and got back, and the effects it counted.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
/// use http::{Response, StatusCode};
/// use tower::{ServiceBuilder, service_fn};
/// use tower_idempotency::testing::{Scenario, Sender, sign};
/// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let effects = Arc::new(AtomicUsize::new(0));
/// let count = effects.clone();
/// let app = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()))
///     .service(service_fn(move |_req| {
///         count.fetch_add(1, Ordering::SeqCst);
///         async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }
///     }));
/// let sender = Sender::new(app).effects(move || std::future::ready(effects.load(Ordering::SeqCst)));
///
/// let report = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 3)).await.unwrap();
/// assert_eq!(report.scenario(), "3 copies in a row");
/// assert_eq!(report.sent(), 3);
/// assert_eq!(report.answers(), [StatusCode::OK; 3]);
/// assert_eq!(report.effects(), Some(1));
/// assert_eq!(report.to_string(), "3 copies in a row: 3 deliveries sent, answered 200 | 200 duplicate | 200 duplicate; 1 effect");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Report {
    pub(super) scenario: String,
    /// What was delivered, in words.
    pub(super) delivery: String,
    /// Each delivery's tries, in the order sent (a copy and the retries of its 409s).
    pub(super) chains: Vec<Vec<Attempt>>,
    pub(super) effects: Option<usize>,
}

impl Report {
    pub(super) fn new(scenario: String, delivery: String) -> Self {
        Self {
            scenario,
            delivery,
            chains: Vec::new(),
            effects: None,
        }
    }

    /// The scenario, in words: `8 concurrent copies across 2 instances`.
    ///
    /// ```
    /// # use tower_idempotency::testing::{Scenario, Sender, sign};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// # let older = sign::github("s").delivery("d-1", "1");
    /// # let newer = sign::github("s").delivery("d-2", "2");
    /// let sender = Sender::new(app);
    /// let state = || std::future::ready(());
    /// let failed = sender.run(Scenario::newer_first(&older, &newer, state)).await.unwrap_err();
    /// assert_eq!(failed.report().scenario(), "the newer event, then the older one");
    /// # }
    /// ```
    pub fn scenario(&self) -> &str {
        &self.scenario
    }

    /// How many deliveries were sent: the copies, and the retries of those answered 409.
    ///
    /// ```
    /// # use tower_idempotency::testing::{Scenario, Sender, sign};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    /// # let runs = Arc::new(AtomicUsize::new(0));
    /// # let (counted, count) = (runs.clone(), runs.clone());
    /// // An app without a layer: every copy runs, so the scenario fails, and says what it sent.
    /// let app = tower::service_fn(move |_req: http::Request<http_body_util::Full<bytes::Bytes>>| {
    ///     counted.fetch_add(1, Ordering::SeqCst);
    ///     async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    /// });
    /// let sender = Sender::new(app).effects(move || std::future::ready(count.load(Ordering::SeqCst)));
    /// let failed = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await.unwrap_err();
    /// assert_eq!(failed.report().sent(), 2);
    /// # }
    /// ```
    pub fn sent(&self) -> usize {
        self.chains.iter().map(Vec::len).sum()
    }

    /// The status of every answer, in the order the deliveries were sent (a delivery the
    /// sender hung up on, or that got no answer, has none).
    ///
    /// ```
    /// # use tower_idempotency::testing::{Scenario, Sender, sign};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    /// # let runs = Arc::new(AtomicUsize::new(0));
    /// # let (counted, count) = (runs.clone(), runs.clone());
    /// // An app without a layer: every copy runs and is answered 200.
    /// let app = tower::service_fn(move |_req: http::Request<http_body_util::Full<bytes::Bytes>>| {
    ///     counted.fetch_add(1, Ordering::SeqCst);
    ///     async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    /// });
    /// let sender = Sender::new(app).effects(move || std::future::ready(count.load(Ordering::SeqCst)));
    /// let failed = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await.unwrap_err();
    /// assert_eq!(failed.report().answers(), [http::StatusCode::OK; 2]);
    /// # }
    /// ```
    pub fn answers(&self) -> Vec<StatusCode> {
        self.chains
            .iter()
            .flatten()
            .filter_map(|attempt| match attempt {
                Attempt::Answer(status, _) => Some(*status),
                _ => None,
            })
            .collect()
    }

    /// How many side effects the deliveries had, counted by the sender's
    /// [`effects`](super::Sender::effects) closure once they were answered; `None` for a
    /// scenario that reads a state instead, or that stopped before counting.
    ///
    /// ```
    /// # use tower_idempotency::testing::{Scenario, Sender, sign};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    ///
    /// let runs = Arc::new(AtomicUsize::new(0));
    /// let (counted, count) = (runs.clone(), runs.clone());
    /// // No idempotency layer: each copy runs.
    /// let app = tower::service_fn(move |_req: http::Request<http_body_util::Full<bytes::Bytes>>| {
    ///     counted.fetch_add(1, Ordering::SeqCst);
    ///     async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    /// });
    /// let sender = Sender::new(app).effects(move || std::future::ready(count.load(Ordering::SeqCst)));
    /// let failed = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await.unwrap_err();
    /// assert_eq!(failed.report().effects(), Some(2));
    /// # }
    /// ```
    pub fn effects(&self) -> Option<usize> {
        self.effects
    }

    /// Whether some answer came from this crate's layers (it names an outcome).
    pub(super) fn saw_layer(&self) -> bool {
        self.chains
            .iter()
            .flatten()
            .any(|attempt| matches!(attempt, Attempt::Answer(_, Some(_))))
    }

    /// The answers, one delivery's tries joined by arrows, deliveries by bars.
    fn answered(&self) -> String {
        let chains: Vec<String> = self
            .chains
            .iter()
            .map(|chain| {
                chain
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" → ")
            })
            .collect();
        chains.join(" | ")
    }

    /// Fails with `problem`, whose usual cause is `cause`.
    pub(super) fn fail(self, problem: String, cause: impl Into<String>) -> Failure {
        Failure {
            report: Box::new(self),
            problem,
            cause: cause.into(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} deliveries sent, answered {}",
            self.scenario,
            self.sent(),
            self.answered()
        )?;
        match self.effects {
            Some(effects) => write!(f, "; {}", plural(effects, "effect")),
            None => Ok(()),
        }
    }
}

/// `1 effect`, `2 effects`.
pub(super) fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// A scenario the app failed: what went wrong, its usual cause, and what was sent and
/// answered. Its `Display` is the whole message, over several lines; so is its `Debug`, so
/// that `.unwrap()` shows it too.
///
/// ```
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use bytes::Bytes;
/// use tower::service_fn;
/// use tower_idempotency::testing::{Scenario, Sender, sign};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let (counted, count) = (runs.clone(), runs.clone());
/// // No idempotency layer: each copy runs the handler.
/// let app = service_fn(move |_req: Request<Full<Bytes>>| {
///     counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }
/// });
/// let sender = Sender::new(app).effects(move || std::future::ready(count.load(std::sync::atomic::Ordering::SeqCst)));
/// let failure = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await.unwrap_err();
/// let message = failure.to_string();
/// assert!(message.starts_with("2 effects for 1 event after 2 copies in a row: "), "{message}");
/// assert!(message.contains("not behind an idempotency layer"), "{message}");
/// assert!(message.contains("answers: 200 | 200"), "{message}");
/// # }
/// ```
#[derive(Clone)]
pub struct Failure {
    report: Box<Report>,
    problem: String,
    cause: String,
}

impl Failure {
    /// What was sent and answered until the scenario failed.
    ///
    /// ```
    /// # use tower_idempotency::testing::{Scenario, Sender, sign};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let sender = Sender::new(app).effects(|| std::future::ready(0));
    /// let failure = sender.run(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await.unwrap_err();
    /// // The app answered 200 before any effect could be seen: the first answer ends it.
    /// assert_eq!(failure.report().answers(), [http::StatusCode::OK]);
    /// # }
    /// ```
    pub fn report(&self) -> &Report {
        &self.report
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.problem, self.cause)?;
        writeln!(f, "  scenario: {}", self.report.scenario)?;
        writeln!(f, "  delivery: {}", self.report.delivery)?;
        writeln!(f, "  deliveries sent: {}", self.report.sent())?;
        write!(f, "  answers: {}", self.report.answered())?;
        for error in self.report.chains.iter().flatten() {
            if let Attempt::Error(error) = error {
                write!(f, "\n  error: {error}")?;
            }
        }
        if let Some(effects) = self.report.effects {
            write!(f, "\n  effects: {effects}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Failure {}

/// The usual cause of a wrong number of effects.
pub(super) fn effects_cause(
    report: &Report,
    effects: usize,
    instances: usize,
    hung_up: bool,
) -> &'static str {
    if effects == 0 {
        return "no effect was counted: the handler failed without saying so, the effect \
                counter reads another table or event, or the event was processed before the \
                scenario began (give each scenario an event id of its own)";
    }
    if hung_up {
        return "the work ran again after the sender hung up: the handler was stopped with the \
                connection and its claim released (or it had none), so the delivery sent again \
                ran it again. A claimed handler must run to completion whoever listens \
                (IdempotencyLayer runs it in a task of its own)";
    }
    if !report.saw_layer() {
        return if instances > 1 {
            "every copy ran the handler: the route is not behind an idempotency layer, its key \
             is not the sender's event id, or its store is not shared between instances"
        } else {
            "every copy ran the handler: the route is not behind an idempotency layer, or its \
             key is not the sender's event id"
        };
    }
    if instances > 1 {
        "the route's store is not shared between instances, or its unique index is missing"
    } else {
        "copies that met ran the work each: the claim is not atomic (a read, then a write, \
         instead of one insert that a unique index arbitrates), or the work also runs outside \
         the layer"
    }
}

/// The usual cause of an answer a sender cannot act on.
pub(super) fn status_cause(status: StatusCode, in_a_row: bool) -> &'static str {
    match status.as_u16() {
        400 => {
            "the route found no key, or refused the body: does the delivery carry the sender's \
             event id where the route's key looks for it?"
        }
        401 | 403 => {
            "the signature was refused: is the delivery signed with the route's secret, at a \
             time within its tolerance?"
        }
        404 | 405 => {
            "no route took it: is the delivery sent to the route's path (`Delivery::to`) with \
             its method?"
        }
        409 if in_a_row => {
            "the copy before was answered, yet its claim was still in flight: the handler \
             answers before its claim is settled"
        }
        503 => "the store was unreachable, or the app was shutting down",
        500..=599 => {
            "the handler failed; where copies meet, often on the database's unique index, which \
             the handler should take for a duplicate and answer 2xx"
        }
        _ => "a sender retries any answer but 2xx, and an event it keeps retrying runs again",
    }
}

/// The usual cause of a 2xx answered before its effect could be seen.
pub(super) const EARLY_ANSWER: &str = "the handler answers before its work is done (work \
    spawned after the answer, or queued): a sender that got this 2xx never sends again, so work \
    that fails afterwards is lost. Do the work before answering";

/// The usual cause of a 409 that never ends.
pub(super) fn endless_cause(after: Duration) -> String {
    format!(
        "still 409 after {after:?} of retries: the first delivery's claim was never settled \
         (a handler that never ends, or a claim left `processing`)"
    )
}
