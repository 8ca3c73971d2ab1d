//! The store contract on Redis: each step one script on the key's hash.

use std::sync::Arc;
use std::time::Duration;

use super::scripts::{CLAIM, COMMIT, DESCRIBE, GIVE_BACK, RELEASE, RENEW, RESOLVE};
use super::{RedisStore, arg, lease_held, unreplicated};
use crate::key::IdempotencyKey;
use crate::store::give_back_unanswered;
use crate::store::{
    Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale,
    StalePolicy, Store, StoreError, StuckClaim,
};

/// A claim script's answer: kind, token, deliveries, age and idle time (µs), reclaimed,
/// receipt.
pub(super) type ClaimReply = (String, String, u64, i64, i64, i64, Option<Vec<u8>>);

/// Microseconds as a duration; a negative one (a clock stepped back) as zero.
pub(super) fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// A duration as whole microseconds, saturating.
pub(super) fn as_micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

impl RedisStore {
    /// Runs a fenced write on the lease's key: its answer 1 means the lease held.
    async fn fenced(
        &self,
        script: &super::scripts::Scripted,
        lease: &Lease,
        args: &[Vec<u8>],
    ) -> Result<(), StoreError> {
        let key = self.key_of(lease.key());
        let mut all = vec![arg(lease.token().to_i64())];
        all.extend_from_slice(args);
        lease_held(self.settle(script, &key, &all).await?)
    }
}

impl Store for RedisStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let token = LeaseToken::generate();
        let redis_key = self.key_of(key);
        let reclaim = stale.policy() == StalePolicy::Reclaim;
        let args = [
            arg(token.to_i64()),
            arg(u8::from(reclaim)),
            arg(as_micros(stale.after())),
            arg(key.namespace()),
            arg(key.value()),
        ];
        let written = self.write(&CLAIM, &redis_key, &args).await;
        let (reply, replicated): (ClaimReply, bool) = match written {
            Ok(reply) => reply,
            Err(error) => {
                // The script may have run, its answer lost (the response timeout, a dropped
                // connection): whatever it granted to `token` is given back.
                let store = self.clone();
                give_back_unanswered(key, token, move |lease| {
                    let store = store.clone();
                    async move { store.give_back(&lease).await }
                });
                return Err(error);
            }
        };
        let (kind, _token, deliveries, age, idle, reclaimed, receipt) = reply;
        match kind.as_str() {
            "acquired" if replicated => Ok(Claim::Acquired(
                Lease::new(key.clone(), token, reclaimed == 1).with_deliveries(deliveries),
            )),
            "acquired" => {
                // Granted on the master alone: given back, so that a retry is not turned away
                // by a claim nobody holds.
                let retention = arg(self.retention_ms());
                let _: Result<i64, _> = self
                    .call(&GIVE_BACK, &redis_key, &[arg(token.to_i64()), retention])
                    .await;
                Err(unreplicated())
            }
            // A duplicate, answered without a write: its delivery is counted here.
            "done" => {
                let receipt = receipt
                    .map(|bytes| Receipt::decode(&bytes).map(Arc::new))
                    .transpose()?;
                let deliveries = deliveries.saturating_add(self.count(key));
                Ok(Claim::Done(
                    Completed::new(deliveries).with_receipt(receipt),
                ))
            }
            "pending" => {
                let deliveries = deliveries.saturating_add(self.count(key));
                Ok(stale.pending(micros(age), micros(idle), deliveries))
            }
            other => Err(StoreError::backend(format!(
                "the claim script answered {other:?}"
            ))),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.heartbeat(&RENEW, &self.key_of(lease.key()), lease.token())
            .await
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        let args = [arg(self.retention_ms()), arg("0")];
        self.fenced(&COMMIT, lease, &args).await
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        let args = [arg(self.retention_ms()), arg("1"), receipt.encode()];
        self.fenced(&COMMIT, lease, &args).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&RELEASE, lease, &[arg(self.retention_ms())])
            .await
    }

    /// Releases the claim, as [`release`](Store::release) does, and takes back the run it
    /// counted, once (a second give-back with the same lease answers `Ok` and takes back
    /// nothing more).
    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(&GIVE_BACK, lease, &[arg(self.retention_ms())])
            .await
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        let reply: Vec<redis::Value> = self.call(&DESCRIBE, &self.key_of(key), &[]).await?;
        if reply.len() < 11 {
            return Ok(None);
        }
        let number = |i: usize| -> Result<i64, StoreError> {
            redis::from_redis_value::<Option<i64>>(reply[i].clone())
                .map(Option::unwrap_or_default)
                .map_err(StoreError::backend)
        };
        let now = number(0)?;
        let state: String =
            redis::from_redis_value(reply[1].clone()).map_err(StoreError::backend)?;
        let state = match state.as_str() {
            "processing" => KeyState::Processing,
            "done" => KeyState::Done,
            "released" => KeyState::Released,
            other => {
                return Err(StoreError::backend(format!(
                    "a claim in Redis has the unknown state {other:?}"
                )));
            }
        };
        let ago = |i: usize| number(i).map(|at| micros(now - at));
        let receipt: Option<Vec<u8>> =
            redis::from_redis_value(reply[10].clone()).map_err(StoreError::backend)?;
        let receipt = receipt
            .map(|bytes| Receipt::decode(&bytes).map(Arc::new))
            .transpose()?;
        let mut record = KeyRecord::new(
            state,
            u64::try_from(number(2)?).unwrap_or(0),
            u64::try_from(number(3)?).unwrap_or(0),
        )
        .with_reclaimed(number(4)? == 1)
        .with_seen(ago(5)?, ago(6)?)
        .with_times(ago(7)?, ago(8)?, ago(9)?)
        .with_receipt(receipt);
        self.tally.include(key, &mut record);
        Ok(Some(record))
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        self.stuck(older_than).await
    }

    async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
        let how = match how {
            Resolution::Done => "done",
            Resolution::Release => "release",
        };
        let args = [
            arg(how),
            arg(LeaseToken::generate().to_i64()),
            arg(self.retention_ms()),
        ];
        self.settle(&RESOLVE, &self.key_of(key), &args).await
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.purge(older_than).await
    }
}
