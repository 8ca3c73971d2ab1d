//! Reading what the statements answer: durations as database numbers, the claim decision made
//! from the row an upsert returns, and the rows of `describe`, `stuck_claims` and the versions
//! table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::ResultExt as _;
use super::table::TableName;
use crate::key::IdempotencyKey;
use crate::store::inbox::{Attempt, Entry, EntryState};
use crate::store::{
    Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Stale, StoreError,
    StuckClaim, VersionClaim,
};

/// Durations are bound as whole microseconds, capped at about a century: far past any stale
/// limit or retention anyone means, and well inside every backend's date range.
const MAX_MICROS: i64 = 100 * 366 * 24 * 60 * 60 * 1_000_000;

/// `duration` in whole microseconds, for binding; capped at [`MAX_MICROS`].
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).map_or(MAX_MICROS, |us| us.min(MAX_MICROS))
}

/// A number of microseconds read back from the database; negative ages (a clock stepped
/// back) read as zero.
pub(crate) fn duration_from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn count(deliveries: i64) -> u64 {
    u64::try_from(deliveries).unwrap_or(0)
}

/// A row of a SQL store's database, read by column position. The bounds sqlx needs to decode
/// what these rows hold, on any of the three databases, are written once: here.
pub(crate) trait Columns {
    fn text(&self, at: usize) -> Result<String, StoreError>;
    fn int(&self, at: usize) -> Result<i64, StoreError>;
    fn maybe_int(&self, at: usize) -> Result<Option<i64>, StoreError>;
    fn flag(&self, at: usize) -> Result<bool, StoreError>;
    fn maybe_bytes(&self, at: usize) -> Result<Option<&[u8]>, StoreError>;
}

impl<R> Columns for R
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r [u8]: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, at: usize) -> Result<String, StoreError> {
        self.try_get(at).store()
    }

    fn int(&self, at: usize) -> Result<i64, StoreError> {
        self.try_get(at).store()
    }

    fn maybe_int(&self, at: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(at).store()
    }

    fn flag(&self, at: usize) -> Result<bool, StoreError> {
        self.try_get(at).store()
    }

    fn maybe_bytes(&self, at: usize) -> Result<Option<&[u8]>, StoreError> {
        self.try_get(at).store()
    }
}

/// The `receipt` column at `index`, decoded: `None` when it is NULL (a row committed without
/// one, or not done).
fn receipt_at<R: Columns>(row: &R, index: usize) -> Result<Option<Arc<Receipt>>, StoreError> {
    let bytes = row.maybe_bytes(index)?;
    bytes
        .map(|bytes| Receipt::decode(bytes).map(Arc::new))
        .transpose()
}

/// Whether a store's keys come new: its last claim found no row for its key, or the one it
/// inserted. The next claim then inserts first (see each store's round trips). Clones share it.
#[derive(Debug, Clone)]
pub(crate) struct NewKeys(Arc<AtomicBool>);

impl Default for NewKeys {
    /// Keys come new until a claim finds one that does not.
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl NewKeys {
    /// Whether the next key is likely new.
    pub(crate) fn likely(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A claim with `token` found `row` for its key (none: no row).
    pub(crate) fn saw(&self, row: Option<&ClaimRow>, token: LeaseToken) {
        let new = row.is_none_or(|row| LeaseToken::from_i64(row.token) == token);
        self.0.store(new, Ordering::Relaxed);
    }
}

/// The row an upsert left behind (or a claim's follow-up read).
#[derive(Debug)]
pub(crate) struct ClaimRow {
    pub(crate) state: String,
    pub(crate) token: i64,
    pub(crate) deliveries: i64,
    /// Whether the row's latest run took over a stale claim.
    pub(crate) reclaimed: bool,
    /// Microseconds since the row's claim, by the database's clock.
    pub(crate) age_us: i64,
    /// Microseconds since the claim was last renewed (or taken).
    pub(crate) idle_us: i64,
    /// What the run that committed the row kept for its duplicates.
    pub(crate) receipt: Option<Arc<Receipt>>,
}

impl ClaimRow {
    /// Reads the seven columns `state, token, deliveries, reclaimed, age_us, idle_us,
    /// receipt`.
    pub(crate) fn read<R: Columns>(row: &R) -> Result<Self, StoreError> {
        Ok(Self {
            state: row.text(0)?,
            token: row.int(1)?,
            deliveries: row.int(2)?,
            reclaimed: row.flag(3)?,
            age_us: row.int(4)?,
            idle_us: row.int(5)?,
            receipt: receipt_at(row, 6)?,
        })
    }

    /// The row a claim with `token` has just inserted: in flight, its first delivery and run.
    #[cfg(feature = "_sql")]
    pub(crate) fn inserted(token: LeaseToken) -> Self {
        Self {
            state: "processing".to_owned(),
            token: token.to_i64(),
            deliveries: 1,
            reclaimed: false,
            age_us: 0,
            idle_us: 0,
            receipt: None,
        }
    }

    /// What the claim answers. The upsert wrote `ours` if and only if it inserted the row or
    /// took it over (released, or stale under reclaim).
    pub(crate) fn into_claim(
        self,
        key: &IdempotencyKey,
        ours: LeaseToken,
        stale: Stale,
    ) -> Result<Claim, StoreError> {
        if LeaseToken::from_i64(self.token) == ours {
            return Ok(Claim::Acquired(
                Lease::new(key.clone(), ours, self.reclaimed)
                    .with_deliveries(count(self.deliveries)),
            ));
        }
        self.answer(stale)
    }

    /// What a claim that did not take the row answers: done, or in flight (held, when stale
    /// under a holding policy).
    pub(crate) fn answer(self, stale: Stale) -> Result<Claim, StoreError> {
        let deliveries = count(self.deliveries);
        match KeyState::parse(&self.state) {
            Some(KeyState::Done) => Ok(Claim::Done(
                Completed::new(deliveries).with_receipt(self.receipt),
            )),
            Some(KeyState::Processing) => Ok(stale.pending(
                duration_from_micros(self.age_us),
                duration_from_micros(self.idle_us),
                deliveries,
            )),
            _ => Err(StoreError::backend(format!(
                "unexpected state {:?} in the idempotency table after a claim",
                self.state
            ))),
        }
    }
}

/// Reads a [`KeyRecord`] from the ten columns of a describe statement: `state, deliveries,
/// runs, reclaimed`, then the ages in microseconds of the first and last delivery, the claim,
/// the last renewal and the settlement (the last two may be NULL), and last the receipt.
pub(crate) fn key_record<R: Columns>(row: &R) -> Result<KeyRecord, StoreError> {
    let state = row.text(0)?;
    let state = KeyState::parse(&state).ok_or_else(|| {
        StoreError::backend(format!(
            "unexpected state {state:?} in the idempotency table"
        ))
    })?;
    let age = |i: usize| -> Result<Duration, StoreError> {
        Ok(duration_from_micros(row.maybe_int(i)?.unwrap_or(0)))
    };
    Ok(
        KeyRecord::new(state, count(row.int(1)?), count(row.int(2)?))
            .with_reclaimed(row.flag(3)?)
            .with_seen(age(4)?, age(5)?)
            .with_times(age(6)?, age(7)?, age(8)?)
            .with_receipt(receipt_at(row, 9)?),
    )
}

/// A stale policy under which no claim is ever stale: transactional mode has no stale claims.
#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
pub(crate) const NEVER_STALE: Stale = Stale::reclaim_after(Duration::MAX);

/// A row of [`Store::stuck_claims`](super::Store::stuck_claims).
pub(crate) fn stuck_claim(
    namespace: String,
    key: String,
    deliveries: i64,
    age_us: i64,
    idle_us: i64,
) -> Result<StuckClaim, StoreError> {
    let key = IdempotencyKey::new(namespace, key).map_err(StoreError::backend)?;
    Ok(StuckClaim::new(
        key,
        duration_from_micros(age_us),
        duration_from_micros(idle_us),
        count(deliveries),
    ))
}

/// Logs a `processing` row that [`Store::stuck_claims`](super::Store::stuck_claims) skips
/// because it cannot read it: its namespace and key (when they are text at all) are no valid
/// [`IdempotencyKey`], or a column has an unexpected type.
pub(crate) fn undecodable_stuck_row(
    table: &TableName,
    namespace: Option<String>,
    key: Option<String>,
    error: &StoreError,
) {
    tracing::error!(
        table = %table.name(),
        namespace = ?namespace,
        key = ?key,
        error = error as &dyn std::error::Error,
        "skipping a processing row that is not a valid claim; fix or delete it by hand"
    );
}

/// A versions row as `begin_version` left it: applied version, pending version, pending token,
/// and the pending version's age in microseconds by the database's clock.
pub(crate) type VersionRow = (Option<i64>, Option<i64>, Option<i64>, Option<i64>);

/// What `begin_version` answers, from the row it left (or read). `Ok(None)`: the row says
/// nothing is pending, the version is not older and yet it is not ours: start over.
pub(crate) fn version_claim(
    entity: &IdempotencyKey,
    version: i64,
    ours: LeaseToken,
    stale: Stale,
    (applied, pending_version, pending_token, age_us): VersionRow,
) -> Option<VersionClaim> {
    let pending = pending_version.zip(pending_token).map(|(version, token)| {
        let age = duration_from_micros(age_us.unwrap_or(0));
        (version, LeaseToken::from_i64(token), age)
    });
    crate::store::decide(entity, version, ours, stale, applied, pending)
}

/// Reads a [`VersionRow`] from the first four columns.
pub(crate) fn version_row<R: Columns>(row: &R) -> Result<VersionRow, StoreError> {
    Ok((
        row.maybe_int(0)?,
        row.maybe_int(1)?,
        row.maybe_int(2)?,
        row.maybe_int(3)?,
    ))
}

/// A count of attempts or crashes read back; a negative one (written by hand) reads as zero.
fn attempts(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// The state an inbox row holds.
pub(crate) fn entry_state(text: &str) -> Result<EntryState, StoreError> {
    EntryState::parse(text)
        .ok_or_else(|| StoreError::backend(format!("unexpected state {text:?} in the inbox table")))
}

fn inbox_key(namespace: String, key: String) -> Result<IdempotencyKey, StoreError> {
    IdempotencyKey::new(namespace, key).map_err(StoreError::backend)
}

/// An inbox entry as operators see it, from the ten columns every SQL inbox's `entries` and
/// `entry` answer: `namespace, key, state, attempts, crashes` (counts as 64-bit integers), the
/// microseconds since it was received, until it is due (NULL unless queued) and since its
/// last renewal (NULL unless running), whether the request is kept (0 or 1), the history.
pub(crate) fn inbox_entry<R: Columns>(row: &R) -> Result<Entry, StoreError> {
    let micros_at = |i: usize| -> Result<Option<Duration>, StoreError> {
        Ok(row.maybe_int(i)?.map(duration_from_micros))
    };
    let history = row.maybe_bytes(9)?;
    let has_request = row.int(8)?;
    Ok(Entry::new(
        inbox_key(row.text(0)?, row.text(1)?)?,
        entry_state(&row.text(2)?)?,
        attempts(row.int(3)?),
        attempts(row.int(4)?),
        micros_at(5)?.unwrap_or_default(),
        micros_at(6)?,
        micros_at(7)?,
        has_request != 0,
        Attempt::decode_history(history.unwrap_or_default())?,
    ))
}

/// What a take answers for one entry it leased, from the nine columns a take returns
/// (PostgreSQL's, SQLite's): `namespace, key, token, attempts, crashes`, whether it was taken
/// over after a crash, the request, the history, and when it was received (microseconds since
/// the Unix epoch). The attempt is the next: the take does not count it.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn taken_entry<R: Columns>(
    row: &R,
) -> Result<
    Result<crate::store::inbox::Taken, crate::store::inbox::unreadable::Unreadable>,
    StoreError,
> {
    let key = inbox_key(row.text(0)?, row.text(1)?)?;
    let token = LeaseToken::from_i64(row.int(2)?);
    Ok(crate::store::inbox::unreadable::taken(
        Lease::new(key, token, row.flag(5)?),
        row.maybe_bytes(6)?,
        attempts(row.int(3)?).saturating_add(1),
        attempts(row.int(4)?),
        std::time::UNIX_EPOCH + duration_from_micros(row.int(8)?),
        row.maybe_bytes(7)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(micros(Duration::from_millis(300)), 300_000);
        assert_eq!(micros(Duration::MAX), MAX_MICROS);
        assert_eq!(duration_from_micros(-5), Duration::ZERO);
        assert_eq!(duration_from_micros(1_500), Duration::from_micros(1_500));
    }

    const PROCESSING: &str = "processing";
    const DONE: &str = "done";

    #[test]
    fn claim_decision() {
        let key = IdempotencyKey::new("ns", "k").unwrap();
        let ours = LeaseToken::generate();
        let other = LeaseToken::generate().to_i64();
        let stale = Stale::hold_after(Duration::from_secs(1));
        let row = |state: &str, token, deliveries, reclaimed, age_us, idle_us| ClaimRow {
            state: state.to_owned(),
            token,
            deliveries,
            reclaimed,
            age_us,
            idle_us,
            receipt: None,
        };
        match row(PROCESSING, ours.to_i64(), 1, false, 0, 0).into_claim(&key, ours, stale) {
            Ok(Claim::Acquired(lease)) => assert!(!lease.reclaimed()),
            other => panic!("{other:?}"),
        }
        match row(PROCESSING, ours.to_i64(), 4, true, 0, 0).into_claim(&key, ours, stale) {
            Ok(Claim::Acquired(lease)) => assert!(lease.reclaimed()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            row(DONE, other, 3, false, 9, 9)
                .into_claim(&key, ours, stale)
                .unwrap(),
            Claim::Done(Completed::new(3))
        );
        let receipt = Arc::new(Receipt::new(
            Some(crate::store::Fingerprint::from_bytes([1; 32])),
            None,
        ));
        let kept = ClaimRow {
            receipt: Some(receipt.clone()),
            ..row(DONE, other, 5, false, 9, 9)
        };
        assert_eq!(
            kept.into_claim(&key, ours, stale).unwrap(),
            Claim::Done(Completed::new(5).with_receipt(Some(receipt))),
            "a done row answers its receipt"
        );
        assert!(matches!(
            row(PROCESSING, other, 2, false, 10, 5).into_claim(&key, ours, stale),
            Ok(Claim::InFlight(p)) if p.deliveries == 2
                && p.age == Duration::from_micros(10)
                && p.since_renewal == Duration::from_micros(5)
        ));
        // Old, but renewed recently: not stale.
        assert!(matches!(
            row(PROCESSING, other, 2, false, 5_000_000, 10).into_claim(&key, ours, stale),
            Ok(Claim::InFlight(_))
        ));
        assert!(matches!(
            row(PROCESSING, other, 2, false, 2_000_000, 2_000_000).into_claim(&key, ours, stale),
            Ok(Claim::Held(_))
        ));
        for weird in ["weird", "released"] {
            assert!(
                row(weird, other, 2, false, 0, 0)
                    .into_claim(&key, ours, stale)
                    .is_err()
            );
        }
    }
}
