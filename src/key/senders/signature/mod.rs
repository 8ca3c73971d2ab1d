//! What every sender's signature check shares (feature `verify`), below the senders' files so
//! that each can hold its own check: the [`Check`] a check is given (the secrets, the
//! tolerance, a public URL), the [`VerifyError`] it answers, the helpers it reads and compares
//! with ([`parse`], [`clock`], [`mac`], [`ed25519`]), and the [`Verifier`] that asks
//! [`detect`](super::detect) whose delivery a request is and runs that sender's check.
//!
//! The public names are [`crate::verify`]'s, which adds the layer's `Verify` trait on top.

pub(crate) mod clock;
pub(crate) mod ed25519;
mod error;
pub(crate) mod mac;
pub(crate) mod parse;
mod verifier;

use std::time::SystemTime;

use http::request::Parts;

pub use error::VerifyError;
pub(crate) use verifier::Check;
pub use verifier::{Secrets, Verifier};

/// A sender's signature check, given the configured secrets and the time it is.
pub(crate) type SignatureCheck = fn(&Check, &Parts, &[u8], SystemTime) -> Result<(), VerifyError>;
