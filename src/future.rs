use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response future of [`Idempotency`](crate::Idempotency).
///
/// The delivery runs in its tracing span, `delivery`, which this future enters while it polls
/// it, and whose outcome it reports when it answers.
pub struct ResponseFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send>>,
    /// Boxed, and only when a subscriber records it.
    span: Option<Box<tracing::Span>>,
    report: fn(&Result<T, E>, Option<&tracing::Span>),
}

impl<T, E> ResponseFuture<T, E> {
    /// `inner` in the delivery's span, with `report` to tell of its answer.
    pub(crate) fn new(
        inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send>>,
        span: Option<Box<tracing::Span>>,
        report: fn(&Result<T, E>, Option<&tracing::Span>),
    ) -> Self {
        Self {
            inner,
            span,
            report,
        }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let _entered = this.span.as_deref().map(tracing::Span::enter);
        let output = std::task::ready!(this.inner.as_mut().poll(cx));
        (this.report)(&output, this.span.as_deref());
        Poll::Ready(output)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
