//! Where the ledger's records live ([`LedgerStore`]), and the two jobs over it: publishing a
//! signed checkpoint ([`publish`]) and auditing the records against one ([`audit`]).
//!
//! Records are appended unnumbered, by any instance, at any time. One publisher at a time
//! numbers them in the order they became visible, from the log's size on, each with its leaf
//! hash, and signs the tree's head. A record whose write commits late is numbered late, never
//! skipped: numbering takes the records that have no number yet, not a range of ids.

use std::future::Future;

use super::audit::{Logged, Verdict, verify};
use super::merkle::Frontier;
use super::note::{Checkpoint, NoteError, NoteSigner, NoteVerifier};
use super::record::Record;
use crate::key::IdempotencyKey;
use crate::store::StoreError;

/// How many records one call to [`LedgerStore::sequence`] numbers at most while publishing.
const SEQUENCE_BATCH: usize = 4096;

/// A checkpoint as the log keeps it: the signed note, and the tree's frontier at its size, so
/// that the next checkpoint reads only the records after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// The checkpoint, signed.
    pub note: String,
    /// The frontier of the tree the note signs.
    pub frontier: Frontier,
}

/// Where a ledger's records and checkpoints are kept.
pub trait LedgerStore: Send + Sync + 'static {
    /// Appends records, unnumbered yet.
    fn append(&self, records: &[Record]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Numbers up to `limit` of the records that have no number yet, in the order they were
    /// appended as far as the store can tell, from the log's size on; keeps each one's number
    /// and leaf hash ([`Logged::new`]) and answers them in order. Only the publisher calls it;
    /// two numberings at once must not both succeed in giving a number twice.
    fn sequence(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Logged>, StoreError>> + Send;

    /// The numbered records with `from <= seq < to`, in any order.
    fn records(
        &self,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<Vec<Logged>, StoreError>> + Send;

    /// A key's records, numbered or not, in the order they were appended.
    fn timeline(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// Keeps a checkpoint; the latest is the one of the largest size.
    fn save_checkpoint(
        &self,
        checkpoint: &StoredCheckpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The checkpoint of the largest size, if any.
    fn latest_checkpoint(
        &self,
    ) -> impl Future<Output = Result<Option<StoredCheckpoint>, StoreError>> + Send;
}

/// Why a checkpoint could not be published, or an audit could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored checkpoint's note does not open with the key given.
    #[error(transparent)]
    Note(#[from] NoteError),
    /// The log is not what its last checkpoint says: the frontier kept with it does not
    /// match the note, or a record numbered since does not match its leaf or its place. An
    /// [`audit`] names what changed.
    #[error("the log does not extend its last checkpoint: {0}")]
    Diverged(&'static str),
}

/// Numbers the records appended since the last checkpoint and signs a new one with `signer`,
/// under `origin`; answers it. Reads only the records after the last checkpoint. Run it on one
/// instance at a time (under a lease): two at once fail rather than number a record twice.
pub async fn publish<L: LedgerStore>(
    store: &L,
    signer: &NoteSigner,
    origin: &str,
) -> Result<Checkpoint, LedgerError> {
    let mut frontier = match store.latest_checkpoint().await? {
        Some(stored) => {
            let signed = Checkpoint::open(&stored.note, &signer.verifier())?;
            if signed.origin != origin {
                return Err(LedgerError::Diverged(
                    "the last checkpoint was signed under another origin",
                ));
            }
            if (signed.size, signed.root) != (stored.frontier.size(), stored.frontier.root()) {
                return Err(LedgerError::Diverged(
                    "the frontier kept with the last checkpoint is not the one it signs",
                ));
            }
            stored.frontier
        }
        None => Frontier::new(),
    };
    // Records numbered after the last checkpoint by a publisher that stopped before signing.
    let mut numbered = store.records(frontier.size(), u64::MAX).await?;
    numbered.sort_by_key(|logged| logged.seq);
    extend(&mut frontier, numbered)?;
    loop {
        let batch = store.sequence(SEQUENCE_BATCH).await?;
        if batch.is_empty() {
            break;
        }
        extend(&mut frontier, batch)?;
    }
    let checkpoint = Checkpoint {
        origin: origin.to_owned(),
        size: frontier.size(),
        root: frontier.root(),
        extensions: Vec::new(),
    };
    let note = checkpoint.sign(signer)?;
    store
        .save_checkpoint(&StoredCheckpoint { note, frontier })
        .await?;
    Ok(checkpoint)
}

/// Pushes numbered records on the frontier, each at its place and matching its leaf.
fn extend(frontier: &mut Frontier, records: Vec<Logged>) -> Result<(), LedgerError> {
    for logged in records {
        if logged.seq != frontier.size() {
            return Err(LedgerError::Diverged(
                "a record's number is not the next after the log's",
            ));
        }
        if Logged::leaf_of(logged.seq, &logged.record) != logged.leaf {
            return Err(LedgerError::Diverged(
                "a record numbered since the last checkpoint does not match its leaf",
            ));
        }
        frontier.push(logged.leaf);
    }
    Ok(())
}

/// Checks the log against a checkpoint note signed by `verifier`'s key, one the auditor kept
/// (where the database's writers cannot reach it) or the store's latest when `note` is `None`:
/// every record it covers is read back, and what changed is named.
pub async fn audit<L: LedgerStore>(
    store: &L,
    verifier: &NoteVerifier,
    note: Option<&str>,
) -> Result<(Checkpoint, Verdict), LedgerError> {
    let note = match note {
        Some(note) => note.to_owned(),
        None => match store.latest_checkpoint().await? {
            Some(stored) => stored.note,
            None => {
                let empty = Checkpoint {
                    origin: String::new(),
                    size: 0,
                    root: Frontier::new().root(),
                    extensions: Vec::new(),
                };
                return Ok((empty.clone(), verify(&empty, [])));
            }
        },
    };
    let checkpoint = Checkpoint::open(&note, verifier)?;
    let records = store.records(0, checkpoint.size).await?;
    let verdict = verify(&checkpoint, records);
    Ok((checkpoint, verdict))
}
