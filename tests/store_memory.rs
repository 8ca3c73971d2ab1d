//! The conformance suite and the races, on `MemoryStore`.

mod common;

use tower_idempotency::store::MemoryStore;

conformance_suite!(async { Some(MemoryStore::new()) });
trust_suite!(async { Some(MemoryStore::new()) });

// In-process "instances" share one map: the race checks the locking, not a database index.
race_suite!(async {
    use std::sync::OnceLock;
    static SHARED: OnceLock<MemoryStore> = OnceLock::new();
    Some(SHARED.get_or_init(MemoryStore::new).clone())
});
