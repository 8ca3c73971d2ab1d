//! The inbox on SQLite: [`InboxStore`] for [`SqliteStore`], in the table `<table>_inbox`. What
//! every SQL store runs the same way is [`Table`](crate::store::sql::Table)'s; here are the
//! enqueue and the take.
//!
//! Every write takes its turn in the store's queue of writers (see the [module
//! docs](crate::store::sqlite#writers)), as the claims do; reads use the pool directly.

use sqlx::AssertSqlSafe;

use super::SqliteStore;
use super::claims::{Write, Wrote};
use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable;
use crate::store::inbox::{Enqueued, InboxStore, StoredRequest, Take, Taken};
use crate::store::sql::{ResultExt as _, micros, taken_entry};
use crate::store::{StalePolicy, StoreError};

mod queries;

pub(super) use queries::{Own, own, shared};

impl SqliteStore {
    /// Inserts the entry of `key` unless there is one: in the next batch of writes when one
    /// is in flight (see [`max_batch`](Self::max_batch)). Answers how many rows it stored.
    async fn insert_entry(&self, key: &IdempotencyKey, bytes: &[u8]) -> Result<u64, StoreError> {
        let write = Write::Enqueue {
            key: key.clone(),
            request: bytes.to_vec(),
        };
        match self.batches.write(write).await? {
            Wrote::Matched(stored) => Ok(stored),
            Wrote::Row(_) | Wrote::Found(_) => Err(StoreError::backend(
                "a batched insert was answered for another kind of write",
            )),
        }
    }
}

/// A number bound as SQLite's integer.
fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// The statements of the [module docs](crate::store::sqlite#the-inbox).
impl InboxStore for SqliteStore {
    /// A read of the entry's state; if there is none, the insert. An entry purged in between
    /// is stored again.
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        // A duplicate is one read, through the pool: it never waits for the writer's turn.
        let bytes = request.encode();
        for _ in 0..3 {
            if let Some(state) = self.table.entry_state(key).await? {
                return Ok(Enqueued::Duplicate(state));
            }
            if self.insert_entry(key, &bytes).await? > 0 {
                return Ok(Enqueued::Stored);
            }
        }
        Err(StoreError::backend(format!(
            "the inbox entry {key} was deleted as often as it was stored"
        )))
    }

    /// One `BEGIN IMMEDIATE` transaction in the writer's turn: under reclaim, the stale
    /// entries whose attempts ran out turn dead; then the oldest due entries are picked, and
    /// each leased under its token.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        if take.limit() == 0 {
            return Ok(Vec::new());
        }
        let reclaims = take.stale.policy() == StalePolicy::Reclaim;
        let (stale, max_attempts) = (micros(take.stale.after()), i64::from(take.max_attempts));
        let turn = self.table.turn().await;
        let mut tx = self
            .table
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .store()?;
        if reclaims {
            sqlx::query(AssertSqlSafe(self.inbox.expire.clone()))
                .bind(stale)
                .bind(max_attempts)
                .execute(&mut *tx)
                .await
                .store()?;
        }
        let picked: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.inbox.pick.clone()))
            .bind(int(take.limit()))
            .bind(reclaims)
            .bind(stale)
            .bind(max_attempts)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let mut rows = Vec::with_capacity(picked.len());
        for (rowid, token) in picked.into_iter().zip(&take.tokens) {
            let row = sqlx::query(AssertSqlSafe(self.inbox.lease.clone()))
                .bind(rowid)
                .bind(token.to_i64())
                .fetch_one(&mut *tx)
                .await
                .store()?;
            // A row whose key cannot be read rolls the take back (the transaction is dropped).
            rows.push(taken_entry(&row)?);
        }
        tx.commit().await.store()?;
        drop(turn);
        let (mut taken, mut unreadable) = (Vec::with_capacity(rows.len()), Vec::new());
        for row in rows {
            match row {
                Ok(entry) => taken.push(entry),
                Err(entry) => unreadable.push(entry),
            }
        }
        unreadable::bury(self, unreadable).await;
        Ok(taken)
    }

    crate::store::sql::inbox_forwards!(shared);
    crate::store::sql::inbox_forwards!(by_transaction);
}

impl super::claims::Lone {
    /// An inbox entry's insert, on `conn`: the rows it stored (none when the key had an
    /// entry).
    pub(super) async fn enqueue_on(
        &self,
        conn: &mut sqlx::SqliteConnection,
        key: &IdempotencyKey,
        request: &[u8],
    ) -> Result<Wrote, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.enqueue.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(request)
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(Wrote::Matched(done.rows_affected()))
    }
}
