//! One delivery in transactional mode: begin, run the handler in the transaction, commit or
//! roll back.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use sqlx::Transaction;
use tokio::sync::Mutex;
use tower_service::Service;

use super::TransactionalStore;
use super::tx::TxHandle;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::drain::{Entry, Stage};
use crate::engine::guard::{LeaseState, Leased};
use crate::engine::observe::observed;
use crate::engine::prepare::{BoxError, Keyed, keyed, pass_through, record, reject, with_outcome};
use crate::engine::run::{Detach, Ran, call};
use crate::engine::settings::Settings;
use crate::future::ResponseFuture;
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::response::{self, Outcome};
use crate::store::{Begin, LeaseToken, StoreError};

pub(super) struct TxShared<St, K> {
    pub(super) store: St,
    pub(super) key: K,
    pub(super) settings: Settings,
    pub(super) lock_timeout: Duration,
}

/// The service of transactional mode. Made by [`TransactionalLayer`](super::TransactionalLayer).
///
/// As in claim-then-commit mode, a handler whose delivery went away runs to its end in a task
/// of its own, and its answer commits or rolls back the transaction.
pub struct TransactionalService<S, St, K = Auto> {
    pub(super) inner: S,
    pub(super) shared: Arc<TxShared<St, K>>,
}

impl<S: Clone, St, K> Clone for TransactionalService<S, St, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, K: fmt::Debug> fmt::Debug for TransactionalService<S, St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalService")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("key", &self.shared.key)
            .field("lock_timeout", &self.shared.lock_timeout)
            .finish()
    }
}

impl<S, St, K, ReqB, ResB> Service<Request<ReqB>> for TransactionalService<S, St, K>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: TransactionalStore,
    K: ExtractKey,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    /// Always ready: the inner service is made ready inside the response future, once the
    /// delivery holds its transaction.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        ResponseFuture::new(Box::pin(observed(deliver(self.shared.clone(), inner, req))))
    }
}

async fn deliver<S, St, K, ReqB, ResB>(
    shared: Arc<TxShared<St, K>>,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: TransactionalStore,
    K: ExtractKey,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    // The whole body is read before the transaction begins: a slow upload must not hold a
    // pooled connection while it trickles in.
    let (key, request) = match keyed(&shared.key, &shared.settings, true, req).await {
        Keyed::Key(key, request) => (key, request),
        Keyed::PassThrough(request) => return pass_through(inner, request).await,
        Keyed::Rejected(error) => return Ok(reject(&error)),
    };
    let mut res = deliver_keyed(&shared, inner, request, &key).await;
    if let Ok(res) = &mut res {
        res.extensions_mut().insert(key);
    }
    res
}

/// The marker a delivery's open transaction holds, as the drain reports it.
#[derive(Clone)]
struct Marker {
    key: IdempotencyKey,
    token: LeaseToken,
}

impl Leased for Marker {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    fn token(&self) -> LeaseToken {
        self.token
    }
}

/// An open transaction counted by the drain until the delivery is settled.
struct Open {
    state: Arc<LeaseState<Marker>>,
    _entry: Entry,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.state.finish();
    }
}

/// One delivery with a valid key, in its own transaction.
async fn deliver_keyed<S, St, K, B, ResB>(
    shared: &Arc<TxShared<St, K>>,
    inner: S,
    request: Request<B>,
    key: &IdempotencyKey,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: TransactionalStore,
    K: ExtractKey,
    B: Send + 'static,
    ResB: Send + 'static,
{
    let settings = &shared.settings;
    let Some(mut entry) = settings.drain.enter() else {
        record(key, Outcome::Draining);
        return Ok(response::draining(settings.retry_after));
    };
    // The lock wait is part of beginning, so the store's own bound comes on top of it. It runs
    // in a task of its own: a store that changes a connection setting for the marker's wait
    // puts it back after the wait, and a delivery dropped meanwhile (its sender hung up, the
    // bound passed) must not cut that short and hand a half-configured connection back to the
    // pool. A transaction that nobody reads then rolls back as the task ends.
    let (store, owned_key, lock_timeout) = (shared.store.clone(), key.clone(), shared.lock_timeout);
    let begin = tokio::spawn(async move { store.begin(&owned_key, lock_timeout).await });
    let bound = settings.store_timeout.saturating_add(shared.lock_timeout);
    let (tx, token) = match tokio::time::timeout(bound, begin).await {
        Ok(Ok(Ok(Begin::Claimed(tx, token)))) => (tx, token),
        Ok(Ok(Ok(Begin::Done(_)))) => {
            record(key, Outcome::Duplicate);
            return Ok(response::duplicate());
        }
        Ok(Ok(Ok(Begin::InFlight(_)))) => {
            record(key, Outcome::InFlight);
            return Ok(response::in_flight(settings.retry_after));
        }
        Ok(Ok(Err(error))) => return Ok(store_failed(settings, key, &error, "could not begin")),
        Ok(Err(panicked)) => {
            let error = StoreError::backend(panicked);
            return Ok(store_failed(settings, key, &error, "could not begin"));
        }
        Err(_) => {
            let error = StoreError::backend("the store did not begin a transaction in time");
            return Ok(store_failed(settings, key, &error, "could not begin"));
        }
    };
    let marker = Marker {
        key: key.clone(),
        token,
    };
    let state = Arc::new(LeaseState::new(marker, "transaction"));
    entry.hold(state.clone());
    let open = Open {
        state,
        _entry: entry,
    };
    let run = run(shared.clone(), open, tx, inner, request);
    match Detach::new(run).await {
        Ok(answer) => answer,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The handler in the delivery's transaction, then `COMMIT` or `ROLLBACK` as it answered.
async fn run<S, St, K, B, ResB>(
    shared: Arc<TxShared<St, K>>,
    open: Open,
    tx: Transaction<'static, St::Database>,
    inner: S,
    mut request: Request<B>,
) -> Ran<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    St: TransactionalStore,
{
    let settings = &shared.settings;
    let key = open.state.lease().key.clone();
    let token = open.state.lease().token;
    let handle = TxHandle {
        slot: Arc::new(Mutex::new(Some(tx))),
    };
    request.extensions_mut().insert(handle.clone());
    // Read only by the `Tx` extractor, to name both databases when a handler asks for another.
    #[cfg(feature = "axum")]
    request
        .extensions_mut()
        .insert(super::tx::TxDatabase(std::any::type_name::<St::Database>()));
    // Should this run be dropped after all (the runtime shuts down), the handle's last clone
    // drops the transaction, and sqlx rolls an unfinished transaction back.
    let res = match call(inner, request).await {
        Ok(Ok(res)) => res,
        Ok(Err(error)) => {
            handle.roll_back(&key).await;
            return Ok(Err(error));
        }
        Err(panic) => {
            handle.roll_back(&key).await;
            return Err(panic);
        }
    };
    open.state.set_stage(Stage::Settling);
    if !settings.commit_when.commits(res.status()) {
        handle.roll_back(&key).await;
        record(&key, Outcome::Released);
        return Ok(Ok(with_outcome(res, Outcome::Released)));
    }
    let Some(mut tx) = handle.take() else {
        let error = StoreError::backend("the handler kept the transaction after it answered");
        return Ok(Ok(store_failed(settings, &key, &error, "could not commit")));
    };
    // A handler that swallowed a failed statement leaves an aborted transaction, which
    // PostgreSQL would silently roll back at COMMIT: the 2xx would then lose the event.
    let check = shared.store.holds_marker(&mut tx, &key, token);
    let failed = match tokio::time::timeout(settings.store_timeout, check).await {
        Ok(Ok(true)) => None,
        Ok(Ok(false)) => Some(StoreError::backend(
            "the delivery's transaction lost its marker: a statement in it failed and the \
             database rolled it back",
        )),
        Ok(Err(error)) => Some(error),
        Err(_) => Some(StoreError::backend(
            "the marker check did not finish in time",
        )),
    };
    if let Some(error) = failed {
        return Ok(Ok(store_failed(settings, &key, &error, "could not commit")));
    }
    let answer = match tokio::time::timeout(settings.store_timeout, tx.commit()).await {
        Ok(Ok(())) => {
            record(&key, Outcome::Processed);
            with_outcome(res, Outcome::Processed)
        }
        // The handler's success must not be reported: if nothing was written, the event would
        // be lost. The sender's retry runs it again, or finds the marker if the commit did
        // land after all.
        Ok(Err(error)) => store_failed(
            settings,
            &key,
            &StoreError::backend(error),
            "could not commit",
        ),
        Err(_) => {
            let error = StoreError::backend("the commit did not finish in time");
            store_failed(settings, &key, &error, "could not commit")
        }
    };
    drop(open);
    Ok(Ok(answer))
}

fn store_failed<B>(
    settings: &Settings,
    key: &IdempotencyKey,
    error: &StoreError,
    what: &str,
) -> Response<ResponseBody<B>> {
    record(key, Outcome::StoreUnavailable);
    tracing::error!(
        namespace = key.namespace(),
        key = key.value(),
        error = error as &dyn std::error::Error,
        "{what} the delivery's transaction; the sender's retry will run it again",
    );
    response::store_unavailable(settings.retry_after)
}
