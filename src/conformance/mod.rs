//! The checks every [`Store`] passes, for a store written in another crate (feature
//! `conformance`).
//!
//! Each check is a public async function that takes a store (or several handles on one
//! backend), drives it through one part of the [store contract](crate::store#the-contract-every-backend-keeps)
//! and panics, naming what went wrong, where the store breaks it. The crate's own stores
//! (memory, SQLite, PostgreSQL, MySQL, Redis) run exactly these checks in its tests.
//!
//! One check, called directly:
//!
//! ```
//! use tower_idempotency::conformance;
//! use tower_idempotency::store::{MemoryStore, Store};
//!
//! // A check passes quietly, or panics: the first delivery claims, the second is in flight,
//! // and after the commit every later one is a duplicate.
//! conformance::run(conformance::claim_commit_duplicate(MemoryStore::new()));
//!
//! // The helpers the checks use are there for a backend's own tests too: every test works in
//! // a namespace of its own, so a shared database needs no cleaning.
//! conformance::run(async {
//!     let store = MemoryStore::new();
//!     let key = conformance::key_in(&conformance::unique_namespace("doc"), "evt_1");
//!     let lease = conformance::acquire(&store, &key, conformance::LONG).await;
//!     assert!(!lease.reclaimed());
//!     store.commit(&lease).await.unwrap();
//! });
//! ```
//!
//! # Wiring a backend crate
//!
//! A backend crate names the feature for its tests:
//!
//! ```toml
//! [dev-dependencies]
//! tower-idempotency = { version = "0.1", features = ["conformance"] }
//! ```
//!
//! and one file of its tests invokes [`conformance_suite!`](crate::conformance_suite), which
//! writes one `#[test]` per check. Each arm takes an expression, evaluated anew in every test,
//! that yields a future of the store (or of `Option<Store>`, where `None` skips the test: a
//! database that cannot be reached, say):
//!
//! ```
//! // tests/conformance.rs of a crate whose store is `MapStore` (here the crate's own
//! // `MemoryStore` stands in for it).
//! use tower_idempotency::store::MemoryStore as MapStore;
//!
//! /// A store of the test's own.
//! async fn store() -> MapStore {
//!     MapStore::new()
//! }
//!
//! /// One app instance of several on one backend: in-process handles share one map.
//! async fn instance() -> MapStore {
//!     static SHARED: std::sync::OnceLock<MapStore> = std::sync::OnceLock::new();
//!     SHARED.get_or_init(MapStore::new).clone()
//! }
//!
//! tower_idempotency::conformance_suite! {
//!     claims: store(),
//!     races: instance(),
//!     versions: store(),
//! }
//! # fn main() {}
//! ```
//!
//! The crate's `tests/conformance_example.rs` is such a file, for a small store over
//! `Mutex<HashMap>`s written with the public API alone, that implements `Store`,
//! `VersionStore` and `InboxStore` and runs every arm.
//!
//! # What is checked
//!
//! - the claims, one key at a time: acquire, duplicate, release, give back, reclaim, hold,
//!   renew, resolve, describe and purge ([`claim_commit_duplicate`] and the functions after
//!   it);
//! - the receipts a commit keeps for [response replay](crate::replay)
//!   ([`commit_with_keeps_the_receipt`] and after);
//! - several app instances at once, one store handle each: one winner per key, one handler
//!   run per event through [`IdempotencyLayer`](crate::IdempotencyLayer)
//!   ([`concurrent_claims_have_one_winner`], [`race_one_event`], [`race_many_events`]);
//! - the [`VersionStore`](crate::version_guard::VersionStore) contract of the version guard
//!   ([`version_store_contract`], [`stale_pending_version_reclaim_hold_and_resolve`]);
//! - the [`InboxStore`](crate::store::inbox::InboxStore) contract of the inbox: enqueue once,
//!   take under the worker's tokens, start, settle, give back, reclaim or hold, the operator's
//!   actions, retention ([`enqueue_once_then_duplicates`] and after), and several instances
//!   enqueueing and taking at once ([`instances_enqueue_and_take_each_once`]).
//!
//! The checks sleep past a short stale limit ([`SHORT`], [`PAST_SHORT`]) where the contract
//! speaks of time, so the store's clock must move with real time; the whole suite runs in a
//! few seconds.

mod claims;
mod expect;
mod inbox;
mod inbox_leases;
mod inbox_races;
mod races;
mod receipts;
mod suite;
mod versions;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::IdempotencyKey;
use crate::store::{Claim, Lease, Stale, Store};

pub use claims::{
    claim_commit_duplicate, describe_counts_deliveries_and_runs, give_back_takes_the_run_back,
    purge_completed_keeps_recent_and_processing, release_lets_the_retry_run,
    renew_keeps_a_claim_fresh, stale_hold_keeps_the_row, stale_reclaim_fences_the_old_owner,
    stuck_claims_and_resolve,
};
pub use inbox::{
    a_taken_entry_says_when_it_was_received, an_operator_leaves_a_live_entry_unless_forced,
    enqueue_once_then_duplicates, entries_and_stats, purge_keeps_dead_requests,
    retry_then_dead_then_retry_now, take_one, take_one_unstarted, take_ours, take_unstarted,
};
pub use inbox_leases::{
    an_unstarted_entry_is_taken_again_without_a_crash, give_back_takes_the_attempt_back,
    hold_leaves_a_crashed_entry_running, reclaim_counts_crashes_and_ends_dead,
};
pub use inbox_races::{instances_enqueue_and_take_each_once, settle_many_answers_each};
pub use races::{concurrent_claims_have_one_winner, race_many_events, race_one_event};
pub use receipts::{
    a_new_run_shows_no_receipt, a_repeated_commit_keeps_the_first_receipt, claimed_receipt,
    commit_with_a_lost_lease_writes_nothing, commit_with_keeps_the_receipt, described_receipt,
    plain_commit_keeps_no_receipt, receipt, receipt_with_body,
};
pub use suite::StoreOrSkip;
pub use versions::{
    acquire_version, stale_pending_version_reclaim_hold_and_resolve, version_store_contract,
};

/// A stale limit no check reaches: ten minutes, claims taken over by reclaim.
pub const LONG: Stale = Stale::reclaim_after(Duration::from_secs(600));

/// The short stale limit of the checks that wait for a claim to turn stale.
pub const SHORT: Duration = Duration::from_millis(300);

/// How long those checks sleep: comfortably past [`SHORT`], even on a busy machine.
pub const PAST_SHORT: Duration = Duration::from_millis(700);

/// Held by every test that [`conformance_suite!`](crate::conformance_suite) writes: shared by
/// most, alone by the two that purge.
///
/// [`Store::purge_completed`] purges every namespace, so run alongside other tests on the same
/// table, a check that purges would forget rows they still rely on, and two that purge would
/// purge each other's rows. A backend's own tests on the table the suite uses hold it too:
/// shared, or alone if they purge or lock the table.
pub static SHARED_TABLE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held alone by every inbox check: a worker's take reaches every namespace, so two checks on
/// one inbox would take each other's entries.
pub static INBOX_TABLE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A namespace no other test, and no earlier run, uses: `test` followed by the process id, the
/// time and a counter.
pub fn unique_namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{test}-{}-{nanos:x}-{n}", std::process::id())
}

/// The key `value` in namespace `ns`.
///
/// # Panics
///
/// If `ns` or `value` is no valid part of an [`IdempotencyKey`].
pub fn key_in(ns: &str, value: &str) -> IdempotencyKey {
    IdempotencyKey::new(ns.to_owned(), value).expect("a valid key")
}

/// Claims `key`, which must be free: the lease.
///
/// # Panics
///
/// If the claim fails or finds the key taken.
pub async fn acquire<S: Store>(store: &S, key: &IdempotencyKey, stale: Stale) -> Lease {
    match store.claim(key, stale).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

/// Runs `check` to its end on a new multi-threaded runtime of two workers (as
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` would), and answers its
/// output. The tests of [`conformance_suite!`](crate::conformance_suite) run on it.
///
/// # Panics
///
/// If the runtime cannot be built, or `check` panics.
pub fn run<F: Future>(check: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(check)
}
