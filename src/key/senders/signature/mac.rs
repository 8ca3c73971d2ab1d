//! Checking a signature: the one comparison every scheme makes, and its verdict.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{Check, Verdict, VerifyError};

/// Whether any signature is the MAC `M` of `content` under any of the check's secrets, each
/// comparison in constant time.
pub(crate) fn signed_by<M: Mac + KeyInit + Clone>(
    check: &Check,
    signatures: &[Vec<u8>],
    content: &[&[u8]],
) -> bool {
    check.keys.iter().any(|key| {
        let mut mac = <M as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
        for part in content {
            mac.update(part);
        }
        signatures
            .iter()
            .any(|signature| mac.clone().verify_slice(signature).is_ok())
    })
}

/// Whether any signature is the HMAC-SHA256 of `content` under any of the check's secrets,
/// each comparison in constant time.
pub(crate) fn any_matches(check: &Check, signatures: &[Vec<u8>], content: &[&[u8]]) -> Verdict {
    matched(signed_by::<Hmac<Sha256>>(check, signatures, content))
}

/// The verdict of a comparison: `Ok` when a signature matched, [`VerifyError::Mismatch`]
/// otherwise.
pub(crate) fn matched(signed: bool) -> Verdict {
    if signed {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}
