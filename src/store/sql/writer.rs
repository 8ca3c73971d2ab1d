//! Where a database with one writer at a time (SQLite) queues the writes of this process.

use std::sync::Arc;

/// The queue of a database's writers in this process: a fair lock that a write statement
/// holds, so that writers wait their turn here rather than in the database's busy handler.
/// Databases with row locks have none.
#[derive(Clone, Default)]
pub(crate) struct Writer(Option<Arc<tokio::sync::Mutex<()>>>);

#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
impl Writer {
    /// A queue of its own.
    pub(crate) fn queue() -> Self {
        Self(Some(Arc::default()))
    }

    /// The queue shared by every store in this process on the database file `path` (made
    /// absolute first: one file, one queue).
    pub(crate) fn for_file(path: &std::path::Path) -> Self {
        use std::collections::HashMap;
        use std::sync::{Mutex, Weak};

        type Queues = HashMap<std::path::PathBuf, Weak<tokio::sync::Mutex<()>>>;
        static QUEUES: Mutex<Option<Queues>> = Mutex::new(None);
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let mut queues = QUEUES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let queues = queues.get_or_insert_with(HashMap::new);
        queues.retain(|_, queue| queue.strong_count() > 0);
        if let Some(queue) = queues.get(&path).and_then(Weak::upgrade) {
            return Self(Some(queue));
        }
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        queues.insert(path, Arc::downgrade(&queue));
        Self(Some(queue))
    }

    /// Whether no write of this process holds or waits for the turn, at the moment of asking.
    pub(crate) fn idle(&self) -> bool {
        self.0.as_ref().is_none_or(|queue| queue.try_lock().is_ok())
    }

    /// Waits for this writer's turn; the turn lasts as long as what this answers.
    pub(crate) async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.0 {
            Some(queue) => Some(queue.lock().await),
            None => None,
        }
    }
}
