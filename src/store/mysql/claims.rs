//! The store contract on MySQL and on MariaDB: [`Store`] for [`MySqlStore`], and how a claim
//! is made: one upsert with `RETURNING` on MariaDB 10.5 and later (while keys come new, an
//! `INSERT IGNORE` first), an insert then a read (unless it inserted) on MySQL and on older
//! MariaDB.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

use super::{MySqlFlavor, MySqlStore, flavor_of};
use crate::key::IdempotencyKey;
use crate::store::batch::{ClaimWrite, CommitWrite};
use crate::store::sql::{self, AfterRead, ClaimRow, ResultExt as _};
use crate::store::{
    Claim, KeyState, Lease, LeaseToken, Receipt, Stale, StalePolicy, Store, StoreError,
};

impl MySqlStore {
    fn upsert<'q>(
        &self,
        sql: &Arc<str>,
        key: &'q IdempotencyKey,
        token: LeaseToken,
        stale: Stale,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .bind(stale.policy() == StalePolicy::Reclaim)
            .bind(sql::micros(stale.after()));
        for _ in 0..8 {
            query = query.bind(token.to_i64());
        }
        query
    }

    /// A claim's first statement, and what the claim does next: `key` inserted if it is
    /// new, or its row read without writing it. MariaDB does both in one statement (while keys
    /// come new, after an `INSERT IGNORE` that inserted nothing); MySQL reads after an insert
    /// that was ignored.
    pub(super) async fn insert_or_read(
        &self,
        flavor: MySqlFlavor,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> Result<AfterRead, StoreError> {
        let token = LeaseToken::generate();
        let insert = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .bind(token.to_i64())
        };
        if flavor == MySqlFlavor::MariaDb {
            let write = ClaimWrite {
                key: key.clone(),
                token,
                likely_new: self.new_keys.likely(),
            };
            let row = (self.batches.claims.write(write).await)
                .inspect_err(|error| self.table.unanswered(key, token, error))?;
            self.new_keys.saw(Some(&row), token);
            return self.table.after_read(key, Some(row), Some(token), stale);
        }
        let inserted = insert(&self.claims.insert_new)
            .execute(&self.table.pool)
            .await
            .store()
            .inspect_err(|error| self.table.unanswered(key, token, error))?;
        if inserted.rows_affected() == 1 {
            let lease = Lease::new(key.clone(), token, false).with_deliveries(1);
            return Ok(AfterRead::Answer(Claim::Acquired(lease)));
        }
        let row = self.table.read_claim(key).await?;
        self.table.after_read(key, row, None, stale)
    }

    /// The commit of `lease`, in the next batch of commits when one is in flight.
    async fn commit_batched(
        &self,
        lease: &Lease,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let write = CommitWrite::of(lease, receipt);
        sql::held(self.batches.commits.write(write).await?)
    }

    /// MariaDB 10.5 and later: one upsert, returning the row.
    pub(super) async fn claim_returning(
        &self,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> Result<Claim, StoreError> {
        let token = LeaseToken::generate();
        self.upsert(&self.claims.returning, key, token, stale)
            .fetch_one(&self.table.pool)
            .await
            .store()
            .and_then(|row| ClaimRow::read(&row)?.into_claim(key, token, stale))
            .inspect_err(|error| self.table.unanswered(key, token, error))
    }

    /// MySQL and older MariaDB: the upsert, and a read of the row unless it inserted.
    pub(super) async fn claim_and_read(
        &self,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> Result<Claim, StoreError> {
        let token = LeaseToken::generate();
        // A row that vanishes between the two statements more than twice in a row means
        // something else is deleting keys as fast as they are claimed.
        for _ in 0..3 {
            let upserted = self
                .upsert(&self.table.sql.claim, key, token, stale)
                .execute(&self.table.pool)
                .await
                .store()
                .inspect_err(|error| self.table.unanswered(key, token, error))?;
            if upserted.rows_affected() == 1 {
                // Inserted: a new key.
                return Ok(Claim::Acquired(
                    Lease::new(key.clone(), token, false).with_deliveries(1),
                ));
            }
            // Updated an existing row: read what it is now. Only this claim knows `token`, so
            // a row holding it is ours; any other row is someone else's.
            let row = sqlx::query(AssertSqlSafe(self.claims.read.clone()))
                .bind(key.namespace())
                .bind(key.value())
                .fetch_optional(&self.table.pool)
                .await
                .store()
                .inspect_err(|error| self.table.unanswered(key, token, error))?;
            if let Some(row) = row {
                let row = ClaimRow::read(&row)?;
                let ours = LeaseToken::from_i64(row.token) == token;
                if ours || KeyState::parse(&row.state) != Some(KeyState::Released) {
                    return row.into_claim(key, token, stale);
                }
            }
            // Released (by the owner the upsert saw) or purged between the two statements:
            // claim again.
        }
        Err(StoreError::backend(
            "the claimed row vanished between the upsert and the read, three times",
        ))
    }

    /// The claim row of `key`, read on `conn`.
    pub(super) async fn read_claim(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &IdempotencyKey,
    ) -> Result<ClaimRow, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.claims.read.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .fetch_one(conn)
            .await
            .store()?;
        ClaimRow::read(&row)
    }

    /// The flavor, asked on `conn` if not known yet: inside a transaction, the pool may have
    /// no other connection to spare.
    pub(super) async fn flavor_on(
        &self,
        conn: &mut sqlx::MySqlConnection,
    ) -> Result<MySqlFlavor, StoreError> {
        self.flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&mut *conn)
                    .await
                    .store()?;
                Ok(flavor_of(&version))
            })
            .await
            .copied()
    }
}

/// A claim is one statement on MariaDB 10.5 and later, two on MySQL and older MariaDB; every
/// other operation is one (see the [module docs](crate::store::mysql#round-trips)).
impl Store for MySqlStore {
    /// An insert that writes nothing on a duplicate, and answers it (MariaDB returns the row
    /// in the same statement; MySQL reads it); only a released row, or a stale one under
    /// reclaim, takes the upsert of the module docs.
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let flavor = self.flavor().await?;
        // A row that vanishes between the two statements more than twice in a row means
        // something else is deleting keys as fast as they are claimed.
        for _ in 0..3 {
            match self.insert_or_read(flavor, key, stale).await? {
                AfterRead::Answer(claim) => return Ok(claim),
                AfterRead::TakeOver => break,
                AfterRead::Absent => {}
            }
        }
        match flavor {
            MySqlFlavor::MariaDb => self.claim_returning(key, stale).await,
            MySqlFlavor::MySql => self.claim_and_read(key, stale).await,
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

/// The statements a write runs when it goes alone, as without batching: a claim's first
/// statement and a commit. (A batch of them is [`batch`](super::batch)'s.) Shared by a
/// store's clones.
pub(super) struct Lone {
    pub(super) pool: sqlx::MySqlPool,
    /// MariaDB's insert-or-read of a claim (see the [module docs](super#round-trips)).
    pub(super) claim: Arc<str>,
    /// The insert alone (`INSERT IGNORE`), for a key likely new.
    pub(super) insert: Arc<str>,
    pub(super) commit: Arc<str>,
}

impl Lone {
    /// The insert-or-read of one key. A key likely new is inserted first (`INSERT IGNORE`,
    /// nothing returned), and read with the insert-or-read only if it has a row.
    pub(super) async fn claim_one(&self, write: &ClaimWrite) -> Result<ClaimRow, StoreError> {
        let statement = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(write.key.namespace())
                .bind(write.key.value())
                .bind(write.token.to_i64())
        };
        if write.likely_new {
            let inserted = statement(&self.insert).execute(&self.pool).await.store()?;
            if inserted.rows_affected() == 1 {
                return Ok(ClaimRow::inserted(write.token));
            }
        }
        let row = statement(&self.claim).fetch_one(&self.pool).await.store()?;
        ClaimRow::read(&row)
    }

    pub(super) async fn commit_one(&self, write: &CommitWrite) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.commit.clone()))
            .bind(write.receipt.as_deref())
            .bind(write.key.namespace())
            .bind(write.key.value())
            .bind(write.token.to_i64())
            .execute(&self.pool)
            .await
            .store()?;
        Ok(done.rows_affected())
    }
}
