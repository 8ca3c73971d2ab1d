//! What this process saw of recent deliveries: a small in-memory journal an operator reads.
//!
//! The store answers how many deliveries a key had and how many runs ([`describe`]). The
//! journal adds what only the process that answered knows: each key's latest outcome, when,
//! and the sender's attempt number where the sender sends one (Slack's `X-Slack-Retry-Num`,
//! Twitch's `Twitch-Eventsub-Message-Retry`, a `Webhook-Attempt` header), whatever the
//! extractor. It keeps the latest delivery of the most recent keys, up to its capacity, and
//! writes nothing to the store. It is this process's view: behind a load balancer, each
//! instance journals the deliveries it answered.
//!
//! ```
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Journal, Outcome, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let journal = Journal::new(1024);
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::slack()).journal(&journal))
//!     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
//! let event = || {
//!     Request::post("/slack")
//!         .header("x-slack-retry-num", "2")
//!         .body(String::from(r#"{"event_id":"Ev1"}"#))
//!         .unwrap()
//! };
//! svc.clone().oneshot(event()).await.unwrap();
//! svc.oneshot(event()).await.unwrap();
//!
//! // No router reports a route here: the key is stored unscoped.
//! let key = IdempotencyKey::new("slack", "Ev1").unwrap();
//! let seen = journal.last(&key).expect("seen");
//! assert_eq!(seen.outcome, Outcome::Duplicate);
//! assert_eq!(seen.attempt, Some(2));
//! # }
//! ```
//!
//! [`describe`]: crate::store::Store::describe

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use crate::key::IdempotencyKey;
use crate::response::Outcome;

/// The headers in which senders number their attempts: Slack's `X-Slack-Retry-Num` (0 on
/// the first retry), Twitch's `Twitch-Eventsub-Message-Retry`, and `Webhook-Attempt`.
const ATTEMPT_HEADERS: [&str; 3] = [
    "x-slack-retry-num",
    "twitch-eventsub-message-retry",
    "webhook-attempt",
];

/// The sender's attempt number, if the request carries one of the known headers.
pub(crate) fn attempt_of(parts: &http::request::Parts) -> Option<u32> {
    ATTEMPT_HEADERS.iter().find_map(|name| {
        let value = parts.headers.get(*name)?;
        value.to_str().ok()?.trim().parse().ok()
    })
}

/// The journal's default capacity: keys remembered.
pub const DEFAULT_JOURNAL_CAPACITY: usize = 4096;

/// The latest delivery of a key that this process answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Seen {
    /// The key, as stored (scoped).
    pub key: IdempotencyKey,
    /// What the layer decided.
    pub outcome: Outcome,
    /// When it answered.
    pub at: SystemTime,
    /// The sender's attempt number, where its extractor knows the header that carries it.
    pub attempt: Option<u32>,
}

/// A bounded, shared record of the latest delivery of each recent key. Cloning it shares it.
/// See the [module docs](self).
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Mutex<Entries>>,
}

struct Entries {
    capacity: usize,
    /// Each key's latest delivery, with the number of its record.
    by_key: HashMap<IdempotencyKey, (u64, Seen)>,
    /// Records in order, oldest first: a key's older records are skipped when they come up.
    order: VecDeque<(u64, IdempotencyKey)>,
    next: u64,
}

impl Journal {
    /// A journal that remembers up to `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Entries {
                capacity: capacity.max(1),
                by_key: HashMap::new(),
                order: VecDeque::new(),
                next: 0,
            })),
        }
    }

    /// Records a delivery.
    pub(crate) fn record(&self, key: &IdempotencyKey, outcome: Outcome, attempt: Option<u32>) {
        let mut entries = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = Seen {
            key: key.clone(),
            outcome,
            at: SystemTime::now(),
            attempt,
        };
        let number = entries.next;
        entries.next += 1;
        entries.by_key.insert(key.clone(), (number, seen));
        entries.order.push_back((number, key.clone()));
        // Forget the oldest keys past the capacity, and records a newer one of their key
        // replaced: both stay bounded, at a constant cost per delivery.
        while entries.by_key.len() > entries.capacity
            || entries.order.len() > entries.capacity.saturating_mul(2)
        {
            let Some((number, oldest)) = entries.order.pop_front() else {
                break;
            };
            if entries
                .by_key
                .get(&oldest)
                .is_some_and(|(n, _)| *n == number)
            {
                entries.by_key.remove(&oldest);
            }
        }
    }

    /// The latest delivery of `key` this process answered, if it still remembers it.
    pub fn last(&self, key: &IdempotencyKey) -> Option<Seen> {
        let entries = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        entries.by_key.get(key).map(|(_, seen)| seen.clone())
    }

    /// Every key remembered, the most recent first.
    pub fn recent(&self) -> Vec<Seen> {
        let entries = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen: Vec<Seen> = entries.by_key.values().map(|(_, s)| s.clone()).collect();
        seen.sort_by_key(|seen| std::cmp::Reverse(seen.at));
        seen
    }
}

impl Default for Journal {
    fn default() -> Self {
        Self::new(DEFAULT_JOURNAL_CAPACITY)
    }
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Journal")
            .field("capacity", &entries.capacity)
            .field("keys", &entries.by_key.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> IdempotencyKey {
        IdempotencyKey::new("ns", format!("k{n}")).unwrap()
    }

    #[test]
    fn keeps_the_latest_of_the_most_recent_keys() {
        let journal = Journal::new(3);
        for n in 0..5 {
            journal.record(&key(n), Outcome::Processed, None);
        }
        journal.record(&key(2), Outcome::Duplicate, Some(1));
        assert!(journal.last(&key(0)).is_none() && journal.last(&key(1)).is_none());
        assert_eq!(journal.last(&key(2)).unwrap().outcome, Outcome::Duplicate);
        assert_eq!(journal.last(&key(4)).unwrap().outcome, Outcome::Processed);
        // One key delivered over and over keeps the journal bounded.
        for _ in 0..100 {
            journal.record(&key(9), Outcome::Duplicate, None);
        }
        let entries = journal.inner.lock().unwrap();
        assert!(entries.by_key.len() <= 3 && entries.order.len() <= 6);
    }
}
