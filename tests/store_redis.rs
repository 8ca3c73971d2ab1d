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

    /// Duplicates' counts reach the cluster, each key's on its own slot's master.
    #[tokio::test]
    async fn duplicate_counts_reach_the_server() {
        let (Some(store), Some(other)) = (store().await, store().await) else {
            return;
        };
        super::counts_reach_the_server(store, other).await;
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

/// The hash of `key` as the store writes it (the module docs give its name), and its time to
/// live in milliseconds.
async fn hash_of(key: &tower_idempotency::IdempotencyKey) -> (Vec<(String, String)>, i64) {
    let url = common::database_url("REDIS_URL", "redis://127.0.0.1:6379");
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ns = key.namespace();
    let name = format!("{PREFIX}:k:{}:{ns}:{}", ns.len(), key.value());
    let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    fields.sort();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    (fields, ttl)
}

/// Duplicates of a done key, and of one in flight, leave its hash as it was (no count, no
/// time, no new time to live), yet are counted at once by their store; taking a released key
/// over does write.
#[tokio::test]
async fn a_duplicate_writes_nothing() {
    use tower_idempotency::store::{Claim, Store};
    let Some(store) = store().await else { return };
    let store = store.with_count_interval(common::hot_path::NEVER);
    let ns = common::unique_namespace("no-write");
    let (done, running, released) = (
        common::key_in(&ns, "done"),
        common::key_in(&ns, "running"),
        common::key_in(&ns, "released"),
    );
    let lease = common::acquire(&store, &done, common::LONG).await;
    store.commit(&lease).await.unwrap();
    let _running = common::acquire(&store, &running, common::LONG).await;
    let lease = common::acquire(&store, &released, common::LONG).await;
    store.release(&lease).await.unwrap();

    let (done_before, done_ttl) = hash_of(&done).await;
    let (running_before, running_ttl) = hash_of(&running).await;
    assert!(
        done_ttl > 0 && running_ttl == -1,
        "{done_ttl} {running_ttl}"
    );
    for deliveries in 2..=4 {
        match store.claim(&done, common::LONG).await.unwrap() {
            Claim::Done(record) => assert_eq!(record.deliveries, deliveries),
            other => panic!("a duplicate of a done key: {other:?}"),
        }
        match store.claim(&running, common::LONG).await.unwrap() {
            Claim::InFlight(pending) => assert_eq!(pending.deliveries, deliveries),
            other => panic!("a duplicate of a key in flight: {other:?}"),
        }
    }
    let (done_after, ttl_after) = hash_of(&done).await;
    assert_eq!(
        done_after, done_before,
        "a duplicate of a done key wrote its hash"
    );
    assert!(
        ttl_after <= done_ttl,
        "a duplicate renewed the time to live"
    );
    assert_eq!(hash_of(&running).await, (running_before, -1));
    assert_eq!(store.describe(&done).await.unwrap().unwrap().deliveries, 4);

    let (released_before, _) = hash_of(&released).await;
    let lease = common::acquire(&store, &released, common::LONG).await;
    assert_ne!(
        hash_of(&released).await.0,
        released_before,
        "a take-over writes"
    );
    store.commit(&lease).await.unwrap();
}

/// Duplicates are counted at once in their instance, and in Redis once written.
#[tokio::test]
async fn duplicate_counts_reach_the_server() {
    let (Some(store), Some(other)) = (store().await, store().await) else {
        return;
    };
    counts_reach_the_server(store, other).await;
}

/// Duplicates through `store` are counted there at once and reach `other` (another instance)
/// once written, exactly once (`hot_path`), counts written by hand.
async fn counts_reach_the_server(store: RedisStore, other: RedisStore) {
    let (store, other) = (
        store.with_count_interval(common::hot_path::NEVER),
        other.with_count_interval(common::hot_path::NEVER),
    );
    common::hot_path::duplicate_counts_reach_the_table(store, other, |store| async move {
        store.write_counts().await.unwrap();
    })
    .await;
}

/// Without `write_counts`, the store's background task writes the counts within its interval.
#[tokio::test]
async fn duplicate_counts_are_written_in_the_background() {
    use std::time::{Duration, Instant};
    use tower_idempotency::store::{Claim, Store};
    let (Some(store), Some(other)) = (store().await, store().await) else {
        return;
    };
    let store = store.with_count_interval(Duration::from_millis(50));
    let key = common::key_in(&common::unique_namespace("background-counts"), "evt");
    let lease = common::acquire(&store, &key, common::LONG).await;
    store.commit(&lease).await.unwrap();
    for _ in 0..2 {
        assert!(matches!(
            store.claim(&key, common::LONG).await,
            Ok(Claim::Done(_))
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = other.describe(&key).await.unwrap().unwrap().deliveries;
        if seen == 3 {
            break;
        }
        assert!(seen < 3, "counted twice: {seen}");
        assert!(Instant::now() < deadline, "the counts never reached Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A round writes many keys' counts at once, each exactly once.
#[tokio::test]
async fn many_keys_counts_are_written_once_each() {
    use tower_idempotency::store::{Claim, Store};
    let (Some(store), Some(other)) = (store().await, store().await) else {
        return;
    };
    let store = store.with_count_interval(common::hot_path::NEVER);
    let ns = common::unique_namespace("many-counts");
    let keys: Vec<_> = (0..100)
        .map(|i| common::key_in(&ns, &format!("evt_{i}")))
        .collect();
    for key in &keys {
        let lease = common::acquire(&store, key, common::LONG).await;
        store.commit(&lease).await.unwrap();
        for _ in 0..2 {
            assert!(matches!(
                store.claim(key, common::LONG).await,
                Ok(Claim::Done(_))
            ));
        }
    }
    store.write_counts().await.unwrap();
    store.write_counts().await.unwrap();
    for key in &keys {
        let seen = other.describe(key).await.unwrap().unwrap();
        assert_eq!(seen.deliveries, 3, "{key}");
    }
}
