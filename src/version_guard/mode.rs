//! The version guard as a mode of the service shell: begin the entity's version, run the
//! inner service, then record the version as applied or release it.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::error::VersionGuardError;
use super::version::ExtractVersion;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::mode::{
    Configured, HeldHook, LeaseGuard, Leased, MissingKey, Mode, Nothing, Owner, Ran, Refusal,
    Rejection, Settings, Settle, Ticket, acquire, check_len, record, run,
};
use crate::key::{ExtractKey, IdempotencyKey, KeyError};
use crate::response::{Outcome, problem};
use crate::store::{LeaseToken, Pending, Stale, StoreError};
use crate::store::{VersionClaim, VersionLease, VersionStore};

/// The version guard as a mode of the service shell: what a
/// [`VersionGuard`](super::VersionGuard) service does with each delivery, and the settings it
/// does it with. Made by [`VersionGuardLayer`](super::VersionGuardLayer).
#[derive(Debug)]
pub struct VersionMode<St, E, V> {
    pub(crate) store: St,
    pub(crate) entity: E,
    pub(crate) version: V,
    pub(crate) settings: Settings,
    pub(crate) stale: Stale,
    pub(crate) on_held: Option<HeldHook>,
}

/// What the version guard finds of a delivery: the entity, and the version it carries.
pub(crate) struct Found {
    entity: IdempotencyKey,
    version: i64,
}

impl<S, St, E, V, B, ResB> Mode<S, B, ResB> for VersionMode<St, E, V>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: VersionStore,
    E: ExtractKey,
    V: ExtractVersion,
    B: Body + Send + 'static,
    ResB: Send + 'static,
{
    type Found = Found;
    type Held = LeaseGuard<Self>;

    fn reads_body(&self, parts: &Parts) -> bool {
        self.entity.reads_body(parts) || self.version.reads_body(parts)
    }

    fn body_refused(&self, error: KeyError) -> Rejection {
        unordered(VersionGuardError::Body(error))
    }

    fn find(&self, parts: &Parts, body: Option<&Bytes>) -> Result<Option<Found>, Rejection> {
        let settings = &self.settings;
        let entity_body = body
            .filter(|_| self.entity.reads_body(parts))
            .map(|b| &b[..]);
        let version_body = body
            .filter(|_| self.version.reads_body(parts))
            .map(|b| &b[..]);
        let entity = check_len(self.entity.extract(parts, entity_body), settings)
            .and_then(|entity| settings.scope.apply(entity, parts));
        let version = self.version.extract(parts, version_body);
        match (entity.map_err(VersionGuardError::entity), version) {
            (Ok(entity), Ok(version)) => Ok(Some(Found { entity, version })),
            (entity, version) => {
                let errors = [entity.err(), version.err().map(VersionGuardError::version)];
                let mut errors = errors.into_iter().flatten();
                let first = errors.next().expect("one of them failed");
                let error = match errors.next() {
                    // Report what is wrong rather than what is absent.
                    Some(second) if first.is_missing() && !second.is_missing() => second,
                    _ => first,
                };
                if error.is_missing() && settings.missing_key == MissingKey::PassThrough {
                    tracing::debug!(%error, "delivery without entity or version");
                    return Ok(None);
                }
                Err(unordered(error))
            }
        }
    }

    async fn claim(self: Arc<Self>, found: &Found, entry: Ticket) -> Result<Self::Held, Refusal> {
        let (entity, version) = (&found.entity, found.version);
        let owner = self.clone();
        let owned_entity = entity.clone();
        let beginning = async move {
            let stale = owner.stale;
            let claim = owner
                .store
                .begin_version(&owned_entity, version, stale)
                .await?;
            Ok(match claim {
                VersionClaim::Acquired(lease) => Ok(LeaseGuard::claimed(owner, lease, entry)),
                VersionClaim::Outdated { applied } => {
                    tracing::trace!(applied, "outdated version");
                    Err(Refusal::Outdated)
                }
                VersionClaim::InFlight(pending) => {
                    tracing::trace!(pending = pending.version, age = ?pending.age, "another version in flight");
                    Err(Refusal::InFlight(
                        "another version of this entity is being applied; retry later",
                    ))
                }
                VersionClaim::Held(pending) => {
                    tracing::warn!(
                        namespace = owned_entity.namespace(),
                        entity = owned_entity.value(),
                        pending = pending.version,
                        age = ?pending.age,
                        "stale pending version held for review: resolve it with \
                         VersionStore::resolve_version",
                    );
                    if let Some(HeldHook(hook)) = &owner.on_held {
                        hook(&owned_entity, &Pending::new(pending.age, pending.age, 0));
                    }
                    Err(Refusal::Held(
                        "an earlier version of this entity did not finish applying; it is \
                         held for review",
                    ))
                }
            })
        };
        let timeout = self.settings.store_timeout;
        match acquire(beginning, timeout, "claim").await {
            Ok(begun) => begun,
            Err(error) => {
                tracing::error!(
                    namespace = entity.namespace(),
                    entity = entity.value(),
                    version,
                    error = &error as &dyn std::error::Error,
                    "version claim failed; the handler does not run",
                );
                Err(Refusal::StoreUnavailable)
            }
        }
    }

    fn run(
        self: Arc<Self>,
        held: LeaseGuard<Self>,
        inner: S,
        request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static {
        run(held, inner, request, Nothing)
    }

    fn record(&self, found: &Found, outcome: Outcome) {
        record(&found.entity, Some(found.version), None, outcome);
    }

    /// The version guard names no key in its answers: its entities are not the keys of
    /// deliveries.
    fn answered(&self, _found: Found, _res: &mut Response<ResponseBody<ResB>>) {}
}

/// A delivery the version guard cannot order: no usable entity id or version, or an
/// unreadable body. Its 4xx problem+json, with the error in the extensions.
fn unordered(error: VersionGuardError) -> Rejection {
    tracing::debug!(outcome = Outcome::Rejected.as_str(), %error, "delivery rejected");
    let detail = error.to_string();
    let mut res = problem(error.status(), Outcome::Rejected, &detail, error.expected());
    res.extensions_mut().insert(error);
    Rejection::Own(Box::new(res))
}

impl Leased for VersionLease {
    fn key(&self) -> &IdempotencyKey {
        self.entity()
    }

    fn token(&self) -> LeaseToken {
        self.token()
    }

    fn version(&self) -> Option<i64> {
        Some(self.version())
    }
}

impl<St, E, V> Configured for VersionMode<St, E, V> {
    fn settings(&self) -> &Settings {
        &self.settings
    }
}

impl<St: VersionStore, E: ExtractKey, V: ExtractVersion> Owner for VersionMode<St, E, V> {
    type Lease = VersionLease;
    const WHAT: &'static str = "pending version";

    fn stale(&self) -> Stale {
        self.stale
    }

    async fn renew(&self, lease: &VersionLease) -> Result<(), StoreError> {
        self.store.renew_version(lease).await
    }

    /// Versions keep no receipt: the version guard replays nothing.
    async fn settle(
        &self,
        lease: &VersionLease,
        action: Settle,
        _receipt: Option<&crate::store::Receipt>,
    ) -> Result<(), StoreError> {
        match action {
            Settle::Commit => self.store.commit_version(lease).await,
            Settle::Release | Settle::GiveBack => self.store.release_version(lease).await,
        }
    }
}
