//! The store contract on SQLite: [`Store`] for [`SqliteStore`], each step one statement.

use std::time::Duration;

use super::SqliteStore;
use super::batch::{Write, Wrote};
use crate::key::IdempotencyKey;
use crate::store::sql::{AfterRead, held, micros};
use crate::store::{
    Claim, KeyRecord, Lease, LeaseToken, Receipt, Resolution, Stale, StalePolicy, Store,
    StoreError, StuckClaim,
};

/// Every operation is one statement, its round trip the only one (see the [module
/// docs](crate::store::sqlite#round-trips) for the SQL).
impl Store for SqliteStore {
    /// A read, which answers a duplicate without writing; the upsert of the module docs for a
    /// new key, a released one, or a stale one under reclaim.
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let table = &self.table;
        let row = table.read_claim(key).await?;
        match table.after_read(key, row, None, stale)? {
            AfterRead::Answer(claim) => Ok(claim),
            AfterRead::TakeOver | AfterRead::Absent => {
                let token = LeaseToken::generate();
                let write = Write::Claim {
                    key: key.clone(),
                    token,
                    reclaim: stale.policy() == StalePolicy::Reclaim,
                    stale_us: micros(stale.after()),
                };
                let claim = match self.batches.write(write).await {
                    Ok(Wrote::Row(row)) => row.into_claim(key, token, stale),
                    Ok(Wrote::Matched(_)) => Err(mixed_up()),
                    Err(error) => Err(error),
                };
                claim.inspect_err(|error| table.unanswered(key, token, error))
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.table.renew(lease).await
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.commit_batched(lease, None).await
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        self.commit_batched(lease, Some(receipt)).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.table.release(lease).await
    }

    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.table.give_back(lease).await
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        self.table.describe(key).await
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        self.table.stuck_claims(older_than).await
    }

    async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
        self.table.resolve(key, how).await
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.table.purge_completed(older_than).await
    }
}

impl SqliteStore {
    /// The commit of `lease`, in the next batch of writes when one is in flight.
    async fn commit_batched(
        &self,
        lease: &Lease,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let write = Write::Commit {
            key: lease.key().clone(),
            token: lease.token(),
            receipt: receipt.map(Receipt::encode),
        };
        match self.batches.write(write).await? {
            Wrote::Matched(matched) => held(matched),
            Wrote::Row(_) => Err(mixed_up()),
        }
    }
}

/// A write answered with what another kind of write answers: a defect of the batch.
fn mixed_up() -> StoreError {
    StoreError::backend("a batched write was answered for another kind of write")
}
