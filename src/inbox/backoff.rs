//! When a failed entry is tried again.

use std::time::Duration;

use crate::store::LeaseToken;

/// When a failed entry is tried again: exponential, from `base`, doubling up to `cap`, with
/// jitter (each delay is drawn between half of it and all of it), for `max_attempts` attempts
/// in all, crashes included.
///
/// The default: 5 seconds, doubling up to 30 minutes, 10 attempts (about 45 minutes of
/// retries before an entry is dead).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::inbox::Backoff;
///
/// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), 5);
/// let third = backoff.delay(3); // after the third attempt failed: 2 to 4 s
/// assert!(third >= Duration::from_secs(2) && third <= Duration::from_secs(4));
/// assert!(backoff.delay(30) <= Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(5), Duration::from_secs(30 * 60), 10)
    }
}

impl Backoff {
    /// A backoff from `base` up to `cap`, for `max_attempts` attempts in all (at least 1).
    pub fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        Self {
            base,
            cap: cap.max(base),
            max_attempts: max_attempts.max(1),
        }
    }

    /// How many attempts an entry gets.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long to wait after failed attempt number `attempt` (1 for the first), jitter
    /// included.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(40);
        let full = self
            .base
            .checked_mul(1 << doublings.min(31))
            .map_or(self.cap, |d| d.min(self.cap));
        LeaseToken::spread(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(100), 9);
        for attempt in 1..=6 {
            let full = Duration::from_secs(2 << (attempt - 1)).min(Duration::from_secs(100));
            for _ in 0..50 {
                let delay = backoff.delay(attempt);
                assert!(delay >= full / 2 && delay <= full, "{attempt}: {delay:?}");
            }
        }
        assert!(backoff.delay(u32::MAX) <= Duration::from_secs(100));
        let spread: std::collections::HashSet<_> = (0..20).map(|_| backoff.delay(4)).collect();
        assert!(spread.len() > 1, "jitter spreads the delays");
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::ZERO, 0).max_attempts(),
            1
        );
    }
}
