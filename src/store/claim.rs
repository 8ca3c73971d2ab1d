//! What a claim answers: [`Claim`], and the [`Lease`] with its fencing [`LeaseToken`] that a
//! successful one holds.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::Receipt;
use crate::key::IdempotencyKey;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// This delivery owns the key now: run the handler, then commit or release.
    Acquired(Lease),
    /// The event was processed already.
    Done(Completed),
    /// Another delivery holds a claim that is not stale yet.
    InFlight(Pending),
    /// A stale claim that the hold policy leaves for a person.
    Held(Pending),
}

/// A successful claim: the key and the fencing token unique to this claim.
///
/// Two leases are equal when they are the same claim (key, token, takeover); the delivery
/// count is what the store knew when it granted the claim, and takes no part.
#[derive(Debug, Clone)]
pub struct Lease {
    key: IdempotencyKey,
    token: LeaseToken,
    reclaimed: bool,
    deliveries: u64,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        (&self.key, self.token, self.reclaimed) == (&other.key, other.token, other.reclaimed)
    }
}

impl Eq for Lease {}

impl Lease {
    /// A lease on `key` with `token`. Stores call this when a claim succeeds; `reclaimed` says
    /// whether it took over a stale `processing` claim of another delivery.
    pub fn new(key: IdempotencyKey, token: LeaseToken, reclaimed: bool) -> Self {
        Self {
            key,
            token,
            reclaimed,
            deliveries: 0,
        }
    }

    /// The lease of a claim made by the key's `deliveries`-th delivery, as the store counted
    /// them (this one included). Stores that count deliveries say so with each claim they
    /// grant; the handler reads it from the [`LeaseHandle`](crate::LeaseHandle) in its
    /// request's extensions, to tell a sender's retry from a first delivery.
    pub fn with_deliveries(mut self, deliveries: u64) -> Self {
        self.deliveries = deliveries;
        self
    }

    /// Which delivery of the key made this claim, 1 for the first, as the store counted them:
    /// `None` when the store does not say. A count of duplicates answered a moment ago may
    /// still be on its way to the store (duplicates' counts are written off the answer path),
    /// so the number may fall short by those, never exceed the truth.
    pub fn deliveries(&self) -> Option<u64> {
        (self.deliveries > 0).then_some(self.deliveries)
    }

    /// The claimed key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// This claim's fencing token.
    pub fn token(&self) -> LeaseToken {
        self.token
    }

    /// Whether this claim took over a stale claim of another delivery.
    pub fn reclaimed(&self) -> bool {
        self.reclaimed
    }
}

/// A fencing token: 64 random-looking bits, fresh for every claim.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(u64);

impl LeaseToken {
    /// A new token, distinct from every other token this process made and, with overwhelming
    /// probability, from those of other processes.
    pub fn generate() -> Self {
        // SipHash keyed with per-process random keys, applied to a counter: distinct inputs,
        // unpredictable outputs, no extra dependency.
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self(KEYS.get_or_init(RandomState::new).hash_one(n))
    }

    /// A duration from half of `full` to the whole of it, at random: waits that would start
    /// together (retries of writes that failed together) start apart.
    pub(crate) fn spread(full: Duration) -> Duration {
        let half = full / 2;
        let unit = (Self::generate().0 >> 11) as f64 / (1u64 << 53) as f64;
        half + half.mul_f64(unit)
    }

    /// The token as stored in a signed 64-bit column.
    pub fn to_i64(self) -> i64 {
        self.0 as i64
    }

    /// The token read back from a signed 64-bit column.
    pub fn from_i64(raw: i64) -> Self {
        Self(raw as u64)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({self})")
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A key that was processed already.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completed {
    /// Deliveries of this event seen so far, this one included.
    pub deliveries: u64,
    /// What the committing delivery left for its duplicates, if it was committed with
    /// [`Store::commit_with`](crate::store::Store::commit_with).
    pub receipt: Option<Arc<Receipt>>,
}

impl Completed {
    /// Describes a done row.
    pub fn new(deliveries: u64) -> Self {
        Self {
            deliveries,
            receipt: None,
        }
    }

    /// The same, with the receipt the row keeps.
    pub fn with_receipt(mut self, receipt: Option<Arc<Receipt>>) -> Self {
        self.receipt = receipt;
        self
    }
}

/// A claim held by another delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// How long ago the claim was taken.
    pub age: Duration,
    /// How long ago its owner last renewed it (or took it, if it never renewed): the claim is
    /// stale once this reaches the stale limit.
    pub since_renewal: Duration,
    /// Deliveries of this event seen so far, this one included.
    pub deliveries: u64,
}

impl Pending {
    /// Describes a `processing` row.
    pub fn new(age: Duration, since_renewal: Duration, deliveries: u64) -> Self {
        Self {
            age,
            since_renewal,
            deliveries,
        }
    }
}
