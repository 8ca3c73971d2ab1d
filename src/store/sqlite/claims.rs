//! The store contract on SQLite: [`Store`] for [`SqliteStore`], each step one statement but
//! the claim, which takes one or two.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::key::IdempotencyKey;
use crate::store::batch::Keyed;
use crate::store::sql::{AfterRead, ClaimRow, ResultExt as _, Table, held, micros, returned};
use crate::store::{Claim, Lease, LeaseToken, Receipt, Stale, StalePolicy, Store, StoreError};

/// Every operation but the claim is one statement (see the [module
/// docs](crate::store::sqlite#round-trips) for the SQL).
impl Store for SqliteStore {
    /// When the store's last claim found its key new and no write of this process is in
    /// flight or waiting, the insert of a new key in the writer's turn, the row read only if
    /// the key has one; otherwise a read first, which answers a duplicate without writing.
    /// Then, for a key with no row, a released one, or a stale one under reclaim, the upsert
    /// of the module docs.
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let table = &self.table;
        let token = LeaseToken::generate();
        let (mut entered, mut insert_failed) = (None, false);
        if self.new_keys.likely() && table.writer_idle() {
            let write = Write::Enter {
                key: key.clone(),
                token,
            };
            match self.batches.write_if_idle(write).await {
                Ok(Ok(Wrote::Found(row))) => entered = Some(row),
                Ok(Ok(_)) => {
                    table.unanswered(key, token, &mixed_up());
                    return Err(mixed_up());
                }
                // The insert failed: read first, as after a duplicate. Should it have written
                // the row after all, the row holds this claim's token, and the read finds it
                // so.
                Ok(Err(error)) => {
                    insert_failed = true;
                    tracing::debug!(
                        error = &error as &dyn std::error::Error,
                        "the insert of a key guessed new failed; reading the key's row instead",
                    );
                }
                // A write is in flight: read first, so that a duplicate need not wait for it.
                Err(_) => {}
            }
        }
        let row = match entered {
            Some(row) => row,
            // Should the read fail too, a row the failed insert did write is given back.
            None => table.read_claim(key).await.inspect_err(|error| {
                if insert_failed {
                    table.unanswered(key, token, error);
                }
            })?,
        };
        self.new_keys.saw(row.as_ref(), token);
        match table.after_read(key, row, Some(token), stale)? {
            AfterRead::Answer(claim) => Ok(claim),
            AfterRead::TakeOver | AfterRead::Absent => {
                let token = LeaseToken::generate();
                let write = Write::Claim {
                    key: key.clone(),
                    token,
                    reclaim: stale.policy() == StalePolicy::Reclaim,
                    stale_us: micros(stale.after()),
                };
                let claim = self
                    .batches
                    .write(write)
                    .await
                    .and_then(|wrote| match wrote {
                        Wrote::Row(row) => row.into_claim(key, token, stale),
                        _ => Err(mixed_up()),
                    });
                claim.inspect_err(|error| table.unanswered(key, token, error))
            }
        }
    }

    /// In the next batch of commits when one is in flight.
    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.commit_batched(lease, None).await
    }

    /// In the next batch of commits when one is in flight.
    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        self.commit_batched(lease, Some(receipt)).await
    }

    crate::store::sql::store_forwards!(shared);
}

impl SqliteStore {
    /// The commit of `lease`, in the next batch of writes when one is in flight.
    async fn commit_batched(
        &self,
        lease: &Lease,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let write = Write::Commit {
            key: lease.key().clone(),
            token: lease.token(),
            receipt: receipt.map(Receipt::encode),
        };
        match self.batches.write(write).await? {
            Wrote::Matched(matched) => held(matched),
            Wrote::Row(_) | Wrote::Found(_) => Err(mixed_up()),
        }
    }
}

/// A write answered with what another kind of write answers: a defect of the batch.
fn mixed_up() -> StoreError {
    StoreError::backend("a batched write was answered for another kind of write")
}

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

/// The statements a write runs, alone (as without batching) or in a batch's transaction: a
/// claim's and a commit's here, an inbox entry's insert beside the inbox. Shared by a store's
/// clones.
pub(super) struct Lone {
    pub(super) table: Table<Sqlite>,
    /// The insert of a claim that guesses its key is new.
    pub(super) enter: Arc<str>,
    /// The inbox's insert.
    pub(super) enqueue: Arc<str>,
}

impl Lone {
    /// One write on its own, committed alone, in the writer's turn its caller holds.
    pub(super) async fn alone(&self, write: &Write) -> Result<Wrote, StoreError> {
        match self.table.pool.acquire().await {
            Ok(mut conn) => self.write_on(&mut conn, write).await,
            Err(error) => Err(StoreError::backend(error)),
        }
    }

    /// One write's statement, on `conn`.
    pub(super) async fn write_on(
        &self,
        conn: &mut SqliteConnection,
        write: &Write,
    ) -> Result<Wrote, StoreError> {
        let table = &self.table;
        match write {
            Write::Enter { key, token } => {
                // Run to its end, its commit included: a commit that fails is answered.
                let inserted = sqlx::query(AssertSqlSafe(self.enter.clone()))
                    .bind(key.namespace())
                    .bind(key.value())
                    .bind(token.to_i64())
                    .execute(&mut *conn)
                    .await
                    .store()?;
                match inserted.rows_affected() {
                    0 => table.read_claim_on(&mut *conn, key).await.map(Wrote::Found),
                    _ => Ok(Wrote::Found(Some(ClaimRow::inserted(*token)))),
                }
            }
            Write::Claim {
                key,
                token,
                reclaim,
                stale_us,
            } => {
                let row = sqlx::query(AssertSqlSafe(table.sql.claim.clone()))
                    .bind(key.namespace())
                    .bind(key.value())
                    .bind(token.to_i64())
                    .bind(*reclaim)
                    .bind(*stale_us)
                    .fetch_all(&mut *conn)
                    .await
                    .store()?;
                ClaimRow::read(&returned(row)?).map(Wrote::Row)
            }
            Write::Commit {
                key,
                token,
                receipt,
            } => {
                let done = sqlx::query(AssertSqlSafe(table.sql.commit.clone()))
                    .bind(receipt.as_deref())
                    .bind(key.namespace())
                    .bind(key.value())
                    .bind(token.to_i64())
                    .execute(&mut *conn)
                    .await
                    .store()?;
                Ok(Wrote::Matched(done.rows_affected()))
            }
            Write::Enqueue { key, request } => self.enqueue_on(conn, key, request).await,
        }
    }
}
