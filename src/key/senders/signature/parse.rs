//! Reading what a signature scheme sends: headers, hex and base64.

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

    #[test]
    fn hex() {
        assert_eq!(from_hex("00ff10").unwrap(), [0, 255, 16]);
        assert!(from_hex("0").is_err());
        assert!(from_hex("zz").is_err());
    }
}
