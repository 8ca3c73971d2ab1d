//! The [`InboxStore`] contract under concurrency: several instances enqueueing and taking at
//! once, and settlements in one batch, each answered on its own. The checks share the store's
//! inbox with nothing else while they run ([`INBOX_TABLE`](super::INBOX_TABLE)).

use std::collections::HashMap;
use std::time::Duration;

use crate::store::StoreError;
use crate::store::inbox::{AttemptResult, Enqueued, EntryState, InboxStore, Settlement};

use super::inbox::{
    LONG, attempt, enqueue_numbered, request, settle_done, take, take_one, take_ours,
};
use super::{key_in, unique_namespace};

/// 200 events, each enqueued 3 times, at once over `stores` (separate instances): each is
/// stored once; then every instance takes at once until none is left: each entry is taken
/// exactly once.
pub async fn instances_enqueue_and_take_each_once<S: InboxStore + Clone>(stores: Vec<S>) {
    let ns = unique_namespace("inbox-race");
    let events = 200;
    let mut tasks = Vec::new();
    for copy in 0..3 {
        for n in 0..events {
            let store = stores[(n + copy) % stores.len()].clone();
            let key = key_in(&ns, &format!("evt_{n}"));
            tasks.push(tokio::spawn(async move {
                store.enqueue(&key, &request(n)).await.unwrap()
            }));
        }
    }
    let mut stored = 0;
    for task in tasks {
        if task.await.unwrap() == Enqueued::Stored {
            stored += 1;
        }
    }
    assert_eq!(stored, events, "each event stored once");
    let workers: Vec<_> = stores
        .iter()
        .map(|store| {
            let store = store.clone();
            let ns = ns.clone();
            tokio::spawn(async move {
                let mut took = Vec::new();
                loop {
                    let batch = take_ours(&store, &take(7, LONG, 5), &ns).await;
                    if batch.is_empty() {
                        return took;
                    }
                    for entry in batch {
                        settle_done(&store, &entry.lease).await;
                        took.push(entry.lease.key().value().to_owned());
                    }
                }
            })
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for worker in workers {
        for key in worker.await.unwrap() {
            *seen.entry(key).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), events, "every entry taken");
    assert!(
        seen.values().all(|&n| n == 1),
        "an entry taken twice: {seen:?}"
    );
}

/// A batch of settlements: each lands as its own would, each answered in order, a spent
/// lease fenced off without failing the others.
pub async fn settle_many_answers_each<S: InboxStore>(store: S) {
    let ns = unique_namespace("inbox-batch");
    enqueue_numbered(&store, &ns, 5).await;
    let policy = take(10, LONG, 5);
    let mut taken = take_ours(&store, &policy, &ns).await;
    taken.sort_by(|a, b| a.lease.key().value().cmp(b.lease.key().value()));
    assert_eq!(taken.len(), 5);
    // evt_4 is settled apart and taken again: its first lease is spent.
    let spent = taken.pop().unwrap().lease;
    store
        .settle(
            &spent,
            &Settlement::Retry {
                after: Duration::ZERO,
            },
            &[],
        )
        .await
        .unwrap();
    let again = take_one(&store, &policy, &ns).await.lease;
    let history = vec![attempt(AttemptResult::Status(503))];
    let batch = [
        (taken[0].lease.clone(), Settlement::Done),
        (taken[1].lease.clone(), Settlement::Dead),
        (
            taken[2].lease.clone(),
            Settlement::Retry {
                after: Duration::from_secs(3600),
            },
        ),
        (taken[3].lease.clone(), Settlement::GiveBack),
        (spent, Settlement::Done),
        (again, Settlement::Done),
    ]
    .map(|(lease, settlement)| crate::store::inbox::Settling {
        lease,
        settlement,
        history: history.clone(),
    });
    let results = store.settle_many(&batch).await;
    assert_eq!(results.len(), 6);
    for (n, result) in results.iter().enumerate() {
        if n == 4 {
            assert!(matches!(result, Err(StoreError::LeaseLost)), "{result:?}");
        } else {
            assert!(result.is_ok(), "{n}: {result:?}");
        }
    }
    let state = |n: usize| {
        let key = key_in(&ns, &format!("evt_{n}"));
        let store = &store;
        async move { store.entry(&key).await.unwrap().unwrap() }
    };
    assert_eq!(state(0).await.state, EntryState::Done);
    assert_eq!(state(0).await.history, history);
    assert_eq!(state(1).await.state, EntryState::Dead);
    let later = state(2).await;
    assert_eq!(later.state, EntryState::Queued);
    assert!(later.due_in.unwrap() > Duration::from_secs(3000));
    let given_back = state(3).await;
    assert_eq!(
        (given_back.state, given_back.attempts),
        (EntryState::Queued, 0)
    );
    assert!(
        given_back.history.is_empty(),
        "a give-back keeps the history"
    );
    assert_eq!(state(4).await.state, EntryState::Done);
    // Leave nothing due for the next check.
    for entry in take_ours(&store, &policy, &ns).await {
        settle_done(&store, &entry.lease).await;
    }
}
