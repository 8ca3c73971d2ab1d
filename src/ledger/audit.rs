//! Checking a log's records against a signed checkpoint, and naming what changed.
//!
//! Each record is stored with its number in the log (`seq`, from 0, without gaps) and its leaf
//! hash, computed when it was written from the number and the record's bytes. A checkpoint
//! signs the head of the tree over the leaves of its first `size` records; a verifier that
//! holds it reads the records back and recomputes. A record edited in place no longer matches
//! its leaf, two records swapped each match the other's number, a number missing is a deletion,
//! a number twice an insertion, and missing numbers at the end a truncation; a record rewritten
//! together with its leaf hash still changes the tree's head, which the signature pins.

use std::collections::HashSet;

use super::merkle::{Frontier, Hash, leaf_hash};
use super::note::Checkpoint;

/// A record as the log stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Its number in the log, from 0.
    pub seq: u64,
    /// The record's bytes (its canonical encoding).
    pub record: Vec<u8>,
    /// The leaf hash written with it: [`Logged::leaf_of`] of its number and bytes.
    pub leaf: Hash,
}

impl Logged {
    /// A record numbered `seq`, with its leaf hash.
    pub fn new(seq: u64, record: Vec<u8>) -> Self {
        let leaf = Self::leaf_of(seq, &record);
        Self { seq, record, leaf }
    }

    /// The leaf hash of record `seq` with bytes `record`: RFC 6962's leaf hash of the number
    /// (eight bytes, big-endian) followed by the bytes.
    pub fn leaf_of(seq: u64, record: &[u8]) -> Hash {
        let mut data = Vec::with_capacity(8 + record.len());
        data.extend_from_slice(&seq.to_be_bytes());
        data.extend_from_slice(record);
        leaf_hash(&data)
    }

    /// Whether the bytes still hash, under their number, to the leaf written with them.
    fn intact(&self) -> bool {
        Self::leaf_of(self.seq, &self.record) == self.leaf
    }
}

/// What a verifier found changed since a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// The record's bytes no longer match the leaf written with them: edited in place.
    Altered {
        /// The record's number.
        seq: u64,
    },
    /// The record at `seq` was written as record `was`: records were reordered.
    Moved {
        /// Where the record is now.
        seq: u64,
        /// The number it was written under.
        was: u64,
    },
    /// No record holds this number.
    Deleted {
        /// The missing number.
        seq: u64,
    },
    /// More than one record holds this number.
    Inserted {
        /// The number held twice.
        seq: u64,
    },
    /// The log ends before the checkpoint's size: the records from `from` on are gone.
    Truncated {
        /// The first missing number.
        from: u64,
        /// How many records the checkpoint covers.
        size: u64,
    },
    /// The check started from a frontier past the checkpoint's size: an older checkpoint
    /// cannot be checked from a later frontier (start from an earlier one, or from nothing).
    Behind {
        /// How many records the checkpoint covers.
        size: u64,
        /// Where the check started.
        from: u64,
    },
    /// Every record matches its leaf, yet the tree's head is not the checkpoint's: records were
    /// rewritten together with their leaf hashes.
    Rewritten {
        /// How many records the checkpoint covers.
        size: u64,
    },
}

/// What [`verify`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every change found, in the order of the log; empty when the records are as signed.
    pub findings: Vec<Finding>,
    /// The tree's frontier at the checkpoint's size, when nothing was found: a later check
    /// starts from it ([`verify_from`]) and reads only the records after it.
    pub frontier: Option<Frontier>,
}

impl Verdict {
    /// Whether the records are exactly those the checkpoint signed.
    pub fn is_intact(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Checks `records` (the log's records, in any order; those numbered past the checkpoint are
/// ignored) against `checkpoint`, whose signature the caller has verified
/// ([`Checkpoint::open`]). Linear in the records.
pub fn verify(checkpoint: &Checkpoint, records: impl IntoIterator<Item = Logged>) -> Verdict {
    verify_from(&Frontier::new(), checkpoint, records)
}

/// [`verify`] from a frontier already checked against an earlier checkpoint (a
/// [`Verdict::frontier`]): only the records numbered from the frontier's size to the
/// checkpoint's are read, so the cost is linear in the records since the earlier checkpoint.
pub fn verify_from(
    start: &Frontier,
    checkpoint: &Checkpoint,
    records: impl IntoIterator<Item = Logged>,
) -> Verdict {
    let (from, size) = (start.size(), checkpoint.size);
    if from > size {
        return Verdict {
            findings: vec![Finding::Behind { size, from }],
            frontier: None,
        };
    }
    // Each record with whether it still matches its leaf; among records holding one number,
    // the one that matches first: it is kept, the others are named.
    let mut rows: Vec<(Logged, bool)> = records
        .into_iter()
        .filter(|row| row.seq >= from && row.seq < size)
        .map(|row| {
            let intact = row.intact();
            (row, intact)
        })
        .collect();
    rows.sort_by_key(|(row, intact)| (row.seq, !intact));
    let mut findings = Vec::new();
    let mut frontier = start.clone();
    let mut broken: Vec<&Logged> = Vec::new();
    let mut rows_at = rows.iter().peekable();
    for seq in from..size {
        let Some((row, intact)) = rows_at.next_if(|(row, _)| row.seq == seq) else {
            if rows_at.peek().is_none() {
                findings.push(Finding::Truncated { from: seq, size });
                break;
            }
            findings.push(Finding::Deleted { seq });
            continue;
        };
        if rows_at.next_if(|(next, _)| next.seq == seq).is_some() {
            findings.push(Finding::Inserted { seq });
            while rows_at.next_if(|(next, _)| next.seq == seq).is_some() {}
        }
        if !intact {
            broken.push(row);
        }
        frontier.push(Logged::leaf_of(seq, &row.record));
    }
    // A broken record that is intact under the number next to its own (records renumbered
    // around an insertion or a deletion), or under another broken one's number while they
    // are few (records swapped), was moved.
    let pair_up = broken.len() <= PAIRED;
    for row in &broken {
        let next_to = [row.seq.checked_sub(1), row.seq.checked_add(1)];
        let others = broken
            .iter()
            .filter(|_| pair_up)
            .map(|other| Some(other.seq));
        let was = next_to
            .into_iter()
            .chain(others)
            .flatten()
            .find(|&seq| seq != row.seq && Logged::leaf_of(seq, &row.record) == row.leaf);
        findings.push(match was {
            Some(was) => Finding::Moved { seq: row.seq, was },
            None => Finding::Altered { seq: row.seq },
        });
    }
    renumbered(&mut findings, from, size);
    if findings.is_empty() && frontier.root() != checkpoint.root {
        findings.push(Finding::Rewritten { size });
    }
    let frontier = findings.is_empty().then_some(frontier);
    Verdict { findings, frontier }
}

/// Up to how many broken records are each tried under the others' numbers: swaps are found
/// among a few, and a mass edit costs no more than a pass over it.
const PAIRED: usize = 64;

/// Where a finding is, for their order.
fn place(finding: &Finding) -> u64 {
    match finding {
        Finding::Altered { seq }
        | Finding::Moved { seq, .. }
        | Finding::Deleted { seq }
        | Finding::Inserted { seq } => *seq,
        Finding::Truncated { from, .. } => *from,
        Finding::Behind { .. } => 0,
        Finding::Rewritten { .. } => u64::MAX,
    }
}

/// Puts the findings in the log's order, naming a record inserted, or deleted, with the
/// records after it renumbered to close the gap: each of them moved by one, to the
/// checkpoint's end.
fn renumbered(findings: &mut Vec<Finding>, from: u64, size: u64) {
    findings.sort_by_key(place);
    let first_moved = findings.iter().find_map(|finding| match finding {
        Finding::Moved { seq, was } if seq.abs_diff(*was) == 1 => Some((*seq, was > seq)),
        _ => None,
    });
    let Some((first, down)) = first_moved else {
        return;
    };
    let moves: HashSet<(u64, u64)> = findings
        .iter()
        .filter_map(|finding| match finding {
            Finding::Moved { seq, was } => Some((*seq, *was)),
            _ => None,
        })
        .collect();
    let shifted = |end: u64, up: bool| {
        (first..end).all(|seq| moves.contains(&(seq, if up { seq - 1 } else { seq + 1 })))
    };
    let moved_on =
        |finding: &Finding| matches!(finding, Finding::Moved { seq, .. } if *seq >= first);
    // The record just before the shifted ones is the one inserted: there, and itself intact.
    let inserted_before = first > from && !findings.iter().any(|f| place(f) == first - 1);
    if !down && inserted_before && shifted(size, true) {
        findings.retain(|finding| !moved_on(finding));
        findings.push(Finding::Inserted { seq: first - 1 });
    } else if down
        && size > first
        && shifted(size - 1, false)
        && findings.contains(&Finding::Truncated {
            from: size - 1,
            size,
        })
    {
        findings
            .retain(|finding| !moved_on(finding) && !matches!(finding, Finding::Truncated { .. }));
        findings.push(Finding::Deleted { seq: first });
    }
    findings.sort_by_key(place);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: u64) -> Vec<Logged> {
        (0..n)
            .map(|seq| Logged::new(seq, format!("delivery {seq}: processed").into_bytes()))
            .collect()
    }

    fn checkpoint_of(records: &[Logged]) -> Checkpoint {
        let mut frontier = Frontier::new();
        for row in records {
            frontier.push(row.leaf);
        }
        Checkpoint {
            origin: "test/ledger".into(),
            size: frontier.size(),
            root: frontier.root(),
            extensions: Vec::new(),
        }
    }

    #[test]
    fn an_untouched_log_verifies_and_later_records_do_not_matter() {
        let records = log(20);
        let checkpoint = checkpoint_of(&records[..12]);
        let verdict = verify(&checkpoint, records.clone());
        assert!(verdict.is_intact(), "{:?}", verdict.findings);
        let frontier = verdict.frontier.unwrap();
        assert_eq!(frontier.size(), 12);
        let later = checkpoint_of(&records);
        let from = verify_from(&frontier, &later, records[12..].to_vec());
        assert!(from.is_intact());
        assert_eq!(from.frontier.unwrap().root(), later.root);
        let older = checkpoint_of(&records[..5]);
        assert_eq!(
            verify_from(&frontier, &older, records.clone()).findings,
            [Finding::Behind { size: 5, from: 12 }]
        );
        assert!(verify(&older, records).is_intact());
    }

    #[test]
    fn every_record_edited_is_named_each() {
        let records = log(3000);
        let checkpoint = checkpoint_of(&records);
        let mut edited = records;
        for row in &mut edited {
            row.record.push(b'!');
        }
        let findings = verify(&checkpoint, edited).findings;
        assert_eq!(findings.len(), 3000);
        assert!(
            findings
                .iter()
                .all(|f| matches!(f, Finding::Altered { .. }))
        );
    }

    #[test]
    fn each_kind_of_tampering_is_named() {
        let records = log(10);
        let checkpoint = checkpoint_of(&records);
        let findings = |edit: &dyn Fn(&mut Vec<Logged>)| {
            let mut rows = records.clone();
            edit(&mut rows);
            verify(&checkpoint, rows).findings
        };
        assert_eq!(
            findings(&|rows| rows[3].record = b"delivery 3: refused".to_vec()),
            [Finding::Altered { seq: 3 }]
        );
        assert_eq!(
            findings(&|rows| {
                rows.remove(4);
            }),
            [Finding::Deleted { seq: 4 }]
        );
        assert_eq!(
            findings(&|rows| {
                rows[2].seq = 5;
                rows[5].seq = 2;
            }),
            [
                Finding::Moved { seq: 2, was: 5 },
                Finding::Moved { seq: 5, was: 2 }
            ]
        );
        assert_eq!(
            findings(&|rows| rows.push(Logged::new(6, b"forged".to_vec()))),
            [Finding::Inserted { seq: 6 }]
        );
        assert_eq!(
            findings(&|rows| rows.truncate(7)),
            [Finding::Truncated { from: 7, size: 10 }]
        );
        assert_eq!(
            findings(&|rows| rows[8] = Logged::new(8, b"rewritten with its leaf".to_vec())),
            [Finding::Rewritten { size: 10 }]
        );
        assert!(
            findings(&|rows| rows.reverse()).is_empty(),
            "order of reading is free"
        );
        assert_eq!(
            findings(&|rows| {
                rows.iter_mut()
                    .filter(|row| row.seq >= 4)
                    .for_each(|row| row.seq += 1);
                rows.push(Logged::new(4, b"forged, the rest renumbered".to_vec()));
            }),
            [Finding::Inserted { seq: 4 }]
        );
        assert_eq!(
            findings(&|rows| rows
                .iter_mut()
                .filter(|row| row.seq >= 4)
                .for_each(|row| row.seq += 1)),
            [4, 5, 6, 7, 8, 9].map(|seq| if seq == 4 {
                Finding::Deleted { seq }
            } else {
                Finding::Moved { seq, was: seq - 1 }
            }),
            "a gap opened, nothing inserted"
        );
        assert_eq!(
            findings(&|rows| {
                let mut copy = rows[9].clone();
                copy.seq = 8;
                rows.insert(0, copy);
                rows.pop();
            }),
            [
                Finding::Inserted { seq: 8 },
                Finding::Truncated { from: 9, size: 10 }
            ],
            "the same names whatever the order the rows are read in"
        );
        assert_eq!(
            findings(&|rows| {
                rows.remove(6);
                rows.iter_mut()
                    .filter(|row| row.seq > 6)
                    .for_each(|row| row.seq -= 1);
            }),
            [Finding::Deleted { seq: 6 }]
        );
    }
}
