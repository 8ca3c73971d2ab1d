//! Receipts on a table that `migrate()` upgraded; the receipts every store keeps are checked
//! by the conformance suite (`tower_idempotency::conformance`).

use tower_idempotency::conformance::{acquire, claimed_receipt, described_receipt, receipt};
use tower_idempotency::store::Store;

use super::{LONG, key_in};

/// After `migrate()` upgraded a table made before receipts existed, and
/// [`upgraded_table_keeps_its_rows`](super::upgraded_table_keeps_its_rows) ran on its rows of
/// namespace `ns`, receipts work there: the rows committed without one read without one, and
/// a new key keeps one.
pub async fn receipts_work_after_the_upgrade<S: Store>(store: S, ns: &str) {
    for old in ["done", "processing"] {
        assert_eq!(claimed_receipt(&store, &key_in(ns, old)).await, None);
    }
    let fresh = key_in(ns, "evt_after_upgrade");
    let lease = acquire(&store, &fresh, LONG).await;
    let written = receipt(8);
    store.commit_with(&lease, &written).await.unwrap();
    assert_eq!(
        claimed_receipt(&store, &fresh).await.as_deref(),
        Some(&written)
    );
    assert_eq!(
        described_receipt(&store, &fresh).await.1.as_deref(),
        Some(&written)
    );
}
