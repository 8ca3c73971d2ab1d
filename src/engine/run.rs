//! The run: the inner service under a claim, to completion whoever still waits for it, with the
//! heartbeat going while it runs.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::guard::{LeaseGuard, Leased, Owner, Settle};
use super::refusal::key_problem;
use crate::body::{BodyWatch, RequestBody, ResponseBody};
use crate::key::KeyError;
use crate::response::{Outcome, tagged};
use crate::store::{StoreError, StoredResponse};

/// A panic caught in the inner service.
pub(crate) type Panic = Box<dyn Any + Send>;

/// What a run ends with: the inner service's answer, or its panic.
pub(crate) type Ran<T, E> = Result<Result<T, E>, Panic>;

/// Makes the inner service ready and calls it, catching a panic in `call` or in its future.
pub(crate) fn call<S, Req>(inner: S, req: Req) -> impl Future<Output = Ran<S::Response, S::Error>>
where
    S: Service<Req>,
{
    AssertUnwindSafe(Calling::Ready {
        ready: Some((inner, req)),
    })
    .catch_unwind()
}

pin_project! {
    /// The inner service made ready, then called: the request and the future of the call it
    /// became take turns in one place, where an `async` block would keep both. The service
    /// is kept until its future is done.
    #[project = CallingProj]
    enum Calling<S: Service<Req>, Req> {
        Ready { ready: Option<(S, Req)> },
        Called { #[pin] future: S::Future, inner: S },
        Done,
    }
}

impl<S: Service<Req>, Req> Future for Calling<S, Req> {
    type Output = Result<S::Response, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                CallingProj::Ready { ready } => {
                    let Some((inner, _)) = ready.as_mut() else {
                        panic!("Calling polled after its call panicked");
                    };
                    if let Err(error) = std::task::ready!(inner.poll_ready(cx)) {
                        self.set(Self::Done);
                        return Poll::Ready(Err(error));
                    }
                    let Some((mut inner, req)) = ready.take() else {
                        unreachable!("looked at above");
                    };
                    let future = inner.call(req);
                    self.set(Self::Called { future, inner });
                }
                CallingProj::Called { future, .. } => {
                    let output = std::task::ready!(future.poll(cx));
                    self.set(Self::Done);
                    return Poll::Ready(output);
                }
                CallingProj::Done => panic!("Calling polled after it completed"),
            }
        }
    }
}

/// A future that goes on when its caller stops waiting: dropped before it finished (hyper drops
/// the response future when the client hangs up), it moves into a task of its own, and `then`
/// takes its output there. A run is detached so, and so is a claim still waiting for the
/// store ([`acquire`]).
///
/// While the caller waits, the future is polled in the caller's task, so a delivery whose
/// sender stays costs no task and no cross-thread wake-up. Without a runtime there is no task
/// to move to, and a dropped future is dropped: a run's guard then settles its claim, and a
/// claim's answer gives itself back.
pub(crate) struct Detach<F: Future<Output: Send + 'static> + Send + 'static> {
    future: Option<Pin<Box<F>>>,
    then: fn(F::Output),
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Detach<F> {
    /// `future`, with what becomes of its output if it finishes detached.
    pub(crate) fn new(future: F, then: fn(F::Output)) -> Self {
        Self {
            future: Some(Box::pin(future)),
            then,
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for Detach<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Detach` is `Unpin`: the future it holds is boxed.
        let Some(future) = self.future.as_mut() else {
            panic!("Detach polled after it completed");
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for Detach<F> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            tracing::debug!("the delivery went away; what it started runs on to completion");
            let then = self.then;
            runtime.spawn(async move { then(future.await) });
        }
    }
}

/// What becomes of a run that finished detached: it settled its own claim; only a panic is
/// left to report.
pub(crate) fn detached_run<T, E>(ran: Ran<T, E>) {
    if ran.is_err() {
        tracing::error!(
            "a handler whose delivery went away panicked; its claim was settled as the stale \
             policy says"
        );
    }
}

/// Runs `acquiring`, a store call that may grant a claim, within `timeout`, and times it for
/// the metrics as the store's `what`.
///
/// The call is polled in the delivery's own task, so a claim costs no task and no wake-up from
/// another thread. Should the delivery stop waiting for it (dropped because the sender hung up,
/// or past the timeout) while the store has not answered, the call is [detached](Detach) and
/// finishes in a task: it is never cut off half way. Whatever it answers is owned by its
/// output: `acquiring` wraps a granted claim in a [`LeaseGuard`] as soon as the store answers,
/// and an output nobody reads is dropped, which gives the claim back. Nothing is lost between
/// the store's answer and the delivery, by construction. The detached call has no bound beyond
/// the store's own (pool and connection timeouts): cutting it off could lose a claim the store
/// granted; while it waits, a drain reports the delivery as still claiming.
pub(crate) async fn acquire<T, F>(
    acquiring: F,
    timeout: Duration,
    what: &'static str,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let started = super::observe::started();
    let mut acquiring = Detach::new(acquiring, drop);
    // A store that answers at once (the memory store) costs no timer either.
    let answer =
        match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut acquiring).poll(cx))).await {
            Poll::Ready(answer) => answer,
            // No timer and no task to move the call to: wait for it where it is.
            Poll::Pending if tokio::runtime::Handle::try_current().is_err() => acquiring.await,
            Poll::Pending => match tokio::time::timeout(timeout, &mut acquiring).await {
                Ok(answer) => answer,
                // Dropped on the way out, the call goes on in a task; should it grant the claim
                // now, its answer gives it back.
                Err(_elapsed) => Err(StoreError::backend(format!(
                    "the store did not answer the {what} within {timeout:?}"
                ))),
            },
        };
    if let Some(started) = started {
        crate::metrics::store_call(what, started.elapsed());
    }
    answer
}

/// What the run does with an answer that commits, before it commits: store it for replay, or
/// pass it on. Answers the response to send and what to store of it, if anything.
pub(crate) trait Keep<B>: Send + 'static {
    /// Whether it may store anything: if not, the run does not ask.
    fn stores(&self) -> bool;

    fn keep(
        self,
        res: Response<B>,
    ) -> impl Future<Output = (Response<ResponseBody<B>>, Option<StoredResponse>)> + Send;
}

/// Stores nothing: the modes without replay.
pub(crate) struct Nothing;

impl<B: Send + 'static> Keep<B> for Nothing {
    fn stores(&self) -> bool {
        false
    }

    async fn keep(self, res: Response<B>) -> (Response<ResponseBody<B>>, Option<StoredResponse>) {
        (res.map(ResponseBody::new), None)
    }
}

/// What a mode keeps when it may keep something: nothing when `None`, without entering the
/// keeper's code.
impl<B: Send + 'static, K: Keep<B>> Keep<B> for Option<K> {
    fn stores(&self) -> bool {
        self.as_ref().is_some_and(K::stores)
    }

    async fn keep(self, res: Response<B>) -> (Response<ResponseBody<B>>, Option<StoredResponse>) {
        match self {
            Some(keeper) => keeper.keep(res).await,
            None => (res.map(ResponseBody::new), None),
        }
    }
}

/// Runs the inner service under the guard's claim: starts the heartbeat once the handler has
/// to wait, then commits or releases as its answer says.
///
/// A streamed body is held to the body timeout (see [`RequestBody`]): once it passed, the
/// claim is released whatever the handler answered, and a success is answered 408 instead.
// Not an `async fn`, which would hold the request twice (see `service::deliver`).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds its arguments twice"
)]
pub(crate) fn run<O, S, B, ResB, Kp>(
    mut guard: LeaseGuard<O>,
    inner: S,
    mut req: Request<RequestBody<B>>,
    keep: Kp,
) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>>
where
    O: Owner,
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>>,
    B: Body,
    Kp: Keep<ResB>,
{
    async move {
        guard.start();
        req.extensions_mut().insert(guard.handle());
        let body = req.body_mut().bound(guard.owner().settings().body_timeout);
        let result = heartbeat(&mut guard, pin!(call(inner, req))).await;
        let status = match &result {
            Ok(Ok(res)) => Some(res.status().as_u16()),
            _ => None,
        };
        guard.handler_answered(status);
        match result {
            Ok(Ok(res)) if body.as_deref().is_some_and(BodyWatch::timed_out) => {
                let res = timed_out(&guard, res);
                let outcome = Box::pin(guard.settle(Settle::Release)).await;
                Ok(Ok(tagged(res, outcome)))
            }
            Ok(Ok(res)) => {
                let commits = guard.owner().settings().commit_when.commits(res.status());
                let (res, action) = if commits && !keep.stores() {
                    (res.map(ResponseBody::new), Settle::Commit)
                } else if commits {
                    // A body read to be stored may take a while: the heartbeat goes on.
                    let (res, stored) = heartbeat(&mut guard, pin!(keep.keep(res))).await;
                    if let Some(stored) = stored {
                        guard.keep(stored);
                    }
                    (res, Settle::Commit)
                } else {
                    (res.map(ResponseBody::new), Settle::Release)
                };
                // Boxed, here and below: the settlement's future would otherwise take room in
                // every run's, next to the handler's.
                let outcome = Box::pin(guard.settle(action)).await;
                Ok(Ok(tagged(res, outcome)))
            }
            Ok(Err(error)) => {
                Box::pin(guard.settle(Settle::Release)).await;
                Ok(Err(error))
            }
            Err(panic) => {
                Box::pin(guard.abandon()).await;
                Err(panic)
            }
        }
    }
}

/// The answer to a delivery whose body did not arrive within the body timeout, which is
/// released whatever its handler answered: the handler's own answer if it would release anyway
/// (its extractor's 400, say), else 408, since the handler cannot have had the whole event.
fn timed_out<O: Owner, ResB>(
    guard: &LeaseGuard<O>,
    res: Response<ResB>,
) -> Response<ResponseBody<ResB>> {
    let settings = guard.owner().settings();
    let key = guard.lease().key();
    let answered = res.status();
    tracing::warn!(
        namespace = key.namespace(),
        key = key.value(),
        timeout = ?settings.body_timeout,
        status = answered.as_u16(),
        "the request body did not arrive within the body timeout; the {} is released \
         whatever the handler answered",
        O::WHAT,
    );
    if !settings.commit_when.commits(answered) {
        return res.map(ResponseBody::new);
    }
    key_problem(KeyError::BodyTimeout, Outcome::Released)
}

/// Drives `call` to its end, with the claim's heartbeat going once the handler has to wait.
/// A handler that answers at once starts no heartbeat; one shorter than the renew interval
/// renews nothing.
pub(crate) async fn heartbeat<O: Owner, F: Future>(
    guard: &mut LeaseGuard<O>,
    mut call: Pin<&mut F>,
) -> F::Output {
    let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    if let Poll::Ready(output) = first {
        return output;
    }
    guard.start_heartbeat();
    call.await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Log = Arc<Mutex<Vec<&'static str>>>;

    /// Ready at its second look (or failing there); `call(0)` panics; drops are logged.
    struct Late {
        looked: bool,
        fail: bool,
        log: Log,
    }

    struct Answer(u8, Log);

    impl Future for Answer {
        type Output = Result<u8, &'static str>;

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Ready(Ok(self.0 + 1))
        }
    }

    impl Drop for Answer {
        fn drop(&mut self) {
            self.1.lock().unwrap().push("future");
        }
    }

    impl Drop for Late {
        fn drop(&mut self) {
            self.log.lock().unwrap().push("service");
        }
    }

    impl Service<u8> for Late {
        type Response = u8;
        type Error = &'static str;
        type Future = Answer;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
            if !std::mem::replace(&mut self.looked, true) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if self.fail {
                Poll::Ready(Err("not ready"))
            } else {
                Poll::Ready(Ok(()))
            }
        }

        fn call(&mut self, req: u8) -> Answer {
            assert_ne!(req, 0, "the call panics");
            Answer(req, self.log.clone())
        }
    }

    fn late(fail: bool) -> (Late, Log) {
        let log = Log::default();
        let service = Late {
            looked: false,
            fail,
            log: log.clone(),
        };
        (service, log)
    }

    #[tokio::test]
    async fn call_waits_for_readiness_and_keeps_the_service_until_its_future_is_done() {
        let (service, log) = late(false);
        assert_eq!(call(service, 41).await.unwrap(), Ok(42));
        assert_eq!(*log.lock().unwrap(), ["future", "service"]);

        let (service, log) = late(true);
        assert_eq!(call(service, 41).await.unwrap(), Err("not ready"));
        assert_eq!(*log.lock().unwrap(), ["service"]);

        let (service, log) = late(false);
        assert!(call(service, 0).await.is_err(), "the panic is caught");
        assert_eq!(*log.lock().unwrap(), ["service"]);
    }
}
