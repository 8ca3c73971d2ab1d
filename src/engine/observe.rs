//! What every delivery reports, whatever its mode: one tracing span, and the metric of its
//! outcome.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::key::IdempotencyKey;
use crate::response::Outcome;

/// Runs `delivery` in its span, `delivery`, whose fields are filled in as they become known:
/// `namespace` and `key` once the key is found, `lease` once a claim is granted,
/// `handler_ms` once the inner service answered, and `outcome` at the end. A tracing layer
/// (OpenTelemetry's among them) sees one span per delivery without any configuration.
pub(crate) fn observed<F>(delivery: F) -> Observed<F> {
    let span = tracing::info_span!(
        "delivery",
        namespace = tracing::field::Empty,
        key = tracing::field::Empty,
        lease = tracing::field::Empty,
        handler_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    Observed { delivery, span }
}

pin_project! {
    /// A delivery in its span, whose outcome is recorded when it answers. A future of its own
    /// rather than an `async` block, which would hold the delivery twice.
    pub(crate) struct Observed<F> {
        #[pin]
        delivery: F,
        span: tracing::Span,
    }
}

impl<F, B, E> Future for Observed<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let res = std::task::ready!(this.delivery.poll(cx));
        if let Ok(res) = &res
            && let Some(outcome) = res.extensions().get::<Outcome>()
        {
            let namespace = res
                .extensions()
                .get::<IdempotencyKey>()
                .map_or("none", IdempotencyKey::namespace);
            this.span.record("outcome", outcome.as_str());
            crate::metrics::delivery(namespace, *outcome);
        }
        Poll::Ready(res)
    }
}

/// The delivery's key is known: its span says so.
pub(crate) fn keyed(key: &IdempotencyKey) {
    let span = tracing::Span::current();
    span.record("namespace", key.namespace());
    span.record("key", key.value());
}

/// The time now, when something will read how long a step took: the metrics, or a delivery
/// span a subscriber records. Otherwise nothing, and no clock is read.
pub(crate) fn started() -> Option<std::time::Instant> {
    let wanted = cfg!(feature = "metrics") || !tracing::Span::current().is_disabled();
    wanted.then(std::time::Instant::now)
}
