//! Group commit: the writes of concurrent deliveries go to the database together.
//!
//! A [`Batcher`] has at most one write of its kind in flight. A write that finds none is sent
//! at once, alone, on the path it would take without batching: there is no timer, and a lone
//! delivery never waits for company. Writes that arrive while one is in flight wait, and go
//! together in the next statement (or transaction), at most [`Batcher::most`] of them, each
//! answered with its own result. Under load each delivery so shares one statement, one
//! transaction and one flush of the disk with the others that arrived meanwhile.
//!
//! Two writes on one key never share a batch: the second waits for the next one, so that a
//! statement never meets the same row twice (PostgreSQL refuses that in one `ON CONFLICT`
//! statement) and the two keep their order.
//!
//! A batch that fails fails its own writes alone, each with the error: the next batch is sent
//! as if nothing happened.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::StoreError;
use crate::key::IdempotencyKey;

/// The target of the `trace` event each batch sends, with its number of `writes`: a lone
/// write is a batch of one.
pub(crate) const BATCH_TARGET: &str = "tower_idempotency::store::batch";

/// The most writes one batch carries unless a store is told otherwise.
pub(crate) const DEFAULT_MOST: usize = 128;

/// A write that names the key whose row it changes.
pub(crate) trait Keyed {
    /// The key of the row this write changes.
    fn key(&self) -> &IdempotencyKey;
}

/// What a batch of writes answers: one result per write, in their order.
pub(crate) type Answers<Out> = Vec<Result<Out, StoreError>>;

type Run<Op, Out> =
    Arc<dyn Fn(Vec<Op>) -> Pin<Box<dyn Future<Output = Answers<Out>> + Send>> + Send + Sync>;

type Reply<Out> = oneshot::Sender<Result<Out, StoreError>>;

/// Sends writes of one kind to the database in batches (see the [module docs](self)).
/// Clones share the queue.
pub(crate) struct Batcher<Op, Out> {
    shared: Arc<Shared<Op, Out>>,
}

impl<Op, Out> Clone for Batcher<Op, Out> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<Op, Out> {
    queue: Mutex<Queue<Op, Out>>,
    most: usize,
    /// Writes a batch: given one write, the path without batching.
    run: Run<Op, Out>,
}

struct Queue<Op, Out> {
    waiting: VecDeque<(Op, Reply<Out>)>,
    /// Whether a batch is in flight.
    busy: bool,
}

impl<Op, Out> Batcher<Op, Out>
where
    Op: Keyed + Send + 'static,
    Out: Send + 'static,
{
    /// A batcher of at most `most` writes a batch (at least one), written by `run`: it is
    /// given the writes of one batch, never two on one key, and answers one result each.
    pub(crate) fn new<F, Fut>(most: usize, run: F) -> Self
    where
        F: Fn(Vec<Op>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answers<Out>> + Send + 'static,
    {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    waiting: VecDeque::new(),
                    busy: false,
                }),
                most: most.max(1),
                run: Arc::new(move |ops| Box::pin(run(ops))),
            }),
        }
    }

    /// The most writes a batch carries.
    pub(crate) fn most(&self) -> usize {
        self.shared.most
    }

    /// Writes `op`: at once and alone when no batch is in flight, else in the next batch.
    pub(crate) async fn write(&self, op: Op) -> Result<Out, StoreError> {
        let answer = match self.shared.lead_or_wait(op) {
            Turn::Lead(op) => {
                // Whatever arrives meanwhile is sent once this write is answered, or if this
                // delivery goes away first.
                let _next = HandOff(self.shared.clone());
                tracing::trace!(target: BATCH_TARGET, writes = 1, "a batch of writes");
                let mut answers = (self.shared.run)(vec![op]).await;
                return answers.pop().unwrap_or_else(|| Err(short()));
            }
            Turn::Wait(answer) => answer,
        };
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::backend(
                "the batch that carried this write was dropped before it answered",
            ))
        })
    }
}

/// A write's turn: alone now, or in a later batch.
enum Turn<Op, Out> {
    Lead(Op),
    Wait(oneshot::Receiver<Result<Out, StoreError>>),
}

impl<Op, Out> Shared<Op, Out> {
    /// Marks the batcher busy and hands `op` back when it was idle; else queues it.
    fn lead_or_wait(&self, op: Op) -> Turn<Op, Out> {
        let mut queue = self.lock();
        if queue.busy {
            let (reply, answer) = oneshot::channel();
            queue.waiting.push_back((op, reply));
            Turn::Wait(answer)
        } else {
            queue.busy = true;
            Turn::Lead(op)
        }
    }
}

impl<Op, Out> Shared<Op, Out> {
    fn lock(&self) -> MutexGuard<'_, Queue<Op, Out>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<Op: Keyed, Out> Shared<Op, Out> {
    /// The next batch, in arrival order: up to `most` writes, none on a key already in it. A
    /// write passed over keeps its place for the batch after. Marks the batcher idle when
    /// nothing waits.
    fn next_batch(&self) -> Option<Vec<(Op, Reply<Out>)>> {
        let mut queue = self.lock();
        if queue.waiting.is_empty() {
            queue.busy = false;
            return None;
        }
        let mut batch: Vec<(Op, Reply<Out>)> =
            Vec::with_capacity(self.most.min(queue.waiting.len()));
        let mut passed = VecDeque::new();
        while batch.len() < self.most {
            let Some((op, reply)) = queue.waiting.pop_front() else {
                break;
            };
            if batch.iter().any(|(taken, _)| taken.key() == op.key()) {
                passed.push_back((op, reply));
            } else {
                batch.push((op, reply));
            }
        }
        while let Some(op) = passed.pop_back() {
            queue.waiting.push_front(op);
        }
        Some(batch)
    }
}

/// Sends the writes that waited for the batch in flight, when it is answered.
struct HandOff<Op: Keyed + Send + 'static, Out: Send + 'static>(Arc<Shared<Op, Out>>);

impl<Op: Keyed + Send + 'static, Out: Send + 'static> Drop for HandOff<Op, Out> {
    fn drop(&mut self) {
        let shared = self.0.clone();
        {
            let mut queue = shared.lock();
            if queue.waiting.is_empty() {
                queue.busy = false;
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flush(shared));
            }
            // No runtime left to write on (it is shutting down): the waiting writes fail.
            Err(_) => {
                let mut queue = shared.lock();
                queue.busy = false;
                for (_, reply) in queue.waiting.drain(..) {
                    let _ = reply.send(Err(StoreError::backend(
                        "the runtime stopped before this write was sent",
                    )));
                }
            }
        }
    }
}

/// Sends batch after batch until nothing waits.
async fn flush<Op: Keyed + Send + 'static, Out: Send + 'static>(shared: Arc<Shared<Op, Out>>) {
    // If this task is dropped mid-batch (its runtime shutting down), the writes left waiting
    // fail rather than wait for ever.
    let mut idle = Idle(Some(shared.clone()));
    while let Some(batch) = shared.next_batch() {
        tracing::trace!(target: BATCH_TARGET, writes = batch.len(), "a batch of writes");
        let (ops, replies): (Vec<Op>, Vec<Reply<Out>>) = batch.into_iter().unzip();
        let answers = (shared.run)(ops).await;
        let mut answers = answers.into_iter();
        for reply in replies {
            let _ = reply.send(answers.next().unwrap_or_else(|| Err(short())));
        }
    }
    idle.0 = None;
}

struct Idle<Op, Out>(Option<Arc<Shared<Op, Out>>>);

impl<Op, Out> Drop for Idle<Op, Out> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            let mut queue = shared.lock();
            queue.busy = false;
            for (_, reply) in queue.waiting.drain(..) {
                let _ = reply.send(Err(StoreError::backend(
                    "the task writing this batch stopped before it was sent",
                )));
            }
        }
    }
}

/// Each of `n` writes fails with `error`, the one error of their batch.
pub(crate) fn all_fail<Out>(
    error: impl std::error::Error + Send + Sync + 'static,
    n: usize,
) -> Answers<Out> {
    let error: Arc<dyn std::error::Error + Send + Sync> = Arc::new(error);
    (0..n)
        .map(|_| Err(StoreError::backend(BatchFailed(error.clone()))))
        .collect()
}

/// The error of a batch, as each of its writes reports it.
#[derive(Debug)]
struct BatchFailed(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for BatchFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

fn short() -> StoreError {
    StoreError::backend("the store answered fewer writes than the batch carried")
}

#[cfg(test)]
mod tests;
