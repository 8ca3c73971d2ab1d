//! A script sent twice answers as it did the first time and changes nothing more: redis-rs
//! sends a command again when the connection it went out on drops before the answer comes,
//! after the first may have run. Each test runs a script twice with the same arguments, on
//! one server (`REDIS_URL`, default `redis://127.0.0.1:6379`) and on a Redis Cluster
//! (`REDIS_CLUSTER_URLS`, default the nodes `.ci/run` starts on 127.0.0.1:7001-7003).
//! Unreachable, a test is skipped, or fails when `CI` is set.

use std::collections::HashMap;
use std::time::Duration;

use super::claims::ClaimReply;
use super::scripts::{CLAIM, RESOLVE, SETTLE_VERSION};
use super::{RedisStore, arg};
use crate::key::IdempotencyKey;
use crate::store::{
    Claim, Lease, LeaseToken, Stale, Store, StoreError, VersionClaim, VersionLease, VersionStore,
};

/// The prefix the integration tests write under too.
const PREFIX: &str = "tower-idempotency-test";

/// A stale limit no test reaches.
const LONG: Stale = Stale::reclaim_after(Duration::from_secs(600));

/// The store on `url`, from the environment variable `var`: `None` (the test skipped) if it
/// cannot be reached, or a failure under `CI`.
fn reachable(var: &str, url: &str, store: Result<RedisStore, StoreError>) -> Option<RedisStore> {
    match store {
        Ok(store) => Some(store.with_prefix(PREFIX).expect("prefix")),
        Err(err) if std::env::var_os("CI").is_some() => {
            panic!("{var}={url} cannot be reached ({err:?}); CI is set, so this fails")
        }
        Err(err) => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {var}={url} cannot be reached ({err:?})"
            );
            None
        }
    }
}

async fn server() -> Option<RedisStore> {
    let var = "REDIS_URL";
    let url = std::env::var(var).unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    reachable(var, &url, RedisStore::connect(&url).await)
}

async fn cluster() -> Option<RedisStore> {
    let var = "REDIS_CLUSTER_URLS";
    let urls = std::env::var(var).unwrap_or_else(|_| {
        "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003".to_owned()
    });
    let nodes = urls.split(',').map(str::trim);
    reachable(var, &urls, RedisStore::connect_cluster(nodes).await)
}

/// A key no other test uses.
fn unique(test: &str) -> IdempotencyKey {
    let n = LeaseToken::generate().to_i64().unsigned_abs();
    IdempotencyKey::new(format!("resend-{test}-{n:x}"), "evt_1").expect("a key")
}

/// The whole hash at `key`.
async fn hash(store: &RedisStore, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut store.conn.clone())
        .await
        .expect("HGETALL")
}

/// The time to live of `key` in milliseconds (-1 none, -2 no key).
async fn ttl(store: &RedisStore, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut store.conn.clone())
        .await
        .expect("PTTL")
}

/// The arguments of `CLAIM` for `token`, reclaiming after `stale_us`.
fn claim_args(key: &IdempotencyKey, token: LeaseToken, stale_us: i64) -> [Vec<u8>; 5] {
    [
        arg(token.to_i64()),
        arg(1_u8),
        arg(stale_us),
        arg(key.namespace()),
        arg(key.value()),
    ]
}

/// Runs `CLAIM` with `args` (for `token`) twice, as a client sends it again: each run answers
/// `acquired` for `token` with the `(deliveries, reclaimed)` given, and leaves the hash held
/// by `token`, counting that many deliveries and as many runs. The hash after each run.
async fn claim_twice(
    store: &RedisStore,
    at: &str,
    args: &[Vec<u8>],
    token: LeaseToken,
    (delivered, reclaim): (u64, i64),
) -> Vec<HashMap<String, String>> {
    let mut rows = Vec::new();
    for run in ["first", "second"] {
        let (kind, answered, deliveries, _, _, reclaimed, _): ClaimReply =
            store.call(&CLAIM, at, args).await.unwrap();
        assert_eq!(kind, "acquired", "{run} run");
        assert_eq!(answered, token.to_i64().to_string(), "{run} run");
        assert_eq!((deliveries, reclaimed), (delivered, reclaim), "{run} run");
        let row = hash(store, at).await;
        assert_eq!(row["token"], token.to_i64().to_string());
        let counted = delivered.to_string();
        assert_eq!(
            (&*row["deliveries"], &*row["runs"]),
            (&*counted, &*counted),
            "{run} run"
        );
        rows.push(row);
    }
    rows
}

/// A claim sent twice acquires once: the second run answers `acquired` with the same token,
/// and counts neither the delivery nor the run again, for a new claim and a reclaim alike.
async fn claim_sent_twice(store: RedisStore) {
    let key = unique("claim");
    let at = store.key_of(&key);
    let token = LeaseToken::generate();
    let args = claim_args(&key, token, 600_000_000);
    for row in claim_twice(&store, &at, &args, token, (1, 0)).await {
        assert_eq!(row["state"], "processing");
    }
    // Another claim is still a duplicate in flight.
    let other = claim_args(&key, LeaseToken::generate(), 600_000_000);
    let (kind, ..): ClaimReply = store.call(&CLAIM, &at, &other).await.unwrap();
    assert_eq!(kind, "pending");

    // A reclaim (stale at once) sent twice: reclaimed once, flag kept on the second answer.
    let reclaimer = LeaseToken::generate();
    let args = claim_args(&key, reclaimer, 0);
    for row in claim_twice(&store, &at, &args, reclaimer, (2, 1)).await {
        assert_eq!(row["reclaimed"], "1");
    }
}

/// A person's resolve sent twice answers 1 both times, done or release, and the second changes
/// nothing, even once a new claim took the released key.
async fn resolve_sent_twice(store: RedisStore) {
    for how in ["done", "release"] {
        let key = unique(&format!("resolve-{how}"));
        let at = store.key_of(&key);
        let Claim::Acquired(lease) = store.claim(&key, LONG).await.unwrap() else {
            panic!("a new key is acquired");
        };
        let args = [
            arg(how),
            arg(LeaseToken::generate().to_i64()),
            arg(store.retention_ms()),
        ];
        for run in ["first", "second"] {
            let resolved: i64 = store.call(&RESOLVE, &at, &args).await.unwrap();
            assert_eq!(resolved, 1, "{how}, {run} run");
        }
        // A resolve of its own finds nothing in flight.
        assert!(
            !store
                .resolve(&key, crate::store::Resolution::Done)
                .await
                .unwrap()
        );
        if how == "done" {
            assert_eq!(hash(&store, &at).await["state"], "done");
            // The old owner's late commit is fenced off.
            assert!(matches!(
                store.commit(&lease).await,
                Err(StoreError::LeaseLost)
            ));
            continue;
        }
        assert_eq!(hash(&store, &at).await["state"], "released");
        // The old owner's release still succeeds, as on the other stores.
        store.release(&lease).await.unwrap();
        // A new claim takes the key; the resolve sent once more leaves it in flight.
        let Claim::Acquired(_next) = store.claim(&key, LONG).await.unwrap() else {
            panic!("a released key is acquired");
        };
        let resolved: i64 = store.call(&RESOLVE, &at, &args).await.unwrap();
        assert_eq!(resolved, 1, "the same resolve, a third time");
        assert_eq!(hash(&store, &at).await["state"], "processing");
    }
}

/// Begins `version` of `entity`, which must be acquired.
async fn begin(store: &RedisStore, entity: &IdempotencyKey, version: i64) -> VersionLease {
    match store.begin_version(entity, version, LONG).await.unwrap() {
        VersionClaim::Acquired(lease) => lease,
        other => panic!("version {version}: {other:?}"),
    }
}

/// A new entity for the test `test`, its hash, and the lease of `version` begun on it.
async fn begun(
    store: &RedisStore,
    test: &str,
    version: i64,
) -> (IdempotencyKey, String, VersionLease) {
    let entity = unique(test);
    let lease = begin(store, &entity, version).await;
    let at = store.entity_of(&entity);
    (entity, at, lease)
}

/// What `SETTLE_VERSION` answers, run with `args` on the hash `at`.
async fn sent(store: &RedisStore, at: &str, args: &[Vec<u8>]) -> i64 {
    store.call(&SETTLE_VERSION, at, args).await.unwrap()
}

/// A version's settlement sent twice answers 1 both times: apply or discard, by the lease or
/// by a person; a second settlement by the same lease (not the first sent again) answers 0.
async fn settle_version_sent_twice(store: RedisStore) {
    // Applied by the lease.
    let (entity, at, lease) = begun(&store, "apply", 5).await;
    let args = store.settle_args(Some(lease.token()), "apply");
    for run in ["first", "second"] {
        assert_eq!(sent(&store, &at, &args).await, 1, "apply, {run} run");
        assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
    }
    let other_way = store.settle_args(Some(lease.token()), "discard");
    assert_eq!(
        sent(&store, &at, &other_way).await,
        0,
        "applied, not discarded"
    );
    // A second settlement by the lease, not the first sent again, finds it settled.
    assert!(matches!(
        store.commit_version(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    // Sent again after the next version began: answers 1, and leaves that one pending.
    let next = begin(&store, &entity, 6).await;
    assert_eq!(sent(&store, &at, &args).await, 1);
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
    store.commit_version(&next).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(6));

    // Discarded by the lease, where nothing was ever applied: a marker with a time to live
    // answers the second run, and the next version begins on it and keeps the hash.
    let (entity, at, lease) = begun(&store, "discard", 5).await;
    let args = store.settle_args(Some(lease.token()), "discard");
    for run in ["first", "second"] {
        assert_eq!(sent(&store, &at, &args).await, 1, "discard, {run} run");
        assert_eq!(store.applied_version(&entity).await.unwrap(), None);
        assert!(ttl(&store, &at).await > 0, "the marker expires");
    }
    let other_way = store.settle_args(Some(lease.token()), "apply");
    assert_eq!(
        sent(&store, &at, &other_way).await,
        0,
        "discarded, not applied"
    );
    let next = begin(&store, &entity, 4).await;
    assert_eq!(
        ttl(&store, &at).await,
        -1,
        "a pending version does not expire"
    );
    store.commit_version(&next).await.unwrap();
    assert_eq!(ttl(&store, &at).await, -1);
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(4));

    // Discarded where a version was applied: the hash keeps it.
    let lease = begin(&store, &entity, 7).await;
    let args = store.settle_args(Some(lease.token()), "discard");
    for run in ["first", "second"] {
        assert_eq!(sent(&store, &at, &args).await, 1, "discard, {run} run");
        assert_eq!(store.applied_version(&entity).await.unwrap(), Some(4));
    }

    // By a person: the second run answers 1 and leaves a version begun since pending.
    for how in ["apply", "discard"] {
        let (entity, at, _held) = begun(&store, &format!("person-{how}"), 3).await;
        let args = store.settle_args(None, how);
        for run in ["first", "second"] {
            assert_eq!(
                sent(&store, &at, &args).await,
                1,
                "a person's {how}, {run} run"
            );
        }
        let next = begin(&store, &entity, 9).await;
        assert_eq!(
            sent(&store, &at, &args).await,
            1,
            "a person's {how}, a third time"
        );
        store.commit_version(&next).await.unwrap();
        assert_eq!(store.applied_version(&entity).await.unwrap(), Some(9));
    }
}

/// A claim given back is released with its run taken back, once; a second give-back is `Ok`
/// and takes nothing more; another token's is `LeaseLost`.
async fn give_back(store: RedisStore) {
    let key = unique("give-back");
    let at = store.key_of(&key);
    let Claim::Acquired(lease) = store.claim(&key, LONG).await.unwrap() else {
        panic!("a new key is acquired");
    };
    assert_eq!(hash(&store, &at).await["runs"], "1");
    let stranger = Lease::new(key.clone(), LeaseToken::generate(), false);
    assert!(matches!(
        store.give_back(&stranger).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(hash(&store, &at).await["state"], "processing");
    for run in ["first", "second"] {
        store.give_back(&lease).await.unwrap();
        let row = hash(&store, &at).await;
        assert_eq!(row["state"], "released", "{run} give-back");
        assert_eq!(row["runs"], "0", "{run} give-back");
        assert_eq!(row["deliveries"], "1", "{run} give-back");
        assert!(ttl(&store, &at).await > 0, "released, it expires");
    }
    // The next delivery runs it: one run in all. The old lease no longer holds.
    let Claim::Acquired(next) = store.claim(&key, LONG).await.unwrap() else {
        panic!("a given-back key is acquired");
    };
    assert_eq!(hash(&store, &at).await["runs"], "1");
    assert!(matches!(
        store.give_back(&lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(hash(&store, &at).await["runs"], "1");
    // A claim settled otherwise is not given back.
    store.commit(&next).await.unwrap();
    assert!(matches!(
        store.give_back(&next).await,
        Err(StoreError::LeaseLost)
    ));
    let row = hash(&store, &at).await;
    assert_eq!((&*row["state"], &*row["runs"]), ("done", "1"));
}

/// Each test once on one server and once on the cluster.
macro_rules! on_both {
    ($($test:ident),* $(,)?) => {
        mod on_server {
            $(
                #[tokio::test]
                async fn $test() {
                    if let Some(store) = super::server().await {
                        super::$test(store).await;
                    }
                }
            )*
        }
        mod on_cluster {
            $(
                #[tokio::test]
                async fn $test() {
                    if let Some(store) = super::cluster().await {
                        super::$test(store).await;
                    }
                }
            )*
        }
    };
}

on_both!(
    claim_sent_twice,
    resolve_sent_twice,
    settle_version_sent_twice,
    give_back
);
