//! A SQL store's table name: the default, the names it refuses, and one it accepts.

/// The `table_names` arm of [`backend_suite!`](crate::backend_suite): module `tables`, the
/// validation of table names on `$store` (a store that needs no database: its pool connects
/// lazily), which refuses each of `rejects` and accepts `accepts`.
#[macro_export]
macro_rules! table_names_suite {
    ($store:expr, rejects: [$($bad:expr),* $(,)?], accepts: $good:expr) => {
        mod tables {
            #[allow(unused_imports)]
            use super::*;

            use tower_idempotency::store::ConfigError;

            #[tokio::test]
            async fn table_names_are_validated() {
                let store = $store;
                assert_eq!(store.table_name(), "idempotency_keys");
                for bad in [$($bad),*] {
                    let err = store.clone().with_table_name(bad).unwrap_err();
                    assert!(
                        matches!(err, ConfigError::InvalidTableName { .. }),
                        "{bad}: {err}"
                    );
                }
                assert_eq!(store.with_table_name($good).unwrap().table_name(), $good);
            }
        }
    };
}
