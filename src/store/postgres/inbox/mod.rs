//! The inbox on PostgreSQL: [`InboxStore`] for [`PostgresStore`], in the table
//! `<table>_inbox` (see the [module docs](crate::store::postgres#inbox) for the SQL). What
//! every SQL store runs the same way is [`Table`](crate::store::sql::Table)'s; here are the
//! enqueue, the take, and the batches that PostgreSQL binds as arrays.

use sqlx::{AssertSqlSafe, Row as _};

use super::claims::is_retryable;
use super::{PostgresStore, is_serialization_failure};
use crate::key::IdempotencyKey;
use crate::store::batch::EnqueueWrite;
use crate::store::inbox::unreadable;
use crate::store::inbox::{
    Enqueued, InboxStore, Running, Settling, StoredRequest, Take, Taken, Wake,
};
use crate::store::sql::{
    ResultExt as _, entry_state, micros, retry_serialization_failure, taken_entry,
};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

mod herald;
mod queries;
mod watch;

pub(crate) use herald::Herald;
pub(super) use queries::{Own, own, shared};

/// The most entries one take leases: a bound on the tokens sent with the statement.
const TAKE_LIMIT: usize = 10_000;

impl PostgresStore {
    /// The enqueue's insert-or-read of `key`'s entry: its state, and whether this insert stored
    /// it (none: an enqueue that committed after the statement's snapshot stored it). In the
    /// next batch of inserts when one is in flight (see [`max_batch`](Self::max_batch)).
    async fn insert_entry(
        &self,
        key: &IdempotencyKey,
        bytes: &[u8],
    ) -> Result<Option<(String, bool)>, StoreError> {
        let write = EnqueueWrite {
            key: key.clone(),
            request: bytes.to_vec(),
        };
        self.batches.enqueues.write(write).await
    }

    /// Wakes the workers of other instances when `changed` entries were made due.
    fn woken(&self, changed: u64) -> u64 {
        if changed > 0 {
            self.herald.poke(self.pool(), &self.inbox.herald);
        }
        changed
    }
}

/// Each operation is one statement, but for two cases: an enqueue whose key another enqueue
/// stored at the same moment reads the entry's state with a second, and a purge deletes the
/// requests, then the entries.
impl InboxStore for PostgresStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        let bytes = request.encode();
        // The row the insert ran into may be missing from the statement's snapshot, and (in
        // theory) purged before a second read.
        for _ in 0..3 {
            let state = match self.insert_entry(key, &bytes).await? {
                Some((_, true)) => {
                    self.woken(1);
                    return Ok(Enqueued::Stored);
                }
                Some((state, false)) => Some(entry_state(&state)?),
                None => self.table.entry_state(key).await?,
            };
            if let Some(state) = state {
                return Ok(Enqueued::Duplicate(state));
            }
        }
        Err(StoreError::backend(
            "the key's inbox entry vanished between its insert and its read, three times",
        ))
    }

    /// One statement, tried once more after a serialization failure. Should an entry it
    /// leased be unreadable, the others are given back and the error answered; the unreadable
    /// one stays running, to be taken again once its lease is stale.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let n = take.limit().min(TAKE_LIMIT);
        if n == 0 {
            return Ok(Vec::new());
        }
        let tokens: Vec<i64> = take.tokens[..n].iter().map(|t| t.to_i64()).collect();
        let max_attempts = i32::try_from(take.max_attempts).unwrap_or(i32::MAX);
        let statement = || {
            sqlx::query(AssertSqlSafe(self.inbox.take.clone()))
                .bind(i64::try_from(n).unwrap_or(i64::MAX))
                .bind(take.stale.policy() == StalePolicy::Reclaim)
                .bind(micros(take.stale.after()))
                .bind(max_attempts)
                .bind(tokens.as_slice())
                .fetch_all(self.pool())
        };
        let rows = retry_serialization_failure("take", is_serialization_failure, statement).await?;
        let (mut taken, mut unreadable, mut damaged) = (Vec::new(), Vec::new(), None);
        for row in &rows {
            match taken_entry(row) {
                Ok(Ok(entry)) => taken.push(entry),
                Ok(Err(entry)) => unreadable.push(entry),
                Err(error) => {
                    damaged.get_or_insert(error);
                }
            }
        }
        unreadable::bury(self, unreadable).await;
        if let Some(error) = damaged {
            let tokens: Vec<LeaseToken> = taken.iter().map(|entry| entry.lease.token()).collect();
            let _ = self.give_back(&tokens).await;
            return Err(error);
        }
        Ok(taken)
    }

    /// One `UPDATE … FROM unnest(…)` for the whole take.
    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        self.start_all(leases).await
    }

    /// One `UPDATE … WHERE token = ANY($1)`.
    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        self.untake_all(tokens).await
    }

    crate::store::sql::inbox_forwards!(shared);

    /// One `UPDATE … FROM unnest(…)` for the whole batch.
    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        if let [one] = batch {
            return vec![self.settle(&one.lease, &one.settlement, &one.history).await];
        }
        self.settle_all(batch).await
    }

    /// Workers elsewhere are told, as of a new entry.
    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        let retried = self.table.retry_now(key, running).await?;
        Ok(self.woken(u64::from(retried)) > 0)
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        Ok(self.woken(self.table.retry_dead(namespace).await?))
    }

    /// Listens on the inbox's channel (see the [module docs](crate::store::postgres#inbox)),
    /// on a connection of its own made with the pool's options, and wakes `wake` at each
    /// notification, and once after each time it starts listening (what was stored while
    /// nothing listened is looked for then). A lost connection is made again, after a pause
    /// that grows from 50 ms to 5 s while the database stays unreachable.
    fn watch(&self, wake: Wake) -> impl Future<Output = ()> + Send {
        let options = (*self.pool().connect_options()).clone();
        watch::watch(options, self.inbox.channel.clone(), wake)
    }
}

impl super::claims::Lone {
    /// One inbox entry's insert-or-read, tried once more after a serialization failure.
    pub(super) async fn enqueue_one(
        &self,
        write: &EnqueueWrite,
    ) -> Result<Option<(String, bool)>, StoreError> {
        let statement = || {
            sqlx::query(AssertSqlSafe(self.enqueue.clone()))
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.request.as_slice())
                .fetch_optional(&self.pool)
        };
        let row = retry_serialization_failure("enqueue", is_retryable, statement).await?;
        row.map(|row| Ok((row.try_get(0).store()?, row.try_get(1).store()?)))
            .transpose()
    }
}
