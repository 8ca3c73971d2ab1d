//! The run: the inner service under a claim, to completion whoever still waits for it, with the
//! heartbeat going while it runs.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::guard::{LeaseGuard, Leased, Owner, Settle};
use super::keep::Keep;
use super::prepare::tagged;
use super::refusal::key_problem;
use crate::body::{BodyWatch, RequestBody, ResponseBody};
use crate::key::KeyError;
use crate::response::Outcome;

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

/// A run that goes on when its caller stops waiting: dropped before it finished (hyper drops
/// the response future when the client hangs up), it moves into a task of its own.
///
/// While the caller waits, the run is polled in the caller's task, so a delivery whose sender
/// stays costs no task and no cross-thread wake-up.
pub(crate) struct Detach<T: Send + 'static, E: Send + 'static> {
    run: Option<BoxRun<T, E>>,
}

type BoxRun<T, E> = Pin<Box<dyn Future<Output = Ran<T, E>> + Send>>;

impl<T: Send + 'static, E: Send + 'static> Detach<T, E> {
    pub(crate) fn new(run: impl Future<Output = Ran<T, E>> + Send + 'static) -> Self {
        Self {
            run: Some(Box::pin(run)),
        }
    }
}

impl<T: Send + 'static, E: Send + 'static> Future for Detach<T, E> {
    type Output = Ran<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ran<T, E>> {
        let Some(run) = self.run.as_mut() else {
            panic!("Detach polled after it completed");
        };
        let output = std::task::ready!(run.as_mut().poll(cx));
        self.run = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static, E: Send + 'static> Drop for Detach<T, E> {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                tracing::debug!("the delivery went away; its handler runs on to completion");
                runtime.spawn(async move {
                    // The run settles its own claim; only a panic is left to report.
                    if run.await.is_err() {
                        tracing::error!(
                            "a handler whose delivery went away panicked; its claim was \
                             settled as the stale policy says"
                        );
                    }
                });
            }
            // Without a runtime the run cannot go on; dropping it lets its guard settle.
            Err(_) => drop(run),
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
        guard.handler_answered();
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
async fn heartbeat<O: Owner, F: Future>(
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
