//! [`AnyStore::connect`]: the URL's scheme picks the store, and the store is connected before
//! it is answered.

use std::error::Error as StdError;

use super::AnyStore;
#[cfg(feature = "memory")]
use crate::store::MemoryStore;
#[cfg(feature = "mysql")]
use crate::store::MySqlStore;
#[cfg(feature = "postgres")]
use crate::store::PostgresStore;
#[cfg(feature = "redis")]
use crate::store::RedisStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
#[cfg(feature = "redis")]
use crate::store::StoreError;

impl AnyStore {
    /// Connects the store that `url`'s scheme names (see the [module docs](crate::store::any#urls)).
    ///
    /// Connects before it answers, so a database that cannot be reached (or refuses the
    /// login) fails here, at start-up, with the driver's error as the source. It does not
    /// create tables: call [`migrate`](Self::migrate) next.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let (scheme, backend) = parse(url)?;
        match backend {
            #[cfg(feature = "memory")]
            Backend::Memory => Ok(Self::Memory(MemoryStore::new())),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => connect_sqlite(&driver_url(url, scheme, "sqlite"))
                .await
                .map(Self::Sqlite)
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "postgres")]
            Backend::Postgres => server_pool(&driver_url(url, scheme, "postgres"))
                .await
                .map(|pool| Self::Postgres(PostgresStore::new(pool)))
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "mysql")]
            Backend::MySql => server_pool(&driver_url(url, scheme, "mysql"))
                .await
                .map(|pool| Self::MySql(MySqlStore::new(pool)))
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let url = driver_url(url, scheme, &scheme.to_ascii_lowercase());
                RedisStore::connect(&url)
                    .await
                    .map(Self::Redis)
                    .map_err(|error| backend.failed(driver_error(error)))
            }
            #[cfg(feature = "redis")]
            Backend::RedisCluster => {
                let nodes = cluster_nodes(url).map_err(|source| backend.failed(source))?;
                RedisStore::connect_cluster(nodes)
                    .await
                    .map(Self::Redis)
                    .map_err(|error| backend.failed(driver_error(error)))
            }
            #[allow(unreachable_patterns)] // with every feature on
            _ => Err(ConnectError::FeatureDisabled {
                scheme: scheme.to_owned(),
                feature: backend.feature(),
            }),
        }
    }
}

/// Why [`AnyStore::connect`] returned no store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL has no scheme this crate knows (`scheme` is empty when it has none at all).
    #[error("{}", unknown_scheme(scheme))]
    UnknownScheme {
        /// The scheme, as written in the URL.
        scheme: String,
    },
    /// The scheme names a store whose feature this build of the crate does not have.
    #[error(
        "the database URL scheme `{scheme}:` needs the `{feature}` feature of tower-idempotency, which is not enabled"
    )]
    FeatureDisabled {
        /// The scheme, as written in the URL.
        scheme: String,
        /// The feature to enable.
        feature: &'static str,
    },
    /// The store's database could not be reached, or its driver rejected the URL.
    #[error("the {backend} store could not connect to its database")]
    Connect {
        /// The store, named as its feature (see [`AnyStore::backend`]).
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// The schemes [`AnyStore::connect`] knows, for error messages.
const SCHEMES: &str = "postgres://, postgresql://, mysql://, mariadb://, sqlite:, memory:, \
     redis:// or redis+cluster://";

fn unknown_scheme(scheme: &str) -> String {
    if scheme.is_empty() {
        format!("the database URL has no scheme: expected {SCHEMES}")
    } else {
        format!("unknown database URL scheme `{scheme}:`: expected {SCHEMES}")
    }
}

/// The backends a URL can name, whether or not their feature is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    Memory,
    Sqlite,
    Postgres,
    MySql,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

impl Backend {
    /// The feature that builds this backend, which is also its name.
    pub(super) fn feature(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Redis | Self::RedisCluster => "redis",
        }
    }

    #[cfg(feature = "_durable")]
    fn failed(self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> ConnectError {
        ConnectError::Connect {
            backend: self.feature(),
            source: source.into(),
        }
    }
}

/// The scheme of `url` as written, and the backend it names.
fn parse(url: &str) -> Result<(&str, Backend), ConnectError> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(ConnectError::UnknownScheme {
            scheme: String::new(),
        });
    }
    let backend = match scheme.to_ascii_lowercase().as_str() {
        "memory" => Backend::Memory,
        "sqlite" => Backend::Sqlite,
        "postgres" | "postgresql" => Backend::Postgres,
        "mysql" | "mariadb" => Backend::MySql,
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" => Backend::Redis,
        "redis+cluster" | "valkey+cluster" => Backend::RedisCluster,
        _ => {
            return Err(ConnectError::UnknownScheme {
                scheme: scheme.to_owned(),
            });
        }
    };
    Ok((scheme, backend))
}

/// `url` with its scheme replaced by `driver`'s: sqlx's MySQL driver wants `mysql://`, its
/// SQLite driver a lowercase `sqlite:`, and redis-rs a lowercase scheme.
#[cfg(feature = "_durable")]
fn driver_url(url: &str, scheme: &str, driver: &str) -> String {
    format!("{driver}{}", &url[scheme.len()..])
}

/// A pool of sqlx's default settings (up to 10 connections) on the server at `url`, after one
/// connection of its own: a server that refuses the connection or the login fails at once with
/// its cause, where the pool would try again until its acquire timeout (30 s) and then report
/// only the timeout.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn server_pool<DB: sqlx::Database>(url: &str) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    use sqlx::{ConnectOptions as _, Connection as _};

    let options: <DB::Connection as sqlx::Connection>::Options = url.parse()?;
    options.connect().await?.close().await?;
    Ok(sqlx::pool::PoolOptions::new().connect_lazy_with(options))
}

/// The node URLs of a `redis+cluster://[user:password@]host:port,host:port[?query]` URL: each
/// `redis://[user:password@]host:port[?query]`. An error names what is wrong, never the URL.
#[cfg(feature = "redis")]
fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let (_, rest) = url
        .split_once("://")
        .ok_or("a Redis Cluster URL is redis+cluster://host:port,host:port")?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    // A trailing `/` (or `/0`, the only database a cluster has) is allowed.
    let hosts = match hosts.split_once('/') {
        Some((hosts, "" | "0")) => hosts,
        Some(_) => return Err("a Redis Cluster has no database but 0".to_owned()),
        None => hosts,
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{userinfo}{host}{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(
            "the Redis Cluster URL names no node: redis+cluster://host:port,host:port".to_owned(),
        );
    }
    Ok(nodes)
}

/// The client's own error out of the store's, as the source of a [`ConnectError`].
#[cfg(feature = "redis")]
fn driver_error(error: StoreError) -> Box<dyn StdError + Send + Sync> {
    match error {
        StoreError::Backend(source) => source,
        other => Box::new(other),
    }
}

/// Opens a SQLite database as the [SQLite store's docs](super::sqlite#connecting) advise: a
/// file as `SqliteStore::open` opens it (created if missing, WAL, `synchronous = FULL`, a busy
/// timeout of 30 s, a small pool), but for the migration; an in-memory database on one
/// connection that the pool never closes (the database lives as long as its connections).
#[cfg(feature = "sqlite")]
async fn connect_sqlite(url: &str) -> Result<SqliteStore, sqlx::Error> {
    use std::str::FromStr as _;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    let options = SqliteConnectOptions::from_str(url)?;
    if !sqlite_in_memory(url) {
        // As `SqliteStore::open` makes it: its writes take turns with every other store of
        // the process on the file.
        return SqliteStore::open_file(crate::store::sqlite::tuned(options)).await;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    Ok(SqliteStore::new(pool))
}

/// Whether sqlx opens the SQLite URL `url` as an in-memory database: `sqlite::memory:`,
/// `sqlite://:memory:`, or `mode=memory`.
#[cfg(feature = "sqlite")]
fn sqlite_in_memory(url: &str) -> bool {
    // As sqlx reads the URL (`SqliteConnectOptions::from_str`).
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|param| param == "mode=memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_backends() {
        for (url, scheme, backend) in [
            ("memory:", "memory", Backend::Memory),
            ("sqlite::memory:", "sqlite", Backend::Sqlite),
            ("sqlite://webhooks.db", "sqlite", Backend::Sqlite),
            ("SQLite:webhooks.db", "SQLite", Backend::Sqlite),
            ("postgres://u@h/db", "postgres", Backend::Postgres),
            ("postgresql://u@h/db", "postgresql", Backend::Postgres),
            ("mysql://root@h/db", "mysql", Backend::MySql),
            ("MariaDB://root@h/db", "MariaDB", Backend::MySql),
            ("redis://127.0.0.1:6379/0", "redis", Backend::Redis),
            ("Valkey://h", "Valkey", Backend::Redis),
            ("rediss://h", "rediss", Backend::Redis),
            ("redis+unix:///run/redis.sock", "redis+unix", Backend::Redis),
            (
                "redis+cluster://h:7001,h:7002",
                "redis+cluster",
                Backend::RedisCluster,
            ),
            (
                "valkey+cluster://h:7001",
                "valkey+cluster",
                Backend::RedisCluster,
            ),
        ] {
            assert_eq!(parse(url).unwrap(), (scheme, backend), "{url}");
        }
    }

    #[test]
    fn unknown_schemes_are_named_and_urls_are_not() {
        let err = parse("mongodb://:hunter2@h").unwrap_err();
        assert!(matches!(&err, ConnectError::UnknownScheme { scheme } if scheme == "mongodb"));
        let message = err.to_string();
        assert!(message.contains("`mongodb:`"), "{message}");
        assert!(message.contains("postgres://"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");

        for url in [
            "",
            "webhooks.db",
            "/var/lib/x.db",
            "1x://h",
            "c:\\x",
            "hunter2@h",
        ] {
            let err = parse(url).unwrap_err();
            if url == "c:\\x" {
                // A drive letter is a scheme as far as URLs go.
                assert!(matches!(&err, ConnectError::UnknownScheme { scheme } if scheme == "c"));
                continue;
            }
            assert!(
                matches!(&err, ConnectError::UnknownScheme { scheme } if scheme.is_empty()),
                "{url}: {err:?}"
            );
            assert!(err.to_string().contains("no scheme"), "{err}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn in_memory_sqlite_urls() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite:x.db?cache=shared&mode=memory",
        ] {
            assert!(sqlite_in_memory(url), "{url}");
        }
        for url in [
            "sqlite:x.db",
            "sqlite://x.db?mode=rwc",
            "sqlite://memory.db",
        ] {
            assert!(!sqlite_in_memory(url), "{url}");
        }
    }

    #[cfg(feature = "_sql")]
    #[test]
    fn driver_urls() {
        assert_eq!(
            driver_url("MariaDB://root@h:3306/db", "MariaDB", "mysql"),
            "mysql://root@h:3306/db"
        );
        assert_eq!(driver_url("SQLITE:x.db", "SQLITE", "sqlite"), "sqlite:x.db");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn cluster_urls_name_each_node() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7001,10.0.0.2:7002").unwrap(),
            ["redis://10.0.0.1:7001", "redis://10.0.0.2:7002"]
        );
        assert_eq!(
            cluster_nodes("Redis+Cluster://app:p%40ss@h1:7001, h2:7002/?protocol=resp3").unwrap(),
            [
                "redis://app:p%40ss@h1:7001?protocol=resp3",
                "redis://app:p%40ss@h2:7002?protocol=resp3"
            ]
        );
        assert_eq!(
            cluster_nodes("valkey+cluster://h:7001/0").unwrap(),
            ["redis://h:7001"]
        );
        for url in [
            "redis+cluster://",
            "redis+cluster://:hunter2@",
            "redis+cluster://,",
            "redis+cluster://:hunter2@h:7001/3",
        ] {
            let err = cluster_nodes(url).unwrap_err();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    /// Each backend whose feature is off: a clear error naming the scheme and the feature.
    #[tokio::test]
    async fn disabled_features_are_named() {
        let urls = [
            (cfg!(feature = "memory"), "memory:", "memory"),
            (cfg!(feature = "sqlite"), "sqlite::memory:", "sqlite"),
            (
                cfg!(feature = "postgres"),
                "postgresql://u@h/db",
                "postgres",
            ),
            (cfg!(feature = "mysql"), "mariadb://u@h/db", "mysql"),
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
            assert!(
                matches!(&err, ConnectError::FeatureDisabled { scheme: s, feature: f }
                    if s == scheme && *f == feature),
                "{url}: {err:?}"
            );
            let message = err.to_string();
            assert!(message.contains(&format!("`{scheme}:`")), "{message}");
            assert!(
                message.contains(&format!("`{feature}` feature")),
                "{message}"
            );
        }
    }
}
