//! The signature schemes of the senders this crate knows: one file per sender, each holding
//! that sender's [`Scheme`] (its check and timestamp tolerance, on top of the sender's record
//! in [`key::senders`](crate::key::senders)) and its verifier (`verify::github(secret)`).
//!
//! A [`Verifier`](super::Verifier) asks [`detect`](crate::key::senders::detect) whose
//! delivery a request is, the question [`key::auto`](crate::key::auto) asks, and runs that
//! sender's check.

use http::request::Parts;

use super::{Check, VerifyError};
use crate::key::senders::Sender;

pub(crate) mod github;
pub(crate) mod shopify;
pub(crate) mod slack;
pub(crate) mod standard_webhooks;
pub(crate) mod stripe;
pub(crate) mod twilio;
pub(crate) mod twitch;

/// How one sender signs its deliveries.
pub(crate) struct Scheme {
    /// The sender: its name, and the headers that name it.
    pub(crate) sender: &'static Sender,
    /// How far its signed timestamp may be from this machine's clock; zero when it signs none.
    pub(crate) tolerance: std::time::Duration,
    /// Its signature check.
    pub(crate) check: SignatureCheck,
}

/// A sender's signature check, given the configured secrets and the time it is.
pub(crate) type SignatureCheck =
    fn(&Check, &Parts, &[u8], std::time::SystemTime) -> Result<(), VerifyError>;

impl PartialEq for Scheme {
    fn eq(&self, other: &Self) -> bool {
        self.sender == other.sender
    }
}

impl std::fmt::Debug for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.sender, f)
    }
}

#[cfg(test)]
mod tests;
