//! The delivery's open transaction, as the handler reaches it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::{Database, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use crate::key::IdempotencyKey;

/// The database of the transaction in a request's extensions, named for the error of a
/// handler that asks for another one.
#[derive(Clone, Copy)]
#[cfg(feature = "axum")]
pub(super) struct TxDatabase(pub(super) &'static str);

/// The delivery's open transaction, in the request extensions of the inner service.
///
/// Handlers that are not axum handlers reach the transaction through it (here on PostgreSQL;
/// the same with `Sqlite` or `MySql`):
///
#[cfg_attr(feature = "postgres", doc = "```no_run")]
#[cfg_attr(not(feature = "postgres"), doc = "```ignore")]
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
    pub(super) slot: Arc<Mutex<Option<Transaction<'static, DB>>>>,
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
    pub(super) fn take(&self) -> Option<Transaction<'static, DB>> {
        self.slot.try_lock().ok()?.take()
    }

    pub(super) async fn roll_back(&self, key: &IdempotencyKey) {
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
            let body = crate::response::problem_json(status, &self.detail, None);
            let mut res = (status, body).into_response();
            res.headers_mut()
                .insert(http::header::CONTENT_TYPE, crate::response::PROBLEM_JSON);
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
