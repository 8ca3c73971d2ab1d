//! The conformance suite as a store of another crate runs it: `MapStore`, a small store over
//! `Mutex<HashMap>`s written with the public API alone, implements the three store traits, and
//! `conformance_suite!` runs every arm of the suite on it. What each part shows:
//!
//! - `Store`, the claims of the idempotency layer (`conformance_example/claims.rs`): one row
//!   per key, each method one step under the lock, as each would be one conditional statement
//!   in a database; a lease fences every write by its token.
//! - `VersionStore`, the version guard's (`conformance_example/versions.rs`): `begin_version`
//!   takes the entity's pending slot in one step when it may, then answers with
//!   `store::decide`, the crate's own rule, from the row as that step left it, rather than
//!   deriving the answer again.
//! - `InboxStore`, the inbox's (`conformance_example/inbox.rs`): `enqueue` stores a key once;
//!   `take` leases due entries under the tokens the worker made before it asked
//!   (`Take::tokens`), so that `give_back` by those tokens undoes a take whose answer never
//!   came; `start` counts an attempt when the handler starts, so that an entry whose worker
//!   died before that is taken again without a crash, while one whose started handler went
//!   silent is reclaimed as a crash (or held, under the hold policy); `settle` and
//!   `settle_many` under the lease; an operator's `retry_now` and `discard` leave a running
//!   entry to its worker or take it, as `Running` says; `purge_inbox` keeps dead requests.
//!
//! A backend crate keeps a file like this one in its `tests/` (its store in its own `src/`),
//! with `tower-idempotency = { version = "0.1", features = ["conformance"] }` among its
//! dev-dependencies; a store on a database makes a new connection pool in `instance()`, and
//! yields `None` (the test is skipped) when the database cannot be reached. The `inbox` arms'
//! tests each hold the suite's inbox lock alone: give them an inbox no running worker uses.

use map_store::MapStore;

/// The backend crate's own code (its `src/`, in a crate of its own): `MapStore` and its three
/// store traits, a file each.
#[path = "conformance_example/mod.rs"]
mod map_store;

/// A store of the test's own.
async fn store() -> MapStore {
    MapStore::default()
}

/// One of several app instances on one backend: in-process handles share one store.
async fn instance() -> MapStore {
    static SHARED: std::sync::OnceLock<MapStore> = std::sync::OnceLock::new();
    SHARED.get_or_init(MapStore::default).clone()
}

tower_idempotency::conformance_suite! {
    claims: store(),
    races: instance(),
    versions: store(),
    inbox: store(),
    inbox_races: instance(),
}
