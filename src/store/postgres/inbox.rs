//! The inbox on PostgreSQL: [`InboxStore`] for [`PostgresStore`], in the table
//! `<table>_inbox` (see the [module docs](crate::store::postgres#inbox) for the SQL).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row as _};

use super::{PostgresStore, is_serialization_failure};
use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable::{self, Unreadable};
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running, Settlement,
    Settling, StoredRequest, Take, Taken, Wake,
};
use crate::store::sql::{
    ResultExt as _, duration_from_micros, micros, retry_serialization_failure,
};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

mod herald;
mod queries;
mod watch;

pub(crate) use herald::Herald;

pub(super) use queries::{InboxQueries, inbox_queries};

/// The most entries one take leases: a bound on the tokens sent with the statement.
const TAKE_LIMIT: usize = 10_000;

fn key_of(namespace: String, key: String) -> Result<IdempotencyKey, StoreError> {
    IdempotencyKey::new(namespace, key).map_err(StoreError::backend)
}

fn state_of(text: &str) -> Result<EntryState, StoreError> {
    EntryState::parse(text).ok_or_else(|| {
        StoreError::backend(format!("an inbox entry is in an unknown state {text:?}"))
    })
}

/// A count read from an `INTEGER` column; a negative one (written by hand) reads as zero.
fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

fn history_of(bytes: Option<&[u8]>) -> Result<Vec<Attempt>, StoreError> {
    Attempt::decode_history(bytes.unwrap_or_default())
}

/// A limit as the statements bind it.
fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Reads the columns of an entry's description: namespace, key, state, attempts, crashes,
/// age, due in, since renewal (microseconds), whether the request is kept, history.
fn entry_of(row: &PgRow) -> Result<Entry, StoreError> {
    let key = key_of(row.try_get(0).store()?, row.try_get(1).store()?)?;
    let state = state_of(row.try_get(2).store()?)?;
    let micros_at = |i: usize| -> Result<Option<Duration>, StoreError> {
        Ok(row
            .try_get::<Option<i64>, _>(i)
            .store()?
            .map(duration_from_micros))
    };
    Ok(Entry::new(
        key,
        state,
        count(row.try_get(3).store()?),
        count(row.try_get(4).store()?),
        micros_at(5)?.unwrap_or_default(),
        micros_at(6)?,
        micros_at(7)?,
        row.try_get(8).store()?,
        history_of(row.try_get(9).store()?)?,
    ))
}

/// Reads what the take answers for one leased entry: namespace, key, token, attempts,
/// crashes, whether it was taken over after a crash, request, history, when it was received
/// (microseconds since the epoch).
fn taken_of(row: &PgRow) -> Result<Result<Taken, Unreadable>, StoreError> {
    let key = key_of(row.try_get(0).store()?, row.try_get(1).store()?)?;
    let token = LeaseToken::from_i64(row.try_get(2).store()?);
    Ok(unreadable::taken(
        Lease::new(key, token, row.try_get(5).store()?),
        row.try_get(6).store()?,
        count(row.try_get(3).store()?).saturating_add(1),
        count(row.try_get(4).store()?),
        epoch_micros(row.try_get(8).store()?),
        row.try_get(7).store()?,
    ))
}

/// A time given as microseconds since the Unix epoch.
fn epoch_micros(us: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + duration_from_micros(us)
}

impl PostgresStore {
    /// Runs a retry statement, its parameters bound, answering how many entries it made due.
    async fn retry_with(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<u64, StoreError> {
        let retried: i64 = query
            .fetch_one(self.pool())
            .await
            .store()?
            .try_get(0)
            .store()?;
        Ok(u64::try_from(retried).unwrap_or(0))
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
        let sql = &self.inbox;
        // The row the insert ran into may be missing from the statement's snapshot, and (in
        // theory) purged before a second read.
        for _ in 0..3 {
            let state: Option<String> = match self.insert_entry(key, &bytes).await? {
                Some((_, true)) => {
                    self.herald.poke(self.pool(), &sql.herald);
                    return Ok(Enqueued::Stored);
                }
                Some((state, false)) => Some(state),
                None => sqlx::query_scalar(AssertSqlSafe(sql.state.clone()))
                    .bind(key.namespace())
                    .bind(key.value())
                    .fetch_optional(self.pool())
                    .await
                    .store()?,
            };
            if let Some(state) = state {
                return Ok(Enqueued::Duplicate(state_of(&state)?));
            }
        }
        Err(StoreError::backend(
            "the key's inbox entry vanished between its insert and its read, three times",
        ))
    }

    /// One statement, tried once more after a serialization failure. Should an entry it
    /// leased be unreadable, the others are given back and the error answered; the unreadable
    /// one stays running, to be taken over (and, past its attempts, to die) or held.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        let n = take.limit().min(TAKE_LIMIT);
        if n == 0 {
            return Ok(Vec::new());
        }
        let tokens: Vec<i64> = take.tokens[..n].iter().map(|t| t.to_i64()).collect();
        let max_attempts = i32::try_from(take.max_attempts).unwrap_or(i32::MAX);
        let statement = || {
            sqlx::query(AssertSqlSafe(self.inbox.take.clone()))
                .bind(limit(n))
                .bind(take.stale.policy() == StalePolicy::Reclaim)
                .bind(micros(take.stale.after()))
                .bind(max_attempts)
                .bind(tokens.as_slice())
                .fetch_all(self.pool())
        };
        let rows = retry_serialization_failure("take", is_serialization_failure, statement).await?;
        let mut taken = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        let mut damaged = None;
        for row in &rows {
            match taken_of(row) {
                Ok(Ok(entry)) => taken.push(entry),
                Ok(Err(entry)) => unreadable.push(entry),
                Err(error) => {
                    damaged.get_or_insert(error);
                }
            }
        }
        unreadable::bury(self, unreadable).await;
        if let Some(error) = damaged {
            for entry in &taken {
                let _ = self.settle(&entry.lease, &Settlement::GiveBack, &[]).await;
            }
            return Err(error);
        }
        Ok(taken)
    }

    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let namespaces: Vec<&str> = leases.iter().map(|l| l.key().namespace()).collect();
        let keys: Vec<&str> = leases.iter().map(|l| l.key().value()).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| l.token().to_i64()).collect();
        let started: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.inbox.start.clone()))
            .bind(namespaces)
            .bind(keys)
            .bind(&tokens)
            .fetch_all(self.pool())
            .await
            .store()?;
        Ok(tokens.iter().map(|t| started.contains(t)).collect())
    }

    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        let tokens: Vec<i64> = tokens.iter().map(|t| t.to_i64()).collect();
        let done = sqlx::query(AssertSqlSafe(self.inbox.give_back.clone()))
            .bind(tokens)
            .execute(self.pool())
            .await
            .store()?;
        Ok(done.rows_affected())
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.inbox.renew.clone()))
            .bind(lease.key().namespace())
            .bind(lease.key().value())
            .bind(lease.token().to_i64())
            .execute(self.pool())
            .await
            .store()?;
        held(done.rows_affected())
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        let (state, due_in, taken_back, history) = settled(settlement, history);
        let done = sqlx::query(AssertSqlSafe(self.inbox.settle.clone()))
            .bind(lease.key().namespace())
            .bind(lease.key().value())
            .bind(lease.token().to_i64())
            .bind(state.as_str())
            .bind(due_in)
            .bind(taken_back)
            .bind(history)
            .execute(self.pool())
            .await
            .store()?;
        held(done.rows_affected())
    }

    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        if batch.len() < 2 {
            return crate::store::inbox::settle_each(self, batch).await;
        }
        let mut columns = SettleColumns::default();
        for one in batch {
            let (state, due_in, taken_back, history) = settled(&one.settlement, &one.history);
            columns.namespaces.push(one.lease.key().namespace());
            columns.keys.push(one.lease.key().value());
            columns.tokens.push(one.lease.token().to_i64());
            columns.states.push(state.as_str());
            columns.due.push(due_in);
            columns.taken_back.push(taken_back);
            columns.histories.push(history);
        }
        let rows = sqlx::query(AssertSqlSafe(self.inbox.settle_many.clone()))
            .bind(columns.namespaces)
            .bind(columns.keys)
            .bind(columns.tokens)
            .bind(columns.states)
            .bind(columns.due)
            .bind(columns.taken_back)
            .bind(columns.histories)
            .fetch_all(self.pool())
            .await;
        let settled: std::collections::HashSet<(String, String, i64)> = match rows {
            Ok(rows) => rows
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect(),
            Err(error) => {
                let error = std::sync::Arc::new(error);
                return batch
                    .iter()
                    .map(|_| Err(StoreError::backend(SharedError(error.clone()))))
                    .collect();
            }
        };
        batch
            .iter()
            .map(|one| {
                let key = one.lease.key();
                let row = (
                    key.namespace().to_owned(),
                    key.value().to_owned(),
                    one.lease.token().to_i64(),
                );
                if settled.contains(&row) {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost)
                }
            })
            .collect()
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let states: Vec<&str> = states.iter().map(|state| state.as_str()).collect();
        let rows = sqlx::query(AssertSqlSafe(self.inbox.entries.clone()))
            .bind(namespace)
            .bind(states)
            .bind(self::limit(limit))
            .fetch_all(self.pool())
            .await
            .store()?;
        rows.iter().map(entry_of).collect()
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox.entry.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(self.pool())
            .await
            .store()?;
        row.as_ref().map(entry_of).transpose()
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox.request.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(self.pool())
            .await
            .store()?;
        let Some(row) = row else { return Ok(None) };
        row.try_get::<Option<&[u8]>, _>(0)
            .store()?
            .map(StoredRequest::decode)
            .transpose()
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        let (after, force) = by_hand(running);
        let query = sqlx::query(AssertSqlSafe(self.inbox.retry_now.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(after)
            .bind(force);
        Ok(self.retry_with(query).await? > 0)
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        let query = sqlx::query(AssertSqlSafe(self.inbox.retry_dead.clone())).bind(namespace);
        self.retry_with(query).await
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        let (after, force) = by_hand(running);
        let done = sqlx::query(AssertSqlSafe(self.inbox.discard.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(after)
            .bind(force)
            .execute(self.pool())
            .await
            .store()?;
        Ok(done.rows_affected() > 0)
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.inbox.stats.clone()))
            .bind(namespace)
            .fetch_one(self.pool())
            .await
            .store()?;
        let counted = |i: usize| -> Result<u64, StoreError> {
            Ok(u64::try_from(row.try_get::<i64, _>(i).store()?).unwrap_or(0))
        };
        let oldest: Option<i64> = row.try_get(3).store()?;
        Ok(InboxStats::new(
            counted(0)?,
            counted(1)?,
            counted(2)?,
            oldest.map(duration_from_micros),
        ))
    }

    /// Two statements: the requests, then the entries.
    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        let purge = |sql: &Arc<str>, after: Duration| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(micros(after))
                .bind(self::limit(limit))
                .execute(self.pool())
        };
        let requests = purge(&self.inbox.purge_requests, requests_after)
            .await
            .store()?
            .rows_affected();
        let entries = purge(&self.inbox.purge_entries, entries_after)
            .await
            .store()?
            .rows_affected();
        Ok(Purged::new(requests, entries))
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

/// A statement fenced by a lease that changed no row: the lease is lost.
fn held(changed: u64) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::LeaseLost),
        _ => Ok(()),
    }
}

/// What a settlement writes: the state, the next due time (microseconds from now), whether
/// the attempt is taken back (if it started), and the encoded history (none for a give-back,
/// which keeps it).
fn settled(
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

/// How an operator's action binds `running`: the microseconds without a renewal after which
/// a running entry may be taken (NULL: never), and whether it is taken whatever.
fn by_hand(running: Running) -> (Option<i64>, bool) {
    match running {
        Running::Leave => (None, false),
        Running::StaleFor(after) => (Some(micros(after)), false),
        Running::Force => (None, true),
    }
}

/// The columns of a batch of settlements, one array each.
#[derive(Default)]
struct SettleColumns<'a> {
    namespaces: Vec<&'a str>,
    keys: Vec<&'a str>,
    tokens: Vec<i64>,
    states: Vec<&'static str>,
    due: Vec<Option<i64>>,
    taken_back: Vec<bool>,
    histories: Vec<Option<Vec<u8>>>,
}

/// One database error, told to every settlement of the batch it failed.
#[derive(Debug)]
struct SharedError(std::sync::Arc<sqlx::Error>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
