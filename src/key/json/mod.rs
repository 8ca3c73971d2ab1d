//! Keys in a JSON body: [`Json`] (one field, found by an RFC 6901 pointer) and
//! [`JsonFields`] (a synthetic key of several fields), with the pointer and the streaming
//! walkers that find a field without building a tree: a quick scan for the documents senders
//! send (`scan`), and serde_json for every other one (`seek`).

use std::borrow::Cow;

use http::request::Parts;

mod scan;
mod seek;

use super::{
    DEFAULT_NAMESPACE, ExtractKey, IdempotencyKey, KeyError, MAX_KEY_LEN, Name, check_text,
    valid_namespace,
};

/// The key in a field of a JSON body, found by an RFC 6901 pointer. Built by [`json`].
///
/// The version guard reads versions with it too, built by
/// [`version::json`](crate::version_guard::version::json).
#[derive(Debug, Clone)]
pub struct Json {
    pointer: Pointer,
    namespace: Name,
}

/// The key is the JSON string or integer at `pointer` (RFC 6901, e.g. `"/id"` or
/// `"/event/id"`) in the request body. An integer becomes its decimal text. The body is
/// buffered through the layer's limit and passed on intact.
///
/// # Panics
///
/// If `pointer` is neither empty nor starts with `/`.
pub fn json(pointer: &str) -> Json {
    Json {
        pointer: Pointer::parse(pointer),
        namespace: Name::Static(DEFAULT_NAMESPACE),
    }
}

impl Json {
    pub(crate) fn preset(pointer: &str, namespace: &'static str) -> Self {
        Self {
            pointer: Pointer::parse(pointer),
            namespace: Name::Static(namespace),
        }
    }

    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }

    /// Where the field is.
    pub(crate) fn pointer(&self) -> &Pointer {
        &self.pointer
    }
}

impl ExtractKey for Json {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let value = match self.pointer.seek(body.unwrap_or_default())? {
            Found::Text(text) => text,
            Found::Integer(n) => Cow::Owned(n.to_string()),
            Found::Absent => return Err(KeyError::missing(self.pointer.expected())),
            Found::Other(kind) => return Err(seek::wrong_type(&self.pointer, kind)),
        };
        IdempotencyKey::in_namespace(&self.namespace, &value)
    }
}

/// A synthetic key made of several JSON fields. Built by [`json_fields`].
#[derive(Debug, Clone)]
pub struct JsonFields {
    pointers: Vec<Pointer>,
    namespace: Name,
}

/// A synthetic key for senders that give no event id: the JSON strings or integers at each of
/// `pointers`, written as a JSON array (so `["a:b", "c"]` and `["a", "b:c"]` stay distinct).
///
/// Choose fields that really are unique per event (an order number, not an amount), and say
/// why in a comment where you build the layer.
///
/// ```
/// use tower_idempotency::key::{self, ExtractKey};
///
/// // The legacy sender has no event id, but an order number is unique per customer.
/// let extractor = key::json_fields(["/customer", "/order_number"]).namespace("legacy");
/// let (parts, ()) = http::Request::new(()).into_parts();
/// let body = br#"{"customer": "cus_9", "order_number": 1001, "amount": 500}"#;
/// let key = extractor.extract(&parts, Some(body)).unwrap();
/// assert_eq!(key.value(), r#"["cus_9","1001"]"#);
/// ```
///
/// # Panics
///
/// If a pointer is neither empty nor starts with `/`, or `pointers` is empty.
pub fn json_fields<I, P>(pointers: I) -> JsonFields
where
    I: IntoIterator<Item = P>,
    P: AsRef<str>,
{
    let pointers: Vec<Pointer> = pointers
        .into_iter()
        .map(|p| Pointer::parse(p.as_ref()))
        .collect();
    assert!(
        !pointers.is_empty(),
        "json_fields needs at least one pointer"
    );
    JsonFields {
        pointers,
        namespace: Name::Static(DEFAULT_NAMESPACE),
    }
}

impl JsonFields {
    /// Like [`ExtractKey::namespace`], without wrapping the extractor in another type.
    pub fn namespace(mut self, namespace: impl Into<Cow<'static, str>>) -> Self {
        self.namespace = valid_namespace(namespace.into());
        self
    }
}

impl ExtractKey for JsonFields {
    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn extract(&self, _parts: &Parts, body: Option<&[u8]>) -> Result<IdempotencyKey, KeyError> {
        let body = body.unwrap_or_default();
        let document: serde_json::Value =
            serde_json::from_slice(body).map_err(|err| KeyError::NotJson {
                detail: err.to_string(),
            })?;
        let parts = self
            .pointers
            .iter()
            .map(|pointer| {
                let field = document
                    .pointer(&pointer.source)
                    .ok_or_else(|| KeyError::missing(pointer.expected()))?;
                let text = seek::key_text(field, pointer)?;
                // Each part is checked like a key of its own: an empty order number must not
                // merge every such event into one.
                check_text("key", &text, MAX_KEY_LEN)
                    .map_err(|err| KeyError::invalid(format!("{}: {err}", pointer.expected())))?;
                Ok(text)
            })
            .collect::<Result<Vec<String>, KeyError>>()?;
        // Serialising a list of strings cannot fail.
        let value = serde_json::to_string(&parts).unwrap_or_default();
        IdempotencyKey::in_namespace(&self.namespace, &value)
    }
}

/// An RFC 6901 JSON pointer, split into its unescaped tokens.
#[derive(Debug, Clone)]
pub(crate) struct Pointer {
    source: String,
    tokens: Vec<String>,
}

/// What is at a [`Pointer`] in a JSON document: what a key or a version is read from.
#[derive(Debug, PartialEq)]
pub(crate) enum Found<'a> {
    /// Nothing: a member or an index on the way is missing, or the path goes on past a scalar.
    Absent,
    /// A string, borrowed from the document unless it had escapes.
    Text(Cow<'a, str>),
    /// An integer, of either sign, as large as JSON readers give it (`u64` or `i64`).
    Integer(i128),
    /// A value of another kind, named for messages: `a fractional number`, `an object`.
    Other(&'static str),
}

impl Pointer {
    /// Finds the field in `body` in one pass, checking that all of `body` is valid JSON (the
    /// only error: [`KeyError::NotJson`]).
    ///
    /// The quick scan answers the documents it reads exactly as serde_json does; it leaves
    /// every other one (invalid JSON among them, so that its message is serde_json's) to a
    /// second pass by serde_json.
    pub(crate) fn seek<'a>(&self, body: &'a [u8]) -> Result<Found<'a>, KeyError> {
        match scan::find(body, &self.tokens) {
            Some(found) => Ok(found),
            None => seek::find(body, self),
        }
    }

    pub(crate) fn parse(source: &str) -> Self {
        assert!(
            source.is_empty() || source.starts_with('/'),
            "a JSON pointer is empty or starts with `/`, got {source:?}"
        );
        let tokens = source
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        Self {
            source: source.to_owned(),
            tokens,
        }
    }

    /// Where the field was expected, for messages: ``JSON field `/id` ``.
    pub(crate) fn expected(&self) -> String {
        format!("JSON field `{}`", self.source)
    }
}

/// The array index a pointer token names, if any. RFC 6901: `0` or digits without a leading
/// zero (no sign, which `usize::from_str` would accept).
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    (digits && (token == "0" || !token.starts_with('0')))
        .then(|| token.parse::<usize>().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::tests::parts;

    #[test]
    fn json_pointer_lookup() {
        let p = parts(&[]);
        let body = br#"{"type":"x","data":{"object":{"id":"in_1"}},"list":[{"id":7},{"id":"b"}],"id":"evt_1","a/b":{"m~n":"esc"}}"#;
        let find = |ptr: &str| json(ptr).extract(&p, Some(body));
        assert_eq!(find("/id").unwrap().value(), "evt_1");
        assert_eq!(find("/data/object/id").unwrap().value(), "in_1");
        assert_eq!(find("/list/0/id").unwrap().value(), "7");
        assert_eq!(find("/list/1/id").unwrap().value(), "b");
        assert_eq!(find("/a~1b/m~0n").unwrap().value(), "esc");
        assert!(matches!(find("/nope"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/list/2/id"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/list/01/id"), Err(KeyError::Missing { .. })));
        assert!(matches!(find("/data"), Err(KeyError::Invalid { .. })));
        assert!(matches!(find("/list"), Err(KeyError::Invalid { .. })));
        assert!(matches!(
            find("/type/deeper"),
            Err(KeyError::Missing { .. })
        ));
    }

    #[test]
    fn json_rejects_bad_documents_and_types() {
        let p = parts(&[]);
        let ex = json("/id");
        for body in [
            &b"not json"[..],
            b"{\"id\":\"a\"",
            b"{\"id\":\"a\"} trailing",
            b"",
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::NotJson { .. }), "{body:?}: {err:?}");
        }
        for body in [
            &br#"{"id":null}"#[..],
            br#"{"id":true}"#,
            br#"{"id":1.5}"#,
            br#"{"id":""}"#,
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::Invalid { .. }), "{body:?}: {err:?}");
        }
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":-42}"#)).unwrap().value(),
            "-42"
        );
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":"a","id":"b"}"#))
                .unwrap()
                .value(),
            "b",
            "the last duplicate wins, as in serde_json::Value"
        );
        assert_eq!(
            ex.extract(&p, Some(br#"{"id":"\u00e9v\"t"}"#))
                .unwrap()
                .value(),
            "év\"t"
        );
    }

    #[test]
    fn json_fields_is_unambiguous() {
        let p = parts(&[]);
        let ex = json_fields(["/a", "/b"]);
        let one = ex.extract(&p, Some(br#"{"a":"x:y","b":"z"}"#)).unwrap();
        let two = ex.extract(&p, Some(br#"{"a":"x","b":"y:z"}"#)).unwrap();
        assert_ne!(one, two);
        let missing = ex.extract(&p, Some(br#"{"a":"x"}"#)).unwrap_err();
        assert_eq!(missing, KeyError::missing("JSON field `/b`"));
    }

    #[test]
    fn json_fields_checks_each_part() {
        let ex = json_fields(["/customer", "/order"]);
        let p = parts(&[]);
        for body in [
            &br#"{"customer":"c1","order":""}"#[..],
            br#"{"customer":"c1","order":"a\u0000"}"#,
        ] {
            let err = ex.extract(&p, Some(body)).unwrap_err();
            assert!(matches!(err, KeyError::Invalid { .. }), "{err:?}");
        }
    }
}
