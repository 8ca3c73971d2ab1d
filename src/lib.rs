// With SQLite, axum, verification and the admin router, the crate documentation is the README
// (docs.rs builds it so); without them, the short version below, whose examples need no database.
#![cfg_attr(
    all(
        feature = "sqlite",
        feature = "axum",
        feature = "verify",
        feature = "admin"
    ),
    doc = include_str!("../README.md")
)]
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "axum",
        feature = "verify",
        feature = "admin"
    )),
    doc = include_str!("../docs/crate.md")
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod body;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod engine;
mod future;
pub mod journal;
pub mod key;
mod layer;
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod replay;
pub mod response;
mod service;
pub mod store;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub mod transactional;
#[cfg(feature = "verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
pub mod verify;
pub mod version_guard;

/// The [version guard](version_guard) under its former module name, for one release.
///
/// Its types under their former names warn when used; paths through the module itself do
/// not (the compiler does not warn for items reached through a deprecated module), so move to
/// `version_guard` now.
#[deprecated(since = "0.2.0", note = "renamed `version_guard`")]
pub mod order {
    pub use crate::version_guard::*;

    /// The version guard's layer under its former name.
    #[deprecated(since = "0.2.0", note = "renamed `version_guard::VersionGuardLayer`")]
    pub type OrderLayer<St, E = Unset, V = Unset> = VersionGuardLayer<St, E, V>;

    /// The version guard's service under its former name.
    #[deprecated(since = "0.2.0", note = "renamed `version_guard::VersionGuard`")]
    pub type Order<S, St, E, V> = VersionGuard<S, St, E, V>;

    /// The version guard's error under its former name.
    #[deprecated(since = "0.2.0", note = "renamed `version_guard::VersionGuardError`")]
    pub type OrderError = VersionGuardError;
}

pub use engine::{
    DEFAULT_BODY_LIMIT, Drain, DrainReport, LeaseHandle, LeftBehind, MissingKey, Stage,
};
pub use future::ResponseFuture;
pub use journal::{Journal, Seen};
pub use key::{IdempotencyKey, Scope};
pub use layer::IdempotencyLayer;
pub use response::Outcome;
pub use service::Idempotency;
pub use store::{Stale, StalePolicy};
