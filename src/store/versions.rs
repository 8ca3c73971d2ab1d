//! Where versions live: the [`VersionStore`] trait, implemented by every store.

use std::future::Future;
use std::time::Duration;

use super::{LeaseToken, Resolution, Stale, StoreError};
use crate::key::IdempotencyKey;

/// Keeps, per entity (`(namespace, entity id)`), the latest version applied and the one version
/// being applied right now: the store side of the [`VersionGuardLayer`](crate::version_guard::VersionGuardLayer).
///
/// Implemented by `MemoryStore`, `SqliteStore`, `PostgresStore`, `MySqlStore` and
/// `RedisStore`; the SQL stores keep a row per entity in the table `<table>_versions`, created
/// by their `migrate()`, and Redis a hash per entity (`<prefix>:v:…`, kept without expiry).
/// Time comes from the database, as for claims.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyKey, Stale};
/// use tower_idempotency::version_guard::{VersionClaim, VersionStore};
/// use tower_idempotency::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let subscription = IdempotencyKey::new("stripe", "sub_1")?;
/// let stale = Stale::reclaim_after(Duration::from_secs(60));
///
/// let VersionClaim::Acquired(lease) = store.begin_version(&subscription, 2, stale).await? else {
///     panic!("nothing applied or pending yet");
/// };
/// // While version 2 is being applied, no other version of the entity may start.
/// assert!(matches!(store.begin_version(&subscription, 3, stale).await?, VersionClaim::InFlight(_)));
/// store.commit_version(&lease).await?;
/// // Version 1 arrives late: it is outdated.
/// assert_eq!(store.begin_version(&subscription, 1, stale).await?, VersionClaim::Outdated { applied: 2 });
/// // Version 2 again (another change in the same second, or a redelivery): it runs.
/// let VersionClaim::Acquired(lease) = store.begin_version(&subscription, 2, stale).await? else {
///     panic!("an equal version is not outdated");
/// };
/// store.commit_version(&lease).await?;
/// assert_eq!(store.applied_version(&subscription).await?, Some(2));
/// # Ok(())
/// # }
/// ```
///
/// # The contract every backend keeps
///
/// - [`begin_version`](Self::begin_version) is atomic. A version older than the applied one
///   answers [`VersionClaim::Outdated`]. Otherwise (newer, or equal), with no version pending,
///   it becomes the pending one under a fresh token: [`VersionClaim::Acquired`]. With another
///   version pending (the same version under another delivery included),
///   [`VersionClaim::InFlight`], unless that one was not renewed for the [`Stale`] limit: then the
///   policy decides, acquired (reclaim) or [`VersionClaim::Held`] (hold).
/// - [`commit_version`](Self::commit_version) sets the applied version to the greater of it
///   and the lease's, and clears the pending slot; [`release_version`](Self::release_version)
///   clears the slot only. Both act only while the lease's token is the pending token, and
///   answer [`StoreError::LeaseLost`] otherwise (a second commit with the same lease too).
pub trait VersionStore: Send + Sync + 'static {
    /// Tries to make `version` the pending version of `entity`. One atomic step.
    fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> impl Future<Output = Result<VersionClaim, StoreError>> + Send;

    /// Moves the lease's pending version's heartbeat to now, if the lease still holds: it is not
    /// stale for another stale limit.
    fn renew_version(
        &self,
        lease: &VersionLease,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The lease's version is applied: the entity's applied version becomes the greater of it
    /// and the lease's, and the pending slot is cleared, if the lease still holds.
    fn commit_version(
        &self,
        lease: &VersionLease,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The lease's version was not applied: the pending slot is cleared, if the lease still
    /// holds, so a retry (or another version) may begin.
    fn release_version(
        &self,
        lease: &VersionLease,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The latest version applied to `entity`, if any.
    fn applied_version(
        &self,
        entity: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Settles a pending version by hand, whoever holds it: [`Resolution::Done`] applies it,
    /// [`Resolution::Release`] discards it. Answers whether a version was pending. For held
    /// versions (the hold policy), after a person checked what the handler did.
    fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`VersionStore::begin_version`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VersionClaim {
    /// This delivery's version is the entity's pending version now: run the handler, then
    /// commit or release.
    Acquired(VersionLease),
    /// The entity is at a newer version already.
    Outdated {
        /// The entity's applied version.
        applied: i64,
    },
    /// Another version of the entity is being applied, and its claim is not stale (as
    /// [`Claim::InFlight`](crate::store::Claim::InFlight) for a key).
    InFlight(PendingVersion),
    /// Another version's claim is stale, and the hold policy leaves it for a person
    /// ([`VersionStore::resolve_version`]).
    Held(PendingVersion),
}

/// The pending version that made a delivery wait.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingVersion {
    /// The version being applied.
    pub version: i64,
    /// How long ago it began or was last renewed: it is stale once this reaches the limit.
    pub age: Duration,
}

impl PendingVersion {
    /// Describes a pending version.
    pub fn new(version: i64, age: Duration) -> Self {
        Self { version, age }
    }
}

/// A successful [`VersionStore::begin_version`]: the entity, the version and a fencing token
/// unique to this claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionLease {
    entity: IdempotencyKey,
    version: i64,
    token: LeaseToken,
}

impl VersionLease {
    /// A lease on `entity`'s pending `version` with `token`. Stores call this when a claim
    /// succeeds.
    pub fn new(entity: IdempotencyKey, version: i64, token: LeaseToken) -> Self {
        Self {
            entity,
            version,
            token,
        }
    }

    /// The entity.
    pub fn entity(&self) -> &IdempotencyKey {
        &self.entity
    }

    /// The version being applied.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// This claim's fencing token.
    pub fn token(&self) -> LeaseToken {
        self.token
    }
}

#[cfg_attr(
    feature = "_sql",
    doc = "What [`advance`](crate::version_guard::advance) did."
)]
#[cfg_attr(
    not(feature = "_sql"),
    doc = "What `version_guard::advance` did (with a SQL store's feature)."
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The entity's applied version is this delivery's now (it was older, absent, or already
    /// equal), within the transaction: apply the business change in the same transaction.
    Applied,
    /// The entity is at a newer version already: change nothing, answer 2xx.
    Outdated {
        /// The entity's applied version.
        applied: i64,
    },
}

/// Advances entity versions inside the caller's transaction: the SQL stores.
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub trait AdvanceVersion: super::TransactionalStore + VersionStore {
    /// See [`version_guard::advance`](crate::version_guard::advance).
    fn advance_version(
        &self,
        conn: &mut <Self::Database as sqlx::Database>::Connection,
        entity: &IdempotencyKey,
        version: i64,
    ) -> impl Future<Output = Result<Advance, StoreError>> + Send;
}

/// The answer of a [`VersionStore::begin_version`], decided from the entity's row as the
/// store's atomic step left it: the rule every store shares, for a store of another crate too.
///
/// A store writes first and decides after. In one atomic step (a conditional statement, a
/// script, a lock) it makes `version` the pending one under its fresh token `ours` when
/// `version` is not older than the applied version and the slot is free: nothing pending, or,
/// under the reclaim policy, a pending version not renewed for the stale limit and not newer
/// than `version` (its owner may have written its state before it died). Then it hands
/// `decide` what the row holds, `applied` and `pending` (the pending version, its token, and
/// the time since it began or was last renewed, by the store's clock), and answers the claim
/// `decide` makes of it:
///
/// - the slot holds `ours`: [`VersionClaim::Acquired`], a lease on `version`;
/// - `version` is older than `applied`: [`VersionClaim::Outdated`], whatever is pending (an
///   equal version is not outdated: it takes the slot like a newer one);
/// - another version is pending: [`VersionClaim::Held`] if `stale` is a hold policy whose
///   limit that version passed, else [`VersionClaim::InFlight`] (a stale version that the
///   reclaim policy left to its owner, being newer than `version`, is in flight too);
/// - nothing pending, not outdated, and not ours: `None`. The row changed between the write
///   and the read (a store that takes two statements for them), and the claim starts over; a
///   store whose write and read are one step never sees it, and answers an error.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyKey, Stale};
/// use tower_idempotency::store::{LeaseToken, PendingVersion, VersionClaim, decide};
///
/// let entity = IdempotencyKey::new("stripe", "sub_1").unwrap();
/// let hold = Stale::hold_after(Duration::from_secs(30));
/// let (ours, theirs) = (LeaseToken::generate(), LeaseToken::generate());
/// let (young, old) = (Duration::from_secs(1), Duration::from_secs(60));
///
/// // The step made version 5 pending under our token: ours to apply.
/// let claim = decide(&entity, 5, ours, hold, Some(4), Some((5, ours, Duration::ZERO)));
/// let Some(VersionClaim::Acquired(lease)) = claim else {
///     panic!("expected acquired, got {claim:?}");
/// };
/// assert_eq!((lease.version(), lease.token()), (5, ours));
///
/// // Version 3 comes after version 4 was applied: outdated, whatever is pending.
/// assert_eq!(
///     decide(&entity, 3, ours, hold, Some(4), Some((5, theirs, young))),
///     Some(VersionClaim::Outdated { applied: 4 }),
/// );
///
/// // Version 6 comes while version 5 is pending: it waits, and once version 5 went past the
/// // stale limit without a heartbeat, the hold policy leaves it for a person.
/// assert_eq!(
///     decide(&entity, 6, ours, hold, Some(4), Some((5, theirs, young))),
///     Some(VersionClaim::InFlight(PendingVersion::new(5, young))),
/// );
/// assert_eq!(
///     decide(&entity, 6, ours, hold, Some(4), Some((5, theirs, old))),
///     Some(VersionClaim::Held(PendingVersion::new(5, old))),
/// );
///
/// // Nothing pending, yet the slot is not ours: the row changed under the store.
/// assert_eq!(decide(&entity, 6, ours, hold, Some(4), None), None);
/// ```
pub fn decide(
    entity: &IdempotencyKey,
    version: i64,
    ours: LeaseToken,
    stale: Stale,
    applied: Option<i64>,
    pending: Option<(i64, LeaseToken, Duration)>,
) -> Option<VersionClaim> {
    match pending {
        Some((_, token, _)) if token == ours => Some(VersionClaim::Acquired(VersionLease::new(
            entity.clone(),
            version,
            ours,
        ))),
        _ if applied.is_some_and(|applied| version < applied) => {
            applied.map(|applied| VersionClaim::Outdated { applied })
        }
        Some((pending, _, age)) => {
            let pending = PendingVersion::new(pending, age);
            Some(
                if stale.policy() == super::StalePolicy::Hold && stale.is_stale(age) {
                    VersionClaim::Held(pending)
                } else {
                    VersionClaim::InFlight(pending)
                },
            )
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let e = IdempotencyKey::new("ns", "e").unwrap();
        let ours = LeaseToken::generate();
        let other = LeaseToken::generate();
        let hold = Stale::hold_after(Duration::from_secs(1));
        let young = Duration::from_millis(10);
        let old = Duration::from_secs(2);
        assert!(matches!(
            decide(&e, 5, ours, hold, Some(4), Some((5, ours, young))),
            Some(VersionClaim::Acquired(l)) if l.version() == 5 && l.token() == ours
        ));
        // Older than the applied version: outdated, whatever is pending.
        assert_eq!(
            decide(&e, 3, ours, hold, Some(4), Some((6, other, young))),
            Some(VersionClaim::Outdated { applied: 4 })
        );
        assert_eq!(
            decide(&e, 3, ours, hold, Some(4), None),
            Some(VersionClaim::Outdated { applied: 4 })
        );
        // Equal to the applied version: not outdated. It runs when the slot is ours, waits
        // behind another pending version (the same one too), and starts over when the row
        // says nothing is pending.
        assert!(matches!(
            decide(&e, 4, ours, hold, Some(4), Some((4, ours, young))),
            Some(VersionClaim::Acquired(l)) if l.version() == 4 && l.token() == ours
        ));
        assert_eq!(
            decide(&e, 4, ours, hold, Some(4), Some((6, other, young))),
            Some(VersionClaim::InFlight(PendingVersion::new(6, young)))
        );
        assert_eq!(
            decide(&e, 4, ours, hold, Some(4), Some((4, other, young))),
            Some(VersionClaim::InFlight(PendingVersion::new(4, young)))
        );
        assert_eq!(
            decide(&e, 4, ours, hold, Some(4), Some((4, other, old))),
            Some(VersionClaim::Held(PendingVersion::new(4, old)))
        );
        assert_eq!(decide(&e, 4, ours, hold, Some(4), None), None);
        assert_eq!(
            decide(&e, 5, ours, hold, Some(4), Some((6, other, young))),
            Some(VersionClaim::InFlight(PendingVersion::new(6, young)))
        );
        assert_eq!(
            decide(&e, 5, ours, hold, None, Some((6, other, old))),
            Some(VersionClaim::Held(PendingVersion::new(6, old)))
        );
        assert_eq!(
            decide(
                &e,
                5,
                ours,
                Stale::reclaim_after(young),
                None,
                Some((6, other, old))
            ),
            Some(VersionClaim::InFlight(PendingVersion::new(6, old))),
            "a stale claim that reclaim did not take over is busy"
        );
        assert_eq!(decide(&e, 5, ours, hold, Some(4), None), None);
    }
}
