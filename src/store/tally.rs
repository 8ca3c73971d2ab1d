//! The deliveries a claim answered without writing: counted in the process, written in the
//! background.
//!
//! A duplicate of a done key (or of one in flight) is answered from one read, which must not
//! wait for a disk flush. Its delivery still counts: the store adds it to this tally, which
//! [`describe`](crate::store::Store::describe) and the answers of later claims of the same key
//! include at once, and which a task writes to the store about once a second, a batch of keys
//! at a time (one `UPDATE` per batch on the SQL stores, one script per key on Redis). A crash
//! loses at most that second's counts of the instance; other instances see them once written.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::key::IdempotencyKey;
use crate::store::{KeyRecord, StoreError};

/// How often the counts are written, unless the store says otherwise.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// How many keys' counts one write takes: a SQL backend's `tally` statement has this many
/// rows of parameters (namespace, key, count, microseconds since the last), the unused ones
/// filled with a key that matches no row.
pub(crate) const CHUNK: usize = 64;

/// One statement's worth of counts.
pub(crate) type Chunk = Vec<(IdempotencyKey, Seen)>;

/// The most keys the tally holds unwritten: past it, a duplicate's count is dropped (and
/// logged) rather than let the tally grow while the database is unreachable.
const MAX_KEYS: usize = 100_000;

/// Deliveries counted but not written yet, per key.
pub(crate) struct Tally {
    seen: Mutex<HashMap<IdempotencyKey, Seen>>,
    /// Whether a task writes the counts.
    flushing: AtomicBool,
    /// How often it does.
    every: Duration,
    /// How many keys one write takes.
    chunk: usize,
    /// Held by whoever writes the counts (the task, or `write_counts`): two writers of the
    /// same snapshot would add its counts twice.
    writing: tokio::sync::Mutex<()>,
}

impl Default for Tally {
    fn default() -> Self {
        Self::every(FLUSH_EVERY)
    }
}

/// One key's unwritten deliveries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) count: u64,
    /// When the last of them arrived.
    pub(crate) last: Instant,
}

impl Tally {
    /// A tally whose counts are written every `every`, [`CHUNK`] keys a write.
    pub(crate) fn every(every: Duration) -> Self {
        Self::every_in(every, CHUNK)
    }

    /// A tally whose counts are written every `every`, `chunk` keys a write: a store whose
    /// write of several keys is not atomic writes one key at a time, so that a failed write
    /// is never added again for the keys it did write.
    pub(crate) fn every_in(every: Duration, chunk: usize) -> Self {
        Self {
            seen: Mutex::default(),
            flushing: AtomicBool::new(false),
            // A zero interval would spin.
            every: every.max(Duration::from_millis(10)),
            chunk: chunk.max(1),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// A tally like this one, empty: the same interval and writes.
    pub(crate) fn like(&self) -> Self {
        Self::every_in(self.every, self.chunk)
    }

    fn seen(&self) -> MutexGuard<'_, HashMap<IdempotencyKey, Seen>> {
        // A count is a plain number: one left half-changed by a panic is still a number.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts one delivery of `key`; answers how many of its deliveries are unwritten now,
    /// this one included.
    pub(crate) fn add(&self, key: &IdempotencyKey) -> u64 {
        let mut seen = self.seen();
        let now = Instant::now();
        if let Some(entry) = seen.get_mut(key) {
            entry.count += 1;
            entry.last = now;
            return entry.count;
        }
        if seen.len() >= MAX_KEYS {
            tracing::warn!(
                key = %key,
                "the delivery count of a duplicate is dropped: {MAX_KEYS} keys wait to be \
                 written already (is the database reachable?)"
            );
            return 1;
        }
        seen.insert(
            key.clone(),
            Seen {
                count: 1,
                last: now,
            },
        );
        1
    }

    /// The unwritten deliveries of `key`.
    pub(crate) fn pending(&self, key: &IdempotencyKey) -> Option<Seen> {
        self.seen().get(key).copied()
    }

    /// How many of `key`'s deliveries are unwritten.
    pub(crate) fn unwritten(&self, key: &IdempotencyKey) -> u64 {
        self.pending(key).map_or(0, |seen| seen.count)
    }

    /// `record`, as the store has it, with `key`'s unwritten deliveries added.
    pub(crate) fn include(&self, key: &IdempotencyKey, record: &mut KeyRecord) {
        if let Some(unwritten) = self.pending(key) {
            record.deliveries += unwritten.count;
            record.last_seen_ago = record.last_seen_ago.min(unwritten.last.elapsed());
        }
    }

    /// Counts a delivery of `key` answered without a write, and makes sure a task writes the
    /// counts with what `writer` makes (asked only when none runs yet); answers how many of
    /// the key's deliveries are unwritten now, this one included.
    pub(crate) fn count<W, Fut>(
        self: &Arc<Self>,
        key: &IdempotencyKey,
        writer: impl FnOnce() -> W,
    ) -> u64
    where
        W: Fn(Chunk) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let unwritten = self.add(key);
        if !self.is_flushing() {
            self.keep_flushed(writer());
        }
        unwritten
    }

    /// What is to be written now, in key order: every writer locks the rows of a chunk in
    /// the same order, so two of them (two instances, or a purge) cannot deadlock.
    pub(crate) fn snapshot(&self) -> Vec<(IdempotencyKey, Seen)> {
        let mut due: Vec<_> = self.seen().iter().map(|(k, s)| (k.clone(), *s)).collect();
        due.sort_unstable_by(|(a, _), (b, _)| {
            (a.namespace(), a.value()).cmp(&(b.namespace(), b.value()))
        });
        due
    }

    /// Writes every count with `write`, a chunk at a time in key order, one writer at a time
    /// (two writers of one snapshot would add its counts twice). The first chunk that fails
    /// ends the round: what is left waits for the next.
    pub(crate) async fn write_round<W, Fut, E>(&self, mut write: W) -> Result<(), E>
    where
        W: FnMut(Chunk) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let _writing = self.writing.lock().await;
        for chunk in self.snapshot().chunks(self.chunk) {
            write(chunk.to_vec()).await?;
            self.all_written(chunk);
        }
        Ok(())
    }

    fn all_written(&self, chunk: &[(IdempotencyKey, Seen)]) {
        for (key, seen) in chunk {
            self.written(key, seen.count);
        }
    }

    /// `count` of `key`'s deliveries are written: they no longer count here.
    pub(crate) fn written(&self, key: &IdempotencyKey, count: u64) {
        let mut seen = self.seen();
        if let Some(entry) = seen.get_mut(key) {
            entry.count = entry.count.saturating_sub(count);
            if entry.count == 0 {
                seen.remove(key);
            }
        }
    }

    /// Whether a task writes the counts already.
    pub(crate) fn is_flushing(&self) -> bool {
        self.flushing.load(Ordering::Acquire)
    }

    /// Starts the task that writes the counts with `write`, unless it runs already. It ends
    /// once every store holding the tally is gone and nothing is left to write.
    pub(crate) fn keep_flushed<W, Fut>(self: &Arc<Self>, write: W)
    where
        W: Fn(Chunk) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        if self.flushing.swap(true, Ordering::AcqRel) {
            return;
        }
        let tally = Arc::downgrade(self);
        // However the task ends (its runtime shut down, before it ran even), the next delivery
        // counted starts another.
        let restart = Restart(tally.clone());
        let every = self.every;
        tokio::spawn(async move {
            let _restart = restart;
            flush(tally, every, write).await;
        });
    }
}

async fn flush<W, Fut>(tally: Weak<Tally>, every: Duration, write: W)
where
    W: Fn(Chunk) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    loop {
        tokio::time::sleep(every).await;
        let Some(strong) = tally.upgrade() else {
            return;
        };
        if let Err(error) = strong.write_round(&write).await {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "could not write the delivery counts of duplicates; trying again shortly"
            );
        }
        // The last store gone, and the round after it written (or failed: its counts are
        // lost, as a crash's would be), the task ends.
        if Arc::strong_count(&strong) == 1 {
            return;
        }
        drop(strong);
    }
}

/// Lets a new task start once the one holding it ends.
struct Restart(Weak<Tally>);

impl Drop for Restart {
    fn drop(&mut self) {
        if let Some(tally) = self.0.upgrade() {
            tally.flushing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    fn key(value: &str) -> IdempotencyKey {
        IdempotencyKey::new("ns", value).unwrap()
    }

    #[test]
    fn counts_until_written() {
        let tally = Tally::default();
        assert!(tally.pending(&key("a")).is_none());
        assert_eq!(tally.add(&key("a")), 1);
        assert_eq!(tally.add(&key("a")), 2);
        assert_eq!(tally.add(&key("b")), 1);
        assert_eq!(tally.pending(&key("a")).unwrap().count, 2);
        let mut due = tally.snapshot();
        due.sort_by(|x, y| x.0.value().cmp(y.0.value()));
        assert_eq!(due.len(), 2);
        assert_eq!((due[0].0.value(), due[0].1.count), ("a", 2));
        // One more arrives while the two are written: it stays.
        assert_eq!(tally.add(&key("a")), 3);
        tally.written(&key("a"), 2);
        assert_eq!(tally.pending(&key("a")).unwrap().count, 1);
        tally.written(&key("a"), 1);
        assert!(tally.pending(&key("a")).is_none());
        assert_eq!(tally.pending(&key("b")).unwrap().count, 1);
    }

    #[test]
    fn a_full_tally_drops_new_keys_but_counts_known_ones() {
        let tally = Tally::default();
        for i in 0..MAX_KEYS {
            tally.add(&key(&i.to_string()));
        }
        assert_eq!(tally.add(&key("one too many")), 1);
        assert!(tally.pending(&key("one too many")).is_none());
        assert_eq!(tally.add(&key("0")), 2);
    }

    #[tokio::test]
    async fn the_task_writes_and_a_failed_write_is_tried_again() {
        let tally = Arc::new(Tally::every(Duration::from_millis(5)));
        let written = Arc::new(AtomicU64::new(0));
        let attempts = Arc::new(AtomicU64::new(0));
        tally.add(&key("a"));
        tally.add(&key("a"));
        let (w, a) = (written.clone(), attempts.clone());
        tally.keep_flushed(move |chunk| {
            let (w, a) = (w.clone(), a.clone());
            async move {
                // The first write fails: the counts stay for the next round.
                if a.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(StoreError::backend("the database is away"));
                }
                let counts: u64 = chunk.iter().map(|(_, seen)| seen.count).sum();
                w.fetch_add(counts, Ordering::SeqCst);
                Ok(())
            }
        });
        assert!(tally.is_flushing());
        let deadline = Instant::now() + Duration::from_secs(10);
        while tally.pending(&key("a")).is_some() {
            assert!(Instant::now() < deadline, "the counts were never written");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(written.load(Ordering::SeqCst), 2);
        assert!(attempts.load(Ordering::SeqCst) >= 2);
    }

    #[test]
    fn a_task_whose_runtime_ended_is_started_again() {
        let tally = Arc::new(Tally::every(Duration::from_millis(5)));
        let written = Arc::new(AtomicU64::new(0));
        let writer = |written: Arc<AtomicU64>| {
            move |chunk: Chunk| {
                let written = written.clone();
                async move {
                    written.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                    Ok(())
                }
            }
        };
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        first.block_on(async {
            tally.keep_flushed(writer(written.clone()));
        });
        assert!(tally.is_flushing());
        drop(first);
        assert!(!tally.is_flushing(), "the task is gone with its runtime");
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        second.block_on(async {
            tally.add(&key("a"));
            tally.keep_flushed(writer(written.clone()));
            let deadline = Instant::now() + Duration::from_secs(10);
            while tally.pending(&key("a")).is_some() {
                assert!(Instant::now() < deadline, "the counts were never written");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert_eq!(written.load(Ordering::SeqCst), 1);
    }
}
