//! The delivery ledger's evidence: a log of records whose Merkle tree (RFC 6962) is signed in
//! checkpoints (C2SP `tlog-checkpoint` notes, Ed25519), so that a record altered, deleted,
//! reordered or inserted after a checkpoint is found and named.
//!
//! A database row can be edited by anyone who can write to the database; a signed checkpoint
//! cannot be forged without the key. Records ([`Record`]: a delivery and how it was answered,
//! a run of the handler, an operator's action) are appended to a [`LedgerStore`] unnumbered,
//! by any instance; one publisher at a time numbers them and signs the tree's head
//! ([`publish`]); an auditor holding the public key and a checkpoint reads the records back
//! and is told what changed ([`audit`], [`verify`]). A record written late is numbered late,
//! never skipped.
//!
//! ```
//! # #[cfg(feature = "memory")] {
//! use std::time::SystemTime;
//! use tower_idempotency::ledger::{
//!     Event, Finding, LedgerStore, MemoryLedger, NoteSigner, Record, audit, merkle, publish,
//! };
//! use tower_idempotency::{IdempotencyKey, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let ledger = MemoryLedger::new();
//! let key = IdempotencyKey::new("github", "d-1").unwrap();
//! let delivery = |number, outcome| Record {
//!     key: key.clone(),
//!     at: SystemTime::now(),
//!     event: Event::Delivery { number: Some(number), outcome, replay: false },
//! };
//! ledger.append(&[delivery(1, Outcome::Processed), delivery(2, Outcome::Duplicate)]).await.unwrap();
//!
//! // The publisher signs the log's head with a key only it holds.
//! let signer = NoteSigner::from_seed("example.com/hooks", [42; 32]).unwrap();
//! let checkpoint = publish(&ledger, &signer, "example.com/hooks").await.unwrap();
//! assert_eq!(checkpoint.size, 2);
//! let note = checkpoint.sign(&signer).unwrap(); // what an auditor keeps
//!
//! // "Was it sent twice, or did it run twice?": the key's timeline.
//! assert_eq!(ledger.timeline(&key).await.unwrap().len(), 2);
//!
//! // An auditor with the public key finds the log as signed...
//! let verifier = signer.verifier();
//! let (_, verdict) = audit(&ledger, &verifier, Some(&note)).await.unwrap();
//! assert!(verdict.is_intact());
//!
//! // ...and one record proven in the tree with a few hashes.
//! let leaves: Vec<_> = ledger.records(0, 2).await.unwrap().iter().map(|r| r.leaf).collect();
//! let proof = merkle::inclusion_proof(1, &leaves).unwrap();
//! assert!(merkle::verify_inclusion(1, 2, &leaves[1], &proof, &checkpoint.root));
//!
//! // Someone with write access rewrites the second delivery as processed.
//! ledger.edit_log(|log| {
//!     let forged = Record::decode(&log[0].record).unwrap();
//!     log[1].record = Record { event: Event::Delivery { number: Some(2),
//!         outcome: Outcome::Processed, replay: false }, ..forged }.encode();
//! });
//! let (_, verdict) = audit(&ledger, &verifier, Some(&note)).await.unwrap();
//! assert_eq!(verdict.findings, [Finding::Altered { seq: 1 }]);
//! # }
//! # main() }
//! ```
//!
//! Claim-then-commit records into a ledger through a [`Recorder`]
//! ([`IdempotencyLayer::ledger`](crate::IdempotencyLayer::ledger)): each run of the handler,
//! before its commit or release, also when the sender hung up, and each delivery answered
//! without a run (a duplicate, one in flight, held, refused).
//! The other modes record nothing yet. The ledger lives in memory ([`MemoryLedger`]), or
//! beside the claims' table on PostgreSQL and SQLite (`PostgresLedger`, `SqliteLedger`: a
//! table of records numbered in place, `<table>_ledger`, and one of checkpoints,
//! `<table>_ledger_cp`); not yet on MySQL or Redis.

mod audit;
mod log;
#[cfg(feature = "memory")]
mod memory;
pub mod merkle;
mod note;
mod publisher;
mod record;
mod recorder;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql;

pub use audit::{Finding, Logged, Verdict, verify, verify_from};
pub use log::{LedgerError, LedgerStore, StoredCheckpoint, audit, publish};
#[cfg(feature = "memory")]
pub use memory::MemoryLedger;
pub use merkle::{Frontier, Hash};
pub use note::{Checkpoint, NoteError, NoteSigner, NoteVerifier};
pub use publisher::Publisher;
pub use record::{Event, Record, Unreadable};
pub use recorder::Recorder;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sql::postgres::PostgresLedger;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sql::sqlite::SqliteLedger;
