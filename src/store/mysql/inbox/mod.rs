//! The inbox on MySQL and MariaDB: [`InboxStore`] for [`MySqlStore`], in the table
//! `<table>_inbox` (see the [module docs](crate::store::mysql#inbox) for the SQL). What every
//! SQL store runs the same way is [`Table`](crate::store::sql::Table)'s; here are the enqueue
//! and the take.

use sqlx::{AssertSqlSafe, Row as _};

use super::server::{DEADLOCK, DUPLICATE_KEY, mysql_error};
use super::{MySqlFlavor, MySqlStore};
use crate::key::IdempotencyKey;

use crate::store::inbox::{Enqueued, InboxStore, StoredRequest, Take, Taken};
use crate::store::sql::{ResultExt as _, entry_state};
use crate::store::{LeaseToken, StoreError};

mod queries;
mod take;

pub(super) use queries::{Own, shared};

/// How many times an enqueue or a take runs again after InnoDB chose it as a deadlock's
/// victim (or, for an enqueue, found the duplicate's row gone before it could read it).
const ATTEMPTS: usize = 3;

/// Whether `error` is the server's error `number`.
fn is(error: &sqlx::Error, number: u16) -> bool {
    matches!(error, sqlx::Error::Database(db) if mysql_error(&**db) == Some(number))
}

/// Whether `error` is InnoDB's deadlock (the transaction was rolled back).
fn deadlocked(error: &StoreError) -> bool {
    let StoreError::Backend(source) = error else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .is_some_and(|e| is(e, DEADLOCK))
}

impl MySqlStore {
    /// One try at an enqueue: `None` when the key's row was there for the insert and gone
    /// for the read (purged in between).
    async fn enqueue_once(
        &self,
        flavor: MySqlFlavor,
        key: &IdempotencyKey,
        request: &[u8],
    ) -> Result<Option<Enqueued>, StoreError> {
        let mark = LeaseToken::generate().to_i64();
        let insert = |sql| {
            sqlx::query(AssertSqlSafe(sql))
                .bind(key.namespace())
                .bind(key.value())
                .bind(mark)
                .bind(request)
        };
        if flavor == MySqlFlavor::MariaDb {
            let row = insert(self.inbox.insert_returning.clone())
                .fetch_one(&self.table.pool)
                .await
                .store()?;
            let token: Option<i64> = row.try_get(1).store()?;
            if token == Some(mark) {
                return Ok(Some(Enqueued::Stored));
            }
            let state: String = row.try_get(0).store()?;
            return Ok(Some(Enqueued::Duplicate(entry_state(&state)?)));
        }
        match insert(self.inbox.insert.clone())
            .execute(&self.table.pool)
            .await
        {
            Ok(_) => return Ok(Some(Enqueued::Stored)),
            Err(e) if is(&e, DUPLICATE_KEY) => {}
            Err(e) => return Err(StoreError::backend(e)),
        }
        let state = self.table.entry_state(key).await?;
        Ok(state.map(Enqueued::Duplicate))
    }
}

/// An enqueue is one statement (MariaDB 10.5+), or an insert and, for a duplicate, a read
/// (MySQL); a take is one transaction. See the [module docs](crate::store::mysql#inbox).
impl InboxStore for MySqlStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        let flavor = self.flavor().await?;
        let bytes = request.encode();
        let mut tries = 0;
        loop {
            tries += 1;
            match self.enqueue_once(flavor, key, &bytes).await {
                Ok(Some(enqueued)) => return Ok(enqueued),
                Ok(None) if tries < ATTEMPTS => {}
                Ok(None) => {
                    return Err(StoreError::backend(
                        "the inbox entry vanished between the insert and the read, three times",
                    ));
                }
                Err(e) if tries < ATTEMPTS && deadlocked(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `SELECT … FOR UPDATE SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+) of the due entries,
    /// in a READ COMMITTED transaction; a deadlock's victim runs again, up to three times.
    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        if take.limit() == 0 {
            return Ok(Vec::new());
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self.take_once(take).await {
                Err(e) if tries < ATTEMPTS && deadlocked(&e) => {}
                taken => return taken,
            }
        }
    }

    crate::store::sql::inbox_forwards!(shared);
    crate::store::sql::inbox_forwards!(by_transaction);
}
