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
    }
}
