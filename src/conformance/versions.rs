//! The [`VersionStore`] contract of the version guard: one pending version per entity, older
//! versions outdated, stale pending versions reclaimed or held, settled by hand.

use crate::IdempotencyKey;
use crate::store::{Resolution, Stale, StoreError};
use crate::version_guard::{PendingVersion, VersionClaim, VersionLease, VersionStore};

use super::{LONG, PAST_SHORT, SHORT, key_in, unique_namespace};

/// Begins `version` of `entity`, which must be free to take it: the lease.
///
/// # Panics
///
/// If the claim fails or finds the entity busy, held, or past that version.
pub async fn acquire_version<St: VersionStore>(
    store: &St,
    entity: &IdempotencyKey,
    version: i64,
    stale: Stale,
) -> VersionLease {
    match store.begin_version(entity, version, stale).await.unwrap() {
        VersionClaim::Acquired(lease) => lease,
        other => panic!("expected to begin {entity} at {version}, got {other:?}"),
    }
}

/// One pending version per entity: others wait (busy) behind it, older than the applied one
/// are outdated, an equal one takes the slot like a newer one; commit and release act once per
/// lease; entities and namespaces are independent; versions are full 64-bit integers.
pub async fn version_store_contract<St: VersionStore>(store: St) {
    let ns = unique_namespace("versions");
    let entity = key_in(&ns, "sub_1");
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let first = acquire_version(&store, &entity, 2, LONG).await;
    assert_eq!((first.entity(), first.version()), (&entity, 2));
    for version in [1, 2, 3] {
        match store.begin_version(&entity, version, LONG).await.unwrap() {
            VersionClaim::InFlight(PendingVersion { version: 2, .. }) => {}
            other => panic!("expected busy for {version}, got {other:?}"),
        }
    }
    store.release_version(&first).await.unwrap();
    assert!(matches!(
        store.release_version(&first).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.commit_version(&first).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let again = acquire_version(&store, &entity, 2, LONG).await;
    assert_ne!(again.token(), first.token());
    store.commit_version(&again).await.unwrap();
    assert!(matches!(
        store.commit_version(&again).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    // Only an older version is outdated.
    for version in [1, -5] {
        assert_eq!(
            store.begin_version(&entity, version, LONG).await.unwrap(),
            VersionClaim::Outdated { applied: 2 }
        );
    }
    // An equal version (another change in the same second) takes the slot like a newer one,
    // one delivery at a time: the same version again waits behind it.
    let equal = acquire_version(&store, &entity, 2, LONG).await;
    assert_ne!(equal.token(), again.token());
    for version in [2, 3] {
        match store.begin_version(&entity, version, LONG).await.unwrap() {
            VersionClaim::InFlight(PendingVersion { version: 2, .. }) => {}
            other => panic!("expected busy for {version}, got {other:?}"),
        }
    }
    assert_eq!(
        store.begin_version(&entity, 1, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 2 }
    );
    store.commit_version(&equal).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    // A released equal version leaves the applied one as it was.
    let equal = acquire_version(&store, &entity, 2, LONG).await;
    store.release_version(&equal).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    let newer = acquire_version(&store, &entity, 5, LONG).await;
    // Outdated wins over busy: a version older than the applied one never waits; an equal
    // one does.
    assert_eq!(
        store.begin_version(&entity, 1, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 2 }
    );
    match store.begin_version(&entity, 2, LONG).await.unwrap() {
        VersionClaim::InFlight(PendingVersion { version: 5, .. }) => {}
        other => panic!("expected busy for the applied version, got {other:?}"),
    }
    store.commit_version(&newer).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
    assert_eq!(
        store.begin_version(&entity, 2, LONG).await.unwrap(),
        VersionClaim::Outdated { applied: 5 }
    );

    // Other entities, and the same id in another namespace, are independent.
    acquire_version(&store, &key_in(&ns, "sub_2"), 1, LONG).await;
    acquire_version(&store, &key_in(&format!("{ns}-other"), "sub_1"), 1, LONG).await;
    // Versions are full 64-bit integers: microsecond timestamps, negative ones too.
    let wide = key_in(&ns, "wide");
    for version in [i64::MIN + 1, -1, 1_714_572_003_250_000, i64::MAX] {
        let lease = acquire_version(&store, &wide, version, LONG).await;
        store.commit_version(&lease).await.unwrap();
        assert_eq!(store.applied_version(&wide).await.unwrap(), Some(version));
    }
}

/// A pending version not renewed for the stale limit is held or taken over, never by an older
/// version; the old owner is fenced off; `resolve_version` settles a pending version by hand.
pub async fn stale_pending_version_reclaim_hold_and_resolve<St: VersionStore>(store: St) {
    let ns = unique_namespace("stale-versions");
    let entity = key_in(&ns, "sub_1");
    let old = acquire_version(&store, &entity, 1, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert!(matches!(
        store.begin_version(&entity, 2, LONG).await.unwrap(),
        VersionClaim::InFlight(_)
    ));
    match store
        .begin_version(&entity, 2, Stale::hold_after(SHORT))
        .await
        .unwrap()
    {
        VersionClaim::Held(pending) => {
            assert_eq!(pending.version, 1);
            assert!(pending.age >= SHORT, "age {:?}", pending.age);
        }
        other => panic!("expected held, got {other:?}"),
    }
    // Reclaim: the new version takes over; the old owner is fenced off.
    let new = acquire_version(&store, &entity, 2, Stale::reclaim_after(SHORT)).await;
    assert!(matches!(
        store.commit_version(&old).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.release_version(&old).await,
        Err(StoreError::LeaseLost)
    ));
    match store.begin_version(&entity, 3, LONG).await.unwrap() {
        // The takeover restarted the pending version's clock.
        VersionClaim::InFlight(p) => assert!(p.version == 2 && p.age < PAST_SHORT, "{p:?}"),
        other => panic!("expected busy, got {other:?}"),
    }
    store.commit_version(&new).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    // A stale pending version is never taken over by an older one: its owner may have written
    // its state before it died.
    let newer = key_in(&ns, "sub_3");
    acquire_version(&store, &newer, 5, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    match store
        .begin_version(&newer, 4, Stale::reclaim_after(SHORT))
        .await
        .unwrap()
    {
        VersionClaim::InFlight(p) => assert_eq!(p.version, 5),
        other => panic!("an older version must not take over, got {other:?}"),
    }
    // The same version (its sender's retry) or a newer one may.
    let retry = acquire_version(&store, &newer, 5, Stale::reclaim_after(SHORT)).await;
    store.commit_version(&retry).await.unwrap();
    assert_eq!(store.applied_version(&newer).await.unwrap(), Some(5));

    // A person settles held versions.
    let held = key_in(&ns, "sub_2");
    let lease = acquire_version(&store, &held, 7, LONG).await;
    assert!(
        store
            .resolve_version(&held, Resolution::Done)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve_version(&held, Resolution::Done)
            .await
            .unwrap()
    );
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert!(matches!(
        store.commit_version(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    let lease = acquire_version(&store, &held, 8, LONG).await;
    assert!(
        store
            .resolve_version(&held, Resolution::Release)
            .await
            .unwrap()
    );
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert!(matches!(
        store.release_version(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    acquire_version(&store, &held, 8, LONG).await;
    assert!(
        !store
            .resolve_version(&key_in(&ns, "absent"), Resolution::Release)
            .await
            .unwrap()
    );
}
