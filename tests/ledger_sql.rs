//! Promise: the ledger on PostgreSQL and SQLite pins its records. Four instances (a pool each)
//! append while a fifth publishes checkpoints: every record is numbered once, and every
//! checkpoint ever published audits clean (no false alarm). Each change made to the table by
//! hand after a checkpoint (a status edited, a record deleted, two swapped, one inserted with
//! the rest renumbered, the tail truncated) is named by the audit.

mod common;

use std::time::{Duration, SystemTime};

use tower_idempotency::ledger::{
    Event, Finding, LedgerStore, Logged, NoteSigner, PostgresLedger, Record, SqliteLedger, audit,
    publish,
};
use tower_idempotency::{IdempotencyKey, Outcome};

const ORIGIN: &str = "example.com/hooks";

fn signer() -> NoteSigner {
    NoteSigner::from_seed(ORIGIN, [21; 32]).unwrap()
}

fn delivery(id: &str) -> Record {
    Record {
        key: IdempotencyKey::new("github", id.to_owned()).unwrap(),
        at: SystemTime::now(),
        event: Event::Delivery {
            number: Some(1),
            outcome: Outcome::Processed,
            replay: false,
        },
    }
}

/// A table name of this test's own.
fn table(test: &str) -> String {
    let unique = common::unique_namespace(test).replace(['-', '.', ':'], "_");
    format!("l{}", &unique[unique.len().saturating_sub(40)..])
}

/// Four writers, each on its own ledger (pool), and a publisher on a fifth, at once; then
/// every note the publisher signed audits clean.
async fn instances_append_while_one_publishes<L: LedgerStore + Clone>(ledgers: Vec<L>) {
    let (publisher, writers) = ledgers.split_first().unwrap();
    let mut tasks = Vec::new();
    for (instance, ledger) in writers.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            for batch in 0..30 {
                let records: Vec<Record> = (0..(batch % 7 + 1))
                    .map(|n| delivery(&format!("d-{instance}-{batch}-{n}")))
                    .collect();
                ledger.append(&records).await.unwrap();
            }
        }));
    }
    let expected: u64 = 4 * (0..30).map(|batch| batch % 7 + 1).sum::<u64>();
    let signer = signer();
    let mut notes = Vec::new();
    loop {
        let done = tasks.iter().all(tokio::task::JoinHandle::is_finished);
        let checkpoint = publish(publisher, &signer, ORIGIN).await.unwrap();
        notes.push(checkpoint.sign(&signer).unwrap());
        if done {
            assert_eq!(checkpoint.size, expected, "every record numbered once");
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(notes.len() > 1);
    for note in &notes {
        let (checkpoint, verdict) = audit(publisher, &signer.verifier(), Some(note))
            .await
            .unwrap();
        assert!(
            verdict.is_intact(),
            "{}: {:?}",
            checkpoint.size,
            verdict.findings
        );
    }
    let key = IdempotencyKey::new("github", "d-2-6-3").unwrap();
    assert_eq!(publisher.timeline(&key).await.unwrap().len(), 1);
}

/// Ten records, checkpointed; the note the auditor keeps.
async fn ten_signed<L: LedgerStore>(ledger: &L) -> String {
    let records: Vec<Record> = (0..10).map(|n| delivery(&format!("d-{n}"))).collect();
    ledger.append(&records).await.unwrap();
    let checkpoint = publish(ledger, &signer(), ORIGIN).await.unwrap();
    assert_eq!(checkpoint.size, 10);
    checkpoint.sign(&signer()).unwrap()
}

async fn findings<L: LedgerStore>(ledger: &L, note: &str) -> Vec<Finding> {
    let (_, verdict) = audit(ledger, &signer().verifier(), Some(note))
        .await
        .unwrap();
    verdict.findings
}

/// The forged record that an insertion puts at number 4, with its leaf.
fn forged() -> Logged {
    Logged::new(4, delivery("d-forged").encode())
}

mod postgres {
    use super::*;

    async fn ledger(table: &str) -> Option<PostgresLedger> {
        let pool = common::db::postgres_pool().await?;
        let ledger = PostgresLedger::new(pool).with_table_name(table).unwrap();
        ledger.migrate().await.unwrap();
        Some(ledger)
    }

    async fn run(pool: &sqlx::PgPool, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn instances_append_while_one_publishes() {
        let name = table("pg-ledger");
        let mut ledgers = Vec::new();
        for _ in 0..5 {
            let Some(ledger) = ledger(&name).await else {
                return;
            };
            ledgers.push(ledger);
        }
        super::instances_append_while_one_publishes(ledgers).await;
    }

    /// A record whose insert commits after a later one's was numbered is numbered after it,
    /// not skipped: the publisher numbers what has no number, not a range of ids.
    #[tokio::test]
    async fn a_record_committed_late_is_numbered_late() {
        let name = table("pg-late");
        let Some(ledger) = ledger(&name).await else {
            return;
        };
        let pool = common::db::postgres_pool().await.unwrap();
        let mut late = pool.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{name}_ledger\" (namespace, \"key\", record) VALUES ('github', \
             'd-late', '\\x{}')",
            hex(&delivery("d-late").encode())
        )))
        .execute(&mut *late)
        .await
        .unwrap();
        ledger.append(&[delivery("d-early")]).await.unwrap();
        let first = publish(&ledger, &signer(), ORIGIN).await.unwrap();
        assert_eq!(first.size, 1, "the uncommitted record is not seen yet");
        late.commit().await.unwrap();
        let second = publish(&ledger, &signer(), ORIGIN).await.unwrap();
        assert_eq!(second.size, 2, "and numbered once it committed");
        let records = ledger.records(0, 2).await.unwrap();
        let late = records.iter().find(|r| r.seq == 1).unwrap();
        assert_eq!(Record::decode(&late.record).unwrap().key.value(), "d-late");
        let (_, verdict) = audit(&ledger, &signer().verifier(), None).await.unwrap();
        assert!(verdict.is_intact());
    }

    #[tokio::test]
    async fn each_change_made_in_the_table_is_named() {
        let Some(pool) = common::db::postgres_pool().await else {
            return;
        };
        let cases: [(&str, Vec<Finding>); 5] = [
            (
                "UPDATE {t} SET record = convert_to(replace(convert_from(record, 'UTF8'), \
                 'processed', 'released'), 'UTF8') WHERE seq = 3",
                vec![Finding::Altered { seq: 3 }],
            ),
            (
                "DELETE FROM {t} WHERE seq = 5",
                vec![Finding::Deleted { seq: 5 }],
            ),
            (
                "UPDATE {t} SET seq = -1 WHERE seq = 1; UPDATE {t} SET seq = 1 WHERE seq = 2; \
                 UPDATE {t} SET seq = 2 WHERE seq = -1",
                vec![
                    Finding::Moved { seq: 1, was: 2 },
                    Finding::Moved { seq: 2, was: 1 },
                ],
            ),
            (
                "UPDATE {t} SET seq = seq + 1000 WHERE seq >= 4; \
                 UPDATE {t} SET seq = seq - 999 WHERE seq >= 1000; {insert}",
                vec![Finding::Inserted { seq: 4 }],
            ),
            (
                "DELETE FROM {t} WHERE seq >= 8",
                vec![Finding::Truncated { from: 8, size: 10 }],
            ),
        ];
        let forged = forged();
        for (n, (edit, expected)) in cases.into_iter().enumerate() {
            let name = table(&format!("pg-tamper-{n}"));
            let Some(ledger) = ledger(&name).await else {
                return;
            };
            let note = ten_signed(&ledger).await;
            let t = format!("\"{name}_ledger\"");
            let insert = format!(
                "INSERT INTO {t} (seq, namespace, \"key\", record, leaf) \
                 VALUES (4, 'github', 'd-forged', '\\x{}', '\\x{}')",
                hex(&forged.record),
                hex(&forged.leaf)
            );
            run(&pool, &edit.replace("{t}", &t).replace("{insert}", &insert)).await;
            assert_eq!(findings(&ledger, &note).await, expected, "{edit}");
        }
    }
}

mod sqlite {
    use super::*;

    async fn pool() -> sqlx::SqlitePool {
        common::db::sqlite_file_pool(common::db::sqlite_file("ledger")).await
    }

    async fn ledger(table: &str) -> SqliteLedger {
        let ledger = SqliteLedger::new(pool().await)
            .with_table_name(table)
            .unwrap();
        ledger.migrate().await.unwrap();
        ledger
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn instances_append_while_one_publishes() {
        let name = table("sqlite-ledger");
        let mut ledgers = Vec::new();
        for _ in 0..5 {
            ledgers.push(ledger(&name).await);
        }
        super::instances_append_while_one_publishes(ledgers).await;
    }

    #[tokio::test]
    async fn each_change_made_in_the_table_is_named() {
        let pool = pool().await;
        let cases: [(&str, Vec<Finding>); 5] = [
            (
                "UPDATE {t} SET record = CAST(replace(CAST(record AS TEXT), 'processed', \
                 'released') AS BLOB) WHERE seq = 3",
                vec![Finding::Altered { seq: 3 }],
            ),
            (
                "DELETE FROM {t} WHERE seq = 5",
                vec![Finding::Deleted { seq: 5 }],
            ),
            (
                "UPDATE {t} SET seq = -1 WHERE seq = 1; UPDATE {t} SET seq = 1 WHERE seq = 2; \
                 UPDATE {t} SET seq = 2 WHERE seq = -1",
                vec![
                    Finding::Moved { seq: 1, was: 2 },
                    Finding::Moved { seq: 2, was: 1 },
                ],
            ),
            (
                "UPDATE {t} SET seq = seq + 1000 WHERE seq >= 4; \
                 UPDATE {t} SET seq = seq - 999 WHERE seq >= 1000; {insert}",
                vec![Finding::Inserted { seq: 4 }],
            ),
            (
                "DELETE FROM {t} WHERE seq >= 8",
                vec![Finding::Truncated { from: 8, size: 10 }],
            ),
        ];
        let forged = forged();
        for (n, (edit, expected)) in cases.into_iter().enumerate() {
            let name = table(&format!("sqlite-tamper-{n}"));
            let ledger = ledger(&name).await;
            let note = ten_signed(&ledger).await;
            let t = format!("\"{name}_ledger\"");
            let insert = format!(
                "INSERT INTO {t} (seq, namespace, \"key\", record, leaf) \
                 VALUES (4, 'github', 'd-forged', X'{}', X'{}')",
                hex(&forged.record),
                hex(&forged.leaf)
            );
            let sql = edit.replace("{t}", &t).replace("{insert}", &insert);
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .unwrap();
            assert_eq!(findings(&ledger, &note).await, expected, "{edit}");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Two instances each run a `Publisher` (a claims store and a ledger on a pool of their own)
/// while records arrive: they take turns through the claims store, and what they publish
/// audits clean.
mod publishers {
    use super::*;
    use tower_idempotency::ledger::Publisher;
    use tower_idempotency::store::PostgresStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_take_turns_and_every_record_is_checkpointed() {
        let name = table("pg-publishers");
        let mut instances = Vec::new();
        for _ in 0..2 {
            let Some(pool) = common::db::postgres_pool().await else {
                return;
            };
            let store = PostgresStore::new(pool.clone())
                .with_table_name(&name)
                .unwrap();
            store.migrate().await.unwrap();
            let ledger = PostgresLedger::new(pool).with_table_name(&name).unwrap();
            ledger.migrate().await.unwrap();
            instances.push((store, ledger));
        }
        let publishers: Vec<Publisher> = instances
            .iter()
            .map(|(store, ledger)| {
                Publisher::spawn(
                    ledger.clone(),
                    store.clone(),
                    signer(),
                    ORIGIN,
                    Duration::from_millis(20),
                )
            })
            .collect();
        for n in 0..100 {
            let (_, ledger) = &instances[n % 2];
            ledger.append(&[delivery(&format!("d-{n}"))]).await.unwrap();
            if n % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let size = |p: &Publisher| p.last().map_or(0, |c| c.size);
        while publishers.iter().map(size).max() < Some(100) {
            assert!(
                std::time::Instant::now() < deadline,
                "never checkpointed all 100"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for publisher in publishers {
            publisher.stop().await;
        }
        let (_, ledger) = &instances[0];
        let (checkpoint, verdict) = audit(ledger, &signer().verifier(), None).await.unwrap();
        assert_eq!(checkpoint.size, 100);
        assert!(verdict.is_intact(), "{:?}", verdict.findings);
    }
}
