//! Versions: what makes one delivery about an entity newer than another.
//!
//! A version is an `i64` that the *sender* increases with every change of the entity: a
//! revision counter, or the time of the change, converted to microseconds since the Unix
//! epoch. Never the receiver's clock: a delivery that arrives late is still old. Only an older
//! version is outdated; an equal one runs, because a timestamp in whole seconds gives two
//! changes within one second the same version. Prefer the finest version the sender offers (a
//! revision counter, a sub-second timestamp): see [equal versions](super#equal-versions).
//!
//! - [`json`]: a JSON integer, or an RFC 3339 timestamp string, at a pointer in the body.
//! - [`header`]: an integer, or an RFC 3339 timestamp, in a header.
//! - [`from_fn`], [`from_body_fn`], or any closure `Fn(&Parts) -> Result<i64, KeyError>`.
//!
//! Keep one representation per entity namespace: a counter and a timestamp do not compare.
//!
//! ```
//! use tower_idempotency::version_guard::version::{self, ExtractVersion};
//!
//! let (parts, ()) = http::Request::new(()).into_parts();
//! let updated = version::json("/data/object/updated");
//! let body = br#"{"data": {"object": {"id": "sub_1", "updated": "2024-05-01T14:00:03.25Z"}}}"#;
//! assert_eq!(updated.extract(&parts, Some(body)).unwrap(), 1_714_572_003_250_000);
//! assert_eq!(version::parse_timestamp("1970-01-01T01:00:00+01:00").unwrap(), 0);
//! ```

use std::fmt;

use http::HeaderName;
use http::request::Parts;

use crate::key::json::Found;
use crate::key::{self, KeyError};
/// The extractors are the key module's own: one type per place a value is read from, a key or
/// a version as the extractor is asked.
pub use crate::key::{FromBodyFn, FromFn, Header, Json};

/// Finds the version of a delivery: the sender's revision or change time of the entity.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&http::request::Parts) -> Result<i64, KeyError>`. Errors use [`KeyError`]'s variants:
/// [`KeyError::Missing`] (the layer answers 400, or lets the delivery through under
/// [`MissingKey::PassThrough`](crate::MissingKey::PassThrough)), [`KeyError::Invalid`] and
/// [`KeyError::NotJson`] (400).
pub trait ExtractVersion: Send + Sync + 'static {
    /// Whether [`extract`](ExtractVersion::extract) needs the body of this request. Only then
    /// does the layer buffer it. The default is `false`.
    fn reads_body(&self, parts: &Parts) -> bool {
        let _ = parts;
        false
    }

    /// Finds the version. `body` holds the whole buffered body exactly when
    /// [`reads_body`](ExtractVersion::reads_body) answered `true` for these `parts`.
    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError>;
}

impl<F> ExtractVersion for F
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        self(parts)
    }
}

/// The version is the value at `pointer` (RFC 6901, e.g. `"/data/object/updated"`) in the JSON
/// body: an integer (a revision, or a Unix time such as Stripe's `created`), or a string holding
/// an RFC 3339 timestamp (converted to microseconds since the Unix epoch, see
/// [`parse_timestamp`]). The body is buffered through the layer's limit and passed on intact.
///
/// It is the key module's [`Json`] extractor, which reads a version as well as a key: the same
/// single pass over the body, which builds no tree. (Its namespace plays no part in a version.)
///
/// # Panics
///
/// If `pointer` is neither empty nor starts with `/`.
pub fn json(pointer: &str) -> Json {
    key::json(pointer)
}

impl ExtractVersion for Json {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError> {
        let pointer = self.pointer();
        let wrong = |kind: &str| {
            KeyError::invalid(format!(
                "{} is {kind}; expected an integer or an RFC 3339 timestamp",
                pointer.expected()
            ))
        };
        match pointer.seek(body.unwrap_or_default())? {
            Found::Absent => Err(KeyError::missing(pointer.expected())),
            Found::Integer(n) => {
                i64::try_from(n).map_err(|_| wrong("an integer too large for 64 bits"))
            }
            Found::Text(text) => parse_timestamp(&text)
                .map_err(|err| KeyError::invalid(format!("{}: {err}", pointer.expected()))),
            Found::Other(kind) => Err(wrong(kind)),
        }
    }
}

/// The version is the value of the header `name`: a decimal integer, or an RFC 3339 timestamp
/// (converted to microseconds since the Unix epoch, see [`parse_timestamp`]). The body is never
/// read.
///
/// It is the key module's [`Header`] extractor, which reads a version as well as a key. (Its
/// namespace plays no part in a version.)
///
/// # Panics
///
/// If `name` is not a valid header name.
pub fn header<N>(name: N) -> Header
where
    N: TryInto<HeaderName>,
    N::Error: fmt::Debug,
{
    key::header(name)
}

impl ExtractVersion for Header {
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        let text = self.text(parts)?;
        if let Some(version) = parse_integer(text) {
            return Ok(version);
        }
        parse_timestamp(text).map_err(|err| {
            KeyError::invalid(format!(
                "{}: neither an integer nor an RFC 3339 timestamp ({err})",
                self.expected()
            ))
        })
    }
}

/// `-?[0-9]+` as an `i64`; nothing else (no `+`, no spaces).
fn parse_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The version is whatever `f` makes of the request head.
///
/// ```
/// use tower_idempotency::{key::KeyError, version_guard::version};
///
/// // This sender puts a revision in the query string: `/hook?rev=7`.
/// let revision = version::from_fn(|parts: &http::request::Parts| {
///     parts.uri.query().unwrap_or_default()
///         .split('&')
///         .find_map(|pair| pair.strip_prefix("rev="))
///         .ok_or_else(|| KeyError::missing("query parameter `rev`"))?
///         .parse::<i64>()
///         .map_err(|e| KeyError::invalid(format!("query parameter `rev`: {e}")))
/// });
/// # let _ = revision;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    FromFn { f }
}

impl<F> ExtractVersion for FromFn<F>
where
    F: Fn(&Parts) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts, _body: Option<&[u8]>) -> Result<i64, KeyError> {
        (self.f)(parts)
    }
}

/// The version is whatever `f` makes of the request head and its whole body. The body is
/// buffered through the layer's limit and passed on intact.
pub fn from_body_fn<F>(f: F) -> FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    FromBodyFn { f }
}

impl<F> ExtractVersion for FromBodyFn<F>
where
    F: Fn(&Parts, &[u8]) -> Result<i64, KeyError> + Send + Sync + 'static,
{
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, parts: &Parts, body: Option<&[u8]>) -> Result<i64, KeyError> {
        (self.f)(parts, body.unwrap_or_default())
    }
}

/// Parses an RFC 3339 timestamp (`2024-05-01T14:00:03.25Z`, `2024-05-01T16:00:03+02:00`) into
/// microseconds since the Unix epoch.
///
/// Strict: exactly the `date-time` of RFC 3339 section 5.6. Four-digit year, two-digit fields,
/// `T` and `Z` (or `t` and `z`), an offset `Z` or `±hh:mm`, a real calendar date. A fraction
/// finer than microseconds is truncated, so two changes within one microsecond compare equal
/// (and both run: only an older version is outdated); a leap second (`:60`) counts as the last
/// microsecond of its minute.
///
/// ```
/// use tower_idempotency::version_guard::version::parse_timestamp;
///
/// assert_eq!(parse_timestamp("2024-05-01T14:00:01Z").unwrap(), 1_714_572_001_000_000);
/// assert!(parse_timestamp("2024-05-01 14:00:01").is_err(), "no offset");
/// assert!(parse_timestamp("2023-02-29T00:00:00Z").is_err(), "not a leap year");
/// ```
pub fn parse_timestamp(text: &str) -> Result<i64, TimestampError> {
    rfc3339::parse(text.as_bytes()).map_err(|reason| TimestampError {
        text: text.chars().take(64).collect(),
        reason,
    })
}

/// A string that is not an RFC 3339 timestamp. Made by [`parse_timestamp`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an RFC 3339 timestamp: {reason}")]
pub struct TimestampError {
    text: String,
    reason: &'static str,
}

mod rfc3339 {
    const MICROS_PER_SECOND: i64 = 1_000_000;

    /// `date-time = full-date "T" full-time`, into microseconds since the Unix epoch.
    pub(super) fn parse(s: &[u8]) -> Result<i64, &'static str> {
        let mut at = Cursor { s, i: 0 };
        let year = at.digits(4, "a four-digit year")?;
        at.expect(b'-', "`-` after the year")?;
        let month = at.digits(2, "a two-digit month")?;
        at.expect(b'-', "`-` after the month")?;
        let day = at.digits(2, "a two-digit day")?;
        if !(1..=12).contains(&month) {
            return Err("the month is not 01 to 12");
        }
        if day < 1 || day > days_in_month(year, month) {
            return Err("the day does not exist in that month");
        }
        match at.next() {
            Some(b'T' | b't') => {}
            _ => return Err("expected `T` between the date and the time"),
        }
        let hour = at.digits(2, "a two-digit hour")?;
        at.expect(b':', "`:` after the hour")?;
        let minute = at.digits(2, "two-digit minutes")?;
        at.expect(b':', "`:` after the minutes")?;
        let second = at.digits(2, "two-digit seconds")?;
        if hour > 23 || minute > 59 || second > 60 {
            return Err("the time of day is out of range");
        }
        let mut micros = 0;
        if at.peek() == Some(b'.') {
            at.i += 1;
            let start = at.i;
            let mut scale = 100_000;
            while let Some(d @ b'0'..=b'9') = at.peek() {
                micros += i64::from(d - b'0') * scale;
                scale /= 10;
                at.i += 1;
            }
            if at.i == start {
                return Err("expected digits after the decimal point");
            }
        }
        let offset_minutes = match at.next() {
            Some(b'Z' | b'z') => 0,
            Some(sign @ (b'+' | b'-')) => {
                let hours = at.digits(2, "a two-digit offset hour")?;
                at.expect(b':', "`:` in the offset")?;
                let minutes = at.digits(2, "two-digit offset minutes")?;
                if hours > 23 || minutes > 59 {
                    return Err("the offset is out of range");
                }
                let offset = hours * 60 + minutes;
                if sign == b'-' { -offset } else { offset }
            }
            _ => return Err("expected an offset: `Z` or `+hh:mm` / `-hh:mm`"),
        };
        if at.i != s.len() {
            return Err("unexpected characters after the offset");
        }
        // A leap second is the last microsecond of its minute: later than every other instant
        // of that minute, and not later than the next minute's first.
        let (second, micros) = if second == 60 {
            (59, MICROS_PER_SECOND - 1)
        } else {
            (second, micros)
        };
        let days = days_from_civil(year, month, day);
        let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
        Ok(seconds * MICROS_PER_SECOND + micros)
    }

    struct Cursor<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Cursor<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.i).copied()
        }

        fn next(&mut self) -> Option<u8> {
            let b = self.peek()?;
            self.i += 1;
            Some(b)
        }

        fn expect(&mut self, want: u8, what: &'static str) -> Result<(), &'static str> {
            match self.next() {
                Some(b) if b == want => Ok(()),
                _ => Err(what),
            }
        }

        fn digits(&mut self, n: usize, what: &'static str) -> Result<i64, &'static str> {
            let mut value = 0;
            for _ in 0..n {
                match self.next() {
                    Some(d @ b'0'..=b'9') => value = value * 10 + i64::from(d - b'0'),
                    _ => return Err(what),
                }
            }
            Ok(value)
        }
    }

    fn is_leap(year: i64) -> bool {
        year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
    }

    fn days_in_month(year: i64, month: i64) -> i64 {
        match month {
            2 if is_leap(year) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
    fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn civil_days() {
            assert_eq!(days_from_civil(1970, 1, 1), 0);
            assert_eq!(days_from_civil(2000, 3, 1), 11_017);
            assert_eq!(days_from_civil(1969, 12, 31), -1);
            assert_eq!(days_from_civil(0, 1, 1), -719_528);
            // Every day of 1600..2400 follows the one before it.
            let mut expected = days_from_civil(1600, 1, 1);
            for year in 1600..2400 {
                for month in 1..=12 {
                    for day in 1..=days_in_month(year, month) {
                        assert_eq!(days_from_civil(year, month, day), expected);
                        expected += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::post("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn timestamps() {
        let ok = [
            ("1970-01-01T00:00:00Z", 0),
            ("1970-01-01T00:00:00.000001Z", 1),
            ("1969-12-31T23:59:59.999999Z", -1),
            ("2024-05-01T14:00:01Z", 1_714_572_001 * S),
            ("2024-05-01t14:00:01z", 1_714_572_001 * S),
            ("2024-05-01T16:00:01+02:00", 1_714_572_001 * S),
            ("2024-05-01T08:30:01-05:30", 1_714_572_001 * S),
            ("2024-05-01T14:00:01-00:00", 1_714_572_001 * S),
            ("2024-05-01T14:00:01.5Z", 1_714_572_001 * S + 500_000),
            (
                "2024-05-01T14:00:01.123456789Z",
                1_714_572_001 * S + 123_456,
            ),
            ("2024-02-29T00:00:00Z", 1_709_164_800 * S),
            ("2000-02-29T00:00:00Z", 951_782_400 * S),
            ("2016-12-31T23:59:60Z", 1_483_228_800 * S - 1),
            ("0000-01-01T00:00:00Z", -62_167_219_200 * S),
            ("9999-12-31T23:59:59Z", 253_402_300_799 * S),
        ];
        for (text, micros) in ok {
            assert_eq!(parse_timestamp(text), Ok(micros), "{text}");
        }
        let bad = [
            "",
            "2024-05-01",
            "2024-05-01T14:00:01",
            "2024-05-01 14:00:01Z",
            "2024-05-01T14:00Z",
            "24-05-01T14:00:01Z",
            "2024-5-01T14:00:01Z",
            "2024-13-01T14:00:01Z",
            "2024-00-01T14:00:01Z",
            "2024-04-31T14:00:01Z",
            "2023-02-29T14:00:01Z",
            "1900-02-29T14:00:01Z",
            "2024-05-00T14:00:01Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T14:60:00Z",
            "2024-05-01T14:00:61Z",
            "2024-05-01T14:00:01.Z",
            "2024-05-01T14:00:01+0200",
            "2024-05-01T14:00:01+24:00",
            "2024-05-01T14:00:01+02:60",
            "2024-05-01T14:00:01Z ",
            " 2024-05-01T14:00:01Z",
            "2024-05-01T14:00:01ZZ",
            "+2024-05-01T14:00:01Z",
            "2024-05-01T14:00:01,5Z",
            "２024-05-01T14:00:01Z",
        ];
        for text in bad {
            assert!(parse_timestamp(text).is_err(), "{text}");
        }
        let err = parse_timestamp("2023-02-29T00:00:00Z").unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn timestamps_order_like_time() {
        let a = parse_timestamp("2024-05-01T14:00:01Z").unwrap();
        let b = parse_timestamp("2024-05-01T14:00:03Z").unwrap();
        let c = parse_timestamp("2024-05-01T16:00:02+02:00").unwrap();
        assert!(a < c && c < b);
        let leap = parse_timestamp("2016-12-31T23:59:60.5Z").unwrap();
        assert!(parse_timestamp("2016-12-31T23:59:59.999Z").unwrap() < leap);
        assert!(leap < parse_timestamp("2017-01-01T00:00:00Z").unwrap());
    }

    #[test]
    fn json_versions() {
        let p = parts(&[]);
        let ex = json("/data/updated");
        let get = |body: &str| ex.extract(&p, Some(body.as_bytes()));
        assert!(ex.reads_body(&p));
        assert_eq!(get(r#"{"data":{"updated":7}}"#), Ok(7));
        assert_eq!(get(r#"{"data":{"updated":-7}}"#), Ok(-7));
        assert_eq!(get(r#"{"data":{"updated":"1970-01-01T00:00:01Z"}}"#), Ok(S));
        assert!(matches!(
            get(r#"{"data":{}}"#),
            Err(KeyError::Missing { .. })
        ));
        assert!(matches!(get("not json"), Err(KeyError::NotJson { .. })));
        for body in [
            r#"{"data":{"updated":1.5}}"#,
            r#"{"data":{"updated":18446744073709551615}}"#,
            r#"{"data":{"updated":"7"}}"#,
            r#"{"data":{"updated":null}}"#,
            r#"{"data":{"updated":true}}"#,
            r#"{"data":{"updated":[]}}"#,
            r#"{"data":{"updated":{}}}"#,
        ] {
            assert!(matches!(get(body), Err(KeyError::Invalid { .. })), "{body}");
        }
    }

    #[test]
    fn header_versions() {
        let ex = header("x-version");
        assert!(!ex.reads_body(&parts(&[])));
        assert_eq!(ex.extract(&parts(&[("x-version", "42")]), None), Ok(42));
        assert_eq!(ex.extract(&parts(&[("x-version", "-3")]), None), Ok(-3));
        assert_eq!(
            ex.extract(&parts(&[("x-version", "1970-01-01T00:00:02Z")]), None),
            Ok(2 * S)
        );
        assert!(matches!(
            ex.extract(&parts(&[]), None),
            Err(KeyError::Missing { .. })
        ));
        for bad in ["+4", " 4", "4.0", "99999999999999999999", "yesterday", "-"] {
            assert!(
                matches!(
                    ex.extract(&parts(&[("x-version", bad)]), None),
                    Err(KeyError::Invalid { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn closures_are_extractors() {
        let ex = |p: &Parts| Ok(p.uri.path().len() as i64);
        assert_eq!(ExtractVersion::extract(&ex, &parts(&[]), None), Ok(1));
        let body = from_body_fn(|_, body| Ok(body.len() as i64));
        assert!(body.reads_body(&parts(&[])));
        assert_eq!(body.extract(&parts(&[]), Some(b"abc")), Ok(3));
    }
}
