//! Checking a log's records against a signed checkpoint, and naming what changed.
//!
//! Each record is stored with its number in the log (`seq`, from 0, without gaps) and its leaf
//! hash, computed when it was written from the number and the record's bytes. A checkpoint
//! signs the head of the tree over the leaves of its first `size` records; a verifier that
//! holds it reads the records back and recomputes. A record edited in place no longer matches
//! its leaf, two records swapped each match the other's number, a number missing is a deletion,
//! a number twice an insertion, and missing numbers at the end a truncation; a record rewritten
//! together with its leaf hash still changes the tree's head, which the signature pins.

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
    let mut rows: Vec<Logged> = records
        .into_iter()
        .filter(|row| row.seq >= from && row.seq < size)
        .collect();
    rows.sort_by_key(|row| row.seq);
    let mut findings = Vec::new();
    let mut frontier = start.clone();
    let mut broken: Vec<&Logged> = Vec::new();
    let mut rows_at = rows.iter().peekable();
    for seq in from..size.max(from) {
        let Some(row) = rows_at.next_if(|row| row.seq == seq) else {
            if rows_at.peek().is_none() {
                findings.push(Finding::Truncated { from: seq, size });
                break;
            }
            findings.push(Finding::Deleted { seq });
            continue;
        };
        if rows_at.next_if(|next| next.seq == seq).is_some() {
            findings.push(Finding::Inserted { seq });
            while rows_at.next_if(|next| next.seq == seq).is_some() {}
        }
        if !row.intact() {
            broken.push(row);
        }
        frontier.push(Logged::leaf_of(seq, &row.record));
    }
    // A broken record that is intact under another broken one's number, or under the number
    // next to its own (records renumbered around an insertion or a deletion), was moved.
    for row in &broken {
        let next_to = [row.seq.checked_sub(1), row.seq.checked_add(1)];
        let was = broken
            .iter()
            .map(|other| Some(other.seq))
            .chain(next_to)
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

/// Where a finding is, for their order.
fn place(finding: &Finding) -> u64 {
    match finding {
        Finding::Altered { seq }
        | Finding::Moved { seq, .. }
        | Finding::Deleted { seq }
        | Finding::Inserted { seq } => *seq,
        Finding::Truncated { from, .. } => *from,
        Finding::Rewritten { .. } => u64::MAX,
    }
}

/// Whether every record from `first` to before `end` moved up by one (`up`) or down by one.
fn shifted(findings: &[Finding], first: u64, end: u64, up: bool) -> bool {
    (first..end).all(|seq| {
        let was = if up { seq - 1 } else { seq + 1 };
        findings.contains(&Finding::Moved { seq, was })
    })
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
    let moved_on =
        |finding: &Finding| matches!(finding, Finding::Moved { seq, .. } if *seq >= first);
    if !down && first > from && shifted(findings, first, size, true) {
        // The record just before the shifted ones is the one inserted.
        findings.retain(|finding| !moved_on(finding));
        findings.push(Finding::Inserted { seq: first - 1 });
    } else if down
        && size > first
        && shifted(findings, first, size - 1, false)
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
