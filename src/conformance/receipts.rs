//! What a `done` key keeps for its duplicates: the receipt `commit_with` wrote, answered by
//! every later claim and by `describe`, byte for byte; never a receipt of another run.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::IdempotencyKey;
use crate::store::{
    Fingerprint, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale, Store, StoredResponse,
};

use super::expect::{assert_lease_lost, expect_done};
use super::{LONG, PAST_SHORT, SHORT, acquire, key_in, unique_namespace};

/// A receipt with a fingerprint of 32 bytes `fingerprint` and a response of status 201, two
/// headers (one of them not UTF-8), and `body`.
pub fn receipt_with_body(fingerprint: u8, body: Bytes) -> Receipt {
    let headers = vec![
        (
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (
            HeaderName::from_static("x-request-trace"),
            HeaderValue::from_bytes(b"a\tb \xff").unwrap(),
        ),
    ];
    Receipt::new(
        Some(Fingerprint::from_bytes([fingerprint; 32])),
        Some(StoredResponse::new(StatusCode::CREATED, headers, body)),
    )
}

/// A small receipt whose body holds the bytes 0x00 and 0xff.
pub fn receipt(fingerprint: u8) -> Receipt {
    receipt_with_body(
        fingerprint,
        Bytes::from_static(b"{\"id\":\"pay_1\"}\x00\xff\x00"),
    )
}

/// The receipt a claim of `key` answers: the key must be done.
pub async fn claimed_receipt<S: Store>(store: &S, key: &IdempotencyKey) -> Option<Arc<Receipt>> {
    expect_done(store.claim(key, LONG).await).receipt
}

/// The receipt `describe` answers for `key`, with its state.
pub async fn described_receipt<S: Store>(
    store: &S,
    key: &IdempotencyKey,
) -> (KeyState, Option<Arc<Receipt>>) {
    let record = store.describe(key).await.unwrap().expect("a known key");
    (record.state, record.receipt)
}

/// Claims `key`, which must be free, and commits it with `written`: the lease.
async fn committed_with<S: Store>(store: &S, key: &IdempotencyKey, written: &Receipt) -> Lease {
    let lease = acquire(store, key, LONG).await;
    store.commit_with(&lease, written).await.unwrap();
    lease
}

/// A claim after `commit_with` answers the receipt exactly, a small one and one of 1 MiB; so
/// does `describe`; and so does every later duplicate.
pub async fn commit_with_keeps_the_receipt<S: Store>(store: S) {
    let ns = unique_namespace("receipt");
    let key = key_in(&ns, "evt_1");
    let written = receipt(7);
    committed_with(&store, &key, &written).await;
    for deliveries in [2, 3] {
        let done = expect_done(store.claim(&key, LONG).await);
        assert_eq!(done.deliveries, deliveries);
        assert_eq!(done.receipt.as_deref(), Some(&written));
    }
    let (state, described) = described_receipt(&store, &key).await;
    assert_eq!(state, KeyState::Done);
    assert_eq!(described.as_deref(), Some(&written));

    // A large body, every byte value in it.
    let big = key_in(&ns, "evt_big");
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i % 256) as u8).collect();
    let written = receipt_with_body(9, Bytes::from(body));
    committed_with(&store, &big, &written).await;
    let answered = claimed_receipt(&store, &big).await.expect("a receipt");
    assert_eq!(
        *answered, written,
        "the 1 MiB receipt reads back as written"
    );
    let (_, described) = described_receipt(&store, &big).await;
    assert_eq!(described.as_deref(), Some(&written));

    // A receipt of a fingerprint alone, and an empty one, are receipts too.
    for (value, written) in [
        (
            "evt_fingerprint",
            Receipt::new(Some(Fingerprint::from_bytes([3; 32])), None),
        ),
        ("evt_empty", Receipt::default()),
    ] {
        let key = key_in(&ns, value);
        committed_with(&store, &key, &written).await;
        assert_eq!(
            claimed_receipt(&store, &key).await.as_deref(),
            Some(&written)
        );
    }
}

/// A plain `commit` keeps no receipt.
pub async fn plain_commit_keeps_no_receipt<S: Store>(store: S) {
    let key = key_in(&unique_namespace("no-receipt"), "evt_1");
    let lease = acquire(&store, &key, LONG).await;
    store.commit(&lease).await.unwrap();
    assert_eq!(claimed_receipt(&store, &key).await, None);
    assert_eq!(
        described_receipt(&store, &key).await,
        (KeyState::Done, None)
    );
}

/// A repeated commit with the same lease answers `Ok` and keeps what the first one wrote,
/// whatever it brings.
pub async fn a_repeated_commit_keeps_the_first_receipt<S: Store>(store: S) {
    let ns = unique_namespace("receipt-again");
    let key = key_in(&ns, "evt_1");
    let first = receipt(1);
    let lease = committed_with(&store, &key, &first).await;
    store.commit_with(&lease, &receipt(2)).await.unwrap();
    store.commit(&lease).await.unwrap();
    assert_eq!(claimed_receipt(&store, &key).await.as_deref(), Some(&first));
    assert_eq!(
        described_receipt(&store, &key).await.1.as_deref(),
        Some(&first)
    );

    // And a row committed without one does not take one later.
    let plain = key_in(&ns, "evt_2");
    let lease = acquire(&store, &plain, LONG).await;
    store.commit(&lease).await.unwrap();
    store.commit_with(&lease, &receipt(3)).await.unwrap();
    assert_eq!(claimed_receipt(&store, &plain).await, None);
}

/// A row taken by a new run, released and claimed again or taken over as stale, never shows a
/// receipt until its own run commits with one; a row a person resolved has none.
pub async fn a_new_run_shows_no_receipt<S: Store>(store: S) {
    let ns = unique_namespace("receipt-run");
    let stale = key_in(&ns, "evt_stale");
    acquire(&store, &stale, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    // Beside them, a key committed with a receipt keeps it.
    let kept = key_in(&ns, "evt_kept");
    let written = receipt(4);
    committed_with(&store, &kept, &written).await;

    let taken = acquire(&store, &stale, Stale::reclaim_after(SHORT)).await;
    assert!(taken.reclaimed());
    assert_eq!(
        described_receipt(&store, &stale).await,
        (KeyState::Processing, None)
    );
    store.commit(&taken).await.unwrap();
    assert_eq!(claimed_receipt(&store, &stale).await, None);

    let released = key_in(&ns, "evt_released");
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();
    assert_eq!(
        described_receipt(&store, &released).await,
        (KeyState::Released, None)
    );
    let again = acquire(&store, &released, LONG).await;
    store.commit(&again).await.unwrap();
    assert_eq!(claimed_receipt(&store, &released).await, None);

    let resolved = key_in(&ns, "evt_resolved");
    acquire(&store, &resolved, LONG).await;
    assert!(store.resolve(&resolved, Resolution::Done).await.unwrap());
    assert_eq!(claimed_receipt(&store, &resolved).await, None);

    assert_eq!(
        claimed_receipt(&store, &kept).await.as_deref(),
        Some(&written)
    );
}

/// `commit_with` on a lease that no longer holds (taken over, released, never granted)
/// answers `LeaseLost` and writes nothing.
pub async fn commit_with_a_lost_lease_writes_nothing<S: Store>(store: S) {
    let ns = unique_namespace("receipt-lost");
    let key = key_in(&ns, "evt_1");
    let old = acquire(&store, &key, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    let new = acquire(&store, &key, Stale::reclaim_after(SHORT)).await;
    assert_lease_lost(store.commit_with(&old, &receipt(5)).await);
    assert_eq!(
        described_receipt(&store, &key).await,
        (KeyState::Processing, None),
        "the old owner's commit changed nothing"
    );
    let written = receipt(6);
    store.commit_with(&new, &written).await.unwrap();
    // The old owner, late again, cannot replace the new owner's receipt either.
    assert_lease_lost(store.commit_with(&old, &receipt(5)).await);
    assert_eq!(
        claimed_receipt(&store, &key).await.as_deref(),
        Some(&written)
    );

    let released = key_in(&ns, "evt_2");
    let lease = acquire(&store, &released, LONG).await;
    store.release(&lease).await.unwrap();
    assert_lease_lost(store.commit_with(&lease, &receipt(5)).await);
    assert_eq!(
        described_receipt(&store, &released).await,
        (KeyState::Released, None)
    );

    let unknown = key_in(&ns, "evt_3");
    let forged = Lease::new(unknown.clone(), LeaseToken::generate(), false);
    assert_lease_lost(store.commit_with(&forged, &receipt(5)).await);
    assert_eq!(store.describe(&unknown).await.unwrap(), None);
}
