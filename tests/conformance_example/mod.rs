//! `MapStore`: the claims, the entities' versions and the inbox, a table each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tower_idempotency::IdempotencyKey;

mod claims;
mod inbox;
mod versions;

/// One table: a row per key.
type Table<R> = Arc<Mutex<HashMap<IdempotencyKey, R>>>;

/// A store over maps in memory: the claims, the entities' versions and the inbox, a table
/// each. Clones share the tables, as handles on one database would.
#[derive(Clone, Default)]
pub(super) struct MapStore {
    claims: Table<claims::Row>,
    versions: Table<versions::Row>,
    inbox: Table<inbox::Row>,
}

/// The table behind its lock, held for one step.
fn lock<R>(table: &Table<R>) -> MutexGuard<'_, HashMap<IdempotencyKey, R>> {
    table.lock().unwrap()
}
