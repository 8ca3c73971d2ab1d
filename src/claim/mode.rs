//! Claim-then-commit, the layer's main mode: claim the key, run the handler, then commit or
//! release.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::body::{BoxError, RequestBody, ResponseBody};
use crate::engine::mode::{
    Configured, HeldHook, LeaseGuard, Mode, Owner, Ran, Refusal, Rejection, Settings, Settle,
    Ticket, acquire, find_key, record, run, wait,
};
use crate::journal::{Journal, attempt_of};
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::replay::{Capture, Keeper, Replay, RequestFingerprint};
use crate::response::Outcome;
use crate::store::{Claim, Completed, Fingerprint, Lease, Receipt, Stale, Store, StoreError};

/// Claim-then-commit as a mode of the service shell: what an
/// [`Idempotency`](super::Idempotency) service does with each delivery, and the settings it
/// does it with. Made by [`IdempotencyLayer`](crate::IdempotencyLayer).
#[derive(Debug)]
pub struct ClaimMode<St, K = Auto> {
    pub(crate) store: St,
    pub(crate) key: K,
    pub(crate) settings: Settings,
    pub(crate) claims: ClaimSettings,
    /// What replay stores, and how: made once from the settings, for every delivery.
    pub(crate) capture: Option<Arc<Capture>>,
}

impl<St, K> ClaimMode<St, K> {
    pub(crate) fn new(store: St, key: K, settings: Settings, claims: ClaimSettings) -> Self {
        let capture = claims.replay.as_ref().map(|replay| {
            Arc::new(Capture {
                replay: replay.clone(),
                fingerprint: claims.fingerprint.clone(),
                timeout: settings.body_timeout,
            })
        });
        Self {
            store,
            key,
            settings,
            claims,
            capture,
        }
    }
}

/// What claim-then-commit finds of a delivery: its key, the request's fingerprint when the
/// layer takes one, and the sender's attempt when the layer journals.
pub(crate) struct Found {
    key: IdempotencyKey,
    // Boxed: a fingerprint held across the claim costs deliveries without one nothing.
    fingerprint: Option<Box<Fingerprint>>,
    attempt: Option<u32>,
}

impl<S, St, K, B, ResB> Mode<S, B, ResB> for ClaimMode<St, K>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    K: ExtractKey,
    B: Body + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Found = Found;
    type Held = LeaseGuard<Self>;

    fn reads_body(&self, parts: &Parts) -> bool {
        let fingerprints = self.claims.fingerprint.as_deref();
        self.key.reads_body(parts) || fingerprints.is_some_and(RequestFingerprint::reads_body)
    }

    fn find(&self, parts: &Parts, body: Option<&Bytes>) -> Result<Option<Found>, Rejection> {
        let Some(key) = find_key(&self.key, &self.settings, parts, body)? else {
            return Ok(None);
        };
        let whole = body.map_or(&[][..], |body| &body[..]);
        let fingerprint = self.claims.fingerprint.as_deref();
        Ok(Some(Found {
            key,
            fingerprint: fingerprint.map(|f| Box::new(f.of(parts, Some(whole)))),
            attempt: self.claims.journal.as_ref().and_then(|_| attempt_of(parts)),
        }))
    }

    async fn claim(self: Arc<Self>, found: &Found, entry: Ticket) -> Result<Self::Held, Refusal> {
        let mut guard =
            claim_or_wait(&self, &found.key, found.fingerprint.as_deref(), entry).await?;
        if let Some(fingerprint) = &found.fingerprint {
            guard.fingerprint(**fingerprint);
        }
        Ok(guard)
    }

    fn run(
        self: Arc<Self>,
        held: LeaseGuard<Self>,
        inner: S,
        request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static {
        let keep = self.capture.clone().map(Keeper);
        run(held, inner, request, keep)
    }

    fn record(&self, found: &Found, outcome: Outcome) {
        record(&found.key, None, None, outcome);
    }

    fn answered(&self, found: Found, res: &mut Response<ResponseBody<ResB>>) {
        if let (Some(journal), Some(outcome)) = (&self.claims.journal, res.extensions().get()) {
            journal.record(&found.key, *outcome, found.attempt);
        }
        // A delivery that ran is recorded by its run (before its settlement), whatever its
        // sender heard: the others, by how they were answered.
        #[cfg(feature = "ledger")]
        if let (Some(ledger), Some(outcome)) = (&self.claims.ledger, res.extensions().get())
            && !matches!(
                outcome,
                Outcome::Processed | Outcome::Released | Outcome::LeaseLost
            )
        {
            ledger.record(crate::ledger::Record {
                key: found.key.clone(),
                at: std::time::SystemTime::now(),
                event: crate::ledger::Event::Delivery {
                    number: None,
                    outcome: *outcome,
                    replay: false,
                },
            });
        }
        res.extensions_mut().insert(found.key);
    }
}

/// Claims a delivery's key: the guard of a granted claim, or the layer's own answer
/// (duplicate, in flight, held, store unavailable); with `.wait_in_flight(..)`, a claim in
/// flight is waited for and claimed again.
async fn claim_or_wait<St: Store, K: ExtractKey>(
    owner: &Arc<ClaimMode<St, K>>,
    key: &IdempotencyKey,
    fingerprint: Option<&Fingerprint>,
    entry: Ticket,
) -> Result<LeaseGuard<ClaimMode<St, K>>, Refusal> {
    let settings = &owner.settings;
    let mut claimed = claim_once(owner, key, entry).await;
    if let (Ok(Claimed::InFlight(_)), Some(wait)) = (&claimed, owner.claims.wait_in_flight) {
        let until = crate::body::later(tokio::time::Instant::now(), wait);
        let (stale, timeout) = (owner.claims.stale, settings.store_timeout);
        if wait::settled(&owner.store, &settings.drain, key, stale, timeout, until).await {
            claimed = match settings.drain.enter() {
                Some(entry) => claim_once(owner, key, entry).await,
                None => return Err(Refusal::Draining),
            };
        }
    }
    let guard = match claimed {
        Ok(Claimed::Acquired(guard)) => guard,
        Ok(Claimed::Done(done)) => return Err(duplicate(owner, fingerprint, &done)),
        Ok(Claimed::InFlight(pending)) => {
            tracing::trace!(age = ?pending.age, deliveries = pending.deliveries, "claim in flight");
            return Err(Refusal::InFlight(
                "another delivery of this event is being processed; retry later",
            ));
        }
        Ok(Claimed::Held(pending)) => {
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                age = ?pending.age,
                since_renewal = ?pending.since_renewal,
                deliveries = pending.deliveries,
                "stale claim held for review: resolve it with Store::resolve",
            );
            if let Some(HeldHook(hook)) = &owner.claims.on_held {
                hook(key, &pending);
            }
            return Err(Refusal::Held(
                "an earlier delivery of this event did not finish; it is held for review",
            ));
        }
        Err(error) => {
            tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "claim failed; the handler does not run",
            );
            return Err(Refusal::StoreUnavailable);
        }
    };
    let lease = guard.lease();
    if lease.reclaimed() {
        tracing::warn!(
            namespace = key.namespace(),
            key = key.value(),
            lease = %lease.token(),
            "reclaimed a stale claim: the earlier delivery's owner stopped renewing it, and may \
             or may not have done its work",
        );
    }
    Ok(guard)
}

/// The answer to a duplicate of a done key: 422 if it reuses the key for another request,
/// the stored answer if there is one to replay, else the plain 200.
fn duplicate<St, K>(
    owner: &ClaimMode<St, K>,
    fingerprint: Option<&Fingerprint>,
    done: &Completed,
) -> Refusal {
    let receipt = done.receipt.as_deref();
    let kept = receipt.and_then(|receipt| receipt.fingerprint.as_ref());
    if let (Some(ours), Some(kept)) = (fingerprint, kept)
        && ours != kept
    {
        tracing::debug!(
            deliveries = done.deliveries,
            "key reused for another request; answered 422"
        );
        return Refusal::Own(Box::new(crate::replay::key_reused()));
    }
    let stored = receipt.and_then(|receipt: &Receipt| receipt.response.as_ref());
    if let (Some(_), Some(stored)) = (&owner.claims.replay, stored) {
        tracing::trace!(
            deliveries = done.deliveries,
            "duplicate answered with its stored answer"
        );
        return Refusal::Own(Box::new(crate::replay::replayed(stored)));
    }
    tracing::trace!(
        deliveries = done.deliveries,
        "duplicate of a processed event"
    );
    Refusal::Duplicate
}

/// What a claim answered, with a granted claim already under its guard.
enum Claimed<St: Store, K: ExtractKey> {
    Acquired(LeaseGuard<ClaimMode<St, K>>),
    Done(Completed),
    InFlight(crate::store::Pending),
    Held(crate::store::Pending),
}

/// Claims `key` within the store timeout (see [`acquire`]); `entry` counts the delivery in
/// the drain.
async fn claim_once<St: Store, K: ExtractKey>(
    owner: &Arc<ClaimMode<St, K>>,
    key: &IdempotencyKey,
    entry: Ticket,
) -> Result<Claimed<St, K>, StoreError> {
    let mode = owner.clone();
    let key = key.clone();
    let claiming = async move {
        let claim = mode.store.claim(&key, mode.claims.stale).await?;
        Ok(match claim {
            Claim::Acquired(lease) => Claimed::Acquired(LeaseGuard::claimed(mode, lease, entry)),
            Claim::Done(done) => Claimed::Done(done),
            Claim::InFlight(pending) => Claimed::InFlight(pending),
            Claim::Held(pending) => Claimed::Held(pending),
        })
    };
    acquire(claiming, owner.settings.store_timeout, "claim").await
}

impl<St, K> Configured for ClaimMode<St, K> {
    fn settings(&self) -> &Settings {
        &self.settings
    }
}

impl<St: Store, K: ExtractKey> Owner for ClaimMode<St, K> {
    type Lease = Lease;
    const WHAT: &'static str = "claim";

    fn stale(&self) -> Stale {
        self.claims.stale
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.renew(lease).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        action: Settle,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        match (action, receipt) {
            (Settle::Commit, Some(receipt)) => self.store.commit_with(lease, receipt).await,
            (Settle::Commit, None) => self.store.commit(lease).await,
            (Settle::Release, _) => self.store.release(lease).await,
            (Settle::GiveBack, _) => self.store.give_back(lease).await,
        }
    }

    #[cfg(feature = "ledger")]
    fn ledger(&self) -> Option<&crate::ledger::Recorder> {
        self.claims.ledger.as_ref()
    }
}

/// The settings only claim-then-commit has.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClaimSettings {
    pub(crate) stale: Stale,
    pub(crate) on_held: Option<HeldHook>,
    pub(crate) wait_in_flight: Option<Duration>,
    pub(crate) replay: Option<Arc<Replay>>,
    pub(crate) fingerprint: Option<Arc<RequestFingerprint>>,
    pub(crate) journal: Option<Journal>,
    #[cfg(feature = "ledger")]
    pub(crate) ledger: Option<crate::ledger::Recorder>,
}
