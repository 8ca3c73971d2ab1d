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
