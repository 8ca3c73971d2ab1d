//! The purge: the table walked in key order, [`PURGE_BATCH`](super::PURGE_BATCH) keys at a time.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Row as _};

use super::{Bounded, Purge, ResultExt as _, micros, statements};
use crate::store::StoreError;

statements! {
    /// Walks the table in key order, [`PURGE_BATCH`](super::PURGE_BATCH) keys at a time: each batch is two short
    /// statements (the batch's last key, then the delete), so claims wait at most for one
    /// batch's locks, and no index on the settle time is needed.
    pub(crate) async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        let age = micros(older_than);
        let mut after = (String::new(), String::new());
        let mut purged = 0;
        loop {
            let (deleted, last) = match &self.sql.purge {
                Purge::Batch(batch) => self.purge_batch(batch, age, &after).await?,
                Purge::Bounded(bounded) => self.purge_bounded(bounded, age, &after).await?,
            };
            purged += deleted;
            match last {
                Some(last) => after = last,
                None => return Ok(purged),
            }
        }
    }

    /// One batch in one statement: how many rows it deleted, and the batch's last key.
    async fn purge_batch(
        &self,
        batch: &Arc<str>,
        age: i64,
        (namespace, key): &(String, String),
    ) -> Result<(u64, Option<(String, String)>), StoreError> {
        let statement = sqlx::query(AssertSqlSafe(batch.clone())).bind(age);
        let statement = DB::bind_position(statement, namespace, key);
        let turn = self.writer.turn().await;
        let row = statement.fetch_optional(&self.pool).await.store()?;
        drop(turn);
        let Some(row) = row else {
            return Ok((0, None));
        };
        let deleted: i64 = row.try_get(0).store()?;
        let last = (row.try_get(1).store()?, row.try_get(2).store()?);
        Ok((u64::try_from(deleted).unwrap_or(0), Some(last)))
    }

    /// One batch in two statements: its last key, then the delete up to it.
    async fn purge_bounded(
        &self,
        Bounded {
            bound,
            up_to,
            rest,
            before,
        }: &Bounded,
        age: i64,
        (namespace, key): &(String, String),
    ) -> Result<(u64, Option<(String, String)>), StoreError> {
        let statement = sqlx::query(AssertSqlSafe(bound.clone()));
        let last = DB::bind_position(statement, namespace, key)
            .fetch_optional(&self.pool)
            .await
            .store()?;
        let last: Option<(String, String)> = last
            .map(|row| Ok::<_, StoreError>((row.try_get(0).store()?, row.try_get(1).store()?)))
            .transpose()?;
        let sql = if last.is_some() { up_to } else { rest };
        let delete = sqlx::query(AssertSqlSafe(sql.clone())).bind(age);
        let mut delete = DB::bind_position(delete, namespace, key);
        if let Some((namespace, key)) = &last {
            delete = DB::bind_position(delete, namespace, key);
        }
        let turn = self.writer.turn().await;
        let mut conn = self.pool.acquire().await.store()?;
        if let Some(before) = before {
            sqlx::raw_sql(AssertSqlSafe(before.clone()))
                .execute(&mut *conn)
                .await
                .store()?;
        }
        let done = delete.execute(&mut *conn).await.store()?;
        drop(turn);
        Ok((DB::rows_affected(&done), last))
    }
}
