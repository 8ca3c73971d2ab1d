//! What every sender's signature check shares (feature `verify`), below the senders' files so
//! that each can hold its own check: the [`Scheme`] a sender's record names (its check, its
//! tolerance, whether it signs the URL), the [`Check`] a check is given (the secrets, the
//! tolerance, a public URL), the [`VerifyError`] it answers, the helpers it reads and compares
//! with ([`parse`], [`clock`], [`mac`], [`ed25519`]), and the [`Verifier`] that asks
//! [`detect`](crate::key::detect) whose delivery a request is and runs that sender's check.
//!
//! The public names are [`crate::verify`]'s, which adds the layer's `Verify` trait on top.

pub(crate) mod clock;
pub(crate) mod ed25519;
mod error;
pub(crate) mod mac;
pub(crate) mod parse;
mod verifier;

use std::time::{Duration, SystemTime};

use http::request::Parts;

pub use error::VerifyError;
pub(crate) use verifier::Check;
pub use verifier::{Secrets, Verifier};

/// What a signature check answers: `Ok` for a delivery it accepts, or why it refuses it.
pub(crate) type Verdict = Result<(), VerifyError>;

/// A sender's signature check, given the configured secrets and the time it is.
pub(crate) type SignatureCheck = fn(&Check, &Parts, &[u8], SystemTime) -> Verdict;

/// A sender's signature scheme, as its record names it: its check, how far the timestamp it
/// signs may be from this machine's clock, and whether it signs the URL it requested.
pub(crate) struct Scheme {
    /// Its signature check.
    pub(crate) check: SignatureCheck,
    /// How far its signed timestamp may be from this machine's clock; zero when it signs none.
    pub(crate) tolerance: Duration,
    /// Whether its signature covers the URL it requested, so that a verifier's
    /// [public URL](Verifier::public_url) applies to it.
    pub(crate) signs_url: bool,
}

impl Scheme {
    /// The scheme `check` checks, which signs no timestamp and not the URL.
    pub(crate) const fn new(check: SignatureCheck) -> Self {
        Self {
            check,
            tolerance: Duration::ZERO,
            signs_url: false,
        }
    }

    /// The same scheme, whose signed timestamp may be `tolerance` from this machine's clock.
    pub(crate) const fn tolerance(self, tolerance: Duration) -> Self {
        Self { tolerance, ..self }
    }

    /// The same scheme, which signs the URL it requested.
    pub(crate) const fn signs_url(self) -> Self {
        Self {
            signs_url: true,
            ..self
        }
    }
}
