//! What the SQL stores need of a database beyond sqlx's [`Database`], one impl per backend.

use sqlx::Database;

/// A statement of `DB` with its arguments.
pub(crate) type Statement<'q, DB> = sqlx::query::Query<'q, DB, <DB as Database>::Arguments>;

/// A database the SQL stores run on: what [`Table`] needs beyond sqlx's [`Database`].
pub(crate) trait Backend: Database {
    /// The statement that begins a transaction of several writes: SQLite's takes the write
    /// lock up front (waiting for it under the busy timeout), where a deferred one could fail
    /// to upgrade its read lock.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    const BEGIN: &'static str = "BEGIN";

    /// Whether `error` is a failure to serialize: nothing was written, and the statement may
    /// run again (PostgreSQL's 40001, under REPEATABLE READ or SERIALIZABLE). SQLite has one
    /// writer at a time: a write never meets a concurrent one to serialize with.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    fn is_serialization_failure(error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }

    /// How many rows a statement changed (or matched: MySQL's connections report matched
    /// rows, sqlx sets `CLIENT_FOUND_ROWS`).
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Binds a position in key order, as the backend's statements compare with one: a row
    /// value `(namespace, key)` on PostgreSQL and SQLite (two parameters); on MySQL, whose
    /// optimizer reads only the spelt-out `namespace > ? OR (namespace = ? AND key > ?)` as a
    /// range of the primary key, three.
    fn bind_position<'q>(
        query: Statement<'q, Self>,
        namespace: &str,
        key: &str,
    ) -> Statement<'q, Self>
    where
        for<'a> String: sqlx::Encode<'a, Self> + sqlx::Type<Self>,
    {
        query.bind(namespace.to_owned()).bind(key.to_owned())
    }
}

#[cfg(feature = "postgres")]
impl Backend for sqlx::Postgres {
    fn is_serialization_failure(e: &sqlx::Error) -> bool {
        matches!(e, sqlx::Error::Database(e) if e.code().as_deref() == Some("40001"))
    }

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl Backend for sqlx::MySql {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }

    fn bind_position<'q>(
        query: Statement<'q, Self>,
        namespace: &str,
        key: &str,
    ) -> Statement<'q, Self> {
        let namespace = namespace.to_owned();
        query
            .bind(namespace.clone())
            .bind(namespace)
            .bind(key.to_owned())
    }
}
