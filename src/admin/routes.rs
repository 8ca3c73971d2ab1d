//! The JSON routes: read the input, ask the store, render the answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::{StreamExt, TryStreamExt, stream};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Map, Value, json};

use super::Admin;
use super::problem::{Problem, json};
use crate::key::IdempotencyKey;
use crate::store::{KeyRecord, KeyState, Resolution, Stale, StalePolicy, Store};

/// The largest body a route reads: its JSON is a few short fields.
const BODY_LIMIT: usize = 64 * 1024;

/// How many keys `GET /claims` describes at once.
const DESCRIBE_AT_ONCE: usize = 8;

/// How many claims `GET /claims` (and entries `GET /inbox`) lists unless `limit` says
/// otherwise, and the most it lists.
const LIST_DEFAULT: usize = 100;
const LIST_MAX: usize = 1000;

/// The header of `GET /claims` that counts every stuck claim, listed or not.
const TOTAL_COUNT: &str = "x-total-count";

pub(super) type Shared<St> = State<Arc<Admin<St>>>;
pub(super) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// `GET /claims?older_than_s=N&limit=L`: the `L` claims stuck longest (100 unless said, at
/// most 1000), each described; `x-total-count` says how many are stuck in all.
pub(super) async fn claims<St: Store + Clone>(
    State(admin): Shared<St>,
    params: Params,
) -> Result<Response, Problem> {
    let params = query(params)?;
    let older_than = match params.get("older_than_s") {
        Some(text) => parse_seconds(text.parse().ok())
            .ok_or_else(|| Problem::bad_request(not_seconds("older_than_s")))?,
        None => admin.stuck_after,
    };
    let limit = limit(params.get("limit"))?;
    let stuck = admin.store.stuck_claims(older_than).await?;
    let total = stuck.len();
    let store = &admin.store;
    let stale = admin.stale;
    let listed: Vec<Value> = stream::iter(stuck.into_iter().take(limit))
        .map(|claim| async move {
            let record = store.describe(&claim.key).await?;
            let renewed_ago = record.as_ref().and_then(|record| record.renewed_ago);
            let standing = Standing::of(stale, renewed_ago.unwrap_or(claim.since_renewal));
            Ok::<_, Problem>(json!({
                "namespace": claim.key.namespace(),
                "key": claim.key.value(),
                "age_s": seconds(claim.age),
                "since_renewal_s": seconds(claim.since_renewal),
                "deliveries": claim.deliveries,
                "runs": record.as_ref().map(|record| record.runs),
                "renewed_ago_s": renewed_ago.map(seconds),
                "state": standing.as_str(),
                "why": standing.why(stale),
                "stale_in_s": standing.stale_in().map(seconds),
            }))
        })
        .buffered(DESCRIBE_AT_ONCE)
        .try_collect()
        .await?;
    let mut res = json(Value::Array(listed));
    res.headers_mut()
        .insert(TOTAL_COUNT, http::HeaderValue::from(total));
    Ok(res)
}

/// `GET /keys?namespace=NS&key=K`
pub(super) async fn describe<St: Store + Clone>(
    State(admin): Shared<St>,
    params: Params,
) -> Result<Response, Problem> {
    let key = query_key(params)?;
    match admin.store.describe(&key).await? {
        Some(record) => {
            let mut rendered = render(&key, &record);
            let last = admin
                .journal
                .as_ref()
                .and_then(|journal| journal.last(&key));
            rendered["last"] = last.map_or(Value::Null, |seen| {
                let ago = seen.at.elapsed().unwrap_or_default();
                json!({
                    "outcome": seen.outcome.as_str(),
                    "ago_s": seconds(ago),
                    "attempt": seen.attempt,
                })
            });
            Ok(json(rendered))
        }
        None => Err(Problem::new(
            http::StatusCode::NOT_FOUND,
            format!("the store does not know the key {key} (never seen, or purged)"),
        )),
    }
}

/// `POST /keys/resolve` `{namespace, key, resolution, force?}`: 409 for a running claim
/// unless `force` is `true`.
pub(super) async fn resolve<St: Store + Clone>(
    State(admin): Shared<St>,
    body: Body,
) -> Result<Response, Problem> {
    let mut fields = Fields(object(body).await?);
    let namespace = fields.string("namespace")?;
    let value = fields.string("key")?;
    let resolution = match fields.string("resolution")?.as_str() {
        "done" => Resolution::Done,
        "release" => Resolution::Release,
        other => {
            return Err(Problem::unprocessable(format!(
                "`resolution` is \"done\" or \"release\", not {other:?}"
            )));
        }
    };
    let force = fields.flag("force")?;
    fields.no_others()?;
    let key = body_key(namespace, value)?;
    // Read right before resolving: an owner that renews between the two steps is resolved
    // all the same, and its fenced lease fails its next renewal or commit (see the module
    // documentation).
    let renewed_ago = match admin.store.describe(&key).await? {
        Some(record) if record.state == KeyState::Processing => record.renewed_ago,
        _ => None,
    };
    let running = renewed_ago.filter(|ago| !admin.stale.is_stale(*ago));
    if let (Some(ago), false) = (running, force) {
        return Err(Problem::new(
            http::StatusCode::CONFLICT,
            format!(
                "the claim on {key} is running: its owner renewed it {} s ago, within the \
                 stale limit of {} s. Resolving it now would let the next delivery run beside \
                 its handler (release), or answer duplicates for work that may still fail \
                 (done); wait until it is stale, or send \"force\": true",
                seconds(ago),
                seconds(admin.stale.after()),
            ),
        ));
    }
    let resolved = admin.store.resolve(&key, resolution).await?;
    if running.is_some() {
        tracing::warn!(%key, ?resolution, resolved, "admin: a running claim resolved by hand, forced");
    } else {
        tracing::info!(%key, ?resolution, resolved, force, "admin: a claim resolved by hand");
    }
    Ok(json(json!({ "resolved": resolved })))
}

/// `POST /purge` `{older_than_s?}`
pub(super) async fn purge<St: Store + Clone>(
    State(admin): Shared<St>,
    body: Body,
) -> Result<Response, Problem> {
    let mut fields = Fields(object(body).await?);
    let older_than = match fields.0.remove("older_than_s") {
        None | Some(Value::Null) => admin.retention,
        Some(value) => parse_seconds(value.as_f64())
            .ok_or_else(|| Problem::unprocessable(not_seconds("older_than_s")))?,
    };
    fields.no_others()?;
    let purged = admin.store.purge_completed(older_than).await?;
    tracing::info!(purged, older_than = ?older_than, "admin: settled keys purged by hand");
    Ok(json(json!({ "purged": purged })))
}

/// Why `GET /claims` lists a claim, judged by the layer's stale limit and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Renewed within the limit: its owner is alive and its handler runs. Holds how long it
    /// has left before it turns stale unless renewed again.
    Running(Duration),
    /// Past the limit under the reclaim policy: the next delivery takes it over.
    Stale,
    /// Past the limit under the hold policy: left for a person.
    Held,
}

impl Standing {
    fn of(stale: Stale, since_renewal: Duration) -> Self {
        if !stale.is_stale(since_renewal) {
            return Self::Running(stale.after().saturating_sub(since_renewal));
        }
        match stale.policy() {
            StalePolicy::Reclaim => Self::Stale,
            StalePolicy::Hold => Self::Held,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Running(_) => "running",
            Self::Stale => "stale",
            Self::Held => "held",
        }
    }

    /// The sentence the page shows; no age in it, which the page keeps current itself.
    fn why(self, stale: Stale) -> String {
        let limit = seconds(stale.after());
        match self {
            Self::Running(_) => format!(
                "Its owner renewed it within the stale limit of {limit} s; its \
                 handler may still be at work."
            ),
            Self::Stale => format!(
                "Its owner stopped renewing it for longer than the stale limit of \
                 {limit} s; the next delivery reclaims it and runs the handler again."
            ),
            Self::Held => format!(
                "Its owner stopped renewing it for longer than the stale limit of \
                 {limit} s; the hold policy answers its deliveries 409 until a person resolves it."
            ),
        }
    }

    fn stale_in(self) -> Option<Duration> {
        match self {
            Self::Running(left) => Some(left),
            Self::Stale | Self::Held => None,
        }
    }
}

/// One key's record as `GET /keys` answers it.
fn render(key: &IdempotencyKey, record: &KeyRecord) -> Value {
    let receipt = record.receipt.as_ref().map(|receipt| {
        json!({
            "fingerprint": receipt.fingerprint.map(|print| hex(print.as_bytes())),
            "status": receipt.response.as_ref().map(|res| res.status.as_u16()),
        })
    });
    json!({
        "namespace": key.namespace(),
        "key": key.value(),
        "state": record.state.as_str(),
        "deliveries": record.deliveries,
        "runs": record.runs,
        "reclaimed": record.reclaimed,
        "first_seen_ago_s": seconds(record.first_seen_ago),
        "last_seen_ago_s": seconds(record.last_seen_ago),
        "claimed_ago_s": seconds(record.claimed_ago),
        "renewed_ago_s": record.renewed_ago.map(seconds),
        "settled_ago_s": record.settled_ago.map(seconds),
        "receipt": receipt,
    })
}

/// The `limit` of a list: 100 unless said, 1 to 1000.
pub(super) fn limit(text: Option<&String>) -> Result<usize, Problem> {
    let Some(text) = text else {
        return Ok(LIST_DEFAULT);
    };
    text.parse::<usize>()
        .ok()
        .filter(|limit| (1..=LIST_MAX).contains(limit))
        .ok_or_else(|| {
            Problem::bad_request(format!(
                "`limit` must be a whole number from 1 to {LIST_MAX}"
            ))
        })
}

pub(super) fn query(params: Params) -> Result<HashMap<String, String>, Problem> {
    params
        .map(|Query(params)| params)
        .map_err(|err| Problem::bad_request(format!("the query does not parse: {err}")))
}

/// The key of a query `?namespace=NS&key=K`: 400 if either is missing or no valid part of a
/// key.
pub(super) fn query_key(params: Params) -> Result<IdempotencyKey, Problem> {
    let mut params = query(params)?;
    let mut field = |name: &str| {
        params
            .remove(name)
            .ok_or_else(|| Problem::bad_request(format!("the query needs `{name}`")))
    };
    let (namespace, value) = (field("namespace")?, field("key")?);
    IdempotencyKey::new(namespace, value)
        .map_err(|err| Problem::bad_request(format!("not a key: {err}")))
}

/// The key of a body's `namespace` and `key` fields: 422 if they are no valid key.
pub(super) fn body_key(namespace: String, value: String) -> Result<IdempotencyKey, Problem> {
    IdempotencyKey::new(namespace, value)
        .map_err(|err| Problem::unprocessable(format!("not a key: {err}")))
}

/// The body as a JSON object: 413 past the limit, 400 if it is no JSON, 422 if no object.
pub(super) async fn object(body: Body) -> Result<Map<String, Value>, Problem> {
    let bytes = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(Problem::new(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {BODY_LIMIT} bytes"),
            ));
        }
        Err(err) => return Err(Problem::bad_request(format!("the body was cut: {err}"))),
    };
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Problem::unprocessable("the body must be a JSON object")),
        Err(err) => Err(Problem::bad_request(format!("the body is not JSON: {err}"))),
    }
}

/// The fields of a JSON body, taken one by one.
pub(super) struct Fields(pub(super) Map<String, Value>);

impl Fields {
    pub(super) fn string(&mut self, name: &str) -> Result<String, Problem> {
        match self.0.remove(name) {
            Some(Value::String(text)) => Ok(text),
            Some(_) => Err(Problem::unprocessable(format!("`{name}` must be a string"))),
            None => Err(Problem::unprocessable(format!("the body needs `{name}`"))),
        }
    }

    /// An optional `true` or `false`, absent (or `null`) as `false`.
    pub(super) fn flag(&mut self, name: &str) -> Result<bool, Problem> {
        match self.0.remove(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(flag)) => Ok(flag),
            Some(_) => Err(Problem::unprocessable(format!(
                "`{name}` must be true or false"
            ))),
        }
    }

    /// A field the route does not take is refused rather than ignored: a misspelt
    /// `older_than_s` must not purge with the default.
    pub(super) fn no_others(self) -> Result<(), Problem> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(name) => Err(Problem::unprocessable(format!(
                "unknown field `{name}` in the body"
            ))),
        }
    }
}

/// Seconds as a duration: finite, not negative, representable.
fn parse_seconds(seconds: Option<f64>) -> Option<Duration> {
    seconds
        .filter(|s| s.is_finite() && *s >= 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
}

fn not_seconds(name: &str) -> String {
    format!("`{name}` must be a number of seconds, not negative")
}

/// A duration as seconds, to the millisecond.
pub(super) fn seconds(duration: Duration) -> f64 {
    duration.as_millis() as f64 / 1000.0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_not_negative() {
        assert_eq!(parse_seconds(Some(0.5)), Some(Duration::from_millis(500)));
        assert_eq!(parse_seconds(Some(0.0)), Some(Duration::ZERO));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
            assert_eq!(parse_seconds(Some(bad)), None, "{bad}");
        }
        assert_eq!(parse_seconds(None), None);
        assert_eq!(seconds(Duration::from_micros(1_234_567)), 1.234);
    }

    #[test]
    fn a_claim_is_running_within_the_stale_limit() {
        let limit = Duration::from_secs(30);
        let reclaim = Stale::reclaim_after(limit);
        let hold = Stale::hold_after(limit);
        let early = Duration::from_secs(10);
        assert_eq!(
            Standing::of(reclaim, early),
            Standing::Running(Duration::from_secs(20))
        );
        assert_eq!(
            Standing::of(hold, early).stale_in(),
            Some(Duration::from_secs(20))
        );
        assert_eq!(Standing::of(reclaim, limit), Standing::Stale);
        assert_eq!(Standing::of(hold, limit), Standing::Held);
        assert_eq!(Standing::of(hold, limit).stale_in(), None);
        // A limit of zero: every claim is stale at once.
        let at_once = Stale::hold_after(Duration::ZERO);
        assert_eq!(Standing::of(at_once, Duration::ZERO), Standing::Held);
        assert!(Standing::of(hold, early).why(hold).contains("30 s"));
    }

    #[test]
    fn a_fingerprint_is_lower_case_hex() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}
