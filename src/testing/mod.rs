//! A kit for the tests of a receiver (feature `testing`, for `[dev-dependencies]`): deliveries
//! signed as each sender signs them.
//!
//! [`sign`] makes the [`Delivery`] each sender that [`verify`](crate::verify) knows would
//! send, signed with a secret, at a time a test chooses; and the forgeries a test of the
//! refusals needs: a tampered body, no signature, an old timestamp, another secret.
//!
//! ```
//! use tower_idempotency::testing::sign;
//! use tower_idempotency::verify::{self, VerifyError};
//!
//! let paid = sign::stripe("whsec_test").delivery(r#"{"id":"evt_1"}"#).to("/webhooks/stripe");
//! let now = std::time::SystemTime::now();
//! let verifier = verify::stripe("whsec_test");
//! assert_eq!(verifier.verify_at(&paid.parts(), paid.body(), now), Ok(()));
//! let forged = paid.tampered();
//! assert_eq!(verifier.verify_at(&forged.parts(), forged.body(), now), Err(VerifyError::Mismatch));
//! ```

mod delivery;
pub mod sign;

pub use delivery::Delivery;
