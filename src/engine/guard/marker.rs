//! The guard of a claim held by an open transaction (transactional mode): its marker is
//! written in the transaction, so the transaction's commit or rollback settles it; the guard
//! only keeps the delivery counted by the drain, and reported as its marker, until then.

use std::sync::Arc;

use super::{LeaseState, Leased};
use crate::engine::drain::{Stage, Ticket};
use crate::key::IdempotencyKey;
use crate::store::LeaseToken;

/// The marker a delivery's open transaction holds: its key and token.
#[derive(Debug, Clone)]
pub(crate) struct Marker {
    key: IdempotencyKey,
    token: LeaseToken,
}

impl Leased for Marker {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    fn token(&self) -> LeaseToken {
        self.token
    }
}

/// Holds a delivery's marker from the store's answer to the transaction's end: the drain
/// counts the delivery, and reports it as the transaction's marker, until the guard is
/// dropped.
pub(crate) struct MarkerGuard {
    state: Arc<LeaseState<Marker>>,
    _ticket: Ticket,
}

impl MarkerGuard {
    /// The store began a transaction holding `key`'s marker under `token`; `ticket` counts
    /// the delivery in the drain.
    pub(crate) fn begun(key: IdempotencyKey, token: LeaseToken, mut ticket: Ticket) -> Self {
        let state = Arc::new(LeaseState::new(Marker { key, token }, "transaction"));
        ticket.hold(state.clone());
        Self {
            state,
            _ticket: ticket,
        }
    }

    pub(crate) fn key(&self) -> &IdempotencyKey {
        &self.state.lease().key
    }

    pub(crate) fn token(&self) -> LeaseToken {
        self.state.lease().token
    }

    /// The transaction is being committed or rolled back.
    pub(crate) fn settling(&self) {
        self.state.set_stage(Stage::Settling);
    }
}

impl Drop for MarkerGuard {
    fn drop(&mut self) {
        self.state.finish();
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use super::*;
    use crate::engine::Drain;

    #[tokio::test]
    async fn the_drain_reports_the_marker_until_the_guard_is_dropped() {
        let drain = Drain::new();
        let key = IdempotencyKey::new("guard", "evt_1").unwrap();
        let guard = MarkerGuard::begun(key.clone(), LeaseToken::generate(), drain.enter().unwrap());
        guard.settling();
        drain.close();
        let report = drain.drain(std::time::Duration::from_millis(10)).await;
        assert!(
            !report.is_clean(),
            "the open transaction is left behind: {report}"
        );
        assert!(report.to_string().contains("evt_1"), "{report}");
        drop(guard);
        assert!(
            drain
                .drain(std::time::Duration::from_millis(10))
                .await
                .is_clean()
        );
    }
}
