//! The ledger on the SQL databases: a table of records, `<table>_ledger`, numbered in place
//! by the publisher, and a table of checkpoints, `<table>_ledger_cp`, beside the claims'
//! table. What the backends share is here; each writes its statements.

/// Inside a backend's `impl LedgerStore`, the methods every SQL backend runs the same way: a
/// `pool` field, and `sql` holding the statements `records`, `timeline`, `save` and `latest`.
macro_rules! shared_reads {
    () => {
        async fn records(
            &self,
            from: u64,
            to: u64,
        ) -> Result<Vec<crate::ledger::audit::Logged>, crate::store::StoreError> {
            let rows: Vec<(i64, Vec<u8>, Option<Vec<u8>>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(self.sql.records.as_str()))
                    .bind(super::to_i64(from))
                    .bind(super::to_i64(to))
                    .fetch_all(&self.pool)
                    .await
                    .store()?;
            Ok(rows
                .into_iter()
                .map(|(seq, record, leaf)| super::logged(seq, record, leaf))
                .collect())
        }

        async fn timeline(
            &self,
            key: &crate::key::IdempotencyKey,
        ) -> Result<Vec<crate::ledger::record::Record>, crate::store::StoreError> {
            let rows: Vec<(Vec<u8>,)> =
                sqlx::query_as(sqlx::AssertSqlSafe(self.sql.timeline.as_str()))
                    .bind(key.namespace().to_owned())
                    .bind(key.value().to_owned())
                    .fetch_all(&self.pool)
                    .await
                    .store()?;
            rows.iter()
                .map(|(bytes,)| {
                    crate::ledger::record::Record::decode(bytes)
                        .map_err(crate::store::StoreError::backend)
                })
                .collect()
        }

        async fn save_checkpoint(
            &self,
            checkpoint: &crate::ledger::log::StoredCheckpoint,
        ) -> Result<(), crate::store::StoreError> {
            sqlx::query(sqlx::AssertSqlSafe(self.sql.save.as_str()))
                .bind(super::to_i64(checkpoint.frontier.size()))
                .bind(checkpoint.note.clone())
                .bind(super::heads(&checkpoint.frontier))
                .execute(&self.pool)
                .await
                .store()?;
            Ok(())
        }

        async fn latest_checkpoint(
            &self,
        ) -> Result<Option<crate::ledger::log::StoredCheckpoint>, crate::store::StoreError> {
            let row: Option<(String, i64, Vec<u8>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(self.sql.latest.as_str()))
                    .fetch_optional(&self.pool)
                    .await
                    .store()?;
            row.map(|(note, size, frontier)| super::checkpoint(note, size, &frontier))
                .transpose()
        }
    };
}
use shared_reads;

#[cfg(feature = "postgres")]
pub(super) mod postgres;
#[cfg(feature = "sqlite")]
pub(super) mod sqlite;

use super::audit::Logged;
use super::log::StoredCheckpoint;
use super::merkle::{Frontier, Hash};
use crate::store::StoreError;
use crate::store::sql::TableName;

/// The ledger's tables and the names of their indexes, from the claims' table name (at most
/// 49 bytes: every name here stays within 63).
struct Names {
    /// `<table>_ledger`.
    records: TableName,
    /// `<table>_ledger_cp`.
    checkpoints: TableName,
    /// `<table>_ldg_key`: a key's records, by id.
    by_key: String,
    /// `<table>_ldg_seq`: the records by number, unique; the ones not numbered yet are its
    /// NULLs, which the publisher reads (a few: what arrived since it last published).
    by_seq: String,
}

impl Names {
    fn of(table: &TableName) -> Self {
        Self {
            records: table.suffixed("_ledger"),
            checkpoints: table.suffixed("_ledger_cp"),
            by_key: format!("{}_ldg_key", table.bare()),
            by_seq: format!("{}_ldg_seq", table.bare()),
        }
    }
}

/// A numbered record as read back: a number, bytes and a leaf hash that may have been
/// changed by anyone who can write to the table. A leaf of the wrong length reads as zeros,
/// which no record matches.
fn logged(seq: i64, record: Vec<u8>, leaf: Option<Vec<u8>>) -> Logged {
    Logged {
        seq: u64::try_from(seq).unwrap_or(u64::MAX),
        record,
        leaf: leaf
            .and_then(|leaf| Hash::try_from(leaf).ok())
            .unwrap_or([0; 32]),
    }
}

/// A checkpoint as read back: the note, the size and the frontier's heads, one after the
/// other.
fn checkpoint(note: String, size: i64, heads: &[u8]) -> Result<StoredCheckpoint, StoreError> {
    let size =
        u64::try_from(size).map_err(|_| StoreError::backend("a negative checkpoint size"))?;
    let heads: Vec<Hash> = heads
        .chunks(32)
        .map(|head| Hash::try_from(head).map_err(|_| ()))
        .collect::<Result<_, _>>()
        .map_err(|()| StoreError::backend("a checkpoint's frontier is not whole hashes"))?;
    let frontier = Frontier::from_parts(size, heads)
        .ok_or_else(|| StoreError::backend("a checkpoint's frontier does not fit its size"))?;
    Ok(StoredCheckpoint { note, frontier })
}

/// The frontier's heads, one after the other.
fn heads(frontier: &Frontier) -> Vec<u8> {
    frontier.heads().concat()
}

/// A number as the databases keep it.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
