//! Group commit on SQLite: the claims, commits and inbox entries of concurrent deliveries go
//! to the database in one transaction (see [`Batcher`]), so that they wait for one sync of the disk together
//! rather than one each.
//!
//! A lone write is the statement of the [module docs](super#round-trips), in the writer's
//! turn, committed on its own. Writes that arrive while it runs go, in the next turn, in one
//! `BEGIN IMMEDIATE` transaction: each write its own statement (a claim's upsert, a commit's
//! update), the same statements as alone, then one `COMMIT`. A statement that fails rolls the
//! transaction back, and the batch's writes go again one by one, each on its own, so that
//! only the one that fails again fails; a transaction that cannot begin or commit fails
//! every write of the batch (answered 503).

use std::sync::Arc;

use super::claims::Lone;
use crate::key::IdempotencyKey;
use crate::store::LeaseToken;
use crate::store::batch::{Answers, Batcher, Keyed, Shape, all_fail};
use crate::store::sql::ClaimRow;

/// One write of a delivery.
pub(super) enum Write {
    /// A claim that guesses its key is new: inserts the row with `token`, or reads the row
    /// the key has (see [`super::queries::enter`]). Sent only when the writer is idle, alone.
    Enter {
        key: IdempotencyKey,
        token: LeaseToken,
    },
    /// A claim's upsert (a new key, or one to take over), writing `token` if it takes the row.
    Claim {
        key: IdempotencyKey,
        token: LeaseToken,
        /// Whether the stale policy reclaims.
        reclaim: bool,
        /// The stale limit, in microseconds.
        stale_us: i64,
    },
    /// A commit, with its receipt encoded.
    Commit {
        key: IdempotencyKey,
        token: LeaseToken,
        receipt: Option<Vec<u8>>,
    },
    /// An inbox entry's insert, with its request encoded.
    Enqueue {
        key: IdempotencyKey,
        request: Vec<u8>,
    },
}

/// What a write answers.
pub(super) enum Wrote {
    /// The row an `Enter` inserted (its token the claim's) or found, read on the insert's
    /// connection (none: no row, the key's row gone between the insert and the read).
    Found(Option<ClaimRow>),
    /// The claimed row, as the upsert left it.
    Row(ClaimRow),
    /// The rows a commit matched (0 when the lease is lost), or an insert stored (0 when the
    /// key was there already).
    Matched(u64),
}

impl Keyed for Write {
    fn key(&self) -> &IdempotencyKey {
        match self {
            Write::Enter { key, .. }
            | Write::Claim { key, .. }
            | Write::Commit { key, .. }
            | Write::Enqueue { key, .. } => key,
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Write::Enter { .. } | Write::Claim { .. } => 0,
            Write::Commit { receipt, .. } => receipt.as_ref().map_or(0, Vec::len),
            Write::Enqueue { request, .. } => request.len(),
        }
    }
}

/// The batcher of one store's writes, at most `most` a transaction, each written alone as
/// `lone` says.
pub(super) fn batcher(lone: Lone, most: usize) -> Batcher<Write, Wrote> {
    let lone = Arc::new(lone);
    let alone = lone.clone();
    // One writer at a time: one lane. The statements of a batch run one after another, each
    // seeing the ones before it, so a key may be in a batch twice.
    Batcher::new(
        Shape::new(most, 1).same_key(),
        move |write| {
            let lone = alone.clone();
            async move {
                let _turn = lone.table.turn().await;
                lone.alone(&write).await
            }
        },
        move |writes| {
            let lone = lone.clone();
            async move { write_all(&lone, writes).await }
        },
    )
}

/// Two writes or more in one `BEGIN IMMEDIATE` transaction, in the writer's turn.
async fn write_all(lone: &Lone, writes: Vec<Write>) -> Answers<Wrote> {
    let table = &lone.table;
    let _turn = table.turn().await;
    let mut tx = match table.pool.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(error) => return all_fail(error, writes.len()),
    };
    let mut answers = Vec::with_capacity(writes.len());
    for write in &writes {
        match lone.write_on(&mut tx, write).await {
            Ok(wrote) => answers.push(Ok(wrote)),
            Err(_) => {
                // Nothing of the batch is written: each write goes again alone, so that the
                // one that fails fails alone.
                drop(tx.rollback().await);
                let mut answers = Vec::with_capacity(writes.len());
                for write in &writes {
                    answers.push(lone.alone(write).await);
                }
                return answers;
            }
        }
    }
    match tx.commit().await {
        Ok(()) => answers,
        Err(error) => all_fail(error, writes.len()),
    }
}
