//! The inbox on SQLite: [`InboxStore`] for [`SqliteStore`], in the table `<table>_inbox`.
//!
//! Every write takes its turn in the store's queue of writers (see the [module
//! docs](crate::store::sqlite#writers)), as the claims do; reads use the pool directly.

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{AssertSqlSafe, Row as _, Sqlite};

use super::SqliteStore;
use super::batch::{Write, Wrote};
use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable::{self, Unreadable};
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running, Settlement,
    Settling, StoredRequest, Take, Taken,
};
use crate::store::sql::{ResultExt as _, duration_from_micros, micros};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

mod queries;

pub(super) use queries::{InboxQueries, inbox_queries};

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

/// A statement of the inbox.
fn statement<'q>(sql: &Arc<str>) -> Query<'q> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

impl SqliteStore {
    /// Runs a write in the writer's turn; answers how many rows it changed.
    async fn inbox_write(&self, query: Query<'_>) -> Result<u64, StoreError> {
        let _turn = self.table.turn().await;
        let done = query.execute(&self.table.pool).await.store()?;
        Ok(done.rows_affected())
    }

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

    /// Runs a write fenced by `lease`, whose first three parameters are the lease's.
    async fn inbox_fenced(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
        more: impl FnOnce(Query<'_>) -> Query<'_>,
    ) -> Result<(), StoreError> {
        let query = statement(sql)
            .bind(lease.key().namespace())
            .bind(lease.key().value())
            .bind(lease.token().to_i64());
        match self.inbox_write(more(query)).await? {
            0 => Err(StoreError::LeaseLost),
            _ => Ok(()),
        }
    }

    /// The fenced write that settles `lease` as `settlement` says.
    fn settling<'q>(
        &'q self,
        lease: &'q Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Query<'q> {
        let fenced = |sql: &Arc<str>| {
            statement(sql)
                .bind(lease.key().namespace())
                .bind(lease.key().value())
                .bind(lease.token().to_i64())
        };
        let history = Attempt::encode_history(history);
        match *settlement {
            Settlement::Done => fenced(&self.inbox.settle)
                .bind(EntryState::Done.as_str())
                .bind(history),
            Settlement::Dead => fenced(&self.inbox.settle)
                .bind(EntryState::Dead.as_str())
                .bind(history),
            Settlement::Retry { after } => fenced(&self.inbox.retry_later)
                .bind(micros(after))
                .bind(history),
            Settlement::GiveBack => fenced(&self.inbox.give_back),
        }
    }

    /// An operator's write on the row of `key`, taking a running entry as `running` says;
    /// whether it changed it.
    async fn inbox_by_hand(
        &self,
        sql: &Arc<str>,
        key: &IdempotencyKey,
        running: Running,
    ) -> Result<bool, StoreError> {
        let (after, force) = by_hand(running);
        let query = statement(sql)
            .bind(key.namespace())
            .bind(key.value())
            .bind(after)
            .bind(force);
        Ok(self.inbox_write(query).await? > 0)
    }
}

/// A count read back from the table.
fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

fn state(text: &str) -> Result<EntryState, StoreError> {
    EntryState::parse(text)
        .ok_or_else(|| StoreError::backend(format!("unexpected state {text:?} in the inbox table")))
}

fn key(namespace: String, key: String) -> Result<IdempotencyKey, StoreError> {
    IdempotencyKey::new(namespace, key).map_err(StoreError::backend)
}

fn history(row: &SqliteRow, index: usize) -> Result<Vec<Attempt>, StoreError> {
    let bytes: Option<&[u8]> = row.try_get(index).store()?;
    Attempt::decode_history(bytes.unwrap_or_default())
}

/// An entry, from the columns of `entries` and `entry`.
fn entry(row: &SqliteRow) -> Result<Entry, StoreError> {
    let state = state(row.try_get(2).store()?)?;
    let micros_at = |i: usize| row.try_get::<i64, _>(i).store().map(duration_from_micros);
    Ok(Entry::new(
        key(row.try_get(0).store()?, row.try_get(1).store()?)?,
        state,
        count(row.try_get(3).store()?),
        count(row.try_get(4).store()?),
        micros_at(5)?,
        (state == EntryState::Queued)
            .then(|| micros_at(6))
            .transpose()?,
        (state == EntryState::Running)
            .then(|| micros_at(7))
            .transpose()?,
        row.try_get(8).store()?,
        history(row, 9)?,
    ))
}

/// A taken entry, from what the lease of a picked entry returns.
fn taken(row: &SqliteRow) -> Result<Result<Taken, Unreadable>, StoreError> {
    let key = key(row.try_get(0).store()?, row.try_get(1).store()?)?;
    let token = LeaseToken::from_i64(row.try_get(2).store()?);
    let received_us: i64 = row.try_get(9).store()?;
    Ok(unreadable::taken(
        Lease::new(key, token, row.try_get(5).store()?),
        row.try_get(7).store()?,
        count(row.try_get(3).store()?).saturating_add(1),
        count(row.try_get(4).store()?),
        std::time::UNIX_EPOCH + duration_from_micros(received_us),
        row.try_get(8).store()?,
    ))
}

/// How an operator's action binds `running`: the microseconds without a renewal after which
/// a running entry may be taken (NULL: never), and whether it is taken whatever.
fn by_hand(running: Running) -> (Option<i64>, bool) {
    match running {
        Running::Leave => (None, false),
        Running::StaleFor(after) => (Some(micros(after)), false),
        Running::Force => (None, true),
    }
}

/// A limit, bound as SQLite's integer.
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The statements of the [module docs](crate::store::sqlite#the-inbox).
impl InboxStore for SqliteStore {
    /// The insert; if it inserted nothing, a read of the entry's state. An entry purged in
    /// between is stored again.
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        // A duplicate is one read, through the pool: it never waits for the writer's turn.
        let bytes = request.encode();
        for _ in 0..3 {
            let found: Option<String> = sqlx::query_scalar(AssertSqlSafe(self.inbox.state.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .fetch_optional(&self.table.pool)
                .await
                .store()?;
            if let Some(found) = found {
                return Ok(Enqueued::Duplicate(state(&found)?));
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
        let stale = micros(take.stale.after());
        let max_attempts = i64::from(take.max_attempts);
        let turn = self.table.turn().await;
        let mut tx = self
            .table
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .store()?;
        if reclaims {
            statement(&self.inbox.expire)
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
            let row = statement(&self.inbox.lease)
                .bind(rowid)
                .bind(token.to_i64())
                .fetch_one(&mut *tx)
                .await
                .store()?;
            // A row whose key cannot be read rolls the take back (the transaction is dropped).
            rows.push(taken(&row)?);
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

    /// One transaction in the writer's turn, one `UPDATE` per lease.
    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let _turn = self.table.turn().await;
        let mut tx = self
            .table
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .store()?;
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            let done = statement(&self.inbox.start)
                .bind(lease.key().namespace())
                .bind(lease.key().value())
                .bind(lease.token().to_i64())
                .execute(&mut *tx)
                .await
                .store()?;
            held.push(done.rows_affected() > 0);
        }
        tx.commit().await.store()?;
        Ok(held)
    }

    /// One transaction in the writer's turn, one `UPDATE` per token.
    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let _turn = self.table.turn().await;
        let mut tx = self
            .table
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .store()?;
        let mut given = 0;
        for token in tokens {
            given += statement(&self.inbox.untake)
                .bind(token.to_i64())
                .execute(&mut *tx)
                .await
                .store()?
                .rows_affected();
        }
        tx.commit().await.store()?;
        Ok(given)
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inbox_fenced(&self.inbox.renew, lease, |q| q).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        let query = self.settling(lease, settlement, history);
        match self.inbox_write(query).await? {
            0 => Err(StoreError::LeaseLost),
            _ => Ok(()),
        }
    }

    /// One `BEGIN IMMEDIATE` transaction in one writer's turn, one `UPDATE` per settlement:
    /// the batch waits for one sync of the disk, not one each.
    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        if batch.len() < 2 {
            return crate::store::inbox::settle_each(self, batch).await;
        }
        let written = async {
            let _turn = self.table.turn().await;
            let mut tx = self
                .table
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .store()?;
            let mut changed = Vec::with_capacity(batch.len());
            for one in batch {
                let query = self.settling(&one.lease, &one.settlement, &one.history);
                changed.push(query.execute(&mut *tx).await.store()?.rows_affected());
            }
            tx.commit().await.store()?;
            Ok::<_, StoreError>(changed)
        };
        crate::store::inbox::batch_results(written.await, batch)
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        const ALL: [EntryState; 4] = [
            EntryState::Queued,
            EntryState::Running,
            EntryState::Done,
            EntryState::Dead,
        ];
        let states = if states.is_empty() { &ALL } else { states };
        let mut query = statement(&self.inbox.entries).bind(namespace);
        // Four places: the states asked for, the last repeated.
        for i in 0..4 {
            query = query.bind(states[i.min(states.len() - 1)].as_str());
        }
        let rows = query
            .bind(int(limit))
            .fetch_all(&self.table.pool)
            .await
            .store()?;
        rows.iter().map(entry).collect()
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let row = statement(&self.inbox.entry)
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.table.pool)
            .await
            .store()?;
        row.as_ref().map(entry).transpose()
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        let row = statement(&self.inbox.request)
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.table.pool)
            .await
            .store()?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bytes: Option<&[u8]> = row.try_get(0).store()?;
        bytes.map(StoredRequest::decode).transpose()
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.inbox_by_hand(&self.inbox.retry_now, key, running)
            .await
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let query = statement(&self.inbox.retry_dead).bind(namespace);
        self.inbox_write(query).await
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.inbox_by_hand(&self.inbox.discard, key, running).await
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        let (queued, running, dead, oldest): (i64, i64, i64, Option<i64>) =
            sqlx::query_as(AssertSqlSafe(self.inbox.stats.clone()))
                .bind(namespace)
                .fetch_one(&self.table.pool)
                .await
                .store()?;
        let n = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(InboxStats::new(
            n(queued),
            n(running),
            n(dead),
            oldest.map(duration_from_micros),
        ))
    }

    /// Two statements, each in the writer's turn: the requests, then the entries.
    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        let requests = statement(&self.inbox.purge_requests)
            .bind(micros(requests_after))
            .bind(int(limit));
        let requests = self.inbox_write(requests).await?;
        let entries = statement(&self.inbox.purge_entries)
            .bind(micros(entries_after))
            .bind(int(limit));
        let entries = self.inbox_write(entries).await?;
        Ok(Purged::new(requests, entries))
    }
}
