//! The claim: a store call that may grant something, bounded in time, and never lost.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use crate::store::StoreError;

/// Runs `acquiring`, a store call that may grant a claim, within `timeout`.
///
/// The first poll happens inline: a store that answers at once (the memory store) costs no
/// task. A call that has to wait (a database round trip) finishes in a task of its own, so that
/// the delivery going away (dropped, or past the timeout) cannot cut it off half way. Whatever
/// it answers is then owned by the task's output: `acquiring` wraps a granted claim in a
/// [`LeaseGuard`](super::guard::LeaseGuard) as soon as the store answers, and an output nobody
/// reads is dropped, which gives the claim back. Nothing is lost between the store's answer and
/// the delivery, by construction. The task itself has no bound beyond the store's own (pool
/// and connection timeouts): cutting it off could lose a claim the store granted; while it
/// waits, a drain reports the delivery as still claiming.
pub(crate) async fn acquire<T, F>(
    acquiring: F,
    timeout: Duration,
    what: &str,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let mut acquiring = Box::pin(acquiring);
    if let Poll::Ready(result) =
        std::future::poll_fn(|cx| Poll::Ready(acquiring.as_mut().poll(cx))).await
    {
        return result;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return acquiring.await;
    };
    let task = runtime.spawn(acquiring);
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(joined)) if joined.is_panic() => std::panic::resume_unwind(joined.into_panic()),
        Ok(Err(_cancelled)) => Err(StoreError::backend(format!(
            "the {what} was cancelled: the runtime is shutting down"
        ))),
        // The task goes on; should it grant the claim now, its answer gives it back.
        Err(_elapsed) => Err(StoreError::backend(format!(
            "the store did not answer the {what} within {timeout:?}"
        ))),
    }
}
