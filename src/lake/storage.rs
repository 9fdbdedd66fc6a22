//! Where a lake's files live: a local folder, or S3 (and S3-compatible
//! servers) through `iceberg-storage-opendal`, configured by the
//! conventions users know: the `AWS_*` environment variables, and catalog
//! properties named as pyiceberg names them (`s3.endpoint`,
//! `s3.access-key-id`, `s3.secret-access-key`, `s3.session-token`,
//! `s3.region`, `s3.path-style-access`), a property winning over the
//! environment.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use iceberg::io::StorageFactory;
use iceberg_storage_opendal::OpenDalStorageFactory;

/// A lake's warehouse: a local folder, or an object store URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warehouse {
    Folder(PathBuf),
    /// `s3://bucket/prefix` (or `s3a://`).
    Uri(String),
}

impl Warehouse {
    /// A folder path, a `file://` URI or an `s3://` URI.
    pub fn parse(text: &str) -> Result<Warehouse, String> {
        if let Some(path) = text.strip_prefix("file://") {
            return Ok(Warehouse::Folder(PathBuf::from(path)));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Warehouse::Folder(PathBuf::from(text)));
        };
        match scheme {
            "s3" | "s3a" if !rest.is_empty() && !rest.starts_with('/') => {
                Ok(Warehouse::Uri(text.trim_end_matches('/').to_owned()))
            }
            "s3" | "s3a" => Err("an S3 warehouse names its bucket: s3://bucket/prefix".to_owned()),
            other => Err(format!(
                "{other}:// is not supported; give a folder, file://folder or s3://bucket/prefix"
            )),
        }
    }
}

/// Catalog properties (`--catalog-property key=value`): for storage, the
/// `s3.*` keys. Their values may be secrets: `Debug` shows keys only, and
/// no error prints a value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CatalogProperties(BTreeMap<String, String>);

impl std::fmt::Debug for CatalogProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The environment variables S3 users set, and the property each fills.
const AWS_VARIABLES: &[(&str, &str)] = &[
    ("AWS_ENDPOINT_URL_S3", "s3.endpoint"),
    ("AWS_ENDPOINT_URL", "s3.endpoint"),
    ("AWS_ACCESS_KEY_ID", "s3.access-key-id"),
    ("AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
    ("AWS_SESSION_TOKEN", "s3.session-token"),
    ("AWS_REGION", "s3.region"),
    ("AWS_DEFAULT_REGION", "s3.region"),
];

impl CatalogProperties {
    /// Properties from `key=value` pairs; the key must not be empty.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<CatalogProperties, String> {
        let mut properties = BTreeMap::new();
        for pair in pairs {
            match pair.split_once('=') {
                Some((key, value)) if !key.trim().is_empty() => {
                    properties.insert(key.trim().to_owned(), value.to_owned());
                }
                _ => {
                    return Err(
                        "expected key=value, such as s3.endpoint=http://localhost:9000".to_owned(),
                    );
                }
            }
        }
        Ok(CatalogProperties(properties))
    }

    /// The properties the object store reads, from the process's
    /// environment and these properties.
    pub fn storage_props(&self) -> HashMap<String, String> {
        self.storage_props_with(|name| std::env::var(name).ok())
    }

    /// The same, with `env` for the environment. A property wins over a
    /// variable, the first variable of [`AWS_VARIABLES`] over a later one
    /// for the same property. A server at an endpoint of its own (MinIO,
    /// moto, Ceph) is addressed by path unless `s3.path-style-access`
    /// says otherwise, and in `us-east-1` unless a region is given.
    fn storage_props_with(&self, env: impl Fn(&str) -> Option<String>) -> HashMap<String, String> {
        let mut props: HashMap<String, String> = HashMap::new();
        for (variable, property) in AWS_VARIABLES {
            if let Some(value) = env(variable).filter(|v| !v.is_empty()) {
                props.entry((*property).to_owned()).or_insert(value);
            }
        }
        props.extend(self.0.clone());
        if props.contains_key("s3.endpoint") {
            props
                .entry("s3.path-style-access".to_owned())
                .or_insert_with(|| "true".to_owned());
            props
                .entry("s3.region".to_owned())
                .or_insert_with(|| "us-east-1".to_owned());
        }
        props
    }
}

/// The storage of a warehouse on an object store.
pub fn object_store() -> Arc<dyn StorageFactory> {
    Arc::new(OpenDalStorageFactory::S3 {
        customized_credential_load: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warehouses_are_folders_unless_they_name_a_store() {
        assert_eq!(
            Warehouse::parse("./lake/warehouse").unwrap(),
            Warehouse::Folder("./lake/warehouse".into())
        );
        assert_eq!(
            Warehouse::parse("file:///tmp/w").unwrap(),
            Warehouse::Folder("/tmp/w".into())
        );
        assert_eq!(
            Warehouse::parse("s3://bucket/lake/").unwrap(),
            Warehouse::Uri("s3://bucket/lake".into())
        );
        let no_bucket = Warehouse::parse("s3:///lake").unwrap_err();
        assert!(no_bucket.contains("names its bucket"), "{no_bucket}");
        let other = Warehouse::parse("hdfs://nn/lake").unwrap_err();
        assert!(other.contains("hdfs:// is not supported"), "{other}");
    }

    #[test]
    fn properties_win_over_the_environment_and_secrets_are_not_shown() {
        let props = CatalogProperties::parse([
            "s3.endpoint=http://127.0.0.1:9000",
            "s3.secret-access-key=hunter2",
        ])
        .unwrap();
        let env = |name: &str| match name {
            "AWS_ENDPOINT_URL" => Some("http://elsewhere:1".to_owned()),
            "AWS_ACCESS_KEY_ID" => Some("AKID".to_owned()),
            "AWS_SECRET_ACCESS_KEY" => Some("from-env".to_owned()),
            _ => None,
        };
        let storage = props.storage_props_with(env);
        assert_eq!(storage["s3.endpoint"], "http://127.0.0.1:9000");
        assert_eq!(storage["s3.access-key-id"], "AKID");
        assert_eq!(storage["s3.secret-access-key"], "hunter2");
        assert_eq!(storage["s3.path-style-access"], "true");
        assert_eq!(storage["s3.region"], "us-east-1");
        let shown = format!("{props:?}");
        assert!(!shown.contains("hunter2") && shown.contains("s3.secret-access-key"));
    }

    #[test]
    fn aws_s3_itself_keeps_its_own_addressing() {
        let env = |name: &str| (name == "AWS_REGION").then(|| "eu-west-1".to_owned());
        let storage = CatalogProperties::default().storage_props_with(env);
        assert_eq!(storage["s3.region"], "eu-west-1");
        assert!(!storage.contains_key("s3.path-style-access"));
    }

    #[test]
    fn a_pair_without_a_key_is_refused() {
        for bad in ["novalue", "=x"] {
            assert!(CatalogProperties::parse([bad]).is_err(), "{bad}");
        }
    }
}
