//! Signed timestamps against this machine's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::VerifyError;

/// A Unix timestamp in whole seconds.
pub(crate) fn seconds(text: &str) -> Result<i64, VerifyError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::malformed(
            "the timestamp is not a number of seconds",
        ));
    }
    text.parse()
        .map_err(|_| VerifyError::malformed("the timestamp is out of range"))
}

/// Refuses a timestamp further than `tolerance` from `now`, in either direction.
pub(crate) fn fresh(
    timestamp: i64,
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(since) => i128::from(since.as_secs()),
        Err(before) => -i128::from(before.duration().as_secs()),
    };
    let skew = (now - i128::from(timestamp)).unsigned_abs();
    if skew > u128::from(tolerance.as_secs()) {
        return Err(VerifyError::Expired {
            skew_secs: u64::try_from(skew).unwrap_or(u64::MAX),
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        let five = Duration::from_secs(300);
        assert!(fresh(1000, at(1300), five).is_ok());
        assert!(fresh(1300, at(1000), five).is_ok(), "skew into the future");
        assert_eq!(
            fresh(1000, at(1301), five),
            Err(VerifyError::Expired {
                skew_secs: 301,
                tolerance_secs: 300
            })
        );
        assert!(fresh(i64::MAX, at(0), five).is_err());
        assert!(seconds("-5").is_err());
        assert!(seconds("99999999999999999999999").is_err());
    }
}
