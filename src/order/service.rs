use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::error::OrderError;
use super::store::{VersionClaim, VersionLease, VersionStore};
use super::version::ExtractVersion;
use crate::body::{RequestBody, ResponseBody};
use crate::future::ResponseFuture;
use crate::key::{ExtractKey, IdempotencyKey};
use crate::layer::{Config, MissingKey};
use crate::response::{self, Outcome};
use crate::service::{
    BoxError, LeaseGuard, Leases, Settle, acquire, check_len, pass_through, take_body, with_outcome,
};
use crate::store::{LeaseToken, Pending, StoreError};

/// The service made by [`OrderLayer`](super::OrderLayer): begin the entity's version, run the
/// inner service, then commit or release it.
///
/// The inner service receives `Request<RequestBody<B>>` and its error type is kept: the
/// layer's own outcomes (outdated, busy, bad entity or version, store down) are responses.
pub struct Order<S, St, E, V> {
    inner: S,
    shared: Arc<OrderShared<St, E, V>>,
}

pub(crate) struct OrderShared<St, E, V> {
    pub(crate) store: St,
    pub(crate) entity: E,
    pub(crate) version: V,
    pub(crate) config: Config,
}

impl<S, St, E, V> Order<S, St, E, V> {
    pub(crate) fn new(inner: S, shared: Arc<OrderShared<St, E, V>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, St, E, V> Clone for Order<S, St, E, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, E: fmt::Debug, V: fmt::Debug> fmt::Debug
    for Order<S, St, E, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Order")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("entity", &self.shared.entity)
            .field("version", &self.shared.version)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, St, E, V, ReqB, ResB> Service<Request<ReqB>> for Order<S, St, E, V>
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
        ResponseFuture::new(Box::pin(deliver(self.shared.clone(), inner, req)))
    }
}

/// One delivery, from entity and version to commit or release.
async fn deliver<S, St, E, V, ReqB, ResB>(
    shared: Arc<OrderShared<St, E, V>>,
    mut inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    St: VersionStore,
    E: ExtractKey,
    V: ExtractVersion,
    ReqB: Body<Data = Bytes>,
    ReqB::Error: Into<BoxError>,
{
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    let entity_reads = shared.entity.reads_body(&parts);
    let version_reads = shared.version.reads_body(&parts);
    let (bytes, body) = match take_body(entity_reads || version_reads, &parts, body, config).await {
        Ok(taken) => taken,
        Err(error) => return Ok(reject(&OrderError::Body(error))),
    };
    let entity_body = bytes.as_deref().filter(|_| entity_reads);
    let version_body = bytes.as_deref().filter(|_| version_reads);
    let entity = check_len(shared.entity.extract(&parts, entity_body), config);
    let version = shared.version.extract(&parts, version_body);
    let (entity, version) = match (entity.map_err(OrderError::entity), version) {
        (Ok(entity), Ok(version)) => (entity, version),
        (entity, version) => {
            let errors = [entity.err(), version.err().map(OrderError::version)];
            let mut errors = errors.into_iter().flatten();
            let first = errors.next().expect("one of them failed");
            let error = match errors.next() {
                // Report what is wrong rather than what is absent.
                Some(second) if first.is_missing() && !second.is_missing() => second,
                _ => first,
            };
            let all_missing = error.is_missing();
            if all_missing && config.missing_key == MissingKey::PassThrough {
                tracing::debug!(%error, "delivery without entity or version");
                return pass_through(inner, Request::from_parts(parts, body)).await;
            }
            return Ok(reject(&error));
        }
    };

    let owner = shared.clone();
    let owned_entity = entity.clone();
    let beginning = async move {
        let stale = owner.config.stale;
        owner
            .store
            .begin_version(&owned_entity, version, stale)
            .await
    };
    let owner = shared.clone();
    let orphaned = move |claim| async move {
        if let VersionClaim::Acquired(lease) = claim {
            let result = owner.store.release_version(&lease).await;
            tracing::debug!(
                namespace = lease.entity().namespace(),
                entity = lease.entity().value(),
                version = lease.version(),
                lease = %lease.token(),
                released = result.is_ok(),
                "the delivery went away while it began its version; the version was released",
            );
        }
    };
    let claim = acquire(beginning, config.store_timeout, "version claim", orphaned).await;
    let lease = match claim {
        Ok(VersionClaim::Acquired(lease)) => lease,
        Ok(VersionClaim::Outdated { applied }) => {
            record(&entity, version, None, Outcome::Outdated);
            tracing::trace!(applied, "outdated version");
            return Ok(response::outdated());
        }
        Ok(VersionClaim::Busy(pending)) => {
            record(&entity, version, None, Outcome::InFlight);
            tracing::trace!(pending = pending.version, age = ?pending.age, "entity busy");
            return Ok(response::entity_busy(config.retry_after));
        }
        Ok(VersionClaim::Held(pending)) => {
            record(&entity, version, None, Outcome::Held);
            tracing::warn!(
                namespace = entity.namespace(),
                entity = entity.value(),
                pending = pending.version,
                age = ?pending.age,
                "stale pending version held for review: resolve it with \
                 VersionStore::resolve_version",
            );
            if let Some(hook) = &config.on_held {
                hook(&entity, &Pending::new(pending.age, 0));
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
            return Ok(response::store_unavailable(config.retry_after));
        }
    };

    let mut guard = LeaseGuard::new(shared.clone(), lease);
    // `call` runs inside the caught future, so a panic in `call` itself is caught as well.
    let request = Request::from_parts(parts, body);
    let result = AssertUnwindSafe(async move {
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(request).await
    })
    .catch_unwind()
    .await;
    match result {
        Ok(Ok(res)) => {
            let outcome = if (config.commit_when)(res.status()) {
                guard.settle(Settle::Commit).await
            } else {
                guard.settle(Settle::Release).await
            };
            Ok(with_outcome(res, outcome))
        }
        Ok(Err(error)) => {
            guard.settle(Settle::Release).await;
            Err(error)
        }
        Err(panic) => {
            guard.abandon().await;
            std::panic::resume_unwind(panic)
        }
    }
}

fn reject<B>(error: &OrderError) -> Response<ResponseBody<B>> {
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

impl<St: VersionStore, E: ExtractKey, V: ExtractVersion> Leases for OrderShared<St, E, V> {
    type Lease = VersionLease;
    const WHAT: &'static str = "pending version";

    fn config(&self) -> &Config {
        &self.config
    }

    async fn settle(&self, lease: &VersionLease, action: Settle) -> Result<(), StoreError> {
        match action {
            Settle::Commit => self.store.commit_version(lease).await,
            Settle::Release => self.store.release_version(lease).await,
        }
    }

    fn report(lease: &VersionLease, action: Settle, result: &Result<(), StoreError>) -> Outcome {
        let outcome = match action {
            Settle::Commit => Outcome::Processed,
            Settle::Release => Outcome::Released,
        };
        let entity = lease.entity();
        record(entity, lease.version(), Some(lease.token()), outcome);
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
                "recording the applied version failed after the handler succeeded; the \
                 pending version will turn stale",
            ),
            (Err(error), Settle::Release) => tracing::error!(
                namespace = entity.namespace(),
                entity = entity.value(),
                version = lease.version(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                "release of the pending version failed; it will turn stale",
            ),
        }
        outcome
    }

    fn describe(lease: &VersionLease) -> (&IdempotencyKey, LeaseToken) {
        (lease.entity(), lease.token())
    }
}
