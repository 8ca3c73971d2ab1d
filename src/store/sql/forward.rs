//! The store-trait methods every SQL backend runs the same way, through its [`Table`]: a
//! backend's `impl` names each one it forwards, and these write the method, its signature
//! once for all of them. What a backend does its own way it writes out beside them.
//!
//! [`Table`]: super::Table

/// Writes, inside a SQL backend's `impl Store`, the methods it names, each forwarding to the
/// backend's `table` field.
macro_rules! store_forwards {
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
    ($($method:ident),+ $(,)?) => {
        $($crate::store::sql::version_forwards!(@ $method);)+
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
