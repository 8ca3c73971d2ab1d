//! Versions inside the handler's own transaction.

use crate::key::IdempotencyKey;
use crate::store::{Advance, AdvanceVersion, StoreError};

/// Moves `entity`'s applied version to `version` inside the transaction `conn` is in, unless it
/// is older: [`Advance::Applied`] for a newer or an equal version (as the
/// [`VersionGuardLayer`](super::VersionGuardLayer) runs an equal version), [`Advance::Outdated`] for an older
/// one. The row stays locked until the transaction ends, so concurrent deliveries of one entity
/// apply one after the other, and the version commits or rolls back together with the business
/// write. A redelivery of the same event is the transactional layer's duplicate, answered before
/// the handler runs; the same version under a new event id applies again.
///
/// It ignores the pending slot of the [`VersionGuardLayer`](super::VersionGuardLayer): use one or the other
/// for an entity namespace.
///
/// See [the module documentation](super#ordering-in-transactional-mode) for an example, the SQL
/// per backend, and the plain-SQL alternative.
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub async fn advance<St: AdvanceVersion>(
    conn: &mut <St::Database as sqlx::Database>::Connection,
    store: &St,
    entity: &IdempotencyKey,
    version: i64,
) -> Result<Advance, StoreError> {
    store.advance_version(conn, entity, version).await
}
