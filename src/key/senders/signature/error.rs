//! [`VerifyError`]: why a delivery's signature was refused.

use std::borrow::Cow;

/// Why a delivery's signature was refused. Each is answered 401 problem+json.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The delivery carries no signature, or lacks a header the signature needs.
    #[error("the request is not signed: expected {expected}")]
    Missing {
        /// What was expected, e.g. ``header `x-hub-signature-256` ``.
        expected: Cow<'static, str>,
    },
    /// A signature header is there but cannot be read.
    #[error("the signature header is malformed: {reason}")]
    Malformed {
        /// What is wrong with it.
        reason: Cow<'static, str>,
    },
    /// No signature matches the content with any configured secret.
    #[error("the signature does not match the request")]
    Mismatch,
    /// The signed timestamp is further from this machine's clock than the tolerance.
    #[error(
        "the signature's timestamp is {skew_secs} s away from now; at most {tolerance_secs} s are allowed"
    )]
    Expired {
        /// How far the timestamp is from now, in seconds, in either direction.
        skew_secs: u64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The delivery looks like one of a sender for which no secret is configured.
    #[error("the request looks like a {sender} delivery, and no {sender} secret is configured")]
    NoSecret {
        /// The sender's name, e.g. `Stripe`.
        sender: &'static str,
    },
}

impl VerifyError {
    /// A [`VerifyError::Missing`] naming what was expected.
    pub fn missing(expected: impl Into<Cow<'static, str>>) -> Self {
        Self::Missing {
            expected: expected.into(),
        }
    }

    /// A [`VerifyError::Malformed`] with the reason.
    pub fn malformed(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::Malformed {
            reason: reason.into(),
        }
    }
}
