//! The version guard's store on Redis: one hash per entity, each step one script.

use super::claims::{as_micros, micros};
use super::scripts::{BEGIN_VERSION, RENEW_VERSION, SETTLE_VERSION};
use super::{RedisStore, arg, lease_held, unreplicated};
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
        let args = self.settle_args(token, how);
        self.settle(&SETTLE_VERSION, &self.entity_of(entity), &args)
            .await
    }

    /// Applies (`apply`) or discards the lease's own pending version: [`StoreError::LeaseLost`]
    /// unless the lease held.
    async fn settle_lease(&self, lease: &VersionLease, how: &str) -> Result<(), StoreError> {
        lease_held(
            self.settle_version(lease.entity(), Some(lease.token()), how)
                .await?,
        )
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
        let args = [
            arg(version),
            arg(ours.to_i64()),
            arg(u8::from(stale.policy() == StalePolicy::Reclaim)),
            arg(as_micros(stale.after())),
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
        self.heartbeat(&RENEW_VERSION, &key, lease.token()).await
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.settle_lease(lease, "apply").await
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.settle_lease(lease, "discard").await
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
