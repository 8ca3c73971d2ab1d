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
        each!(self, s => s.enqueue(key, request).await, redis => Err(no_inbox()))
    }

    async fn take(&self, take: &Take) -> Result<Vec<Taken>, StoreError> {
        each!(self, s => s.take(take).await, redis => Err(no_inbox()))
    }

    async fn start(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        each!(self, s => s.start(leases).await, redis => Err(no_inbox()))
    }

    async fn give_back(&self, tokens: &[LeaseToken]) -> Result<u64, StoreError> {
        each!(self, s => s.give_back(tokens).await, redis => Err(no_inbox()))
    }

    async fn renew_entry(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.renew_entry(lease).await, redis => Err(no_inbox()))
    }

    async fn settle(
        &self,
        lease: &Lease,
        settlement: &Settlement,
        history: &[Attempt],
    ) -> Result<(), StoreError> {
        each!(self, s => s.settle(lease, settlement, history).await, redis => Err(no_inbox()))
    }

    async fn settle_many(&self, batch: &[Settling]) -> Vec<Result<(), StoreError>> {
        each!(self, s => s.settle_many(batch).await, redis => batch.iter().map(|_| Err(no_inbox())).collect())
    }

    async fn entries(
        &self,
        namespace: Option<&str>,
        states: &[EntryState],
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        each!(self, s => s.entries(namespace, states, limit).await, redis => Err(no_inbox()))
    }

    async fn entry(&self, key: &IdempotencyKey) -> Result<Option<Entry>, StoreError> {
        each!(self, s => s.entry(key).await, redis => Err(no_inbox()))
    }

    async fn stored_request(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        each!(self, s => s.stored_request(key).await, redis => Err(no_inbox()))
    }

    async fn retry_now(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        each!(self, s => s.retry_now(key, running).await, redis => Err(no_inbox()))
    }

    async fn retry_dead(&self, namespace: &str) -> Result<u64, StoreError> {
        each!(self, s => s.retry_dead(namespace).await, redis => Err(no_inbox()))
    }

    async fn discard(&self, key: &IdempotencyKey, running: Running) -> Result<bool, StoreError> {
        each!(self, s => s.discard(key, running).await, redis => Err(no_inbox()))
    }

    async fn inbox_stats(&self, namespace: Option<&str>) -> Result<InboxStats, StoreError> {
        each!(self, s => s.inbox_stats(namespace).await, redis => Err(no_inbox()))
    }

    async fn purge_inbox(
        &self,
        requests_after: Duration,
        entries_after: Duration,
        limit: usize,
    ) -> Result<Purged, StoreError> {
        each!(self, s => s.purge_inbox(requests_after, entries_after, limit).await, redis => Err(no_inbox()))
    }

    async fn watch(&self, wake: Wake) {
        each!(self, s => s.watch(wake).await, redis => drop(wake))
    }
}
