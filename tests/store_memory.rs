//! Everything `MemoryStore` promises: the suites of `backend_suite!`.

mod common;

use tower_idempotency::store::MemoryStore;

/// A store of the test's own.
async fn store() -> Option<MemoryStore> {
    Some(MemoryStore::new())
}

/// One app instance: in-process "instances" share one map, so the races check the locking,
/// not a database index.
async fn instance() -> Option<MemoryStore> {
    use std::sync::OnceLock;
    static SHARED: OnceLock<MemoryStore> = OnceLock::new();
    Some(SHARED.get_or_init(MemoryStore::new).clone())
}

backend_suite! {
    claims: store(),
    trust: store(),
    races: instance(),
    versions: store(), instances: instance(),
}

mod inbox_suite {
    use tower_idempotency::store::MemoryStore;

    tower_idempotency::conformance_suite! {
        inbox: async { MemoryStore::new() },
        inbox_races: async { Some(SHARED.get_or_init(MemoryStore::new).clone()) },
    }

    static SHARED: std::sync::OnceLock<MemoryStore> = std::sync::OnceLock::new();
}
