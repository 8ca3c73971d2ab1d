//! [`Verifier`]: the configured senders, each with its secrets, checked by the sender a
//! request looks like.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::request::Parts;

use super::senders::{Scheme, twilio};
use super::{Verify, VerifyError};
use crate::key::senders;

/// One or more secrets of a sender: several while one is rotated.
///
/// Made from a string, or an array or `Vec` of them. [`Debug`] never shows them.
#[derive(Clone)]
pub struct Secrets(pub(crate) Vec<Box<[u8]>>);

impl Secrets {
    fn into_keys(self, scheme: &Scheme) -> Arc<[Box<[u8]>]> {
        assert!(
            !self.0.is_empty() && self.0.iter().all(|s| !s.is_empty()),
            "{} verification needs at least one secret, and no empty one",
            scheme.sender.name
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
    checks: Vec<Check>,
}

/// One configured sender: what its [signature check](Scheme::check) is given.
#[derive(Clone)]
pub(crate) struct Check {
    scheme: &'static Scheme,
    /// Its secrets, as the keys of its MAC.
    pub(crate) keys: Arc<[Box<[u8]>]>,
    /// How far a signed timestamp may be from now.
    pub(crate) tolerance: Duration,
    /// Twilio's public base URL, when configured.
    pub(crate) public_url: Option<Arc<str>>,
}

impl Verifier {
    /// Checks the deliveries of `scheme`'s sender with `secrets`, under its tolerance.
    ///
    /// # Panics
    ///
    /// If no secret, or an empty one, is given.
    pub(crate) fn of(scheme: &'static Scheme, secrets: Secrets) -> Self {
        Self {
            checks: vec![Check {
                scheme,
                keys: secrets.into_keys(scheme),
                tolerance: scheme.tolerance,
                public_url: None,
            }],
        }
    }

    /// Also accepts the senders of `other`. A request is checked by the sender it looks like
    /// (the rule of [`key::auto`](crate::key::auto)). A sender configured twice accepts the
    /// secrets of both configurations, under the first one's tolerance and public URL.
    pub fn or(mut self, other: Verifier) -> Self {
        for check in other.checks {
            match self.checks.iter_mut().find(|c| c.scheme == check.scheme) {
                // The same sender again (`stripe(old).or(stripe(new))`): one check with the
                // secrets of both, the first one's tolerance and URL.
                Some(same) => {
                    let keys: Vec<_> = same.keys.iter().chain(check.keys.iter()).cloned().collect();
                    same.keys = keys.into();
                }
                None => self.checks.push(check),
            }
        }
        self
    }

    /// How far a signed timestamp may be from this machine's clock, in either direction, for
    /// the senders configured so far. Senders that sign no timestamp ignore it.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        for check in &mut self.checks {
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
        for check in &mut self.checks {
            if *check.scheme == twilio::SCHEME {
                check.public_url = Some(base.clone());
            }
        }
        self
    }

    /// Verifies a delivery as if the clock read `now`: what [`Verify::verify`] does with the
    /// current time. For tests against a sender's published examples.
    pub fn verify_at(
        &self,
        parts: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        let Some(sender) = senders::detect(parts) else {
            let expected: Vec<_> = self
                .checks
                .iter()
                .map(|c| format!("header `{}`", c.scheme.sender.signature[0]))
                .collect();
            return Err(VerifyError::missing(expected.join(" or ")));
        };
        let check = self
            .checks
            .iter()
            .find(|check| check.scheme.sender == sender)
            .ok_or(VerifyError::NoSecret {
                sender: sender.name,
            })?;
        (check.scheme.check)(check, parts, body, now)
    }
}

#[cfg(test)]
impl Verifier {
    /// The check of a verifier made for one sender.
    pub(crate) fn only_check(&self) -> &Check {
        let [check] = &self.checks[..] else {
            panic!("{} senders", self.checks.len())
        };
        check
    }
}

impl Verify for Verifier {
    fn verify(&self, parts: &Parts, body: &[u8]) -> Result<(), VerifyError> {
        self.verify_at(parts, body, SystemTime::now())
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for check in &self.checks {
            list.entry(&format_args!(
                "{} ({} secrets, tolerance {:?}, public URL {:?})",
                check.scheme.sender.name,
                check.keys.len(),
                check.tolerance,
                check.public_url
            ));
        }
        list.finish()
    }
}
