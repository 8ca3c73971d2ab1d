//! Writes the counts of the [tally](crate::store::tally) to a SQL table.

use sqlx::{AssertSqlSafe, Encode, Executor, IntoArguments, Pool, Type};

use super::{Backend, Queries, ResultExt as _, Writer, micros};
use crate::key::IdempotencyKey;
use crate::store::StoreError;
use crate::store::tally::{CHUNK, Seen};

/// Adds the deliveries the tally counted of each key of `chunk` (at most [`CHUNK`]) to
/// its row, in one statement: the rows left over are bound to a key that matches no row.
pub(crate) async fn write<DB>(
    pool: &Pool<DB>,
    sql: &Queries,
    writer: &Writer,
    chunk: &[(IdempotencyKey, Seen)],
) -> Result<(), StoreError>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    i64: for<'a> Encode<'a, DB> + Type<DB>,
{
    let mut statement = sqlx::query(AssertSqlSafe(sql.tally.clone()));
    for (key, seen) in chunk {
        statement = statement
            .bind(key.namespace())
            .bind(key.value())
            .bind(i64::try_from(seen.count).unwrap_or(i64::MAX))
            .bind(micros(seen.last.elapsed()));
    }
    for _ in chunk.len()..CHUNK {
        statement = statement.bind("").bind("").bind(0_i64).bind(0_i64);
    }
    let _turn = writer.turn().await;
    statement.execute(pool).await.store().map(drop)
}
