//! The webhook senders this crate knows: one file per sender, holding all the crate knows of
//! it. Its [`Sender`] record says what every part of the crate asks of it: its name and
//! namespace, where its delivery id is, which header carries its signature and with what
//! precedence, and, with the `verify` feature, its signature scheme (the check, the timestamp
//! tolerance, whether the URL is signed). Beside the record, the file holds the sender's key
//! preset (`key::github()`) and, under `#[cfg(feature = "verify")]`, a `scheme` module with
//! the scheme, its check and the sender's public verifier (`verify::github(secret)`), whose
//! docs describe its signature scheme and where it is published.
//!
//! [`key::auto`](crate::key::auto), the [detection](crate::key::detect) of a sender by its headers (written beside it), and
//! signature verification all read the records of [`ALL`], so that the key claimed always
//! belongs to the sender whose signature is checked. What they share to check a signature
//! (the scheme's record, the errors, the MAC, the parsing and clock helpers, the verifier
//! that runs the checks) is in `signature/`, which imports none of the senders' files.
//!
//! # Adding a sender
//!
//! A new sender `acme` is:
//!
//! 1. the file `acme.rs` here, shaped as the others: the record `pub(crate) static SENDER`,
//!    `pub fn key()` with its docs, and a `#[cfg(feature = "verify")] pub(crate) mod scheme`
//!    holding the `SCHEME` the record names (`Scheme::new(check)`, with the tolerance of a
//!    signed timestamp or `signs_url()` where the sender signs those),
//!    `pub fn verifier(secrets: impl Into<Secrets>) -> Verifier` with the docs of the scheme
//!    (its format, what it covers, its tolerance, where it is published), and the `check`;
//! 2. `acme` in the list of senders in this file, at the place its id header takes in
//!    detection. The list declares the module, puts its record in [`ALL`], and gives it its
//!    public names: `key::acme()` and `verify::acme(secret)`;
//! 3. its signer in the testing kit (feature `testing`): the file `src/testing/sign/acme.rs`,
//!    a type `Acme` made by `pub fn acme(secret)`, whose `delivery(..)` signs as the sender's
//!    published scheme says; and in `testing/sign/mod.rs` its `mod acme;`, its
//!    `pub use acme::{Acme, acme};` and its row in the module's table. The signer is written
//!    from the sender's documentation, not from `check`, and imports nothing of `signature/`:
//!    each is the other's test. `tests/testing_sign.rs` signs the sender's published example
//!    with it, and sends its deliveries and their forgeries through the verifier.
//!
//! Tests written against [`ALL`] then fail until they are told of it, so that nothing that
//! names every sender forgets one: `tests.rs` here lists each sender's key preset and every
//! id and signature header in the order of detection, `verify/mod.rs` each public verifier,
//! `testing/sign/mod.rs` each signer of the testing kit, and `key::auto`'s message for a
//! request that names no sender each id header. The docs that name every sender are the
//! tables of README.md, of the `verify` module and of `testing::sign`, and the order of
//! detection in [`key::auto`](crate::key::auto)'s docs.

use std::fmt;

#[cfg(feature = "verify")]
pub(crate) mod signature;

/// Declares the senders, each the file of its name here, in the order their id headers name
/// them (see [`detect`](crate::key::detect)): their modules, [`ALL`], and their public names, the key presets
/// (`key::github()`, from [`keys`]) and the verifiers (`verify::github(secret)`, from
/// `verifiers`).
macro_rules! senders {
    ($($sender:ident),+ $(,)?) => {
        $(pub(crate) mod $sender;)+

        /// Every sender, in the order its id header names it (see [`detect`](crate::key::detect)).
        pub(crate) static ALL: &[&Sender] = &[$(&$sender::SENDER),+];

        /// Each sender's key preset under the sender's name, for [`key`](crate::key).
        pub(crate) mod keys {
            $(pub use super::$sender::key as $sender;)+
        }

        /// Each sender's verifier under the sender's name, for [`verify`](crate::verify).
        #[cfg(feature = "verify")]
        pub(crate) mod verifiers {
            $(pub use super::$sender::scheme::verifier as $sender;)+
        }
    };
}

senders!(
    github,
    shopify,
    standard_webhooks,
    twilio,
    twitch,
    stripe,
    slack,
);

/// What the crate knows of one webhook sender, whatever it is asked for: its key, or whose
/// signature a request carries.
pub(crate) struct Sender {
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
    /// Its signature scheme: its check, its timestamp tolerance, whether it signs the URL.
    #[cfg(feature = "verify")]
    pub(crate) scheme: signature::Scheme,
}

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

impl PartialEq for Sender {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace
    }
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
mod tests;
