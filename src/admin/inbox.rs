//! The inbox's routes, added by [`Admin::inbox`]: its entries, one entry with its stored
//! request, and what an operator does to them (retry, retry a namespace's dead, discard).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use http::StatusCode;
use serde_json::{Value, json};

use super::Admin;
use super::page::base64;
use super::problem::{Problem, json};
use super::routes::{Fields, Params, Shared, body_key, limit, object, query, query_key, seconds};
use crate::key::IdempotencyKey;
use crate::store::Stale;
use crate::store::inbox::{
    Attempt, AttemptResult, Entry, EntryState, InboxStore, Running, StoredRequest,
};

/// The most of a stored body `GET /inbox/entry` shows, in bytes.
const BODY_SHOWN: usize = 64 * 1024;

/// What `GET /inbox` lists without `state`: every entry that is not done.
const UNSETTLED: [EntryState; 3] = [EntryState::Queued, EntryState::Running, EntryState::Dead];

/// The router state of an [`Admin`] over `St`.
type Routes<St> = Router<Arc<Admin<St>>>;

/// Adds the inbox's routes to `router`.
pub(super) fn routes<St: InboxStore + Clone>(router: Routes<St>) -> Routes<St> {
    router
        .route("/inbox", get(list::<St>))
        .route("/inbox/entry", get(entry::<St>))
        .route("/inbox/retry", post(retry::<St>))
        .route("/inbox/retry-dead", post(retry_dead::<St>))
        .route("/inbox/discard", post(discard::<St>))
}

/// `GET /inbox?state=S1,S2&namespace=NS&limit=L`: the inbox's counts and its oldest entries
/// in those states.
async fn list<St: InboxStore>(
    State(admin): Shared<St>,
    params: Params,
) -> Result<Response, Problem> {
    let params = query(params)?;
    let states = match params.get("state") {
        Some(text) => states(text)?,
        None => UNSETTLED.to_vec(),
    };
    let namespace = params.get("namespace").map(String::as_str);
    if let Some(namespace) = namespace {
        check_namespace(namespace).map_err(Problem::bad_request)?;
    }
    let limit = limit(params.get("limit"))?;
    let stats = admin.store.inbox_stats(namespace).await?;
    let entries = admin.store.entries(namespace, &states, limit).await?;
    let entries: Vec<Value> = entries
        .iter()
        .map(|entry| render(entry, admin.stale))
        .collect();
    Ok(json(json!({
        "stats": {
            "queued": stats.queued,
            "running": stats.running,
            "dead": stats.dead,
            "oldest_due_s": stats.oldest_due.map(seconds),
        },
        "entries": entries,
    })))
}

/// `GET /inbox/entry?namespace=NS&key=K`: one entry and its stored request.
async fn entry<St: InboxStore>(
    State(admin): Shared<St>,
    params: Params,
) -> Result<Response, Problem> {
    let key = query_key(params)?;
    let Some(entry) = admin.store.entry(&key).await? else {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            format!("the inbox has no entry {key} (never stored, or purged)"),
        ));
    };
    // Retention may delete the request between the two reads: then it is `null`, as when
    // the entry said so.
    let request = if entry.has_request {
        admin.store.stored_request(&key).await?
    } else {
        None
    };
    let mut rendered = render(&entry, admin.stale);
    rendered["request"] = request.as_ref().map_or(Value::Null, show_request);
    Ok(json(rendered))
}

/// `POST /inbox/retry` `{namespace, key, force?}`: a queued, running or dead entry due now (a
/// running one only once its worker stopped renewing, or with `force`), in one conditional
/// write: a worker that renews between the look and the write keeps its entry.
async fn retry<St: InboxStore>(State(admin): Shared<St>, body: Body) -> Result<Response, Problem> {
    let (key, running) = by_hand(&admin, body).await?;
    let retried = admin.store.retry_now(&key, running).await?;
    done_by_hand(&admin, &key, retried, "retried").await
}

/// `POST /inbox/retry-dead` `{namespace}`: every dead entry of the namespace due now.
async fn retry_dead<St: InboxStore>(
    State(admin): Shared<St>,
    body: Body,
) -> Result<Response, Problem> {
    let mut fields = Fields(object(body).await?);
    let namespace = fields.string("namespace")?;
    fields.no_others()?;
    check_namespace(&namespace).map_err(Problem::unprocessable)?;
    let retried = admin.store.retry_dead(&namespace).await?;
    tracing::info!(
        namespace,
        retried,
        "admin: an inbox's dead entries retried by hand"
    );
    Ok(json(json!({ "retried": retried })))
}

/// `POST /inbox/discard` `{namespace, key, force?}`: a queued, running or dead entry done
/// without running (a running one only once its worker stopped renewing, or with `force`),
/// in one conditional write.
async fn discard<St: InboxStore>(
    State(admin): Shared<St>,
    body: Body,
) -> Result<Response, Problem> {
    let (key, running) = by_hand(&admin, body).await?;
    let discarded = admin.store.discard(&key, running).await?;
    done_by_hand(&admin, &key, discarded, "discarded").await
}

/// The answer of an action by hand on the entry `key`, `done` (`retried`, `discarded`) if
/// `changed`: `{"<done>": true}`, logged; otherwise what the entry is ([`nothing_to`]).
async fn done_by_hand<St: InboxStore>(
    admin: &Admin<St>,
    key: &IdempotencyKey,
    changed: bool,
    done: &str,
) -> Result<Response, Problem> {
    if !changed {
        return Err(nothing_to(admin, key, done).await);
    }
    tracing::info!(%key, "admin: an inbox entry {done} by hand");
    Ok(json(json!({ done: true })))
}

/// What an action that changed nothing answers, saying what the key has: 409 for an entry a
/// live worker runs (send `force`), 404 for a done entry or none.
async fn nothing_to<St: InboxStore>(
    admin: &Admin<St>,
    key: &IdempotencyKey,
    done: &str,
) -> Problem {
    let entry = match admin.store.entry(key).await {
        Ok(entry) => entry,
        Err(err) => return Problem::store(err),
    };
    let detail = match entry {
        Some(entry) if entry.state == EntryState::Running => {
            let since = entry.since_renewal.unwrap_or_default();
            return Problem::new(
                StatusCode::CONFLICT,
                format!(
                    "the inbox entry {key} is running, renewed {:.1} s ago: its worker is alive; \
                     send \"force\": true to take it away all the same",
                    since.as_secs_f64()
                ),
            );
        }
        Some(entry) => format!(
            "the inbox entry {key} is {}: only a queued, running or dead entry can be {done}",
            entry.state.as_str()
        ),
        None => format!("the inbox has no entry {key} (never stored, or purged)"),
    };
    Problem::new(StatusCode::NOT_FOUND, detail)
}

/// The key of a body `{namespace, key, force?}`, and which running entries the action may
/// take: with `force` any, else one whose worker stopped renewing for the stale limit of
/// [`Admin::stale`] (the worker may be about to finish otherwise).
async fn by_hand<St: InboxStore>(
    admin: &Admin<St>,
    body: Body,
) -> Result<(IdempotencyKey, Running), Problem> {
    let mut fields = Fields(object(body).await?);
    let namespace = fields.string("namespace")?;
    let value = fields.string("key")?;
    let force = fields.flag("force")?;
    fields.no_others()?;
    let key = body_key(namespace, value)?;
    let running = if force {
        Running::Force
    } else {
        Running::StaleFor(admin.stale.after())
    };
    Ok((key, running))
}

/// The states of `state=queued,dead`: at least one, each a state the store writes.
fn states(text: &str) -> Result<Vec<EntryState>, Problem> {
    let mut states = Vec::new();
    for name in text.split(',').map(str::trim) {
        let state = EntryState::parse(name).ok_or_else(|| {
            Problem::bad_request(format!(
                "`state` is a comma-separated list of queued, running, done and dead, \
                 not {name:?}"
            ))
        })?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    Ok(states)
}

/// Whether `text` could be a namespace: the checks of [`IdempotencyKey::new`].
fn check_namespace(text: &str) -> Result<(), String> {
    IdempotencyKey::new(text.to_owned(), "-")
        .map(drop)
        .map_err(|err| format!("not a namespace: {err}"))
}

/// One entry as the routes answer it; `stale` tells a running entry whose worker stopped
/// renewing its lease (`stuck`).
fn render(entry: &Entry, stale: Stale) -> Value {
    let stuck = entry.state == EntryState::Running
        && entry.since_renewal.is_some_and(|ago| stale.is_stale(ago));
    let history: Vec<Value> = entry.history.iter().map(attempt).collect();
    json!({
        "namespace": entry.key.namespace(),
        "key": entry.key.value(),
        "state": entry.state.as_str(),
        "attempts": entry.attempts,
        "crashes": entry.crashes,
        "age_s": seconds(entry.age),
        "due_in_s": entry.due_in.map(seconds),
        "since_renewal_s": entry.since_renewal.map(seconds),
        "stuck": stuck,
        "has_request": entry.has_request,
        "last": entry.last_attempt().map_or(Value::Null, attempt),
        "history": history,
    })
}

/// `{at_ms, duration_ms}` and one of `status`, `error` or `crashed: true`.
fn attempt(attempt: &Attempt) -> Value {
    let mut rendered = json!({
        "at_ms": attempt.started_ms,
        "duration_ms": attempt.duration_ms,
    });
    let (name, value) = match &attempt.result {
        AttemptResult::Status(status) => ("status", json!(status)),
        AttemptResult::Error(error) => ("error", json!(error)),
        AttemptResult::Crashed => ("crashed", json!(true)),
    };
    rendered[name] = value;
    rendered
}

/// A stored request as `GET /inbox/entry` shows it.
fn show_request(request: &StoredRequest) -> Value {
    let headers: Vec<[String; 2]> = request
        .headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            [name.as_str().to_owned(), value]
        })
        .collect();
    let (body, encoding) = shown_body(&request.body);
    json!({
        "method": request.method.as_str(),
        "uri": request.uri,
        "headers": headers,
        "body": body,
        "body_encoding": encoding,
        "body_bytes": request.body.len(),
        "truncated": request.body.len() > BODY_SHOWN,
    })
}

/// The first [`BODY_SHOWN`] bytes of `body`, as text when they are UTF-8 (a character the
/// cut splits is left out), else as base64; and which of the two.
fn shown_body(body: &[u8]) -> (String, &'static str) {
    let shown = &body[..body.len().min(BODY_SHOWN)];
    let cut = shown.len() < body.len();
    match std::str::from_utf8(shown) {
        Ok(text) => (text.to_owned(), "utf-8"),
        // Valid text up to a character that the cut split in two.
        Err(err) if cut && err.error_len().is_none() => {
            let whole = &shown[..err.valid_up_to()];
            (String::from_utf8_lossy(whole).into_owned(), "utf-8")
        }
        Err(_) => (base64(shown), "base64"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_text_when_it_is_utf_8_and_base64_otherwise() {
        assert_eq!(shown_body(b"{\"a\":1}"), ("{\"a\":1}".to_owned(), "utf-8"));
        assert_eq!(shown_body("café".as_bytes()), ("café".to_owned(), "utf-8"));
        assert_eq!(
            shown_body(&[0xff, 0x00, 0x41]),
            ("/wBB".to_owned(), "base64")
        );
        // Cut in the middle of a character: the text stops before it.
        let mut long = "a".repeat(BODY_SHOWN - 1).into_bytes();
        long.extend_from_slice("é and more".as_bytes());
        let (text, encoding) = shown_body(&long);
        assert_eq!((text.len(), encoding), (BODY_SHOWN - 1, "utf-8"));
        // Bytes that are no text, but for the cut, stay bytes.
        let mut binary = vec![b'a'; BODY_SHOWN + 10];
        binary[10] = 0xff;
        assert_eq!(shown_body(&binary).1, "base64");
        // Broken text before the cut is no text.
        let mut broken = vec![b'a'; BODY_SHOWN + 10];
        broken[BODY_SHOWN - 1] = 0xc3;
        broken[BODY_SHOWN - 3] = 0xff;
        assert_eq!(shown_body(&broken).1, "base64");
    }

    #[test]
    fn states_are_a_list_of_known_names() {
        assert_eq!(
            states("dead, queued,dead").unwrap(),
            [EntryState::Dead, EntryState::Queued]
        );
        assert_eq!(states("done").unwrap(), [EntryState::Done]);
        for bad in ["", "dead,", "retrying", "Dead"] {
            assert_eq!(
                states(bad).unwrap_err().status(),
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }

    #[test]
    fn an_attempt_names_how_it_ended() {
        let status = attempt(&Attempt::new(1, 2, AttemptResult::Status(503)));
        assert_eq!(
            status,
            json!({ "at_ms": 1, "duration_ms": 2, "status": 503 })
        );
        let error = attempt(&Attempt::new(1, 2, AttemptResult::Error("boom".into())));
        assert_eq!(error["error"], "boom");
        let crashed = attempt(&Attempt::new(1, 0, AttemptResult::Crashed));
        assert_eq!(crashed["crashed"], true);
    }
}
