//! Where a lake's files live: a local folder, S3 (and S3-compatible
//! servers) or Google Cloud Storage, through `iceberg-storage-opendal`,
//! configured by the conventions users know: for S3 the `AWS_*`
//! environment variables, and catalog properties named as Iceberg's S3
//! FileIO names them (`s3.endpoint`, `s3.access-key-id`,
//! `s3.secret-access-key`, `s3.session-token`, `s3.region`, pyiceberg's
//! names too; and `s3.path-style-access`); for GCS Google's application
//! default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, a VM's service
//! account), `STORAGE_EMULATOR_HOST`, and the `gcs.*` properties. A
//! property wins over the environment. `durable_fs` syncs a local lake's
//! files and folders; `listing` lists a table's files with their ages.

pub(crate) mod durable_fs;
pub(crate) mod listing;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use iceberg::io::StorageFactory;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

/// A lake's warehouse: a local folder, or an object store URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Warehouse {
    Folder(PathBuf),
    /// `s3://bucket/prefix` (or `s3a://`), `gs://bucket/prefix`.
    Uri(String),
}

impl Warehouse {
    /// A folder path, a `file://` URI, or an `s3://` or `gs://` URI.
    pub(crate) fn parse(text: &str) -> Result<Warehouse, String> {
        if let Some(path) = text.strip_prefix("file://") {
            return Ok(Warehouse::Folder(PathBuf::from(path)));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Warehouse::Folder(PathBuf::from(text)));
        };
        let bucket = rest.split('/').next().unwrap_or_default();
        match scheme {
            "s3" | "s3a" | "gs" if bucket.chars().any(|c| c.is_ascii_uppercase()) => {
                Err(format!("bucket names are lowercase, not {bucket:?}"))
            }
            "s3" | "s3a" | "gs" if !bucket.is_empty() => {
                Ok(Warehouse::Uri(text.trim_end_matches('/').to_owned()))
            }
            "s3" | "s3a" | "gs" => Err(format!(
                "an object store warehouse names its bucket: {scheme}://bucket/prefix"
            )),
            other => Err(format!(
                "{other}:// is not supported; give a folder, file://folder, s3://bucket/prefix \
                 or gs://bucket/prefix"
            )),
        }
    }
}

/// Catalog properties (`--catalog-property key=value`): for storage, the
/// `s3.*` and `gcs.*` keys; for a REST catalog, pyiceberg's names ([`REST_PROPERTIES`]
/// and `header.<name>`). Their values may be secrets: `Debug` shows keys
/// only, and no error prints a value.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct CatalogProperties(BTreeMap<String, String>);

impl std::fmt::Debug for CatalogProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The properties a lake takes (the names of iceberg-rust and Iceberg's
/// Java S3 FileIO, which pyiceberg shares but for path-style access; for
/// GCS pyiceberg's and Java's `gcs.service.host` for the endpoint, which
/// iceberg-rust calls `gcs.service.path`, and iceberg-rust's others).
const PROPERTIES: &[&str] = &[
    "s3.endpoint",
    "s3.access-key-id",
    "s3.secret-access-key",
    "s3.session-token",
    "s3.region",
    "s3.path-style-access",
    GCS_ENDPOINT,
    GCS_ENDPOINT_RUST,
    "gcs.oauth2.token",
    GCS_CREDENTIALS,
    GCS_NO_AUTH,
];

/// A service account's key, in base64, iceberg-rust's.
const GCS_CREDENTIALS: &str = "gcs.credentials-json";

/// GCS's endpoint, as pyiceberg and Iceberg's Java GCS FileIO name it.
const GCS_ENDPOINT: &str = "gcs.service.host";
/// The same, as iceberg-rust names it.
const GCS_ENDPOINT_RUST: &str = "gcs.service.path";
/// No credential at all (an emulator), iceberg-rust's.
const GCS_NO_AUTH: &str = "gcs.no-auth";

/// A REST catalog's properties, as pyiceberg and iceberg-rust name them:
/// a bearer `token`, or a `credential` (`client_id:client_secret`)
/// exchanged at `oauth2-server-uri` for a token of `scope` (`audience`,
/// `resource`); the server's `prefix`.
const REST_PROPERTIES: &[&str] = &[
    "token",
    "credential",
    "oauth2-server-uri",
    "scope",
    "audience",
    "resource",
    "prefix",
];

/// AWS Glue's properties, as pyiceberg names them: the Data Catalog's
/// account (`glue.id`), its region, and a credential or profile for it
/// when not the environment's ([`crate::lake::catalog::glue`]).
pub(in crate::lake) const GLUE_PROPERTIES: &[&str] = &[
    "glue.id",
    "glue.region",
    "glue.profile-name",
    "glue.access-key-id",
    "glue.secret-access-key",
    "glue.session-token",
];

/// The properties of a credential: taken all from the properties when
/// one of them is there, else all from the environment, never mixed.
const CREDENTIAL: &[&str] = &[
    "s3.access-key-id",
    "s3.secret-access-key",
    "s3.session-token",
];

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
    /// Properties from `key=value` pairs, each key one of [`PROPERTIES`].
    pub(crate) fn parse<'a>(
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<CatalogProperties, String> {
        let mut properties = BTreeMap::new();
        for pair in pairs {
            match pair.split_once('=') {
                // opendal takes a key only in base64 and, given another,
                // goes on with Google's default credentials unsaid.
                Some((key, value))
                    if key.trim() == GCS_CREDENTIALS
                        && base64::engine::general_purpose::STANDARD
                            .decode(value.trim())
                            .is_err() =>
                {
                    return Err(format!(
                        "{GCS_CREDENTIALS} takes a service account's key file in base64 \
                         (base64 -w0 key.json)"
                    ));
                }
                Some((key, value))
                    if PROPERTIES.contains(&key.trim())
                        || GLUE_PROPERTIES.contains(&key.trim())
                        || is_rest(key.trim()) =>
                {
                    properties.insert(key.trim().to_owned(), value.to_owned());
                }
                Some((key, _)) => {
                    return Err(format!(
                        "unknown property {:?}; known: {}, {}, {} and header.<name> (a \
                         [catalog] table in a file also takes type, uri, warehouse and name)",
                        key.trim(),
                        PROPERTIES.join(", "),
                        GLUE_PROPERTIES.join(", "),
                        REST_PROPERTIES.join(", ")
                    ));
                }
                None => {
                    return Err(
                        "expected key=value, such as s3.endpoint=http://localhost:9000".to_owned(),
                    );
                }
            }
        }
        Ok(CatalogProperties(properties))
    }

    /// Whether a storage property (`s3.*`, `gcs.*`) is given.
    pub(crate) fn names_object_store(&self) -> bool {
        self.0.keys().any(|k| PROPERTIES.contains(&k.as_str()))
    }

    /// Whether a REST catalog's property is given.
    pub(crate) fn names_rest(&self) -> bool {
        self.0.keys().any(|k| is_rest(k))
    }

    /// Whether a Glue catalog's property is given.
    pub(crate) fn names_glue(&self) -> bool {
        self.0.keys().any(|k| GLUE_PROPERTIES.contains(&k.as_str()))
    }

    /// The REST catalog's properties.
    pub(crate) fn rest_props(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.0
            .iter()
            .filter(|(k, _)| is_rest(k))
            .map(|(k, v)| (k.clone(), v.clone()))
    }

    /// The value of Glue's property `key`.
    pub(in crate::lake) fn glue(&self, key: &str) -> Option<&str> {
        debug_assert!(GLUE_PROPERTIES.contains(&key));
        self.0.get(key).map(String::as_str)
    }

    /// The properties the object store reads, from the process's
    /// environment and these properties.
    pub(crate) fn storage_props(&self) -> HashMap<String, String> {
        self.storage_props_with(|name| std::env::var(name).ok())
    }

    /// The same, with `env` for the environment. A property wins over a
    /// variable, the first variable of [`AWS_VARIABLES`] over a later one
    /// for the same property; a credential comes whole from one side
    /// ([`CREDENTIAL`]). A server at an endpoint of its own, not AWS's
    /// (MinIO, moto, Ceph), is addressed by path unless
    /// `s3.path-style-access` says otherwise, and in `us-east-1` unless a
    /// region is given.
    fn storage_props_with(&self, env: impl Fn(&str) -> Option<String>) -> HashMap<String, String> {
        let credential_given = CREDENTIAL.iter().any(|k| self.0.contains_key(*k));
        let mut props: HashMap<String, String> = HashMap::new();
        for (variable, property) in AWS_VARIABLES {
            if credential_given && CREDENTIAL.contains(property) {
                continue;
            }
            if let Some(value) = env(variable).filter(|v| !v.is_empty()) {
                props.entry((*property).to_owned()).or_insert(value);
            }
        }
        props.extend(self.0.clone());
        // Google's client libraries take an emulator from this variable,
        // and send it no credential.
        if let Some(host) = env("STORAGE_EMULATOR_HOST").filter(|h| !h.is_empty())
            && !props.contains_key(GCS_ENDPOINT)
            && !props.contains_key(GCS_ENDPOINT_RUST)
        {
            // Go's client takes a bare `host:port` there too.
            let endpoint = if host.contains("://") {
                host
            } else {
                format!("http://{host}")
            };
            props.insert(GCS_ENDPOINT.to_owned(), endpoint);
            props
                .entry(GCS_NO_AUTH.to_owned())
                .or_insert_with(|| "true".to_owned());
        }
        if let Some(endpoint) = props.get(GCS_ENDPOINT).cloned() {
            props
                .entry(GCS_ENDPOINT_RUST.to_owned())
                .or_insert(endpoint);
        }
        let own_server = props
            .get("s3.endpoint")
            .is_some_and(|e| !e.contains(".amazonaws.com"));
        if own_server {
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

/// Whether `key` is a REST catalog's property.
fn is_rest(key: &str) -> bool {
    REST_PROPERTIES.contains(&key) || key.strip_prefix("header.").is_some_and(|h| !h.is_empty())
}

/// The storage of a warehouse on an object store, by each location's
/// scheme.
pub(crate) fn object_store() -> Arc<dyn StorageFactory> {
    Arc::new(OpenDalResolvingStorageFactory::new())
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
        assert_eq!(
            Warehouse::parse("s3a://bucket").unwrap(),
            Warehouse::Uri("s3a://bucket".into())
        );
        let capitals = Warehouse::parse("s3://Lake/x").unwrap_err();
        assert!(capitals.contains("lowercase"), "{capitals}");
        let no_bucket = Warehouse::parse("s3:///lake").unwrap_err();
        assert!(no_bucket.contains("names its bucket"), "{no_bucket}");
        let other = Warehouse::parse("hdfs://nn/lake").unwrap_err();
        assert!(other.contains("hdfs:// is not supported"), "{other}");
        assert_eq!(
            Warehouse::parse("gs://bucket/lake/").unwrap(),
            Warehouse::Uri("gs://bucket/lake".into())
        );
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
        assert!(
            !storage.contains_key("s3.access-key-id"),
            "a credential is not mixed from two sources"
        );
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
    fn the_environment_alone_fills_in_order_and_skips_empty_values() {
        let env = |name: &str| match name {
            "AWS_ENDPOINT_URL_S3" => Some("http://s3-only:1".to_owned()),
            "AWS_ENDPOINT_URL" => Some("http://any:1".to_owned()),
            "AWS_REGION" => Some(String::new()),
            "AWS_DEFAULT_REGION" => Some("eu-central-1".to_owned()),
            "AWS_ACCESS_KEY_ID" => Some("AKID".to_owned()),
            _ => None,
        };
        let props = CatalogProperties::parse(["s3.path-style-access=false"]).unwrap();
        let storage = props.storage_props_with(env);
        assert_eq!(storage["s3.endpoint"], "http://s3-only:1");
        assert_eq!(storage["s3.region"], "eu-central-1");
        assert_eq!(storage["s3.access-key-id"], "AKID");
        assert_eq!(storage["s3.path-style-access"], "false");
    }

    #[test]
    fn an_aws_endpoint_keeps_virtual_hosts_and_needs_its_region() {
        let env = |name: &str| {
            (name == "AWS_ENDPOINT_URL").then(|| "https://s3.eu-west-1.amazonaws.com".to_owned())
        };
        let storage = CatalogProperties::default().storage_props_with(env);
        assert!(!storage.contains_key("s3.path-style-access"));
        assert!(!storage.contains_key("s3.region"));
    }

    #[test]
    fn gcs_takes_pyicebergs_endpoint_and_an_emulator_from_the_environment() {
        let emulator = |name: &str| {
            (name == "STORAGE_EMULATOR_HOST").then(|| "http://127.0.0.1:4443".to_owned())
        };
        let storage = CatalogProperties::default().storage_props_with(emulator);
        assert_eq!(storage[GCS_ENDPOINT_RUST], "http://127.0.0.1:4443");
        assert_eq!(storage[GCS_NO_AUTH], "true");
        let bare = |name: &str| (name == "STORAGE_EMULATOR_HOST").then(|| "gcs:4443".to_owned());
        let storage = CatalogProperties::default().storage_props_with(bare);
        assert_eq!(storage[GCS_ENDPOINT_RUST], "http://gcs:4443");
        let raw = CatalogProperties::parse(["gcs.credentials-json={\"type\": \"x\"}"]).unwrap_err();
        assert!(raw.contains("base64") && !raw.contains("type"), "{raw}");
        assert!(CatalogProperties::parse(["gcs.credentials-json=eyJ0eXBlIjogIngifQ=="]).is_ok());

        let given = CatalogProperties::parse([
            "gcs.service.host=https://storage.example",
            "gcs.oauth2.token=ya29",
        ])
        .unwrap();
        assert!(given.names_object_store());
        let storage = given.storage_props_with(emulator);
        assert_eq!(storage[GCS_ENDPOINT_RUST], "https://storage.example");
        assert!(
            !storage.contains_key(GCS_NO_AUTH),
            "a property's endpoint keeps the credential"
        );
        assert!(!format!("{given:?}").contains("ya29"));
    }

    #[test]
    fn unknown_keys_and_pairs_without_a_key_are_refused() {
        for bad in ["novalue", "=x", "uri=sqlite:/tmp/x", "s3.acess-key-id=x"] {
            assert!(CatalogProperties::parse([bad]).is_err(), "{bad}");
        }
        let rest =
            CatalogProperties::parse(["token=t0k", "header.X-Tenant=a", "prefix=p"]).unwrap();
        assert!(rest.names_rest() && !rest.names_object_store());
        assert_eq!(rest.rest_props().count(), 3);
        assert!(!format!("{rest:?}").contains("t0k"));
        assert!(CatalogProperties::parse(["header.=x"]).is_err());
        let err = CatalogProperties::parse(["warehouse=s3://x"]).unwrap_err();
        assert!(err.contains("unknown property \"warehouse\"") && err.contains("s3.endpoint"));
        assert!(err.contains("type, uri, warehouse and name"), "{err}");
    }
}
