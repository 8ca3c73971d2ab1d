//! Group commit, seen from the database: a burst of concurrent deliveries goes out in fewer
//! transactions than deliveries (PostgreSQL's `pg_stat_database.xact_commit`), or fewer WAL
//! frames (SQLite's `wal_checkpoint`), or fewer statements (MariaDB's `Com_insert` and
//! `Com_update`), than the same burst with batching off; a lone delivery
//! pays its own two writes and nothing more; and several instances with batching on still run
//! each event once.
//!
//! The databases come from `POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`;
//! the counting test makes a database of its own beside it, `tower_idempotency_group_commit`)
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`; its counts are the server's, so
//! nothing else should write to it meanwhile) and a temporary directory. If a server cannot be
//! reached its tests are skipped, or fail when `CI` is set.

#![cfg(all(feature = "postgres", feature = "sqlite", feature = "mysql"))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Row as _, SqlitePool};
use tokio::sync::Barrier;
use tower_idempotency::store::inbox::{Enqueued, InboxStore, StoredRequest};
use tower_idempotency::store::{Claim, KeyState, PostgresStore, SqliteStore, Store};
use tower_idempotency::{IdempotencyKey, Stale};

/// Deliveries of a burst.
const BURST: usize = 64;

/// `BURST` new events at once through `store`, each claimed, then committed: every claim is
/// acquired and every commit holds (see [`all_done`] for the rows).
async fn burst<St: Store + Clone + 'static>(store: &St, ns: &str) {
    let start = Arc::new(Barrier::new(BURST));
    let tasks: Vec<_> = (0..BURST)
        .map(|n| {
            let (store, start) = (store.clone(), start.clone());
            let key = IdempotencyKey::new(ns.to_owned(), format!("evt_{n}")).unwrap();
            tokio::spawn(async move {
                start.wait().await;
                let lease = match store.claim(&key, Stale::default()).await.unwrap() {
                    Claim::Acquired(lease) => lease,
                    other => panic!("{key}: a new key answered {other:?}"),
                };
                store.commit(&lease).await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// `BURST` new deliveries at once into the inbox of `store`: every one is stored.
async fn ingest<St: InboxStore + Clone + 'static>(store: &St, ns: &str) {
    let start = Arc::new(Barrier::new(BURST));
    let request = StoredRequest::new(http::Method::POST, "/hook", Vec::new(), "{}".into());
    let tasks: Vec<_> = (0..BURST)
        .map(|n| {
            let (store, start, request) = (store.clone(), start.clone(), request.clone());
            let key = IdempotencyKey::new(ns.to_owned(), format!("entry_{n}")).unwrap();
            tokio::spawn(async move {
                start.wait().await;
                let enqueued = store.enqueue(&key, &request).await.unwrap();
                assert!(matches!(enqueued, Enqueued::Stored), "{key}: {enqueued:?}");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// `n` events claimed, then committed at once, each with a receipt whose body (of `size`
/// bytes) names its own key: each duplicate is answered with its own event's receipt, so no
/// batch mixed them up, and no commit failed for the size of its batch.
async fn receipts_stay_with_their_keys<St: Store + Clone + 'static>(
    store: &St,
    ns: &str,
    n: usize,
    size: usize,
) {
    use tower_idempotency::store::{Receipt, StoredResponse};

    let body = |key: &IdempotencyKey| {
        let mut body = key.value().as_bytes().to_vec();
        body.resize(size, b'.');
        bytes::Bytes::from(body)
    };
    let mut leases = Vec::new();
    for i in 0..n {
        let key = IdempotencyKey::new(ns.to_owned(), format!("receipt_{i}")).unwrap();
        let Claim::Acquired(lease) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("{key}: a new key")
        };
        leases.push(lease);
    }
    let start = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = leases
        .into_iter()
        .map(|lease| {
            let (store, start) = (store.clone(), start.clone());
            let response = StoredResponse::new(http::StatusCode::OK, Vec::new(), body(lease.key()));
            let receipt = Receipt::new(None, Some(response));
            tokio::spawn(async move {
                start.wait().await;
                store.commit_with(&lease, &receipt).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("a commit with its receipt");
    }
    for i in 0..n {
        let key = IdempotencyKey::new(ns.to_owned(), format!("receipt_{i}")).unwrap();
        let Claim::Done(done) = store.claim(&key, Stale::default()).await.unwrap() else {
            panic!("{key}: done")
        };
        let receipt = done.receipt.expect("the receipt");
        let kept = &receipt.response.as_ref().expect("the response").body;
        assert_eq!(kept.len(), size, "{key}");
        assert!(
            kept.starts_with(key.value().as_bytes()),
            "{key}: another key's receipt"
        );
    }
}

/// Every event of [`burst`] is done.
async fn all_done<St: Store>(store: &St, ns: &str) {
    for n in 0..BURST {
        let key = IdempotencyKey::new(ns.to_owned(), format!("evt_{n}")).unwrap();
        let record = store.describe(&key).await.unwrap().unwrap();
        assert_eq!(record.state, KeyState::Done, "{key}");
    }
}

mod postgres {
    use super::*;

    const DATABASE: &str = "tower_idempotency_group_commit";

    /// A pool on the counting database, made if missing.
    async fn counted_pool(size: u32) -> Option<(PgPool, PgPool)> {
        let admin = common::db::postgres_pool().await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(DATABASE)
                .fetch_one(&admin)
                .await
                .unwrap();
        if !exists {
            // Another test binary may make it at the same moment.
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DATABASE}")))
                .execute(&admin)
                .await;
        }
        let url = common::db::postgres_url();
        let (server, _) = url.rsplit_once('/').expect("a database URL");
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .connect(&format!("{server}/{DATABASE}"))
            .await
            .expect("connect to the counting database");
        Some((admin, pool))
    }

    /// Transactions committed in the counting database, once every connection that ran some
    /// has ended (a server process publishes its counts as it exits): read from another
    /// database, so that the reads count none.
    async fn committed(admin: &PgPool) -> i64 {
        let read = || async {
            let mut conn = admin.acquire().await.unwrap();
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(&mut *conn)
                .await
                .unwrap();
            sqlx::query_scalar::<_, i64>(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
            )
            .bind(DATABASE)
            .fetch_one(&mut *conn)
            .await
            .unwrap()
        };
        let mut last = read().await;
        // Until the count holds still: the ended connections' counts have landed.
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = read().await;
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// A store on a table of its own in the counting database, migrated, with autovacuum off
    /// on it (its transactions would be counted), by a pool that is then closed.
    async fn prepared(table: &str) -> Option<PgPool> {
        let (admin, pool) = counted_pool(2).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {table}, {table}_versions, {table}_inbox"
        )))
        .execute(&pool)
        .await
        .unwrap();
        let store = PostgresStore::new(pool.clone())
            .with_table_name(table)
            .unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        Some(admin)
    }

    /// The transactions `run` made through a store with batches of at most `most`, on a pool of
    /// `connections` of its own.
    async fn transactions<F, Fut>(
        table: &str,
        ns: &str,
        (most, connections): (usize, u32),
        run: F,
    ) -> Option<i64>
    where
        F: FnOnce(PostgresStore) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let admin = prepared(table).await?;
        let before = committed(&admin).await;
        let (_, pool) = counted_pool(connections).await?;
        let store = PostgresStore::new(pool.clone())
            .with_table_name(table)
            .unwrap()
            .max_batch(most);
        run(store.clone()).await;
        pool.close().await;
        let counted = committed(&admin).await - before;
        if table.contains("burst") {
            let (_, pool) = counted_pool(2).await?;
            all_done(
                &PostgresStore::new(pool).with_table_name(table).unwrap(),
                ns,
            )
            .await;
        }
        Some(counted)
    }

    /// One test, so that nothing else runs in the counting database while it counts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_burst_shares_transactions_and_a_lone_delivery_pays_its_own_two() {
        let ns = common::unique_namespace("gc");
        let Some(alone) = transactions("gc_burst_alone", &ns, (1, 16), |store| {
            let ns = ns.clone();
            async move { burst(&store, &ns).await }
        })
        .await
        else {
            return;
        };
        assert!(
            alone >= 2 * BURST as i64,
            "with batching off each delivery commits its claim and its commit: {alone} transactions for {BURST}"
        );
        let batched = transactions("gc_burst_batched", &ns, (128, 16), |store| {
            let ns = ns.clone();
            async move { burst(&store, &ns).await }
        })
        .await
        .unwrap();
        println!("transactions for {BURST} deliveries: {alone} alone, {batched} batched");
        assert!(
            batched < BURST as i64,
            "{BURST} deliveries at once, claim and commit each, went out in {batched} transactions \
             (with batching off: {alone})"
        );
        let ingested = |table: &'static str, most| {
            let ns = ns.clone();
            async move {
                transactions(table, &ns.clone(), (most, 16), |store| {
                    let ns = ns.clone();
                    async move { ingest(&store, &ns).await }
                })
                .await
                .unwrap()
            }
        };
        let (ingest_alone, ingest_batched) = (
            ingested("gc_ingest_alone", 1).await,
            ingested("gc_ingest", 128).await,
        );
        println!("inbox: {BURST} deliveries, {ingest_alone} alone, {ingest_batched} batched");
        assert!(
            ingest_alone >= BURST as i64 && ingest_batched < BURST as i64 / 2,
            "{BURST} deliveries into the inbox at once: {ingest_batched} transactions \
             (with batching off: {ingest_alone})"
        );
        let lone = |table: &'static str, most| {
            let ns = ns.clone();
            async move {
                transactions(table, &ns.clone(), (most, 1), |store| {
                    let ns = ns.clone();
                    async move {
                        let key = IdempotencyKey::new(ns, "lone").unwrap();
                        let claim = store.claim(&key, Stale::default()).await.unwrap();
                        let Claim::Acquired(lease) = claim else {
                            panic!("a new key answered {claim:?}")
                        };
                        store.commit(&lease).await.unwrap();
                    }
                })
                .await
                .unwrap()
            }
        };
        // The fewest of three tries each: the server's own work (autovacuum of its
        // catalogs, say) can add a transaction to a window, never take one away.
        let (mut lone_alone, mut lone_batched) = (i64::MAX, i64::MAX);
        for _ in 0..3 {
            lone_alone = lone_alone.min(lone("gc_lone_alone", 1).await);
            lone_batched = lone_batched.min(lone("gc_lone", 128).await);
        }
        assert_eq!(
            lone_batched, lone_alone,
            "a lone delivery with batching on costs what it costs with batching off"
        );
        // After a new key the next claim inserts first: a duplicate then takes the insert
        // and the read, and the duplicate after it the read alone. Counted as what a second
        // key adds once every statement is prepared on the connection.
        let keys = |second: bool| {
            let ns = ns.clone();
            async move {
                transactions("gc_new_then_duplicates", &ns.clone(), (128, 1), |store| {
                    new_then_duplicates(store, ns, second)
                })
                .await
                .unwrap()
            }
        };
        let (mut first, mut both) = (i64::MAX, i64::MAX);
        for _ in 0..3 {
            first = first.min(keys(false).await);
            both = both.min(keys(true).await);
        }
        assert_eq!(
            both - first,
            5,
            "a new key's claim and commit, then its duplicate's insert and read, then the next \
             duplicate's read"
        );
    }

    /// A new key claimed and committed, then claimed again; with `second`, then another new
    /// key, claimed and committed, then claimed twice.
    async fn new_then_duplicates(store: PostgresStore, ns: String, second: bool) {
        // The duplicates' count, written in the background, is left out.
        let store = store.with_count_interval(Duration::from_secs(3600));
        let keys: &[(&str, usize)] = if second {
            &[("first", 1), ("second", 2)]
        } else {
            &[("first", 1)]
        };
        for &(key, duplicates) in keys {
            let key = IdempotencyKey::new(ns.clone(), key).unwrap();
            let claim = store.claim(&key, Stale::default()).await.unwrap();
            let Claim::Acquired(lease) = claim else {
                panic!("a new key answered {claim:?}")
            };
            store.commit(&lease).await.unwrap();
            for _ in 0..duplicates {
                let claim = store.claim(&key, Stale::default()).await.unwrap();
                assert!(
                    matches!(claim, Claim::Done(_)),
                    "a duplicate answered {claim:?}"
                );
            }
        }
    }

    /// Receipts of 300 KiB each, 32 committed at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn receipts_in_a_batch_stay_with_their_keys() {
        let Some(store) = common::db::postgres_store().await else {
            return;
        };
        let ns = common::unique_namespace("gc_receipts");
        receipts_stay_with_their_keys(&store, &ns, 32, 300 << 10).await;
    }

    /// Four instances (pools), batching on, 32 events delivered 8 times each at once: each
    /// event is acquired once, and ends done.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn instances_with_batches_run_each_event_once() {
        let mut stores = Vec::new();
        for _ in 0..4 {
            let Some(store) = common::db::postgres_store().await else {
                return;
            };
            stores.push(store);
        }
        let ns = common::unique_namespace("gc_instances");
        once_each(&stores, &ns).await;
    }
}

/// 32 events, 8 copies each, spread over `stores` and sent at once: each event is acquired by
/// exactly one copy (the others see it in flight or done), and every event ends done.
async fn once_each<St: Store + Clone + 'static>(stores: &[St], ns: &str) {
    const EVENTS: usize = 32;
    const COPIES: usize = 8;
    let start = Arc::new(Barrier::new(EVENTS * COPIES));
    let tasks: Vec<_> = (0..EVENTS * COPIES)
        .map(|n| {
            let store = stores[n % stores.len()].clone();
            let start = start.clone();
            let key = IdempotencyKey::new(ns.to_owned(), format!("evt_{}", n % EVENTS)).unwrap();
            tokio::spawn(async move {
                start.wait().await;
                match store.claim(&key, Stale::default()).await.unwrap() {
                    Claim::Acquired(lease) => {
                        store.commit(&lease).await.unwrap();
                        Some(n % EVENTS)
                    }
                    Claim::Done(_) | Claim::InFlight { .. } => None,
                    other => panic!("{key}: {other:?}"),
                }
            })
        })
        .collect();
    let mut acquired = vec![0; EVENTS];
    for task in tasks {
        if let Some(event) = task.await.unwrap() {
            acquired[event] += 1;
        }
    }
    assert_eq!(acquired, vec![1; EVENTS], "acquisitions per event");
    for event in 0..EVENTS {
        let key = IdempotencyKey::new(ns.to_owned(), format!("evt_{event}")).unwrap();
        let record = stores[0].describe(&key).await.unwrap().unwrap();
        assert_eq!(record.state, KeyState::Done, "{key}");
    }
}

mod sqlite {
    use super::*;

    /// A store opened on a new file, its WAL emptied after `migrate`.
    async fn opened(name: &str, most: usize) -> (SqliteStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(common::unique_namespace(name));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("gc.db"))
            .await
            .expect("open")
            .max_batch(most);
        truncate(store.pool()).await;
        (store, dir)
    }

    async fn truncate(pool: &SqlitePool) {
        let row = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(row.get::<i64, _>(0), 0, "the checkpoint was not blocked");
    }

    /// Frames written to the WAL since it was emptied.
    async fn frames(pool: &SqlitePool) -> i64 {
        let row = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(pool)
            .await
            .unwrap();
        row.get(1)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_burst_shares_transactions_and_a_lone_delivery_pays_its_own_two() {
        let ns = common::unique_namespace("gc");
        let (store, dir) = opened("gc_ingest_alone", 1).await;
        ingest(&store, &ns).await;
        let ingest_alone = frames(store.pool()).await;
        std::fs::remove_dir_all(dir).unwrap();
        let (store, dir) = opened("gc_ingest", 128).await;
        ingest(&store, &ns).await;
        let ingest_batched = frames(store.pool()).await;
        std::fs::remove_dir_all(dir).unwrap();
        assert!(
            ingest_alone >= BURST as i64 && ingest_batched < BURST as i64 / 2,
            "{BURST} deliveries into the inbox at once: {ingest_batched} WAL frames \
             (with batching off: {ingest_alone})"
        );

        let (alone, dir) = opened("gc_alone", 1).await;
        burst(&alone, &ns).await;
        let alone_frames = frames(alone.pool()).await;
        all_done(&alone, &ns).await;
        assert!(
            alone_frames >= 2 * BURST as i64,
            "with batching off each delivery commits its claim and its commit: {alone_frames} frames for {BURST}"
        );
        std::fs::remove_dir_all(dir).unwrap();

        let (batched, dir) = opened("gc_batched", 128).await;
        burst(&batched, &ns).await;
        let batched_frames = frames(batched.pool()).await;
        all_done(&batched, &ns).await;
        assert!(
            batched_frames < BURST as i64,
            "{BURST} deliveries at once, claim and commit each, wrote {batched_frames} WAL frames \
             (with batching off: {alone_frames})"
        );

        // A lone delivery on the same store: its two transactions, each as large as alone.
        truncate(batched.pool()).await;
        let key = IdempotencyKey::new(ns.clone(), "lone").unwrap();
        let Claim::Acquired(lease) = batched.claim(&key, Stale::default()).await.unwrap() else {
            panic!("a new key")
        };
        batched.commit(&lease).await.unwrap();
        let lone = frames(batched.pool()).await;
        let per_delivery = alone_frames as f64 / BURST as f64;
        assert!(
            (2..=per_delivery.ceil() as i64 + 1).contains(&lone),
            "a lone delivery wrote {lone} frames; alone each wrote {per_delivery:.1}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn receipts_in_a_batch_stay_with_their_keys() {
        let (store, dir) = opened("gc_receipts", 128).await;
        receipts_stay_with_their_keys(&store, "gc_receipts", 32, 300 << 10).await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Four stores on one file, batching on, 32 events delivered 8 times each at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn instances_with_batches_run_each_event_once() {
        let dir = std::env::temp_dir().join(common::unique_namespace("gc_instances"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut stores = Vec::new();
        for _ in 0..4 {
            let store = SqliteStore::open(dir.join("gc.db")).await.expect("open");
            stores.push(store);
        }
        once_each(&stores, "gc_instances").await;
        std::fs::remove_dir_all(dir).unwrap();
    }
}

mod mariadb {
    use sqlx::MySqlPool;
    use tower_idempotency::store::MySqlStore;

    use super::*;

    /// The server's count of `INSERT` and `UPDATE` statements: of all sessions (`GLOBAL`), or
    /// of the pool's one connection (`SESSION`).
    async fn writes(pool: &MySqlPool, scope: &str) -> i64 {
        let sql =
            format!("SHOW {scope} STATUS WHERE Variable_name IN ('Com_insert', 'Com_update')");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap();
        rows.iter()
            .map(|row| row.get::<String, _>(1).parse::<i64>().unwrap())
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_burst_shares_statements_and_a_lone_delivery_pays_its_own_two() {
        let Some(pool) = common::db::mysql_pool().await else {
            return;
        };
        let store = |most| {
            MySqlStore::new(pool.clone())
                .with_table_name("gc_mariadb")
                .unwrap()
                .max_batch(most)
        };
        store(1).migrate().await.unwrap();
        let counted = |most, ns: String| {
            let (store, pool) = (store(most), pool.clone());
            async move {
                store.flavor().await.unwrap();
                let before = writes(&pool, "GLOBAL").await;
                burst(&store, &ns).await;
                let wrote = writes(&pool, "GLOBAL").await - before;
                all_done(&store, &ns).await;
                wrote
            }
        };
        let alone = counted(1, common::unique_namespace("gc_alone")).await;
        assert!(
            alone >= 2 * BURST as i64,
            "with batching off each delivery sends its claim and its commit: {alone} for {BURST}"
        );
        let batched = counted(128, common::unique_namespace("gc_batched")).await;
        println!("writes for {BURST} deliveries: {alone} alone, {batched} batched");
        assert!(
            batched < BURST as i64,
            "{BURST} deliveries at once, claim and commit each, went out in {batched} statements \
             (with batching off: {alone})"
        );
        // The lone delivery on a pool of one connection, counted by that connection alone.
        let one = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&common::db::mysql_url())
            .await
            .unwrap();
        // The duplicates' count, written in the background, is left out.
        let store = MySqlStore::new(one.clone())
            .with_table_name("gc_mariadb")
            .unwrap()
            .max_batch(128)
            .with_count_interval(Duration::from_secs(3600));
        store.flavor().await.unwrap();
        let ns = common::unique_namespace("gc_lone");
        let before = writes(&one, "SESSION").await;
        let key = IdempotencyKey::new(ns, "lone").unwrap();
        let claim = store.claim(&key, Stale::default()).await.unwrap();
        let Claim::Acquired(lease) = claim else {
            panic!("a new key answered {claim:?}")
        };
        store.commit(&lease).await.unwrap();
        assert_eq!(
            writes(&one, "SESSION").await - before,
            2,
            "a lone delivery: its claim and its commit, as with batching off"
        );
        // After a new key the next claim inserts first: a duplicate then takes the insert
        // and the insert-or-read, and the duplicate after it the insert-or-read alone.
        let before = writes(&one, "SESSION").await;
        for _ in 0..2 {
            let claim = store.claim(&key, Stale::default()).await.unwrap();
            assert!(
                matches!(claim, Claim::Done(_)),
                "a duplicate answered {claim:?}"
            );
        }
        assert_eq!(
            writes(&one, "SESSION").await - before,
            3,
            "a duplicate after a new key: two statements; the next one: one"
        );
    }

    /// Receipts of 300 KiB each, 32 committed at once: more than the server takes in one
    /// packet by default, were they in one statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn receipts_in_a_batch_stay_with_their_keys() {
        let Some(store) = common::db::mysql_store().await else {
            return;
        };
        let ns = common::unique_namespace("gc_receipts");
        receipts_stay_with_their_keys(&store, &ns, 32, 300 << 10).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn instances_with_batches_run_each_event_once() {
        let mut stores = Vec::new();
        for _ in 0..4 {
            let Some(store) = common::db::mysql_store().await else {
                return;
            };
            stores.push(store);
        }
        let ns = common::unique_namespace("gc_instances");
        once_each(&stores, &ns).await;
    }
}
