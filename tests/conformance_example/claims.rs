//! The claims: `Store` over the `claims` table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_idempotency::IdempotencyKey;
use tower_idempotency::store::{
    Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale,
    StalePolicy, Store, StoreError, StuckClaim,
};

use super::{MapStore, lock};

/// One key's row.
pub(super) struct Row {
    state: KeyState,
    token: LeaseToken,
    deliveries: u64,
    runs: u64,
    reclaimed: bool,
    /// Whether the current run was given back (its run taken back already).
    given_back: bool,
    receipt: Option<Arc<Receipt>>,
    first_seen: Instant,
    last_seen: Instant,
    claimed: Instant,
    renewed: Instant,
    settled: Instant,
}

impl MapStore {
    /// Runs `change` on the lease's row if the lease is that row's current one.
    fn leased<T>(
        &self,
        lease: &Lease,
        change: impl FnOnce(&mut Row) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut rows = lock(&self.claims);
        match rows.get_mut(lease.key()) {
            Some(row) if row.token == lease.token() => change(row),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// Settles the leased `processing` row as done, keeping `receipt`; a row this lease
    /// committed already stays as it is.
    fn settle_done(&self, lease: &Lease, receipt: Option<&Receipt>) -> Result<(), StoreError> {
        self.leased(lease, |row| match row.state {
            KeyState::Processing => {
                row.state = KeyState::Done;
                row.settled = Instant::now();
                row.receipt = receipt.map(|receipt| Arc::new(receipt.clone()));
                Ok(())
            }
            KeyState::Done => Ok(()),
            _ => Err(StoreError::LeaseLost),
        })
    }
}

impl Store for MapStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        let (now, token) = (Instant::now(), LeaseToken::generate());
        let mut rows = lock(&self.claims);
        let row = rows.entry(key.clone()).or_insert(Row {
            state: KeyState::Released,
            token,
            deliveries: 0,
            runs: 0,
            reclaimed: false,
            given_back: false,
            receipt: None,
            first_seen: now,
            last_seen: now,
            claimed: now,
            renewed: now,
            settled: now,
        });
        row.deliveries += 1;
        row.last_seen = now;
        let silent = now - row.renewed;
        let reclaimed = match row.state {
            KeyState::Done => {
                return Ok(Claim::Done(
                    Completed::new(row.deliveries).with_receipt(row.receipt.clone()),
                ));
            }
            KeyState::Processing
                if stale.policy() == StalePolicy::Reclaim && stale.is_stale(silent) =>
            {
                true
            }
            KeyState::Processing => {
                return Ok(stale.pending(now - row.claimed, silent, row.deliveries));
            }
            // Released (and a new row): free.
            _ => false,
        };
        row.state = KeyState::Processing;
        row.token = token;
        row.runs += 1;
        row.reclaimed = reclaimed;
        row.given_back = false;
        row.receipt = None;
        (row.claimed, row.renewed) = (now, now);
        Ok(Claim::Acquired(
            Lease::new(key.clone(), token, reclaimed).with_deliveries(row.deliveries),
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.leased(lease, |row| match row.state {
            KeyState::Processing => {
                row.renewed = Instant::now();
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        })
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        self.settle_done(lease, None)
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        self.settle_done(lease, Some(receipt))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.leased(lease, |row| match row.state {
            KeyState::Processing => {
                row.state = KeyState::Released;
                row.settled = Instant::now();
                Ok(())
            }
            KeyState::Released => Ok(()),
            _ => Err(StoreError::LeaseLost),
        })
    }

    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.leased(lease, |row| match row.state {
            KeyState::Processing => {
                row.state = KeyState::Released;
                row.settled = Instant::now();
                row.runs -= 1;
                row.given_back = true;
                Ok(())
            }
            KeyState::Released if row.given_back => Ok(()),
            _ => Err(StoreError::LeaseLost),
        })
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        let now = Instant::now();
        Ok(lock(&self.claims).get(key).map(|row| {
            KeyRecord::new(row.state, row.deliveries, row.runs)
                .with_reclaimed(row.reclaimed)
                .with_receipt(row.receipt.clone())
                .with_seen(now - row.first_seen, now - row.last_seen)
                .with_times(now - row.claimed, now - row.renewed, now - row.settled)
        }))
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        let now = Instant::now();
        let rows = lock(&self.claims);
        let mut stuck: Vec<_> = rows
            .iter()
            .filter(|(_, row)| row.state == KeyState::Processing && now - row.renewed >= older_than)
            .map(|(key, row)| {
                StuckClaim::new(
                    key.clone(),
                    now - row.claimed,
                    now - row.renewed,
                    row.deliveries,
                )
            })
            .collect();
        stuck.sort_by_key(|claim| std::cmp::Reverse(claim.since_renewal));
        Ok(stuck)
    }

    async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
        let mut rows = lock(&self.claims);
        let Some(row) = rows
            .get_mut(key)
            .filter(|row| row.state == KeyState::Processing)
        else {
            return Ok(false);
        };
        row.state = match how {
            Resolution::Done => KeyState::Done,
            Resolution::Release => KeyState::Released,
        };
        row.settled = Instant::now();
        Ok(true)
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut rows = lock(&self.claims);
        let before = rows.len();
        rows.retain(|_, row| row.state == KeyState::Processing || now - row.settled < older_than);
        Ok((before - rows.len()) as u64)
    }
}
