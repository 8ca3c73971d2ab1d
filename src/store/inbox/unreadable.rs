//! An entry a take locked whose stored request cannot be read: it cannot run, so it goes dead
//! at once, kept for a person, rather than failing every take after it.

use std::time::SystemTime;

use super::{Attempt, AttemptResult, InboxStore, Settlement, StoredRequest, Taken};
use crate::store::{Lease, StoreError};

/// An entry taken (its lease granted) whose request, or history, did not decode.
pub(crate) struct Unreadable {
    pub(crate) lease: Lease,
    /// Its history, when that much could be read.
    history: Vec<Attempt>,
    error: StoreError,
}

/// What a take hands the worker for a row it locked, from the row's columns: the entry, or,
/// when its stored request or history cannot be read, an [`Unreadable`] to [`bury`].
pub(crate) fn taken(
    lease: Lease,
    request: Option<&[u8]>,
    attempt: u32,
    crashes: u32,
    received_at: SystemTime,
    history: Option<&[u8]>,
) -> Result<Taken, Unreadable> {
    let history = Attempt::decode_history(history.unwrap_or_default());
    // Retention never deletes the request of an entry that can still run.
    let request = request
        .ok_or_else(|| StoreError::backend("the entry lost its stored request"))
        .and_then(StoredRequest::decode);
    match (request, history) {
        (Ok(request), Ok(history)) => Ok(Taken {
            lease,
            request,
            attempt,
            crashes,
            received_at,
            history,
        }),
        (Err(error), history) => Err(Unreadable {
            lease,
            history: history.unwrap_or_default(),
            error,
        }),
        (Ok(_), Err(error)) => Err(Unreadable {
            lease,
            history: Vec::new(),
            error,
        }),
    }
}

/// Settles each unreadable entry dead, its history ending with an attempt that says why. One
/// whose settlement fails stays taken, and is taken again (and buried) once its lease is stale.
pub(crate) async fn bury<S: InboxStore>(store: &S, unreadable: Vec<Unreadable>) {
    for entry in unreadable {
        let key = entry.lease.key();
        tracing::error!(
            namespace = key.namespace(),
            key = key.value(),
            error = &entry.error as &dyn std::error::Error,
            "an inbox entry's stored request could not be read: it cannot run, and is dead, kept \
             for a person",
        );
        // The attempt that found it unreadable counts, as the history says.
        if let Err(error) = store.start(std::slice::from_ref(&entry.lease)).await {
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "an unreadable inbox entry's attempt could not be counted",
            );
        }
        let why = format!("the stored entry could not be read: {}", entry.error);
        let mut history = entry.history;
        history.push(Attempt::new(
            Attempt::now_ms(),
            0,
            AttemptResult::Error(why),
        ));
        let settled = store
            .settle(&entry.lease, &Settlement::Dead, &history)
            .await;
        if let Err(error) = settled {
            tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "an unreadable inbox entry could not be settled dead; it is taken again once \
                 its lease is stale",
            );
        }
    }
}
