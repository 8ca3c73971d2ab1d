//! The version guard's store: `VersionStore` over the `versions` table.

use std::time::Instant;

use tower_idempotency::IdempotencyKey;
use tower_idempotency::store::{
    LeaseToken, Resolution, Stale, StalePolicy, StoreError, VersionClaim, VersionLease,
    VersionStore, decide,
};

use super::{MapStore, lock};

/// One entity's row: the latest version applied, and the version being applied, if any.
#[derive(Default)]
pub(super) struct Row {
    applied: Option<i64>,
    pending: Option<Pending>,
}

/// The version being applied: under whose token, and since its last heartbeat.
#[derive(Clone, Copy)]
struct Pending {
    version: i64,
    token: LeaseToken,
    renewed: Instant,
}

impl Row {
    /// Clears the pending slot; `apply` makes the applied version the greater of the two.
    fn settle(&mut self, apply: bool) {
        if let Some(pending) = self.pending.take()
            && apply
        {
            self.applied = Some(
                self.applied
                    .map_or(pending.version, |applied| applied.max(pending.version)),
            );
        }
    }
}

impl MapStore {
    /// Runs `change` on the entity's row if `lease` holds its pending version.
    fn versioned(
        &self,
        lease: &VersionLease,
        change: impl FnOnce(&mut Row),
    ) -> Result<(), StoreError> {
        let mut rows = lock(&self.versions);
        match rows.get_mut(lease.entity()) {
            Some(row)
                if row
                    .pending
                    .is_some_and(|pending| pending.token == lease.token()) =>
            {
                change(row);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }
}

impl VersionStore for MapStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let (now, ours) = (Instant::now(), LeaseToken::generate());
        let mut rows = lock(&self.versions);
        let row = rows.entry(entity.clone()).or_default();
        // The one atomic step: the slot becomes ours if the version is not older than the
        // applied one, and nothing is pending, or a stale pending version that reclaim may take
        // over (never from a newer version: its owner may have written its state already).
        let not_older = row.applied.is_none_or(|applied| applied <= version);
        let free = row.pending.is_none_or(|pending| {
            stale.policy() == StalePolicy::Reclaim
                && stale.is_stale(now - pending.renewed)
                && pending.version <= version
        });
        if not_older && free {
            row.pending = Some(Pending {
                version,
                token: ours,
                renewed: now,
            });
        }
        // Then the crate's rule answers from the row as the step left it.
        let pending = row
            .pending
            .map(|pending| (pending.version, pending.token, now - pending.renewed));
        decide(entity, version, ours, stale, row.applied, pending)
            .ok_or_else(|| StoreError::backend("a version row with nothing pending, not ours"))
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.versioned(lease, |row| {
            if let Some(pending) = &mut row.pending {
                pending.renewed = Instant::now();
            }
        })
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.versioned(lease, |row| row.settle(true))
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.versioned(lease, |row| row.settle(false))
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        Ok(lock(&self.versions).get(entity).and_then(|row| row.applied))
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let mut rows = lock(&self.versions);
        let Some(row) = rows.get_mut(entity).filter(|row| row.pending.is_some()) else {
            return Ok(false);
        };
        row.settle(resolution == Resolution::Done);
        Ok(true)
    }
}
