//! Everything `RedisStore` promises, on one server and on a Redis Cluster: the suites of
//! `backend_suite!`.
//!
//! The server is `REDIS_URL` (default `redis://127.0.0.1:6379`); the cluster is
//! `REDIS_CLUSTER_URLS`, comma-separated (default the six nodes `.ci/run` starts on
//! 127.0.0.1:7001–7006). Unreachable, a test is skipped, or fails when `CI` is set.

mod common;

use tower_idempotency::store::RedisStore;

/// The prefix every test of this binary writes under: one "table", as the SQL tests share.
const PREFIX: &str = "tower-idempotency-test";

/// A store on a connection of its own: one app instance.
async fn store() -> Option<RedisStore> {
    let url = common::database_url("REDIS_URL", "redis://127.0.0.1:6379");
    let store = common::connect("REDIS_URL", &url, RedisStore::connect(&url)).await?;
    Some(store.with_prefix(PREFIX).expect("prefix"))
}

backend_suite! {
    claims: store(),
    trust: store(),
    races: store(),
    versions: store(),
}

/// The same suites on a Redis Cluster.
mod cluster {
    use super::*;

    async fn store() -> Option<RedisStore> {
        let urls = common::database_url(
            "REDIS_CLUSTER_URLS",
            "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
        );
        let nodes: Vec<&str> = urls.split(',').map(str::trim).collect();
        let store = common::connect(
            "REDIS_CLUSTER_URLS",
            &urls,
            RedisStore::connect_cluster(nodes),
        )
        .await?;
        Some(store.with_prefix(PREFIX).expect("prefix"))
    }

    backend_suite! {
        claims: store(),
        trust: store(),
        races: store(),
        versions: store(),
    }
}

/// Versions are compared as integers in the server's scripts, past the 2^53 where Lua's
/// numbers stop being exact, and below zero.
#[tokio::test]
async fn versions_compare_exactly_past_two_to_the_fifty_third() {
    use std::time::Duration;
    use tower_idempotency::Stale;
    use tower_idempotency::store::{VersionClaim, VersionStore};
    let Some(store) = store().await else { return };
    let stale = Stale::reclaim_after(Duration::from_secs(60));
    let entity = common::key_in(&common::unique_namespace("big-versions"), "sub_1");
    let big = (1_i64 << 62) + 1;
    for (version, newer) in [(big, true), (big + 1, true), (big, false), (-5, false)] {
        match store.begin_version(&entity, version, stale).await.unwrap() {
            VersionClaim::Acquired(lease) => {
                assert!(newer, "{version} is older than what was applied");
                store.commit_version(&lease).await.unwrap();
            }
            VersionClaim::Outdated { applied } => {
                assert!(!newer, "{version} is not older");
                assert_eq!(applied, big + 1);
            }
            other => panic!("{version}: {other:?}"),
        }
    }
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(big + 1));
    let negative = common::key_in(&common::unique_namespace("negative-versions"), "sub_1");
    for (version, applies) in [(-10, true), (-11, false), (-9, true), (-100, false)] {
        let claim = store
            .begin_version(&negative, version, stale)
            .await
            .unwrap();
        match claim {
            VersionClaim::Acquired(lease) if applies => store.commit_version(&lease).await.unwrap(),
            VersionClaim::Outdated { .. } if !applies => {}
            other => panic!("{version}: {other:?}"),
        }
    }
    assert_eq!(store.applied_version(&negative).await.unwrap(), Some(-9));
}

/// A write that the replicas asked for do not confirm (the test server has none) is an
/// error, and a claim it granted is given back: the next claim, waiting for no replica, gets
/// the key as new.
#[tokio::test]
async fn a_claim_no_replica_confirmed_is_given_back() {
    use std::time::Duration;
    use tower_idempotency::Stale;
    use tower_idempotency::store::{
        Claim, KeyState, Store, StoreError, VersionClaim, VersionStore,
    };
    let Some(store) = store().await else { return };
    let waiting = store
        .clone()
        .wait_for_replicas(1, Duration::from_millis(50));
    let key = common::key_in(&common::unique_namespace("unreplicated"), "evt_1");
    let stale = Stale::default();
    let err = waiting.claim(&key, stale).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert_eq!(
        store.describe(&key).await.unwrap().map(|r| r.state),
        Some(KeyState::Released),
        "given back"
    );
    let Claim::Acquired(lease) = store.claim(&key, stale).await.unwrap() else {
        panic!("the key is free again");
    };
    // A commit no replica confirmed is an error the layer retries; it landed on the server.
    assert!(waiting.commit(&lease).await.is_err());
    assert!(matches!(
        store.claim(&key, stale).await.unwrap(),
        Claim::Done(_)
    ));

    let entity = common::key_in(&common::unique_namespace("unreplicated-version"), "sub_1");
    assert!(waiting.begin_version(&entity, 1, stale).await.is_err());
    assert!(matches!(
        store.begin_version(&entity, 1, stale).await.unwrap(),
        VersionClaim::Acquired(_)
    ));
}
