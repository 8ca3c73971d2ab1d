//! The inbox on MySQL and MariaDB: [`InboxStore`] for [`MySqlStore`], in the table
//! `<table>_inbox` (see the [module docs](crate::store::mysql#inbox) for the SQL).

use std::time::Duration;

use sqlx::{AssertSqlSafe, Row as _};

use super::server::{DEADLOCK, DUPLICATE_KEY, mysql_error};
use super::{MySqlFlavor, MySqlStore};
use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable;
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running, Settlement,
    Settling, StoredRequest, Take, Taken,
};
use crate::store::sql::{ResultExt as _, duration_from_micros, micros};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

mod queries;
mod rows;

pub(super) use queries::InboxQueries;
use rows::{Locked, describe, state_of};

/// How many times an enqueue or a take runs again after InnoDB chose it as a deadlock's
/// victim (or, for an enqueue, found the duplicate's row gone before it could read it).
const ATTEMPTS: usize = 3;

/// Run first on the take's connection: under READ COMMITTED InnoDB locks no gaps, and keeps
/// no lock on a row the take read but did not choose.
const BEGIN_TAKE: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN";
/// The same for the purge's statements (each its own transaction).
const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Whether `error` is the server's error `number`.
fn is(error: &sqlx::Error, number: u16) -> bool {
    matches!(error, sqlx::Error::Database(db) if mysql_error(&**db) == Some(number))
}

/// Whether `error` is InnoDB's deadlock (the transaction was rolled back).
fn deadlocked(error: &StoreError) -> bool {
    let StoreError::Backend(source) = error else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .is_some_and(|e| is(e, DEADLOCK))
}

impl MySqlStore {
    /// One try at an enqueue: `None` when the key's row was there for the insert and gone
    /// for the read (purged in between).
    async fn enqueue_once(
        &self,
        flavor: MySqlFlavor,
        key: &IdempotencyKey,
        request: &[u8],
    ) -> Result<Option<Enqueued>, StoreError> {
        let mark = LeaseToken::generate().to_i64();
        let insert = |sql| {
            sqlx::query(AssertSqlSafe(sql))
                .bind(key.namespace())
                .bind(key.value())
                .bind(mark)
                .bind(request)
        };
        if flavor == MySqlFlavor::MariaDb {
            let row = insert(self.inbox.insert_returning.clone())
                .fetch_one(&self.table.pool)
                .await
                .store()?;
            let token: Option<i64> = row.try_get(1).store()?;
            if token == Some(mark) {
                return Ok(Some(Enqueued::Stored));
            }
            let state: String = row.try_get(0).store()?;
            return Ok(Some(Enqueued::Duplicate(state_of(&state)?)));
        }
        match insert(self.inbox.insert.clone())
            .execute(&self.table.pool)
            .await
        {
            Ok(_) => return Ok(Some(Enqueued::Stored)),
            Err(e) if is(&e, DUPLICATE_KEY) => {}
            Err(e) => return Err(StoreError::backend(e)),
        }
        let state: Option<String> = sqlx::query_scalar(AssertSqlSafe(self.inbox.state.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.table.pool)
            .await
            .store()?;
        state
            .map(|state| Ok(Enqueued::Duplicate(state_of(&state)?)))
            .transpose()
    }

    /// One try at a take, in one transaction: lock the due entries (and the stale ones, under
    /// reclaim), decide, update them in one statement, commit.
    async fn take_once(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let limit = i64::try_from(take.limit()).unwrap_or(i64::MAX);
        let mut tx = self.table.pool.begin_with(BEGIN_TAKE).await.store()?;
        let mut rows = sqlx::query(AssertSqlSafe(self.inbox.take_stale.clone()))
            .bind(micros(take.stale.after()))
            .bind(take.stale.policy() == StalePolicy::Reclaim)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        rows.extend(
            sqlx::query(AssertSqlSafe(self.inbox.take_queued.clone()))
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .store()?,
        );
        let mut locked = rows
            .iter()
            .map(Locked::read)
            .collect::<Result<Vec<_>, _>>()?;
        locked.sort_by_key(|row| row.due_us);
        // Oldest due first, up to the limit; a crash on the last attempt ends dead instead,
        // and takes no place.
        let mut plan: Vec<(Locked, Option<LeaseToken>)> = Vec::new();
        let (mut taken, mut unreadable) = (Vec::new(), Vec::new());
        let mut tokens = take.tokens.iter().copied();
        for row in locked {
            if row.crashed && row.attempts >= take.max_attempts {
                plan.push((row, None));
                continue;
            }
            let Some(token) = tokens.next() else {
                break;
            };
            match row.taken(token)? {
                Ok(entry) => taken.push(entry),
                Err(entry) => unreadable.push(entry),
            }
            plan.push((row, Some(token)));
        }
        if !plan.is_empty() {
            let update = self.inbox.take_update(plan.len());
            let mut statement = sqlx::query(AssertSqlSafe(update));
            for (row, token) in &plan {
                statement = statement
                    .bind(&row.namespace)
                    .bind(&row.key)
                    .bind(token.map(LeaseToken::to_i64))
                    .bind(i64::from(row.crashed));
            }
            let updated = statement.execute(&mut *tx).await.store()?;
            if updated.rows_affected() != plan.len() as u64 {
                return Err(StoreError::backend(
                    "the inbox entries a take locked changed under their locks",
                ));
            }
        }
        tx.commit().await.store()?;
        unreadable::bury(self, unreadable).await;
        Ok(taken)
    }

    /// Runs a statement on the row of `key` (namespace, key[, token]); answers how many rows
    /// it matched.
    async fn on_entry(
        &self,
        sql: &std::sync::Arc<str>,
        key: &IdempotencyKey,
        token: Option<LeaseToken>,
    ) -> Result<u64, StoreError> {
        let mut statement = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value());
        if let Some(token) = token {
            statement = statement.bind(token.to_i64());
        }
        let done = statement.execute(&self.table.pool).await.store()?;
        Ok(done.rows_affected())
    }
}

impl MySqlStore {
    /// An operator's statement on the row of `key` (namespace, key, force, microseconds
    /// without a renewal), taking a running entry as `running` says; whether it changed it.
    async fn by_hand(
        &self,
        sql: &std::sync::Arc<str>,
        key: &IdempotencyKey,
        running: Running,
    ) -> Result<bool, StoreError> {
        let (after, force) = match running {
            Running::Leave => (None, false),
            Running::StaleFor(after) => (Some(micros(after)), false),
            Running::Force => (None, true),
        };
        let done = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(force)
            .bind(after)
            .execute(&self.table.pool)
            .await
            .store()?;
        Ok(done.rows_affected() > 0)
    }

    /// The fenced statement that settles `lease` as `settlement` says.
    fn settling<'q>(
        &'q self,
        lease: &'q Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let statement = match *settlement {
            Settlement::GiveBack => sqlx::query(AssertSqlSafe(self.inbox.give_back.clone())),
            Settlement::Retry { after } => {
                sqlx::query(AssertSqlSafe(self.inbox.retry_later.clone()))
                    .bind(micros(after))
                    .bind(Attempt::encode_history(history))
            }
            Settlement::Dead => sqlx::query(AssertSqlSafe(self.inbox.settle.clone()))
                .bind(EntryState::Dead.as_str())
                .bind(Attempt::encode_history(history)),
            Settlement::Done => sqlx::query(AssertSqlSafe(self.inbox.settle.clone()))
                .bind(EntryState::Done.as_str())
                .bind(Attempt::encode_history(history)),
        };
        statement
            .bind(lease.key().namespace())
            .bind(lease.key().value())
            .bind(lease.token().to_i64())
    }
}

/// A fenced statement that matched no row: the lease is lost.
fn held(matched: u64) -> Result<(), StoreError> {
    match matched {
        0 => Err(StoreError::LeaseLost),
        _ => Ok(()),
    }
}

/// An enqueue is one statement (MariaDB 10.5+), or an insert and, for a duplicate, a read
/// (MySQL); a take is one transaction. See the [module docs](crate::store::mysql#inbox).
impl InboxStore for MySqlStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        let flavor = self.flavor().await?;
        let bytes = request.encode();
        let mut tries = 0;
        loop {
            tries += 1;
            match self.enqueue_once(flavor, key, &bytes).await {
                Ok(Some(enqueued)) => return Ok(enqueued),
                Ok(None) if tries < ATTEMPTS => {}
                Ok(None) => {
                    return Err(StoreError::backend(
                        "the inbox entry vanished between the insert and the read, three times",
                    ));
                }
                Err(e) if tries < ATTEMPTS && deadlocked(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `SELECT … FOR UPDATE SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+) of the due entries,
    /// in a READ COMMITTED transaction; a deadlock's victim runs again, up to three times.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        if take.limit() == 0 {
            return Ok(Vec::new());
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self.take_once(take).await {
                Err(e) if tries < ATTEMPTS && deadlocked(&e) => {}
                taken => return taken,
            }
        }
    }

    /// One transaction, one `UPDATE` per lease.
    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.table.pool.begin().await.store()?;
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            let done = sqlx::query(AssertSqlSafe(self.inbox.start.clone()))
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

    /// One transaction, one `UPDATE` per token.
    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let mut tx = self.table.pool.begin().await.store()?;
        let mut given = 0;
        for token in tokens {
            given += sqlx::query(AssertSqlSafe(self.inbox.untake.clone()))
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
        held(
            self.on_entry(&self.inbox.renew, lease.key(), Some(lease.token()))
                .await?,
        )
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        let done = self
            .settling(lease, settlement, history)
            .execute(&self.table.pool)
            .await
            .store()?;
        held(done.rows_affected())
    }

    /// One transaction, one `UPDATE` per settlement: the batch waits for one flush of the
    /// redo log, not one each.
    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        if batch.len() < 2 {
            return crate::store::inbox::settle_each(self, batch).await;
        }
        let written = async {
            let mut tx = self.table.pool.begin().await.store()?;
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
        let wants = |state| states.is_empty() || states.contains(&state);
        let rows = sqlx::query(AssertSqlSafe(self.inbox.entries.clone()))
            .bind(namespace)
            .bind(namespace)
            .bind(wants(EntryState::Queued))
            .bind(wants(EntryState::Running))
            .bind(wants(EntryState::Done))
            .bind(wants(EntryState::Dead))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.table.pool)
            .await
            .store()?;
        rows.iter().map(describe).collect()
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox.entry.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.table.pool)
            .await
            .store()?;
        row.as_ref().map(describe).transpose()
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        let bytes: Option<Option<Vec<u8>>> =
            sqlx::query_scalar(AssertSqlSafe(self.inbox.request.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .fetch_optional(&self.table.pool)
                .await
                .store()?;
        bytes
            .flatten()
            .map(|bytes| StoredRequest::decode(&bytes))
            .transpose()
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.by_hand(&self.inbox.retry_now, key, running).await
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.inbox.retry_dead.clone()))
            .bind(namespace)
            .execute(&self.table.pool)
            .await
            .store()?;
        Ok(done.rows_affected())
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        self.by_hand(&self.inbox.discard, key, running).await
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(self.inbox.stats.clone()))
            .bind(namespace)
            .bind(namespace)
            .fetch_all(&self.table.pool)
            .await
            .store()?;
        let (mut queued, mut running, mut dead, mut oldest_due) = (0, 0, 0, None);
        for row in &rows {
            let state: String = row.try_get(0).store()?;
            let n = u64::try_from(row.try_get::<i64, _>(1).store()?).unwrap_or(0);
            match state_of(&state)? {
                EntryState::Queued => {
                    queued = n;
                    let due_for: Option<i64> = row.try_get(2).store()?;
                    oldest_due = due_for.map(duration_from_micros);
                }
                EntryState::Running => running = n,
                EntryState::Dead => dead = n,
                EntryState::Done => {}
            }
        }
        Ok(InboxStats::new(queued, running, dead, oldest_due))
    }

    /// Two statements, each at READ COMMITTED (InnoDB then locks no gap of the index it
    /// walks, and keeps no lock on a row it passes over).
    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        if limit == 0 {
            return Ok(Purged::default());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conn = self.table.pool.acquire().await.store()?;
        // Each part in a transaction of its own: pick with SKIP LOCKED, then change the rows
        // picked, one statement each (a batch is at most `limit` rows).
        let mut purge =
            async |pick: &std::sync::Arc<str>, change: &std::sync::Arc<str>, after: Duration| {
                sqlx::raw_sql(READ_COMMITTED)
                    .execute(&mut *conn)
                    .await
                    .store()?;
                let mut tx = sqlx::Connection::begin(&mut *conn).await.store()?;
                let picked: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(pick.clone()))
                    .bind(micros(after))
                    .bind(micros(after))
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?;
                let mut changed = 0;
                for (namespace, key) in &picked {
                    let done = sqlx::query(AssertSqlSafe(change.clone()))
                        .bind(namespace)
                        .bind(key)
                        .execute(&mut *tx)
                        .await
                        .store()?;
                    changed += done.rows_affected();
                }
                tx.commit().await.store()?;
                Ok::<_, StoreError>(changed)
            };
        let requests = purge(
            &self.inbox.purge_requests,
            &self.inbox.purge_request_of,
            requests_after,
        )
        .await?;
        let entries = purge(
            &self.inbox.purge_entries,
            &self.inbox.purge_entry_of,
            entries_after,
        )
        .await?;
        Ok(Purged::new(requests, entries))
    }
}
