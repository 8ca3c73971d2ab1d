//! The body types the layer passes on and answers with.
//!
//! The inner service receives a [`RequestBody`]: the original body, untouched, when the key
//! came from the headers; the buffered bytes when the extractor had to read the body. Either
//! way it reads the same bytes the client sent. Responses are [`ResponseBody`]: the inner
//! service's body, or one of the layer's own short answers.
//!
//! A body passed on untouched is still held to the layer's `body_timeout` once the delivery
//! holds its claim: the handler may wait for it that long in all (the time it spends on its own
//! work between two reads does not count). Past it, reading the body fails with a
//! [`BodyTimeoutError`] (an axum extractor then answers 400), and the claim is released
//! whatever the handler answers: an answer that would commit becomes 408. So a request whose
//! body trickles or never comes cannot hold its key for longer than the handler's own work
//! plus the body timeout.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::body::{BoxError, RequestBody};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The handler echoes the body it received. Reading it fails with a `BoxError`: the
//! // original body's error, or a `BodyTimeoutError`.
//! let echo = service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
//!     let body = req.into_body().collect().await?.to_bytes();
//!     Ok::<_, BoxError>(Response::new(Full::new(body)))
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::stripe()))
//!     .service(echo);
//!
//! let event = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
//! let res = svc.oneshot(Request::new(Full::new(Bytes::from(event)))).await.unwrap();
//! let echoed = res.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(echoed, event, "the key was read from the body, and the handler got it intact");
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// The error of a [`RequestBody`]: the original body's own error, passed on as it was, or a
/// [`BodyTimeoutError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The request body the inner service receives.
    ///
    /// Its error is a [`BoxError`]: the original body's error as it was (so axum and
    /// tower-http still recognise theirs), or a [`BodyTimeoutError`] once a streamed body of a
    /// claimed delivery has kept the handler waiting for longer than the layer's
    /// `body_timeout` in all.
    pub struct RequestBody<B> {
        #[pin]
        kind: Kind<B>,
        // Set for the streamed body of a claimed delivery: what the run reads when it settles.
        watch: Option<Arc<BodyWatch>>,
        // Made at the first wait for the body, so a body ready at once costs no timer.
        timer: Option<Pin<Box<Timer>>>,
    }
}

pin_project! {
    /// The response body of the layer's service.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Bytes { data: Option<Bytes> },
    }
}

/// A streamed request body did not arrive within the layer's
/// [`body_timeout`](crate::IdempotencyLayer::body_timeout): the handler waited that long for it
/// in all. The claim is released whatever the handler answers.
///
/// Reading a [`RequestBody`] fails with it, boxed; find it with `error.is::<BodyTimeoutError>()`
/// or `downcast_ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyTimeoutError {
    timeout: Duration,
}

impl BodyTimeoutError {
    /// The body timeout that passed.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Display for BodyTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body did not arrive within {:?}",
            self.timeout
        )
    }
}

impl std::error::Error for BodyTimeoutError {}

/// What the run of a claimed delivery knows of its streamed body: the body timeout, and
/// whether it passed.
#[derive(Debug)]
pub(crate) struct BodyWatch {
    timeout: Duration,
    timed_out: AtomicBool,
}

impl BodyWatch {
    /// Whether reading the body failed with [`BodyTimeoutError`].
    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Acquire)
    }
}

pin_project! {
    /// The time a handler may still wait for its body: it runs only while the body keeps the
    /// handler waiting, so a handler that works between two reads is not held to it.
    struct Timer {
        #[pin]
        sleep: Sleep,
        left: Duration,
        waiting: bool,
    }
}

impl Timer {
    fn new(left: Duration) -> Self {
        Self {
            sleep: tokio::time::sleep_until(later(Instant::now(), left)),
            left,
            waiting: true,
        }
    }

    /// The body keeps the handler waiting: the time runs (again) from now.
    fn poll_wait(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if !std::mem::replace(this.waiting, true) {
            let until = later(Instant::now(), *this.left);
            this.sleep.as_mut().reset(until);
        }
        this.sleep.poll(cx)
    }

    /// A frame arrived after a wait: the time stops until the next.
    fn resume(self: Pin<&mut Self>) {
        let this = self.project();
        if std::mem::replace(this.waiting, false) {
            *this.left = this
                .sleep
                .deadline()
                .saturating_duration_since(Instant::now());
        }
    }
}

impl<B> RequestBody<B> {
    /// The original body, passed on untouched.
    pub fn new(body: B) -> Self {
        Self::of(Kind::Inner { body })
    }

    /// A body that was read whole and is replayed from memory.
    pub fn buffered(data: Bytes) -> Self {
        Self::of(Kind::bytes(data))
    }

    fn of(kind: Kind<B>) -> Self {
        Self {
            kind,
            watch: None,
            timer: None,
        }
    }

    /// Bounds how long the handler of a claimed delivery may wait for a streamed body, in
    /// all: past `timeout`, reading it fails with [`BodyTimeoutError`] and the answered watch
    /// says so. None for a buffered body, one already at its end, or a `timeout` of
    /// `Duration::MAX`: nothing to watch, and nothing allocated.
    pub(crate) fn bound(&mut self, timeout: Duration) -> Option<Arc<BodyWatch>>
    where
        B: Body,
    {
        match &self.kind {
            Kind::Inner { body } if !body.is_end_stream() && timeout != Duration::MAX => {}
            _ => return None,
        }
        let watch = Arc::new(BodyWatch {
            timeout,
            timed_out: AtomicBool::new(false),
        });
        self.watch = Some(watch.clone());
        Some(watch)
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// One of the layer's own answers.
    pub(crate) fn bytes(data: Bytes) -> Self {
        Self {
            kind: Kind::bytes(data),
        }
    }
}

impl<B> Kind<B> {
    /// Bytes sent as one frame; none at all when empty.
    fn bytes(data: Bytes) -> Self {
        Self::Bytes {
            data: (!data.is_empty()).then_some(data),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Inner { .. } => "inner",
            Self::Bytes { .. } => "bytes",
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Kind<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Bytes { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Inner { body } => body.is_end_stream(),
            Self::Bytes { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Inner { body } => body.size_hint(),
            Self::Bytes { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = this.kind.as_mut().poll_frame(cx);
        let Some(watch) = this.watch.as_ref() else {
            return polled.map_err(Into::into);
        };
        if let Poll::Ready(frame) = polled {
            if let Some(timer) = this.timer.as_mut() {
                timer.as_mut().resume();
            }
            if frame.is_none() {
                // The whole body arrived: nothing left to watch.
                *this.timer = None;
            }
            return Poll::Ready(frame).map_err(Into::into);
        }
        let timeout = watch.timeout;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(Timer::new(timeout)));
        std::task::ready!(timer.as_mut().poll_wait(cx));
        watch.timed_out.store(true, Ordering::Release);
        // Nothing more is read from the original body: it ends here, after the error.
        *this.watch = None;
        *this.timer = None;
        this.kind.set(Kind::Bytes { data: None });
        Poll::Ready(Some(Err(Box::new(BodyTimeoutError { timeout }))))
    }

    fn is_end_stream(&self) -> bool {
        self.kind.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.kind.size_hint()
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().kind.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.kind.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.kind.size_hint()
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBody")
            .field("kind", &self.kind.name())
            .finish()
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("kind", &self.kind.name())
            .finish()
    }
}

/// `by` after `from`, or about thirty years after it when `by` reaches past what an instant
/// can hold: a configured `Duration::MAX` means "never", not a panic.
pub(crate) fn later(from: Instant, by: Duration) -> Instant {
    const NEVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(by.min(NEVER))
        .or_else(|| from.checked_add(Duration::from_secs(3600)))
        .unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};

    #[tokio::test]
    async fn buffered_body_replays_its_bytes_once() {
        let body = RequestBody::<Empty<Bytes>>::buffered(Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    }

    #[test]
    fn empty_answer_is_at_its_end() {
        let body = ResponseBody::<Empty<Bytes>>::bytes(Bytes::new());
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }

    /// A streamed body whose frames are sent by the test; it ends when the sender is dropped.
    struct Channel(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|data| data.map(|d| Ok(Frame::data(d))))
        }
    }

    fn channel() -> (
        tokio::sync::mpsc::UnboundedSender<Bytes>,
        RequestBody<Channel>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, RequestBody::new(Channel(rx)))
    }

    #[test]
    fn only_a_streamed_body_with_a_timeout_is_watched() {
        let second = Duration::from_secs(1);
        let mut buffered = RequestBody::<Channel>::buffered(Bytes::from_static(b"{}"));
        assert!(buffered.bound(second).is_none());
        assert!(
            RequestBody::new(Empty::<Bytes>::new())
                .bound(second)
                .is_none()
        );
        let (_tx, mut body) = channel();
        assert!(body.bound(Duration::MAX).is_none(), "no limit, no watch");
        assert!(body.bound(second).is_some());
    }

    #[tokio::test]
    async fn body_ready_at_once_makes_no_timer() {
        let (tx, mut body) = channel();
        let watch = body.bound(Duration::from_secs(1)).unwrap();
        tx.send(Bytes::from_static(b"hello")).unwrap();
        drop(tx);
        let mut body = std::pin::pin!(body);
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "hello"
        );
        assert!(body.frame().await.is_none());
        assert!(body.timer.is_none() && !watch.timed_out());
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_body_fails_once_the_handler_waited_the_timeout_in_all() {
        let timeout = Duration::from_millis(100);
        let (tx, mut body) = channel();
        let watch = body.bound(timeout).unwrap();
        let mut body = std::pin::pin!(body);
        let later = |tx: tokio::sync::mpsc::UnboundedSender<Bytes>, after| {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                tx.send(Bytes::from_static(b"x")).unwrap();
                tx
            })
        };
        // 60 ms of waiting for the first frame...
        let sent = later(tx, Duration::from_millis(60));
        assert!(body.frame().await.unwrap().is_ok());
        let tx = sent.await.unwrap();
        // ...then the handler works for a while, which does not count, and finds the next
        // frame there...
        tx.send(Bytes::from_static(b"y")).unwrap();
        tokio::time::sleep(timeout * 5).await;
        assert!(body.frame().await.unwrap().is_ok());
        assert!(!watch.timed_out());
        // ...and may wait 40 ms more: then reading fails, and the watch says so.
        let waiting = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        let waited = waiting.elapsed();
        assert!(
            waited >= Duration::from_millis(40) && waited < Duration::from_millis(60),
            "{waited:?}"
        );
        let error = error.downcast::<BodyTimeoutError>().unwrap();
        assert_eq!(error.timeout(), timeout);
        assert_eq!(
            error.to_string(),
            "the request body did not arrive within 100ms"
        );
        assert!(watch.timed_out());
        // Nothing more is read from the original body: it is dropped, and the body ends.
        assert!(tx.send(Bytes::from_static(b"z")).is_err());
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_body_error_is_passed_on_as_it_was() {
        let failing =
            http_body_util::StreamBody::new(futures_util::stream::iter([Err::<Frame<Bytes>, _>(
                std::io::Error::other("reset"),
            )]));
        let mut body = RequestBody::new(failing);
        let _watch = body.bound(Duration::from_secs(1));
        let error = body.collect().await.unwrap_err();
        assert!(error.is::<std::io::Error>(), "{error:?}");
    }
}
