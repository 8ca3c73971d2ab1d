//! The claim: a store call that may grant something, bounded in time, and never lost.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::store::StoreError;

/// Runs `acquiring`, a store call that may grant a claim, within `timeout`.
///
/// The call is polled in the delivery's own task, so a claim costs no task and no wake-up from
/// another thread. Should the delivery stop waiting for it (dropped because the sender hung up,
/// or past the timeout) while the store has not answered, the call moves into a task of its
/// own and finishes there: it is never cut off half way. Whatever it answers is owned by its
/// output: `acquiring` wraps a granted claim in a [`LeaseGuard`](super::guard::LeaseGuard) as
/// soon as the store answers, and an output nobody reads is dropped, which gives the claim
/// back. Nothing is lost between the store's answer and the delivery, by construction. The
/// moved call has no bound beyond the store's own (pool and connection timeouts): cutting it
/// off could lose a claim the store granted; while it waits, a drain reports the delivery as
/// still claiming.
pub(crate) async fn acquire<T, F>(
    acquiring: F,
    timeout: Duration,
    what: &str,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let mut acquiring = Finish::new(acquiring);
    // A store that answers at once (the memory store) costs no timer either.
    if let Poll::Ready(result) = std::future::poll_fn(|cx| Poll::Ready(acquiring.poll_in(cx))).await
    {
        return result;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        // No timer and no task to move the call to: wait for it where it is.
        return acquiring.await;
    }
    match tokio::time::timeout(timeout, &mut acquiring).await {
        Ok(result) => result,
        // Dropped on the way out, the call goes on in a task; should it grant the claim now,
        // its answer gives it back.
        Err(_elapsed) => Err(StoreError::backend(format!(
            "the store did not answer the {what} within {timeout:?}"
        ))),
    }
}

/// A future that is finished in a task of its own when dropped before it completed.
struct Finish<F: Future<Output: Send + 'static> + Send + 'static> {
    future: Option<Pin<Box<F>>>,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Finish<F> {
    fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
        }
    }

    fn poll_in(&mut self, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("Finish polled after it completed");
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for Finish<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Finish` is `Unpin`: the future it holds is boxed.
        self.get_mut().poll_in(cx)
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // The output, a claim perhaps, is dropped in the task: its guard gives it back.
                runtime.spawn(future);
            }
            // Without a runtime the call cannot go on; dropping it is all there is.
            Err(_) => drop(future),
        }
    }
}
