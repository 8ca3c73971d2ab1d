//! The layer's metrics, through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): whatever recorder the application installed receives them, a Prometheus
//! exporter for one. Without the feature, or without a recorder, they cost nothing.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `idempotency_deliveries_total` | counter | `namespace`, `outcome` | deliveries answered, by [`Outcome`] (`processed`, `duplicate`, `in-flight`, …) |
//! | `idempotency_handler_duration_seconds` | histogram | `namespace` | how long the inner service took, claimed deliveries only |
//! | `idempotency_store_duration_seconds` | histogram | `operation` | store calls: `claim` (a version's too), `begin` (transactional mode), `enqueue` (the inbox's ingest), `commit`, `release`, `renew` |
//! | `idempotency_claims_in_flight` | gauge | | deliveries claiming or holding a claim in this process |
//! | `idempotency_lease_lost_total` | counter | `operation` | renewals and settlements that found their claim taken over |
//! | `idempotency_settle_retries_total` | counter | `action` | commits and releases tried again after a store failure |
//! | `idempotency_inbox_attempts_total` | counter | `namespace`, `result` | [inbox](crate::inbox) attempts, by how they ended: `done`, `retry`, `dead`, `lease-lost` |
//! | `idempotency_inbox_depth` | gauge | | inbox entries queued (due or not) |
//! | `idempotency_inbox_running` | gauge | | inbox entries a worker runs |
//! | `idempotency_inbox_dead` | gauge | | dead inbox entries, waiting for a person |
//! | `idempotency_inbox_oldest_due_seconds` | gauge | | how long the oldest due entry has waited |
//!
//! The inbox gauges are the whole inbox's, as its workers last counted them (every
//! [`stats_every`](crate::inbox::Workers::stats_every)).
//!
//! `namespace` is the extractor's namespace (`stripe`, `github`, …) without the route's scope,
//! so that the labels stay few whatever the paths and clients.
//!
//! Exported with `metrics-exporter-prometheus`:
//!
//! ```text
//! let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! let app = app.route("/metrics", get(move || std::future::ready(handle.render())));
//! ```

#![cfg_attr(not(feature = "metrics"), allow(unused_variables, dead_code))]

use std::time::Duration;

use crate::response::Outcome;

/// The namespace without its scope: the label of the delivery metrics.
pub(crate) fn base(namespace: &str) -> &str {
    namespace.split('@').next().unwrap_or(namespace)
}

/// A delivery answered.
pub(crate) fn delivery(namespace: &str, outcome: Outcome) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_deliveries_total",
        "namespace" => base(namespace).to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
}

/// The inner service's time for a claimed delivery.
pub(crate) fn handler(namespace: &str, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(
        "idempotency_handler_duration_seconds",
        "namespace" => base(namespace).to_owned(),
    )
    .record(took.as_secs_f64());
}

/// A store call's time.
pub(crate) fn store_call(operation: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("idempotency_store_duration_seconds", "operation" => operation)
        .record(took.as_secs_f64());
}

/// A delivery started (`1.0`) or stopped (`-1.0`) claiming or holding a claim.
pub(crate) fn in_flight(delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("idempotency_claims_in_flight").increment(delta);
}

/// A renewal or settlement found its claim taken over.
pub(crate) fn lease_lost(operation: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idempotency_lease_lost_total", "operation" => operation).increment(1);
}

/// A commit or release tried again.
pub(crate) fn settle_retry(action: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idempotency_settle_retries_total", "action" => action).increment(1);
}

/// An inbox attempt ended.
pub(crate) fn inbox_attempt(namespace: &str, result: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_inbox_attempts_total",
        "namespace" => base(namespace).to_owned(),
        "result" => result,
    )
    .increment(1);
}

/// The inbox's counts, as the workers last read them.
pub(crate) fn inbox_stats(stats: &crate::store::inbox::InboxStats) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("idempotency_inbox_depth").set(stats.queued as f64);
        metrics::gauge!("idempotency_inbox_running").set(stats.running as f64);
        metrics::gauge!("idempotency_inbox_dead").set(stats.dead as f64);
        metrics::gauge!("idempotency_inbox_oldest_due_seconds")
            .set(stats.oldest_due.map_or(0.0, |d| d.as_secs_f64()));
    }
}
