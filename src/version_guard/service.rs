use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::error::VersionGuardError;
use super::version::ExtractVersion;
use crate::MissingKey;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::acquire::acquire;
use crate::engine::guard::{LeaseGuard, Leased, Owner, Settle};
use crate::engine::observe::observed;
use crate::engine::prepare::{
    self, BoxError, check_len, pass_through, take_body, verified, verifies,
};
use crate::engine::run::{Detach, run};
use crate::engine::settings::HeldHook;
use crate::engine::settings::Settings;
use crate::future::ResponseFuture;
use crate::key::{ExtractKey, IdempotencyKey};
use crate::replay::Nothing;
use crate::response::{self, Outcome};
use crate::store::{LeaseToken, Pending, Stale, StoreError};
use crate::store::{PendingVersion, VersionClaim, VersionLease, VersionStore};

/// The service made by [`VersionGuardLayer`](super::VersionGuardLayer): begin the entity's version, run the
/// inner service, then commit or release it.
///
/// The inner service receives `Request<RequestBody<B>>` and its error type is kept: the
/// layer's own outcomes (outdated, busy, bad entity or version, store down) are responses.
pub struct VersionGuard<S, St, E, V> {
    inner: S,
    shared: Arc<OrderShared<St, E, V>>,
}

pub(crate) struct OrderShared<St, E, V> {
    pub(crate) store: St,
    pub(crate) entity: E,
    pub(crate) version: V,
    pub(crate) settings: Settings,
    pub(crate) stale: Stale,
    pub(crate) on_held: Option<HeldHook>,
}

impl<S, St, E, V> VersionGuard<S, St, E, V> {
    pub(crate) fn new(inner: S, shared: Arc<OrderShared<St, E, V>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, St, E, V> Clone for VersionGuard<S, St, E, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, E: fmt::Debug, V: fmt::Debug> fmt::Debug
    for VersionGuard<S, St, E, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionGuard")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("entity", &self.shared.entity)
            .field("version", &self.shared.version)
            .field("settings", &self.shared.settings)
            .field("stale", &self.shared.stale)
            .finish()
    }
}

impl<S, St, E, V, ReqB, ResB> Service<Request<ReqB>> for VersionGuard<S, St, E, V>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: VersionStore,
    E: ExtractKey,
    V: ExtractVersion,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    /// Always ready: the inner service is driven to readiness inside the response future, once
    /// the delivery holds the entity's pending version.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        observed(Box::pin(deliver(self.shared.clone(), inner, req)))
    }
}

/// One delivery, from entity and version to commit or release.
async fn deliver<S, St, E, V, ReqB, ResB>(
    shared: Arc<OrderShared<St, E, V>>,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: VersionStore,
    E: ExtractKey,
    V: ExtractVersion,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    let settings = &shared.settings;
    let (parts, body) = req.into_parts();
    let entity_reads = shared.entity.reads_body(&parts);
    let version_reads = shared.version.reads_body(&parts);
    let needed = entity_reads || version_reads || verifies(settings);
    let (bytes, body) = match take_body(needed, &parts, body, settings).await {
        Ok(taken) => taken,
        Err(error) => return Ok(reject(&VersionGuardError::Body(error))),
    };
    if let Err(refused) = verified(settings, &parts, bytes.as_deref()) {
        return Ok(prepare::reject(&refused));
    }
    let entity_body = bytes.as_deref().filter(|_| entity_reads);
    let version_body = bytes.as_deref().filter(|_| version_reads);
    let entity = check_len(shared.entity.extract(&parts, entity_body), settings)
        .and_then(|entity| settings.scope.apply(entity, &parts));
    let version = shared.version.extract(&parts, version_body);
    let (entity, version) = match (entity.map_err(VersionGuardError::entity), version) {
        (Ok(entity), Ok(version)) => (entity, version),
        (entity, version) => {
            let errors = [entity.err(), version.err().map(VersionGuardError::version)];
            let mut errors = errors.into_iter().flatten();
            let first = errors.next().expect("one of them failed");
            let error = match errors.next() {
                // Report what is wrong rather than what is absent.
                Some(second) if first.is_missing() && !second.is_missing() => second,
                _ => first,
            };
            let all_missing = error.is_missing();
            if all_missing && settings.missing_key == MissingKey::PassThrough {
                tracing::debug!(%error, "delivery without entity or version");
                return pass_through(inner, Request::from_parts(parts, body)).await;
            }
            return Ok(reject(&error));
        }
    };

    let Some(entry) = settings.drain.enter() else {
        record(&entity, version, None, Outcome::Draining);
        return Ok(response::draining(settings.retry_after));
    };
    let owner = shared.clone();
    let owned_entity = entity.clone();
    let beginning = async move {
        let stale = owner.stale;
        let claim = owner
            .store
            .begin_version(&owned_entity, version, stale)
            .await?;
        Ok(match claim {
            VersionClaim::Acquired(lease) => {
                Begun::Acquired(LeaseGuard::claimed(owner, lease, entry))
            }
            VersionClaim::Outdated { applied } => Begun::Outdated(applied),
            VersionClaim::Busy(pending) => Begun::Busy(pending),
            VersionClaim::Held(pending) => Begun::Held(pending),
        })
    };
    let guard = match acquire(beginning, settings.store_timeout, "version claim").await {
        Ok(Begun::Acquired(guard)) => guard,
        Ok(Begun::Outdated(applied)) => {
            record(&entity, version, None, Outcome::Outdated);
            tracing::trace!(applied, "outdated version");
            return Ok(response::outdated());
        }
        Ok(Begun::Busy(pending)) => {
            record(&entity, version, None, Outcome::InFlight);
            tracing::trace!(pending = pending.version, age = ?pending.age, "entity busy");
            return Ok(response::entity_busy(settings.retry_after));
        }
        Ok(Begun::Held(pending)) => {
            record(&entity, version, None, Outcome::Held);
            tracing::warn!(
                namespace = entity.namespace(),
                entity = entity.value(),
                pending = pending.version,
                age = ?pending.age,
                "stale pending version held for review: resolve it with \
                 VersionStore::resolve_version",
            );
            if let Some(hook) = &shared.on_held {
                hook(&entity, &Pending::new(pending.age, pending.age, 0));
            }
            return Ok(response::entity_held());
        }
        Err(error) => {
            record(&entity, version, None, Outcome::StoreUnavailable);
            tracing::error!(
                namespace = entity.namespace(),
                entity = entity.value(),
                version,
                error = &error as &dyn std::error::Error,
                "version claim failed; the handler does not run",
            );
            return Ok(response::store_unavailable(settings.retry_after));
        }
    };
    let request = Request::from_parts(parts, body);
    match Detach::new(run(guard, inner, request, Nothing)).await {
        Ok(answer) => answer,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// What beginning a version answered, with a granted version already under its guard.
enum Begun<St: VersionStore, E: ExtractKey, V: ExtractVersion> {
    Acquired(LeaseGuard<OrderShared<St, E, V>>),
    Outdated(i64),
    Busy(PendingVersion),
    Held(PendingVersion),
}

fn reject<B>(error: &VersionGuardError) -> Response<ResponseBody<B>> {
    tracing::debug!(outcome = Outcome::Rejected.as_str(), %error, "delivery rejected");
    response::unordered(error)
}

/// The one event every ordered delivery records.
fn record(entity: &IdempotencyKey, version: i64, lease: Option<LeaseToken>, outcome: Outcome) {
    tracing::debug!(
        namespace = entity.namespace(),
        entity = entity.value(),
        version,
        outcome = outcome.as_str(),
        lease = lease.map(tracing::field::display),
        "ordered delivery",
    );
}

impl Leased for VersionLease {
    fn key(&self) -> &IdempotencyKey {
        self.entity()
    }

    fn token(&self) -> LeaseToken {
        self.token()
    }
}

impl<St: VersionStore, E: ExtractKey, V: ExtractVersion> Owner for OrderShared<St, E, V> {
    type Lease = VersionLease;
    const WHAT: &'static str = "pending version";

    fn settings(&self) -> &Settings {
        &self.settings
    }

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

    fn report(lease: &VersionLease, action: Settle, result: &Result<(), StoreError>) {
        let entity = lease.entity();
        record(
            entity,
            lease.version(),
            Some(lease.token()),
            action.outcome_of(result),
        );
        match (result, action) {
            (Ok(()), _) => {}
            (Err(StoreError::LeaseLost), _) => tracing::warn!(
                namespace = entity.namespace(),
                entity = entity.value(),
                version = lease.version(),
                lease = %lease.token(),
                action = ?action,
                "lost the pending version: another delivery took it over; this version was not recorded as applied",
            ),
            (Err(error), Settle::Commit) => tracing::error!(
                namespace = entity.namespace(),
                entity = entity.value(),
                version = lease.version(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                "recording the applied version failed after the handler succeeded; it is \
                 retried in the background",
            ),
            (Err(error), Settle::Release | Settle::GiveBack) => tracing::error!(
                namespace = entity.namespace(),
                entity = entity.value(),
                version = lease.version(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                "release of the pending version failed; it is retried in the background",
            ),
        }
    }
}
