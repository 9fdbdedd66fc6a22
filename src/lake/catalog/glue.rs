//! AWS Glue's Data Catalog. Namespaces, reads, drops and renames go
//! through `iceberg-catalog-glue`; a table's creation and every commit go
//! through wal2iceberg's own calls (`glue_commit`), since the crate 0.10
//! cannot describe a `timestamptz` column to Glue, and the commits
//! `row_delta` and `expire` make themselves cannot be its `TableCommit`.
//!
//! Settings as pyiceberg names them ([`crate::lake::storage::GLUE_PROPERTIES`]):
//! `glue.id` (the catalog's account), `glue.region`, `glue.profile-name`,
//! and a credential (`glue.access-key-id`, `glue.secret-access-key`,
//! `glue.session-token`); else the AWS SDK's own chain (`AWS_*`
//! variables, `~/.aws`, the instance's role).

use std::collections::HashMap;
use std::str::FromStr;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_glue::config::{Credentials, Region};
use iceberg::spec::TableMetadataBuilder;
use iceberg::table::Table;
use iceberg::{
    Catalog, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, TableCommit, TableCreation,
    TableIdent,
};
use iceberg_catalog_glue::{
    AWS_ACCESS_KEY_ID, AWS_PROFILE_NAME, AWS_REGION_NAME, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
};

use crate::error::{Error, Result};
use crate::lake::catalog::glue_commit::GlueCommits;
use crate::lake::storage::CatalogProperties;

/// Where `iceberg-catalog-glue` puts a Glue database's `LocationUri` among
/// the namespace's properties.
const NAMESPACE_LOCATION: &str = "location_uri";

/// The properties `iceberg-catalog-glue` takes, from the lake's settings:
/// the endpoint (`uri`), the account, the region and the credential, and
/// the S3 ones its tables' files are read and written with (`storage`).
/// A server at an endpoint of its own (moto, LocalStack) is in
/// `us-east-1` unless a region is given, as the lake's S3 settings are.
/// An endpoint of Glue's needs S3's too: the crate would send the files'
/// requests to Glue's endpoint otherwise.
pub(crate) fn catalog_props(
    properties: &CatalogProperties,
    endpoint: Option<&str>,
    warehouse: &str,
    storage: HashMap<String, String>,
) -> Result<HashMap<String, String>> {
    if endpoint.is_some() && !storage.contains_key("s3.endpoint") {
        return Err(Error::new(
            crate::error::ErrorKind::Config,
            "a Glue endpoint of its own (--catalog-uri) needs S3's endpoint too: give \
             --catalog-property s3.endpoint=... or AWS_ENDPOINT_URL_S3 (for AWS's S3, \
             https://s3.<region>.amazonaws.com)",
        ));
    }
    let mut props = storage;
    props.insert("warehouse".to_owned(), warehouse.to_owned());
    if let Some(endpoint) = endpoint {
        props.insert("uri".to_owned(), endpoint.to_owned());
    }
    for (ours, theirs) in [
        ("glue.id", "catalog_id"),
        ("glue.region", AWS_REGION_NAME),
        ("glue.profile-name", AWS_PROFILE_NAME),
        ("glue.access-key-id", AWS_ACCESS_KEY_ID),
        ("glue.secret-access-key", AWS_SECRET_ACCESS_KEY),
        ("glue.session-token", AWS_SESSION_TOKEN),
    ] {
        if let Some(value) = properties.glue(ours) {
            props.insert(theirs.to_owned(), value.to_owned());
        }
    }
    let regional = |v: &str| std::env::var(v).is_ok_and(|r| !r.is_empty());
    let own_server = endpoint.is_some_and(|e| !e.contains(".amazonaws.com"));
    if own_server
        && !props.contains_key(AWS_REGION_NAME)
        && !regional("AWS_REGION")
        && !regional("AWS_DEFAULT_REGION")
    {
        props.insert(AWS_REGION_NAME.to_owned(), "us-east-1".to_owned());
    }
    Ok(props)
}

/// A client of Glue's API configured as `iceberg-catalog-glue` configures
/// its own from the same `props` ([`catalog_props`]).
pub(crate) async fn connect(props: &HashMap<String, String>) -> GlueCommits {
    let mut config = aws_config::defaults(BehaviorVersion::latest());
    if let Some(endpoint) = props.get("uri") {
        config = config.endpoint_url(endpoint);
    }
    if let (Some(key), Some(secret)) = (
        props.get(AWS_ACCESS_KEY_ID),
        props.get(AWS_SECRET_ACCESS_KEY),
    ) {
        let token = props.get(AWS_SESSION_TOKEN).cloned();
        config = config.credentials_provider(Credentials::new(key, secret, token, None, "glue.*"));
    }
    if let Some(profile) = props.get(AWS_PROFILE_NAME) {
        config = config.profile_name(profile);
    }
    if let Some(region) = props.get(AWS_REGION_NAME) {
        config = config.region(Region::new(region.clone()));
    }
    GlueCommits {
        client: aws_sdk_glue::Client::new(&config.load().await),
        catalog_id: props.get("catalog_id").cloned(),
    }
}

/// Glue as an Iceberg catalog: `iceberg-catalog-glue`'s, but for a
/// table's creation and updates ([`GlueCommits`]).
pub(crate) struct GlueCatalog {
    pub(crate) inner: iceberg_catalog_glue::GlueCatalog,
    pub(crate) commits: GlueCommits,
    /// Where tables go whose namespace names no location.
    pub(crate) warehouse: String,
}

/// Not the crate's: it shows the properties, secrets included.
impl std::fmt::Debug for GlueCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlueCatalog")
            .field("warehouse", &self.warehouse)
            .field("catalog_id", &self.commits.catalog_id)
            .finish_non_exhaustive()
    }
}

fn lake_error(e: crate::error::Error) -> iceberg::Error {
    iceberg::Error::new(ErrorKind::Unexpected, e.to_string())
}

#[async_trait]
impl Catalog for GlueCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    /// As the crate places a table (the namespace's `location`, else
    /// `<warehouse>/<namespace>.db/<table>`), with columns Glue takes.
    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        mut creation: TableCreation,
    ) -> iceberg::Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let location = match &creation.location {
            Some(location) => location.clone(),
            None => {
                let properties = self.get_namespace(namespace).await?.properties().clone();
                match properties.get(NAMESPACE_LOCATION) {
                    Some(location) => {
                        format!("{}/{}", location.trim_end_matches('/'), ident.name())
                    }
                    None => format!(
                        "{}/{}.db/{}",
                        self.warehouse.trim_end_matches('/'),
                        namespace.join("."),
                        ident.name()
                    ),
                }
            }
        };
        creation.location = Some(location.clone());
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        let file_io = self.inner.file_io();
        metadata.write_to(&file_io, &metadata_location).await?;
        self.commits
            .create(&ident, &metadata_location.to_string(), &metadata)
            .await
            .map_err(lake_error)?;
        self.inner.load_table(&ident).await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        self.inner.load_table(table).await
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(
        &self,
        table: &TableIdent,
        metadata_location: String,
    ) -> iceberg::Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }

    /// The commit's requirements checked on the table as it is, its
    /// updates applied, the new metadata written and Glue's pointer
    /// swapped under the version read with it; a lost race is a
    /// retryable conflict, as the crate's.
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        let ident = commit.identifier().clone();
        let table = self.inner.load_table(&ident).await?;
        let base = table.metadata_location_result()?.to_owned();
        let staged = commit.apply(table)?;
        let location = staged.metadata_location_result()?.to_owned();
        staged
            .metadata()
            .write_to(staged.file_io(), &MetadataLocation::from_str(&location)?)
            .await?;
        let swapped = self
            .commits
            .swap(&ident, base, &location, staged.metadata())
            .await
            .map_err(lake_error)?;
        if !swapped {
            return Err(iceberg::Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("another commit updated {ident} first"),
            )
            .with_retryable(true));
        }
        Ok(staged)
    }
}

#[cfg(test)]
mod tests {
    use iceberg::CatalogBuilder;

    use super::*;

    #[test]
    fn settings_take_glues_names_and_a_server_of_its_own_gets_a_region() {
        let properties = CatalogProperties::parse([
            "glue.id=123456789012",
            "glue.access-key-id=AKID",
            "glue.secret-access-key=SECRET",
        ])
        .unwrap();
        let props = catalog_props(
            &properties,
            Some("http://127.0.0.1:5000"),
            "s3://lake/wh",
            HashMap::from([("s3.endpoint".to_owned(), "http://127.0.0.1:5000".to_owned())]),
        )
        .unwrap();
        assert_eq!(props["catalog_id"], "123456789012");
        assert_eq!(props[AWS_ACCESS_KEY_ID], "AKID");
        assert_eq!(props[AWS_SECRET_ACCESS_KEY], "SECRET");
        assert_eq!(props["warehouse"], "s3://lake/wh");
        assert_eq!(props["uri"], "http://127.0.0.1:5000");
        assert_eq!(props["s3.endpoint"], "http://127.0.0.1:5000");
        let aws = catalog_props(
            &CatalogProperties::default(),
            None,
            "s3://l/w",
            HashMap::new(),
        )
        .unwrap();
        assert!(!aws.contains_key("uri") && !aws.contains_key("catalog_id"));
        assert!(!aws.contains_key(AWS_REGION_NAME));
        // Glue's own endpoint, and none for S3: refused, not S3 sent there.
        let refused = catalog_props(
            &properties,
            Some("https://glue-vpce.example"),
            "s3://l/w",
            HashMap::new(),
        )
        .unwrap_err();
        assert!(refused.to_string().contains("s3.endpoint"), "{refused}");
    }

    #[tokio::test]
    async fn the_catalog_never_shows_its_secrets() {
        let properties =
            CatalogProperties::parse(["glue.access-key-id=AKID", "glue.secret-access-key=S3CR3T"])
                .unwrap();
        let s3 = HashMap::from([("s3.endpoint".to_owned(), "http://127.0.0.1:9".to_owned())]);
        let props = catalog_props(&properties, Some("http://127.0.0.1:9"), "s3://l/w", s3).unwrap();
        let commits = connect(&props).await;
        let inner = iceberg_catalog_glue::GlueCatalogBuilder::default()
            .load("glue", props)
            .await
            .unwrap();
        let catalog = GlueCatalog {
            inner,
            commits,
            warehouse: "s3://l/w".into(),
        };
        let shown = format!("{catalog:?}");
        assert!(
            !shown.contains("S3CR3T") && shown.contains("s3://l/w"),
            "{shown}"
        );
    }
}
