//! The hand-written baselines: the seed's SQL in a webhook handler, as its users write it, on
//! the table `bench_seed` (the seed's columns, and a namespace as the store's key has).
//!
//! - **Pattern 3**, the baseline of record, has the layer's contract: `INSERT … (status
//!   'processing') ON CONFLICT DO NOTHING` (MariaDB: `INSERT IGNORE`); if nothing was
//!   inserted, `SELECT status` of the row and answer 200 for `done`, 409 otherwise; else the
//!   work, then `UPDATE … SET status = 'done'`. The work here cannot fail, so the release a
//!   careful handler writes for a failed run (the row deleted, so that the retry runs) is never
//!   reached and left out.
//! - **Pattern 1**, the floor: the same rows, but 200 whenever nothing was inserted, without
//!   the read. It acknowledges a duplicate of an event still running, so the event is lost if
//!   that run fails; what it saves is the read of a duplicate.
//!
//! Each as an axum handler on a `post` route, or as a bare `service_fn` (`BENCH_SHELL=tower`).

use std::convert::Infallible;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Empty;
use tower::{Service, service_fn};

use super::{Db, Kind, NAMESPACE, PATH, Req, SEED_TABLE, event_id, work};

/// A hand-written claim-then-commit: what it answers when nothing was inserted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pattern {
    /// 200, unread: the floor.
    One,
    /// 200 if the row is `done`, 409 otherwise: the baseline of record.
    Three,
}

impl Pattern {
    /// Its name in the summary.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::One => "pattern 1",
            Pattern::Three => "pattern 3",
        }
    }

    /// One delivery of the event `id`, answered as the handler answers it.
    pub(crate) async fn answer(self, db: &Db, id: &str) -> StatusCode {
        match db.seed_claim(id).await {
            Ok(true) => {}
            Ok(false) if self == Pattern::One => return StatusCode::OK,
            Ok(false) => {
                return match db.seed_status(id).await {
                    Ok(Some(status)) if status == "done" => StatusCode::OK,
                    Ok(_) => StatusCode::CONFLICT,
                    Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                };
            }
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
        }
        work().await;
        match db.seed_done(id).await {
            Ok(()) => StatusCode::OK,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// An axum app answering this pattern's handler on `post` [`PATH`].
    pub(crate) fn router(self, db: Db) -> Router {
        let route = match self {
            Pattern::One => post(pattern_1),
            Pattern::Three => post(pattern_3),
        };
        Router::new().route(PATH, route).with_state(db)
    }

    /// The same handler as a bare tower service.
    pub(crate) fn service(
        self,
        db: Db,
    ) -> impl Service<Req, Response = Response<Empty<Bytes>>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static {
        service_fn(move |req: Req| {
            let db = db.clone();
            async move {
                let status = self.answer(&db, event_id(req.headers())).await;
                let mut res = Response::new(Empty::new());
                *res.status_mut() = status;
                Ok(res)
            }
        })
    }
}

async fn pattern_1(State(db): State<Db>, headers: HeaderMap) -> StatusCode {
    Pattern::One.answer(&db, event_id(&headers)).await
}

async fn pattern_3(State(db): State<Db>, headers: HeaderMap) -> StatusCode {
    Pattern::Three.answer(&db, event_id(&headers)).await
}

impl Db {
    pub(crate) async fn create_seed_table(&self) {
        let sql = match self.kind() {
            Kind::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    TEXT NOT NULL,
                    event_id     TEXT NOT NULL,
                    status       TEXT NOT NULL,
                    claimed_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
                    completed_at TIMESTAMPTZ,
                    PRIMARY KEY (namespace, event_id))"
            ),
            Kind::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    TEXT NOT NULL,
                    event_id     TEXT NOT NULL,
                    status       TEXT NOT NULL,
                    claimed_at   INTEGER NOT NULL DEFAULT (unixepoch()),
                    completed_at INTEGER,
                    PRIMARY KEY (namespace, event_id))"
            ),
            Kind::MySql => format!(
                "CREATE TABLE IF NOT EXISTS {SEED_TABLE} (
                    namespace    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                    event_id     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                    status       VARCHAR(10) NOT NULL,
                    claimed_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                    completed_at DATETIME(6) NULL,
                    PRIMARY KEY (namespace, event_id)) ENGINE = InnoDB"
            ),
        };
        self.exec(sql).await;
    }

    /// The claim: `true` if this delivery inserted the row.
    async fn seed_claim(&self, id: &str) -> Result<bool, sqlx::Error> {
        let inserted = match self {
            Db::Postgres(pool) => sqlx::query(
                "INSERT INTO bench_seed (namespace, event_id, status) VALUES ($1, $2, 'processing') \
                 ON CONFLICT DO NOTHING",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
            Db::Sqlite(pool) => sqlx::query(
                "INSERT INTO bench_seed (namespace, event_id, status) VALUES (?1, ?2, 'processing') \
                 ON CONFLICT DO NOTHING",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
            Db::MySql(pool) => sqlx::query(
                "INSERT IGNORE INTO bench_seed (namespace, event_id, status) VALUES (?, ?, 'processing')",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(inserted == 1)
    }

    /// Pattern 3's read of a row it did not insert: its status, if the row is there.
    async fn seed_status(&self, id: &str) -> Result<Option<String>, sqlx::Error> {
        match self {
            Db::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT status FROM bench_seed WHERE namespace = $1 AND event_id = $2",
                )
                .bind(NAMESPACE)
                .bind(id)
                .fetch_optional(pool)
                .await
            }
            Db::Sqlite(pool) => {
                sqlx::query_scalar(
                    "SELECT status FROM bench_seed WHERE namespace = ?1 AND event_id = ?2",
                )
                .bind(NAMESPACE)
                .bind(id)
                .fetch_optional(pool)
                .await
            }
            Db::MySql(pool) => {
                sqlx::query_scalar(
                    "SELECT status FROM bench_seed WHERE namespace = ? AND event_id = ?",
                )
                .bind(NAMESPACE)
                .bind(id)
                .fetch_optional(pool)
                .await
            }
        }
    }

    /// The commit: the row marked done.
    async fn seed_done(&self, id: &str) -> Result<(), sqlx::Error> {
        match self {
            Db::Postgres(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = now() \
                 WHERE namespace = $1 AND event_id = $2",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
            Db::Sqlite(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = unixepoch() \
                 WHERE namespace = ?1 AND event_id = ?2",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
            Db::MySql(pool) => sqlx::query(
                "UPDATE bench_seed SET status = 'done', completed_at = UTC_TIMESTAMP(6) \
                 WHERE namespace = ? AND event_id = ?",
            )
            .bind(NAMESPACE)
            .bind(id)
            .execute(pool)
            .await
            .map(drop),
        }
    }
}
