//! The bytes a store keeps for an entry's request and its attempts: length-prefixed fields
//! behind a tag with a version, so that a later release can read what this one wrote.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};

use super::{Attempt, AttemptResult, StoredRequest};
use crate::store::StoreError;

/// The most attempts an entry's history keeps: the latest ones.
pub const HISTORY_LIMIT: usize = 20;

const REQUEST_TAG: &[u8; 4] = b"TIR1";
const HISTORY_TAG: &[u8; 4] = b"TIH1";
/// The longest error text an attempt keeps, in bytes.
const ERROR_LIMIT: usize = 512;

fn put(out: &mut Vec<u8>, field: &[u8]) {
    let len = u32::try_from(field.len()).expect("a stored field is under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(field);
}

pub(super) fn encode_request(request: &StoredRequest) -> Vec<u8> {
    let headers: usize = request
        .headers
        .iter()
        .map(|(name, value)| 8 + name.as_str().len() + value.len())
        .sum();
    let mut out = Vec::with_capacity(24 + request.uri.len() + headers + request.body.len());
    out.extend_from_slice(REQUEST_TAG);
    put(&mut out, request.method.as_str().as_bytes());
    put(&mut out, request.uri.as_bytes());
    let count = u32::try_from(request.headers.len()).expect("fewer than 4 G headers");
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in &request.headers {
        put(&mut out, name.as_str().as_bytes());
        put(&mut out, value.as_bytes());
    }
    put(&mut out, &request.body);
    out
}

/// Reads fields off a slice, failing on a short or odd one.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(damaged("it ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn field(&mut self) -> Result<&'a [u8], StoreError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn tag(&mut self, tag: &[u8; 4]) -> Result<(), StoreError> {
        if self.take(4)? != tag {
            return Err(damaged("its tag is not one this release writes"));
        }
        Ok(())
    }

    fn end(&self) -> Result<(), StoreError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(damaged("bytes follow its end"))
        }
    }
}

fn damaged(why: &str) -> StoreError {
    StoreError::backend(format!("a stored inbox entry cannot be read: {why}"))
}

pub(super) fn decode_request(bytes: &[u8]) -> Result<StoredRequest, StoreError> {
    let mut reader = Reader(bytes);
    reader.tag(REQUEST_TAG)?;
    let method = Method::from_bytes(reader.field()?).map_err(|_| damaged("bad method"))?;
    let uri = std::str::from_utf8(reader.field()?)
        .map_err(|_| damaged("bad path"))?
        .to_owned();
    let count = reader.u32()? as usize;
    let mut headers = Vec::with_capacity(count.min(256));
    for _ in 0..count {
        let name = HeaderName::from_bytes(reader.field()?).map_err(|_| damaged("bad header"))?;
        let value =
            HeaderValue::from_bytes(reader.field()?).map_err(|_| damaged("bad header value"))?;
        headers.push((name, value));
    }
    let body = Bytes::copy_from_slice(reader.field()?);
    reader.end()?;
    Ok(StoredRequest {
        method,
        uri,
        headers,
        body,
    })
}

pub(super) fn encode_history(attempts: &[Attempt]) -> Vec<u8> {
    let kept = &attempts[attempts.len().saturating_sub(HISTORY_LIMIT)..];
    let mut out = Vec::with_capacity(6 + kept.len() * 24);
    out.extend_from_slice(HISTORY_TAG);
    out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
    for attempt in kept {
        out.extend_from_slice(&attempt.started_ms.to_be_bytes());
        out.extend_from_slice(&attempt.duration_ms.to_be_bytes());
        match &attempt.result {
            AttemptResult::Status(status) => {
                out.push(0);
                out.extend_from_slice(&status.to_be_bytes());
            }
            AttemptResult::Error(text) => {
                out.push(1);
                put(&mut out, shortened(text).as_bytes());
            }
            AttemptResult::Crashed => out.push(2),
        }
    }
    out
}

/// `text` cut to [`ERROR_LIMIT`] bytes, on a character boundary.
fn shortened(text: &str) -> &str {
    if text.len() <= ERROR_LIMIT {
        return text;
    }
    let mut end = ERROR_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

pub(super) fn decode_history(bytes: &[u8]) -> Result<Vec<Attempt>, StoreError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut reader = Reader(bytes);
    reader.tag(HISTORY_TAG)?;
    let count = reader.u16()? as usize;
    let mut attempts = Vec::with_capacity(count.min(HISTORY_LIMIT));
    for _ in 0..count {
        let started_ms = reader.u64()?;
        let duration_ms = reader.u64()?;
        let result = match reader.u8()? {
            0 => AttemptResult::Status(reader.u16()?),
            1 => AttemptResult::Error(String::from_utf8_lossy(reader.field()?).into_owned()),
            2 => AttemptResult::Crashed,
            _ => return Err(damaged("an attempt of an unknown kind")),
        };
        attempts.push(Attempt {
            started_ms,
            duration_ms,
            result,
        });
    }
    reader.end()?;
    Ok(attempts)
}
