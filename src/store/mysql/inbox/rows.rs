//! Reading the inbox table's rows: the entries a take locked, and entries as operators see
//! them.

use std::time::Duration;

use sqlx::Row as _;
use sqlx::mysql::MySqlRow;

use crate::key::IdempotencyKey;
use crate::store::inbox::unreadable::{self, Unreadable};
use crate::store::inbox::{Attempt, Entry, EntryState, Taken};
use crate::store::sql::{ResultExt as _, duration_from_micros};
use crate::store::{Lease, LeaseToken, StoreError};

/// The state a row holds.
pub(super) fn state_of(text: &str) -> Result<EntryState, StoreError> {
    EntryState::parse(text)
        .ok_or_else(|| StoreError::backend(format!("unexpected state {text:?} in the inbox table")))
}

fn key_of(namespace: String, key: String) -> Result<IdempotencyKey, StoreError> {
    IdempotencyKey::new(namespace, key).map_err(StoreError::backend)
}

/// A count as the table keeps it (an `INT` never below zero).
fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

fn history(bytes: Option<&[u8]>) -> Result<Vec<Attempt>, StoreError> {
    Attempt::decode_history(bytes.unwrap_or_default())
}

/// A row a take locked.
pub(super) struct Locked {
    pub(super) namespace: String,
    pub(super) key: String,
    /// It was running, its handler started: its worker stopped renewing.
    pub(super) crashed: bool,
    pub(super) attempts: u32,
    crashes: u32,
    request: Option<Vec<u8>>,
    history: Option<Vec<u8>>,
    pub(super) due_us: i64,
    received_us: i64,
}

impl Locked {
    pub(super) fn read(row: &MySqlRow) -> Result<Self, StoreError> {
        let state: String = row.try_get(2).store()?;
        let started: bool = row.try_get(8).store()?;
        Ok(Self {
            namespace: row.try_get(0).store()?,
            key: row.try_get(1).store()?,
            crashed: state_of(&state)? == EntryState::Running && started,
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
    pub(super) fn taken(&self, token: LeaseToken) -> Result<Result<Taken, Unreadable>, StoreError> {
        let key = key_of(self.namespace.clone(), self.key.clone())?;
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

/// An entry as `entries` and `entry` read it.
pub(super) fn describe(row: &MySqlRow) -> Result<Entry, StoreError> {
    let key = key_of(row.try_get(0).store()?, row.try_get(1).store()?)?;
    let state = state_of(row.try_get(2).store()?)?;
    let age = |i: usize| -> Result<Option<Duration>, StoreError> {
        let us: Option<i64> = row.try_get(i).store()?;
        Ok(us.map(duration_from_micros))
    };
    let has_request: i64 = row.try_get(8).store()?;
    let bytes: Option<&[u8]> = row.try_get(9).store()?;
    Ok(Entry::new(
        key,
        state,
        count(row.try_get(3).store()?),
        count(row.try_get(4).store()?),
        age(5)?.unwrap_or_default(),
        age(6)?,
        age(7)?,
        has_request != 0,
        history(bytes)?,
    ))
}
