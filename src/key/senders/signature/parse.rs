//! Reading what a signature scheme sends: headers, the entries of a header that lists
//! several signatures, hex and base64.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::request::Parts;

use super::VerifyError;

/// The value of a header the signature needs, as text.
pub(crate) fn header<'a>(parts: &'a Parts, name: &str) -> Result<&'a str, VerifyError> {
    let value = parts
        .headers
        .get(name)
        .ok_or_else(|| VerifyError::missing(format!("header `{name}`")))?;
    value
        .to_str()
        .map(str::trim)
        .map_err(|_| VerifyError::malformed(format!("header `{name}` is not visible ASCII")))
}

/// The most entries a signature header may list: a header that lists more is malformed.
///
/// A sender lists one signature per secret it signs with, and signs with more than one only
/// while a secret is rotated: two at once, or a few. Each listed entry costs a check over the
/// whole body for each configured key, an HMAC or an Ed25519 verification (a SHA-512 of the
/// body), and a request asks for them before anything has shown it genuine: unbounded, one
/// request listing thousands of entries beside a large body holds a thread for seconds. Eight
/// is well above what a sender rotating its secrets sends, and bounds what one request costs
/// to eight checks of its body per key.
///
/// Every listed entry counts, those of a version no check reads and those that do not decode
/// too, so that a list of junk is refused as cheaply as a list of signatures. The header's
/// length has no bound of its own: reading it costs no cryptography and time linear in its
/// length, which the server's limit on headers bounds, and a sender that adds a version with
/// longer signatures beside one this crate reads is not refused for it.
pub(crate) const MAX_SIGNATURES: usize = 8;

/// The entries of a signature header that lists several, `separator` between them: each one
/// trimmed, empty ones left out. The entries for which `counted` holds (every one but a
/// scheme's own fields, such as Stripe's `t=`) are counted first, whatever they hold, and a
/// header that lists more than [`MAX_SIGNATURES`] of them is malformed: refused here, before
/// any entry is decoded or checked.
pub(crate) fn entries(
    listed: &str,
    separator: char,
    counted: impl Fn(&str) -> bool,
) -> Result<impl Iterator<Item = &str> + Clone, VerifyError> {
    let entries = listed
        .split(separator)
        .map(str::trim)
        .filter(|entry| !entry.is_empty());
    let count = entries.clone().filter(|entry| counted(entry)).count();
    if count > MAX_SIGNATURES {
        return Err(VerifyError::malformed(format!(
            "it lists {count} signature entries; at most {MAX_SIGNATURES} are read"
        )));
    }
    Ok(entries)
}

/// The signature of a header written `<prefix><hex>`, such as GitHub's `sha256=<hex>`.
pub(crate) fn prefixed_hex(
    parts: &Parts,
    name: &str,
    prefix: &str,
) -> Result<Vec<u8>, VerifyError> {
    let hex = header(parts, name)?
        .strip_prefix(prefix)
        .ok_or_else(|| VerifyError::malformed(format!("expected `{prefix}<hex>`")))?;
    from_hex(hex)
}

pub(crate) fn from_hex(text: &str) -> Result<Vec<u8>, VerifyError> {
    let malformed = || VerifyError::malformed("a signature is not hexadecimal");
    if !text.len().is_multiple_of(2) {
        return Err(malformed());
    }
    let digit = |b: u8| char::from(b).to_digit(16).ok_or_else(malformed);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Ok((digit(pair[0])? << 4 | digit(pair[1])?) as u8))
        .collect()
}

pub(crate) fn from_base64(text: &str) -> Result<Vec<u8>, VerifyError> {
    BASE64
        .decode(text)
        .map_err(|_| VerifyError::malformed("a signature is not base64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(header: &str, separator: char) -> Result<Vec<&str>, VerifyError> {
        entries(header, separator, |_| true).map(Iterator::collect)
    }

    /// The bound's worth of entries is read, whatever they are; one more is malformed, and the
    /// reason says how many were listed and how many are read.
    #[test]
    fn entries_beyond_the_bound_are_malformed() {
        let junk = |n: usize| vec!["v2,junk"; n].join(" ");
        assert_eq!(
            listed(&junk(MAX_SIGNATURES), ' ').unwrap().len(),
            MAX_SIGNATURES
        );
        for n in [MAX_SIGNATURES + 1, 4000] {
            let Err(VerifyError::Malformed { reason }) = listed(&junk(n), ' ') else {
                panic!("{n} entries are read");
            };
            assert_eq!(
                reason,
                format!("it lists {n} signature entries; at most {MAX_SIGNATURES} are read")
            );
        }
        // Entries are trimmed, and the empty ones between separators are no entries.
        let spaced = format!("  {}  ", ["v1,a"; MAX_SIGNATURES].join("   "));
        assert_eq!(listed(&spaced, ' ').unwrap(), vec!["v1,a"; MAX_SIGNATURES]);
        let items = format!("t=1, ,{}, ", ["v1=00"; MAX_SIGNATURES - 1].join(" ,, "));
        assert_eq!(listed(&items, ',').unwrap().len(), MAX_SIGNATURES);
        assert!(listed(&" ".repeat(100), ' ').unwrap().is_empty());
    }

    /// Only the entries `counted` names count toward the bound: a scheme's own fields, such as
    /// Stripe's timestamp, do not.
    #[test]
    fn only_counted_entries_count() {
        let signatures = ["v1=00"; MAX_SIGNATURES].join(",");
        let not_t = |entry: &str| !entry.starts_with("t=");
        let header = format!("t=1,{signatures}");
        assert_eq!(
            entries(&header, ',', not_t).unwrap().count(),
            MAX_SIGNATURES + 1
        );
        let header = format!("t=1,{signatures},v0=00");
        assert!(matches!(
            entries(&header, ',', not_t),
            Err(VerifyError::Malformed { .. })
        ));
    }

    #[test]
    fn hex() {
        assert_eq!(from_hex("00ff10").unwrap(), [0, 255, 16]);
        assert!(from_hex("0").is_err());
        assert!(from_hex("zz").is_err());
    }
}
