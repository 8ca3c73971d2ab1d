//! The webhook senders this crate knows: one file per sender, each holding that sender's one
//! [`Provider`] record, its key preset (`key::github()`) and, with the `verify` feature, its
//! signature check and verifier (`verify::github(secret)`).
//!
//! [`key::auto`](crate::key::auto), the [detection](detect) of a sender by its headers, and
//! signature verification all read the records of [`ALL`], so that the key claimed always
//! belongs to the sender whose signature is checked. A new sender is a file here and an entry
//! in [`ALL`].

use std::fmt;
use std::sync::LazyLock;

use http::request::Parts;

pub(crate) mod github;
pub(crate) mod shopify;
pub(crate) mod slack;
pub(crate) mod standard_webhooks;
pub(crate) mod stripe;
pub(crate) mod twilio;
pub(crate) mod twitch;

/// Every sender, in the order its id header names it (see [`detect`]).
pub(crate) static ALL: &[&Provider] = &[
    &github::PROVIDER,
    &shopify::PROVIDER,
    &standard_webhooks::PROVIDER,
    &twilio::PROVIDER,
    &twitch::PROVIDER,
    &stripe::PROVIDER,
    &slack::PROVIDER,
];

/// [`ALL`] in the order of [`Provider::signature_precedence`], sorted once: detection by a
/// signature header stops at the first sender whose header is there.
static BY_SIGNATURE: LazyLock<Vec<&'static Provider>> = LazyLock::new(|| {
    let mut senders = ALL.to_vec();
    senders.sort_by_key(|provider| provider.signature_precedence);
    senders
});

/// What the crate knows of one webhook sender.
pub(crate) struct Provider {
    /// The sender's name, as in messages: `GitHub`.
    pub(crate) name: &'static str,
    /// The namespace of its keys: `github`.
    pub(crate) namespace: &'static str,
    /// Where its delivery id is.
    pub(crate) id: Id,
    /// The header that carries its signature; Standard Webhooks has one per header family,
    /// in the order of its id headers.
    pub(crate) signature: &'static [&'static str],
    /// Its place among the senders recognised by a signature header alone, lowest first: a
    /// request that carries no sender's id header and two senders' signature headers is the
    /// sender's with the lower number.
    pub(crate) signature_precedence: u8,
    /// How far its signed timestamp may be from this machine's clock; zero when it signs none.
    #[cfg(feature = "verify")]
    pub(crate) tolerance: std::time::Duration,
    /// Its signature check.
    #[cfg(feature = "verify")]
    pub(crate) check: SignatureCheck,
}

/// A sender's signature check, given the configured secrets and the time it is.
#[cfg(feature = "verify")]
pub(crate) type SignatureCheck = fn(
    &crate::verify::Check,
    &Parts,
    &[u8],
    std::time::SystemTime,
) -> Result<(), crate::verify::VerifyError>;

/// Where a sender puts the id it keeps the same across its retries.
#[derive(Debug)]
pub(crate) enum Id {
    /// In a header. Standard Webhooks has a family of them (`webhook-id`, `svix-id`): its key
    /// is read from the first one present, and is missing from the last when none is.
    Headers(&'static [&'static str]),
    /// At a JSON pointer in the body.
    Body {
        /// The pointer: `/id`.
        pointer: &'static str,
        /// When set, a body that is not JSON has no key, and this is what was expected
        /// instead (Slack's slash commands are forms); otherwise it is refused as not JSON.
        if_not_json: Option<&'static str>,
    },
}

impl PartialEq for Provider {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace
    }
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The sender whose key [`auto`](crate::key::auto) uses for this request, if any. Signature
/// verification asks the same question, so that the key claimed always belongs to the sender
/// verified.
///
/// A sender's id header names it first, in the order of [`ALL`]; then its signature header,
/// in the order of [`Provider::signature_precedence`]. A request that carries a sender's
/// signature is that sender's, so that a signed delivery stripped of its id header cannot
/// fall through to the generic `Idempotency-Key`.
pub(crate) fn detect(parts: &Parts) -> Option<&'static Provider> {
    let any = |names: &[&str]| names.iter().any(|name| parts.headers.contains_key(*name));
    ALL.iter()
        .copied()
        .find(|provider| matches!(provider.id, Id::Headers(names) if any(names)))
        .or_else(|| {
            BY_SIGNATURE
                .iter()
                .copied()
                .find(|provider| any(provider.signature))
        })
}

#[cfg(test)]
mod tests;
