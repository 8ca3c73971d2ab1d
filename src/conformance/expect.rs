//! What the checks expect of a store's answers, each stated once: a claim that must find its
//! key in flight, held or done, a version that must wait behind another or find it held, and a
//! call made with a lease that no longer holds. Each panics at the check's own line, saying
//! what the store answered instead.

use std::fmt::Debug;

use crate::store::{Claim, Completed, Pending, PendingVersion, StoreError, VersionClaim};

/// Writes, for each `name: Answer::Variant => Carried;`, a function that takes a store's
/// answer, which must be `Ok(Answer::Variant(carried))`, and returns `carried`.
macro_rules! expectations {
    ($($(#[$doc:meta])* $name:ident: $answer:ident::$variant:ident => $carried:ty;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub(super) fn $name(answer: Result<$answer, StoreError>) -> $carried {
            match answer {
                Ok($answer::$variant(carried)) => carried,
                other => panic!("expected {}, got {other:?}", stringify!($answer::$variant)),
            }
        }
    )*};
}

expectations! {
    /// A claim that must find its key in flight (another delivery's claim, not stale): what it
    /// found.
    expect_in_flight: Claim::InFlight => Pending;
    /// A claim that must find its key held (stale, and left for a person by the hold policy):
    /// what it found.
    expect_held: Claim::Held => Pending;
    /// A claim that must find its key done (the delivery is a duplicate): what it found.
    expect_done: Claim::Done => Completed;
    /// A version that must wait behind another pending version that is not stale (in flight):
    /// that version.
    expect_version_in_flight: VersionClaim::InFlight => PendingVersion;
    /// A version that must find another pending version held (stale, and left for a person by
    /// the hold policy): that version.
    expect_version_held: VersionClaim::Held => PendingVersion;
}

/// Asserts that `result` is [`StoreError::LeaseLost`]: the lease no longer holds, and the call
/// changed nothing.
#[track_caller]
pub(super) fn assert_lease_lost<T: Debug>(result: Result<T, StoreError>) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost)),
        "expected the lease lost, got {result:?}"
    );
}
