//! The [`VersionStore`] contract of the version guard: one pending version per entity, older
//! versions outdated, stale pending versions reclaimed or held, settled by hand.

use crate::IdempotencyKey;
use crate::store::{Resolution, Stale};
use crate::version_guard::{VersionClaim, VersionLease, VersionStore};

use super::expect::{assert_lease_lost, expect_version_held, expect_version_in_flight};
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
        let pending = expect_version_in_flight(store.begin_version(&entity, version, LONG).await);
        assert_eq!(pending.version, 2, "busy for {version}");
    }
    store.release_version(&first).await.unwrap();
    assert_lease_lost(store.release_version(&first).await);
    assert_lease_lost(store.commit_version(&first).await);
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let again = acquire_version(&store, &entity, 2, LONG).await;
    assert_ne!(again.token(), first.token());
    store.commit_version(&again).await.unwrap();
    assert_lease_lost(store.commit_version(&again).await);
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
        let pending = expect_version_in_flight(store.begin_version(&entity, version, LONG).await);
        assert_eq!(pending.version, 2, "busy for {version}");
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
    let pending = expect_version_in_flight(store.begin_version(&entity, 2, LONG).await);
    assert_eq!(pending.version, 5, "busy for the applied version");
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
    expect_version_in_flight(store.begin_version(&entity, 2, LONG).await);
    let hold = Stale::hold_after(SHORT);
    let pending = expect_version_held(store.begin_version(&entity, 2, hold).await);
    assert_eq!(pending.version, 1);
    assert!(pending.age >= SHORT, "age {:?}", pending.age);
    // Reclaim: the new version takes over; the old owner is fenced off.
    let new = acquire_version(&store, &entity, 2, Stale::reclaim_after(SHORT)).await;
    assert_lease_lost(store.commit_version(&old).await);
    assert_lease_lost(store.release_version(&old).await);
    // The takeover restarted the pending version's clock.
    let p = expect_version_in_flight(store.begin_version(&entity, 3, LONG).await);
    assert!(p.version == 2 && p.age < PAST_SHORT, "{p:?}");
    store.commit_version(&new).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

    // A stale pending version is never taken over by an older one: its owner may have written
    // its state before it died.
    let newer = key_in(&ns, "sub_3");
    acquire_version(&store, &newer, 5, LONG).await;
    tokio::time::sleep(PAST_SHORT).await;
    let p = expect_version_in_flight(
        store
            .begin_version(&newer, 4, Stale::reclaim_after(SHORT))
            .await,
    );
    assert_eq!(p.version, 5, "an older version must not take over");
    // The same version (its sender's retry) or a newer one may.
    let retry = acquire_version(&store, &newer, 5, Stale::reclaim_after(SHORT)).await;
    store.commit_version(&retry).await.unwrap();
    assert_eq!(store.applied_version(&newer).await.unwrap(), Some(5));

    // A person settles held versions.
    let held = key_in(&ns, "sub_2");
    let resolve = |how| store.resolve_version(&held, how);
    let lease = acquire_version(&store, &held, 7, LONG).await;
    assert!(resolve(Resolution::Done).await.unwrap());
    assert!(!resolve(Resolution::Done).await.unwrap());
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert_lease_lost(store.commit_version(&lease).await);
    let lease = acquire_version(&store, &held, 8, LONG).await;
    assert!(resolve(Resolution::Release).await.unwrap());
    assert_eq!(store.applied_version(&held).await.unwrap(), Some(7));
    assert_lease_lost(store.release_version(&lease).await);
    acquire_version(&store, &held, 8, LONG).await;
    assert!(
        !store
            .resolve_version(&key_in(&ns, "absent"), Resolution::Release)
            .await
            .unwrap()
    );
}
