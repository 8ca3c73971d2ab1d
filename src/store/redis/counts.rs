//! The deliveries of duplicates, which the claim script answers without a write: counted in
//! the process (the [`Tally`] the SQL stores use too) and added to their hashes in the
//! background, one script per key.

use std::sync::Arc;
use std::time::Duration;

use super::scripts::TALLY;
use super::{Conn, RedisStore, claim_key};
use crate::key::IdempotencyKey;
use crate::store::StoreError;
use crate::store::tally::{Chunk, Tally};

/// A tally of the store's kind, written every `every`: one key a write (a script per key is not
/// atomic across keys), one after another. Sent many at once, they left some keys' claims
/// failing for a minute on a cluster client whose master had just died (`redis_failover`).
pub(super) fn tally(every: Duration) -> Tally {
    Tally::every_in(every, 1)
}

impl RedisStore {
    /// How often the deliveries answered without writing (duplicates, see the [module
    /// docs](super#delivery-counts)) are added to their keys: every second unless set. Set it
    /// before the store is used; clones made earlier keep the old interval.
    pub fn with_count_interval(mut self, every: Duration) -> Self {
        self.tally = Arc::new(tally(every));
        self
    }

    /// Adds the deliveries counted since the last write to their keys now, rather than within
    /// the [count interval](Self::with_count_interval): before the process exits, say, or
    /// before reading the keys by hand. [`describe`](crate::store::Store::describe) and
    /// [`stuck_claims`](crate::store::Store::stuck_claims) include them either way.
    pub async fn write_counts(&self) -> Result<(), StoreError> {
        let counts = self.counts();
        self.tally.write_round(|chunk| counts.write(chunk)).await
    }

    /// Counts a delivery answered without writing; answers how many of the key's deliveries
    /// are unwritten now, this one included.
    pub(super) fn count(&self, key: &IdempotencyKey) -> u64 {
        self.tally.count(key, || {
            let counts = self.counts();
            move |chunk| {
                let counts = counts.clone();
                async move { counts.write(chunk).await }
            }
        })
    }

    /// What writes the tally's counts: the connection and the prefix, not the store, so that
    /// the task writing them ends once every store is gone.
    fn counts(&self) -> Counts {
        Counts {
            conn: self.conn.clone(),
            prefix: self.prefix.clone(),
        }
    }
}

/// Writes counted deliveries to their keys (see [`Tally`]).
#[derive(Clone)]
struct Counts {
    conn: Conn,
    prefix: Arc<str>,
}

impl Counts {
    /// Adds each key's counted deliveries to its hash, one script a key: the tally gives one
    /// key a write, so a failure never leaves a chunk half written.
    async fn write(&self, chunk: Chunk) -> Result<(), StoreError> {
        for (key, seen) in chunk {
            let ago = i64::try_from(seen.last.elapsed().as_micros()).unwrap_or(i64::MAX);
            let mut call = TALLY.script().key(claim_key(&self.prefix, &key));
            call.arg(seen.count).arg(ago);
            let _found: i64 = call
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(StoreError::backend)?;
        }
        Ok(())
    }
}
