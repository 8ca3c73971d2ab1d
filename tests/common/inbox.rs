//! What the inbox's test binaries share: stores on tables of their own, and emptying them.

use std::time::Duration;

use tower_idempotency::Stale;
use tower_idempotency::store::inbox::{EntryState, InboxStore, Running, Settlement, Take};

/// Empties an inbox of what an earlier run left, running entries included. Only for an inbox
/// no worker uses: it takes every entry over.
pub async fn emptied<St: InboxStore>(store: &St) {
    let everything = Take {
        stale: Stale::reclaim_after(Duration::ZERO),
        max_attempts: u32::MAX,
        ..Take::up_to(1000)
    };
    loop {
        let taken = store.take(&everything).await.unwrap();
        if taken.is_empty() {
            break;
        }
        for entry in taken {
            store
                .settle(&entry.lease, &Settlement::Done, &[])
                .await
                .unwrap();
        }
    }
    for entry in store
        .entries(None, &[EntryState::Dead], 100_000)
        .await
        .unwrap()
    {
        let _ = store.discard(&entry.key, Running::Force).await;
    }
    store
        .purge_inbox(Duration::ZERO, Duration::ZERO, 1_000_000)
        .await
        .unwrap();
}

/// A migrated `PostgresStore` on a new pool, its claims and inbox in `table`.
#[cfg(feature = "postgres")]
pub async fn postgres(table: &str) -> Option<tower_idempotency::store::PostgresStore> {
    let pool = super::db::postgres_pool().await?;
    let store = tower_idempotency::store::PostgresStore::new(pool)
        .with_table_name(table)
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A migrated `MySqlStore` on a new pool, its claims and inbox in `table`.
#[cfg(feature = "mysql")]
pub async fn mysql(table: &str) -> Option<tower_idempotency::store::MySqlStore> {
    let pool = super::db::mysql_pool().await?;
    let store = tower_idempotency::store::MySqlStore::new(pool)
        .with_table_name(table)
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A migrated `SqliteStore` on a new pool on the file `path`, its claims and inbox in `table`.
#[cfg(feature = "sqlite")]
pub async fn sqlite(path: &std::path::Path, table: &str) -> tower_idempotency::store::SqliteStore {
    let pool = super::db::sqlite_file_pool(path).await;
    let store = tower_idempotency::store::SqliteStore::new(pool)
        .with_table_name(table)
        .unwrap();
    store.migrate().await.expect("migrate");
    store
}

/// One entry through `store`'s inbox, the way a worker takes it: stored under `key`, taken
/// whole, settled done. What a test checks after `migrate()` made the inbox.
pub async fn an_entry_runs<St: InboxStore>(store: &St, key: &tower_idempotency::IdempotencyKey) {
    use tower_idempotency::store::inbox::{Enqueued, StoredRequest};

    let request = StoredRequest::new(
        http::Method::POST,
        "/hooks",
        Vec::new(),
        bytes::Bytes::from_static(b"{}"),
    );
    assert_eq!(
        store.enqueue(key, &request).await.unwrap(),
        Enqueued::Stored
    );
    let taken = store.take(&Take::default()).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].request, request);
    let started = store.start(&[taken[0].lease.clone()]).await.unwrap();
    assert_eq!(started, [true]);
    store
        .settle(&taken[0].lease, &Settlement::Done, &[])
        .await
        .unwrap();
    let entry = store.entry(key).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.attempts), (EntryState::Done, 1));
}

/// Asserts that a take settled `entry`, whose stored request could not be read, dead after
/// its one attempt, with an attempt that says why.
pub fn assert_unreadable_and_dead(entry: &tower_idempotency::store::inbox::Entry) {
    use tower_idempotency::store::inbox::AttemptResult;

    assert_eq!((entry.state, entry.attempts), (EntryState::Dead, 1));
    let last = entry.history.last().expect("an attempt that says why");
    assert!(
        matches!(&last.result, AttemptResult::Error(why) if why.contains("could not be read")),
        "{last:?}"
    );
}
