//! The PostgreSQL store.
//!
//! ```no_run
//! use sqlx::postgres::PgPoolOptions;
//! use tower_idempotency::{IdempotencyLayer, key, store::PostgresStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPoolOptions::new()
//!     .max_connections(16)
//!     .connect("postgres://app@db.internal/app")
//!     .await?;
//! let store = PostgresStore::new(pool);
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store).key(key::stripe());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Time
//!
//! Every timestamp and age is computed by the server with `now()`: the start of the current
//! transaction, which for the store's single-statement operations is the start of the
//! statement. It is one value throughout a statement, so the stale test, the timestamp written
//! and the age returned agree, and app instances with skewed clocks agree on staleness. (Not
//! `clock_timestamp()`, which changes while a statement runs.)
//!
//! # Isolation
//!
//! The store needs nothing stricter than READ COMMITTED, PostgreSQL's default: the primary key
//! decides between concurrent claims. Where the connections' isolation is stricter
//! (`default_transaction_isolation` set to `repeatable read` or `serializable` on the role, the
//! database or the server), PostgreSQL fails a claim whose row another delivery of the same key
//! changed meanwhile with a serialization failure (SQLSTATE 40001). Nothing was written then:
//! the claim, a commit, and the version guard's version claim, are tried once more after a
//! random pause
//! of up to 20 ms, and only a second failure is an error (answered 503, so the sender retries).
//! Many duplicates of one event arriving at once still fail so now and then; give the store a
//! pool of its own that sets `SET default_transaction_isolation = 'read committed'` in
//! [`after_connect`](sqlx::pool::PoolOptions::after_connect) to avoid them altogether.
//!
//! # Table
//!
//! [`PostgresStore::migrate`] runs this in one transaction, under a transaction-scoped advisory
//! lock so that instances starting together do not race on the catalog (`idempotency_keys` is
//! the default name, see [`PostgresStore::with_table_name`]):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys" (
//!     namespace     TEXT        NOT NULL,
//!     "key"         TEXT        NOT NULL,
//!     state         TEXT        NOT NULL,
//!     token         BIGINT      NOT NULL,
//!     deliveries    BIGINT      NOT NULL,
//!     runs          BIGINT      NOT NULL DEFAULT 1,
//!     reclaimed     BOOLEAN     NOT NULL DEFAULT FALSE,
//!     first_seen_at TIMESTAMPTZ,
//!     last_seen_at  TIMESTAMPTZ,
//!     claimed_at    TIMESTAMPTZ NOT NULL,
//!     renewed_at    TIMESTAMPTZ,
//!     completed_at  TIMESTAMPTZ,
//!     receipt       BYTEA,
//!     PRIMARY KEY (namespace, "key")
//! );
//! ```
//!
//! The primary key is the only index. A commit changes `state` and the settle time, and any
//! index that named either would have to change with it: PostgreSQL could no longer update the
//! row in place (a HOT update) and would add an entry to every index, which cost a lone new
//! event about a thirtieth of its time while the store kept an index of `processing` rows.
//! So [`purge_completed`](crate::store::Store::purge_completed) walks the primary key, 1,000
//! keys at a time, and [`stuck_claims`](crate::store::Store::stuck_claims), which only the
//! operator's list of held claims calls, reads the whole table: about 45 ms for 1e6 rows on a
//! small machine. Where that list is read often on a large table, add the index under a name
//! of your own, which `migrate()` leaves alone:
//!
//! ```sql
//! CREATE INDEX CONCURRENTLY idempotency_keys_in_flight
//!     ON idempotency_keys (claimed_at) WHERE state = 'processing';
//! ```
//!
//! `migrate()` drops the indexes of earlier releases: `<table>_stuck_idx` (that index of
//! `processing` rows), `<table>_claimed_idx` on `(state, claimed_at)` and
//! `<table>_completed_idx` on `(state, completed_at)`, each found on the table itself, so
//! that an index of the same name in another schema of the search path stays.
//!
//! `state` is one of `processing`, `done` and `released`, and the store writes no other. No
//! check constraint says so: PostgreSQL prepares a check's expression anew for each statement
//! that writes a row, which cost a lone new event (a claim and a commit) about a twentieth of
//! its time. Should a row ever hold another state, claims of its key fail with an error that
//! names it.
//!
//! `migrate()` drops the check on `state` that earlier releases made: any check constraint of
//! the table on `state` alone, one you added included, except one inherited from a parent
//! table. Dropping it locks the table, reads included, for an instant once the lock is
//! granted, under the same 10 s `lock_timeout` as below: a start-up that meets a long open
//! transaction on the table fails, and `migrate()` is then called again.
//!
//! A table of the first release (without `runs`) is upgraded in the same transaction: the new
//! columns are added (`ADD COLUMN IF NOT EXISTS`, instant for these defaults), its check on
//! `state` is dropped as above, and `renewed_at` of `processing` rows starts at their claim
//! time. Rows are kept as they are. `migrate()` waits at most 10 s
//! for any lock on the table (`lock_timeout`), rather than stall the claims queued behind it,
//! and fails if it could not get one. Dropping an index of an earlier release locks the table
//! for an instant, as dropping the check does.
//!
//! A table made before receipts (with `runs`, without `receipt`) gets the column in the same
//! transaction, `ADD COLUMN IF NOT EXISTS receipt BYTEA`: nullable without a default, it changes
//! the catalog alone, so it is instant, under the same 10 s `lock_timeout`. Its rows read as
//! committed without a receipt.
//!
//! # Receipts
//!
//! `receipt` holds what [`commit_with`](crate::store::Store::commit_with) kept with a `done`
//! row ([`Receipt::encode`](crate::store::Receipt::encode): the fingerprint and the stored
//! response, body included, in one value that TOAST keeps out of line when it is large). It is
//! NULL for a row committed with `commit`, in flight, or released, and a new run of the key
//! clears it. Claims read it with the row, in the statements they run anyway.
//!
//! # Round trips
//!
//! One per operation but where said below (once sqlx has prepared the statement on the
//! connection):
//!
//! - `claim`: `WITH found AS (SELECT state, token, deliveries, reclaimed, <age>, <since
//!   renewal>, receipt FROM … WHERE namespace = $1 AND "key" = $2), inserted AS (INSERT … SELECT
//!   … WHERE NOT EXISTS (SELECT 1 FROM found) ON CONFLICT (namespace, "key") DO NOTHING
//!   RETURNING …) SELECT … FROM found UNION ALL SELECT … FROM inserted`: a new key is inserted,
//!   an existing one read (with its receipt), in one statement. The
//!   primary key decides between concurrent claims; the claim acquired if the returned token is
//!   the one it generated. A duplicate (done, in flight, held) is this one statement (two
//!   right after a new key, see below), which then writes nothing and waits for no flush (see [delivery counts](#delivery-counts)). Only
//!   a released row, or one not renewed for the limit under reclaim, takes a second: `INSERT …
//!   ON CONFLICT (namespace, "key") DO UPDATE SET deliveries = deliveries + 1, <the claim's
//!   columns> = CASE WHEN <released, or processing and not renewed for the limit under
//!   reclaim> THEN <a new run, its receipt NULL> ELSE <as was> END RETURNING …`, which takes
//!   the row over atomically. (A row that another delivery committed after the first statement's snapshot
//!   was taken is missing from it: a plain read follows then.)
//!
//!   While keys come new (the store's last claim found its key so), a claim sent alone
//!   inserts first instead: `INSERT … ON CONFLICT (namespace, "key") DO NOTHING`, with the
//!   row the statement above would insert, and nothing read or returned. One inserted row is
//!   the claim acquired, in one round trip that costs the server less than the statement
//!   above; none, and the statement above follows, which then reads the row. So a duplicate
//!   that comes right after a new key takes two round trips, and the next one, one again.
//!   Such a duplicate's insert also waits for an open transaction that has updated the key's
//!   row (a transactional-mode duplicate's marker, a `resolve`, a transaction of your own),
//!   where the read would not.
//! - `renew`: `UPDATE … SET renewed_at = now() WHERE namespace = $1 AND "key" = $2 AND token =
//!   $3 AND state = 'processing'`; `commit` and `commit_with` set `state = 'done'` and `receipt
//!   = CASE WHEN state = 'done' THEN receipt ELSE $1 END` (NULL for `commit`: a repeated commit
//!   keeps what the first wrote), `release` sets `state = 'released'`, fenced the same way.
//! - `describe`, `stuck_claims`, `resolve`, `purge_completed`: one statement each.
//!
//! # Group commit
//!
//! Claims that arrive while the store's claim statements are in flight go together in the
//! next one, and so do commits, and the inbox's new entries: one statement, one transaction
//! and one flush of the WAL for the lot, each delivery still answered with its own row and
//! fenced by its own token (the statements are in `batch.rs`: an insert-or-read over
//! `unnest`ed arrays for claims and entries, an `UPDATE … FROM` for commits). Each kind has two
//! lanes, two statements in flight at once: a write that finds a lane free is sent at once,
//! alone, as the statements above, with no timer, so a lone delivery pays nothing for it. A
//! batch carries at most [`max_batch`](PostgresStore::max_batch) writes (128 unless set) and
//! 1 MiB of receipts or requests; a key may be twice in a batch of claims (both answered with
//! its row, each with its own token), never in a batch of commits or of inbox entries (a
//! second entry of a key waits for the next batch, where it finds the first). The keys of a batch are sorted, so
//! that two instances' batches take shared keys in one order. A batch that fails to
//! serialize or deadlocks is sent again write by write; any other failure answers its own
//! deliveries 503, never another's. Every 2xx still goes out after that delivery's own claim
//! and commit are durable. `max_batch(1)` turns it off.
//!
//! # Delivery counts
//!
//! A duplicate (of a done key, or of one in flight or held) is answered from the read alone,
//! which writes nothing and so never waits for a disk flush. Its delivery is counted in the
//! process and added to the row's `deliveries` and `last_seen_at` by a background task about
//! once a second ([`with_count_interval`](PostgresStore::with_count_interval)), one `UPDATE` per key
//! that had duplicates meanwhile. [`describe`](crate::store::Store::describe) and
//! [`stuck_claims`](crate::store::Store::stuck_claims) on the same store include the counts not
//! written yet; another instance sees them once they are. A crash loses at most the last
//! interval's counts of the instance (never a claim: counts are statistics);
//! [`write_counts`](PostgresStore::write_counts) writes them at once, before shutting down say.
//!
//! # Transactional mode
//!
//! `BEGIN; SET LOCAL lock_timeout = <ms>` (one round trip), the marker's insert as `done`,
//! the handler's statements, a check that the marker is still in the transaction, `COMMIT`.
//! A duplicate's insert waits for the open transaction on the primary key; past the lock
//! timeout (SQLSTATE 55P03) it answers 409. The lock timeout stays in force for the handler's
//! own statements in the transaction, and ends with it: the pooled connection keeps its own.
//!
//! # Entity versions (the version guard)
//!
//! [`migrate`](PostgresStore::migrate) also creates, in the same transaction, the table of the
//! [version guard](crate::version_guard), named after the claims table (`<table>_versions`, whose
//! primary key's name `<table>_versions_pkey` still fits in 63 bytes):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys_versions" (
//!     namespace       TEXT        NOT NULL,
//!     entity          TEXT        NOT NULL,
//!     applied_version BIGINT,
//!     pending_version BIGINT,
//!     pending_token   BIGINT,
//!     pending_since   TIMESTAMPTZ,
//!     deliveries      BIGINT      NOT NULL,
//!     last_seen_at    TIMESTAMPTZ NOT NULL,
//!     PRIMARY KEY (namespace, entity)
//! );
//! ```
//!
//! - `begin_version`: one round trip, `INSERT … ON CONFLICT (namespace, entity) DO UPDATE SET
//!   deliveries = deliveries + 1, pending_* = CASE WHEN <not older than applied_version
//!   (applied_version <= ours), and nothing pending or the pending one stale and the policy
//!   reclaims> THEN <ours> ELSE <as was> END RETURNING applied_version, pending_version,
//!   pending_token, <age>`; acquired if the returned token is ours, outdated if the returned
//!   applied version is newer than ours.
//! - `commit_version`: `UPDATE … SET applied_version = GREATEST(applied_version,
//!   pending_version), pending_* = NULL WHERE … AND pending_token = $3`; `release_version`
//!   the same without moving `applied_version`. One round trip each.
//! - [`version_guard::advance`](crate::version_guard::advance), in the caller's transaction: `INSERT … ON
//!   CONFLICT … DO UPDATE SET applied_version = excluded.applied_version WHERE
//!   t.applied_version IS NULL OR t.applied_version <= excluded.applied_version RETURNING
//!   applied_version` (an equal version advances, as the version guard runs it); when it returns
//!   nothing (outdated: the row is at a newer version), a `SELECT` of the applied version. The
//!   conflicting row is locked either way until the transaction ends.
//!
//! # Inbox
//!
//! [`migrate`](PostgresStore::migrate) also creates, in the same transaction, the table of the
//! [inbox](crate::store::inbox) (`<table>_inbox`: at most 55 bytes, so that the names of its
//! indexes still fit in 63), which a database of an earlier release gets on its next
//! `migrate()`:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys_inbox" (
//!     namespace   TEXT        NOT NULL,
//!     "key"       TEXT        NOT NULL,
//!     state       TEXT        NOT NULL,
//!     token       BIGINT,
//!     attempts    INTEGER     NOT NULL DEFAULT 0,
//!     crashes     INTEGER     NOT NULL DEFAULT 0,
//!     started     BOOLEAN     NOT NULL DEFAULT TRUE,
//!     received_at TIMESTAMPTZ NOT NULL,
//!     due_at      TIMESTAMPTZ NOT NULL,
//!     renewed_at  TIMESTAMPTZ NOT NULL,
//!     settled_at  TIMESTAMPTZ,
//!     request     BYTEA,
//!     history     BYTEA,
//!     PRIMARY KEY (namespace, "key")
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_inbox_due_idx"
//!     ON "idempotency_keys_inbox" (due_at) WHERE state = 'queued';
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_inbox_run_idx"
//!     ON "idempotency_keys_inbox" (renewed_at) WHERE state = 'running';
//! ```
//!
//! `state` is one of `queued`, `running`, `done` and `dead`; as on the claims table, no check
//! constraint says so, and `migrate()` drops the one earlier releases made.
//!
//! `request` holds [`StoredRequest::encode`](crate::store::inbox::StoredRequest::encode)'s
//! bytes (NULL once retention deleted them), `history` those of
//! [`Attempt::encode_history`](crate::store::inbox::Attempt::encode_history), `token` the
//! lease of a `running` entry (NULL otherwise), `started` whether that entry's handler
//! started (an earlier release's table gets the column from `migrate()`). The two partial indexes hold the entries a
//! worker's take looks for, due ones by their due time and running ones by their last
//! renewal; done and dead entries are in neither, so the inbox's history costs a take
//! nothing. Each operation is one statement, one round trip, but where said:
//!
//! - `enqueue`: `WITH found AS (SELECT state FROM … WHERE namespace = $1 AND "key" = $2),
//!   inserted AS (INSERT … SELECT … WHERE NOT EXISTS (SELECT 1 FROM found) ON CONFLICT
//!   (namespace, "key") DO NOTHING RETURNING state), woken AS (SELECT state,
//!   pg_notify('<channel>', '') FROM inserted) SELECT … FROM found UNION ALL SELECT … FROM
//!   woken`: a new key is inserted and notified, a duplicate is the read alone and writes
//!   nothing. (A key another enqueue stored after the statement's snapshot was taken is in
//!   neither part: a plain read of its state follows then.)
//! - `take`: `WITH queued AS (SELECT … WHERE state = 'queued' AND due_at <= now() ORDER BY
//!   due_at LIMIT $1 FOR UPDATE SKIP LOCKED), stale AS (<the same for running entries not
//!   renewed for the stale limit: under reclaim, all; under hold, those never started>),
//!   picked AS (<the oldest due of both, LIMIT $1>) UPDATE … SET state = 'running', token =
//!   <one of the worker's tokens, bound as an array>, started = FALSE, renewed_at = now() …
//!   FROM picked … RETURNING …`: workers on any number of instances skip each other's rows and
//!   never lease one entry twice. An entry whose handler started counts a crash, and one
//!   crashed on its last attempt is made `dead` in the same `UPDATE` instead, and is not
//!   answered.
//! - `start`: one `UPDATE … FROM unnest(…)` for the whole take: `started = TRUE`, the attempt
//!   counted. `give_back`: one `UPDATE … WHERE state = 'running' AND token = ANY($1)`.
//! - `renew_entry`, `settle`: `UPDATE … WHERE namespace = $1 AND "key" = $2 AND token = $3 AND
//!   state = 'running'`, the lease lost when it changes no row; a settlement clears the token.
//! - `retry_now`, `retry_dead`, `discard`, `entries`, `entry`, `stored_request`,
//!   `inbox_stats`: one statement each (the stats count each state on its own, the queued
//!   and running ones on their indexes); a retry notifies the channel as an enqueue does.
//! - `purge_inbox`: `WITH old AS (SELECT … WHERE state = 'done' AND settled_at <= <the
//!   limit> LIMIT $2 FOR UPDATE SKIP LOCKED) UPDATE … SET request = NULL`, then the same
//!   with `DELETE`: two statements. They read the done entries without an index.
//!
//! ## Notifications
//!
//! An enqueue that stored an entry asks for a `pg_notify` after its insert committed, sent by
//! a task of the store's (`SELECT pg_notify(…)`, which writes nothing), one for every burst of
//! such asks: a notification committed with the insert would hold PostgreSQL's lock on the
//! notification queue through the commit's flush, and concurrent enqueues would commit one at
//! a time. The channel is named after the inbox table: `<table>_inbox` as given (`idempotency_keys_inbox` by default, with its
//! schema when the table has one, unless that is longer than the 63 bytes a channel's name
//! can be; then without it). [`watch`](crate::store::inbox::InboxStore::watch) holds a
//! connection of its own, made with the options of the store's pool (outside it, so it takes
//! none of its connections), that `LISTEN`s on the channel and wakes the workers at each
//! notification. It makes the connection again when it is lost, after a pause of 50 ms that
//! doubles up to 5 s while the database cannot be reached, and wakes the workers once each
//! time it starts listening: what was stored while nothing listened is found then.

use std::sync::Arc;

use sqlx::{PgPool, Postgres};

use super::batch::DEFAULT_MOST;
use super::sql::{NewKeys, ResultExt as _, Table, TableName};
use super::{ConfigError, StoreError};

mod batch;
mod claims;
mod inbox;
mod queries;
mod transactional;
mod versions;

use batch::Batches;
use inbox::Herald;
use queries::{add_receipt, drop_earlier, insert_new, insert_or_read, queries, upgrade};

/// Claims kept in a PostgreSQL table, shared by every app instance that uses the database.
///
/// Cloning is cheap: clones share the pool. Call [`migrate`](Self::migrate) once at start-up
/// (it is idempotent) before serving. See the [module docs](crate::store::postgres) for the SQL,
/// the time source and the round trips.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    table: Table<Postgres>,
    /// The statements of the inbox that are PostgreSQL's own (the others are the table's).
    inbox: Arc<inbox::Own>,
    /// Sends the notifications of new inbox entries.
    herald: Arc<Herald>,
    /// Where concurrent claims, commits and inbox entries meet to go together.
    batches: Batches,
    /// Whether the store's last claim found its key new: the next claim, sent alone, then
    /// inserts first (see [round trips](self#round-trips)).
    new_keys: NewKeys,
}

impl PostgresStore {
    /// A store on `pool`, in the table `idempotency_keys`.
    pub fn new(pool: PgPool) -> Self {
        Self::on(
            Table::new(pool, queries(TableName::default_table())),
            DEFAULT_MOST,
        )
    }

    /// A store on `table`, its batches of at most `most` writes.
    fn on(table: Table<Postgres>, most: usize) -> Self {
        let inbox: Arc<inbox::Own> = inbox::own(&table.sql.table).into();
        let lone = Arc::new(claims::Lone {
            pool: table.pool.clone(),
            claim: insert_or_read(&table.sql.table).into(),
            insert: insert_new(&table.sql.table).into(),
            commit: table.sql.commit.clone(),
            enqueue: inbox.enqueue.clone(),
        });
        Self {
            batches: Batches::new(lone, &table.sql.table, most),
            inbox,
            herald: Arc::default(),
            table,
            new_keys: NewKeys::default(),
        }
    }

    /// Uses the table `name` instead: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes, or
    /// `schema.table` with each part so (the schema must exist). It is quoted in SQL, so it is
    /// case-sensitive.
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        let table = TableName::parse(name, true)?;
        let most = self.batches.claims.most();
        Ok(Self::on(self.table.with_queries(queries(table)), most))
    }

    /// The most claims that go to the database in one statement, and apart the most commits:
    /// 128 unless set. Claims (and commits) that arrive while the store's previous one is in
    /// flight go together in the next statement, so that concurrent deliveries share its
    /// round trip, its transaction and its flush to disk; a lone delivery's is sent at once,
    /// never held back for company (see [group commit](self#group-commit)). `1` sends each on
    /// its own, as many at a time as the pool allows. Set it before the store is used; clones
    /// made earlier keep theirs.
    ///
    /// At most 4,096: a larger `most` counts as that.
    ///
    /// # Panics
    ///
    /// If `most` is 0.
    pub fn max_batch(self, most: usize) -> Self {
        assert!(most > 0, "a batch carries at least one write");
        Self::on(self.table, most)
    }

    /// Creates the table and its indexes if they do not exist, with the tables of the
    /// version guard and of the inbox (`<table>_versions`, `<table>_inbox`), in one
    /// transaction, and upgrades a table made by an earlier release (new columns added, its
    /// rows kept). Safe to call at every start-up, from several instances at once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.table.pool.begin().await.store()?;
        self.table
            .script(&mut *tx, self.table.sql.migrate.clone())
            .await?;
        let table = &self.table.sql.table;
        // The columns that tell an earlier release's table: `runs` (added by the second),
        // `receipt` (the latest).
        let (runs, receipt): (bool, bool) = sqlx::query_as(
            "SELECT COALESCE(bool_or(attname = 'runs'), FALSE), \
             COALESCE(bool_or(attname = 'receipt'), FALSE) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname IN ('runs', 'receipt') \
             AND NOT attisdropped",
        )
        .bind(table.quoted('"'))
        .fetch_one(&mut *tx)
        .await
        .store()?;
        if !runs {
            tracing::info!(table = %table.name(), "upgrading the idempotency table");
            self.table.script(&mut *tx, upgrade(table)).await?;
        } else if !receipt {
            tracing::info!(table = %table.name(), "adding the receipt column to the idempotency table");
            self.table.script(&mut *tx, add_receipt(table)).await?;
        }
        self.table
            .script(&mut *tx, self.table.sql.versions.migrate.clone())
            .await?;
        self.table
            .script(&mut *tx, self.table.sql.inbox.migrate.clone())
            .await?;
        // An earlier release's inbox has no `started` column: its running entries started.
        let started: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attname = 'started' AND NOT attisdropped)",
        )
        .bind(table.inbox().quoted('"'))
        .fetch_one(&mut *tx)
        .await
        .store()?;
        if !started {
            tracing::info!(table = %table.inbox().name(), "adding the started column to the inbox table");
            self.table
                .script(&mut *tx, self.table.sql.inbox.add_started.clone())
                .await?;
        }
        // The checks on `state` of earlier releases, whatever their names (a renamed table
        // keeps the old one), but one inherited from a parent table, which cannot be dropped
        // here: each table's as `regclass` names it, and the check's.
        let checks: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.conrelid::regclass::text, c.conname::text FROM pg_constraint c \
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'state' \
             WHERE c.conrelid IN (to_regclass($1), to_regclass($2)) AND c.contype = 'c' \
             AND c.conkey = ARRAY[a.attnum] AND c.coninhcount = 0",
        )
        .bind(table.quoted('"'))
        .bind(table.inbox().quoted('"'))
        .fetch_all(&mut *tx)
        .await
        .store()?;
        // The indexes of earlier releases, which every commit updated, looked up on this
        // table: a name alone is looked up along the search path, and could be another
        // schema's.
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT i.indexrelid::regclass::text FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = to_regclass($1) AND c.relname = ANY($2)",
        )
        .bind(table.quoted('"'))
        .bind(&table.old_indexes()[..])
        .fetch_all(&mut *tx)
        .await
        .store()?;
        let drops = drop_earlier(&checks, &indexes);
        if !drops.is_empty() {
            tracing::info!(table = %table.name(), "dropping the checks and indexes of earlier releases");
            self.table.script(&mut *tx, drops).await?;
        }
        tx.commit().await.store()
    }
}

crate::store::sql::table_handles!(PostgresStore, PgPool);

/// 40001 serialization_failure: under REPEATABLE READ or SERIALIZABLE (the connection's
/// `default_transaction_isolation`), a concurrent delivery changed the key's row after this
/// statement's snapshot was taken. Nothing was written; the statement can be run again.
fn is_serialization_failure(e: &sqlx::Error) -> bool {
    <Postgres as super::sql::Backend>::is_serialization_failure(e)
}
