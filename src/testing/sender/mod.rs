//! [`Sender`]: an at-least-once sender that plays the [scenarios](Scenario) against an app.

mod play;
mod report;
mod scenario;
mod socket;

use std::fmt;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tower_service::Service;

use crate::body::BoxError;

pub use report::{Failure, Report};
use scenario::Kind;
pub use scenario::Scenario;

/// An app's answer, its body boxed.
type Answer = Response<UnsyncBoxBody<Bytes, BoxError>>;

/// One instance of the app, its types erased: a request in, its answer out.
type Call =
    Arc<dyn Fn(Request<Bytes>) -> BoxFuture<'static, Result<Answer, BoxError>> + Send + Sync>;

/// Builds the instance of the given number.
type Build<S> = Arc<dyn Fn(usize) -> BoxFuture<'static, S> + Send + Sync>;

/// Counts the effects.
type Count = Arc<dyn Fn() -> BoxFuture<'static, usize> + Send + Sync>;

/// An at-least-once sender, to play the [scenarios](Scenario) that find the bugs of a
/// receiver against an app: the same delivery in a row, at once, across instances, two events
/// in reverse order, a sender that hangs up and sends again.
///
/// The app is any tower service of `Request<B>` (an axum `Router`, a service behind this
/// crate's layers) whose clones share its state. Give it the count of side effects with
/// [`effects`](Self::effects): a closure that reads the app's own table, or a counter. The
/// requests carry a `Full<Bytes>` body unless [`request_body`](Self::request_body) names
/// another. Every scenario but [`hang_up`](Scenario::hang_up) calls the app directly,
/// without a socket.
///
/// The scenarios run on the test's Tokio runtime and spawn tasks on it: a multi-threaded
/// runtime (`#[tokio::test(flavor = "multi_thread")]`) lets concurrent copies truly overlap.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
/// use http::Response;
/// use tower::{ServiceBuilder, service_fn};
/// use tower_idempotency::testing::{Scenario, Sender, sign};
/// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let emails = Arc::new(AtomicUsize::new(0));
/// let sent = emails.clone();
/// let app = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()).verify(verify::github("s3cret")))
///     .service(service_fn(move |_req| {
///         let sent = sent.clone();
///         async move {
///             tokio::time::sleep(std::time::Duration::from_millis(5)).await;
///             sent.fetch_add(1, Ordering::SeqCst); // the side effect
///             Ok::<_, std::convert::Infallible>(Response::new(String::new()))
///         }
///     }));
/// let sender = Sender::new(app).effects(move || std::future::ready(emails.load(Ordering::SeqCst)));
///
/// let github = sign::github("s3cret");
/// sender.assert(Scenario::in_a_row(&github.delivery("d-1", "{}"), 3)).await;
/// let report = sender.assert(Scenario::at_once(&github.delivery("d-2", "{}"), 8)).await;
/// assert_eq!(report.effects(), Some(1));
/// # }
/// ```
#[must_use]
pub struct Sender<S, B = Full<Bytes>> {
    build: Build<S>,
    instances: usize,
    effects: Option<Count>,
    retry_every: Duration,
    give_up_after: Duration,
    body: PhantomData<fn() -> B>,
}

impl<S> Sender<S> {
    /// A sender to one instance of `app`, cloned for each delivery.
    ///
    /// ```
    /// use tower_idempotency::testing::Sender;
    ///
    /// let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let sender = Sender::new(app);
    /// assert!(format!("{sender:?}").contains("instances: 1"));
    /// ```
    pub fn new(app: S) -> Self
    where
        S: Clone + Send + 'static,
    {
        let app = Mutex::new(app);
        Self::instances(1, move |_| std::future::ready(clone_of(&app)))
    }

    /// A sender to `count` instances of the app, the way several processes of it run: `build`
    /// makes instance `0`, `1`, … afresh for each scenario, each with its own connections
    /// (its own pool, its own store handle). The copies of a delivery go to each instance in
    /// turn. Instances that share nothing but their database find the missing unique index;
    /// instances built over separate in-memory stores fail, as they should.
    ///
    /// # Panics
    ///
    /// If `count` is 0.
    ///
    /// ```
    /// use tower_idempotency::testing::Sender;
    ///
    /// let sender = Sender::instances(2, |_instance| async {
    ///     tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     })
    /// });
    /// assert!(format!("{sender:?}").contains("instances: 2"));
    /// ```
    pub fn instances<F, Fut>(count: usize, build: F) -> Self
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
    {
        assert!(count > 0, "a sender needs at least one instance of the app");
        Self {
            build: Arc::new(move |instance| Box::pin(build(instance))),
            instances: count,
            effects: None,
            retry_every: Duration::from_millis(50),
            give_up_after: Duration::from_secs(30),
            body: PhantomData,
        }
    }
}

impl<S, B> Sender<S, B> {
    /// How the side effects are counted: a closure whose future reads how many effects the
    /// app had so far (a `SELECT count(*)` of its table, a counter). A scenario counts
    /// before it starts and after each 2xx, and judges the difference, so effects from
    /// before it do not matter; give each scenario an event of its own.
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    /// use tower_idempotency::testing::Sender;
    ///
    /// # let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let effects = Arc::new(AtomicUsize::new(0));
    /// let sender = Sender::new(app).effects(move || std::future::ready(effects.load(Ordering::SeqCst)));
    /// assert!(format!("{sender:?}").contains("effects: true"));
    /// ```
    pub fn effects<F, Fut>(mut self, count: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = usize> + Send + 'static,
    {
        self.effects = Some(Arc::new(move || Box::pin(count())));
        self
    }

    /// How long the sender waits before it sends again a delivery answered 409 (default 50
    /// ms). It does not wait for `Retry-After`, so that tests stay quick.
    ///
    /// ```
    /// # let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// use std::time::Duration;
    /// use tower_idempotency::testing::Sender;
    ///
    /// let sender = Sender::new(app).retry_every(Duration::from_millis(10));
    /// assert!(format!("{sender:?}").contains("retry_every: 10ms"));
    /// ```
    pub fn retry_every(mut self, interval: Duration) -> Self {
        self.retry_every = interval;
        self
    }

    /// How long a delivery may go on being answered 409, or unanswered, before the scenario
    /// fails (default 30 s): longer than the app's slowest handler.
    ///
    /// ```
    /// # let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// use std::time::Duration;
    /// use tower_idempotency::testing::Sender;
    ///
    /// let sender = Sender::new(app).give_up_after(Duration::from_secs(5));
    /// assert!(format!("{sender:?}").contains("give_up_after: 5s"));
    /// ```
    pub fn give_up_after(mut self, patience: Duration) -> Self {
        self.give_up_after = patience;
        self
    }

    /// Sends requests with a body of type `B2` instead of `Full<Bytes>`, for an app that
    /// takes only that one: a boxed service of axum's `Body`, say.
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    /// use axum::{Router, body::Body, response::Response, routing::post};
    /// use tower::util::BoxCloneService;
    /// use tower_idempotency::testing::{Scenario, Sender, sign};
    /// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let effects = Arc::new(AtomicUsize::new(0));
    /// let counted = effects.clone();
    /// let handler = move || async move { counted.fetch_add(1, Ordering::SeqCst); "ok" };
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).key(key::github());
    /// let router = Router::new().route("/hooks", post(handler).layer(layer));
    /// let app: BoxCloneService<http::Request<Body>, Response, std::convert::Infallible> = BoxCloneService::new(router);
    ///
    /// let sender = Sender::new(app)
    ///     .request_body::<Body>()
    ///     .effects(move || std::future::ready(effects.load(Ordering::SeqCst)));
    /// let delivery = sign::github("s").delivery("d-1", "{}").to("/hooks");
    /// assert_eq!(sender.assert(Scenario::in_a_row(&delivery, 2)).await.effects(), Some(1));
    /// # }
    /// ```
    pub fn request_body<B2>(self) -> Sender<S, B2> {
        Sender {
            build: self.build,
            instances: self.instances,
            effects: self.effects,
            retry_every: self.retry_every,
            give_up_after: self.give_up_after,
            body: PhantomData,
        }
    }
}

impl<S, B, RB> Sender<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: From<Bytes> + Send + 'static,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    /// Plays `scenario` against fresh instances of the app, and reports what it sent, what
    /// was answered and how many effects there were; or fails, saying what went wrong and
    /// its usual cause.
    ///
    /// # Panics
    ///
    /// If the scenario counts effects and no [`effects`](Self::effects) were given.
    ///
    /// ```
    /// use tower_idempotency::testing::{Scenario, Sender, sign};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // An app that applies every event it is sent, in the order it comes: no version guard.
    /// let applied = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    /// let state = applied.clone();
    /// let app = tower::service_fn(move |req: http::Request<http_body_util::Full<bytes::Bytes>>| {
    ///     let applied = applied.clone();
    ///     async move {
    ///         let body = http_body_util::BodyExt::collect(req.into_body()).await?.to_bytes();
    ///         *applied.lock().unwrap() = String::from_utf8_lossy(&body).into_owned();
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }
    /// });
    /// let github = sign::github("s");
    /// let (older, newer) = (github.delivery("d-1", "active"), github.delivery("d-2", "cancelled"));
    /// let read = move || std::future::ready(state.lock().unwrap().clone());
    /// let failure = Sender::new(app).run(Scenario::newer_first(&older, &newer, read)).await.unwrap_err();
    /// assert!(failure.to_string().contains("the older event overwrote"), "{failure}");
    /// # }
    /// ```
    pub async fn run(&self, scenario: Scenario) -> Result<Report, Failure> {
        let mut apps = Vec::with_capacity(self.instances);
        for instance in 0..self.instances {
            apps.push(Self::erase((self.build)(instance).await));
        }
        let play = play::Play {
            label: scenario.label(self.instances),
            apps,
            effects: self.effects.as_ref(),
            retry_every: self.retry_every,
            give_up_after: self.give_up_after,
        };
        match scenario.kind {
            Kind::InARow { delivery, copies } => play.in_a_row(&delivery, copies).await,
            Kind::AtOnce { delivery, copies } => play.at_once(&delivery, copies).await,
            Kind::NewerFirst {
                older,
                newer,
                state,
            } => play.newer_first(&older, &newer, state).await,
            // Over a socket of its own: the only scenario that needs one.
            Kind::HangUp { delivery, after } => socket::hang_up(play, &delivery, after).await,
        }
    }

    /// Plays `scenario` as [`run`](Self::run) does, and panics with the failure's message if
    /// the app fails it.
    ///
    /// # Panics
    ///
    /// If the app fails the scenario, or as [`run`](Self::run).
    ///
    /// ```should_panic
    /// use tower_idempotency::testing::{Scenario, Sender, sign};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // An app that answers 200 and never does anything.
    /// let app = tower::service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let sender = Sender::new(app).effects(|| std::future::ready(0));
    /// sender.assert(Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 2)).await;
    /// # }
    /// ```
    pub async fn assert(&self, scenario: Scenario) -> Report {
        match self.run(scenario).await {
            Ok(report) => report,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// `app` behind a [`Call`]: cloned for each request, made ready, called, its answer's body
    /// boxed.
    fn erase(app: S) -> Call {
        let app = Mutex::new(app);
        Arc::new(move |request: Request<Bytes>| {
            let mut app = clone_of(&app);
            let request = request.map(B::from);
            Box::pin(async move {
                poll_fn(|cx| app.poll_ready(cx)).await.map_err(Into::into)?;
                let response = app.call(request).await.map_err(Into::into)?;
                Ok(response.map(|body| {
                    body.map_frame(|frame| {
                        frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
                    })
                    .map_err(Into::into)
                    .boxed_unsync()
                }))
            })
        })
    }
}

/// A clone of the app `shared` holds: under a lock, since a service need not be `Sync`.
fn clone_of<S: Clone>(shared: &Mutex<S>) -> S {
    shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

impl<S, B> fmt::Debug for Sender<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("instances", &self.instances)
            .field("effects", &self.effects.is_some())
            .field("retry_every", &self.retry_every)
            .field("give_up_after", &self.give_up_after)
            .finish()
    }
}
