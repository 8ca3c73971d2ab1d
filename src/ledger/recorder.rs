//! The layers' way into a ledger: records handed to a task that appends them in batches, off
//! every delivery's path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::log::LedgerStore;
use super::record::Record;

/// How many records wait for the writer at most; past that, records are dropped (and counted)
/// rather than held in memory without bound.
const QUEUE: usize = 8192;
/// How many records one append carries at most.
const BATCH: usize = 512;
/// How many times a failed append is tried before its records are given up.
const TRIES: u32 = 5;

enum Message {
    Record(Record),
    Flush(oneshot::Sender<()>),
}

/// Hands a layer's records to a [`LedgerStore`]: [`IdempotencyLayer::ledger`] records each
/// delivery it answers and each run of the handler. Records go to a task that appends them in
/// batches, so no delivery waits for the ledger; a record is in the store a moment after its
/// delivery was answered. What was handed over and not written yet is lost if the process
/// dies; a store that keeps failing, or a queue past 8,192 records, drops records, each counted
/// ([`Recorder::dropped`]) and logged. Clones share the task.
///
/// [`IdempotencyLayer::ledger`]: crate::IdempotencyLayer::ledger
#[derive(Clone, Debug)]
pub struct Recorder {
    sender: mpsc::Sender<Message>,
    instance: Arc<str>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Message(..)")
    }
}

impl Recorder {
    /// Starts the task that appends to `store`; `instance` names this process in the run
    /// records (a host name, a pod). Call it inside a Tokio runtime.
    pub fn spawn<L: LedgerStore>(store: L, instance: impl Into<String>) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(write(store, receiver, dropped.clone()));
        Self {
            sender,
            instance: instance.into().into(),
            dropped,
        }
    }

    /// The instance the run records name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Hands `record` over, without waiting. A full queue, or a writer that stopped, drops it.
    pub fn record(&self, record: Record) {
        if self.sender.try_send(Message::Record(record)).is_err() {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::error!(
                    dropped,
                    "a ledger record was dropped: the ledger's queue is full or its writer \
                     stopped"
                );
            }
        }
    }

    /// Waits until every record handed over before the call is written, or given up.
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }

    /// How many records were dropped: a full queue, or a store that kept failing.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The writer: takes what waits, up to a batch, and appends it, trying a failed append again
/// a few times, a little later each time.
async fn write<L: LedgerStore>(
    store: L,
    mut receiver: mpsc::Receiver<Message>,
    dropped: Arc<AtomicU64>,
) {
    let mut records = Vec::with_capacity(BATCH);
    let mut flushes = Vec::new();
    while let Some(first) = receiver.recv().await {
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Message::Record(record) => records.push(record),
                Message::Flush(done) => flushes.push(done),
            }
            next = (records.len() < BATCH)
                .then(|| receiver.try_recv().ok())
                .flatten();
        }
        if !records.is_empty() {
            append(&store, &records, &dropped).await;
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn append<L: LedgerStore>(store: &L, records: &[Record], dropped: &AtomicU64) {
    let mut wait = Duration::from_millis(50);
    for attempt in 1..=TRIES {
        match store.append(records).await {
            Ok(()) => return,
            Err(error) if attempt == TRIES => {
                dropped.fetch_add(records.len() as u64, Ordering::Relaxed);
                tracing::error!(
                    %error,
                    records = records.len(),
                    "ledger records were dropped: the ledger's store failed {TRIES} times"
                );
            }
            Err(error) => {
                tracing::warn!(%error, attempt, "a ledger append failed; it is tried again");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}
