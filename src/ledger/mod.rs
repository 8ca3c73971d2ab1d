//! The delivery ledger's evidence: a log of records whose Merkle tree (RFC 6962) is signed in
//! checkpoints (C2SP `tlog-checkpoint` notes, Ed25519), so that a record altered, deleted,
//! reordered or inserted after a checkpoint is found and named.
//!
//! A database row can be edited by anyone who can write to the database; a signed checkpoint
//! cannot be forged without the key. This module holds what does not depend on a store: the
//! hashing and proofs ([`merkle`]), the signed notes ([`Checkpoint`], [`NoteSigner`],
//! [`NoteVerifier`]) and the check of records against a checkpoint ([`verify`]).
//!
//! ```
//! use tower_idempotency::ledger::{
//!     Checkpoint, Finding, Frontier, Logged, NoteSigner, NoteVerifier, merkle, verify,
//! };
//!
//! // Three records, each numbered and written with its leaf hash.
//! let mut records: Vec<Logged> = ["evt_1 delivery 1: processed", "evt_1 delivery 2: duplicate",
//!     "evt_2 delivery 1: processed"]
//!     .iter()
//!     .enumerate()
//!     .map(|(seq, text)| Logged::new(seq as u64, text.as_bytes().to_vec()))
//!     .collect();
//!
//! // A checkpoint over them, signed with a key only the publisher holds.
//! let mut tree = Frontier::new();
//! records.iter().for_each(|record| tree.push(record.leaf));
//! let signer = NoteSigner::from_seed("example.com/hooks", [42; 32]).unwrap();
//! let note = Checkpoint { origin: "example.com/hooks".into(), size: tree.size(),
//!     root: tree.root(), extensions: vec![] }
//!     .sign(&signer)
//!     .unwrap();
//!
//! // An auditor holds the public key, opens the note and checks the records.
//! let verifier = NoteVerifier::parse(&signer.verifier().to_string()).unwrap();
//! let checkpoint = Checkpoint::open(&note, &verifier).unwrap();
//! assert!(verify(&checkpoint, records.clone()).is_intact());
//!
//! // One record proven in the tree with a few hashes.
//! let leaves: Vec<_> = records.iter().map(|record| record.leaf).collect();
//! let proof = merkle::inclusion_proof(1, &leaves).unwrap();
//! assert!(merkle::verify_inclusion(1, 3, &leaves[1], &proof, &checkpoint.root));
//!
//! // Someone edits the database: "the second delivery was never a duplicate".
//! records[1].record = b"evt_1 delivery 2: processed".to_vec();
//! assert_eq!(verify(&checkpoint, records).findings, [Finding::Altered { seq: 1 }]);
//! ```

mod audit;
pub mod merkle;
mod note;

pub use audit::{Finding, Logged, Verdict, verify, verify_from};
pub use merkle::{Frontier, Hash};
pub use note::{Checkpoint, NoteError, NoteSigner, NoteVerifier};
