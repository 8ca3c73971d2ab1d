//! RFC 3339 timestamps, read strictly into microseconds since the Unix epoch.
//!
//! Shared by the version guard (a delivery's version may be the time of the change) and by
//! signature verification (Twitch signs an RFC 3339 timestamp). Public as
//! [`version_guard::version::parse_timestamp`](crate::version_guard::version::parse_timestamp).

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
}
