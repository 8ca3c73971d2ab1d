//! The entity versions of the [`MemoryStore`], for the [version guard](crate::version_guard):
//! one row per entity, apart from the claims, each call one step under its shard's lock.

use tokio::time::Instant;

use super::MemoryStore;
use crate::key::IdempotencyKey;
use crate::store::{
    LeaseToken, Resolution, Stale, StalePolicy, StoreError, VersionClaim, VersionLease,
    VersionStore,
};

/// One entity's versions.
#[derive(Debug, Default)]
pub(super) struct VersionRow {
    applied: Option<i64>,
    pending: Option<PendingSlot>,
}

#[derive(Debug, Clone, Copy)]
struct PendingSlot {
    version: i64,
    token: LeaseToken,
    since: Instant,
}

impl VersionStore for MemoryStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let now = Instant::now();
        let mut map = self.inner.versions_of(entity);
        let row = map.entry(entity.clone()).or_default();
        // Only an older version is outdated: an equal one (another change in the same second)
        // takes the slot like a newer one.
        let not_older = row.applied.is_none_or(|applied| applied <= version);
        // A stale pending version is taken over only by itself or a newer one: its owner may
        // have written its state before it died, and an older state must not follow it.
        let free = row.pending.is_none_or(|p| {
            stale.policy() == StalePolicy::Reclaim
                && stale.is_stale(now.saturating_duration_since(p.since))
                && p.version <= version
        });
        let ours = LeaseToken::generate();
        if not_older && free {
            row.pending = Some(PendingSlot {
                version,
                token: ours,
                since: now,
            });
        }
        let pending = row
            .pending
            .map(|p| (p.version, p.token, now.saturating_duration_since(p.since)));
        crate::store::decide(entity, version, ours, stale, row.applied, pending)
            .ok_or_else(|| StoreError::backend("inconsistent version row"))
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map
            .get_mut(lease.entity())
            .and_then(|row| row.pending.as_mut())
        {
            Some(pending) if pending.token == lease.token() => {
                pending.since = Instant::now();
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map.get_mut(lease.entity()) {
            Some(row) if row.pending.is_some_and(|p| p.token == lease.token()) => {
                row.applied = Some(
                    row.applied
                        .map_or(lease.version(), |a| a.max(lease.version())),
                );
                row.pending = None;
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let mut map = self.inner.versions_of(lease.entity());
        match map.get_mut(lease.entity()) {
            Some(row) if row.pending.is_some_and(|p| p.token == lease.token()) => {
                row.pending = None;
                if row.applied.is_none() {
                    map.remove(lease.entity());
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        let map = self.inner.versions_of(entity);
        Ok(map.get(entity).and_then(|row| row.applied))
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let mut map = self.inner.versions_of(entity);
        let Some(row) = map.get_mut(entity) else {
            return Ok(false);
        };
        let Some(pending) = row.pending.take() else {
            return Ok(false);
        };
        if resolution == Resolution::Done {
            row.applied = Some(
                row.applied
                    .map_or(pending.version, |a| a.max(pending.version)),
            );
        }
        Ok(true)
    }
}
