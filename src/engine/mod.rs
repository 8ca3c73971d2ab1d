//! The delivery engine: what every mode shares.
//!
//! A delivery goes through the same steps whatever the mode; a mode adds only its claim step
//! and what its settlement does.
//!
//! 1. [`prepare`]: find the key (buffering the body only if the extractor reads it, through the
//!    size and time limits) and answer what needs no store (400, 413, 408).
//! 2. [`drain`]: count the delivery, or turn it away with 503 while the layer drains.
//! 3. [`acquire`]: the mode's claim, bounded by the store timeout, with a granted claim wrapped
//!    at once in a [`guard::LeaseGuard`] so that an answer nobody reads gives itself back.
//! 4. [`run`]: the inner service under the claim, moved into a task of its own if the
//!    delivery goes away ([`run::Detach`]), with the heartbeat renewing the claim meanwhile.
//! 5. [`guard`]: commit or release as the answer says, retried in the background when the
//!    store fails; a panic is abandoned as the stale policy says.
//! 6. [`wait`]: optionally, a duplicate that meets a claim in flight waits for it to settle.

pub(crate) mod acquire;
pub(crate) mod drain;
pub(crate) mod guard;
pub(crate) mod observe;
pub(crate) mod prepare;
pub(crate) mod run;
pub(crate) mod settings;
pub(crate) mod wait;

pub use drain::{Drain, DrainReport, LeftBehind, Stage};

/// `by` after `from`, or about thirty years after it when `by` reaches past what an instant
/// can hold: a configured `Duration::MAX` means "never", not a panic.
pub(crate) fn later(from: tokio::time::Instant, by: std::time::Duration) -> tokio::time::Instant {
    const NEVER: std::time::Duration = std::time::Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(by.min(NEVER))
        .or_else(|| from.checked_add(std::time::Duration::from_secs(3600)))
        .unwrap_or(from)
}
pub use guard::LeaseHandle;
pub use settings::{DEFAULT_BODY_LIMIT, MissingKey};
