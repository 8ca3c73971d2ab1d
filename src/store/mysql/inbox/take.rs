//! MySQL's take: one transaction that locks the due entries (and the stale ones), decides in
//! the process which of them it leases and under which token, and updates them in one
//! statement.

use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Row as _};

use super::MySqlStore;
use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable::{self, Unreadable};
use crate::store::inbox::{EntryState, Take, Taken};
use crate::store::sql::{ResultExt as _, duration_from_micros, entry_state, micros};
use crate::store::{Lease, LeaseToken, StalePolicy, StoreError};

/// Run first on the take's connection: under READ COMMITTED InnoDB locks no gaps, and keeps
/// no lock on a row the take read but did not choose.
const BEGIN_TAKE: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN";

impl MySqlStore {
    /// One try at a take, in one transaction: lock the due entries (and the stale ones, under
    /// reclaim), decide, update them in one statement, commit.
    pub(super) async fn take_once(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
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
}

/// A count as the table keeps it (an `INT` never below zero).
fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// A row a take locked.
struct Locked {
    namespace: String,
    key: String,
    /// It was running, its handler started: its worker stopped renewing.
    crashed: bool,
    attempts: u32,
    crashes: u32,
    request: Option<Vec<u8>>,
    history: Option<Vec<u8>>,
    due_us: i64,
    received_us: i64,
}

impl Locked {
    fn read(row: &MySqlRow) -> Result<Self, StoreError> {
        let state: String = row.try_get(2).store()?;
        let started: bool = row.try_get(8).store()?;
        Ok(Self {
            namespace: row.try_get(0).store()?,
            key: row.try_get(1).store()?,
            crashed: entry_state(&state)? == EntryState::Running && started,
            attempts: count(row.try_get(3).store()?),
            crashes: count(row.try_get(4).store()?),
            request: row.try_get(5).store()?,
            history: row.try_get(6).store()?,
            due_us: row.try_get(7).store()?,
            received_us: row.try_get(9).store()?,
        })
    }

    /// What the worker gets, under `token`: the entry, or one whose stored request cannot be
    /// read.
    fn taken(&self, token: LeaseToken) -> Result<Result<Taken, Unreadable>, StoreError> {
        let key = IdempotencyKey::new(self.namespace.clone(), self.key.clone())
            .map_err(StoreError::backend)?;
        Ok(unreadable::taken(
            Lease::new(key, token, self.crashed),
            self.request.as_deref(),
            self.attempts.saturating_add(1),
            self.crashes + u32::from(self.crashed),
            std::time::UNIX_EPOCH + duration_from_micros(self.received_us),
            self.history.as_deref(),
        ))
    }
}
