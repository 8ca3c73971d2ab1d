//! The ledger in this process's memory: for tests, and a single instance that keeps no
//! evidence across restarts.

use std::sync::{Arc, Mutex, MutexGuard};

use super::audit::Logged;
use super::log::{LedgerStore, StoredCheckpoint};
use super::record::Record;
use crate::key::IdempotencyKey;
use crate::store::StoreError;

/// A [`LedgerStore`] in memory. Clones share the log.
#[derive(Clone, Debug, Default)]
pub struct MemoryLedger {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Appended, not numbered yet, oldest first.
    pending: Vec<Record>,
    /// Numbered, by number.
    log: Vec<Logged>,
    checkpoints: Vec<StoredCheckpoint>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The numbered records as stored, to change by hand: what someone with write access to
    /// a database could do. For tests of tamper evidence.
    #[doc(hidden)]
    pub fn edit_log(&self, edit: impl FnOnce(&mut Vec<Logged>)) {
        edit(&mut self.inner().log);
    }
}

impl LedgerStore for MemoryLedger {
    async fn append(&self, records: &[Record]) -> Result<(), StoreError> {
        self.inner().pending.extend_from_slice(records);
        Ok(())
    }

    async fn sequence(&self, limit: usize) -> Result<Vec<Logged>, StoreError> {
        let mut inner = self.inner();
        let take = limit.min(inner.pending.len());
        let next = inner
            .log
            .iter()
            .map(|logged| logged.seq + 1)
            .max()
            .unwrap_or(0);
        let numbered: Vec<Logged> = inner
            .pending
            .drain(..take)
            .zip(next..)
            .map(|(record, seq)| Logged::new(seq, record.encode()))
            .collect();
        inner.log.extend(numbered.iter().cloned());
        Ok(numbered)
    }

    async fn records(&self, from: u64, to: u64) -> Result<Vec<Logged>, StoreError> {
        let inner = self.inner();
        Ok(inner
            .log
            .iter()
            .filter(|logged| logged.seq >= from && logged.seq < to)
            .cloned()
            .collect())
    }

    async fn timeline(&self, key: &IdempotencyKey) -> Result<Vec<Record>, StoreError> {
        let inner = self.inner();
        let numbered = inner
            .log
            .iter()
            .filter_map(|logged| Record::decode(&logged.record).ok());
        Ok(numbered
            .chain(inner.pending.iter().cloned())
            .filter(|record| &record.key == key)
            .collect())
    }

    async fn save_checkpoint(&self, checkpoint: &StoredCheckpoint) -> Result<(), StoreError> {
        self.inner().checkpoints.push(checkpoint.clone());
        Ok(())
    }

    async fn latest_checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(self
            .inner()
            .checkpoints
            .iter()
            .max_by_key(|stored| stored.frontier.size())
            .cloned())
    }
}
