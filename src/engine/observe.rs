//! What every delivery reports, whatever its mode: one tracing span, and the metric of its
//! outcome, told by its response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::key::IdempotencyKey;
use crate::response::Outcome;
use crate::store::LeaseToken;

/// The response future of a delivery: `delivery` in its span, `delivery`, whose fields are
/// filled in as they become known: `namespace` and `key` once the key is found, `lease` once a
/// claim is granted, `handler_ms` once the inner service answered, and `outcome` at the end.
/// A tracing layer (OpenTelemetry's among them) sees one span per delivery without any
/// configuration.
pub(crate) fn observed<B, E>(
    delivery: Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>,
) -> ResponseFuture<Response<B>, E> {
    let span = tracing::info_span!(
        "delivery",
        namespace = tracing::field::Empty,
        key = tracing::field::Empty,
        lease = tracing::field::Empty,
        handler_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    // Boxed, and only when a subscriber records it: nothing to carry otherwise.
    let span = (!span.is_disabled()).then(|| Box::new(span));
    ResponseFuture::new(delivery, span, report)
}

/// The response future of every service of the crate's layers ([`Idempotency`](crate::Idempotency),
/// [`VersionGuard`](crate::version_guard::VersionGuard), `Transactional`, `Ingest`): all four
/// are a [`Guarded`](super::Guarded) shell.
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

/// Tells of a delivery's answer: its span's `outcome`, and the metric.
fn report<B, E>(answer: &Result<Response<B>, E>, span: Option<&tracing::Span>) {
    if span.is_none() && !cfg!(feature = "metrics") {
        return;
    }
    let Ok(res) = answer else { return };
    let Some(outcome) = res.extensions().get::<Outcome>() else {
        return;
    };
    if let Some(span) = span {
        span.record("outcome", outcome.as_str());
    }
    #[cfg(feature = "metrics")]
    {
        let namespace = res
            .extensions()
            .get::<IdempotencyKey>()
            .map_or("none", IdempotencyKey::namespace);
        crate::metrics::delivery(namespace, *outcome);
    }
}

/// The span of the delivery being polled, if a subscriber records spans at all: a cheap
/// check first, so that a service without one pays nothing.
pub(crate) fn span() -> Option<tracing::Span> {
    if !tracing::dispatcher::has_been_set() || !tracing::level_enabled!(tracing::Level::INFO) {
        return None;
    }
    let span = tracing::Span::current();
    (!span.is_disabled()).then_some(span)
}

/// The delivery's key is known: its span says so.
pub(crate) fn keyed(key: &IdempotencyKey) {
    if let Some(span) = span() {
        span.record("namespace", key.namespace());
        span.record("key", key.value());
    }
}

/// The time now, when something will read how long a step took: the metrics, or a delivery
/// span a subscriber records. Otherwise nothing, and no clock is read.
pub(crate) fn started() -> Option<std::time::Instant> {
    let wanted = cfg!(feature = "metrics") || span().is_some();
    wanted.then(std::time::Instant::now)
}

/// The one event every delivery with a key records: its key (an entity's, with the version,
/// under the version guard), the lease it held if any, and its outcome.
pub(crate) fn record(
    key: &IdempotencyKey,
    version: Option<i64>,
    lease: Option<LeaseToken>,
    outcome: Outcome,
) {
    tracing::debug!(
        namespace = key.namespace(),
        key = key.value(),
        version,
        lease = lease.map(tracing::field::display),
        outcome = outcome.as_str(),
        "delivery",
    );
}
