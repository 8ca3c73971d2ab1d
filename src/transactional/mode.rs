//! Transactional mode as a mode of the service shell: begin, run the handler in the
//! transaction, commit or roll back.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::request::Parts;
use http::{Request, Response};
use sqlx::Transaction;
use tokio::sync::Mutex;
use tower_service::Service;

use super::TransactionalStore;
use super::tx::TxHandle;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::mode::{
    Configured, MarkerGuard, Mode, Ran, Refusal, Rejection, Settings, Ticket, acquire, call,
    find_key, record,
};
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::response::Outcome;
use crate::response::with_outcome;
use crate::store::{Begin, StoreError};

/// Transactional mode as a mode of the service shell: what a
/// [`Transactional`](super::Transactional) service does with each delivery, and the settings
/// it does it with. Made by [`TransactionalLayer`](super::TransactionalLayer).
#[derive(Debug)]
pub struct TxMode<St, K = Auto> {
    pub(super) store: St,
    pub(super) key: K,
    pub(super) settings: Settings,
    pub(super) lock_timeout: Duration,
}

impl<St, K> Configured for TxMode<St, K> {
    fn settings(&self) -> &Settings {
        &self.settings
    }
}

/// A transaction begun with the delivery's marker, counted by the drain until it settles.
pub(crate) struct Held<St: TransactionalStore> {
    tx: Transaction<'static, St::Database>,
    marker: MarkerGuard,
}

impl<S, St, K, B, ResB> Mode<S, B, ResB> for TxMode<St, K>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: TransactionalStore,
    K: ExtractKey,
    B: Send + 'static,
    ResB: Send + 'static,
{
    type Found = IdempotencyKey;
    type Held = Held<St>;

    /// The whole body is read before the transaction begins: a slow upload must not hold a
    /// pooled connection while it trickles in.
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn find(
        &self,
        parts: &Parts,
        body: Option<&Bytes>,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        find_key(&self.key, &self.settings, parts, body)
    }

    async fn claim(
        self: Arc<Self>,
        key: &IdempotencyKey,
        ticket: Ticket,
    ) -> Result<Self::Held, Refusal> {
        // The lock wait is part of beginning, so the store's own bound comes on top of
        // it. A delivery dropped meanwhile (its sender hung up, the bound passed) never
        // cuts the begin short: a store that changes a connection setting for the
        // marker's wait puts it back after the wait, and must not hand a half-configured
        // connection back to the pool. A transaction nobody reads rolls back as it is
        // dropped.
        let (store, begun, lock_timeout) = (self.store.clone(), key.clone(), self.lock_timeout);
        let beginning = async move {
            // A store that panics while beginning fails this delivery with 503, as a store
            // that errs does; the delivery's own future is not unwound.
            let begin = AssertUnwindSafe(store.begin(&begun, lock_timeout))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(StoreError::backend("the store panicked while beginning")));
            Ok(match begin? {
                Begin::Claimed(tx, token) => Ok(Held {
                    tx,
                    marker: MarkerGuard::begun(begun, token, ticket),
                }),
                Begin::Done(_) => Err(Refusal::Duplicate),
                Begin::InFlight(_) => Err(Refusal::InFlight(
                    "another delivery of this event is being processed; retry later",
                )),
            })
        };
        let bound = self.settings.store_timeout.saturating_add(lock_timeout);
        acquire(beginning, bound, "begin")
            .await
            .unwrap_or_else(|error| {
                failed(key, &error, "could not begin");
                Err(Refusal::StoreUnavailable)
            })
    }

    fn run(
        self: Arc<Self>,
        held: Held<St>,
        inner: S,
        request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static {
        run(self, held.marker, held.tx, inner, request)
    }

    fn record(&self, key: &IdempotencyKey, outcome: Outcome) {
        record(key, None, None, outcome);
    }

    fn answered(&self, key: IdempotencyKey, res: &mut Response<ResponseBody<ResB>>) {
        res.extensions_mut().insert(key);
    }
}

/// The handler in the delivery's transaction, then `COMMIT` or `ROLLBACK` as it answered.
async fn run<S, St, K, B, ResB>(
    shared: Arc<TxMode<St, K>>,
    marker: MarkerGuard,
    tx: Transaction<'static, St::Database>,
    inner: S,
    mut request: Request<B>,
) -> Ran<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    St: TransactionalStore,
{
    let settings = &shared.settings;
    let (key, token) = (marker.key().clone(), marker.token());
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
    marker.settling();
    if !settings.commit_when.commits(res.status()) {
        handle.roll_back(&key).await;
        record(&key, None, None, Outcome::Released);
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
            record(&key, None, None, Outcome::Processed);
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
    drop(marker);
    Ok(Ok(answer))
}

fn store_failed<B>(
    settings: &Settings,
    key: &IdempotencyKey,
    error: &StoreError,
    what: &str,
) -> Response<ResponseBody<B>> {
    record(key, None, None, Outcome::StoreUnavailable);
    failed(key, error, what);
    Refusal::StoreUnavailable.answer(settings.retry_after)
}

fn failed(key: &IdempotencyKey, error: &StoreError, what: &str) {
    tracing::error!(
        namespace = key.namespace(),
        key = key.value(),
        error = error as &dyn std::error::Error,
        "{what} the delivery's transaction; the sender's retry will run it again",
    );
}
