//! Group commit: the writes of concurrent deliveries go to the database together.
//!
//! A [`Batcher`] has a few writes of its kind in flight at most, its [lanes](Shape::lanes).
//! A write that finds a lane free is sent at once, alone, on the path it would take without
//! batching (the backend's lone statement, which it writes beside its claims or its inbox):
//! there is no timer, and a lone delivery never waits for company. Writes that
//! arrive while every lane is busy wait, and go together in the next statement (or
//! transaction) a lane sends, each answered with its own result. Under load each delivery so
//! shares one statement, one transaction and one flush of the disk with the others that
//! arrived meanwhile.
//!
//! A batch is bounded: at most [`Shape::most`] writes, and at most [`Shape::bytes`] of the
//! data they carry (receipts, stored requests) beyond its first write, so that no statement
//! outgrows what the server takes in one packet. A batcher told that one statement must not
//! meet a key twice (an `UPDATE … FROM` of several rows of one key changes it once) never puts
//! two writes on one key in one batch: the second waits for the next, keeping its place.
//!
//! A batch that fails fails its own writes alone, each with the error: the next batch is sent
//! as if nothing happened. A batch the database does not answer within [`Shape::stall`] (a
//! connection that stopped answering) no longer holds its lane: the writes that wait go on in
//! the next batch, and the stalled one answers its own writes whenever it ends. A write whose caller stopped waiting before its batch left is not
//! sent. Waiting writes are bounded too: past [`Shape::waiting`] of them, a write fails at
//! once, [never sent](NotSent), and is answered 503 as when the pool has no connection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;

use super::StoreError;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::{Lease, LeaseToken, Receipt};
use crate::key::IdempotencyKey;

/// The target of the `trace` event each batch sends, with its number of `writes`: a lone
/// write is a batch of one.
pub(crate) const BATCH_TARGET: &str = "tower_idempotency::store::batch";

/// The most writes one batch carries unless a store is told otherwise.
pub(crate) const DEFAULT_MOST: usize = 128;

/// How long a batch in flight holds its lane unless a store is told otherwise: the layers'
/// default store timeout.
pub(crate) const DEFAULT_STALL: Duration = Duration::from_secs(5);

/// The most a `max_batch` can be: a batch statement binds a few parameters a write, and the
/// servers take at most 65,535 in one statement.
pub(crate) const LARGEST_MOST: usize = 4096;

/// A write that names the key whose row it changes.
pub(crate) trait Keyed {
    /// The key of the row this write changes.
    fn key(&self) -> &IdempotencyKey;

    /// The bytes of data it carries beyond its key: a receipt, a stored request.
    fn bytes(&self) -> usize {
        0
    }
}

/// How a batcher groups its writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// The most writes in one batch (at least one).
    pub(crate) most: usize,
    /// The most bytes of data one batch carries beyond its first write's.
    pub(crate) bytes: usize,
    /// The most batches in flight at once (at least one).
    pub(crate) lanes: usize,
    /// Whether one batch may carry two writes on one key.
    pub(crate) same_key: bool,
    /// The most writes that wait for a lane; more fail at once.
    pub(crate) waiting: usize,
    /// How long a batch in flight holds its lane: past it, the lane sends what waits, and the
    /// stalled batch answers its writes whenever the database does.
    pub(crate) stall: Duration,
}

impl Shape {
    /// Batches of at most `most` writes (and 1 MiB of data), on `lanes` lanes, never two
    /// writes on one key in a batch; up to 16 batches' worth waiting. Batches of one write
    /// have as many lanes as there are writes: each goes at once, alone, as without a batcher.
    pub(crate) fn new(most: usize, lanes: usize) -> Self {
        let most = most.clamp(1, LARGEST_MOST);
        Self {
            most,
            bytes: 1 << 20,
            lanes: if most == 1 { usize::MAX } else { lanes.max(1) },
            same_key: false,
            waiting: most * 16,
            stall: DEFAULT_STALL,
        }
    }

    /// A batch in flight holds its lane for `stall` at most.
    pub(crate) fn stall(self, stall: Duration) -> Self {
        Self { stall, ..self }
    }

    /// One batch may carry several writes on one key: the statement answers each.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn same_key(self) -> Self {
        Self {
            same_key: true,
            ..self
        }
    }
}

/// What a batch of writes answers: one result per write, in their order.
pub(crate) type Answers<Out> = Vec<Result<Out, StoreError>>;

type Run<Op, Out> =
    Arc<dyn Fn(Vec<Op>) -> Pin<Box<dyn Future<Output = Answers<Out>> + Send>> + Send + Sync>;

type One<Op, Out> =
    Arc<dyn Fn(Op) -> Pin<Box<dyn Future<Output = Result<Out, StoreError>> + Send>> + Send + Sync>;

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
    shape: Shape,
    /// Writes one write alone: the path without batching.
    one: One<Op, Out>,
    /// Writes a batch of two writes or more.
    many: Run<Op, Out>,
}

struct Queue<Op, Out> {
    waiting: VecDeque<(Op, Reply<Out>)>,
    /// The lanes with a batch in flight.
    busy: usize,
}

impl<Op, Out> Batcher<Op, Out>
where
    Op: Keyed + Send + 'static,
    Out: Send + 'static,
{
    /// A batcher shaped by `shape`: a write alone is written by `one`, a batch by `many`,
    /// which is given the writes of one batch (two or more, never two on one key unless the
    /// shape allows it) and answers one result each.
    pub(crate) fn new<F1, Fut1, F, Fut>(shape: Shape, one: F1, many: F) -> Self
    where
        F1: Fn(Op) -> Fut1 + Send + Sync + 'static,
        Fut1: Future<Output = Result<Out, StoreError>> + Send + 'static,
        F: Fn(Vec<Op>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answers<Out>> + Send + 'static,
    {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    waiting: VecDeque::new(),
                    busy: 0,
                }),
                shape,
                one: Arc::new(move |op| Box::pin(one(op))),
                many: Arc::new(move |ops| Box::pin(many(ops))),
            }),
        }
    }

    /// The most writes a batch carries.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn most(&self) -> usize {
        self.shared.shape.most
    }

    /// Writes `op`: at once and alone when a lane is free, else in a later batch.
    pub(crate) async fn write(&self, op: Op) -> Result<Out, StoreError> {
        let answer = match self.shared.lead_or_wait(op) {
            Turn::Lead(op) => return self.lead(op).await,
            Turn::Wait(answer) => answer,
            Turn::Full => {
                return Err(StoreError::backend(NotSent(
                    "too many writes are waiting for the database",
                )));
            }
        };
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::backend(
                "the batch that carried this write stopped before it answered",
            ))
        })
    }
}

impl<Op, Out> Batcher<Op, Out>
where
    Op: Keyed + Send + 'static,
    Out: Send + 'static,
{
    /// Writes `op` at once and alone if a lane is free and nothing waits; else hands it back,
    /// unsent, for the caller to do something else first.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) async fn write_if_idle(&self, op: Op) -> Result<Result<Out, StoreError>, Op> {
        if !self.shared.lead_if_idle() {
            return Err(op);
        }
        Ok(self.lead(op).await)
    }

    /// Sends `op` alone on the lane it took.
    async fn lead(&self, op: Op) -> Result<Out, StoreError> {
        // Whatever arrives meanwhile is sent once this write is answered, if this delivery
        // goes away first, or once the write stalls.
        let mut next = Some(HandOff(self.shared.clone()));
        tracing::trace!(target: BATCH_TARGET, writes = 1, "a batch of writes");
        let mut run = (self.shared.one)(op);
        match within(&mut run, self.shared.shape.stall).await {
            Some(answer) => answer,
            None => {
                stalled(1);
                drop(next.take());
                run.await
            }
        }
    }
}

/// A write's turn: alone now, in a later batch, or none.
enum Turn<Op, Out> {
    Lead(Op),
    Wait(oneshot::Receiver<Result<Out, StoreError>>),
    Full,
}

impl<Op, Out> Shared<Op, Out> {
    fn lock(&self) -> MutexGuard<'_, Queue<Op, Out>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a lane and hands `op` back when one is free and nothing waits; else queues it.
    fn lead_or_wait(&self, op: Op) -> Turn<Op, Out> {
        let mut queue = self.lock();
        if self.take_lane(&mut queue) {
            return Turn::Lead(op);
        }
        if queue.waiting.len() >= self.shape.waiting {
            return Turn::Full;
        }
        let (reply, answer) = oneshot::channel();
        queue.waiting.push_back((op, reply));
        Turn::Wait(answer)
    }

    /// Takes a lane when one is free and nothing waits.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    fn lead_if_idle(&self) -> bool {
        self.take_lane(&mut self.lock())
    }

    /// Takes a lane of `queue` if one is free and nothing waits for one.
    fn take_lane(&self, queue: &mut Queue<Op, Out>) -> bool {
        let free = queue.busy < self.shape.lanes && queue.waiting.is_empty();
        if free {
            queue.busy += 1;
        }
        free
    }

    /// Gives a lane back, failing what waits if no lane is left to send it.
    fn idle(&self, why: &'static str) {
        let mut queue = self.lock();
        queue.busy = queue.busy.saturating_sub(1);
        if queue.busy == 0 {
            for (_, reply) in queue.waiting.drain(..) {
                let _ = reply.send(Err(StoreError::backend(NotSent(why))));
            }
        }
    }
}

impl<Op: Keyed, Out> Shared<Op, Out> {
    /// The next batch, in arrival order: up to `most` writes and the shape's bytes, on keys
    /// not already in it unless the shape allows. A write passed over keeps its place for the
    /// batch after; a write nobody waits for any more is dropped, unsent. Gives the lane back
    /// when nothing waits.
    fn next_batch(&self) -> Option<Vec<(Op, Reply<Out>)>> {
        let mut queue = self.lock();
        let shape = self.shape;
        let mut batch: Vec<(Op, Reply<Out>)> = Vec::new();
        let mut passed = VecDeque::new();
        let mut bytes = 0;
        while batch.len() < shape.most {
            let Some((op, reply)) = queue.waiting.pop_front() else {
                break;
            };
            if reply.is_closed() {
                continue;
            }
            let heavy = !batch.is_empty() && bytes + op.bytes() > shape.bytes;
            let twice = !shape.same_key && batch.iter().any(|(in_it, _)| in_it.key() == op.key());
            if heavy {
                queue.waiting.push_front((op, reply));
                break;
            }
            if twice {
                passed.push_back((op, reply));
                continue;
            }
            bytes += op.bytes();
            batch.push((op, reply));
        }
        while let Some(op) = passed.pop_back() {
            queue.waiting.push_front(op);
        }
        if batch.is_empty() {
            queue.busy = queue.busy.saturating_sub(1);
            return None;
        }
        Some(batch)
    }
}

/// Sends the writes that waited while a lead write was in flight, once it is answered.
struct HandOff<Op: Keyed + Send + 'static, Out: Send + 'static>(Arc<Shared<Op, Out>>);

impl<Op: Keyed + Send + 'static, Out: Send + 'static> Drop for HandOff<Op, Out> {
    fn drop(&mut self) {
        let shared = self.0.clone();
        {
            let mut queue = shared.lock();
            if queue.waiting.is_empty() {
                queue.busy = queue.busy.saturating_sub(1);
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Made before the spawn: a task its stopping runtime drops before it first
                // runs still gives the lane back.
                let lane = Lane(Some(shared.clone()));
                runtime.spawn(flush(shared, lane));
            }
            Err(_) => shared.idle("the runtime stopped before this write was sent"),
        }
    }
}

/// Sends batch after batch on one lane until nothing waits.
async fn flush<Op: Keyed + Send + 'static, Out: Send + 'static>(
    shared: Arc<Shared<Op, Out>>,
    mut lane: Lane<Op, Out>,
) {
    while let Some(batch) = shared.next_batch() {
        tracing::trace!(target: BATCH_TARGET, writes = batch.len(), "a batch of writes");
        let n = batch.len();
        let (mut ops, replies): (Vec<Op>, Vec<Reply<Out>>) = batch.into_iter().unzip();
        let answers: Pin<Box<dyn Future<Output = Answers<Out>> + Send>> = if n == 1 {
            let one = (shared.one)(ops.pop().expect("one write"));
            Box::pin(async move { vec![one.await] })
        } else {
            (shared.many)(ops)
        };
        let mut sending = Box::pin(async move {
            let mut answers = answers.await.into_iter();
            for reply in replies {
                let _ = reply.send(answers.next().unwrap_or_else(|| Err(short())));
            }
        });
        if within(&mut sending, shared.shape.stall).await.is_none() {
            // The lane goes on; the stalled batch answers its writes when it ends.
            stalled(n);
            tokio::spawn(sending);
        }
    }
    // `next_batch` gave the lane back.
    lane.0 = None;
}

/// `future`'s output if it is ready within `stall`; a future ready at once costs no timer.
async fn within<F: Future + Unpin>(future: &mut F, stall: Duration) -> Option<F::Output> {
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await;
    match first {
        Poll::Ready(output) => Some(output),
        Poll::Pending => tokio::time::timeout(stall, future).await.ok(),
    }
}

fn stalled(writes: usize) {
    tracing::warn!(
        target: BATCH_TARGET,
        writes,
        "a batch of writes has not been answered within its bound; the writes waiting behind \
         it go on without it, and it answers its own when the database does",
    );
}

/// A lane held by a flushing task: given back if the task is dropped before it ends (its
/// runtime stopping), failing the writes that then have no lane left to carry them.
struct Lane<Op, Out>(Option<Arc<Shared<Op, Out>>>);

impl<Op, Out> Drop for Lane<Op, Out> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.idle("the task sending this write's batch stopped before it was sent");
        }
    }
}

/// Each of `n` writes fails with `error`, the one error of their batch.
#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
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
#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
pub(crate) struct BatchFailed(Arc<dyn std::error::Error + Send + Sync>);

#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
impl BatchFailed {
    /// The batch's own error.
    pub(crate) fn cause(&self) -> &(dyn std::error::Error + 'static) {
        &*self.0
    }
}

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

/// A write that was never sent to the database: nothing of it can have been written.
#[derive(Debug, thiserror::Error)]
#[error("{0}; the write was not sent")]
pub(crate) struct NotSent(pub(crate) &'static str);

fn short() -> StoreError {
    StoreError::backend("the store answered fewer writes than the batch carried")
}

#[cfg(test)]
mod tests;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod writes;

#[cfg(feature = "postgres")]
pub(crate) use writes::EnqueueWrite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use writes::{key_order, or_alone};

// The writes of a claim and of a commit on PostgreSQL and MySQL, and the batcher that sends
// them alone or together.

/// A claim's first statement, for one key: `token` is written if it inserts the row.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct ClaimWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) token: LeaseToken,
    /// Whether the key is likely new (the store's last claim found its key so): sent alone,
    /// the write then inserts without reading first, and reads only if the key has a row.
    /// PostgreSQL and MariaDB.
    pub(crate) likely_new: bool,
}

/// A commit (with its receipt, encoded), for one lease. It is answered with the rows it
/// matched, not those it changed (MySQL: sqlx sets `CLIENT_FOUND_ROWS`), so that a repeated
/// commit holds; the row keeps what the first commit wrote.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct CommitWrite {
    pub(crate) key: IdempotencyKey,
    pub(crate) token: LeaseToken,
    pub(crate) receipt: Option<Vec<u8>>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl CommitWrite {
    /// The commit of `lease`, keeping `receipt`.
    pub(crate) fn of(lease: &Lease, receipt: Option<&Receipt>) -> Self {
        Self {
            key: lease.key().clone(),
            token: lease.token(),
            receipt: receipt.map(Receipt::encode),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Keyed for ClaimWrite {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Keyed for CommitWrite {
    fn key(&self) -> &IdempotencyKey {
        &self.key
    }
    fn bytes(&self) -> usize {
        self.receipt.as_ref().map_or(0, Vec::len)
    }
}

/// A [`Batcher`] of `$shape` whose lone write is `$lone.$one(&write)` and
/// whose batch is `$on.$many(writes)`, both `Arc`s the batcher keeps clones of.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! batcher {
    ($shape:expr, $lone:ident . $one:ident, $on:ident . $many:ident) => {{
        let (lone, on) = ($lone.clone(), $on.clone());
        $crate::store::batch::Batcher::new(
            $shape,
            move |write| {
                let lone = lone.clone();
                async move { lone.$one(&write).await }
            },
            move |writes| {
                let on = on.clone();
                async move { on.$many(writes).await }
            },
        )
    }};
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use batcher;
