//! The reading of [`Pointer::seek`](super::Pointer::seek) that serde_json does: finds one
//! field in a single pass, skipping everything else without building a tree, and checks that
//! the whole document is valid JSON. The quick scan (`scan`) answers only documents it reads
//! exactly as this does, and leaves every other one, and so every error, to this.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Found, KeyError, Pointer, array_index};

pub(super) fn find<'a>(body: &'a [u8], pointer: &Pointer) -> Result<Found<'a>, KeyError> {
    let not_json = |err: serde_json::Error| KeyError::NotJson {
        detail: err.to_string(),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Seek(&pointer.tokens)
        .deserialize(&mut de)
        .map_err(not_json)?;
    de.end().map_err(not_json)?;
    Ok(found)
}

pub(super) fn key_text(value: &serde_json::Value, pointer: &Pointer) -> Result<String, KeyError> {
    use serde_json::Value;
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Value::Number(_) => Err(wrong_type(pointer, "a fractional number")),
        Value::Null => Err(wrong_type(pointer, "null")),
        Value::Bool(_) => Err(wrong_type(pointer, "a boolean")),
        Value::Array(_) => Err(wrong_type(pointer, "an array")),
        Value::Object(_) => Err(wrong_type(pointer, "an object")),
    }
}

pub(super) fn wrong_type(pointer: &Pointer, kind: &str) -> KeyError {
    KeyError::invalid(format!(
        "{} is {kind}; expected a string or an integer",
        pointer.expected()
    ))
}

/// Walks `tokens` down the document; at the end of the path, reads the value.
struct Seek<'p>(&'p [String]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Found<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<Found<'de>, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Text(Cow::Borrowed(v))))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Text(Cow::Owned(v.to_owned()))))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Text(Cow::Owned(v))))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Integer(v.into())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Integer(v.into())))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Other("a fractional number")))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Other("a boolean")))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Found<'de>, E> {
        Ok(self.leaf(|| Found::Other("null")))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let Some((token, rest)) = self.0.split_first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Found::Other("an object"));
        };
        // Like most JSON readers, the last of duplicated names wins.
        let mut found = Found::Absent;
        while let Some(matches) = map.next_key_seed(NameIs(token))? {
            if matches {
                found = map.next_value_seed(Seek(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found<'de>, A::Error> {
        let Some((token, rest)) = self.0.split_first() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Found::Other("an array"));
        };
        let index = array_index(token);
        let mut found = Found::Absent;
        let mut at = 0usize;
        loop {
            if Some(at) == index {
                match seq.next_element_seed(Seek(rest))? {
                    Some(value) => found = value,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            at += 1;
        }
        Ok(found)
    }
}

impl Seek<'_> {
    /// A scalar: the answer if the path ends here, absent if it goes deeper.
    fn leaf<'de>(&self, found: impl FnOnce() -> Found<'de>) -> Found<'de> {
        if self.0.is_empty() {
            found()
        } else {
            Found::Absent
        }
    }
}

/// Compares an object member's name to one token without allocating.
struct NameIs<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for NameIs<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object member name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}
