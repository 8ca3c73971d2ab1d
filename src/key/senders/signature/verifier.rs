//! [`Verifier`]: the configured senders, each with its secrets, checked by the sender a
//! request looks like; and [`Secrets`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::VerifyError;
use super::ed25519::PublicKey;
use crate::key::senders::Sender;

/// One or more secrets of a sender: several while one is rotated. For Standard Webhooks, its
/// public keys (`whpk_…`) may stand among them or instead of them.
///
/// Made from a string, or an array or `Vec` of them. [`Debug`] never shows them.
#[derive(Clone)]
pub struct Secrets(pub(crate) Vec<Box<[u8]>>);

impl Secrets {
    /// The secrets as MAC keys, beside `public_keys`.
    ///
    /// # Panics
    ///
    /// If there is neither a secret nor a public key, or a secret is empty.
    fn into_keys(self, sender: &Sender, public_keys: &[PublicKey]) -> Arc<[Box<[u8]>]> {
        assert!(
            (!self.0.is_empty() || !public_keys.is_empty()) && self.0.iter().all(|s| !s.is_empty()),
            "{} verification needs at least one secret, and no empty one",
            sender.name
        );
        self.0.into()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} redacted)", self.0.len())
    }
}

impl From<&str> for Secrets {
    fn from(secret: &str) -> Self {
        Self(vec![secret.as_bytes().into()])
    }
}

impl From<String> for Secrets {
    fn from(secret: String) -> Self {
        Self(vec![secret.into_bytes().into()])
    }
}

impl From<&String> for Secrets {
    fn from(secret: &String) -> Self {
        Self::from(secret.as_str())
    }
}

impl<S: AsRef<str>, const N: usize> From<[S; N]> for Secrets {
    fn from(secrets: [S; N]) -> Self {
        Self(
            secrets
                .iter()
                .map(|s| s.as_ref().as_bytes().into())
                .collect(),
        )
    }
}

impl<S: AsRef<str>> From<Vec<S>> for Secrets {
    fn from(secrets: Vec<S>) -> Self {
        Self(
            secrets
                .iter()
                .map(|s| s.as_ref().as_bytes().into())
                .collect(),
        )
    }
}

/// Verifies the signatures of one or more senders. Made by the functions of the
/// [module](crate::verify) and joined with [`or`](Verifier::or).
#[derive(Clone)]
#[must_use]
pub struct Verifier {
    /// Each configured sender, with what its [check](super::Scheme::check) is given.
    checks: Vec<(&'static Sender, Check)>,
}

/// What a sender's [signature check](super::Scheme::check) is given: its configuration.
#[derive(Clone)]
pub(crate) struct Check {
    /// Its secrets, as the keys of its MAC.
    pub(crate) keys: Arc<[Box<[u8]>]>,
    /// Its Ed25519 public keys, for a sender that signs with those too (Standard Webhooks).
    pub(crate) public_keys: Arc<[PublicKey]>,
    /// How far a signed timestamp may be from now.
    pub(crate) tolerance: Duration,
    /// The public base URL, when configured, for a sender that signs the URL (Twilio).
    pub(crate) public_url: Option<Arc<str>>,
}

impl Verifier {
    /// Checks the deliveries of `sender` with `secrets`, under its tolerance.
    ///
    /// # Panics
    ///
    /// If no secret, or an empty one, is given.
    pub(crate) fn of(sender: &'static Sender, secrets: Secrets) -> Self {
        Self::of_keys(sender, secrets, Vec::new())
    }

    /// Checks the deliveries of `sender` with `secrets` and Ed25519 `public_keys`, under its
    /// tolerance: one or the other may be empty, not both.
    ///
    /// # Panics
    ///
    /// If neither a secret nor a public key is given, or a secret is empty.
    pub(crate) fn of_keys(
        sender: &'static Sender,
        secrets: Secrets,
        public_keys: Vec<PublicKey>,
    ) -> Self {
        let check = Check {
            keys: secrets.into_keys(sender, &public_keys),
            public_keys: public_keys.into(),
            tolerance: sender.scheme.tolerance,
            public_url: None,
        };
        Self {
            checks: vec![(sender, check)],
        }
    }

    /// Also accepts the senders of `other`. A request is checked by the sender it looks like
    /// (the rule of [`key::auto`](crate::key::auto)). A sender configured twice accepts the
    /// secrets (and public keys) of both configurations, under the first one's tolerance and
    /// public URL.
    pub fn or(mut self, other: Verifier) -> Self {
        for (sender, check) in other.checks {
            match self.checks.iter_mut().find(|(s, _)| *s == sender) {
                // The same sender again (`stripe(old).or(stripe(new))`): one check with the
                // secrets and public keys of both, the first one's tolerance and URL.
                Some((_, same)) => {
                    same.keys = same.keys.iter().chain(check.keys.iter()).cloned().collect();
                    same.public_keys = (same.public_keys.iter())
                        .chain(check.public_keys.iter())
                        .cloned()
                        .collect();
                }
                None => self.checks.push((sender, check)),
            }
        }
        self
    }

    /// How far a signed timestamp may be from this machine's clock, in either direction, for
    /// the senders configured so far. Senders that sign no timestamp ignore it.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        for (_, check) in &mut self.checks {
            check.tolerance = tolerance;
        }
        self
    }

    /// The public base URL Twilio posts to (`https://hooks.example.com`, or with a path
    /// prefix a proxy removes), for the Twilio senders configured so far. The URL Twilio
    /// signed is this base followed by the request's path and query.
    ///
    /// # Panics
    ///
    /// If `base` does not start with `https://` or `http://`.
    pub fn public_url(mut self, base: impl Into<String>) -> Self {
        let base = base.into();
        assert!(
            base.starts_with("https://") || base.starts_with("http://"),
            "a public URL starts with https:// or http://, got {base:?}"
        );
        let base: Arc<str> = base.trim_end_matches('/').into();
        for (sender, check) in &mut self.checks {
            if sender.scheme.signs_url {
                check.public_url = Some(base.clone());
            }
        }
        self
    }

    /// Verifies a delivery as if the clock read `now`: what
    /// [`Verify::verify`](crate::verify::Verify::verify) does with the current time. For tests
    /// against a sender's published examples.
    pub fn verify_at(
        &self,
        parts: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        let Some(sender) = crate::key::detect(parts) else {
            let expected: Vec<_> = self
                .checks
                .iter()
                .map(|(sender, _)| format!("header `{}`", sender.signature[0]))
                .collect();
            return Err(VerifyError::missing(expected.join(" or ")));
        };
        let (_, check) =
            self.checks
                .iter()
                .find(|(s, _)| *s == sender)
                .ok_or(VerifyError::NoSecret {
                    sender: sender.name,
                })?;
        (sender.scheme.check)(check, parts, body, now)
    }
}

#[cfg(test)]
impl Verifier {
    /// The check of a verifier made for one sender.
    pub(crate) fn only_check(&self) -> &Check {
        &self.only().1
    }

    /// The sender of a verifier made for one sender.
    pub(crate) fn only_sender(&self) -> &'static Sender {
        self.only().0
    }

    fn only(&self) -> &(&'static Sender, Check) {
        let [only] = &self.checks[..] else {
            panic!("{} senders", self.checks.len())
        };
        only
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for (sender, check) in &self.checks {
            let public_keys = match check.public_keys.len() {
                0 => String::new(),
                n => format!(", {n} public keys"),
            };
            list.entry(&format_args!(
                "{} ({} secrets{public_keys}, tolerance {:?}, public URL {:?})",
                sender.name,
                check.keys.len(),
                check.tolerance,
                check.public_url
            ));
        }
        list.finish()
    }
}
