// The crate documentation is the README, whatever the features: its examples that need a
// feature compile only when it is on.
#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod body;
pub mod claim;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod engine;
pub mod inbox;
pub mod journal;
pub mod key;
#[cfg(feature = "ledger")]
#[cfg_attr(docsrs, doc(cfg(feature = "ledger")))]
pub mod ledger;
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod replay;
pub mod response;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod timestamp;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub mod transactional;
#[cfg(feature = "verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
pub mod verify;
pub mod version_guard;

pub use claim::{ClaimMode, Idempotency, IdempotencyLayer};
pub use engine::Guarded;
pub use engine::ResponseFuture;
pub use engine::{
    DEFAULT_BODY_LIMIT, Drain, DrainReport, LeaseHandle, LeftBehind, MissingKey, SharedSettings,
    Stage,
};
pub use journal::{Journal, Seen};
pub use key::{IdempotencyKey, Scope};
pub use response::Outcome;
pub use store::{Stale, StalePolicy};
