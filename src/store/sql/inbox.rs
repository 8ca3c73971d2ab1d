//! The inbox's statements that every SQL store runs the same way ([`InboxQueries`]): a
//! backend's `impl InboxStore` forwards to these, and writes only its enqueue and its take
//! (and, where one statement can carry a batch, its settlements).

use std::time::Duration;

use sqlx::{AssertSqlSafe, Row as _};

use super::{
    InboxPurge, InboxQueries, ResultExt as _, entry_state, held, inbox_entry, micros, statements,
};
use crate::key::IdempotencyKey;
use crate::store::inbox::{
    Attempt, Entry, EntryState, InboxStats, Purged, Running, Settlement, Settling, StoredRequest,
};
use crate::store::{Lease, LeaseToken, StoreError};

/// What a settlement binds: the state, the microseconds until due (none: the due time
/// stays), whether a started attempt is taken back (a give-back), and the encoded history
/// (none for a give-back, which keeps it).
pub(crate) fn settlement(
    settlement: &Settlement,
    history: &[Attempt],
) -> (EntryState, Option<i64>, bool, Option<Vec<u8>>) {
    let encoded = || Some(Attempt::encode_history(history));
    match *settlement {
        Settlement::Done => (EntryState::Done, None, false, encoded()),
        Settlement::Dead => (EntryState::Dead, None, false, encoded()),
        Settlement::Retry { after } => (EntryState::Queued, Some(micros(after)), false, encoded()),
        Settlement::GiveBack => (EntryState::Queued, Some(0), true, None),
    }
}

/// What an operator's action binds of `running`: whether it takes a running entry whatever,
/// and the microseconds without a renewal after which it may (none: never).
fn by_hand(running: Running) -> (bool, Option<i64>) {
    match running {
        Running::Leave => (false, None),
        Running::StaleFor(after) => (false, Some(micros(after))),
        Running::Force => (true, None),
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

statements! {
    fn inbox(&self) -> &InboxQueries {
        &self.sql.inbox
    }

    /// The state of `key`'s entry, if it has one: what a duplicate is answered with.
    pub(crate) async fn entry_state(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<EntryState>, StoreError> {
        let state: Option<String> = sqlx::query_scalar(AssertSqlSafe(self.inbox().state.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        state.as_deref().map(entry_state).transpose()
    }

    pub(crate) async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.inbox().renew, lease.key(), lease.token())
            .await
    }

    /// The statement that settles `lease` as `how` says, with `history`.
    fn settling<'q>(
        &'q self,
        lease: &'q Lease,
        how: &Settlement,
        history: &[Attempt],
    ) -> super::backend::Statement<'q, DB> {
        let (state, due, taken_back, history) = settlement(how, history);
        sqlx::query(AssertSqlSafe(self.inbox().settle.clone()))
            .bind(state.as_str())
            .bind(due)
            .bind(taken_back)
            .bind(history)
            .bind(lease.key().namespace())
            .bind(lease.key().value())
            .bind(lease.token().to_i64())
    }

    pub(crate) async fn settle_entry(
        &self,
        lease: &Lease,
        how: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        held(self.write(self.settling(lease, how, history)).await?)
    }

    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    /// Settles a batch in one transaction, one statement each: it waits for one flush of the
    /// disk, not one a settlement. Each answers as its own would; a failure fails them all.
    pub(crate) async fn settle_together(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        if let [one] = batch {
            return vec![self.settle_entry(&one.lease, &one.settlement, &one.history).await];
        }
        let written = async {
            let _turn = self.writer.turn().await;
            let mut tx = self.pool.begin_with(DB::BEGIN).await.store()?;
            let mut changed = Vec::with_capacity(batch.len());
            for one in batch {
                let query = self.settling(&one.lease, &one.settlement, &one.history);
                changed.push(DB::rows_affected(&query.execute(&mut *tx).await.store()?));
            }
            tx.commit().await.store()?;
            Ok::<_, StoreError>(changed)
        };
        crate::store::inbox::batch_results(written.await, batch)
    }

    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    /// One transaction, one statement a lease.
    pub(crate) async fn start_entries(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let _turn = self.writer.turn().await;
        let mut tx = self.pool.begin_with(DB::BEGIN).await.store()?;
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            let done = sqlx::query(AssertSqlSafe(self.inbox().start.clone()))
                .bind(lease.key().namespace())
                .bind(lease.key().value())
                .bind(lease.token().to_i64())
                .execute(&mut *tx)
                .await
                .store()?;
            held.push(DB::rows_affected(&done) > 0);
        }
        tx.commit().await.store()?;
        Ok(held)
    }

    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    /// One transaction, one statement a token.
    pub(crate) async fn untake(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let _turn = self.writer.turn().await;
        let mut tx = self.pool.begin_with(DB::BEGIN).await.store()?;
        let mut given = 0;
        for token in tokens {
            let done = sqlx::query(AssertSqlSafe(self.inbox().untake.clone()))
                .bind(token.to_i64())
                .execute(&mut *tx)
                .await
                .store()?;
            given += DB::rows_affected(&done);
        }
        tx.commit().await.store()?;
        Ok(given)
    }

    pub(crate) async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let wants = |state| states.is_empty() || states.contains(&state);
        let rows = sqlx::query(AssertSqlSafe(self.inbox().entries.clone()))
            .bind(namespace)
            .bind(namespace)
            .bind(wants(EntryState::Queued))
            .bind(wants(EntryState::Running))
            .bind(wants(EntryState::Done))
            .bind(wants(EntryState::Dead))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .store()?;
        rows.iter().map(inbox_entry).collect()
    }

    pub(crate) async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox().entry.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        row.as_ref().map(inbox_entry).transpose()
    }

    pub(crate) async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox().request.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bytes: Option<&[u8]> = row.try_get(0).store()?;
        bytes.map(StoredRequest::decode).transpose()
    }

    /// An operator's write on `key`'s entry, taking a running one as `running` says: whether
    /// it changed the entry.
    async fn by_hand(
        &self,
        sql: &std::sync::Arc<str>,
        key: &IdempotencyKey,
        running: Running,
    ) -> Result<bool, StoreError> {
        let (force, after) = by_hand(running);
        let query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(force)
            .bind(after);
        Ok(self.write(query).await? > 0)
    }

    pub(crate) async fn retry_now(
        &self,
        key: &IdempotencyKey,
        running: Running,
    ) -> Result<bool, StoreError> {
        self.by_hand(&self.inbox().retry_now, key, running).await
    }

    pub(crate) async fn discard(
        &self,
        key: &IdempotencyKey,
        running: Running,
    ) -> Result<bool, StoreError> {
        self.by_hand(&self.inbox().discard, key, running).await
    }

    pub(crate) async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let query = sqlx::query(AssertSqlSafe(self.inbox().retry_dead.clone())).bind(namespace);
        self.write(query).await
    }

    pub(crate) async fn inbox_stats(
        &self,
        namespace: Option<&str>,
    ) -> Result<InboxStats, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox().stats.clone()))
            .bind(namespace)
            .bind(namespace)
            .fetch_one(&self.pool)
            .await
            .store()?;
        let oldest: Option<i64> = row.try_get(3).store()?;
        Ok(InboxStats::new(
            count(row.try_get(0).store()?),
            count(row.try_get(1).store()?),
            count(row.try_get(2).store()?),
            oldest.map(super::duration_from_micros),
        ))
    }

    /// Two parts, the requests then the entries, each as [`InboxPurge`] says.
    pub(crate) async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        if limit == 0 {
            return Ok(Purged::default());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (requests, entries) = match &self.inbox().purge {
            InboxPurge::Direct { requests, entries } => {
                let purge = |sql: &std::sync::Arc<str>, after: Duration| {
                    sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(micros(after))
                        .bind(limit)
                };
                let requests = self.write(purge(requests, requests_after)).await?;
                (requests, self.write(purge(entries, entries_after)).await?)
            }
            InboxPurge::Picked {
                before,
                pick_requests,
                request_of,
                pick_entries,
                entry_of,
            } => {
                let parts = [
                    (pick_requests, request_of, requests_after),
                    (pick_entries, entry_of, entries_after),
                ];
                let mut purged = [0; 2];
                for (n, (pick, change, after)) in parts.into_iter().enumerate() {
                    purged[n] = self.purge_picked(before, pick, change, micros(after), limit).await?;
                }
                (purged[0], purged[1])
            }
        };
        Ok(Purged::new(requests, entries))
    }

    /// One part of a purge in a transaction of its own: `before` on its connection, then
    /// `pick` (age, age, limit), then `change` on each key it picked.
    async fn purge_picked(
        &self,
        before: &std::sync::Arc<str>,
        pick: &std::sync::Arc<str>,
        change: &std::sync::Arc<str>,
        age: i64,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await.store()?;
        sqlx::raw_sql(AssertSqlSafe(before.clone()))
            .execute(&mut *conn)
            .await
            .store()?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await.store()?;
        let picked = sqlx::query(AssertSqlSafe(pick.clone()))
            .bind(age)
            .bind(age)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let mut changed = 0;
        for row in &picked {
            let (namespace, key): (String, String) =
                (row.try_get(0).store()?, row.try_get(1).store()?);
            let done = sqlx::query(AssertSqlSafe(change.clone()))
                .bind(namespace.as_str())
                .bind(key.as_str())
                .execute(&mut *tx)
                .await
                .store()?;
            changed += DB::rows_affected(&done);
        }
        tx.commit().await.store()?;
        Ok(changed)
    }
}
