//! The store contract on PostgreSQL: [`Store`] for [`PostgresStore`], each step one statement
//! but where the module docs say.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, PgPool};

use super::PostgresStore;
use crate::key::IdempotencyKey;
use crate::store::batch::{ClaimWrite, CommitWrite};
use crate::store::sql::{AfterRead, ClaimRow, held, retry_serialization_failure};
use crate::store::{Claim, Lease, LeaseToken, Receipt, Stale, Store, StoreError};

/// Every operation is one statement, its round trip the only one, but where the [module
/// docs](crate::store::postgres#round-trips) say (they give the SQL).
impl Store for PostgresStore {
    /// The insert-or-read of the module docs (while keys come new and the claim goes alone,
    /// a plain insert first, the insert-or-read only if it inserted nothing); then, only for a
    /// released row or a stale one under reclaim, the upsert that takes it over. Each is
    /// tried once more after a serialization failure.
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let table = &self.table;
        // The row the insert ran into may be missing from the statement's snapshot (inserted
        // by a delivery that committed after it was taken), and purged before a second read.
        for _ in 0..3 {
            let token = LeaseToken::generate();
            let row = self
                .first_statement(key, token)
                .await
                .inspect_err(|error| table.unanswered(key, token, error))?;
            let row = match row {
                Some(row) => Some(row),
                None => table.read_claim(key).await?,
            };
            self.new_keys.saw(row.as_ref(), token);
            match table.after_read(key, row, Some(token), stale)? {
                AfterRead::Answer(claim) => return Ok(claim),
                AfterRead::TakeOver => {
                    let token = LeaseToken::generate();
                    return table
                        .claim_upsert(key, token, stale)
                        .await
                        .inspect_err(|error| table.unanswered(key, token, error));
                }
                AfterRead::Absent => {}
            }
        }
        Err(StoreError::backend(
            "the key's row vanished between its insert and its read, three times",
        ))
    }

    /// In the next batch of commits when one is in flight.
    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.commit_batched(lease, None).await
    }

    /// In the next batch of commits when one is in flight.
    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        self.commit_batched(lease, Some(receipt)).await
    }

    crate::store::sql::store_forwards!(shared);
}

impl PostgresStore {
    /// A claim's first statement: the insert-or-read of `key`, writing `token` if it inserts.
    /// In the next batch of claims when one is in flight (see [`max_batch`](Self::max_batch)).
    async fn first_statement(
        &self,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<Option<ClaimRow>, StoreError> {
        let write = ClaimWrite {
            key: key.clone(),
            token,
            likely_new: self.new_keys.likely(),
        };
        self.batches.claims.write(write).await
    }

    /// The commit of `lease`, in the next batch of commits when one is in flight.
    async fn commit_batched(
        &self,
        lease: &Lease,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let write = CommitWrite::of(lease, receipt);
        held(self.batches.commits.write(write).await?)
    }
}

/// The statements a write runs when it goes alone, as without batching: a claim's first
/// statement and a commit here, an inbox entry's insert beside the inbox. (A batch of them is
/// [`batch`](super::batch)'s.) Shared by a store's clones.
pub(super) struct Lone {
    pub(super) pool: PgPool,
    /// The insert-or-read of a claim (see the [module docs](super#round-trips)).
    pub(super) claim: Arc<str>,
    /// The claim of a key likely new: an insert alone.
    pub(super) insert: Arc<str>,
    pub(super) commit: Arc<str>,
    /// The insert-or-read of an inbox entry.
    pub(super) enqueue: Arc<str>,
}

impl Lone {
    /// The insert-or-read of one key, tried once more after a serialization failure. A key
    /// likely new is inserted first, and read only if it has a row.
    pub(super) async fn claim_one(
        &self,
        write: &ClaimWrite,
    ) -> Result<Option<ClaimRow>, StoreError> {
        let statement = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.token.to_i64())
        };
        if write.likely_new {
            let insert = || statement(&self.insert).execute(&self.pool);
            let done = retry_serialization_failure("claim", is_retryable, insert).await?;
            if done.rows_affected() == 1 {
                return Ok(Some(ClaimRow::inserted(write.token)));
            }
        }
        let read = || statement(&self.claim).fetch_optional(&self.pool);
        retry_serialization_failure("claim", is_retryable, read)
            .await
            .and_then(|row| row.as_ref().map(ClaimRow::read).transpose())
    }

    /// One commit, alone: the rows it matched. Tried once more after a serialization failure,
    /// which a stricter isolation than READ COMMITTED makes likelier beside batches that read
    /// many rows.
    pub(super) async fn commit_one(&self, write: &CommitWrite) -> Result<u64, StoreError> {
        let statement = || {
            sqlx::query(AssertSqlSafe(self.commit.clone()))
                .bind(write.receipt.as_deref())
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.token.to_i64())
                .execute(&self.pool)
        };
        let done = retry_serialization_failure("commit", is_retryable, statement).await?;
        Ok(done.rows_affected())
    }
}

/// 40001 serialization_failure, 40P01 deadlock_detected: nothing was written, and the writes
/// can be sent again.
pub(super) fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e)
        if matches!(e.code().as_deref(), Some("40001" | "40P01")))
}
