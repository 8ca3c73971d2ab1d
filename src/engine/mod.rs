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
//! 3. [`run::acquire`]: the mode's claim, bounded by the store timeout, with a granted claim
//!    wrapped at once in a [`guard::LeaseGuard`] so that an answer nobody reads gives itself
//!    back.
//! 4. [`run`]: the inner service under the claim, moved into a task of its own if the
//!    delivery goes away ([`run::Detach`]), with the heartbeat renewing the claim meanwhile.
//! 5. [`guard`]: commit or release as the answer says, retried in the background when the
//!    store fails; a panic is abandoned as the stale policy says.
//! 6. [`wait`]: optionally, a duplicate that meets a claim in flight waits for it to settle.
//!
//! # The path of one delivery
//!
//! A new event, claim-then-commit with a header key on PostgreSQL, from the service's `call`
//! to its claim's row, file by file:
//!
//! | step | file |
//! |---|---|
//! | `Guarded::call`, `deliver` | `engine/mode.rs` |
//! | the delivery's span and response future | `engine/observe.rs` |
//! | the body (left unread), the signature | `engine/prepare.rs` |
//! | `ClaimMode::find` | `claim/mode.rs` |
//! | `find_key`: extract, check the length, scope | `engine/prepare.rs`, `key/header.rs`, `key/scope.rs` |
//! | `Drain::enter` | `engine/drain.rs` |
//! | `ClaimMode::claim` | `claim/mode.rs` |
//! | [`run::acquire`] | `engine/run.rs` |
//! | `Store::claim` | `store/postgres/claims.rs` |
//! | the batcher: a lone write goes at once | `store/batch.rs` |
//! | the insert-or-read, the row written | `store/postgres/batch.rs` |
//!
//! Then the row read back (`store/sql/rows.rs`, `store/sql/mod.rs`), the claim under its
//! guard (`engine/guard/mod.rs`), the run (`engine/run.rs`, the handler itself, `replay.rs`
//! when answers are kept), the settlement (`engine/guard/mod.rs`, `Owner::settle` in
//! `claim/mode.rs`, and the same three store files for the commit), and the answer's report
//! (`engine/observe.rs`, `metrics.rs`). The other modes take the same path through their own
//! `mode.rs` in place of `claim/mode.rs`.

pub(crate) mod drain;
pub(crate) mod guard;
pub(crate) mod handback;
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
pub use observe::ResponseFuture;

pub use guard::LeaseHandle;
pub use settings::{DEFAULT_BODY_LIMIT, MissingKey};
pub use shared::SharedSettings;
