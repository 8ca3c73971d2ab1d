//! [`backend_suite!`](crate::backend_suite): every suite of the contract, for one backend.

/// Generates every suite a backend runs, one module each, from the store makers it is given.
/// A backend's test file invokes it once, so that file is the index of the backend's contract:
///
/// ```ignore
/// backend_suite! {
///     claims: store(),
///     trust: store(),
///     races: store(),
///     versions: store(),
///     advance: PostgresStore = store(),
///     transactional: PostgresStore = store(),
///     sql: store(), tables: ["app_claims"], quiet: quiet_store(),
///     table_names: lazy_store(), rejects: ["", "a.b.c"], accepts: "app.claims",
/// }
/// ```
///
/// Each arm is optional (a variant of a backend, e.g. another connection setting, may run only
/// some suites), and the arms come in this order:
///
/// - `claims: $make` — module `claims`: the `Store` contract, one key at a time, and the
///   receipts a commit keeps (the `claims` arm of `tower_idempotency::conformance_suite!`);
/// - `trust: $make` — module `trust`: which deliveries claim a key, and how far it reaches
///   (`trust.rs`);
/// - `races: $instance` — module `races`: several app instances claiming at once; each test
///   calls `$instance` four times, one app instance (its own pool) each (the `races` arm of
///   `conformance_suite!`);
/// - `versions: $make` or `versions: $make, instances: $instance` — module `version_guard`:
///   the version guard on the backend, whose tests over four instances call `$instance`
///   (`$make` unless given) four times (`versions.rs`); and module `versions`: the
///   `VersionStore` contract (the `versions` arm of `conformance_suite!`);
/// - `advance: $Store = $make` — module `advance`: `version_guard::advance` in transactional
///   mode, on a SQL store of type `$Store`, which implements
///   [`SqlBackend`](super::sql::SqlBackend) (`advance.rs`);
/// - `transactional: $Store = $make` — module `transactional`: the marker and the handler's
///   write commit together or not at all, on a SQL store of type `$Store`, which implements
///   `SqlBackend` (`transactional.rs`);
/// - `sql: $make, tables: [$name, ...], quiet: $quiet` — module `sql`: what every SQL store
///   does the same way beyond the contract (`migrate()` twice, a closed pool, the tables
///   `$name`, rows that are no valid key), on a store that implements `SqlBackend`; and
///   duplicate counts written to the table by two instances made by `$quiet`
///   (`sql_store.rs`);
/// - `table_names: $store, rejects: [$bad, ...], accepts: $good` — module `tables`: `$store`
///   (a SQL store whose pool connects lazily) is named `idempotency_keys` by default, refuses
///   each `$bad` name and accepts `$good` (`tables.rs`).
///
/// Every `$make` and `$instance` is an expression, evaluated anew in each test, that yields a
/// future of `Option<Store>` (`None` skips the test); it is resolved inside the generated
/// module, which sees everything of the module that invokes the macro. Every test holds
/// [`SHARED_TABLE`](super::SHARED_TABLE) shared, the tests that purge hold it alone.
#[macro_export]
macro_rules! backend_suite {
    (
        $(claims: $claims:expr,)?
        $(trust: $trust:expr,)?
        $(races: $races:expr,)?
        $(versions: $versions:expr $(, instances: $instances:expr)?,)?
        $(advance: $advance_store:ty = $advance:expr,)?
        $(transactional: $tx_store:ty = $tx:expr,)?
        $(sql: $sql:expr, tables: [$($table:expr),* $(,)?], quiet: $quiet:expr,)?
        $(table_names: $tables:expr, rejects: [$($bad:expr),* $(,)?], accepts: $good:expr,)?
    ) => {
        $(tower_idempotency::conformance_suite! { claims: $claims, })?
        $($crate::trust_suite!($trust);)?
        $(tower_idempotency::conformance_suite! { races: $races, })?
        $(
            $crate::versions_suite!($versions $(, $instances)?);
            tower_idempotency::conformance_suite! { versions: $versions, }
        )?
        $($crate::advance_suite!($advance_store, $advance);)?
        $($crate::transactional_suite!($tx_store, $tx);)?
        $($crate::sql_store_suite!($sql, tables: [$($table),*], quiet: $quiet);)?
        $($crate::table_names_suite!($tables, rejects: [$($bad),*], accepts: $good);)?
    };
}
