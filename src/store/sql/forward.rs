//! The store-trait methods every SQL backend runs the same way, through its [`Table`]: a
//! backend's `impl` names what it forwards (one method, or a set: `shared`, what all three
//! backends forward), and these write the methods, each signature once for all of them. What
//! a backend does its own way it writes out beside them.
//!
//! [`Table`]: super::Table

/// Writes, inside a SQL backend's `impl Store`, the methods it names, each forwarding to the
/// backend's `table` field (a commit, to the backend's `commit_batched`).
macro_rules! store_forwards {
    // Every method but the claim: what all three SQL backends forward.
    (shared) => {
        $crate::store::sql::store_forwards!(
            renew, commit, commit_with, release, give_back, describe, stuck_claims, resolve,
            purge_completed
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::store::sql::store_forwards!(@ $method);)+
    };
    (@ renew) => {
        async fn renew(
            &self,
            lease: &$crate::store::Lease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.renew(lease).await
        }
    };
    (@ commit) => {
        /// In the next batch of commits when one is in flight.
        async fn commit(
            &self,
            lease: &$crate::store::Lease,
        ) -> Result<(), $crate::store::StoreError> {
            self.commit_batched(lease, None).await
        }
    };
    (@ commit_with) => {
        /// In the next batch of commits when one is in flight.
        async fn commit_with(
            &self,
            lease: &$crate::store::Lease,
            receipt: &$crate::store::Receipt,
        ) -> Result<(), $crate::store::StoreError> {
            self.commit_batched(lease, Some(receipt)).await
        }
    };
    (@ release) => {
        async fn release(
            &self,
            lease: &$crate::store::Lease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.release(lease).await
        }
    };
    (@ give_back) => {
        async fn give_back(
            &self,
            lease: &$crate::store::Lease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.give_back(lease).await
        }
    };
    (@ describe) => {
        async fn describe(
            &self,
            key: &$crate::key::IdempotencyKey,
        ) -> Result<Option<$crate::store::KeyRecord>, $crate::store::StoreError> {
            self.table.describe(key).await
        }
    };
    (@ stuck_claims) => {
        async fn stuck_claims(
            &self,
            older_than: ::std::time::Duration,
        ) -> Result<Vec<$crate::store::StuckClaim>, $crate::store::StoreError> {
            self.table.stuck_claims(older_than).await
        }
    };
    (@ resolve) => {
        async fn resolve(
            &self,
            key: &$crate::key::IdempotencyKey,
            how: $crate::store::Resolution,
        ) -> Result<bool, $crate::store::StoreError> {
            self.table.resolve(key, how).await
        }
    };
    (@ purge_completed) => {
        async fn purge_completed(
            &self,
            older_than: ::std::time::Duration,
        ) -> Result<u64, $crate::store::StoreError> {
            self.table.purge_completed(older_than).await
        }
    };
}
pub(crate) use store_forwards;

/// Writes, inside a SQL backend's `impl VersionStore`, the methods it names, each forwarding
/// to the backend's `table` field.
macro_rules! version_forwards {
    // Every method but the version claim: what all three SQL backends forward.
    (shared) => {
        $crate::store::sql::version_forwards!(
            renew_version, commit_version, release_version, applied_version, resolve_version
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::store::sql::version_forwards!(@ $method);)+
    };
    (@ begin_version) => {
        /// The upsert of the module docs (tried once more after a failure to serialize).
        async fn begin_version(
            &self,
            entity: &$crate::key::IdempotencyKey,
            version: i64,
            stale: $crate::store::Stale,
        ) -> Result<$crate::store::VersionClaim, $crate::store::StoreError> {
            self.table.begin_version(entity, version, stale).await
        }
    };
    (@ renew_version) => {
        async fn renew_version(
            &self,
            lease: &$crate::store::VersionLease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.renew_version(lease).await
        }
    };
    (@ commit_version) => {
        async fn commit_version(
            &self,
            lease: &$crate::store::VersionLease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.commit_version(lease).await
        }
    };
    (@ release_version) => {
        async fn release_version(
            &self,
            lease: &$crate::store::VersionLease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.release_version(lease).await
        }
    };
    (@ applied_version) => {
        async fn applied_version(
            &self,
            entity: &$crate::key::IdempotencyKey,
        ) -> Result<Option<i64>, $crate::store::StoreError> {
            self.table.applied_version(entity).await
        }
    };
    (@ resolve_version) => {
        async fn resolve_version(
            &self,
            entity: &$crate::key::IdempotencyKey,
            how: $crate::store::Resolution,
        ) -> Result<bool, $crate::store::StoreError> {
            self.table.resolve_version(entity, how).await
        }
    };
}
pub(crate) use version_forwards;

/// Writes, inside a SQL backend's `impl InboxStore`, the methods it names, each forwarding to
/// the backend's `table` field (`inbox.rs` in this folder).
macro_rules! inbox_forwards {
    // What all three SQL backends forward.
    (shared) => {
        $crate::store::sql::inbox_forwards!(
            renew_entry, settle, entries, entry, stored_request, discard, inbox_stats, purge_inbox
        );
    };
    // And what SQLite and MySQL forward besides: their starts, give-backs and batches of
    // settlements are one transaction of single statements.
    (by_transaction) => {
        $crate::store::sql::inbox_forwards!(start, give_back, settle_many, retry_now, retry_dead);
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::store::sql::inbox_forwards!(@ $method);)+
    };
    (@ start) => {
        async fn start(
            &self,
            leases: &[$crate::store::Lease],
        ) -> Result<Vec<bool>, $crate::store::StoreError> {
            self.table.start_entries(leases).await
        }
    };
    (@ give_back) => {
        async fn give_back(
            &self,
            tokens: &[$crate::store::LeaseToken],
        ) -> Result<u64, $crate::store::StoreError> {
            self.table.untake(tokens).await
        }
    };
    (@ renew_entry) => {
        async fn renew_entry(
            &self,
            lease: &$crate::store::Lease,
        ) -> Result<(), $crate::store::StoreError> {
            self.table.renew_entry(lease).await
        }
    };
    (@ settle) => {
        async fn settle(
            &self,
            lease: &$crate::store::Lease,
            settlement: &$crate::store::inbox::Settlement,
            history: &[$crate::store::inbox::Attempt],
        ) -> Result<(), $crate::store::StoreError> {
            self.table.settle_entry(lease, settlement, history).await
        }
    };
    (@ settle_many) => {
        /// One transaction, one statement a settlement: the batch waits for one flush of the
        /// disk, not one each.
        async fn settle_many(
            &self,
            batch: &[$crate::store::inbox::Settling],
        ) -> Vec<Result<(), $crate::store::StoreError>> {
            self.table.settle_together(batch).await
        }
    };
    (@ entries) => {
        async fn entries(
            &self,
            namespace: Option<&str>,
            states: &[$crate::store::inbox::EntryState],
            limit: usize,
        ) -> Result<Vec<$crate::store::inbox::Entry>, $crate::store::StoreError> {
            self.table.entries(namespace, states, limit).await
        }
    };
    (@ entry) => {
        async fn entry(
            &self,
            key: &$crate::key::IdempotencyKey,
        ) -> Result<Option<$crate::store::inbox::Entry>, $crate::store::StoreError> {
            self.table.entry(key).await
        }
    };
    (@ stored_request) => {
        async fn stored_request(
            &self,
            key: &$crate::key::IdempotencyKey,
        ) -> Result<Option<$crate::store::inbox::StoredRequest>, $crate::store::StoreError> {
            self.table.stored_request(key).await
        }
    };
    (@ retry_now) => {
        async fn retry_now(
            &self,
            key: &$crate::key::IdempotencyKey,
            running: $crate::store::inbox::Running,
        ) -> Result<bool, $crate::store::StoreError> {
            self.table.retry_now(key, running).await
        }
    };
    (@ retry_dead) => {
        async fn retry_dead(&self, namespace: &str) -> Result<u64, $crate::store::StoreError> {
            self.table.retry_dead(namespace).await
        }
    };
    (@ discard) => {
        async fn discard(
            &self,
            key: &$crate::key::IdempotencyKey,
            running: $crate::store::inbox::Running,
        ) -> Result<bool, $crate::store::StoreError> {
            self.table.discard(key, running).await
        }
    };
    (@ inbox_stats) => {
        async fn inbox_stats(
            &self,
            namespace: Option<&str>,
        ) -> Result<$crate::store::inbox::InboxStats, $crate::store::StoreError> {
            self.table.inbox_stats(namespace).await
        }
    };
    (@ purge_inbox) => {
        async fn purge_inbox(
            &self,
            requests_after: ::std::time::Duration,
            entries_after: ::std::time::Duration,
            limit: usize,
        ) -> Result<$crate::store::inbox::Purged, $crate::store::StoreError> {
            self.table
                .purge_inbox(requests_after, entries_after, limit)
                .await
        }
    };
}
pub(crate) use inbox_forwards;
