//! What a store needs for transactional mode: to begin a delivery in a transaction.

use std::fmt;
use std::time::Duration;

use sqlx::{Database, Transaction};

use super::{Claim, Completed, LeaseToken, Pending, Store, StoreError};
use crate::key::IdempotencyKey;

/// A store that can run a delivery in one database transaction: the SQL stores.
pub trait TransactionalStore: Store + Clone {
    /// The database the store's pool talks to.
    type Database: Database;

    /// Begins a transaction and inserts the marker of `key` as `done` in it, the marker's lock
    /// wait bounded by `lock_timeout` (on PostgreSQL every lock wait of the transaction is,
    /// with `SET LOCAL`; on MySQL, MariaDB and SQLite only the marker's, and the connection's
    /// own setting is put back). A duplicate's insert waits for an open transaction
    /// holding the same key.
    fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: Duration,
    ) -> impl Future<Output = Result<Begin<Self::Database>, StoreError>> + Send;

    /// Whether the transaction on `conn` still holds the marker [`begin`](Self::begin)
    /// inserted with `token`. Asked just before `COMMIT`: a transaction that a failed statement
    /// aborted (PostgreSQL then turns `COMMIT` into a silent rollback) or that the database
    /// rolled back (a MySQL deadlock) answers no, or fails.
    fn holds_marker(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`TransactionalStore::begin`] found.
#[non_exhaustive]
pub enum Begin<DB: Database> {
    /// The marker, with this fencing token, is inserted in this open transaction.
    Claimed(Transaction<'static, DB>, LeaseToken),
    /// The event was committed already.
    Done(Completed),
    /// A claim-then-commit delivery holds the key, or the first delivery's transaction did not
    /// finish within the lock timeout.
    InFlight(Pending),
}

impl<DB: Database> Begin<DB> {
    /// The answer when a duplicate's wait for the first delivery's transaction timed out.
    pub(crate) fn lock_timed_out(waited: Duration) -> Self {
        Self::InFlight(Pending::new(waited, Duration::ZERO, 0))
    }
}

/// Turns the claim read from the marker's insert into the answer of
/// [`TransactionalStore::begin`]. When the key exists already, the transaction holds at most
/// the delivery count (MySQL does not count in this mode): it is committed.
pub(crate) async fn begun<DB: Database>(
    claim: Claim,
    tx: Transaction<'static, DB>,
) -> Result<Begin<DB>, StoreError> {
    let begin = match claim {
        Claim::Acquired(lease) => return Ok(Begin::Claimed(tx, lease.token())),
        Claim::Done(done) => Begin::Done(done),
        Claim::InFlight(pending) | Claim::Held(pending) => Begin::InFlight(pending),
    };
    tx.commit().await.map_err(StoreError::backend)?;
    Ok(begin)
}

impl<DB: Database> fmt::Debug for Begin<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claimed(..) => f.write_str("Claimed(..)"),
            Self::Done(done) => f.debug_tuple("Done").field(done).finish(),
            Self::InFlight(pending) => f.debug_tuple("InFlight").field(pending).finish(),
        }
    }
}
