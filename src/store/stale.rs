//! When a claim is stale, and what happens to it then: [`Stale`] and its [`StalePolicy`].

use std::time::Duration;

use super::{Claim, Pending};

/// What to do with a stale claim: a `processing` row whose owner has not renewed it for a
/// limit, because it died between claim and commit (or lost the store).
///
/// The default reclaims after 30 seconds without a heartbeat. While a handler runs, the layer
/// renews its claim every [quarter of the limit](Self::renew_interval): three renewals in a
/// row must fail before a live claim turns stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    after: Duration,
    policy: StalePolicy,
}

/// The two deliberate answers to a stale claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StalePolicy {
    /// Take the claim over and run the handler again: a possible duplicate beats a
    /// certainly missing event (receipts, notifications).
    Reclaim,
    /// Leave the claim for a person and answer 409: for work that moves money or goods.
    Hold,
}

/// The stale limit of [`Stale::default`]: 30 seconds without a heartbeat.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

impl Stale {
    /// Reclaim claims not renewed for `after`.
    pub const fn reclaim_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Reclaim,
        }
    }

    /// Hold claims not renewed for `after`, for a person to [`resolve`](crate::store::Store::resolve).
    pub const fn hold_after(after: Duration) -> Self {
        Self {
            after,
            policy: StalePolicy::Hold,
        }
    }

    /// How long a claim may go without a heartbeat before it is stale.
    pub const fn after(&self) -> Duration {
        self.after
    }

    /// What happens to a stale claim.
    pub const fn policy(&self) -> StalePolicy {
        self.policy
    }

    /// How often the layer renews a running claim: a quarter of the limit (7.5 s at the
    /// default 30 s), and never more often than every 10 ms.
    pub fn renew_interval(&self) -> Duration {
        (self.after / 4).max(Duration::from_millis(10))
    }

    /// Whether a claim last renewed this long ago is stale.
    pub fn is_stale(&self, since_renewal: Duration) -> bool {
        since_renewal >= self.after
    }

    /// What a claim on a `processing` row answers when it does not take it over.
    pub fn pending(&self, age: Duration, since_renewal: Duration, deliveries: u64) -> Claim {
        let pending = Pending::new(age, since_renewal, deliveries);
        if self.policy == StalePolicy::Hold && self.is_stale(since_renewal) {
            Claim::Held(pending)
        } else {
            Claim::InFlight(pending)
        }
    }
}

impl Default for Stale {
    fn default() -> Self {
        Self::reclaim_after(DEFAULT_STALE_AFTER)
    }
}
