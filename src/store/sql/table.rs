//! Table names: validated once, quoted in every statement.

use super::super::ConfigError;

/// The table every SQL store uses unless told otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idempotency_keys";

/// The longest table name (or schema name) accepted: 63 bytes (Postgres' identifier limit)
/// less the longest index suffix, so the derived index names are never truncated into each
/// other.
pub(crate) const MAX_TABLE_NAME_LEN: usize = 63 - COMPLETED_INDEX_SUFFIX.len();
const _: () = assert!(
    MAX_TABLE_NAME_LEN == 49,
    "update the message in TableName::parse"
);

/// The indexes of earlier releases, which every commit had to update; `migrate` drops them:
/// the partial one of `processing` rows (PostgreSQL, SQLite), and those on
/// `(state, claimed_at)` and `(state, completed_at)`.
const STUCK_INDEX_SUFFIX: &str = "_stuck_idx";
const CLAIMED_INDEX_SUFFIX: &str = "_claimed_idx";
const COMPLETED_INDEX_SUFFIX: &str = "_completed_idx";
/// The suffix of the entity versions table of the [version guard](crate::version_guard).
const VERSIONS_SUFFIX: &str = "_versions";
const _: () = assert!(
    MAX_TABLE_NAME_LEN + VERSIONS_SUFFIX.len() + "_pkey".len() <= 63,
    "the versions table and its primary key's name must fit Postgres' 63-byte identifiers"
);

/// The suffix of the inbox table of [`InboxStore`](crate::store::inbox::InboxStore), and of its
/// indexes: due queued entries, and running ones by their last renewal.
const INBOX_SUFFIX: &str = "_inbox";
const INBOX_DUE_INDEX_SUFFIX: &str = "_inbox_due_idx";
const INBOX_RUNNING_INDEX_SUFFIX: &str = "_inbox_run_idx";
const _: () = assert!(
    MAX_TABLE_NAME_LEN + INBOX_DUE_INDEX_SUFFIX.len() <= 63
        && MAX_TABLE_NAME_LEN + INBOX_RUNNING_INDEX_SUFFIX.len() <= 63
        && MAX_TABLE_NAME_LEN + INBOX_SUFFIX.len() + "_pkey".len() <= 63,
    "the inbox table, its indexes and its primary key's name must fit Postgres' 63-byte identifiers"
);

/// A validated table name, optionally schema-qualified (Postgres only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    schema: Option<String>,
    table: String,
}

impl TableName {
    /// The default table.
    pub(crate) fn default_table() -> Self {
        Self {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
        }
    }

    /// Validates `name`: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_TABLE_NAME_LEN`] bytes; with
    /// `allow_schema`, also `schema.table` with each part so.
    pub(crate) fn parse(name: &str, allow_schema: bool) -> Result<Self, ConfigError> {
        let invalid = |reason: &'static str| ConfigError::InvalidTableName {
            name: name.to_owned(),
            reason,
        };
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) if allow_schema => (Some(schema), table),
            Some(_) => return Err(invalid("this backend takes no schema-qualified name")),
            None => (None, name),
        };
        for part in schema.iter().chain([&table]) {
            if part.is_empty() {
                return Err(invalid("it is empty"));
            }
            if part.len() > MAX_TABLE_NAME_LEN {
                return Err(invalid("it is longer than 49 bytes"));
            }
            let mut bytes = part.bytes();
            let first_ok = bytes
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
            if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(
                    "only ASCII letters, digits and `_` are allowed, not starting with a digit",
                ));
            }
        }
        Ok(Self {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// The name as given.
    pub(crate) fn name(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The table, quoted with `quote` (`"` or `` ` ``), schema-qualified if it has a schema.
    /// Validation admits no quote characters, so quoting cannot be escaped.
    pub(crate) fn quoted(&self, quote: char) -> String {
        match &self.schema {
            Some(schema) => format!("{quote}{schema}{quote}.{quote}{}{quote}", self.table),
            None => format!("{quote}{}{quote}", self.table),
        }
    }

    /// The table of entity versions: `<table>_versions`, in the same schema. At most 58
    /// bytes, so Postgres' name for its primary key (`<table>_versions_pkey`) fits in 63.
    pub(crate) fn versions(&self) -> Self {
        self.suffixed(VERSIONS_SUFFIX)
    }

    /// The inbox table: `<table>_inbox`, in the same schema. At most 55 bytes.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn inbox(&self) -> Self {
        self.suffixed(INBOX_SUFFIX)
    }

    /// The quoted, unqualified name of the inbox's index of queued entries by due time:
    /// `<table>_inbox_due_idx`.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn inbox_due_index(&self, quote: char) -> String {
        format!("{quote}{}{INBOX_DUE_INDEX_SUFFIX}{quote}", self.table)
    }

    /// The quoted, unqualified name of the inbox's index of running entries by last renewal:
    /// `<table>_inbox_run_idx`.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn inbox_running_index(&self, quote: char) -> String {
        format!("{quote}{}{INBOX_RUNNING_INDEX_SUFFIX}{quote}", self.table)
    }

    /// The quoted, unqualified name of the MySQL table's check constraint on `state`:
    /// `<table>_state_check`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn state_check(&self, quote: char) -> String {
        format!("{quote}{}_state_check{quote}", self.table)
    }

    /// `<table><suffix>`, in the same schema: the tables beside the claims' (the versions',
    /// the inbox's, the ledger's). The caller keeps the result within the database's limit on
    /// names.
    pub(crate) fn suffixed(&self, suffix: &str) -> Self {
        Self {
            schema: self.schema.clone(),
            table: format!("{}{suffix}", self.table),
        }
    }

    /// The unqualified table name, unquoted: for catalog lookups.
    pub(crate) fn bare(&self) -> &str {
        &self.table
    }

    /// The unquoted names of the indexes of earlier releases, which every commit had to
    /// update: `migrate` drops them.
    pub(crate) fn old_indexes(&self) -> [String; 3] {
        [
            STUCK_INDEX_SUFFIX,
            CLAIMED_INDEX_SUFFIX,
            COMPLETED_INDEX_SUFFIX,
        ]
        .map(|suffix| format!("{}{suffix}", self.table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for ok in [
            "idempotency_keys",
            "_t",
            "T1",
            &"a".repeat(MAX_TABLE_NAME_LEN),
        ] {
            assert!(TableName::parse(ok, false).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "a-b",
            "a b",
            "t\"",
            "t`",
            "é",
            "a;drop",
            &"a".repeat(MAX_TABLE_NAME_LEN + 1),
            "s.t",
        ] {
            assert!(TableName::parse(bad, false).is_err(), "{bad}");
        }
        let qualified = TableName::parse("app.claims", true).unwrap();
        assert_eq!(qualified.quoted('"'), r#""app"."claims""#);
        assert_eq!(
            qualified.old_indexes(),
            [
                "claims_stuck_idx",
                "claims_claimed_idx",
                "claims_completed_idx"
            ]
        );
        assert_eq!(qualified.name(), "app.claims");
        for bad in [".t", "s.", "s.t.u", "s.1"] {
            assert!(TableName::parse(bad, true).is_err(), "{bad}");
        }
        let long = "a".repeat(MAX_TABLE_NAME_LEN);
        let table = TableName::parse(&long, false).unwrap();
        assert!(table.old_indexes().iter().all(|index| index.len() <= 63));
        assert_eq!(table.inbox_due_index('"').len(), 63 + 2);
        assert_eq!(table.inbox_running_index('"').len(), 63 + 2);
        assert_eq!(table.inbox().bare().len(), 55);
        assert_eq!(qualified.inbox().quoted('"'), r#""app"."claims_inbox""#);
    }
}
