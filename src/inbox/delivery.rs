//! What a worker's request tells its handler: which event, which attempt, since when.

use std::time::SystemTime;

use crate::key::IdempotencyKey;

/// In the extensions of every request a worker sends: which entry it is, which attempt, and
/// when the event was received. The handler may read it (and the
/// [`LeaseHandle`](crate::LeaseHandle), there too).
///
/// A handler that checks the sender's timestamp itself (the Stripe, Slack and Svix SDKs do,
/// with a tolerance of five minutes) fails every attempt made later than that after the
/// delivery arrived: a retry after a backoff, an entry an operator runs again. Behind the
/// inbox, let the layer verify (`.verify(..)` checks the signature and its age once, when the
/// delivery arrives), and have the handler parse the event without checking it again; or, if
/// it must check, take [`received_at`](Self::received_at) as the time to check against.
///
/// ```
/// use tower_idempotency::inbox::InboxDelivery;
///
/// // In a handler: a retry is told from the first attempt.
/// fn is_retry(delivery: Option<&InboxDelivery>) -> bool {
///     delivery.is_some_and(|d| d.attempt() > 1)
/// }
/// assert!(!is_retry(None));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxDelivery {
    key: IdempotencyKey,
    attempt: u32,
    crashes: u32,
    received_at: SystemTime,
}

impl InboxDelivery {
    pub(super) fn new(
        key: IdempotencyKey,
        attempt: u32,
        crashes: u32,
        received_at: SystemTime,
    ) -> Self {
        Self {
            key,
            attempt,
            crashes,
            received_at,
        }
    }

    /// The event's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// This attempt's number: 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many earlier attempts ended with their worker gone.
    pub fn crashes(&self) -> u32 {
        self.crashes
    }

    /// When the inbox stored the event's first delivery, by the store's clock: the time the
    /// sender's signature was checked against.
    pub fn received_at(&self) -> SystemTime {
        self.received_at
    }
}
