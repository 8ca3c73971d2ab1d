//! What only a batch of several writes needs, on PostgreSQL and MySQL: an inbox entry's
//! insert, the order of a batch's keys, and the way back to the lone path when a batch
//! statement fails.

#[cfg(feature = "postgres")]
use crate::key::IdempotencyKey;

use std::future::Future;

use super::{Answers, Keyed, all_fail};
use crate::store::StoreError;

/// An inbox entry's insert, with its request encoded.
#[cfg(feature = "postgres")]
pub(crate) struct EnqueueWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) request: Vec<u8>,
}

#[cfg(feature = "postgres")]
impl Keyed for EnqueueWrite {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }
    fn bytes(&self) -> usize {
        self.request.len()
    }
}

/// The indexes of `writes` in key order: the order in which a batch statement takes their
/// rows, the same on every instance, so that two batches never wait for each other in a
/// cycle.
pub(crate) fn key_order<W: Keyed>(writes: &[W]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..writes.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (writes[a].key(), writes[b].key());
        (a.namespace(), a.value()).cmp(&(b.namespace(), b.value()))
    });
    order
}

/// What a batch statement answered, or else the answers of its writes: each sent again alone
/// (`alone`) when `retryable` says the statement wrote nothing and may be sent again (a
/// deadlock's victim, a failure to serialize), every one failing with the statement's error
/// otherwise.
pub(crate) async fn or_alone<'w, W, Rows, Out, Fut>(
    answered: Result<Rows, sqlx::Error>,
    writes: &'w [W],
    retryable: fn(&sqlx::Error) -> bool,
    alone: impl FnMut(&'w W) -> Fut,
) -> Result<Rows, Answers<Out>>
where
    Fut: Future<Output = Result<Out, StoreError>>,
{
    match answered {
        Ok(rows) => Ok(rows),
        Err(error) if retryable(&error) => {
            Err(futures_util::future::join_all(writes.iter().map(alone)).await)
        }
        Err(error) => Err(all_fail(error, writes.len())),
    }
}
