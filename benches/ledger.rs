//! The ledger's evidence at the sizes a busy receiver reaches: the tree head over a million
//! records (a checkpoint), the check of the records since a checkpoint against the next one,
//! and the size of an inclusion proof.
//!
//! Baseline in the same run: SHA-256 of the same records' bytes, one after the other, with no
//! tree (what hashing the log costs at the least). The summary gives each as a ratio to it.
//!
//! ```sh
//! cargo bench --features ledger --bench ledger
//! ```

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use sha2::{Digest as _, Sha256};
use tower_idempotency::ledger::{Checkpoint, Frontier, Logged, merkle, verify_from};

const RECORDS: u64 = 1_000_000;

/// A record as a delivery's would be: its key, its number, how it was answered.
fn record(seq: u64) -> Vec<u8> {
    format!(
        "github:delivery-{seq:08}|delivery {}|processed|200",
        seq % 3 + 1
    )
    .into_bytes()
}

fn checkpoint_of(frontier: &Frontier) -> Checkpoint {
    Checkpoint {
        origin: "bench/ledger".into(),
        size: frontier.size(),
        root: frontier.root(),
        extensions: Vec::new(),
    }
}

fn main() {
    let records: Vec<Logged> = (0..RECORDS)
        .map(|seq| Logged::new(seq, record(seq)))
        .collect();

    // Baseline: SHA-256 over each record's bytes, no tree.
    let started = Instant::now();
    for row in &records {
        black_box(Sha256::digest(&row.record));
    }
    let baseline = started.elapsed();

    // A checkpoint: the tree head over a million stored leaf hashes.
    let started = Instant::now();
    let mut frontier = Frontier::new();
    for row in &records {
        frontier.push(row.leaf);
    }
    let checkpoint = checkpoint_of(&frontier);
    let head = started.elapsed();

    // The check of the last 10% against the checkpoint, from the frontier at 90%.
    let mut start = Frontier::new();
    for row in &records[..900_000] {
        start.push(row.leaf);
    }
    let started = Instant::now();
    let verdict = verify_from(&start, &checkpoint, records[900_000..].iter().cloned());
    let tail = started.elapsed();
    assert!(verdict.is_intact());

    // The whole log checked from nothing.
    let started = Instant::now();
    let verdict = verify_from(&Frontier::new(), &checkpoint, records.iter().cloned());
    let whole = started.elapsed();
    assert!(verdict.is_intact());

    let leaves: Vec<_> = records.iter().map(|row| row.leaf).collect();
    let proof = merkle::inclusion_proof(123_457, &leaves).expect("in the tree");
    let bytes = proof.len() * 32;
    let bound = 32 * (RECORDS as f64).log2().ceil() as usize;
    assert!(bytes <= bound);

    println!(
        "ledger, {RECORDS} records (ratios to SHA-256 of each record's bytes, {baseline:.2?}):"
    );
    println!(
        "  checkpoint (tree head over stored leaves): {head:.2?} ({:.2}x)",
        head.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  verify the last 100000 from the frontier:  {tail:.2?} ({:.2}x)",
        tail.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  verify all from nothing:                   {whole:.2?} ({:.2}x)",
        whole.as_secs_f64() / baseline.as_secs_f64()
    );
    println!("  inclusion proof: {bytes} bytes (bound 32 x ceil(log2 n) = {bound})");

    let mut criterion = Criterion::default().configure_from_args().sample_size(10);
    let sample: Vec<Logged> = records[..10_000].to_vec();
    let small = {
        let mut f = Frontier::new();
        sample.iter().for_each(|row| f.push(row.leaf));
        checkpoint_of(&f)
    };
    criterion.bench_function("ledger/verify 10000 records", |b| {
        b.iter(|| verify_from(&Frontier::new(), &small, sample.iter().cloned()))
    });
    criterion.bench_function("ledger/frontier push", |b| {
        let mut f = Frontier::new();
        let leaf = records[0].leaf;
        b.iter(|| f.push(black_box(leaf)))
    });
    criterion.final_summary();
}
