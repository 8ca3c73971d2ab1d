//! [`conformance_suite!`](crate::conformance_suite): one test per check, for one store maker.

use crate::store::Store;

/// What a store maker of [`conformance_suite!`](crate::conformance_suite) yields: a store, or
/// `Option` of one, where `None` skips the test (its backend cannot be reached, say).
pub trait StoreOrSkip {
    /// The store made.
    type Store;

    /// The store, or `None` to skip the test.
    fn store_or_skip(self) -> Option<Self::Store>;
}

impl<S: Store> StoreOrSkip for S {
    type Store = S;

    fn store_or_skip(self) -> Option<S> {
        Some(self)
    }
}

impl<S: Store> StoreOrSkip for Option<S> {
    type Store = S;

    fn store_or_skip(self) -> Option<S> {
        self
    }
}

/// Writes the tests of the [conformance suite](crate::conformance) for one store: one `#[test]`
/// per check, in one module per arm, each on a runtime of its own
/// ([`conformance::run`](crate::conformance::run)).
///
/// ```
/// use tower_idempotency::store::MemoryStore;
///
/// async fn store() -> MemoryStore {
///     MemoryStore::new()
/// }
///
/// tower_idempotency::conformance_suite! {
///     claims: store(),
///     races: async { Some(MemoryStore::new()) },
/// }
/// # fn main() {}
/// ```
///
/// The arms are optional and come in this order:
///
/// - `claims: $make` — module `claims`: the [`Store`] contract one key at a time, and the
///   receipts a commit keeps, from [`claim_commit_duplicate`](crate::conformance::claim_commit_duplicate)
///   to [`commit_with_a_lost_lease_writes_nothing`](crate::conformance::commit_with_a_lost_lease_writes_nothing)
///   (14 tests);
/// - `races: $instance` — module `races`: several app instances claiming at once; each test
///   calls `$instance` four times, for four handles on one backend (each its own connection
///   pool, as app instances would have; in-process stores hand out clones of one store)
///   (3 tests);
/// - `versions: $make` — module `versions`: the
///   [`VersionStore`](crate::version_guard::VersionStore) contract, for a store that also
///   implements it (2 tests);
/// - `inbox: $make` — module `inbox`: the [`InboxStore`](crate::store::inbox::InboxStore)
///   contract, from [`enqueue_once_then_duplicates`](crate::conformance::enqueue_once_then_duplicates)
///   to [`settle_many_answers_each`](crate::conformance::settle_many_answers_each) (11 tests);
/// - `inbox_races: $instance` — module `inbox_races`: four instances enqueueing and taking at
///   once ([`instances_enqueue_and_take_each_once`](crate::conformance::instances_enqueue_and_take_each_once)).
///
/// The inbox tests each hold [`INBOX_TABLE`](crate::conformance::INBOX_TABLE) alone: give them
/// an inbox no running worker uses.
///
/// `$make` and `$instance` are expressions, evaluated anew in every test, that yield a future
/// of a store or of `Option<Store>` ([`StoreOrSkip`]: `None` skips the test). They are
/// resolved inside the generated modules, which see everything of the module that invokes the
/// macro. Every test of the other arms holds
/// [`SHARED_TABLE`](crate::conformance::SHARED_TABLE): shared, or alone for the two that purge.
#[macro_export]
macro_rules! conformance_suite {
    // A module `$module` of tests, one for each check of each group, named after the check or
    // the name given with `as`: the check on what `$make` yields, one store (`one`) or four
    // handles on one backend (`four`), holding the group's lock `$table.$lock`
    // (`SHARED_TABLE.read` shared, `SHARED_TABLE.write` or `INBOX_TABLE.lock` alone).
    (@tests $module:ident, $make:expr,
        $($count:ident $table:ident.$lock:ident: [$($check:ident $(as $test:ident)?),+ $(,)?])+
    ) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $($(
                $crate::conformance_suite!(@test $count, $make, $table.$lock, $check $(as $test)?);
            )+)+
        }
    };
    (@test $count:ident, $make:expr, $table:ident.$lock:ident, $check:ident) => {
        $crate::conformance_suite!(@test $count, $make, $table.$lock, $check as $check);
    };
    (@test $count:ident, $make:expr, $table:ident.$lock:ident, $check:ident as $test:ident) => {
        #[test]
        fn $test() {
            $crate::conformance::run(async {
                let _table = $crate::conformance::$table.$lock().await;
                let Some(stores) = $crate::conformance_suite!(@stores $count, $make) else {
                    return;
                };
                $crate::conformance::$check(stores).await;
            });
        }
    };
    // The store, or `None` to skip the test.
    (@stores one, $make:expr) => {
        $crate::conformance::StoreOrSkip::store_or_skip($make.await)
    };
    // Four stores, each made anew, or `None` to skip the test.
    (@stores four, $make:expr) => {
        async {
            let mut stores = ::std::vec::Vec::new();
            for _ in 0..4 {
                stores.push($crate::conformance::StoreOrSkip::store_or_skip($make.await)?);
            }
            Some(stores)
        }
        .await
    };
    (
        $(claims: $claims:expr,)?
        $(races: $races:expr,)?
        $(versions: $versions:expr,)?
        $(inbox: $inbox:expr,)?
        $(inbox_races: $inbox_races:expr,)?
    ) => {
        $($crate::conformance_suite!(@tests claims, $claims,
            one SHARED_TABLE.read: [
                claim_commit_duplicate,
                release_lets_the_retry_run,
                give_back_takes_the_run_back,
                stale_reclaim_fences_the_old_owner,
                stale_hold_keeps_the_row,
                stuck_claims_and_resolve,
                renew_keeps_a_claim_fresh,
                commit_with_keeps_the_receipt,
                plain_commit_keeps_no_receipt,
                a_repeated_commit_keeps_the_first_receipt,
                a_new_run_shows_no_receipt,
                commit_with_a_lost_lease_writes_nothing,
            ]
            one SHARED_TABLE.write: [
                describe_counts_deliveries_and_runs,
                purge_completed_keeps_recent_and_processing,
            ]
        );)?
        $($crate::conformance_suite!(@tests races, $races,
            four SHARED_TABLE.read: [
                concurrent_claims_have_one_winner,
                race_one_event as race_one_event_over_four_instances,
                race_many_events as race_200_events_over_four_instances,
            ]
        );)?
        $($crate::conformance_suite!(@tests versions, $versions,
            one SHARED_TABLE.read: [
                version_store_contract,
                stale_pending_version_reclaim_hold_and_resolve,
            ]
        );)?
        $($crate::conformance_suite!(@tests inbox, $inbox,
            one INBOX_TABLE.lock: [
                enqueue_once_then_duplicates,
                retry_then_dead_then_retry_now,
                reclaim_counts_crashes_and_ends_dead,
                hold_leaves_a_crashed_entry_running,
                give_back_takes_the_attempt_back,
                an_unstarted_entry_is_taken_again_without_a_crash,
                an_operator_leaves_a_live_entry_unless_forced,
                a_taken_entry_says_when_it_was_received,
                entries_and_stats,
                purge_keeps_dead_requests,
                settle_many_answers_each,
            ]
        );)?
        $($crate::conformance_suite!(@tests inbox_races, $inbox_races,
            four INBOX_TABLE.lock: [instances_enqueue_and_take_each_once]
        );)?
    };
}
