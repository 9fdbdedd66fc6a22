//! Tables loaded from a REST catalog with the credentials it vends for
//! their files. iceberg-rust 0.10.1's `RestCatalog::load_table` builds a
//! table's FileIO from the response's `config` alone and leaves
//! `storage-credentials` unread: the REST spec's newer field, where
//! rustberg and other recent servers put what they vend. Here a table is
//! loaded as pyiceberg 0.12 loads it: the credential whose prefix is the
//! longest the table's location starts with is laid over the table's
//! properties. Kept narrow so upstream support can replace it.
//!
//! Spec: the REST catalog's OpenAPI, `GET /v1/{prefix}/namespaces/{ns}/tables/{table}`
//! (loadTable), `LoadTableResult.storage-credentials`.

use iceberg::Runtime;
use iceberg::TableIdent;
use iceberg::io::FileIOBuilder;
use iceberg::table::Table;
use iceberg_catalog_rest::{LoadTableResult, StorageCredential};

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::rest_commit::RestCommits;

impl RestCommits {
    /// The table `ident` as the catalog holds it now, its files read and
    /// written with the properties the catalog gives for it: the
    /// server's defaults, the catalog properties, the server's overrides
    /// and the table's `config` (the catalog properties win over it, as
    /// iceberg-rust has them), and over all of them the credential the
    /// server vends for the table's location.
    pub(crate) async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let namespace = ident.namespace().join("\u{1f}");
        let path = ["namespaces", &namespace, "tables", ident.name()];
        let response = self.get(&path).await?;
        let status = response.status();
        if !status.is_success() {
            let message = match status.as_u16() {
                404 => "the table is not in the catalog".to_owned(),
                _ => format!(
                    "the REST catalog refused to load the table: {}",
                    crate::lake::catalog::rest_commit::server_message(response).await
                ),
            };
            return Err(Error::new(ErrorKind::Lake, message)
                .with_context("table", ident)
                .with_context("status", status.as_u16()));
        }
        let loaded: LoadTableResult = response.json().await.map_err(|e| {
            Error::new(ErrorKind::Lake, "the REST catalog's table does not parse")
                .with_context("table", ident)
                .with_source(e)
        })?;
        let metadata_location = loaded.metadata_location.ok_or_else(|| {
            Error::new(
                ErrorKind::Lake,
                "the REST catalog gave no metadata location",
            )
            .with_context("table", ident)
        })?;
        let mut props = self.server_props().await?;
        props.extend(loaded.config);
        props.extend(self.props().clone());
        let credentials = loaded.storage_credentials.unwrap_or_default();
        if let Some(vended) = vended_for(&credentials, loaded.metadata.location()) {
            props.extend(vended.config.clone());
        }
        let file_io = FileIOBuilder::new(self.storage()).with_props(props).build();
        Table::builder()
            .identifier(ident.clone())
            .file_io(file_io)
            .metadata(loaded.metadata)
            .metadata_location(metadata_location)
            .runtime(Runtime::current())
            .build()
            .map_err(|e| {
                Error::new(ErrorKind::Lake, "cannot open the REST catalog's table")
                    .with_context("table", ident)
                    .with_source(e)
            })
    }
}

/// The credential for the files under the table `location`: the one of
/// the longest prefix they start with (the spec's rule; a server may name
/// the table's folder with its slash, as rustberg does).
fn vended_for<'a>(
    credentials: &'a [StorageCredential],
    location: &str,
) -> Option<&'a StorageCredential> {
    let folder = format!("{}/", location.trim_end_matches('/'));
    credentials
        .iter()
        .filter(|c| folder.starts_with(&c.prefix))
        .max_by_key(|c| c.prefix.len())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn credential(prefix: &str, key: &str) -> StorageCredential {
        StorageCredential {
            prefix: prefix.to_owned(),
            config: HashMap::from([("s3.access-key-id".to_owned(), key.to_owned())]),
        }
    }

    #[test]
    fn the_longest_prefix_the_location_starts_with_is_chosen() {
        let credentials = [
            credential("s3://bucket/", "bucket"),
            credential("s3://bucket/wh/shop/orders/", "table"),
            credential("s3://bucket/wh/", "warehouse"),
            credential("s3://other/wh/shop/orders/and/more", "other"),
        ];
        let key = |location| {
            vended_for(&credentials, location).map(|c| c.config["s3.access-key-id"].as_str())
        };
        assert_eq!(key("s3://bucket/wh/shop/orders"), Some("table"));
        assert_eq!(key("s3://bucket/wh/shop/orders/"), Some("table"));
        assert_eq!(key("s3://bucket/wh/shop/orders_changes"), Some("warehouse"));
        assert_eq!(key("s3://bucket/wh/shop/customers"), Some("warehouse"));
        assert_eq!(key("s3://bucket/elsewhere"), Some("bucket"));
        assert_eq!(key("s3://third/wh"), None);
    }
}
