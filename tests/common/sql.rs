//! What the SQL suites (`advance` and `transactional`) need of a backend besides its store:
//! their statements, in the backend's dialect.

/// The statements of the SQL suites, in a backend's dialect (placeholders, upserts).
pub trait SqlBackend {
    /// `advance`: writes the business row `(id, status, version)` of a subscription, counting
    /// its writes.
    const UPSERT_SUBSCRIPTION: &'static str;
    /// `advance`: reads `(status, version, writes)` of the subscription `id`.
    const SELECT_SUBSCRIPTION: &'static str;
    /// `transactional`: writes the business row of an event.
    const INSERT_EFFECT: &'static str;
    /// `transactional`: counts the business rows of an event.
    const COUNT_EFFECTS: &'static str;
    /// `transactional`: counts the markers (claims) of a namespace.
    const COUNT_MARKERS: &'static str;
}

#[cfg(feature = "sqlite")]
impl SqlBackend for tower_idempotency::store::SqliteStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES (?1, ?2, ?3, 1) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
         writes = order_subscriptions.writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = ?1";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES (?1)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = ?1";
    const COUNT_MARKERS: &'static str =
        "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = ?1";
}

#[cfg(feature = "postgres")]
impl SqlBackend for tower_idempotency::store::PostgresStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES ($1, $2, $3, 1) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
         writes = order_subscriptions.writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = $1";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES ($1)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = $1";
    const COUNT_MARKERS: &'static str =
        "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = $1";
}

#[cfg(feature = "mysql")]
impl SqlBackend for tower_idempotency::store::MySqlStore {
    const UPSERT_SUBSCRIPTION: &'static str = "INSERT INTO order_subscriptions (id, status, version, writes) \
         VALUES (?, ?, ?, 1) \
         ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
         writes = writes + 1";
    const SELECT_SUBSCRIPTION: &'static str =
        "SELECT status, version, writes FROM order_subscriptions WHERE id = ?";
    const INSERT_EFFECT: &'static str = "INSERT INTO tx_effects (event) VALUES (?)";
    const COUNT_EFFECTS: &'static str = "SELECT COUNT(*) FROM tx_effects WHERE event = ?";
    const COUNT_MARKERS: &'static str = "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = ?";
}
