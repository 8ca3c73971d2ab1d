//! Checking a signature: the one comparison every scheme makes.

use hmac::{KeyInit, Mac};

use super::Check;

/// Whether any signature is the MAC `M` of `content` under any of the check's secrets, each
/// comparison in constant time.
pub(super) fn signed_by<M: Mac + KeyInit + Clone>(
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
