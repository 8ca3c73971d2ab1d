//! What every SQL store does the same way beyond the `Store` contract: `migrate()` twice, a
//! closed pool, a table of another name, rows that are no valid key, duplicate counts written
//! to the table. The statements each needs are the backend's ([`SqlBackend`]).

use tower_idempotency::store::{Claim, StoreError};

use super::sql::SqlBackend;
use super::{LONG, PAST_SHORT, SHORT, acquire, key_in, unique_namespace};

/// Migrating a migrated table again changes nothing, and claims work after it.
pub async fn migrate_twice_is_fine<S: SqlBackend>(store: S) {
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let key = key_in(&unique_namespace("twice"), "evt_1");
    acquire(&store, &key, LONG).await;
}

/// A closed pool fails a claim with the sqlx error as the source, and the layer answers 503.
pub async fn a_closed_pool_is_a_503_with_the_sqlx_error_as_source<S: SqlBackend>(store: S) {
    store.close().await;
    let err = super::store_down_is_503(store).await;
    let source = std::error::Error::source(&err).unwrap();
    assert!(
        matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolClosed)
        ),
        "{source:?}"
    );
    assert!(matches!(err, StoreError::Backend(_)));
}

/// `store` (on the default table, migrated) on each table of `names`: migrated there, its
/// claims are rows of that table, none of the default one.
pub async fn custom_table_name_end_to_end<S: SqlBackend>(store: S, names: &[&str]) {
    for &name in names {
        let custom = store.clone().on_table(name);
        custom.migrate().await.unwrap();
        let ns = unique_namespace("custom");
        let key = key_in(&ns, "evt_1");
        let lease = acquire(&custom, &key, LONG).await;
        custom.commit(&lease).await.unwrap();
        assert!(matches!(
            custom.claim(&key, LONG).await.unwrap(),
            Claim::Done(_)
        ));
        assert_eq!(store.rows_in(name, &ns).await, 1);
        assert_eq!(store.rows_in("idempotency_keys", &ns).await, 0);
    }
}

/// A `processing` row whose namespace or key is no valid `IdempotencyKey` (written by hand or
/// by other code) is skipped by `stuck_claims`, which still lists the valid stuck claims.
pub async fn stuck_claims_skip_a_row_that_is_no_valid_key<S: SqlBackend>(store: S) {
    let ns = unique_namespace("undecodable");
    let (older, newer) = (key_in(&ns, "evt_a"), key_in(&ns, "evt_b"));
    acquire(&store, &older, LONG).await;
    acquire(&store, &newer, LONG).await;
    store
        .execute(S::AGE_RENEWAL, older.namespace(), older.value())
        .await;
    let bad = super::db::undecodable_keys(&ns);
    for (namespace, key) in &bad {
        store.execute(S::INSERT_STUCK, namespace, key).await;
    }
    tokio::time::sleep(PAST_SHORT).await;
    let events = super::db::ErrorEvents::default();
    let listed = {
        let _collect = events.install();
        store.stuck_claims(SHORT).await
    };
    for (namespace, key) in &bad {
        store.execute(S::DELETE_ROW, namespace, key).await;
    }
    super::db::assert_undecodable_rows_skipped(listed, &events, &ns, &[older, newer], bad.len());
}

/// The `sql` arm of [`backend_suite!`](crate::backend_suite): module `sql`, the checks of this
/// file on stores of type `$store` made by `$make` (`None` skips the test), the table names of
/// `custom_table_name_end_to_end` in `tables`, and `duplicate_counts_reach_the_table` on two
/// instances made by `$quiet`, whose duplicate counts are written only when asked.
#[macro_export]
macro_rules! sql_store_suite {
    ($make:expr, tables: [$($table:expr),* $(,)?], quiet: $quiet:expr) => {
        mod sql {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn migrate_twice_is_fine() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::sql_store::migrate_twice_is_fine(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_closed_pool_is_a_503_with_the_sqlx_error_as_source() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::sql_store::a_closed_pool_is_a_503_with_the_sqlx_error_as_source(
                    store,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn custom_table_name_end_to_end() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let Some(store) = $make.await else { return };
                $crate::common::sql_store::custom_table_name_end_to_end(store, &[$($table),*])
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stuck_claims_skip_a_row_that_is_no_valid_key() {
                // Alone: until they are deleted, the rows are in every listing of the table.
                let _alone = $crate::common::SHARED_TABLE.write().await;
                let Some(store) = $make.await else { return };
                $crate::common::sql_store::stuck_claims_skip_a_row_that_is_no_valid_key(store)
                    .await;
            }

            /// Duplicates are counted at once in their instance, and in the table once
            /// written.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn duplicate_counts_reach_the_table() {
                let _shared = $crate::common::SHARED_TABLE.read().await;
                let (Some(store), Some(other)) = ($quiet.await, $quiet.await) else {
                    return;
                };
                $crate::common::hot_path::duplicate_counts_reach_the_table(
                    store,
                    other,
                    |store| async move {
                        $crate::common::sql::SqlBackend::write_counts(&store).await;
                    },
                )
                .await;
            }
        }
    };
}
