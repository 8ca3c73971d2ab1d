//! The notifications of new entries, sent apart from the inserts and coalesced.
//!
//! A `NOTIFY` committed with the insert would make each enqueue take PostgreSQL's lock on the
//! notification queue from its pre-commit through its commit's flush of the WAL: concurrent
//! enqueues would commit one at a time, and lose the group commit that makes them cheap. So
//! an enqueue that stored a row pokes the herald instead, after its commit, and the herald
//! sends `SELECT pg_notify(…)`, a transaction that writes nothing. Pokes that come while one
//! is being sent make one more notification, not one each: there is no timer, a lone poke is
//! sent at once. A lost notification costs a worker's poll interval, never an entry.

use std::sync::{Arc, OnceLock};

use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::mpsc;

/// Shared by a store and its clones; its task ends when the last of them is dropped.
#[derive(Debug, Default)]
pub(crate) struct Herald {
    poke: OnceLock<mpsc::Sender<()>>,
}

impl Herald {
    /// Asks for a notification, sent by the herald's task (started on the first poke, on the
    /// current runtime).
    pub(crate) fn poke(&self, pool: &PgPool, notify: &Arc<str>) {
        let poke = self.poke.get_or_init(|| {
            // One waiting poke at most: the ones that find it full are in it already.
            let (poke, pokes) = mpsc::channel(1);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(send(pool.clone(), notify.clone(), pokes));
            }
            poke
        });
        let _ = poke.try_send(());
    }
}

async fn send(pool: PgPool, notify: Arc<str>, mut pokes: mpsc::Receiver<()>) {
    while pokes.recv().await.is_some() {
        if let Err(error) = sqlx::query(AssertSqlSafe(notify.clone()))
            .execute(&pool)
            .await
        {
            tracing::debug!(
                error = &error as &dyn std::error::Error,
                "an inbox notification was not sent; workers elsewhere find the entry at their \
                 next poll",
            );
        }
    }
}
