//! What every delivery reports, whatever its mode: one tracing span, and the metric of its
//! outcome.

use std::future::Future;

use http::Response;
use tracing::Instrument;

use crate::key::IdempotencyKey;
use crate::response::Outcome;

/// Runs `delivery` in its span, `delivery`, whose fields are filled in as they become known:
/// `namespace` and `key` once the key is found, `lease` once a claim is granted,
/// `handler_ms` once the inner service answered, and `outcome` at the end. A tracing layer
/// (OpenTelemetry's among them) sees one span per delivery without any configuration.
pub(crate) fn observed<B, E>(
    delivery: impl Future<Output = Result<Response<B>, E>> + Send,
) -> impl Future<Output = Result<Response<B>, E>> + Send {
    let span = tracing::info_span!(
        "delivery",
        namespace = tracing::field::Empty,
        key = tracing::field::Empty,
        lease = tracing::field::Empty,
        handler_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let reported = span.clone();
    async move {
        let res = delivery.await;
        if let Ok(res) = &res
            && let Some(outcome) = res.extensions().get::<Outcome>()
        {
            let namespace = res
                .extensions()
                .get::<IdempotencyKey>()
                .map_or("none", IdempotencyKey::namespace);
            reported.record("outcome", outcome.as_str());
            crate::metrics::delivery(namespace, *outcome);
        }
        res
    }
    .instrument(span)
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
