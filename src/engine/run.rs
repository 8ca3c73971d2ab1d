//! The run: the inner service under a claim, to completion whoever still waits for it, with the
//! heartbeat going while it runs.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use futures_util::FutureExt;
use http::{Request, Response};
use tower_service::Service;

use super::guard::{LeaseGuard, Owner, Settle};
use super::prepare::with_outcome;
use crate::body::ResponseBody;

/// A panic caught in the inner service.
pub(crate) type Panic = Box<dyn Any + Send>;

/// What a run ends with: the inner service's answer, or its panic.
pub(crate) type Ran<T, E> = Result<Result<T, E>, Panic>;

/// Makes the inner service ready and calls it, catching a panic in `call` or in its future.
pub(crate) async fn call<S, Req>(mut inner: S, req: Req) -> Ran<S::Response, S::Error>
where
    S: Service<Req>,
{
    AssertUnwindSafe(async move {
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(req).await
    })
    .catch_unwind()
    .await
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
pub(crate) async fn run<O, S, B, ResB>(
    mut guard: LeaseGuard<O>,
    inner: S,
    mut req: Request<B>,
) -> Ran<Response<ResponseBody<ResB>>, S::Error>
where
    O: Owner,
    S: Service<Request<B>, Response = Response<ResB>>,
{
    guard.start();
    req.extensions_mut().insert(guard.handle());
    let result = heartbeat(&mut guard, pin!(call(inner, req))).await;
    match result {
        Ok(Ok(res)) => {
            let action = if guard.owner().settings().commit_when.commits(res.status()) {
                Settle::Commit
            } else {
                Settle::Release
            };
            let outcome = guard.settle(action).await;
            Ok(Ok(with_outcome(res, outcome)))
        }
        Ok(Err(error)) => {
            guard.settle(Settle::Release).await;
            Ok(Err(error))
        }
        Err(panic) => {
            guard.abandon().await;
            Err(panic)
        }
    }
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
