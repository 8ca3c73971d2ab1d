//! The delivery engine: what every mode shares, and the one service shell.
//!
//! A delivery goes through the same steps whatever the mode, in [`mode::Guarded`]; a mode
//! ([`mode::Mode`]) says what it claims, how, and how its claim runs and settles. Every answer
//! the layer gives by itself is a [`refusal::Refusal`], made into a response in one place.
//!
//! 1. [`prepare`]: buffer the body only if the mode or verification reads it (through the
//!    size and time limits), verify, find what to claim, and answer what needs no store
//!    (400, 401, 413, 408).
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
pub(crate) mod keep;
pub(crate) mod mode;
pub(crate) mod observe;
pub(crate) mod prepare;
pub(crate) mod refusal;
pub(crate) mod run;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod wait;

pub use drain::{Drain, DrainReport, LeftBehind, Stage};
pub use mode::Guarded;

pub(crate) use crate::body::later;
pub use guard::LeaseHandle;
pub use settings::{DEFAULT_BODY_LIMIT, MissingKey};
pub use shared::SharedSettings;
