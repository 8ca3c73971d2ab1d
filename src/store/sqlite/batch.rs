//! Group commit on SQLite: the claims, commits and inbox entries of concurrent deliveries go
//! to the database in one transaction (see [`Batcher`]), so that they wait for one sync of
//! the disk together rather than one each. The writes and their lone statements are in
//! `claims.rs`.
//!
//! A lone write is the statement of the [module docs](super#round-trips), in the writer's
//! turn, committed on its own. Writes that arrive while it runs go, in the next turn, in one
//! `BEGIN IMMEDIATE` transaction: each write its own statement (a claim's upsert, a commit's
//! update), the same statements as alone, then one `COMMIT`. A statement that fails rolls the
//! transaction back, and the batch's writes go again one by one, each on its own, so that
//! only the one that fails again fails; a transaction that cannot begin or commit fails
//! every write of the batch (answered 503).

use std::sync::Arc;

use super::claims::{Lone, Write, Wrote};
use crate::store::batch::{Answers, Batcher, Shape, all_fail};

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
