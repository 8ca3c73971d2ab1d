//! Transactional mode: the marker and the handler's own writes commit together.
//!
//! When the work a webhook triggers is itself a write to the same database (mark an order
//! paid, insert a row), claim and commit can be one database transaction: the layer begins
//! it, inserts the key's marker in it, hands it to the handler, and commits it only after a
//! successful response. A handler that fails or panics rolls everything back, marker included,
//! so the sender's retry runs it again. A handler whose sender hung up runs on to its end, and
//! its answer decides as usual. There is no `processing` row and so no stale claim to decide
//! about: a crash rolls back.
//!
//! ```no_run
//! use axum::{Router, http::StatusCode, routing::post};
//! use sqlx::Postgres;
//! use tower_idempotency::{key, store::PostgresStore, transactional::{TransactionalLayer, Tx}};
//!
//! async fn order_paid(mut tx: Tx<Postgres>, body: String) -> Result<&'static str, StatusCode> {
//!     let event: serde_json::Value = serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
//!     let order = event["data"]["object"]["metadata"]["order_id"].as_str().unwrap_or_default();
//!     // Runs in the layer's transaction: committed with the marker, or not at all.
//!     sqlx::query("UPDATE orders SET status = 'paid' WHERE id = $1")
//!         .bind(order)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok("paid")
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::new(sqlx::PgPool::connect("postgres://localhost/app").await?);
//! store.migrate().await?;
//! let app: Router = Router::new().route(
//!     "/webhooks/stripe",
//!     post(order_paid).layer(TransactionalLayer::new(store).key(key::stripe())),
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # When to choose it
//!
//! Choose it when the handler's work is writes to the database the store lives in: it is the
//! correct default then. Do not choose it for work no transaction can roll back (an e-mail, a
//! third-party API call): a rollback after such a call would let the retry repeat it. Use the
//! claim-then-commit mode of [`IdempotencyLayer`](crate::IdempotencyLayer) for those.
//!
//! The transaction holds a pooled connection for as long as the handler runs; size the pool
//! for the deliveries you handle at once. The body is read whole before the transaction
//! begins (within the body limit and time limit), so a slow upload holds no connection.
//!
//! # Concurrent duplicates
//!
//! A duplicate that arrives while the first delivery's transaction is open waits on the
//! table's unique index. When the first commits, the duplicate answers 200; when it rolls
//! back, the duplicate runs the handler itself. The wait is bounded by
//! [`TransactionalLayer::lock_timeout`] (5 seconds by default): past it the duplicate answers
//! 409 with `Retry-After`. Each backend's store documents how it bounds the wait.
//!
//! On SQLite, which has one writer at a time, every delivery in this mode takes the write lock
//! when it begins, so deliveries run one after another whatever their key, and any of them
//! may answer 409 past the lock timeout when handlers are slow.
//!
//! A handler must not swallow its database errors: a failed statement aborts the transaction
//! on PostgreSQL (the layer notices before `COMMIT` and answers 503, so the retry runs), and a
//! MySQL deadlock rolls it back, marker included, so statements run after it would no longer
//! be part of the delivery's transaction.
//!
//! To keep entities in order in this mode, move the version inside the transaction with
//! [`order::advance`](crate::order::advance), not with a `VersionGuardLayer` around the route: that
//! layer records versions on a connection of its own, outside the transaction.
//!
//! # What every delivery gets
//!
//! | situation | answer | marker and the handler's writes |
//! |---|---|---|
//! | handler answers 2xx | its response | committed together |
//! | handler answers non-2xx, `Err`, or panics | its response / error | rolled back |
//! | the sender hangs up while the handler runs | nobody hears it; the handler runs to its end | committed or rolled back as it answers |
//! | the process dies mid-handler | — | rolled back by the database |
//! | a statement of the handler failed and it answered 2xx anyway, or the commit fails | 503 with `Retry-After` | rolled back (a commit that timed out may have landed: the retry then finds the marker) |
//! | duplicate of a committed event | 200, `idempotency-outcome: duplicate` | unchanged |
//! | duplicate while the first is open, past the lock timeout | 409 with `Retry-After` | unchanged |
//! | store unreachable | 503 with `Retry-After`, the handler does not run | unchanged |
//! | the layer is draining ([`Drain`](crate::Drain)) | 503 with `Retry-After` | unchanged |
//!
//! Key errors are answered as in claim-then-commit mode.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use sqlx::{Database, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::engine::drain::{Entry, Stage};
use crate::engine::guard::{LeaseState, Leased};
use crate::engine::prepare::{BoxError, Keyed, keyed, pass_through, record, reject, with_outcome};
use crate::engine::run::{Detach, Ran, call};
use crate::engine::settings::{Settings, shared_settings};
use crate::future::ResponseFuture;
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::response::{self, Outcome};
use crate::store::{Claim, Completed, LeaseToken, Pending, Store, StoreError};

/// A store that can run a delivery in one database transaction: the SQL stores.
pub trait TransactionalStore: Store + Clone {
    /// The database the store's pool talks to.
    type Database: Database;

    /// Begins a transaction whose lock waits are bounded by `lock_timeout`, and inserts the
    /// marker of `key` as `done` in it. A duplicate's insert waits for an open transaction
    /// holding the same key.
    fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: Duration,
    ) -> impl Future<Output = Result<Begin<Self::Database>, StoreError>> + Send;

    /// Whether the transaction on `conn` still holds the marker [`begin`](Self::begin)
    /// inserted with `token`. Asked just before `COMMIT`: a transaction that a failed statement
    /// aborted (PostgreSQL then turns `COMMIT` into a silent rollback) or that the database
    /// rolled back (a MySQL deadlock) answers no, or fails.
    fn holds_marker(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`TransactionalStore::begin`] found.
#[non_exhaustive]
pub enum Begin<DB: Database> {
    /// The marker, with this fencing token, is inserted in this open transaction.
    Claimed(Transaction<'static, DB>, LeaseToken),
    /// The event was committed already.
    Done(Completed),
    /// A claim-then-commit delivery holds the key, or the first delivery's transaction did not
    /// finish within the lock timeout.
    InFlight(Pending),
}

impl<DB: Database> Begin<DB> {
    /// The answer when a duplicate's wait for the first delivery's transaction timed out.
    pub(crate) fn lock_timed_out(waited: Duration) -> Self {
        Self::InFlight(Pending::new(waited, Duration::ZERO, 0))
    }
}

/// Turns the claim read from the marker's insert into the answer of
/// [`TransactionalStore::begin`]. When the key exists already, the transaction holds at most
/// the delivery count (MySQL does not count in this mode): it is committed.
pub(crate) async fn begun<DB: Database>(
    claim: Claim,
    tx: Transaction<'static, DB>,
) -> Result<Begin<DB>, StoreError> {
    let begin = match claim {
        Claim::Acquired(lease) => return Ok(Begin::Claimed(tx, lease.token())),
        Claim::Done(done) => Begin::Done(done),
        Claim::InFlight(pending) | Claim::Held(pending) => Begin::InFlight(pending),
    };
    tx.commit().await.map_err(StoreError::backend)?;
    Ok(begin)
}

impl<DB: Database> fmt::Debug for Begin<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claimed(..) => f.write_str("Claimed(..)"),
            Self::Done(done) => f.debug_tuple("Done").field(done).finish(),
            Self::InFlight(pending) => f.debug_tuple("InFlight").field(pending).finish(),
        }
    }
}

/// The layer of transactional mode.
///
/// Built with [`TransactionalLayer::new`] on a [`TransactionalStore`]; the key and the settings
/// every mode shares are set as on [`IdempotencyLayer`](crate::IdempotencyLayer). There is no
/// stale policy to choose: a delivery that dies rolls back, and leaves nothing to decide.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # {
/// use std::time::Duration;
/// use tower_idempotency::{key, store::SqliteStore, transactional::TransactionalLayer};
///
/// # fn layer(store: SqliteStore) {
/// let layer = TransactionalLayer::new(store)
///     .key(key::stripe())
///     .lock_timeout(Duration::from_secs(2));
/// # let _ = layer;
/// # }
/// # }
/// ```
///
/// Settings that only claim-then-commit has do not exist here, so they cannot be set and
/// silently ignored:
///
/// ```compile_fail
/// use tower_idempotency::{Stale, transactional::{TransactionalLayer, TransactionalStore}};
///
/// fn layer<St: TransactionalStore>(store: St) {
///     // error[E0599]: no method named `stale`: a rollback leaves no stale claim to decide.
///     let _ = TransactionalLayer::new(store).stale(Stale::default());
/// }
/// ```
#[derive(Clone)]
#[must_use]
pub struct TransactionalLayer<St, K = Auto> {
    store: St,
    key: K,
    settings: Settings,
    lock_timeout: Duration,
}

impl<St: TransactionalStore> TransactionalLayer<St> {
    /// A layer that runs each delivery in one transaction on `store`'s database, finding keys
    /// with [`key::auto`](crate::key::auto).
    ///
    /// Defaults: commit on 2xx; bodies read whole before the transaction begins, up to 1 MiB
    /// within 30 seconds, so that a slow upload never holds a pooled connection; a duplicate
    /// waits up to 5 seconds for the first delivery's transaction; store calls bounded by 5
    /// seconds on top of that; `Retry-After: 5` on 409 and 503.
    pub fn new(store: St) -> Self {
        Self {
            store,
            key: crate::key::auto(),
            settings: Settings::default(),
            lock_timeout: Duration::from_secs(5),
        }
    }
}

impl<St, K> TransactionalLayer<St, K> {
    /// Finds keys with `key` instead, e.g. [`key::stripe()`](crate::key::stripe).
    pub fn key<K2: ExtractKey>(self, key: K2) -> TransactionalLayer<St, K2> {
        TransactionalLayer {
            store: self.store,
            key,
            settings: self.settings,
            lock_timeout: self.lock_timeout,
        }
    }

    /// How long a duplicate waits for the first delivery's open transaction before it answers
    /// 409 with `Retry-After`. Default: 5 seconds.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    shared_settings!();

    /// The store this layer uses.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<St: fmt::Debug, K: fmt::Debug> fmt::Debug for TransactionalLayer<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalLayer")
            .field("store", &self.store)
            .field("key", &self.key)
            .field("settings", &self.settings)
            .field("lock_timeout", &self.lock_timeout)
            .finish()
    }
}

impl<S, St, K> Layer<S> for TransactionalLayer<St, K>
where
    St: TransactionalStore,
    K: ExtractKey + Clone,
{
    type Service = TransactionalService<S, St, K>;

    fn layer(&self, inner: S) -> Self::Service {
        TransactionalService {
            inner,
            shared: Arc::new(TxShared {
                store: self.store.clone(),
                key: self.key.clone(),
                settings: self.settings.clone(),
                lock_timeout: self.lock_timeout,
            }),
        }
    }
}

struct TxShared<St, K> {
    store: St,
    key: K,
    settings: Settings,
    lock_timeout: Duration,
}

/// The service of transactional mode. Made by [`TransactionalLayer`].
///
/// As in claim-then-commit mode, a handler whose delivery went away runs to its end in a task
/// of its own, and its answer commits or rolls back the transaction.
pub struct TransactionalService<S, St, K = Auto> {
    inner: S,
    shared: Arc<TxShared<St, K>>,
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
        ResponseFuture::new(Box::pin(deliver(self.shared.clone(), inner, req)))
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
    // The lock wait is part of beginning, so the store's own bound comes on top of it. A
    // delivery dropped meanwhile drops the transaction, which rolls back: nothing to give back.
    let begin = shared.store.begin(key, shared.lock_timeout);
    let bound = settings.store_timeout.saturating_add(shared.lock_timeout);
    let (tx, token) = match tokio::time::timeout(bound, begin).await {
        Ok(Ok(Begin::Claimed(tx, token))) => (tx, token),
        Ok(Ok(Begin::Done(_))) => {
            record(key, Outcome::Duplicate);
            return Ok(response::duplicate());
        }
        Ok(Ok(Begin::InFlight(_))) => {
            record(key, Outcome::InFlight);
            return Ok(response::in_flight(settings.retry_after));
        }
        Ok(Err(error)) => return Ok(store_failed(settings, key, &error, "could not begin")),
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
    request
        .extensions_mut()
        .insert(TxDatabase(std::any::type_name::<St::Database>()));
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

/// The database of the transaction in a request's extensions, named for the error of a
/// handler that asks for another one.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
struct TxDatabase(&'static str);

/// The delivery's open transaction, in the request extensions of the inner service.
///
/// Handlers that are not axum handlers reach the transaction through it:
///
/// ```no_run
/// # use sqlx::Postgres;
/// # use tower_idempotency::transactional::TxHandle;
/// # async fn handler<B>(req: http::Request<B>) -> Result<(), sqlx::Error> {
/// let handle = req.extensions().get::<TxHandle<Postgres>>().expect("transactional layer").clone();
/// let mut tx = handle.lock().expect("the transaction is open while the handler runs");
/// sqlx::query("INSERT INTO audit (note) VALUES ('paid')").execute(&mut *tx).await?;
/// # Ok(())
/// # }
/// ```
pub struct TxHandle<DB: Database> {
    slot: Arc<Mutex<Option<Transaction<'static, DB>>>>,
}

impl<DB: Database> TxHandle<DB> {
    /// Locks the transaction for this handler. `None` when it is locked already (a second
    /// `Tx` in the same handler: waiting would never end) or the layer has finished it (after
    /// the handler answered).
    pub fn lock(&self) -> Option<Tx<DB>> {
        let guard: OwnedMutexGuard<_> = self.slot.clone().try_lock_owned().ok()?;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .ok()
            .map(|guard| Tx { guard })
    }

    /// Takes the transaction back, unless a handler still holds it.
    fn take(&self) -> Option<Transaction<'static, DB>> {
        self.slot.try_lock().ok()?.take()
    }

    async fn roll_back(&self, key: &IdempotencyKey) {
        let Some(tx) = self.take() else {
            // A handler still holds it; it rolls back when the last holder drops it.
            return;
        };
        if let Err(error) = tx.rollback().await {
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "rollback failed; the connection is closed instead",
            );
        }
    }
}

impl<DB: Database> Clone for TxHandle<DB> {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot.clone(),
        }
    }
}

impl<DB: Database> fmt::Debug for TxHandle<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxHandle").finish_non_exhaustive()
    }
}

/// The delivery's transaction, locked for a handler. Derefs to the connection, so
/// `sqlx::query(..).execute(&mut *tx)` runs inside it.
///
/// Under the `axum` feature it is an extractor. Keep it within the handler: the layer commits
/// only after the handler has let go of it.
pub struct Tx<DB: Database> {
    guard: OwnedMappedMutexGuard<Option<Transaction<'static, DB>>, Transaction<'static, DB>>,
}

impl<DB: Database> Deref for Tx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.guard
    }
}

impl<DB: Database> DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.guard
    }
}

impl<DB: Database> fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum_core::extract::FromRequestParts;
    use axum_core::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::{Database, Tx, TxDatabase, TxHandle};

    /// Why a [`Tx`] could not be extracted: the route has no transactional layer, its
    /// transaction is on another database than the one asked for (`Tx<Sqlite>` under a
    /// PostgreSQL store), or the handler asked for the transaction twice. Answered 500
    /// problem+json, whose detail says which.
    #[derive(Debug)]
    pub struct MissingTransaction {
        detail: String,
    }

    impl MissingTransaction {
        /// What went wrong, as the problem's detail says it.
        pub fn detail(&self) -> &str {
            &self.detail
        }
    }

    impl std::fmt::Display for MissingTransaction {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.detail)
        }
    }

    impl std::error::Error for MissingTransaction {}

    impl IntoResponse for MissingTransaction {
        fn into_response(self) -> Response {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            let body = serde_json::json!({
                "title": status.canonical_reason().unwrap_or_default(),
                "status": status.as_u16(),
                "detail": self.detail,
            });
            let mut res = (status, body.to_string()).into_response();
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/problem+json"),
            );
            res
        }
    }

    impl<DB: Database, S: Send + Sync> FromRequestParts<S> for Tx<DB> {
        type Rejection = MissingTransaction;

        async fn from_request_parts(
            parts: &mut Parts,
            _state: &S,
        ) -> Result<Self, Self::Rejection> {
            let wanted = std::any::type_name::<DB>();
            let missing = |detail: String| MissingTransaction { detail };
            let Some(handle) = parts.extensions.get::<TxHandle<DB>>() else {
                return Err(missing(match parts.extensions.get::<TxDatabase>() {
                    Some(TxDatabase(present)) => format!(
                        "the handler asks for Tx<{wanted}>, but the route's transaction is on \
                         {present}: use the database of the route's store"
                    ),
                    None => format!(
                        "the handler asks for Tx<{wanted}>, but the route has no transactional \
                         idempotency layer (TransactionalLayer)"
                    ),
                }));
            };
            handle.clone().lock().ok_or_else(|| {
                missing(format!(
                    "the handler asks for Tx<{wanted}> a second time; the first holds it"
                ))
            })
        }
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use extract::MissingTransaction;
