//! The version guard's store on Redis: one hash per entity, each step one script.

use super::RedisStore;
use super::claims::micros;
use super::scripts::{BEGIN_VERSION, RENEW_VERSION, SETTLE_VERSION};
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
    /// Applies (`apply`) or discards the pending version: the lease's (`token`), or whoever's.
    async fn settle_version(
        &self,
        entity: &IdempotencyKey,
        token: Option<LeaseToken>,
        how: &str,
    ) -> Result<bool, StoreError> {
        let key = self.entity_of(entity);
        let token = token.map_or_else(String::new, |t| t.to_i64().to_string());
        let settled: i64 = SETTLE_VERSION
            .key(&key)
            .arg(token)
            .arg(how)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)?;
        if settled == 1 {
            self.replicated(&key).await?;
        }
        Ok(settled == 1)
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
        let (applied, pending, token, idle): BeginReply = BEGIN_VERSION
            .key(&key)
            .arg(version)
            .arg(ours.to_i64())
            .arg(u8::from(stale.policy() == StalePolicy::Reclaim))
            .arg(stale_us)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)?;
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
        if matches!(claim, VersionClaim::Acquired(_)) {
            self.replicated(&key).await?;
        }
        Ok(claim)
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        let held: i64 = RENEW_VERSION
            .key(self.entity_of(lease.entity()))
            .arg(lease.token().to_i64())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)?;
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
