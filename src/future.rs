use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response future of [`Idempotency`](crate::Idempotency).
pub struct ResponseFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send>>,
}

impl<T, E> ResponseFuture<T, E> {
    pub(crate) fn new(inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send>>) -> Self {
        Self { inner }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
