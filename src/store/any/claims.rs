//! [`Store`] for [`AnyStore`]: each method the chosen store's own.

use std::time::Duration;

use super::AnyStore;
use crate::key::IdempotencyKey;
use crate::store::{
    Claim, KeyRecord, Lease, Receipt, Resolution, Stale, Store, StoreError, StuckClaim,
};

impl Store for AnyStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        each!(self, s => s.claim(key, stale).await)
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.renew(lease).await)
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.commit(lease).await)
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        each!(self, s => s.commit_with(lease, receipt).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.release(lease).await)
    }

    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.give_back(lease).await)
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        each!(self, s => s.describe(key).await)
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        each!(self, s => s.stuck_claims(older_than).await)
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.resolve(key, resolution).await)
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        each!(self, s => s.purge_completed(older_than).await)
    }
}
