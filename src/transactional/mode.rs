//! Transactional mode as a mode of the service shell: begin, run the handler in the
//! transaction, commit or roll back.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use sqlx::Transaction;
use tokio::sync::Mutex;
use tower_service::Service;

use super::TransactionalStore;
use super::tx::TxHandle;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::drain::{Entry, Stage};
use crate::engine::guard::{LeaseState, Leased};
use crate::engine::mode::Mode;
use crate::engine::observe::record;
use crate::engine::prepare::find_key;
use crate::engine::refusal::{Refusal, Rejection};
use crate::engine::run::{Ran, call};
use crate::engine::settings::Settings;
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::response::Outcome;
use crate::response::with_outcome;
use crate::store::{Begin, LeaseToken, StoreError};

/// Transactional mode as a mode of the service shell: what a
/// [`Transactional`](super::Transactional) service does with each delivery, and the settings
/// it does it with. Made by [`TransactionalLayer`](super::TransactionalLayer).
pub struct TxMode<St, K = Auto> {
    pub(super) store: St,
    pub(super) key: K,
    pub(super) settings: Settings,
    pub(super) lock_timeout: Duration,
}

impl<St: fmt::Debug, K: fmt::Debug> fmt::Debug for TxMode<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxMode")
            .field("store", &self.store)
            .field("key", &self.key)
            .field("lock_timeout", &self.lock_timeout)
            .finish()
    }
}

/// A transaction begun with the delivery's marker, counted by the drain until it settles.
pub(crate) struct Held<St: TransactionalStore> {
    tx: Transaction<'static, St::Database>,
    open: Open,
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

    fn settings(&self) -> &Settings {
        &self.settings
    }

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

    #[allow(
        clippy::manual_async_fn,
        reason = "the trait names the future's bounds"
    )]
    fn claim(
        self: Arc<Self>,
        key: &IdempotencyKey,
        mut entry: Entry,
    ) -> impl Future<Output = Result<Held<St>, Refusal>> + Send {
        let key = key.clone();
        async move {
            // The lock wait is part of beginning, so the store's own bound comes on top of
            // it. It runs in a task of its own: a store that changes a connection setting for
            // the marker's wait puts it back after the wait, and a delivery dropped meanwhile
            // (its sender hung up, the bound passed) must not cut that short and hand a
            // half-configured connection back to the pool. A transaction that nobody reads
            // then rolls back as the task ends.
            let (store, owned_key, lock_timeout) =
                (self.store.clone(), key.clone(), self.lock_timeout);
            let begin = tokio::spawn(async move { store.begin(&owned_key, lock_timeout).await });
            let bound = self
                .settings
                .store_timeout
                .saturating_add(self.lock_timeout);
            let error = match tokio::time::timeout(bound, begin).await {
                Ok(Ok(Ok(Begin::Claimed(tx, token)))) => {
                    let marker = Marker { key, token };
                    let state = Arc::new(LeaseState::new(marker, "transaction"));
                    entry.hold(state.clone());
                    let open = Open {
                        state,
                        _entry: entry,
                    };
                    return Ok(Held { tx, open });
                }
                Ok(Ok(Ok(Begin::Done(_)))) => return Err(Refusal::Duplicate),
                Ok(Ok(Ok(Begin::InFlight(_)))) => {
                    return Err(Refusal::InFlight(
                        "another delivery of this event is being processed; retry later",
                    ));
                }
                Ok(Ok(Err(error))) => error,
                Ok(Err(panicked)) => StoreError::backend(panicked),
                Err(_) => StoreError::backend("the store did not begin a transaction in time"),
            };
            failed(&key, &error, "could not begin");
            Err(Refusal::StoreUnavailable)
        }
    }

    fn run(
        self: Arc<Self>,
        held: Held<St>,
        inner: S,
        request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static {
        run(self, held.open, held.tx, inner, request)
    }

    fn record(&self, key: &IdempotencyKey, outcome: Outcome) {
        record(key, outcome);
    }

    fn answered(&self, key: IdempotencyKey, res: &mut Response<ResponseBody<ResB>>) {
        res.extensions_mut().insert(key);
    }
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

/// The handler in the delivery's transaction, then `COMMIT` or `ROLLBACK` as it answered.
async fn run<S, St, K, B, ResB>(
    shared: Arc<TxMode<St, K>>,
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
