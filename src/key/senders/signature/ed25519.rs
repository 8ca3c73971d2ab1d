//! Checking an Ed25519 signature: the public keys a check is given, and the one verification
//! every asymmetric scheme makes.

use ed25519_dalek::{Signature, VerifyingKey};

use super::Check;

/// An Ed25519 public key that signatures are checked against: a valid point of the curve, and
/// not one of the few weak keys of small order.
#[derive(Clone)]
pub(crate) struct PublicKey(VerifyingKey);

impl PublicKey {
    /// The key whose encoding is `bytes`, or why it is not one.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let encoded: &[u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("an Ed25519 public key is 32 bytes, not {}", bytes.len()))?;
        let key = VerifyingKey::from_bytes(encoded)
            .map_err(|_| "the bytes are no point of the Ed25519 curve".to_owned())?;
        if key.is_weak() {
            // Strict verification would refuse every signature: say so now, not at each delivery.
            return Err("a weak key of small order, which verifies nothing".to_owned());
        }
        Ok(Self(key))
    }
}

/// A signature as sent: 64 bytes, or `None`.
pub(crate) fn signature(bytes: &[u8]) -> Option<Signature> {
    Signature::from_slice(bytes).ok()
}

/// Whether any signature is one of `content`, its parts joined, by any of the check's public
/// keys. Verification is strict: a signature with a non-canonical scalar or a point of small
/// order is refused, as one an honest signer never makes.
pub(crate) fn signed_by(check: &Check, signatures: &[Signature], content: &[&[u8]]) -> bool {
    if signatures.is_empty() || check.public_keys.is_empty() {
        return false;
    }
    // Ed25519 hashes the message twice, so it is joined once.
    let message = content.concat();
    check.public_keys.iter().any(|PublicKey(key)| {
        signatures
            .iter()
            .any(|signature| key.verify_strict(&message, signature).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        crate::key::senders::signature::parse::from_hex(text).unwrap()
    }

    /// RFC 8032, section 7.1, TEST 1 and TEST 2.
    #[test]
    fn rfc_8032_vectors() {
        let vectors = [
            (
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
                "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
                 5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
            ),
            (
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
                "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da\
                 085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
            ),
        ];
        for (key, message, sig) in vectors {
            let key = PublicKey::from_bytes(&hex(key)).unwrap();
            let check = Check {
                keys: Arc::new([]),
                public_keys: Arc::new([key]),
                tolerance: Duration::ZERO,
                public_url: None,
            };
            let sig = signature(&hex(sig)).unwrap();
            assert!(signed_by(&check, &[sig], &[&hex(message)]), "{message:?}");
            assert!(!signed_by(&check, &[sig], &[b"another message"]));
        }
    }

    #[test]
    fn keys_that_verify_nothing_are_refused() {
        assert!(PublicKey::from_bytes(&[7; 31]).is_err(), "short");
        // y = 2 has no x on the curve.
        let mut off_curve = [0; 32];
        off_curve[0] = 2;
        assert!(PublicKey::from_bytes(&off_curve).is_err(), "no point");
        // y = 1 is the identity, of order 1.
        let mut identity = [0; 32];
        identity[0] = 1;
        assert!(PublicKey::from_bytes(&identity).is_err(), "weak");
        assert_eq!(signature(&[0; 63]), None);
    }
}
