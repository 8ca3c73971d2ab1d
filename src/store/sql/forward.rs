//! The macros that write what the SQL backends share: the store-trait methods every backend
//! runs the same way, through its [`Table`] (a backend's `impl` names what it forwards: one
//! method, or a set such as `shared`, what all three forward), each signature once for all of
//! them; the bounds of [`Table`]'s generic statements; each backend's handles. What a backend
//! does its own way it writes out beside them.
//!
//! [`Table`]: super::Table

/// `impl<DB> Table<DB>` for the generic statements of `$items`, under the bounds they all
/// need: what they bind and read on `DB`. Written once here, as bounds on a trait's
/// associated types are not implied where the trait is used.
macro_rules! statements {
    ($($items:item)*) => {
        impl<DB> $crate::store::sql::Table<DB>
        where
            DB: $crate::store::sql::Backend,
            for<'c> &'c mut DB::Connection: ::sqlx::Executor<'c, Database = DB>,
            DB::Arguments: ::sqlx::IntoArguments<DB>,
            for<'a> &'a str: ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            i64: for<'a> ::sqlx::Encode<'a, DB> + for<'r> ::sqlx::Decode<'r, DB> + ::sqlx::Type<DB>,
            bool: for<'a> ::sqlx::Encode<'a, DB>
                + for<'r> ::sqlx::Decode<'r, DB>
                + ::sqlx::Type<DB>,
            String: for<'r> ::sqlx::Decode<'r, DB>
                + for<'a> ::sqlx::Encode<'a, DB>
                + ::sqlx::Type<DB>,
            for<'r> &'r [u8]: ::sqlx::Decode<'r, DB> + ::sqlx::Type<DB>,
            Option<Vec<u8>>: for<'a> ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            for<'a> Option<&'a str>: ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            Option<i64>: for<'a> ::sqlx::Encode<'a, DB> + ::sqlx::Type<DB>,
            usize: ::sqlx::ColumnIndex<DB::Row>,
        {
            $($items)*
        }
    };
}
pub(crate) use statements;

/// One method that forwards its arguments to a method of the backend's `table` field (named
/// after `=>`) and awaits its answer. Types are spelled from `crate::store` on.
macro_rules! to_table {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $answer:ty => $on:ident) => {
        $(#[$doc])*
        async fn $name(&self, $($arg: $ty),*) -> $answer {
            self.table.$on($($arg),*).await
        }
    };
}
pub(crate) use to_table;

/// Writes, inside a SQL backend's `impl Store`, the methods it names, each forwarding to the
/// backend's `table` field. The commits are each backend's own: they go through its group
/// commit.
macro_rules! store_forwards {
    // Every method but the claim and the commits: what all three SQL backends forward.
    (shared) => {
        $crate::store::sql::store_forwards!(
            renew, release, give_back, describe, stuck_claims, resolve, purge_completed
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::store::sql::store_forwards!(@ $method);)+
    };
    (@ renew) => { $crate::store::sql::to_table!(
        renew(lease: &$crate::store::Lease) -> Result<(), $crate::store::StoreError> => renew); };
    (@ release) => { $crate::store::sql::to_table!(
        release(lease: &$crate::store::Lease) -> Result<(), $crate::store::StoreError> => release); };
    (@ give_back) => { $crate::store::sql::to_table!(
        give_back(lease: &$crate::store::Lease) -> Result<(), $crate::store::StoreError> => give_back); };
    (@ describe) => { $crate::store::sql::to_table!(
        describe(key: &$crate::key::IdempotencyKey)
        -> Result<Option<$crate::store::KeyRecord>, $crate::store::StoreError> => describe); };
    (@ stuck_claims) => { $crate::store::sql::to_table!(
        stuck_claims(older_than: ::std::time::Duration)
        -> Result<Vec<$crate::store::StuckClaim>, $crate::store::StoreError> => stuck_claims); };
    (@ resolve) => { $crate::store::sql::to_table!(
        resolve(key: &$crate::key::IdempotencyKey, how: $crate::store::Resolution)
        -> Result<bool, $crate::store::StoreError> => resolve); };
    (@ purge_completed) => { $crate::store::sql::to_table!(
        purge_completed(older_than: ::std::time::Duration)
        -> Result<u64, $crate::store::StoreError> => purge_completed); };
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
    (@ begin_version) => { $crate::store::sql::to_table!(
        /// The upsert of the module docs (tried once more after a failure to serialize).
        begin_version(entity: &$crate::key::IdempotencyKey, version: i64, stale: $crate::store::Stale)
        -> Result<$crate::store::VersionClaim, $crate::store::StoreError> => begin_version); };
    (@ renew_version) => { $crate::store::sql::to_table!(
        renew_version(lease: &$crate::store::VersionLease)
        -> Result<(), $crate::store::StoreError> => renew_version); };
    (@ commit_version) => { $crate::store::sql::to_table!(
        commit_version(lease: &$crate::store::VersionLease)
        -> Result<(), $crate::store::StoreError> => commit_version); };
    (@ release_version) => { $crate::store::sql::to_table!(
        release_version(lease: &$crate::store::VersionLease)
        -> Result<(), $crate::store::StoreError> => release_version); };
    (@ applied_version) => { $crate::store::sql::to_table!(
        applied_version(entity: &$crate::key::IdempotencyKey)
        -> Result<Option<i64>, $crate::store::StoreError> => applied_version); };
    (@ resolve_version) => { $crate::store::sql::to_table!(
        resolve_version(entity: &$crate::key::IdempotencyKey, how: $crate::store::Resolution)
        -> Result<bool, $crate::store::StoreError> => resolve_version); };
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
    (@ start) => { $crate::store::sql::to_table!(
        start(leases: &[$crate::store::Lease])
        -> Result<Vec<bool>, $crate::store::StoreError> => start_entries); };
    (@ give_back) => { $crate::store::sql::to_table!(
        give_back(tokens: &[$crate::store::LeaseToken])
        -> Result<u64, $crate::store::StoreError> => untake); };
    (@ renew_entry) => { $crate::store::sql::to_table!(
        renew_entry(lease: &$crate::store::Lease)
        -> Result<(), $crate::store::StoreError> => renew_entry); };
    (@ settle) => { $crate::store::sql::to_table!(
        settle(
            lease: &$crate::store::Lease,
            settlement: &$crate::store::inbox::Settlement,
            history: &[$crate::store::inbox::Attempt]
        ) -> Result<(), $crate::store::StoreError> => settle_entry); };
    (@ settle_many) => { $crate::store::sql::to_table!(
        /// One transaction, one statement a settlement: the batch waits for one flush of the
        /// disk, not one each.
        settle_many(batch: &[$crate::store::inbox::Settling])
        -> Vec<Result<(), $crate::store::StoreError>> => settle_together); };
    (@ entries) => { $crate::store::sql::to_table!(
        entries(namespace: Option<&str>, states: &[$crate::store::inbox::EntryState], limit: usize)
        -> Result<Vec<$crate::store::inbox::Entry>, $crate::store::StoreError> => entries); };
    (@ entry) => { $crate::store::sql::to_table!(
        entry(key: &$crate::key::IdempotencyKey)
        -> Result<Option<$crate::store::inbox::Entry>, $crate::store::StoreError> => entry); };
    (@ stored_request) => { $crate::store::sql::to_table!(
        stored_request(key: &$crate::key::IdempotencyKey)
        -> Result<Option<$crate::store::inbox::StoredRequest>, $crate::store::StoreError>
        => stored_request); };
    (@ retry_now) => { $crate::store::sql::to_table!(
        retry_now(key: &$crate::key::IdempotencyKey, running: $crate::store::inbox::Running)
        -> Result<bool, $crate::store::StoreError> => retry_now); };
    (@ retry_dead) => { $crate::store::sql::to_table!(
        retry_dead(namespace: &str) -> Result<u64, $crate::store::StoreError> => retry_dead); };
    (@ discard) => { $crate::store::sql::to_table!(
        discard(key: &$crate::key::IdempotencyKey, running: $crate::store::inbox::Running)
        -> Result<bool, $crate::store::StoreError> => discard); };
    (@ inbox_stats) => { $crate::store::sql::to_table!(
        inbox_stats(namespace: Option<&str>)
        -> Result<$crate::store::inbox::InboxStats, $crate::store::StoreError> => inbox_stats); };
    (@ purge_inbox) => { $crate::store::sql::to_table!(
        purge_inbox(requests_after: ::std::time::Duration, entries_after: ::std::time::Duration, limit: usize)
        -> Result<$crate::store::inbox::Purged, $crate::store::StoreError> => purge_inbox); };
}
pub(crate) use inbox_forwards;

/// Writes the inherent methods every SQL backend offers over its `table` field (the count
/// interval, a write of the counts now, the table's name and the pool) and its `Debug`.
macro_rules! table_handles {
    ($store:ty, $pool:ty) => {
        impl $store {
            /// How often the deliveries answered without writing (duplicates, see the [module
            /// docs](self#delivery-counts)) are added to the table: every second unless set.
            /// Set it before the store is used; clones made earlier keep the old interval.
            pub fn with_count_interval(mut self, every: ::std::time::Duration) -> Self {
                self.table = self.table.count_every(every);
                self
            }

            /// Adds the deliveries counted since the last write to the table now, rather than
            /// within the [count interval](Self::with_count_interval): before the process
            /// exits, say, or before reading the table by hand.
            /// [`describe`](crate::store::Store::describe) and
            /// [`stuck_claims`](crate::store::Store::stuck_claims) include them either way.
            pub async fn write_counts(&self) -> Result<(), $crate::store::StoreError> {
                self.table.write_counts().await
            }

            /// The table's name, as given.
            pub fn table_name(&self) -> String {
                self.table.sql.table.name()
            }

            /// The pool the store uses.
            pub fn pool(&self) -> &$pool {
                &self.table.pool
            }
        }

        impl ::std::fmt::Debug for $store {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.table.debug(stringify!($store), f)
            }
        }
    };
}
pub(crate) use table_handles;
