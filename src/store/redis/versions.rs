//! The version guard's store on Redis: one hash per entity, each step one script.

use super::claims::micros;
use super::scripts::{BEGIN_VERSION, RENEW_VERSION, SETTLE_VERSION};
use super::{RedisStore, arg, unreplicated};
use crate::key::IdempotencyKey;
use crate::store::{
    LeaseToken, Resolution, Stale, StalePolicy, StoreError, VersionClaim, VersionLease,
    VersionStore,
};

/// What `BEGIN_VERSION` answers: applied version, pending version, pending token, idle µs.
type BeginReply = (Option<String>, Option<String>, Option<String>, i64);

/// A version as the scripts keep it (decimal text), read back.
fn version(text: &str) -> Result<i64, StoreError> {
    text.parse()
        .map_err(|_| StoreError::backend(format!("a version in Redis is not an integer: {text:?}")))
}

impl RedisStore {
    /// Applies (`apply`) or discards the pending version: the lease's (`token`), or whoever's
    /// (a person resolving).
    async fn settle_version(
        &self,
        entity: &IdempotencyKey,
        token: Option<LeaseToken>,
        how: &str,
    ) -> Result<bool, StoreError> {
        let (settled, replicated): (i64, bool) = self
            .write(
                &SETTLE_VERSION,
                &self.entity_of(entity),
                &self.settle_args(token, how),
            )
            .await?;
        if settled == 1 && !replicated {
            return Err(unreplicated());
        }
        Ok(settled == 1)
    }

    /// The arguments of `SETTLE_VERSION` for the lease's `token`, or for a person: with a
    /// fresh token of this settlement's own, by which the script knows it if it is sent again.
    pub(super) fn settle_args(&self, token: Option<LeaseToken>, how: &str) -> [Vec<u8>; 4] {
        let token = token.map_or_else(String::new, |t| t.to_i64().to_string());
        [
            arg(token),
            arg(how),
            arg(LeaseToken::generate().to_i64()),
            arg(self.retention_ms()),
        ]
    }
}

impl VersionStore for RedisStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        let ours = LeaseToken::generate();
        let key = self.entity_of(entity);
        let stale_us = i64::try_from(stale.after().as_micros()).unwrap_or(i64::MAX);
        let args = [
            arg(version),
            arg(ours.to_i64()),
            arg(u8::from(stale.policy() == StalePolicy::Reclaim)),
            arg(stale_us),
        ];
        let ((applied, pending, token, idle), replicated): (BeginReply, bool) =
            self.write(&BEGIN_VERSION, &key, &args).await?;
        let applied = applied.as_deref().map(self::version).transpose()?;
        let pending = match (pending, token) {
            (Some(pending), Some(token)) => {
                let token = token.parse::<i64>().map_err(|_| {
                    StoreError::backend(format!(
                        "a version token in Redis is not an integer: {token:?}"
                    ))
                })?;
                Some((
                    self::version(&pending)?,
                    LeaseToken::from_i64(token),
                    micros(idle),
                ))
            }
            _ => None,
        };
        let claim = crate::store::decide(entity, version, ours, stale, applied, pending)
            .ok_or_else(|| StoreError::backend("inconsistent version hash in Redis"))?;
        if matches!(claim, VersionClaim::Acquired(_)) && !replicated {
            // Granted on the master alone: given back, so that the entity is not blocked by
            // a version nobody applies.
            let discard = self.settle_args(Some(ours), "discard");
            let _: Result<i64, _> = self.call(&SETTLE_VERSION, &key, &discard).await;
            return Err(unreplicated());
        }
        Ok(claim)
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let key = self.entity_of(lease.entity());
        let held: i64 = self
            .call(&RENEW_VERSION, &key, &[arg(lease.token().to_i64())])
            .await?;
        if held == 1 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        }
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        match self
            .settle_version(lease.entity(), Some(lease.token()), "apply")
            .await?
        {
            true => Ok(()),
            false => Err(StoreError::LeaseLost),
        }
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        match self
            .settle_version(lease.entity(), Some(lease.token()), "discard")
            .await?
        {
            true => Ok(()),
            false => Err(StoreError::LeaseLost),
        }
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        let applied: Option<String> = redis::cmd("HGET")
            .arg(self.entity_of(entity))
            .arg("applied")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)?;
        applied.as_deref().map(version).transpose()
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let how = match resolution {
            Resolution::Done => "apply",
            Resolution::Release => "discard",
        };
        self.settle_version(entity, None, how).await
    }
}
