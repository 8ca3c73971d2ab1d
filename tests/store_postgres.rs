//! Everything `PostgresStore` promises (the suites of `backend_suite!`), plus its own checks.
//!
//! The database comes from `POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! If it cannot be reached the tests are skipped, or fail when `CI` is set.

#![cfg(feature = "postgres")]

mod common;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tower_idempotency::store::{Claim, PostgresStore, Store};

fn url() -> String {
    common::db::postgres_url()
}

async fn pool() -> Option<PgPool> {
    common::db::postgres_pool().await
}

async fn store() -> Option<PostgresStore> {
    common::db::postgres_store().await
}

/// A store whose pool would connect on first use: the table-name checks need no database.
fn lazy_store() -> PostgresStore {
    PostgresStore::new(PgPoolOptions::new().connect_lazy(&url()).unwrap())
}

backend_suite! {
    claims: store(),
    trust: store(),
    races: store(),
    versions: store(),
    advance: PostgresStore = store(),
    transactional: PostgresStore = store(),
    sql: store(), tables: ["idempotency_custom_e2e", "public.idempotency_qualified_e2e"], quiet: impatient_store(),
    table_names: lazy_store(),
        rejects: ["", "bad-name", "1st", "x\"; DROP TABLE t; --", "a.b.c", &"t".repeat(50)],
        accepts: "app.claims",
}

/// A pool whose connections run every transaction SERIALIZABLE, as a role or database with
/// `default_transaction_isolation = 'serializable'` would: one app instance.
async fn serializable_pool() -> Option<PgPool> {
    let url = url();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET default_transaction_isolation = 'serializable'")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url);
    common::connect("POSTGRES_URL", &url, pool).await
}

async fn serializable_store() -> Option<PostgresStore> {
    let store = PostgresStore::new(serializable_pool().await?);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The claims hold when the connections' isolation is SERIALIZABLE.
mod serializable {
    use super::serializable_store;

    crate::backend_suite! {
        claims: serializable_store(),
    }
}

/// Concurrent claims of one key, from several pools whose isolation is SERIALIZABLE, make the
/// database fail some of them with SQLSTATE 40001. Each is tried once more: a claim answers an
/// error only when the second attempt failed so too, never after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serialization_failure_of_a_claim_is_tried_once_more() {
    let _shared = common::SHARED_TABLE.read().await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        let Some(store) = serializable_store().await else {
            return;
        };
        stores.push(store);
    }
    let isolation: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(stores[0].pool())
        .await
        .unwrap();
    assert_eq!(isolation, "serializable");
    let ns = common::unique_namespace("serializable");
    let (mut retried_twice, mut answered) = (0, 0);
    for event in 0..8 {
        let key = common::key_in(&ns, &format!("evt_{event}"));
        let claims: Vec<_> = (0..32)
            .map(|i| {
                let store = stores[i % stores.len()].clone();
                let key = key.clone();
                tokio::spawn(async move { store.claim(&key, common::LONG).await })
            })
            .collect();
        let mut acquired = 0;
        for claim in claims {
            match claim.await.unwrap() {
                Ok(Claim::Acquired(_)) => acquired += 1,
                Ok(Claim::InFlight(_)) => answered += 1,
                Ok(other) => panic!("unexpected {other:?}"),
                Err(err) => {
                    let source = std::error::Error::source(&err).expect("a backend error");
                    let first_attempt = source.downcast_ref::<sqlx::Error>().and_then(|e| {
                        e.as_database_error()
                            .and_then(|e| e.code())
                            .map(|c| c.into_owned())
                    });
                    assert_ne!(
                        first_attempt.as_deref(),
                        Some("40001"),
                        "a serialization failure surfaced without being tried again: {source}"
                    );
                    assert!(
                        source.to_string().contains("twice in a row"),
                        "only a claim that failed to serialize twice is an error: {source}"
                    );
                    retried_twice += 1;
                }
            }
        }
        assert_eq!(acquired, 1, "exactly one claim of {key} acquired");
    }
    assert!(answered > 0, "most claims are answered");
    // Not an assertion: how often a second attempt failed too, for the curious.
    eprintln!(
        "{retried_twice} of {} claims failed to serialize twice",
        8 * 32
    );
}

/// The same for the version guard's version claims, an upsert too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serialization_failure_of_a_version_claim_is_tried_once_more() {
    use tower_idempotency::version_guard::{VersionClaim, VersionStore};
    let mut stores = Vec::new();
    for _ in 0..4 {
        let Some(store) = serializable_store().await else {
            return;
        };
        stores.push(store);
    }
    let ns = common::unique_namespace("serializable-versions");
    for entity in 0..8 {
        let entity = common::key_in(&ns, &format!("sub_{entity}"));
        let claims: Vec<_> = (0..32)
            .map(|i| {
                let store = stores[i % stores.len()].clone();
                let entity = entity.clone();
                tokio::spawn(async move { store.begin_version(&entity, 7, common::LONG).await })
            })
            .collect();
        let mut acquired = 0;
        for claim in claims {
            match claim.await.unwrap() {
                Ok(VersionClaim::Acquired(_)) => acquired += 1,
                Ok(VersionClaim::InFlight(_)) => {}
                Ok(other) => panic!("unexpected {other:?}"),
                Err(err) => {
                    let source = std::error::Error::source(&err).expect("a backend error");
                    assert!(
                        source.to_string().contains("twice in a row"),
                        "only a version claim that failed to serialize twice is an error: {source}"
                    );
                }
            }
        }
        assert_eq!(acquired, 1, "exactly one claim of {entity} acquired");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_do_not_race() {
    let Some(pool) = pool().await else { return };
    let store = PostgresStore::new(pool)
        .with_table_name(&format!("idempotency_mig_{}", std::process::id()))
        .unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let sql = format!("DROP TABLE {}", store.table_name());
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(store.pool())
        .await
        .unwrap();
}

/// A table made by the first release (no runs, no heartbeat, no `released` state) with rows in
/// it, and renamed since, is upgraded in place by `migrate()`, rows kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release() {
    let Some(pool) = pool().await else { return };
    let table = format!("idempotency_up_{}", std::process::id());
    let ns = common::unique_namespace("upgrade");
    let old = format!(
        r#"DROP TABLE IF EXISTS {table}, {table}_before, {table}_versions;
CREATE TABLE {table}_before (
    namespace    TEXT        NOT NULL,
    "key"        TEXT        NOT NULL,
    state        TEXT        NOT NULL CHECK (state IN ('processing', 'done')),
    token        BIGINT      NOT NULL,
    deliveries   BIGINT      NOT NULL,
    claimed_at   TIMESTAMPTZ NOT NULL,
    completed_at TIMESTAMPTZ,
    PRIMARY KEY (namespace, "key")
);
CREATE INDEX {table}_claimed_idx ON {table}_before (state, claimed_at);
CREATE INDEX {table}_completed_idx ON {table}_before (state, completed_at);
-- Renamed since: its check keeps the name {table}_before_state_check.
ALTER TABLE {table}_before RENAME TO {table};
INSERT INTO {table} VALUES
    ('{ns}', 'done', 'done', 1, 3, now() - interval '1 hour', now() - interval '59 minutes'),
    ('{ns}', 'processing', 'processing', 2, 1, now() - interval '1 hour', NULL);"#
    );
    common::sql::run(&pool, old).await;
    let store = PostgresStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let indexes = indexes(&pool, &table).await;
    assert_eq!(
        indexes,
        // The primary key keeps the name it had before the table was renamed.
        [format!("{table}_before_pkey")],
        "the indexes every commit updated are gone"
    );
    assert_eq!(checks(&pool, &table).await, Vec::<String>::new());
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let drop = format!("DROP TABLE {table}, {table}_versions, {table}_inbox");
    common::sql::run(&pool, drop).await;
}

/// `migrate()` drops the indexes of earlier releases of its own table only: an index of the
/// same name on a table of another schema, which the name alone would find along the search
/// path, stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_drops_old_indexes_of_its_own_table_only() {
    let Some(pool) = pool().await else { return };
    let table = format!("idempotency_own_{}", std::process::id());
    let other = format!("{table}_other");
    let elsewhere = format!("{table}_elsewhere");
    let setup = format!(
        r#"DROP SCHEMA IF EXISTS {other} CASCADE;
CREATE SCHEMA {other};
CREATE TABLE {other}.{elsewhere} (claimed_at TIMESTAMPTZ, state TEXT);
CREATE INDEX {table}_stuck_idx ON {other}.{elsewhere} (claimed_at) WHERE state = 'processing';"#
    );
    common::sql::run(&pool, setup).await;
    // An app whose search path finds the other schema after the store's.
    let options: sqlx::postgres::PgConnectOptions = url().parse().unwrap();
    let searching = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([("search_path", format!("public,{other}"))]))
        .await
        .unwrap();
    let store = PostgresStore::new(searching.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(
        indexes(&pool, &elsewhere).await,
        [format!("{table}_stuck_idx")],
        "the other schema's index of the same name stays"
    );
    assert_eq!(indexes(&pool, &table).await, [format!("{table}_pkey")]);
    searching.close().await;
    let drop = format!(
        "DROP TABLE public.{table}, public.{table}_versions, public.{table}_inbox; \
         DROP SCHEMA {other} CASCADE"
    );
    common::sql::run(&pool, drop).await;
}

/// A table made by the release before receipts (every column but `receipt`) with rows in it
/// gets the column from `migrate()`, rows kept, and keeps receipts from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_receipt_column_to_a_table_of_the_previous_release() {
    let Some(pool) = pool().await else { return };
    let table = format!("idempotency_prev_{}", std::process::id());
    let ns = common::unique_namespace("upgrade-receipt");
    let old = format!(
        r#"DROP TABLE IF EXISTS {table}, {table}_versions, {table}_inbox;
CREATE TABLE {table} (
    namespace     TEXT        NOT NULL,
    "key"         TEXT        NOT NULL,
    state         TEXT        NOT NULL,
    token         BIGINT      NOT NULL,
    deliveries    BIGINT      NOT NULL,
    runs          BIGINT      NOT NULL DEFAULT 1,
    reclaimed     BOOLEAN     NOT NULL DEFAULT FALSE,
    first_seen_at TIMESTAMPTZ,
    last_seen_at  TIMESTAMPTZ,
    claimed_at    TIMESTAMPTZ NOT NULL,
    renewed_at    TIMESTAMPTZ,
    completed_at  TIMESTAMPTZ,
    PRIMARY KEY (namespace, "key"),
    CONSTRAINT {table}_state_check CHECK (state IN ('processing', 'done', 'released'))
);
CREATE INDEX {table}_stuck_idx ON {table} (claimed_at) WHERE state = 'processing';
-- An index of the user's own, under another name.
CREATE INDEX {table}_mine ON {table} (claimed_at) WHERE state = 'processing';
CREATE TABLE {table}_inbox (
    namespace   TEXT        NOT NULL,
    "key"       TEXT        NOT NULL,
    state       TEXT        NOT NULL CHECK (state IN ('queued', 'running', 'done', 'dead')),
    token       BIGINT,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    crashes     INTEGER     NOT NULL DEFAULT 0,
    received_at TIMESTAMPTZ NOT NULL,
    due_at      TIMESTAMPTZ NOT NULL,
    renewed_at  TIMESTAMPTZ NOT NULL,
    settled_at  TIMESTAMPTZ,
    request     BYTEA,
    history     BYTEA,
    PRIMARY KEY (namespace, "key")
);
INSERT INTO {table} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at, completed_at) VALUES
    ('{ns}', 'done', 'done', 1, 3, 1, FALSE, now() - interval '1 hour',
        now() - interval '1 hour', now() - interval '1 hour', NULL, now() - interval '59 minutes'),
    ('{ns}', 'processing', 'processing', 2, 1, 1, FALSE, now() - interval '1 hour',
        now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', NULL);"#
    );
    common::sql::run(&pool, old).await;
    let store = PostgresStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let receipt: String = sqlx::query_scalar(
        "SELECT data_type::text FROM information_schema.columns \
         WHERE table_name = $1 AND column_name = 'receipt'",
    )
    .bind(&table)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(receipt, "bytea");
    let indexes = indexes(&pool, &table).await;
    assert_eq!(
        indexes,
        [format!("{table}_mine"), format!("{table}_pkey")],
        "the index of processing rows, which every commit updated, is gone; the user's stays"
    );
    for table in [table.clone(), format!("{table}_inbox")] {
        assert_eq!(
            checks(&pool, &table).await,
            Vec::<String>::new(),
            "the check on the state of {table}, which every write prepared anew, is gone"
        );
    }
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    common::receipts::receipts_work_after_the_upgrade(store, &ns).await;
    let drop = format!("DROP TABLE {table}, {table}_versions, {table}_inbox");
    common::sql::run(&pool, drop).await;
}

/// The names of `table`'s indexes, in order.
async fn indexes(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY indexname",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The check constraints on `table`.
async fn checks(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = to_regclass($1) AND contype = 'c' ORDER BY conname",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A store whose lock waits give up after 300 ms, its duplicate counts written only when
/// asked: one app instance.
async fn impatient_store() -> Option<PostgresStore> {
    let url = url();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET lock_timeout = '300ms'")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url);
    let pool = common::connect("POSTGRES_URL", &url, pool).await?;
    let store = PostgresStore::new(pool).with_count_interval(common::hot_path::NEVER);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// Duplicates of a done key are answered while another transaction holds its row locked:
/// they write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_writes_nothing() {
    let _shared = common::SHARED_TABLE.read().await;
    let (Some(store), Some(locker)) = (impatient_store().await, pool().await) else {
        return;
    };
    common::hot_path::a_duplicate_writes_nothing(store, |done, released| async move {
        let mut tx = locker.begin().await.unwrap();
        let locked = sqlx::query(
            r#"SELECT 1 FROM idempotency_keys
            WHERE (namespace, "key") IN (($1, $2), ($3, $4)) FOR UPDATE"#,
        )
        .bind(done.namespace())
        .bind(done.value())
        .bind(released.namespace())
        .bind(released.value())
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(locked.len(), 2);
        tx
    })
    .await;
}

/// A purge of more rows than one batch holds deletes them all, and only them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_the_table_in_batches() {
    let _alone = common::SHARED_TABLE.write().await;
    let Some(store) = store().await else { return };
    let pool = store.pool().clone();
    common::hot_path::purge_walks_the_table_in_batches(store, |ns, count| async move {
        sqlx::query(
            r#"INSERT INTO idempotency_keys
            (namespace, "key", state, token, deliveries, claimed_at, completed_at)
            SELECT $1, 'old-' || i, 'done', i, 1,
                now() - interval '2 days', now() - interval '2 days'
            FROM generate_series(0, $2 - 1) AS i"#,
        )
        .bind(&ns)
        .bind(i64::try_from(count).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    })
    .await;
}

/// A migrated store on the table `table`, on a pool of its own.
async fn store_on(table: &str) -> Option<PostgresStore> {
    let store = PostgresStore::new(pool().await?)
        .with_table_name(table)
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The inbox contract, on an inbox only these tests use (a worker's take reaches every
/// namespace of its inbox); each store is an instance of its own, on a pool of its own.
mod inbox_suite {
    use super::store_on;

    tower_idempotency::conformance_suite! {
        inbox: store_on("inbox_conformance"),
        inbox_races: store_on("inbox_conformance"),
    }
}

fn stored_request(n: usize) -> tower_idempotency::store::inbox::StoredRequest {
    tower_idempotency::store::inbox::StoredRequest::new(
        http::Method::POST,
        format!("/hooks?n={n}"),
        Vec::new(),
        bytes::Bytes::from(format!("{{\"n\":{n}}}")),
    )
}

/// Drops `table` and the tables `migrate()` derives from it.
async fn drop_tables(pool: &PgPool, table: &str) {
    let drop = format!("DROP TABLE IF EXISTS {table}, {table}_versions, {table}_inbox");
    common::sql::run(pool, drop).await;
}

/// A database of the previous release (the claims and versions tables, no inbox) gets the
/// inbox table and its indexes from `migrate()`, their names whole for a table name of the
/// longest length; the claims' rows are kept, and a second `migrate()` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_inbox_table_to_a_database_of_the_previous_release() {
    use tower_idempotency::store::inbox::{Enqueued, InboxStore};

    let Some(pool) = pool().await else { return };
    let mut table = format!("inbox_prev_{}_", std::process::id());
    while table.len() < 49 {
        table.push('x');
    }
    let ns = common::unique_namespace("upgrade-inbox");
    drop_tables(&pool, &table).await;
    let store = PostgresStore::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let previous = format!(
        r#"DROP TABLE {table}_inbox;
INSERT INTO {table} (namespace, "key", state, token, deliveries, runs, reclaimed,
    first_seen_at, last_seen_at, claimed_at, renewed_at, completed_at) VALUES
    ('{ns}', 'done', 'done', 1, 3, 1, FALSE, now() - interval '1 hour',
        now() - interval '1 hour', now() - interval '1 hour', NULL, now() - interval '59 minutes'),
    ('{ns}', 'processing', 'processing', 2, 1, 1, FALSE, now() - interval '1 hour',
        now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', NULL);"#
    );
    common::sql::run(&pool, previous).await;
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let indexes = indexes(&pool, &format!("{table}_inbox")).await;
    assert_eq!(
        indexes,
        [
            format!("{table}_inbox_due_idx"),
            format!("{table}_inbox_pkey"),
            format!("{table}_inbox_run_idx"),
        ]
    );
    common::upgraded_table_keeps_its_rows(store.clone(), &ns).await;
    let key = common::key_in(&ns, "evt_1");
    assert_eq!(
        store.enqueue(&key, &stored_request(1)).await.unwrap(),
        Enqueued::Stored
    );
    assert_eq!(
        store.stored_request(&key).await.unwrap(),
        Some(stored_request(1))
    );
    drop_tables(&pool, &table).await;
}

/// An enqueue of a new key notifies the inbox's channel once, and a duplicate not at all;
/// an operator's retry notifies it too. (Notifications arrive in the order their
/// transactions committed: the markers sent after each step tell what the step sent. The
/// new entry's own, and a retry's, come from a task of the store's, so they are awaited before
/// the next marker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_entry_notifies_the_channel_and_a_duplicate_does_not() {
    use tower_idempotency::store::inbox::{Enqueued, EntryState, InboxStore, Running};

    let table = format!("inbox_notify_{}", std::process::id());
    let Some(store) = store_on(&table).await else {
        return;
    };
    let channel = format!("{table}_inbox");
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen(&channel).await.unwrap();
    let marker = |text: &'static str| {
        let (pool, channel) = (store.pool().clone(), channel.clone());
        async move {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel)
                .bind(text)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let ns = common::unique_namespace("inbox-notify");
    let key = common::key_in(&ns, "evt_1");
    assert_eq!(
        store.enqueue(&key, &stored_request(1)).await.unwrap(),
        Enqueued::Stored
    );
    // The new entry's notification is sent after the insert's commit, apart from it (see the
    // herald): heard before the next step, so that no marker can overtake it.
    let mut heard = Vec::new();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("the new entry's notification")
        .unwrap();
    assert_eq!(first.channel(), channel);
    heard.push(first.payload().to_owned());
    assert_eq!(
        store.enqueue(&key, &stored_request(2)).await.unwrap(),
        Enqueued::Duplicate(EntryState::Queued)
    );
    marker("after the duplicate").await;
    assert!(
        !store
            .retry_now(&common::key_in(&ns, "evt_unknown"), Running::Leave)
            .await
            .unwrap()
    );
    assert!(store.retry_now(&key, Running::Leave).await.unwrap());
    // The retry's notification, sent by the store's task as a new entry's is, is heard before
    // the last marker is sent.
    while heard.len() < 3 {
        let notification =
            tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
                .await
                .expect("the marker and the retry's notification")
                .unwrap();
        assert_eq!(notification.channel(), channel);
        heard.push(notification.payload().to_owned());
    }
    marker("after the retries").await;
    while heard.last().map(String::as_str) != Some("after the retries") {
        let notification = listener.recv().await.unwrap();
        assert_eq!(notification.channel(), channel);
        heard.push(notification.payload().to_owned());
    }
    assert_eq!(heard, ["", "after the duplicate", "", "after the retries"]);
    drop(listener);
    drop_tables(store.pool(), &table).await;
}

/// Enqueues new entries through `store` until `wake` is woken: one notification heard by the
/// watcher suffices. Each attempt waits a moment; 30 s without a wake fails the test.
async fn enqueue_until_woken(
    wake: &tower_idempotency::store::inbox::Wake,
    store: &PostgresStore,
    ns: &str,
    n: &mut usize,
) {
    use std::time::Duration;
    use tower_idempotency::store::inbox::{Enqueued, InboxStore};

    let woken = wake.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    let enqueues = async {
        loop {
            *n += 1;
            let key = common::key_in(ns, &format!("evt_{n}"));
            let stored = store.enqueue(&key, &stored_request(*n)).await.unwrap();
            assert_eq!(stored, Enqueued::Stored);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        () = &mut woken => {}
        () = enqueues => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => panic!("the watcher was never woken"),
    }
}

/// A watcher on one instance is woken by entries another instance enqueues, and keeps
/// listening after its connection is cut. It wakes its workers once more each time it starts
/// listening (a lost notification is looked for so): two wakes in a row take at least one
/// notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_is_woken_by_another_instances_enqueue_and_outlives_its_connection() {
    use std::str::FromStr as _;
    use tower_idempotency::store::inbox::InboxStore;

    let table = format!("inbox_watch_{}", std::process::id());
    let Some(other) = store_on(&table).await else {
        return;
    };
    let name = common::unique_namespace("watcher");
    let options = sqlx::postgres::PgConnectOptions::from_str(&url())
        .unwrap()
        .application_name(&name);
    let watcher_pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let watcher = PostgresStore::new(watcher_pool)
        .with_table_name(&table)
        .unwrap();
    let wake = tower_idempotency::store::inbox::Wake::default();
    let watch = tokio::spawn({
        let wake = wake.clone();
        async move { watcher.watch(wake).await }
    });
    let ns = common::unique_namespace("inbox-watch");
    let mut n = 0;
    for _ in 0..2 {
        enqueue_until_woken(&wake, &other, &ns, &mut n).await;
    }
    let (listening, cut): (i64, i64) = sqlx::query_as(
        "WITH cut AS (SELECT query, pg_terminate_backend(pid) AS done FROM pg_stat_activity \
         WHERE application_name = $1) \
         SELECT count(*) FILTER (WHERE query LIKE 'LISTEN%'), count(*) FILTER (WHERE done) \
         FROM cut",
    )
    .bind(&name)
    .fetch_one(other.pool())
    .await
    .unwrap();
    assert_eq!(listening, 1, "the watcher's connection listens");
    assert!(cut >= 1);
    for _ in 0..2 {
        enqueue_until_woken(&wake, &other, &ns, &mut n).await;
    }
    watch.abort();
    drop_tables(other.pool(), &table).await;
}

/// A damaged entry (bytes no release wrote) is an error, never a panic: reading its request
/// or its history fails. A take that leased it settles it dead and hands over the entries
/// it leased with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_entry_is_an_error() {
    use tower_idempotency::store::inbox::{InboxStore, Take};

    let table = format!("inbox_damaged_{}", std::process::id());
    let Some(store) = store_on(&table).await else {
        return;
    };
    let ns = common::unique_namespace("inbox-damaged");
    let (good, damaged) = (common::key_in(&ns, "good"), common::key_in(&ns, "damaged"));
    store.enqueue(&good, &stored_request(1)).await.unwrap();
    let insert = format!(
        r#"INSERT INTO {table}_inbox (namespace, "key", state, received_at, due_at, renewed_at,
    request) VALUES ($1, $2, 'queued', now(), now() - interval '1 hour', now(), 'junk'::bytea)"#
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(damaged.namespace())
        .bind(damaged.value())
        .execute(store.pool())
        .await
        .unwrap();
    assert!(store.stored_request(&damaged).await.is_err());
    let taken = store.take(&Take::default()).await.unwrap();
    let keys: Vec<_> = taken.iter().map(|entry| entry.lease.key()).collect();
    assert_eq!(keys, [&good]);
    common::inbox::assert_unreadable_and_dead(&store.entry(&damaged).await.unwrap().unwrap());
    assert!(store.take(&Take::default()).await.unwrap().is_empty());
    let history = format!(r#"UPDATE {table}_inbox SET history = 'junk'::bytea WHERE "key" = $1"#);
    sqlx::query(sqlx::AssertSqlSafe(history))
        .bind(damaged.value())
        .execute(store.pool())
        .await
        .unwrap();
    assert!(store.entry(&damaged).await.is_err());
    assert!(store.entries(Some(&ns), &[], 10).await.is_err());
    drop_tables(store.pool(), &table).await;
}
