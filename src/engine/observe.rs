//! What every delivery reports, whatever its mode: one tracing span, and the metric of its
//! outcome.

use std::future::Future;
use std::pin::Pin;

use http::Response;

use crate::future::ResponseFuture;
use crate::key::IdempotencyKey;
use crate::response::Outcome;

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
