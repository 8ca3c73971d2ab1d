//! What the SQL backends share.
//!
//! Each backend writes its own SQL (`queries` in its folder) and its own `impl Store`; the
//! statements that are run the same way on every database (bind the key, run, count the rows)
//! are the methods of [`Table`], written once over sqlx's [`Database`]. What sqlx's trait does
//! not say, and these need, is [`Backend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Database, Executor, Pool, Row as _};

mod backend;
mod forward;
mod inbox;
mod purge;
mod queries;
mod rows;
mod table;
mod tally;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod upsert;
mod versions;
mod writer;

pub(crate) use super::tally::CHUNK as TALLY_CHUNK;
use super::tally::Tally;
pub(crate) use backend::Backend;
use backend::Statement;
pub(crate) use forward::{
    inbox_forwards, statements, store_forwards, table_handles, to_table, version_forwards,
};
#[cfg(feature = "postgres")]
pub(crate) use inbox::settlement;
pub(crate) use queries::{
    Bounded, InboxPurge, InboxQueries, Purge, Queries, VersionQueries, statement_set,
};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use rows::taken_entry;
pub(crate) use rows::{
    ClaimRow, NEVER_STALE, NewKeys, duration_from_micros, entry_state, inbox_entry, key_record,
    micros, stuck_claim, undecodable_stuck_row, version_claim, version_row,
};
pub(crate) use table::TableName;
pub(crate) use writer::Writer;

use super::batch::{BatchFailed, NotSent};
use super::{
    Claim, KeyRecord, KeyState, Lease, LeaseToken, Resolution, Stale, StalePolicy, StoreError,
    StuckClaim,
};
use crate::key::IdempotencyKey;

/// How many rows a purge deletes at most in one statement.
pub(crate) const PURGE_BATCH: u32 = 1_000;

/// A store's table on its pool: the pool, the statements the backend wrote for the table, and
/// the deliveries answered without writing that are not written yet. Clones share all three.
pub(crate) struct Table<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: Arc<Queries>,
    tally: Arc<Tally>,
    /// Where a database with one writer at a time (SQLite) queues its writes.
    writer: Writer,
}

impl<DB: Database> Clone for Table<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            tally: self.tally.clone(),
            writer: self.writer.clone(),
        }
    }
}

/// What a claim does after reading the key's row.
pub(crate) enum AfterRead {
    /// Answer this, having written nothing: a done key, or one in flight or held (the delivery
    /// is counted in the tally); or the claim acquired by the read's own insert.
    Answer(Claim),
    /// Take the row over (it is released, or stale under a reclaiming policy) with the
    /// backend's upsert.
    TakeOver,
    /// There is no row.
    Absent,
}

impl<DB: Database> Table<DB> {
    pub(crate) fn new(pool: Pool<DB>, sql: Queries) -> Self {
        Self {
            pool,
            sql: Arc::new(sql),
            tally: Arc::default(),
            writer: Writer::default(),
        }
    }

    /// The same pool and writer queue on other statements (another table), with a tally of
    /// its own.
    pub(crate) fn with_queries(self, sql: Queries) -> Self {
        Self {
            sql: Arc::new(sql),
            tally: Arc::new(self.tally.like()),
            ..self
        }
    }

    /// The same table, its writes queued in `writer`.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn writing_through(self, writer: Writer) -> Self {
        Self { writer, ..self }
    }

    /// Waits for this table's turn to write (a database with one writer at a time, SQLite,
    /// queues the writes of the process); the turn lasts as long as what this answers. For
    /// writes the backend runs itself, a transaction of several statements say.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.writer.turn().await
    }

    /// Whether no write of this process holds or waits for the writer's turn, now.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn writer_idle(&self) -> bool {
        self.writer.idle()
    }

    /// The same table, whose deliveries answered without writing are written every `every`.
    pub(crate) fn count_every(self, every: Duration) -> Self {
        Self {
            tally: Arc::new(Tally::every(every)),
            ..self
        }
    }

    /// The `Debug` of the store `name` on this table.
    pub(crate) fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("table", &self.sql.table.name())
            .field("pool", &self.pool)
            .finish()
    }
}

statements! {
    /// Runs a write, in the writer's turn, and counts the rows it changed.
    async fn write(&self, query: Statement<'_, DB>) -> Result<u64, StoreError> {
        let _turn = self.writer.turn().await;
        let done = query.execute(&self.pool).await.store()?;
        Ok(DB::rows_affected(&done))
    }

    /// Runs `sql` with (namespace, key[, token]) and counts the rows it changed.
    async fn on_key(
        &self,
        sql: &Arc<str>,
        key: &IdempotencyKey,
        token: Option<LeaseToken>,
    ) -> Result<u64, StoreError> {
        let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value());
        if let Some(token) = token {
            query = query.bind(token.to_i64());
        }
        self.write(query).await
    }

    /// Runs a statement fenced by `token` on the row of `key`: no row changed means the lease
    /// is lost.
    async fn fenced(
        &self,
        sql: &Arc<str>,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<(), StoreError> {
        held(self.on_key(sql, key, Some(token)).await?)
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.renew, lease.key(), lease.token())
            .await
    }

    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.release, lease.key(), lease.token())
            .await
    }

    pub(crate) async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&self.sql.give_back, lease.key(), lease.token())
            .await
    }

    /// The claim statement that wrote `token` failed with `error`, perhaps after the database
    /// ran it: whatever it granted is given back in the background
    /// ([`give_back_unanswered`](crate::store::give_back_unanswered)). A statement that never
    /// left the pool (no connection could be had) granted nothing, and costs a failing store
    /// no further statement.
    pub(crate) fn unanswered(&self, key: &IdempotencyKey, token: LeaseToken, error: &StoreError) {
        if never_sent(error) {
            return;
        }
        let table = self.clone();
        crate::store::give_back_unanswered(key, token, move |lease| {
            let table = table.clone();
            async move { table.give_back(&lease).await }
        });
    }

    pub(crate) async fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.describe.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        let Some(mut record) = row.as_ref().map(key_record).transpose()? else {
            return Ok(None);
        };
        self.tally.include(key, &mut record);
        Ok(Some(record))
    }

    /// Reads the row of `key` as a claim sees it (the seven columns of [`ClaimRow`]).
    pub(crate) async fn read_claim(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<ClaimRow>, StoreError> {
        self.read_claim_on(&self.pool, key).await
    }

    /// [`read_claim`](Self::read_claim) on the connection `on`.
    pub(crate) async fn read_claim_on<'c, E: Executor<'c, Database = DB>>(
        &self,
        on: E,
        key: &IdempotencyKey,
    ) -> Result<Option<ClaimRow>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.read.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_optional(on)
            .await
            .store()?;
        row.as_ref().map(ClaimRow::read).transpose()
    }

    /// What a claim of `key` does with the row its first statement found. `ours` is the token
    /// the claim wrote if an insert of its own made the row (PostgreSQL's insert-or-read,
    /// SQLite's insert first), so that a row holding it is the claim's.
    pub(crate) fn after_read(
        &self,
        key: &IdempotencyKey,
        row: Option<ClaimRow>,
        ours: Option<LeaseToken>,
        stale: Stale,
    ) -> Result<AfterRead, StoreError> {
        let Some(mut row) = row else {
            return Ok(AfterRead::Absent);
        };
        if let Some(ours) = ours.filter(|ours| LeaseToken::from_i64(row.token) == *ours) {
            let deliveries = u64::try_from(row.deliveries).unwrap_or(0);
            return Ok(AfterRead::Answer(Claim::Acquired(
                Lease::new(key.clone(), ours, false).with_deliveries(deliveries),
            )));
        }
        let free = match KeyState::parse(&row.state) {
            Some(KeyState::Released) => true,
            Some(KeyState::Processing) => {
                stale.policy() == StalePolicy::Reclaim
                    && stale.is_stale(duration_from_micros(row.idle_us))
            }
            _ => false,
        };
        if free {
            return Ok(AfterRead::TakeOver);
        }
        let unwritten = self.count(key);
        row.deliveries = row
            .deliveries
            .saturating_add(i64::try_from(unwritten).unwrap_or(i64::MAX));
        row.answer(stale).map(AfterRead::Answer)
    }

    /// Counts a delivery answered without writing; answers how many of the key's deliveries
    /// are unwritten now, this one included.
    fn count(&self, key: &IdempotencyKey) -> u64 {
        self.tally.count(key, || {
            let (pool, sql, writer) = (self.pool.clone(), self.sql.clone(), self.writer.clone());
            move |chunk| {
                let (pool, sql, writer) = (pool.clone(), sql.clone(), writer.clone());
                async move { tally::write(&pool, &sql, &writer, &chunk).await }
            }
        })
    }

    /// Writes every count of the tally now.
    pub(crate) async fn write_counts(&self) -> Result<(), StoreError> {
        let (pool, sql, writer) = (&self.pool, &self.sql, &self.writer);
        self.tally
            .write_round(|chunk| async move { tally::write(pool, sql, writer, &chunk).await })
            .await
    }

    /// One row the store cannot read (a key written by hand, or by other code, that is no
    /// valid `IdempotencyKey`) is logged and skipped: it must not hide every other stuck claim.
    pub(crate) async fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> Result<Vec<StuckClaim>, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.stuck.clone()))
            .bind(micros(older_than))
            .fetch_all(&self.pool)
            .await
            .store()?;
        let decode = |row: &DB::Row| {
            stuck_claim(
                row.try_get(0).store()?,
                row.try_get(1).store()?,
                row.try_get(2).store()?,
                row.try_get(3).store()?,
                row.try_get(4).store()?,
            )
        };
        Ok(rows
            .iter()
            .filter_map(|row| match decode(row) {
                Ok(mut claim) => {
                    claim.deliveries += self.tally.unwritten(&claim.key);
                    Some(claim)
                }
                Err(error) => {
                    let (namespace, key) = (row.try_get(0).ok(), row.try_get(1).ok());
                    undecodable_stuck_row(&self.sql.table, namespace, key, &error);
                    None
                }
            })
            .collect())
    }

    pub(crate) async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let changed = match resolution {
            // A new token fences off the old owner, whose late commit must not undo what the
            // person decided.
            Resolution::Done => {
                let query = sqlx::query(AssertSqlSafe(self.sql.resolve_done.clone()))
                    .bind(LeaseToken::generate().to_i64())
                    .bind(key.namespace())
                    .bind(key.value());
                self.write(query).await?
            }
            Resolution::Release => self.on_key(&self.sql.resolve_release, key, None).await?,
        };
        Ok(changed > 0)
    }

    /// Runs `sql` on `conn`, one statement or several, as it is (no parameters): a
    /// migration's steps.
    pub(crate) async fn script<Sql>(
        &self,
        conn: &mut DB::Connection,
        sql: Sql,
    ) -> Result<(), StoreError>
    where
        AssertSqlSafe<Sql>: sqlx::SqlSafeStr,
    {
        let ran = sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await;
        ran.store().map(drop)
    }

    /// Transactional mode, just before `COMMIT`: whether the transaction on `conn` still
    /// holds the marker of `key` with `token`.
    pub(crate) async fn holds_marker(
        &self,
        conn: &mut DB::Connection,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<bool, StoreError> {
        let found = sqlx::query(AssertSqlSafe(self.sql.tx_check.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .fetch_optional(conn)
            .await
            .store()?;
        Ok(found.is_some())
    }
}

/// What a statement fenced by a lease answers: no row changed (or matched) means the lease is
/// lost.
pub(crate) fn held(changed: u64) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::LeaseLost),
        _ => Ok(()),
    }
}

/// The one row a write's `RETURNING` answers, from every row it answered.
///
/// Fetched whole (`fetch_all`), not with `fetch_one`: SQLite commits a statement that runs
/// outside a transaction only once it has been stepped to its end, and sqlx, which stops
/// stepping after the first row `fetch_one` asks for, finishes it while resetting it and drops
/// what the reset answers, a failed commit included. Stepped to its end, the statement has
/// committed (and synced) before its row is read, or answers the error.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn returned<R>(rows: Vec<R>) -> Result<R, StoreError> {
    rows.into_iter()
        .next()
        .ok_or_else(|| StoreError::backend("the write returned no row"))
}

/// A statement that failed to serialize with concurrent ones twice in a row: PostgreSQL's
/// SQLSTATE 40001, which a claim meets only when the connection's isolation is stricter than
/// READ COMMITTED (`default_transaction_isolation` set on the role, the database or the pool's
/// connections).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, thiserror::Error)]
#[error(
    "the {what} failed to serialize with concurrent deliveries of the same key twice in a row \
     (SQLSTATE 40001): the connection's default isolation is stricter than READ COMMITTED"
)]
pub(crate) struct SerializationFailure {
    what: &'static str,
    #[source]
    source: sqlx::Error,
}

/// The longest pause before the second attempt of a statement that failed to serialize.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
const SERIALIZATION_JITTER_US: u64 = 20_000;

/// Runs `statement`, and once more if it failed as `is_serialization_failure` says: a second
/// attempt starts after the concurrent statement that made the first fail has committed, so
/// it sees that row. A second failure of the same kind is a [`SerializationFailure`].
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn retry_serialization_failure<T, F, Fut>(
    what: &'static str,
    is_serialization_failure: fn(&sqlx::Error) -> bool,
    mut statement: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    match statement().await {
        Err(first) if is_serialization_failure(&first) => {
            tracing::debug!(
                error = &first as &dyn std::error::Error,
                "the {what} failed to serialize; trying it once more"
            );
            // Every delivery that waited for the same row failed at once: a random pause
            // spreads their second attempts, which would otherwise collide again.
            let pause = LeaseToken::generate().to_i64().unsigned_abs() % SERIALIZATION_JITTER_US;
            tokio::time::sleep(Duration::from_micros(pause)).await;
            match statement().await {
                Err(source) if is_serialization_failure(&source) => {
                    Err(StoreError::backend(SerializationFailure { what, source }))
                }
                again => again.store(),
            }
        }
        first => first.store(),
    }
}

/// Maps a backend result's error into a [`StoreError`], keeping the source.
pub(crate) trait ResultExt<T> {
    fn store(self) -> Result<T, StoreError>;
}

/// Whether `error` is the pool's: no connection was had, so no statement was sent.
fn never_sent(error: &StoreError) -> bool {
    let StoreError::Backend(source) = error else {
        return false;
    };
    let pool = |error: &(dyn std::error::Error + 'static)| {
        matches!(
            error.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
        ) || error.is::<NotSent>()
    };
    pool(&**source)
        || source
            .downcast_ref::<BatchFailed>()
            .is_some_and(|failed| pool(failed.cause()))
}

impl<T> ResultExt<T> for Result<T, sqlx::Error> {
    fn store(self) -> Result<T, StoreError> {
        self.map_err(StoreError::backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pools_own_errors_were_never_sent() {
        assert!(never_sent(&StoreError::backend(sqlx::Error::PoolTimedOut)));
        assert!(never_sent(&StoreError::backend(sqlx::Error::PoolClosed)));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!never_sent(&StoreError::backend(sqlx::Error::Io(io))));
        assert!(!never_sent(&StoreError::backend("a statement timed out")));
        assert!(!never_sent(&StoreError::LeaseLost));
    }
}
