//! What the ledger records: a delivery and how it was answered, a run of the handler and how
//! it ended, an operator's action; each for one key, at one time, in one canonical encoding.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::key::IdempotencyKey;
use crate::response::Outcome;

/// One thing that happened to an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The event's key.
    pub key: IdempotencyKey,
    /// When it happened (a run: when it ended), to the microsecond.
    pub at: SystemTime,
    /// What happened.
    pub event: Event,
}

/// What a [`Record`] tells.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A delivery of the event, and how it was answered.
    Delivery {
        /// Which delivery of the event it was, where the store counted (1 for the first).
        number: Option<u64>,
        /// How the layer answered it.
        outcome: Outcome,
        /// Whether it was a deliberate replay, not a sender's delivery.
        replay: bool,
    },
    /// A run of the handler, ended at the record's time.
    Run {
        /// Which delivery of the event ran it, where the store counted (1 for the first): a
        /// run of the second delivery is a sender's retry of one that failed or was cut off.
        delivery: Option<u64>,
        /// The instance that ran it (a host name, a pod).
        instance: String,
        /// When the handler started.
        started: SystemTime,
        /// The handler's status, when it answered.
        status: Option<u16>,
        /// The handler's error, when it failed without an answer.
        error: Option<String>,
        /// Whether the run was a deliberate replay.
        replay: bool,
    },
    /// An operator's action on the event: resolve, retry, discard, replay, purge.
    Operator {
        /// The action.
        action: String,
        /// Who asked.
        who: String,
        /// Why, in their words.
        why: String,
    },
}

/// Why stored bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a ledger record: {0}")]
pub struct Unreadable(pub &'static str);

fn micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    })
}

fn time(micros: u64) -> Result<SystemTime, Unreadable> {
    UNIX_EPOCH
        .checked_add(Duration::from_micros(micros))
        .ok_or(Unreadable("a time out of range"))
}

impl Record {
    /// The record's canonical bytes: a JSON object with its members in sorted order and times
    /// in microseconds since the Unix epoch. The same record always gives the same bytes,
    /// which is what its leaf hash commits to.
    pub fn encode(&self) -> Vec<u8> {
        let fields = match &self.event {
            Event::Delivery {
                number,
                outcome,
                replay,
            } => json!({
                "kind": "delivery",
                "number": number,
                "outcome": outcome.as_str(),
                "replay": replay,
            }),
            Event::Run {
                delivery,
                instance,
                started,
                status,
                error,
                replay,
            } => json!({
                "kind": "run",
                "delivery": delivery,
                "instance": instance,
                "started": micros(*started),
                "status": status,
                "error": error,
                "replay": replay,
            }),
            Event::Operator { action, who, why } => json!({
                "kind": "operator",
                "action": action,
                "who": who,
                "why": why,
            }),
        };
        // A BTreeMap writes its members in sorted order, whatever serde_json's features: the
        // bytes are canonical.
        let mut object: BTreeMap<String, Value> = BTreeMap::new();
        object.insert("ns".into(), json!(self.key.namespace()));
        object.insert("key".into(), json!(self.key.value()));
        object.insert("at".into(), json!(micros(self.at)));
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        serde_json::to_vec(&object).unwrap_or_default()
    }

    /// Reads a record's canonical bytes back.
    pub fn decode(bytes: &[u8]) -> Result<Self, Unreadable> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|_| Unreadable("the bytes are not JSON"))?;
        fn member<'a>(value: &'a Value, name: &str) -> Result<&'a str, Unreadable> {
            value
                .get(name)
                .and_then(Value::as_str)
                .ok_or(Unreadable("a text member is missing"))
        }
        let number = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_u64)
                .ok_or(Unreadable("a number member is missing"))
        };
        let flag = |name: &'static str| value.get(name).and_then(Value::as_bool).unwrap_or(false);
        let key = IdempotencyKey::new(
            member(&value, "ns")?.to_owned(),
            member(&value, "key")?.to_owned(),
        )
        .map_err(|_| Unreadable("the key is not a key"))?;
        let event = match member(&value, "kind")? {
            "delivery" => Event::Delivery {
                number: value.get("number").and_then(Value::as_u64),
                outcome: Outcome::parse(member(&value, "outcome")?)
                    .ok_or(Unreadable("the outcome is unknown"))?,
                replay: flag("replay"),
            },
            "run" => Event::Run {
                delivery: value.get("delivery").and_then(Value::as_u64),
                instance: member(&value, "instance")?.to_owned(),
                started: time(number("started")?)?,
                status: value
                    .get("status")
                    .and_then(Value::as_u64)
                    .and_then(|status| u16::try_from(status).ok()),
                error: value
                    .get("error")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                replay: flag("replay"),
            },
            "operator" => Event::Operator {
                action: member(&value, "action")?.to_owned(),
                who: member(&value, "who")?.to_owned(),
                why: member(&value, "why")?.to_owned(),
            },
            _ => return Err(Unreadable("the kind is unknown")),
        };
        Ok(Self {
            key,
            at: time(number("at")?)?,
            event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> IdempotencyKey {
        IdempotencyKey::new("github", "d-1").unwrap()
    }

    #[test]
    fn every_kind_round_trips_and_encodes_canonically() {
        let at = time(1_700_000_000_123_456).unwrap();
        let records = [
            Record {
                key: key(),
                at,
                event: Event::Delivery {
                    number: Some(2),
                    outcome: Outcome::Duplicate,
                    replay: false,
                },
            },
            Record {
                key: key(),
                at,
                event: Event::Run {
                    delivery: Some(2),
                    instance: "web-1".into(),
                    started: time(1_700_000_000_000_000).unwrap(),
                    status: Some(200),
                    error: None,
                    replay: true,
                },
            },
            Record {
                key: key(),
                at,
                event: Event::Operator {
                    action: "replay".into(),
                    who: "ana".into(),
                    why: "backfill \"orders\"".into(),
                },
            },
        ];
        for record in records {
            let bytes = record.encode();
            assert_eq!(Record::decode(&bytes).unwrap(), record);
            assert_eq!(record.encode(), bytes, "the same bytes every time");
        }
        let delivery = String::from_utf8(
            Record {
                key: key(),
                at,
                event: Event::Delivery {
                    number: None,
                    outcome: Outcome::Processed,
                    replay: false,
                },
            }
            .encode(),
        )
        .unwrap();
        assert_eq!(
            delivery,
            r#"{"at":1700000000123456,"key":"d-1","kind":"delivery","ns":"github","number":null,"outcome":"processed","replay":false}"#
        );
    }

    #[test]
    fn every_outcome_has_a_name_it_is_read_back_from() {
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::parse(outcome.as_str()), Some(outcome));
        }
        assert!(Record::decode(b"{}").is_err());
        assert!(Record::decode(b"not json").is_err());
    }
}
