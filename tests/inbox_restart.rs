//! Promise: the database restarted under a running inbox loses nothing and runs nothing twice,
//! and the workers resume by themselves (DESIGN.md, "Tests that matter" 7).
//!
//! Senders keep delivering 300 events (each until it is answered 2xx, as senders retry a
//! 503) to two instances with their own pools and workers, while PostgreSQL is restarted
//! (`pg_ctlcluster <version> main restart`). Then every event has run exactly once.
//!
//! A test binary of its own: cargo runs test binaries one at a time, so no other test meets
//! the restart. It restarts only the local cluster, and only when `POSTGRES_URL` is unset or
//! points at 127.0.0.1: a remote database is not this test's to restart (it says so and
//! passes, unless `CI` is set).

#![cfg(all(unix, feature = "postgres"))]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::inbox::{Backoff, Inbox, WorkerHandle};
use tower_idempotency::key;
use tower_idempotency::store::PostgresStore;
use tower_idempotency::store::inbox::InboxStore;

const TABLE: &str = "inbox_restart";
const EVENTS: usize = 300;

type Runs = Arc<Mutex<HashMap<String, usize>>>;

async fn instance(runs: Runs) -> Option<(Router, WorkerHandle, PostgresStore)> {
    let pool = common::db::postgres_pool().await?;
    let store = PostgresStore::new(pool).with_table_name(TABLE).unwrap();
    store.migrate().await.expect("migrate");
    let inbox = Inbox::new(store.clone());
    let app = Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            *runs.lock().unwrap().entry(body).or_default() += 1;
            StatusCode::NO_CONTENT
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let workers = inbox
        .workers(app.clone())
        .backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
            50,
        ))
        .poll_interval(Duration::from_millis(100))
        .spawn();
    Some((app, workers, store))
}

fn local() -> bool {
    std::env::var("POSTGRES_URL").map_or(true, |url| url.contains("127.0.0.1"))
}

fn restart_postgres() {
    let versions = std::fs::read_dir("/etc/postgresql").expect("/etc/postgresql");
    let version = versions
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a cluster");
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .status()
        .expect("pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster restart: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_loses_nothing_and_runs_nothing_twice() {
    if !local() {
        assert!(
            std::env::var_os("CI").is_none(),
            "POSTGRES_URL is not local: this test restarts only a local cluster"
        );
        eprintln!("SKIPPED: POSTGRES_URL is not local; the restart test needs the local cluster");
        return;
    }
    let runs: Runs = Arc::default();
    let Some(one) = instance(runs.clone()).await else {
        return;
    };
    let Some(two) = instance(runs.clone()).await else {
        return;
    };
    // Leftovers of an earlier run would count as runs: start from an empty inbox.
    one.2
        .purge_inbox(Duration::ZERO, Duration::ZERO, 1_000_000)
        .await
        .unwrap();
    let apps = [one.0.clone(), two.0.clone()];
    let ns = common::unique_namespace("restart");
    let senders: Vec<_> = (0..EVENTS)
        .map(|n| {
            let app = apps[n % 2].clone();
            let event = format!("{ns}-{n}");
            tokio::spawn(async move {
                // Spread over the restart.
                tokio::time::sleep(Duration::from_millis(n as u64 * 10)).await;
                let deadline = Instant::now() + Duration::from_secs(90);
                loop {
                    let req = Request::post("/hooks")
                        .header("x-event-id", &event)
                        .body(Body::from(event.clone()))
                        .unwrap();
                    let status = app.clone().oneshot(req).await.unwrap().status();
                    if status.is_success() {
                        return;
                    }
                    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{event}");
                    assert!(Instant::now() < deadline, "{event} never stored");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    tokio::task::spawn_blocking(restart_postgres).await.unwrap();
    for sender in senders {
        sender.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ran = runs
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(&ns))
            .count();
        if ran == EVENTS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ran} of {EVENTS} events ran after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a second run, were there one to come.
    tokio::time::sleep(Duration::from_secs(1)).await;
    one.1.stop().await;
    two.1.stop().await;
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "run more than once: {twice:?}");
}
