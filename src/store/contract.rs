//! The [`Store`] trait: what every backend implements, and a small complete one in its docs.

use std::future::Future;
use std::time::Duration;

use super::{Claim, KeyRecord, Lease, Receipt, Resolution, Stale, StoreError, StuckClaim};
use crate::key::IdempotencyKey;

/// A storage backend for claims.
///
/// Futures are `Send`, so the layer works on multi-threaded runtimes. The [module
/// documentation](crate::store#the-contract-every-backend-keeps) states the contract; the conformance
/// suite in the crate's `tests/` checks it for every backend.
///
/// A store for a database this crate does not cover implements these ten methods; none has a
/// default, so that no feature is turned off by leaving one out. A small complete one, over a
/// map in memory (each method is one atomic step under the lock, as each would be one
/// conditional statement in a database):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::{Duration, Instant};
///
/// use tower_idempotency::IdempotencyKey;
/// use tower_idempotency::store::{
///     Claim, Completed, KeyRecord, KeyState, Lease, LeaseToken, Receipt, Resolution, Stale,
///     StalePolicy, Store, StoreError, StuckClaim,
/// };
///
/// struct Row { state: KeyState, token: LeaseToken, claimed: Instant, renewed: Instant,
///              settled: Instant, first_seen: Instant, last_seen: Instant, deliveries: u64, runs: u64,
///              receipt: Option<Arc<Receipt>> }
///
/// #[derive(Clone, Default)]
/// struct MapStore(Arc<Mutex<HashMap<IdempotencyKey, Row>>>);
///
/// impl MapStore {
///     /// Runs `change` on the leased row if the lease still holds.
///     fn leased(&self, lease: &Lease, change: impl FnOnce(&mut Row)) -> Result<(), StoreError> {
///         let mut rows = self.0.lock().unwrap();
///         match rows.get_mut(lease.key()) {
///             Some(row) if row.token == lease.token() && row.state == KeyState::Processing => {
///                 change(row);
///                 Ok(())
///             }
///             // Releasing twice with one lease is `Ok`, as the contract says.
///             Some(row) if row.token == lease.token() && row.state == KeyState::Released => Ok(()),
///             _ => Err(StoreError::LeaseLost),
///         }
///     }
/// }
///
/// impl Store for MapStore {
///     async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
///         let (now, token) = (Instant::now(), LeaseToken::generate());
///         let mut rows = self.0.lock().unwrap();
///         let fresh = Row { state: KeyState::Processing, token, claimed: now, renewed: now,
///                           settled: now, first_seen: now, last_seen: now, deliveries: 0, runs: 0,
///                           receipt: None };
///         let row = rows.entry(key.clone()).or_insert(fresh);
///         (row.deliveries, row.last_seen) = (row.deliveries + 1, now);
///         let silent = now - row.renewed;
///         let take_over = match row.state {
///             KeyState::Done => {
///                 let done = Completed::new(row.deliveries).with_receipt(row.receipt.clone());
///                 return Ok(Claim::Done(done));
///             }
///             KeyState::Released => Some(false),
///             KeyState::Processing if row.token == token => Some(false), // just inserted
///             KeyState::Processing
///                 if stale.policy() == StalePolicy::Reclaim && stale.is_stale(silent) => Some(true),
///             _ => None,
///         };
///         let Some(reclaimed) = take_over else {
///             return Ok(stale.pending(now - row.claimed, silent, row.deliveries));
///         };
///         (row.state, row.token, row.claimed, row.renewed) = (KeyState::Processing, token, now, now);
///         row.runs += 1;
///         let lease = Lease::new(key.clone(), token, reclaimed).with_deliveries(row.deliveries);
///         Ok(Claim::Acquired(lease))
///     }
///
///     async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| row.renewed = Instant::now())
///     }
///
///     async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| (row.state, row.settled) = (KeyState::Done, Instant::now()))
///     }
///
///     async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
///         // Kept with the row, in the same step: later claims answer it (response replay, the
///         // fingerprint that tells a reused key).
///         let receipt = Some(Arc::new(receipt.clone()));
///         self.leased(lease, |row| {
///             (row.state, row.settled, row.receipt) = (KeyState::Done, Instant::now(), receipt)
///         })
///     }
///
///     async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
///         self.leased(lease, |row| (row.state, row.settled) = (KeyState::Released, Instant::now()))
///     }
///
///     async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
///         // Only a `processing` row gets here (see `leased`): the run is taken back once.
///         self.leased(lease, |row| {
///             (row.state, row.settled) = (KeyState::Released, Instant::now());
///             row.runs -= 1;
///         })
///     }
///
///     async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
///         let now = Instant::now();
///         Ok(self.0.lock().unwrap().get(key).map(|row| {
///             KeyRecord::new(row.state, row.deliveries, row.runs)
///                 .with_seen(now - row.first_seen, now - row.last_seen)
///                 .with_times(now - row.claimed, now - row.renewed, now - row.settled)
///                 .with_receipt(row.receipt.clone())
///         }))
///     }
///
///     async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
///         let now = Instant::now();
///         let rows = self.0.lock().unwrap();
///         let mut stuck: Vec<_> = rows
///             .iter()
///             .filter(|(_, row)| row.state == KeyState::Processing && now - row.renewed >= older_than)
///             .map(|(key, row)| {
///                 StuckClaim::new(key.clone(), now - row.claimed, now - row.renewed, row.deliveries)
///             })
///             .collect();
///         stuck.sort_by(|a, b| b.since_renewal.cmp(&a.since_renewal));
///         Ok(stuck)
///     }
///
///     async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
///         let mut rows = self.0.lock().unwrap();
///         let Some(row) = rows.get_mut(key).filter(|row| row.state == KeyState::Processing) else {
///             return Ok(false);
///         };
///         row.state = match how {
///             Resolution::Done => KeyState::Done,
///             Resolution::Release => KeyState::Released,
///         };
///         row.settled = Instant::now();
///         Ok(true)
///     }
///
///     async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
///         let now = Instant::now();
///         let mut rows = self.0.lock().unwrap();
///         let before = rows.len();
///         rows.retain(|_, row| row.state == KeyState::Processing || now - row.settled < older_than);
///         Ok((before - rows.len()) as u64)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::replay::Replay;
/// use tower_idempotency::{IdempotencyLayer, key};
///
/// let store = MapStore::default();
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(store.clone()).key(key::github()))
///     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
/// let delivery = || Request::post("/hook").header("x-github-delivery", "d-1").body(String::new()).unwrap();
/// svc.clone().oneshot(delivery()).await.unwrap();
/// let again = svc.oneshot(delivery()).await.unwrap();
/// assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
///
/// let stored = IdempotencyKey::new("github", "d-1").unwrap(); // no router, so no scope
/// let record = store.describe(&stored).await.unwrap().unwrap();
/// assert_eq!((record.state, record.deliveries, record.runs), (KeyState::Done, 2, 1));
///
/// // With response replay, a duplicate gets the first answer back, from the receipt the store
/// // kept with `commit_with`.
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(store.clone()).key(key::github()).replay(Replay::new()))
///     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new("paid".to_owned())) }));
/// let delivery = || Request::post("/hook").header("x-github-delivery", "d-2").body(String::new()).unwrap();
/// svc.clone().oneshot(delivery()).await.unwrap();
/// let again = svc.oneshot(delivery()).await.unwrap();
/// assert_eq!(again.headers()["idempotent-replayed"], "true");
/// let stored = IdempotencyKey::new("github", "d-2").unwrap();
/// let record = store.describe(&stored).await.unwrap().unwrap();
/// assert_eq!(record.receipt.unwrap().response.as_ref().unwrap().body, "paid");
/// # }
/// ```
///
/// The conformance suite (`tower_idempotency::conformance`, feature `conformance`) runs the
/// same checks against every backend; a new store runs it with `conformance_suite!`.
pub trait Store: Send + Sync + 'static {
    /// Tries to claim `key` for this delivery, counting the delivery. One atomic step.
    fn claim(
        &self,
        key: &IdempotencyKey,
        stale: Stale,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Moves the leased claim's heartbeat to now, if the lease still holds: the claim is not
    /// stale for another stale limit.
    fn renew(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the leased key `done`, if the lease still holds.
    fn commit(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the leased key `done` as [`commit`](Self::commit) does, and keeps `receipt` with
    /// it: the request's fingerprint and the response of [response replay](crate::replay),
    /// which later claims of the key answer in [`Completed::receipt`](crate::store::Completed::receipt) (and
    /// [`describe`](Self::describe) in [`KeyRecord::receipt`]).
    ///
    /// The receipt is written in the same atomic step as the `done` state, under the same
    /// lease check, and answered as written (a store may keep it encoded with
    /// [`Receipt::encode`]). A store that dropped it would silently turn replay and reuse
    /// detection off, so there is no default.
    fn commit_with(
        &self,
        lease: &Lease,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the leased `processing` row `released`, if the lease still holds, so the next
    /// delivery runs the handler again. Releasing a row this lease released already is `Ok`.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back a claim whose handler never started (its delivery went away while the claim
    /// was on its way, or the claim's answer was lost): as [`release`](Self::release), and
    /// the run the claim counted is taken back, so that [`KeyRecord::runs`] counts only the
    /// runs a handler started. An operator reads that count to decide what a held claim
    /// needs. Giving back twice with one lease is `Ok` and takes the run back once.
    fn give_back(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What the store knows of `key`: its state, how many deliveries arrived and how many runs
    /// started, and when. `None` for a key it has never seen (or purged). Writes nothing.
    fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<KeyRecord>, StoreError>> + Send;

    /// Lists `processing` rows whose owner has not renewed them for at least `older_than`,
    /// longest silent first: claims whose owner probably died, and claims held for a person.
    ///
    /// A row the SQL stores cannot read as a claim (written by other code, with a namespace or
    /// key that is no valid [`IdempotencyKey`]) is left out and logged at `ERROR` with its
    /// table, namespace and key; the other rows are listed as usual.
    fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<Vec<StuckClaim>, StoreError>> + Send;

    /// Settles a `processing` row by hand, whoever holds it. Answers whether there was such
    /// a row.
    fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes `done` and `released` rows settled at least `older_than` ago; answers how many.
    /// Keep rows longer than any sender retries ([`DEFAULT_RETENTION`](super::DEFAULT_RETENTION)).
    fn purge_completed(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
