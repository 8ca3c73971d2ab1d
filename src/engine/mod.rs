//! The delivery engine: what every mode shares, and the one service shell.
//!
//! A delivery goes through the same steps whatever the mode, in [`mode::Guarded`]; a mode
//! ([`mode::Mode`]) says what it claims, how, and how its claim runs and settles. Every answer
//! the layer gives by itself is a [`refusal::Refusal`], made into a response in one place.
//!
//! 1. [`mode`], before the claim: buffer the body only if the mode or verification reads it
//!    (through the size and time limits), verify, find what to claim, and answer what needs
//!    no store (400, 401, 413, 408).
//! 2. [`drain`]: count the delivery, or turn it away with 503 while the layer drains.
//! 3. [`run::acquire`]: the mode's claim, bounded by the store timeout, with a granted claim
//!    wrapped at once in a [`guard::LeaseGuard`] so that an answer nobody reads gives itself
//!    back.
//! 4. [`run`]: the inner service under the claim, moved into a task of its own if the
//!    delivery goes away ([`run::Detach`]), with the heartbeat renewing the claim once the
//!    handler has to wait.
//! 5. [`guard`]: commit or release as the answer says, retried in the background when the
//!    store fails; a panic is abandoned as the stale policy says.
//! 6. [`wait`]: optionally, a duplicate that meets a claim in flight waits for it to settle.
//!
//! # The path of one delivery
//!
//! A new event, claim-then-commit on PostgreSQL with the default key (`key::auto()`, here a
//! GitHub delivery: a header key, the body left unread), no replay, from the service's `call`
//! to the answer, file by file. A file counts where code written in it runs; the handler
//! answers at its first poll, and the store's last claim met a new key.
//!
//! | step | file |
//! |---|---|
//! | `Guarded::call`, `deliver`: the body left unread, no signature, `find_key`, `check_len` | `engine/mode.rs` |
//! | the delivery's span and response future | `engine/observe.rs` |
//! | `ClaimMode::reads_body`, `find`, `claim`, `run`, `Owner::settle`, `answered` | `claim/mode.rs` |
//! | the sender detected, its key read, the namespace joined, the scope | `key/auto.rs`, `key/header.rs`, `key/mod.rs`, `key/scope.rs` |
//! | `RequestBody::new`, the body's bound, `ResponseBody::new` | `body.rs` |
//! | `Drain::enter`, `Ticket::hold`, the ticket dropped | `engine/drain.rs` |
//! | the gauge, the store and handler histograms, the delivery counter | `metrics.rs` |
//! | [`run::acquire`], [`run::run`] (no keeper: replay is off) | `engine/run.rs` |
//! | `Store::claim`, `Lone::claim_one`: **`INSERT … ON CONFLICT DO NOTHING`**; `commit`, `Lone::commit_one`: **`UPDATE … SET state = 'done'`** | `store/postgres/claims.rs` (the SQL text in `store/postgres/queries.rs`) |
//! | `LeaseToken::generate`, `Lease::new` | `store/claim.rs` |
//! | `NewKeys`, `ClaimRow::inserted` | `store/sql/rows.rs` |
//! | the batcher: a lone write goes at once, alone; `CommitWrite::of` | `store/batch/mod.rs` |
//! | `retry_serialization_failure`, `after_read`, `held` | `store/sql/mod.rs` |
//! | `LeaseGuard::claimed`, `settle`, `bounded`, `report` | `engine/guard/mod.rs` |
//! | which answers commit, `tagged`, the outcome's name | `response.rs` |
//!
//! 18 files, 19 with the SQL text. Off this path: the heartbeat and a failed settlement's
//! retries (`engine/guard/beat.rs`), replay (`replay.rs`), a batch of several writes
//! (`store/postgres/batch.rs`), the version claim's and SQLite's upserts
//! (`store/sql/upsert.rs`). The other modes take the same path through their own `mode.rs`
//! in place of `claim/mode.rs`.

pub(crate) mod drain;
pub(crate) mod guard;
pub(crate) mod handback;
pub(crate) mod mode;
pub(crate) mod observe;
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
