//! The writes the SQL stores batch, whatever the database: a claim's first statement, a
//! commit, an inbox entry's insert.

use crate::key::IdempotencyKey;
use crate::store::{Lease, LeaseToken, Receipt};

use std::future::Future;

use super::{Answers, Keyed, all_fail};
use crate::store::StoreError;

/// A claim's first statement, for one key: `token` is written if it inserts the row.
pub(crate) struct ClaimWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) token: LeaseToken,
    /// Whether the key is likely new (the store's last claim found its key so): sent alone,
    /// the write then inserts without reading first, and reads only if the key has a row.
    /// PostgreSQL and MariaDB.
    pub(crate) likely_new: bool,
}

/// A commit (with its receipt, encoded), for one lease. It is answered with the rows it
/// matched, not those it changed (MySQL: sqlx sets `CLIENT_FOUND_ROWS`), so that a repeated
/// commit holds; the row keeps what the first commit wrote.
pub(crate) struct CommitWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) token: LeaseToken,
    pub(crate) receipt: Option<Vec<u8>>,
}

impl CommitWrite {
    /// The commit of `lease`, keeping `receipt`.
    pub(crate) fn of(lease: &Lease, receipt: Option<&Receipt>) -> Self {
        Self {
            key: lease.key().clone(),
            token: lease.token(),
            receipt: receipt.map(Receipt::encode),
        }
    }
}

/// An inbox entry's insert, with its request encoded.
#[cfg(feature = "postgres")]
pub(crate) struct EnqueueWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) request: Vec<u8>,
}

impl Keyed for ClaimWrite {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }
}

impl Keyed for CommitWrite {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }
    fn bytes(&self) -> usize {
        self.receipt.as_ref().map_or(0, Vec::len)
    }
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

/// A [`Batcher`](super::Batcher) of `$shape` whose lone write is `$lone.$one(&write)` and
/// whose batch is `$on.$many(writes)`, both `Arc`s the batcher keeps clones of.
macro_rules! batcher {
    ($shape:expr, $lone:ident . $one:ident, $on:ident . $many:ident) => {{
        let (lone, on) = ($lone.clone(), $on.clone());
        $crate::store::batch::Batcher::new(
            $shape,
            move |write| {
                let lone = lone.clone();
                async move { lone.$one(&write).await }
            },
            move |writes| {
                let on = on.clone();
                async move { on.$many(writes).await }
            },
        )
    }};
}
pub(crate) use batcher;
