//! The inbox of the store chosen: every SQL store and memory hold one; Redis answers each call
//! with an error saying it holds none (see the README's inbox section for why).

// Built with Redis alone, every method answers that error and reads none of its arguments.
#![cfg_attr(
    not(any(
        feature = "memory",
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(unused_variables)
)]

use std::time::Duration;

use super::AnyStore;
use crate::key::IdempotencyKey;
use crate::store::inbox::{
    Attempt, Enqueued, Entry, EntryState, InboxStats, InboxStore, Purged, Running, Settlement,
    Settling, StoredRequest, Take, Taken, Wake,
};
use crate::store::{Lease, LeaseToken, StoreError};

/// `match` on the variants that hold an inbox; `$none` for Redis.
macro_rules! inbox {
    ($store:expr, $s:ident => $body:expr, $none:expr) => {
        match $store {
            #[cfg(feature = "memory")]
            AnyStore::Memory($s) => $body,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $body,
            #[cfg(feature = "mysql")]
            AnyStore::MySql($s) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => $none,
        }
    };
}

#[cfg(feature = "redis")]
fn no_inbox() -> StoreError {
    StoreError::backend("the Redis store holds no inbox: give the inbox a SQL store")
}

impl InboxStore for AnyStore {
    async fn enqueue(
        &self,
        key: &IdempotencyKey,
        request: &StoredRequest,
    ) -> Result<Enqueued, StoreError> {
        inbox!(self, s => s.enqueue(key, request).await, Err(no_inbox()))
    }

    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        inbox!(self, s => s.take(take).await, Err(no_inbox()))
    }

    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        inbox!(self, s => s.start(leases).await, Err(no_inbox()))
    }

    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        inbox!(self, s => s.give_back(tokens).await, Err(no_inbox()))
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        inbox!(self, s => s.renew_entry(lease).await, Err(no_inbox()))
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        inbox!(self, s => s.settle(lease, settlement, history).await, Err(no_inbox()))
    }

    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        inbox!(
            self,
            s => s.settle_many(batch).await,
            batch.iter().map(|_| Err(no_inbox())).collect()
        )
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        inbox!(self, s => s.entries(namespace, states, limit).await, Err(no_inbox()))
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        inbox!(self, s => s.entry(key).await, Err(no_inbox()))
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        inbox!(self, s => s.stored_request(key).await, Err(no_inbox()))
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        inbox!(self, s => s.retry_now(key, running).await, Err(no_inbox()))
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        inbox!(self, s => s.retry_dead(namespace).await, Err(no_inbox()))
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        inbox!(self, s => s.discard(key, running).await, Err(no_inbox()))
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        inbox!(self, s => s.inbox_stats(namespace).await, Err(no_inbox()))
    }

    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        inbox!(
            self,
            s => s.purge_inbox(requests_after, entries_after, limit).await,
            Err(no_inbox())
        )
    }

    async fn watch(&self, wake: Wake) {
        inbox!(self, s => s.watch(wake).await, drop(wake))
    }
}
