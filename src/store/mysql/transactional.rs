//! Transactional mode and the version guard's advance on MySQL and MariaDB: the marker's lock
//! wait is bounded by the lock timeout, and the connection's own is kept or put back.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySql, MySqlConnection, Row as _};

use super::server::{DEADLOCK, LOCK_WAIT_TIMEOUT, mysql_error};
use super::{MySqlFlavor, MySqlStore};
use crate::key::IdempotencyKey;
use crate::store::sql::{self, ClaimRow, ResultExt as _};
use crate::store::{
    Advance, AdvanceVersion, Begin, KeyState, LeaseToken, StoreError, TransactionalStore, begun,
};

impl AdvanceVersion for MySqlStore {
    /// `INSERT … ON DUPLICATE KEY UPDATE`, which takes the row's exclusive lock at once and
    /// stamps the row with a fresh token when it moves the version (a newer or an equal one).
    /// MariaDB returns the row
    /// (one round trip); MySQL reads it with `SELECT … FOR UPDATE` unless the row was new.
    async fn advance_version(
        &self,
        conn: &mut MySqlConnection,
        entity: &IdempotencyKey,
        version: i64,
    ) -> Result<Advance, StoreError> {
        let token = LeaseToken::generate().to_i64();
        let flavor = self.flavor_on(conn).await?;
        let upsert = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .bind(version)
                .bind(token)
                .bind(version)
                .bind(token)
                .bind(token)
                .bind(version)
        };
        let row = if flavor == MySqlFlavor::MariaDb {
            upsert(&self.claims.advance_returning)
                .fetch_one(&mut *conn)
                .await
                .store()?
        } else {
            let upserted = upsert(&self.table.sql.versions.advance)
                .execute(&mut *conn)
                .await
                .store()?;
            if upserted.rows_affected() == 1 {
                return Ok(Advance::Applied);
            }
            sqlx::query(AssertSqlSafe(self.claims.advance_read.clone()))
                .bind(entity.namespace())
                .bind(entity.value())
                .fetch_one(&mut *conn)
                .await
                .store()?
        };
        let applied: Option<i64> = row.try_get(0).store()?;
        let stamp: Option<i64> = row.try_get(1).store()?;
        match applied {
            _ if stamp == Some(token) => Ok(Advance::Applied),
            Some(applied) => Ok(Advance::Outdated { applied }),
            None => Err(StoreError::backend(
                "the versions row kept no applied version yet refused this one",
            )),
        }
    }
}

impl TransactionalStore for MySqlStore {
    type Database = MySql;

    crate::store::sql::to_table!(
        holds_marker(conn: &mut MySqlConnection, key: &IdempotencyKey, token: LeaseToken)
        -> Result<bool, StoreError> => holds_marker
    );

    /// `BEGIN`, then `INSERT IGNORE` of the marker, followed, when the key existed, by a read
    /// of the row (deliveries of an existing key are not counted in this mode), and an
    /// `UPDATE` taking it over if it was released.
    ///
    /// The lock timeout (whole seconds, at least 1) bounds those statements only, and the
    /// pooled connection keeps its own `innodb_lock_wait_timeout`: on MariaDB each of them
    /// runs as `SET STATEMENT innodb_lock_wait_timeout = <s> FOR …`; on MySQL (and MariaDB
    /// before 10.5) the session's value is saved in a user variable and replaced in the
    /// `BEGIN` round trip, and put back in one more round trip right after the marker. The
    /// handler's own statements run with the connection's setting.
    ///
    /// When a first delivery rolls back, InnoDB may fail one of the waiting duplicates as
    /// deadlocked: it begins again, up to three times.
    async fn begin(
        &self,
        key: &IdempotencyKey,
        lock_timeout: std::time::Duration,
    ) -> Result<Begin<MySql>, StoreError> {
        let seconds = lock_timeout
            .as_secs_f64()
            .ceil()
            .clamp(1.0, 1_073_741_824.0) as u64;
        let scoped = self.flavor().await? == MySqlFlavor::MariaDb;
        let marker = if scoped {
            let within = |sql: &str| -> Arc<str> {
                format!("SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR {sql}").into()
            };
            MarkerQueries {
                begin: "BEGIN".into(),
                insert: within(&self.table.sql.tx_claim),
                take: within(&self.claims.tx_take),
            }
        } else {
            MarkerQueries {
                begin: format!(
                    "SET {SAVED_LOCK_WAIT} = @@SESSION.innodb_lock_wait_timeout; \
                     SET SESSION innodb_lock_wait_timeout = {seconds}; BEGIN"
                )
                .into(),
                insert: self.table.sql.tx_claim.clone(),
                take: self.claims.tx_take.clone(),
            }
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut tx = self
                .table
                .pool
                .begin_with(AssertSqlSafe(marker.begin.clone()))
                .await
                .store()?;
            let token = LeaseToken::generate();
            let marked = self.insert_marker(&mut tx, &marker, key, token).await;
            if !scoped {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET SESSION innodb_lock_wait_timeout = {SAVED_LOCK_WAIT}; \
                     SET {SAVED_LOCK_WAIT} = NULL"
                )))
                .execute(&mut *tx)
                .await
                .store()?;
            }
            let claim = match marked? {
                Marked::Claimed => return Ok(Begin::Claimed(tx, token)),
                Marked::LockTimedOut => {
                    return Ok(Begin::lock_timed_out(lock_timeout));
                }
                Marked::Deadlocked(_) if attempt < 3 => continue,
                Marked::Deadlocked(e) => return Err(StoreError::backend(e)),
                Marked::Found(row) => row.into_claim(key, token, sql::NEVER_STALE)?,
            };
            return begun(claim, tx).await;
        }
    }
}

/// The user variable that keeps the session's `innodb_lock_wait_timeout` while a delivery's
/// marker is inserted with the lock timeout instead (MySQL, and MariaDB before 10.5).
const SAVED_LOCK_WAIT: &str = "@tower_idempotency_lock_wait";

/// The statements of one transactional delivery's marker, with its lock timeout.
struct MarkerQueries {
    begin: Arc<str>,
    insert: Arc<str>,
    take: Arc<str>,
}

/// What inserting a transactional marker found.
enum Marked {
    /// The marker is in the transaction, with this delivery's token.
    Claimed,
    /// The key's row, someone else's.
    Found(ClaimRow),
    /// The first delivery's transaction held the row past the lock timeout.
    LockTimedOut,
    /// InnoDB chose this transaction as a deadlock's victim and rolled it back.
    Deadlocked(sqlx::Error),
}

impl MySqlStore {
    /// Inserts the marker of `key` in `tx`, or takes over the key's released row.
    async fn insert_marker(
        &self,
        tx: &mut MySqlConnection,
        marker: &MarkerQueries,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<Marked, StoreError> {
        let inserted = sqlx::query(AssertSqlSafe(marker.insert.clone()))
            .bind(key.namespace())
            .bind(key.value())
            .bind(token.to_i64())
            .execute(&mut *tx)
            .await;
        match inserted {
            Ok(done) if done.rows_affected() == 1 => return Ok(Marked::Claimed),
            Ok(_) => {}
            Err(e) => return marker_failed(e),
        }
        let row = self.read_claim(tx, key).await?;
        if KeyState::parse(&row.state) != Some(KeyState::Released) {
            return Ok(Marked::Found(row));
        }
        // A released row is free for the marker: taken over in this transaction, unless
        // another delivery was faster.
        let taken = sqlx::query(AssertSqlSafe(marker.take.clone()))
            .bind(token.to_i64())
            .bind(key.namespace())
            .bind(key.value())
            .execute(&mut *tx)
            .await;
        match taken {
            Ok(done) if done.rows_affected() == 1 => Ok(Marked::Claimed),
            Ok(_) => Ok(Marked::Found(self.read_claim(tx, key).await?)),
            Err(e) => marker_failed(e),
        }
    }
}

/// A marker statement's error: a lock wait past the lock timeout or a deadlock are answers,
/// any other error is the store's failure.
fn marker_failed(e: sqlx::Error) -> Result<Marked, StoreError> {
    match &e {
        sqlx::Error::Database(db) if mysql_error(&**db) == Some(LOCK_WAIT_TIMEOUT) => {
            Ok(Marked::LockTimedOut)
        }
        sqlx::Error::Database(db) if mysql_error(&**db) == Some(DEADLOCK) => {
            Ok(Marked::Deadlocked(e))
        }
        _ => Err(StoreError::backend(e)),
    }
}
