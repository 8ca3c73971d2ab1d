//! What a committed key keeps for its duplicates: the request's fingerprint, and the response
//! when [response replay](crate::replay) stored it.

use std::fmt;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use super::StoreError;

/// A digest of what identifies a request beyond its key (method, path, body, chosen
/// headers): 32 bytes of SHA-256. A duplicate whose fingerprint differs reuses the key for
/// another request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// A fingerprint from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The fingerprint's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

/// A response kept for replay: its status, the headers the allowlist let through, its body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The status the handler answered.
    pub status: StatusCode,
    /// The headers kept, in the order the handler sent them.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

impl StoredResponse {
    /// A response to keep.
    pub fn new(status: StatusCode, headers: Vec<(HeaderName, HeaderValue)>, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
        }
    }
}

/// What a `done` key keeps of the delivery that committed it, for the duplicates that follow:
/// the request's fingerprint and, when it was stored, the response. Written by
/// [`Store::commit_with`](super::Store::commit_with), answered in
/// [`Completed::receipt`](super::Completed::receipt).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Receipt {
    /// The committing request's fingerprint, when the layer takes them.
    pub fingerprint: Option<Fingerprint>,
    /// The committing delivery's response, when it was stored.
    pub response: Option<StoredResponse>,
}

/// The first byte of an encoded receipt: the layout's version.
const LAYOUT: u8 = 1;
const HAS_FINGERPRINT: u8 = 1;
const HAS_RESPONSE: u8 = 2;

impl Receipt {
    /// A receipt with this fingerprint and response.
    pub fn new(fingerprint: Option<Fingerprint>, response: Option<StoredResponse>) -> Self {
        Self {
            fingerprint,
            response,
        }
    }

    /// The receipt as the SQL stores keep it, in one binary column: a layout byte, a flags
    /// byte, the fingerprint's 32 bytes if any, then, if there is a response, its status (2
    /// bytes, big-endian), its header count (2 bytes), each header as a 2-byte name length,
    /// the name, a 4-byte value length and the value, and last the body's length (8 bytes)
    /// and the body. A column cut short anywhere reads as an error, never as a shorter body.
    pub fn encode(&self) -> Vec<u8> {
        let response_len = self.response.as_ref().map_or(0, |res| {
            res.headers
                .iter()
                .map(|(name, value)| 6 + name.as_str().len() + value.len())
                .sum::<usize>()
                + 12
                + res.body.len()
        });
        let mut out = Vec::with_capacity(2 + 32 + response_len);
        let flags = if self.fingerprint.is_some() {
            HAS_FINGERPRINT
        } else {
            0
        } | if self.response.is_some() {
            HAS_RESPONSE
        } else {
            0
        };
        out.extend_from_slice(&[LAYOUT, flags]);
        if let Some(fingerprint) = &self.fingerprint {
            out.extend_from_slice(fingerprint.as_bytes());
        }
        if let Some(res) = &self.response {
            out.extend_from_slice(&res.status.as_u16().to_be_bytes());
            let count = u16::try_from(res.headers.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&count.to_be_bytes());
            for (name, value) in res.headers.iter().take(usize::from(count)) {
                // Header names are at most 64 KiB in practice (hyper's limit is far lower);
                // values at most 4 GiB. Longer ones cannot come through HTTP/1 or HTTP/2.
                let name = name.as_str().as_bytes();
                out.extend_from_slice(&(name.len() as u16).to_be_bytes());
                out.extend_from_slice(name);
                out.extend_from_slice(&(value.len() as u32).to_be_bytes());
                out.extend_from_slice(value.as_bytes());
            }
            out.extend_from_slice(&(res.body.len() as u64).to_be_bytes());
            out.extend_from_slice(&res.body);
        }
        out
    }

    /// Reads a receipt [`encode`](Self::encode) wrote. A column written by something else
    /// answers [`StoreError::Backend`] naming what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        let mut reader = Reader(bytes);
        let head = reader.take(2, "too short")?;
        if head[0] != LAYOUT {
            return Err(unreadable("unknown layout"));
        }
        let flags = head[1];
        let fingerprint = if flags & HAS_FINGERPRINT != 0 {
            let bytes = reader.take(32, "fingerprint cut short")?;
            let mut fingerprint = [0; 32];
            fingerprint.copy_from_slice(bytes);
            Some(Fingerprint(fingerprint))
        } else {
            None
        };
        let response = if flags & HAS_RESPONSE != 0 {
            let status =
                StatusCode::from_u16(reader.u16("status")?).map_err(|_| unreadable("status"))?;
            let count = reader.u16("header count")?;
            let mut headers = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let len = usize::from(reader.u16("header name length")?);
                let name = HeaderName::from_bytes(reader.take(len, "header name")?)
                    .map_err(|_| unreadable("header name"))?;
                let len = reader.u32("header value length")? as usize;
                let value = HeaderValue::from_bytes(reader.take(len, "header value")?)
                    .map_err(|_| unreadable("header value"))?;
                headers.push((name, value));
            }
            let len = usize::try_from(reader.u64("body length")?)
                .map_err(|_| unreadable("body length"))?;
            let body = Bytes::copy_from_slice(reader.take(len, "body cut short")?);
            Some(StoredResponse::new(status, headers, body))
        } else {
            None
        };
        if !reader.0.is_empty() {
            return Err(unreadable("bytes after its end"));
        }
        Ok(Self::new(fingerprint, response))
    }
}

fn unreadable(what: &str) -> StoreError {
    StoreError::backend(format!("unreadable receipt: {what}"))
}

/// The bytes of an encoded receipt not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(unreadable(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u16(&mut self, what: &str) -> Result<u16, StoreError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, StoreError> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, StoreError> {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_be_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_reads_back_as_written() {
        let response = StoredResponse::new(
            StatusCode::CREATED,
            vec![
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    http::header::LOCATION,
                    HeaderValue::from_static("/payments/1"),
                ),
            ],
            Bytes::from_static(b"{\"id\":1}\x00\xff"),
        );
        for receipt in [
            Receipt::default(),
            Receipt::new(Some(Fingerprint::from_bytes([7; 32])), None),
            Receipt::new(None, Some(response.clone())),
            Receipt::new(Some(Fingerprint::from_bytes([9; 32])), Some(response)),
        ] {
            assert_eq!(Receipt::decode(&receipt.encode()).unwrap(), receipt);
        }
    }

    #[test]
    fn a_damaged_receipt_is_an_error_not_a_panic() {
        let whole = Receipt::new(
            Some(Fingerprint::from_bytes([1; 32])),
            Some(StoredResponse::new(
                StatusCode::OK,
                vec![(http::header::ETAG, HeaderValue::from_static("\"v1\""))],
                Bytes::from_static(b"{\"paid\":true}"),
            )),
        )
        .encode();
        for cut in 0..whole.len() {
            // Cut anywhere, the body's bytes included: never a panic, always an error.
            assert!(Receipt::decode(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert!(Receipt::decode(&longer).is_err(), "a byte past the end");
        assert!(Receipt::decode(&[2, 0]).is_err(), "unknown layout");
        assert!(
            Receipt::decode(&[1, 1, 0]).is_err(),
            "fingerprint cut short"
        );
    }
}
