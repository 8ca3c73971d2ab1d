//! What a store tells of its keys: a key's state and [`KeyRecord`], the [`StuckClaim`]s, and how
//! a person [resolves](Resolution) one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Receipt;
use crate::key::IdempotencyKey;

/// A `processing` row listed by [`Store::stuck_claims`](crate::store::Store::stuck_claims).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StuckClaim {
    /// The claimed key.
    pub key: IdempotencyKey,
    /// How long ago it was claimed.
    pub age: Duration,
    /// How long ago its owner last renewed it.
    pub since_renewal: Duration,
    /// Deliveries of this event seen so far.
    pub deliveries: u64,
}

impl StuckClaim {
    /// Describes a stuck row.
    pub fn new(
        key: IdempotencyKey,
        age: Duration,
        since_renewal: Duration,
        deliveries: u64,
    ) -> Self {
        Self {
            key,
            age,
            since_renewal,
            deliveries,
        }
    }
}

/// The state of a key's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyState {
    /// A delivery holds the claim and its handler runs (or its owner died).
    Processing,
    /// The event was processed; further deliveries are duplicates.
    Done,
    /// The last run failed and gave the claim back; the next delivery runs the handler.
    Released,
}

impl KeyState {
    /// The state's name, as stored by the SQL stores.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Done => "done",
            Self::Released => "released",
        }
    }

    /// The state named `name`, as stored.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "processing" => Some(Self::Processing),
            "done" => Some(Self::Done),
            "released" => Some(Self::Released),
            _ => None,
        }
    }
}

impl fmt::Display for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store knows of one key: the answer of [`Store::describe`](crate::store::Store::describe).
///
/// `deliveries` against `runs` answers "was it sent twice, or did my handler run twice?". Times
/// are ages by the store's clock. Rows written before these counts existed read `runs` as 1
/// and the seen times as the claim time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The row's state.
    pub state: KeyState,
    /// Deliveries of the event that arrived (claims counted, transactional duplicates too
    /// where the backend counts them).
    pub deliveries: u64,
    /// Claims that started the handler: the first run, runs after a release, reclaims. A claim
    /// given back because its delivery vanished before the handler started counts too.
    pub runs: u64,
    /// Whether the latest run took over a stale claim.
    pub reclaimed: bool,
    /// How long ago the first delivery arrived.
    pub first_seen_ago: Duration,
    /// How long ago the latest delivery arrived.
    pub last_seen_ago: Duration,
    /// How long ago the latest run claimed the key.
    pub claimed_ago: Duration,
    /// `processing` rows: how long ago the owner last renewed the claim.
    pub renewed_ago: Option<Duration>,
    /// `done` and `released` rows: how long ago the run was settled.
    pub settled_ago: Option<Duration>,
    /// `done` rows committed with [`Store::commit_with`](crate::store::Store::commit_with): the fingerprint and stored response.
    pub receipt: Option<Arc<Receipt>>,
}

impl KeyRecord {
    /// A record in `state` with the counts; times are set with the `with_` methods (zero until
    /// then). Stores call this.
    pub fn new(state: KeyState, deliveries: u64, runs: u64) -> Self {
        Self {
            state,
            deliveries,
            runs,
            reclaimed: false,
            first_seen_ago: Duration::ZERO,
            last_seen_ago: Duration::ZERO,
            claimed_ago: Duration::ZERO,
            renewed_ago: None,
            settled_ago: None,
            receipt: None,
        }
    }

    /// Sets the receipt a `done` row keeps.
    pub fn with_receipt(mut self, receipt: Option<Arc<Receipt>>) -> Self {
        self.receipt = receipt;
        self
    }

    /// Sets whether the latest run reclaimed.
    pub fn with_reclaimed(mut self, reclaimed: bool) -> Self {
        self.reclaimed = reclaimed;
        self
    }

    /// Sets the first and latest arrival.
    pub fn with_seen(mut self, first_seen_ago: Duration, last_seen_ago: Duration) -> Self {
        self.first_seen_ago = first_seen_ago;
        self.last_seen_ago = last_seen_ago;
        self
    }

    /// Sets the claim time, the heartbeat (for `processing` rows) and the settlement (for the
    /// others), as the state says.
    pub fn with_times(
        mut self,
        claimed_ago: Duration,
        renewed_ago: Duration,
        settled_ago: Duration,
    ) -> Self {
        self.claimed_ago = claimed_ago;
        match self.state {
            KeyState::Processing => self.renewed_ago = Some(renewed_ago),
            KeyState::Done | KeyState::Released => self.settled_ago = Some(settled_ago),
        }
        self
    }
}

/// How a person settles a held claim with [`Store::resolve`](crate::store::Store::resolve).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The work was done: mark the key `done`, so further deliveries are duplicates.
    Done,
    /// The work was not done: release the claim, so the next delivery runs the handler.
    Release,
}
