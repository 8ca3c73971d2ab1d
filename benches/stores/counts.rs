//! What the databases did per delivery, counted apart from the timing: for each side, path and
//! concurrency, [`fixed_count`] deliveries through that side alone, between two reads of the
//! counters.
//!
//! - Every backend: the statements sqlx ran (one `sqlx::query` event each).
//! - PostgreSQL: `pg_stat_database.xact_commit` (transactions), `pg_stat_wal.wal_write` and
//!   `wal_sync` (WAL writes, and flushes to disk; on PostgreSQL 18, which moved them,
//!   `pg_stat_io`'s `writes` and `fsyncs` of the WAL), `pg_stat_wal.wal_bytes`. A connection
//!   publishes its counters as it goes idle, at most once a second: before each read every
//!   connection of the pool, and the reading one, is made to publish
//!   (`pg_stat_force_next_flush()`).
//! - MariaDB: global `Questions` (statements), `Com_insert` + `Com_update`, `Com_select`,
//!   `Handler_commit` (commits, a read's too), `Innodb_log_writes` (redo log writes) and the
//!   fsyncs: `Innodb_os_log_fsyncs` where the server has it; MariaDB 10.8 and later count the
//!   redo log's in `Innodb_data_fsyncs`, with the data files'.
//!
//! The servers' counters are the whole server's (PostgreSQL's: the database's): with nothing
//! else running, a window's deltas are its deliveries'. The statements the last read ran (each
//! a transaction of its own) are subtracted. The stores write the counts of duplicates they
//! hold back before a window and again at its end, so that each window holds the writes its
//! own deliveries caused; the window then waits [`SETTLE`] (for the WAL writer's counts)
//! before its last read.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::runtime::Runtime;

use super::{CONCURRENCY, Db, Kind, POOL_SIZE, Side, fixed_count, keys};

/// How long a window waits after its deliveries before its last read.
const SETTLE: Duration = Duration::from_millis(250);

/// Counts `sqlx::query` events: sqlx records one per statement it executes. Installed once
/// the timed parts are over, since with a subscriber sqlx formats every statement it logs.
pub(crate) struct StatementCounter;

static STATEMENTS: AtomicU64 = AtomicU64::new(0);

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if self.enabled(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.target() == "sqlx::query" || meta.target() == BATCH_TARGET
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == BATCH_TARGET {
            let mut writes = BatchWrites(None);
            event.record(&mut writes);
            if let Some(n) = writes.0 {
                BATCHES.lock().unwrap().push(n);
            }
            return;
        }
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The target of the stores' events of batches, with their number of `writes`.
const BATCH_TARGET: &str = "tower_idempotency::store::batch";

/// The sizes of the batches seen since they were last taken.
static BATCHES: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Reads the `writes` field of a batch's event.
struct BatchWrites(Option<u64>);

impl tracing::field::Visit for BatchWrites {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "writes" {
            self.0 = Some(value);
        }
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.record_u64(field, value.unsigned_abs());
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

/// The batches seen since the last call: writes per batch, mean and largest, or `None` when
/// there were none (a store without batches).
pub(crate) fn batch_sizes() -> Option<String> {
    let sizes = std::mem::take(&mut *BATCHES.lock().unwrap());
    let largest = *sizes.iter().max()?;
    let mean = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
    Some(format!("{mean:.1} (max {largest})"))
}

const SQLX: &str = "statements (sqlx)";

/// The counters a backend has, in the summary's order.
fn columns(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Postgres => &[
            SQLX,
            "transactions",
            "WAL writes",
            "WAL flushes",
            "WAL bytes",
        ],
        Kind::MySql => &[
            SQLX,
            "statements (server)",
            "inserts + updates",
            "selects",
            "commits",
            "redo log writes",
            "fsyncs",
        ],
        Kind::Sqlite => &[SQLX],
    }
}

/// Counter values by name.
type Readings = BTreeMap<&'static str, f64>;

/// One side's counts at one path and concurrency.
pub(crate) struct Row {
    path: &'static str,
    concurrency: usize,
    side: &'static str,
    /// Per delivery, by counter.
    per_delivery: Readings,
    /// The sizes of the batches its store's statements carried, where the store tells them.
    batches: Option<String>,
}

/// Counts of every side of `sides` on `db`, new events and duplicates, at each concurrency.
pub(crate) fn count(rt: &Runtime, db: &Db, sides: &[Side]) -> Vec<Row> {
    rt.block_on(async {
        let counters = Counters::new(db).await;
        // Every connection of the pool prepares every side's statements before any count,
        // and the reads theirs.
        for side in sides {
            for path in ["new", "duplicate"] {
                side.run(64, 8 * u64::from(POOL_SIZE), keys(path), false)
                    .await;
            }
        }
        counters.read().await;
        let n = fixed_count();
        let mut rows = Vec::new();
        for path in ["new", "duplicate"] {
            for concurrency in CONCURRENCY {
                for side in sides {
                    let warm = (2 * concurrency as u64).max(16);
                    side.run(concurrency, warm, keys(path), false).await;
                    // What the warm-up's statements carried is not the count's.
                    let _ = (side.batches)();
                    let run = async {
                        side.run(concurrency, n, keys(path), false).await;
                    };
                    let per_delivery = counters
                        .window(sides, run)
                        .await
                        .into_iter()
                        .map(|(name, v)| (name, v / n as f64))
                        .collect();
                    rows.push(Row {
                        path,
                        concurrency,
                        side: side.name,
                        per_delivery,
                        batches: (side.batches)(),
                    });
                }
            }
        }
        rows
    })
}

/// Where the counters of a pool's database are read.
struct Counters<'a> {
    db: &'a Db,
    /// A connection of its own to the server, none for SQLite.
    monitor: Option<Db>,
    /// PostgreSQL 18 and later: WAL writes and flushes from `pg_stat_io`.
    wal_in_io: bool,
}

impl<'a> Counters<'a> {
    async fn new(db: &'a Db) -> Counters<'a> {
        let kind = db.kind();
        let monitor = match kind {
            Kind::Sqlite => None,
            _ => Some(kind.connect(1, true).await.expect("counters' connection")),
        };
        let mut wal_in_io = false;
        if let Some(Db::Postgres(monitor)) = &monitor {
            let version: i32 =
                sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
                    .fetch_one(monitor)
                    .await
                    .unwrap_or_default();
            wal_in_io = version >= 180_000;
        }
        Counters {
            db,
            monitor,
            wal_in_io,
        }
    }

    /// The counters' deltas over `work`, less what the reads ran. Every side's store writes
    /// what it holds back before `work` and after it.
    async fn window(&self, sides: &[Side], work: impl Future<Output = ()>) -> Readings {
        for side in sides {
            (side.settle)().await;
        }
        let (before, _) = self.read().await;
        work.await;
        for side in sides {
            (side.settle)().await;
        }
        tokio::time::sleep(SETTLE).await;
        let (after, ran) = self.read().await;
        after
            .into_iter()
            .filter_map(|(name, v)| {
                // The last read's statements, each a transaction of its own, are in the
                // deltas of the counters of statements and transactions.
                let read = match name {
                    SQLX | "transactions" | "statements (server)" => ran,
                    _ => 0.0,
                };
                Some((name, v - before.get(name)? - read))
            })
            .collect()
    }

    /// The counters now: sqlx's, and the server's (none for SQLite); and how many statements
    /// the read ran. A counter the server does not have is left out.
    async fn read(&self) -> (Readings, f64) {
        let mut out = Readings::new();
        let mut ran = 0;
        match (self.db, &self.monitor) {
            (Db::Postgres(pool), Some(Db::Postgres(monitor))) => {
                let flush = "SELECT pg_stat_force_next_flush()";
                let mut held = Vec::new();
                for _ in 0..pool.size() {
                    held.push(pool.acquire().await.expect("connection"));
                }
                for conn in &mut held {
                    sqlx::query(flush)
                        .execute(&mut **conn)
                        .await
                        .expect("publish the counters");
                    ran += 1;
                }
                drop(held);
                sqlx::query(flush)
                    .execute(monitor)
                    .await
                    .expect("publish the counters");
                let wal = if self.wal_in_io {
                    "SELECT sum(writes)::float8, sum(fsyncs)::float8 FROM pg_stat_io \
                     WHERE object = 'wal'"
                } else {
                    "SELECT wal_write::float8, wal_sync::float8 FROM pg_stat_wal"
                };
                let (commits, bytes): (f64, f64) = sqlx::query_as(
                    "SELECT d.xact_commit::float8, w.wal_bytes::float8 \
                     FROM pg_stat_database AS d, pg_stat_wal AS w \
                     WHERE d.datname = current_database()",
                )
                .fetch_one(monitor)
                .await
                .expect("pg_stat_database");
                let (writes, syncs): (f64, f64) = sqlx::query_as(wal)
                    .fetch_one(monitor)
                    .await
                    .expect("WAL counters");
                ran += 3;
                out.insert("transactions", commits);
                out.insert("WAL bytes", bytes);
                out.insert("WAL writes", writes);
                out.insert("WAL flushes", syncs);
            }
            (Db::MySql(_), Some(Db::MySql(monitor))) => {
                let status: Vec<(String, String)> = sqlx::query_as(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_insert', \
                     'Com_update', 'Com_select', 'Handler_commit', 'Innodb_log_writes', \
                     'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')",
                )
                .fetch_all(monitor)
                .await
                .expect("SHOW GLOBAL STATUS");
                ran += 1;
                let get = |name: &str| {
                    status
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .and_then(|(_, v)| v.parse::<f64>().ok())
                };
                let mut put = |column, value: Option<f64>| {
                    if let Some(value) = value {
                        out.insert(column, value);
                    }
                };
                put("statements (server)", get("Questions"));
                put(
                    "inserts + updates",
                    get("Com_insert").zip(get("Com_update")).map(|(i, u)| i + u),
                );
                put("selects", get("Com_select"));
                put("commits", get("Handler_commit"));
                put("redo log writes", get("Innodb_log_writes"));
                put(
                    "fsyncs",
                    get("Innodb_os_log_fsyncs").or_else(|| get("Innodb_data_fsyncs")),
                );
            }
            _ => {}
        }
        // Last, so that the read's own statements are in it.
        out.insert(SQLX, STATEMENTS.load(Ordering::Relaxed) as f64);
        (out, f64::from(ran))
    }
}

/// The counts of one pool as a table: a row per path, concurrency and side; the batch sizes
/// in a last column where a store told them.
pub(crate) fn table(kind: Kind, rows: &[Row]) {
    let columns = columns(kind);
    let batches = rows.iter().any(|row| row.batches.is_some());
    let mut head = "| path | concurrency | side |".to_owned();
    let mut rule = "|---|---:|---|".to_owned();
    for column in columns {
        head += &format!(" {column} |");
        rule += "---:|";
    }
    if batches {
        head += " batch sizes |";
        rule += "---|";
    }
    println!("{head}\n{rule}");
    for row in rows {
        let mut line = format!("| {} | {} | {} |", row.path, row.concurrency, row.side);
        for column in columns {
            line += &match row.per_delivery.get(column) {
                Some(v) if *column == "WAL bytes" => format!(" {v:.0} |"),
                Some(v) => format!(" {v:.2} |"),
                None => " - |".to_owned(),
            };
        }
        if batches {
            line += &format!(" {} |", row.batches.as_deref().unwrap_or("-"));
        }
        println!("{line}");
    }
}
