use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::*;

/// A write of the tests: its key, and the number it answers.
struct Write(IdempotencyKey, u32);

impl Keyed for Write {
    fn key(&self) -> &IdempotencyKey {
        &self.0
    }
    /// Its number, as bytes: the tests of the byte budget give it.
    fn bytes(&self) -> usize {
        self.1 as usize
    }
}

fn write(key: &str, n: u32) -> Write {
    Write(IdempotencyKey::new("t", key).unwrap(), n)
}

/// The keys of every batch a batcher sent, in order.
type Seen = Arc<StdMutex<Vec<Vec<String>>>>;

/// A batcher whose batches wait for a permit of `gate` each, recording the keys of every
/// batch; a write numbered 0 fails its batch.
fn gated(most: usize, gate: Arc<Semaphore>) -> (Batcher<Write, u32>, Seen) {
    shaped(Shape::new(most, 1), gate)
}

/// A batcher whose lone write is its batch of one, both written by `many`.
fn batcher<F, Fut>(shape: Shape, many: F) -> Batcher<Write, u32>
where
    F: Fn(Vec<Write>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answers<u32>> + Send + 'static,
{
    let many = Arc::new(many);
    let alone = many.clone();
    let one = move |op| {
        let answers = alone(vec![op]);
        async move { answers.await.pop().unwrap_or_else(|| Err(short())) }
    };
    Batcher::new(shape, one, move |ops| many(ops))
}

/// As [`gated`], shaped by `shape`.
fn shaped(shape: Shape, gate: Arc<Semaphore>) -> (Batcher<Write, u32>, Seen) {
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let record = seen.clone();
    let batcher = batcher(shape, move |ops: Vec<Write>| {
        let (gate, record) = (gate.clone(), record.clone());
        async move {
            gate.acquire().await.unwrap().forget();
            record
                .lock()
                .unwrap()
                .push(ops.iter().map(|w| w.0.value().to_owned()).collect());
            if ops.iter().any(|w| w.1 == 0) {
                return all_fail(std::io::Error::other("the batch failed"), ops.len());
            }
            ops.iter().map(|w| Ok(w.1)).collect()
        }
    });
    (batcher, seen)
}

/// Waits until `n` writes wait behind the batch in flight.
async fn waiting(batcher: &Batcher<Write, u32>, n: usize) {
    for _ in 0..1000 {
        if batcher.shared.lock().waiting.len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} writes never waited");
}

#[tokio::test]
async fn a_lone_write_goes_at_once_and_alone() {
    let gate = Arc::new(Semaphore::new(100));
    let (batcher, seen) = gated(8, gate);
    assert_eq!(batcher.write(write("a", 1)).await.unwrap(), 1);
    assert_eq!(batcher.write(write("b", 2)).await.unwrap(), 2);
    assert_eq!(*seen.lock().unwrap(), vec![vec!["a"], vec!["b"]]);
    assert_eq!(batcher.shared.lock().busy, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_if_idle_goes_alone_or_comes_back_unsent() {
    let gate = Arc::new(Semaphore::new(1));
    let (batcher, seen) = gated(8, gate.clone());
    assert!(matches!(
        batcher.write_if_idle(write("idle", 1)).await,
        Ok(Ok(1))
    ));
    let first = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("first", 2)).await }
    });
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
    // A write is in flight: handed back, neither sent nor waiting.
    match batcher.write_if_idle(write("busy", 3)).await {
        Err(back) => assert_eq!(back.0.value(), "busy"),
        Ok(_) => panic!("sent while a write was in flight"),
    }
    assert_eq!(batcher.shared.lock().waiting.len(), 0);
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 2);
    assert_eq!(*seen.lock().unwrap(), vec![vec!["idle"], vec!["first"]]);
    assert_eq!(batcher.shared.lock().busy, 0, "idle once nothing waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_arrive_meanwhile_share_the_next_batch_each_with_its_answer() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = gated(4, gate.clone());
    let first = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("first", 100)).await }
    });
    // The first is in flight, alone; ten more arrive while it is.
    waiting(&batcher, 0).await;
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
    // Each queued before the next is spawned: tasks on two threads would otherwise arrive in
    // any order.
    let mut later = Vec::new();
    for n in 1..=10 {
        let writer = batcher.clone();
        later.push(tokio::spawn(async move {
            writer.write(write(&format!("k{n}"), n)).await
        }));
        waiting(&batcher, n as usize).await;
    }
    gate.add_permits(100);
    assert_eq!(first.await.unwrap().unwrap(), 100);
    for (n, task) in (1..=10).zip(later) {
        assert_eq!(
            task.await.unwrap().unwrap(),
            n,
            "each write gets its own answer"
        );
    }
    let seen = seen.lock().unwrap().clone();
    let sizes: Vec<usize> = seen.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        [1, 4, 4, 2],
        "at most four a batch, in arrival order: {seen:?}"
    );
    assert_eq!(seen[1], ["k1", "k2", "k3", "k4"]);
    assert_eq!(batcher.shared.lock().busy, 0, "idle once nothing waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_never_twice_in_a_batch_and_its_writes_keep_their_order() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = gated(8, gate.clone());
    let first = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("lead", 1)).await }
    });
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
    let mut tasks = Vec::new();
    for (key, n) in [("a", 2), ("b", 3), ("a", 4), ("c", 5), ("a", 6)] {
        let writer = batcher.clone();
        tasks.push(tokio::spawn(
            async move { writer.write(write(key, n)).await },
        ));
        waiting(&batcher, tasks.len()).await;
    }
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![vec!["lead"], vec!["a", "b", "c"], vec!["a"], vec!["a"],]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_fails_its_own_writes_alone() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, _) = gated(3, gate.clone());
    let first = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("lead", 1)).await }
    });
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
    // The next batch carries the failing write (numbered 0); the one after it does not.
    let mut tasks = Vec::new();
    for (key, n) in [("x", 0), ("y", 7), ("z", 8), ("w", 9)] {
        let writer = batcher.clone();
        tasks.push(tokio::spawn(
            async move { writer.write(write(key, n)).await },
        ));
        waiting(&batcher, tasks.len()).await;
    }
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    let answers: Vec<_> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for failed in &answers[..3] {
        let error = failed.as_ref().unwrap_err();
        let source = std::error::Error::source(error).expect("the batch's error");
        assert_eq!(source.to_string(), "the batch failed");
    }
    assert_eq!(*answers[3].as_ref().unwrap(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_waiting_behind_a_delivery_that_went_away_are_still_sent() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = gated(8, gate.clone());
    let lead = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("lead", 1)).await }
    });
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
    let behind = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("behind", 2)).await }
    });
    waiting(&batcher, 1).await;
    lead.abort();
    assert!(lead.await.unwrap_err().is_cancelled());
    gate.add_permits(100);
    assert_eq!(behind.await.unwrap().unwrap(), 2);
    assert_eq!(
        seen.lock().unwrap().last().unwrap(),
        &vec!["behind".to_owned()]
    );
}

/// Waits until the lead write is in flight.
async fn led(batcher: &Batcher<Write, u32>) {
    while batcher.shared.lock().busy == 0 {
        tokio::task::yield_now().await;
    }
}

/// Sends `writes` behind the lead, each waiting before the next is sent, and answers their
/// tasks.
async fn behind(
    batcher: &Batcher<Write, u32>,
    writes: &[(&'static str, u32)],
) -> Vec<tokio::task::JoinHandle<Result<u32, StoreError>>> {
    let mut tasks = Vec::new();
    for &(key, n) in writes {
        let writer = batcher.clone();
        tasks.push(tokio::spawn(
            async move { writer.write(write(key, n)).await },
        ));
        waiting(batcher, tasks.len()).await;
    }
    tasks
}

fn lead(batcher: &Batcher<Write, u32>) -> tokio::task::JoinHandle<Result<u32, StoreError>> {
    let batcher = batcher.clone();
    tokio::spawn(async move { batcher.write(write("lead", 1)).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_carries_at_most_its_bytes_beyond_its_first_write() {
    let gate = Arc::new(Semaphore::new(0));
    let shape = Shape {
        bytes: 100,
        ..Shape::new(8, 1)
    };
    let (batcher, seen) = shaped(shape, gate.clone());
    let first = lead(&batcher);
    led(&batcher).await;
    // 60 + 60 is over 100: the second starts the next batch; 150 alone is over too, but a
    // batch always carries its first write.
    let tasks = behind(
        &batcher,
        &[("a", 60), ("b", 30), ("c", 60), ("d", 150), ("e", 5)],
    )
    .await;
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            vec!["lead"],
            vec!["a", "b"],
            vec!["c"],
            vec!["d"],
            vec!["e"]
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_that_allows_it_carries_one_key_twice() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = shaped(Shape::new(8, 1).same_key(), gate.clone());
    let first = lead(&batcher);
    led(&batcher).await;
    let tasks = behind(&batcher, &[("a", 2), ("a", 3), ("b", 4)]).await;
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    for (task, n) in tasks.into_iter().zip([2, 3, 4]) {
        assert_eq!(task.await.unwrap().unwrap(), n);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![vec!["lead"], vec!["a", "a", "b"]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_free_lane_sends_a_write_at_once() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = shaped(Shape::new(8, 2), gate.clone());
    let first = lead(&batcher);
    led(&batcher).await;
    // The second lane is free: this write goes at once, alone, without waiting.
    let second = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.write(write("second", 2)).await }
    });
    while batcher.shared.lock().busy < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(batcher.shared.lock().waiting.len(), 0);
    // Both lanes busy: the next ones wait, and go together.
    let tasks = behind(&batcher, &[("c", 3), ("d", 4)]).await;
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.contains(&vec!["c".to_owned(), "d".to_owned()]),
        "{seen:?}"
    );
    assert_eq!(batcher.shared.lock().busy, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_nobody_waits_for_is_not_sent() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, seen) = gated(8, gate.clone());
    let first = lead(&batcher);
    led(&batcher).await;
    let mut tasks = behind(&batcher, &[("gone", 2), ("kept", 3)]).await;
    let gone = tasks.remove(0);
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    while batcher.shared.lock().busy > 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*seen.lock().unwrap(), vec![vec!["lead"], vec!["kept"]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_waiting_limit_a_write_fails_at_once_unsent() {
    let gate = Arc::new(Semaphore::new(0));
    let shape = Shape {
        waiting: 2,
        ..Shape::new(8, 1)
    };
    let (batcher, _) = shaped(shape, gate.clone());
    let first = lead(&batcher);
    led(&batcher).await;
    let tasks = behind(&batcher, &[("a", 2), ("b", 3)]).await;
    let refused = batcher.write(write("c", 4)).await.unwrap_err();
    let source = std::error::Error::source(&refused).expect("why");
    assert!(source.is::<NotSent>(), "{source}");
    gate.add_permits(100);
    first.await.unwrap().unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

/// A runtime that stops while a write waits behind the lead: the hand-off's flush is spawned
/// on the stopping runtime, which drops it unpolled. The lane must still be given back, and
/// the next write, on another runtime, sent.
#[test]
fn a_runtime_that_stops_leaves_no_lane_taken() {
    let gate = Arc::new(Semaphore::new(0));
    let (batcher, _) = gated(8, gate.clone());
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    first.block_on(async {
        let _lead = lead(&batcher);
        led(&batcher).await;
        let _behind = behind(&batcher, &[("behind", 2)]).await;
    });
    drop(first);
    gate.add_permits(100);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let later = tokio::time::timeout(Duration::from_secs(5), batcher.write(write("later", 3)));
        assert_eq!(later.await.expect("the batcher was left busy").unwrap(), 3);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_stalls_no_longer_holds_its_lane() {
    let gate = Arc::new(Semaphore::new(0));
    let opened = gate.clone();
    let shape = Shape::new(8, 1).stall(Duration::from_millis(50));
    // "slow" waits for the gate; a batch with a "hang…" write never answers, as a statement
    // on a connection that stopped answering.
    let batcher = batcher(shape, move |ops: Vec<Write>| {
        let gate = opened.clone();
        async move {
            if ops.iter().any(|w| w.0.value() == "slow") {
                gate.acquire().await.unwrap().forget();
            }
            if ops.iter().any(|w| w.0.value().starts_with("hang")) {
                std::future::pending::<()>().await;
            }
            ops.iter().map(|w| Ok(w.1)).collect()
        }
    });
    let answered = |n| async move {
        tokio::time::timeout(Duration::from_secs(5), n)
            .await
            .expect("answered, not held behind a stalled batch")
    };
    // A lone write that hangs: the write behind it goes once it stalled.
    let hung = {
        let batcher = batcher.clone();
        tokio::spawn(async move { batcher.write(write("hang-1", 1)).await })
    };
    led(&batcher).await;
    assert_eq!(answered(batcher.write(write("a", 2))).await.unwrap(), 2);
    // A batch that hangs: "hang-2" and "b" wait behind "slow", go together, and hang; "c",
    // queued behind them, goes once they stalled.
    let slow = {
        let batcher = batcher.clone();
        tokio::spawn(async move { batcher.write(write("slow", 3)).await })
    };
    led(&batcher).await;
    let stuck = behind(&batcher, &[("hang-2", 4), ("b", 5)]).await;
    gate.add_permits(1);
    assert_eq!(slow.await.unwrap().unwrap(), 3);
    waiting(&batcher, 0).await;
    assert_eq!(answered(batcher.write(write("c", 6))).await.unwrap(), 6);
    assert!(!hung.is_finished() && stuck.iter().all(|t| !t.is_finished()));
}
