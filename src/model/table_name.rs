//! The name of a source table, as the user gives it and as the catalog
//! stores it.

use std::fmt;

use postgres_protocol::escape::escape_identifier;

use crate::error::{Error, ErrorKind, Result};

/// A schema-qualified table name, as given by the user (`public.customers`,
/// or `customers` for the `public` schema). Names are matched exactly, as
/// stored in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    pub(crate) schema: String,
    pub name: String,
}

impl TableName {
    pub fn parse(s: &str) -> Result<TableName> {
        let (schema, name) = s.split_once('.').unwrap_or(("public", s));
        if schema.is_empty() || name.is_empty() || name.contains('.') {
            return Err(Error::new(
                ErrorKind::Config,
                format!("table {s:?} is not of the form schema.table"),
            ));
        }
        Ok(TableName {
            schema: schema.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `"schema"."name"`, for SQL.
    pub(crate) fn quoted(&self) -> String {
        format!(
            "{}.{}",
            escape_identifier(&self.schema),
            escape_identifier(&self.name)
        )
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}
