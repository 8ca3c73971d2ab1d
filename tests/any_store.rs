//! The conformance suite and the races on `AnyStore`, once for each backend it can hold, every
//! store made by `AnyStore::connect`; then what `connect` makes of each URL scheme.
//!
//! PostgreSQL and MySQL come from `POSTGRES_URL` and `MYSQL_URL`, Redis from `REDIS_URL` and
//! the Redis Cluster from `REDIS_CLUSTER_URLS` (defaults: the local servers, and the cluster
//! `.ci/run` starts on 127.0.0.1:7001-7006); an unreachable database skips the test, or fails
//! it when `CI` is set. The SQL stores use a table of this binary's own, and the Redis stores a
//! key prefix of its own, so that the suite's purges leave other test binaries' rows on the
//! same database alone.

#![cfg(any(
    feature = "memory",
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]

mod common;

use std::time::Duration;

use tower_idempotency::IdempotencyKey;
use tower_idempotency::store::{
    AnyStore, ConnectError, Resolution, Stale, VersionClaim, VersionStore,
};

/// The table of this binary's SQL stores, and the key prefix of its Redis stores.
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
const TABLE: &str = "any_store_keys";

/// `AnyStore::connect(url)`, in this binary's table and migrated; `None` (or a panic under
/// `CI`) when the database named by `var` cannot be reached.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
async fn connect_to(var: &str, url: &str) -> Option<AnyStore> {
    let store = common::connect(var, url, AnyStore::connect(url)).await?;
    let store = store.with_table_name(TABLE).expect("a valid table name");
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The applied version follows what `begin_version` / `commit_version` / `release_version`
/// / `resolve_version` did, through the enum.
async fn versions_go_through(store: AnyStore) {
    let ns = common::unique_namespace("any-versions");
    let entity = IdempotencyKey::new(ns, "sub_1").unwrap();
    let stale = Stale::reclaim_after(Duration::from_secs(600));

    let VersionClaim::Acquired(lease) = store.begin_version(&entity, 2, stale).await.unwrap()
    else {
        panic!("nothing applied or pending yet");
    };
    assert!(matches!(
        store.begin_version(&entity, 3, stale).await.unwrap(),
        VersionClaim::InFlight(_)
    ));
    store.renew_version(&lease).await.unwrap();
    store.commit_version(&lease).await.unwrap();
    assert_eq!(
        store.begin_version(&entity, 1, stale).await.unwrap(),
        VersionClaim::Outdated { applied: 2 }
    );
    let VersionClaim::Acquired(lease) = store.begin_version(&entity, 4, stale).await.unwrap()
    else {
        panic!("a newer version runs");
    };
    store.release_version(&lease).await.unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
    let VersionClaim::Acquired(_) = store.begin_version(&entity, 5, stale).await.unwrap() else {
        panic!("the released slot is free");
    };
    assert!(
        store
            .resolve_version(&entity, Resolution::Done)
            .await
            .unwrap()
    );
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
}

#[cfg(feature = "memory")]
mod memory {
    use std::sync::OnceLock;

    use tower_idempotency::store::{AnyStore, MemoryStore};

    async fn store() -> Option<AnyStore> {
        let store = AnyStore::connect("memory:").await.expect("memory:");
        assert!(matches!(store, AnyStore::Memory(_)));
        Some(store)
    }

    /// In-process "instances" share one map: the race checks the locking, not an index.
    async fn shared() -> Option<AnyStore> {
        static SHARED: OnceLock<AnyStore> = OnceLock::new();
        Some(SHARED.get_or_init(|| MemoryStore::new().into()).clone())
    }

    tower_idempotency::conformance_suite! {
        claims: store(),
        races: shared(),
    }

    #[tokio::test]
    async fn versions() {
        super::versions_go_through(store().await.unwrap()).await;
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use tokio::sync::OnceCell;
    use tower_idempotency::store::AnyStore;

    /// A new pool on this binary's SQLite file (one app instance), created and migrated by
    /// the first call.
    async fn file_store() -> Option<AnyStore> {
        static CREATED: OnceCell<()> = OnceCell::const_new();
        let url = format!(
            "sqlite://{}",
            crate::common::db::sqlite_file("any-store").display()
        );
        let open = || async {
            let store = AnyStore::connect(&url).await.expect("open the SQLite file");
            store.with_table_name(super::TABLE).unwrap()
        };
        CREATED
            .get_or_init(|| async { open().await.migrate().await.expect("migrate") })
            .await;
        Some(open().await)
    }

    async fn memory_store() -> Option<AnyStore> {
        let store = AnyStore::connect("sqlite::memory:").await.unwrap();
        store.migrate().await.expect("migrate");
        Some(store)
    }

    mod file {
        use super::file_store;

        tower_idempotency::conformance_suite! {
            claims: file_store(),
            races: file_store(),
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn versions() {
            crate::versions_go_through(file_store().await.unwrap()).await;
        }
    }

    mod memory {
        use super::memory_store;

        tower_idempotency::conformance_suite! {
            claims: memory_store(),
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use tower_idempotency::store::AnyStore;

    async fn store() -> Option<AnyStore> {
        let store = super::connect_to("POSTGRES_URL", &crate::common::db::postgres_url()).await?;
        assert!(matches!(store, AnyStore::Postgres(_)));
        Some(store)
    }

    tower_idempotency::conformance_suite! {
        claims: store(),
        races: store(),
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn versions() {
        let Some(store) = store().await else { return };
        crate::versions_go_through(store).await;
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use tower_idempotency::store::AnyStore;

    async fn store() -> Option<AnyStore> {
        let store = super::connect_to("MYSQL_URL", &crate::common::db::mysql_url()).await?;
        assert!(matches!(store, AnyStore::MySql(_)));
        Some(store)
    }

    tower_idempotency::conformance_suite! {
        claims: store(),
        races: store(),
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn versions() {
        let Some(store) = store().await else { return };
        crate::versions_go_through(store).await;
    }
}

#[cfg(feature = "redis")]
mod redis {
    use tower_idempotency::store::AnyStore;

    /// `redis://` on `REDIS_URL`: one app instance on its own connection.
    async fn store() -> Option<AnyStore> {
        let url = crate::common::database_url("REDIS_URL", "redis://127.0.0.1:6379");
        let store = super::connect_to("REDIS_URL", &url).await?;
        assert!(matches!(store, AnyStore::Redis(_)));
        Some(store)
    }

    tower_idempotency::conformance_suite! {
        claims: store(),
        races: store(),
    }

    #[tokio::test]
    async fn versions_go_through() {
        let Some(store) = store().await else { return };
        crate::versions_go_through(store).await;
    }

    /// The same through a `redis+cluster://` URL.
    mod cluster {
        use tower_idempotency::store::AnyStore;

        async fn store() -> Option<AnyStore> {
            let url = super::super::cluster_url();
            let store = super::super::connect_to("REDIS_CLUSTER_URLS", &url).await?;
            assert!(matches!(store, AnyStore::Redis(_)));
            Some(store)
        }

        tower_idempotency::conformance_suite! {
            claims: store(),
            races: store(),
        }

        #[tokio::test]
        async fn versions_go_through() {
            let Some(store) = store().await else { return };
            crate::versions_go_through(store).await;
        }
    }
}

/// `REDIS_CLUSTER_URLS` (comma-separated `redis://` URLs) as one `redis+cluster://` URL.
#[cfg(feature = "redis")]
fn cluster_url() -> String {
    let urls = common::database_url(
        "REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
    );
    let nodes: Vec<&str> = urls
        .split(',')
        .map(|url| url.trim().trim_start_matches("redis://"))
        .collect();
    format!("redis+cluster://{}", nodes.join(","))
}

// What `connect` makes of each scheme.

#[cfg(feature = "memory")]
#[tokio::test]
async fn memory_urls() {
    for url in ["memory:", "MEMORY://"] {
        let store = AnyStore::connect(url).await.unwrap();
        assert!(matches!(store, AnyStore::Memory(_)), "{url}");
        assert_eq!(store.backend(), "memory");
        store.migrate().await.expect("nothing to migrate");
        let store = store.with_table_name("ignored-without-a-table").unwrap();
        assert!(matches!(store, AnyStore::Memory(_)));
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_files_are_created_in_wal_mode() {
    let path = std::env::temp_dir().join(format!(
        "tower-idempotency-{}.sqlite3",
        common::unique_namespace("any-connect")
    ));
    assert!(!path.exists());
    for url in [
        format!("sqlite://{}", path.display()),
        format!("SQLite:{}", path.display()),
    ] {
        let store = AnyStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(store.backend(), "sqlite");
        let AnyStore::Sqlite(sqlite) = &store else {
            panic!("{url}: {store:?}");
        };
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(sqlite.pool())
            .await
            .unwrap();
        assert_eq!(mode, "wal", "{url}");
        sqlite.pool().close().await;
        assert!(path.exists(), "{url} created the file");
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Instances starting together on a new file all open it (the switch to WAL included).
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_instances_open_a_new_file_together() {
    let path = std::env::temp_dir().join(format!(
        "tower-idempotency-{}.sqlite3",
        common::unique_namespace("any-together")
    ));
    let url = format!("sqlite://{}", path.display());
    let opening: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let store = AnyStore::connect(&url).await?;
                store.migrate().await.map_err(|e| e.to_string())?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for open in opening {
        open.await.unwrap().expect("every instance opens the file");
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// `sqlite::memory:` gets one connection: on several, SQLite's shared cache would answer
/// concurrent claims "database table is locked" instead of waiting.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_in_memory_serves_concurrent_claims() {
    use tower_idempotency::store::{Claim, Store};

    let store = AnyStore::connect("sqlite::memory:").await.unwrap();
    store.migrate().await.unwrap();
    let ns = common::unique_namespace("any-memory");
    let claims: Vec<_> = (0..32)
        .map(|i| {
            let (store, key) = (store.clone(), common::key_in(&ns, &format!("evt_{i}")));
            tokio::spawn(async move { store.claim(&key, common::LONG).await })
        })
        .collect();
    for claim in claims {
        let claim = claim.await.unwrap().expect("no claim fails");
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_urls() {
    let url = common::db::postgres_url();
    for url in [url.clone(), url.replacen("postgres://", "postgresql://", 1)] {
        let Some(store) = common::connect("POSTGRES_URL", &url, AnyStore::connect(&url)).await
        else {
            return;
        };
        assert!(matches!(store, AnyStore::Postgres(_)), "{url}");
        assert_eq!(store.backend(), "postgres");
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_and_mariadb_urls() {
    let url = common::db::mysql_url();
    for url in [url.clone(), url.replacen("mysql://", "mariadb://", 1)] {
        let Some(store) = common::connect("MYSQL_URL", &url, AnyStore::connect(&url)).await else {
            return;
        };
        assert!(matches!(store, AnyStore::MySql(_)), "{url}");
        assert_eq!(store.backend(), "mysql");
        let AnyStore::MySql(mysql) = &store else {
            unreachable!()
        };
        mysql.flavor().await.expect("the server answers");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls() {
    use tower_idempotency::store::{Claim, Store};

    let url = common::database_url("REDIS_URL", "redis://127.0.0.1:6379");
    let ns = common::unique_namespace("any-redis-urls");
    for url in [
        url.clone(),
        url.replacen("redis://", "REDIS://", 1),
        url.replacen("redis://", "valkey://", 1),
    ] {
        let Some(store) = common::connect("REDIS_URL", &url, AnyStore::connect(&url)).await else {
            return;
        };
        assert!(matches!(store, AnyStore::Redis(_)), "{url}");
        assert_eq!(store.backend(), "redis");
        store.migrate().await.expect("nothing to migrate");
        let store = store.with_table_name(TABLE).expect("a valid prefix");
        let claim = store.claim(&common::key_in(&ns, &url), common::LONG).await;
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{url}: {claim:?}");
    }
}

/// `redis+cluster://` connects to the cluster through the nodes it lists, even when the first
/// one listed is down; one store's claims are seen by another connected through other nodes.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_urls() {
    use tower_idempotency::store::{Claim, Store};

    let url = cluster_url();
    let Some(store) = common::connect("REDIS_CLUSTER_URLS", &url, AnyStore::connect(&url)).await
    else {
        return;
    };
    assert!(matches!(store, AnyStore::Redis(_)));
    assert_eq!(store.backend(), "redis");
    let store = store.with_table_name(TABLE).unwrap();
    // Port 1 on loopback refuses at once: the other nodes are enough.
    let other = url.replacen("redis+cluster://", "valkey+cluster://127.0.0.1:1,", 1);
    let other = AnyStore::connect(&other)
        .await
        .expect("the listed nodes that answer are enough")
        .with_table_name(TABLE)
        .unwrap();
    let ns = common::unique_namespace("any-redis-cluster");
    for i in 0..20 {
        // Keys on every master, as their slots fall.
        let key = common::key_in(&ns, &format!("evt_{i}"));
        let Claim::Acquired(lease) = store.claim(&key, common::LONG).await.unwrap() else {
            panic!("a new key");
        };
        store.commit(&lease).await.unwrap();
        let claim = other.claim(&key, common::LONG).await.unwrap();
        assert!(matches!(claim, Claim::Done(_)), "{claim:?}");
    }
}

/// Redis that cannot be reached, and a URL the client refuses: a connect error naming the
/// store, with the client's error as its source and no password anywhere. (A single server
/// that refuses takes a few seconds: the connection manager tries again before it gives up.)
#[cfg(feature = "redis")]
#[tokio::test]
async fn unreachable_redis_is_a_connect_error() {
    for url in [
        "redis://:hunter2@127.0.0.1:1",
        "redis+cluster://:hunter2@127.0.0.1:1,127.0.0.1:2",
        // Built without TLS.
        "rediss://:hunter2@127.0.0.1:6379",
        "redis+cluster://:hunter2@",
    ] {
        let started = std::time::Instant::now();
        let err = AnyStore::connect(url).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(30), "{url}");
        let ConnectError::Connect { backend, source } = &err else {
            panic!("{url}: {err:?}");
        };
        assert_eq!(*backend, "redis", "{url}");
        if url.contains("127.0.0.1") {
            assert!(source.is::<::redis::RedisError>(), "{url}: {source:?}");
        }
        let message = format!("{err} {err:?} {source} {source:?}");
        assert!(!message.contains("hunter2"), "{url}: {message}");
    }
}

/// A server that cannot be reached: the error comes at once (not after the pool's 30 s acquire
/// timeout), names the store, keeps the driver's own error (connection refused) as its source,
/// and shows the URL's password nowhere.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[tokio::test]
async fn unreachable_server_is_a_connect_error_at_once() {
    let mut urls = Vec::new();
    #[cfg(feature = "postgres")]
    urls.push(("postgres", "postgres://postgres:hunter2@127.0.0.1:1/test"));
    #[cfg(feature = "mysql")]
    urls.push(("mysql", "mariadb://root:hunter2@127.0.0.1:1/test"));
    for (backend, url) in urls {
        // Port 1 on loopback: refused at once.
        let started = std::time::Instant::now();
        let err = AnyStore::connect(url).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "{url}");
        let ConnectError::Connect {
            backend: named,
            source,
        } = &err
        else {
            panic!("{url}: {err:?}");
        };
        assert_eq!(*named, backend);
        let source = source.downcast_ref::<sqlx::Error>().expect("sqlx's error");
        assert!(matches!(source, sqlx::Error::Io(_)), "{url}: {source:?}");
        let message = err.to_string();
        assert!(message.contains(backend), "{message}");
        assert!(!format!("{message} {err:?}").contains("hunter2"));
    }
}

#[tokio::test]
async fn unknown_schemes_are_errors_that_name_them() {
    let err = AnyStore::connect("mongodb://:hunter2@127.0.0.1:27017")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectError::UnknownScheme { scheme } if scheme == "mongodb"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "unknown database URL scheme `mongodb:`: expected postgres://, postgresql://, mysql://, \
         mariadb://, sqlite:, memory:, redis:// or redis+cluster://"
    );

    let err = AnyStore::connect("webhooks.db").await.unwrap_err();
    assert!(
        matches!(&err, ConnectError::UnknownScheme { scheme } if scheme.is_empty()),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the database URL has no scheme: expected postgres://, postgresql://, mysql://, \
         mariadb://, sqlite:, memory:, redis:// or redis+cluster://"
    );
}

/// A scheme whose feature is off names the feature to enable. The loop checks the features
/// this build lacks: none with every feature on (the crate's unit tests check the same).
#[tokio::test]
async fn schemes_of_disabled_features_name_the_feature() {
    let urls = [
        (cfg!(feature = "memory"), "memory:", "memory"),
        (cfg!(feature = "sqlite"), "sqlite::memory:", "sqlite"),
        (cfg!(feature = "postgres"), "postgres://u@h/db", "postgres"),
        (cfg!(feature = "mysql"), "mysql://u@h/db", "mysql"),
        (cfg!(feature = "redis"), "redis://h:6379", "redis"),
        (
            cfg!(feature = "redis"),
            "redis+cluster://h:7001,h:7002",
            "redis",
        ),
    ];
    for (_, url, feature) in urls.into_iter().filter(|(on, ..)| !on) {
        let err = AnyStore::connect(url).await.unwrap_err();
        let scheme = url.split(':').next().unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "the database URL scheme `{scheme}:` needs the `{feature}` feature of \
                 tower-idempotency, which is not enabled"
            )
        );
    }
}
