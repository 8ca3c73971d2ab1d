use std::borrow::Cow;

use http::StatusCode;

use crate::key::KeyError;

/// Why the [`VersionGuardLayer`](super::VersionGuardLayer) could not order a delivery. Each is a 4xx answer
/// (problem+json), found in the response extensions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionGuardError {
    /// The delivery does not carry the entity id the extractor looks for.
    #[error("no entity id found: expected {expected}")]
    MissingEntity {
        /// Where the entity id was expected.
        expected: Cow<'static, str>,
    },
    /// An entity id was found but is empty, too long, or not visible text.
    #[error("invalid entity id: {reason}")]
    InvalidEntity {
        /// What is wrong with it.
        reason: Cow<'static, str>,
    },
    /// The delivery does not carry the version the extractor looks for.
    #[error("no version found: expected {expected}")]
    MissingVersion {
        /// Where the version was expected.
        expected: Cow<'static, str>,
    },
    /// A version was found but is not an integer or an RFC 3339 timestamp.
    #[error("invalid version: {reason}")]
    InvalidVersion {
        /// What is wrong with it.
        reason: Cow<'static, str>,
    },
    /// The body could not be read or is not JSON (413, 408 or 400, as for keys).
    #[error(transparent)]
    Body(KeyError),
}

impl VersionGuardError {
    /// Files an entity extractor's error.
    pub(crate) fn entity(error: KeyError) -> Self {
        match error {
            KeyError::Missing { expected } => Self::MissingEntity { expected },
            KeyError::Invalid { reason } => Self::InvalidEntity { reason },
            other => Self::Body(other),
        }
    }

    /// Files a version extractor's error.
    pub(crate) fn version(error: KeyError) -> Self {
        match error {
            KeyError::Missing { expected } => Self::MissingVersion { expected },
            KeyError::Invalid { reason } => Self::InvalidVersion { reason },
            other => Self::Body(other),
        }
    }

    /// Whether the entity id or the version is simply absent.
    pub fn is_missing(&self) -> bool {
        matches!(
            self,
            Self::MissingEntity { .. } | Self::MissingVersion { .. }
        )
    }

    /// The status the layer answers with: 413 for an oversized body, 408 for a body that never
    /// finished, 400 otherwise.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Body(error) => error.status(),
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// Where the missing part was expected, for the problem's `expected` member.
    pub(crate) fn expected(&self) -> Option<&str> {
        match self {
            Self::MissingEntity { expected } | Self::MissingVersion { expected } => Some(expected),
            _ => None,
        }
    }
}
