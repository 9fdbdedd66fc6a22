//! The files under a table's folder and when each was last written: what
//! the orphan sweep ([`crate::lake::maintenance::expire`]) weighs against what the table
//! refers to. iceberg-rust 0.10's FileIO cannot list, so a local folder is
//! walked, and an S3 or GCS prefix is listed through opendal (the library
//! under the lake's FileIO), configured from the table's own FileIO
//! properties: the lake's `s3.*` or `gcs.*` settings, or the credentials a
//! REST catalog vended for the table.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use futures_util::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use opendal::services::{Gcs, S3};

use crate::blocking::blocking;
use crate::error::{Error, ErrorKind, Result};

/// A file, by its location as the table's metadata writes one
/// (`file:///...`, `s3://bucket/...`).
pub(crate) struct Listed {
    pub(crate) location: String,
    /// None when the store's listing does not say.
    pub(crate) modified: Option<SystemTime>,
}

/// Every file under the folder `location`, recursively; nothing when it
/// does not exist, `None` for a scheme this cannot list.
pub(crate) async fn files_under(
    location: &str,
    props: &HashMap<String, String>,
) -> Result<Option<Vec<Listed>>> {
    let Some((scheme, rest)) = location.split_once("://") else {
        return walk(PathBuf::from(location)).await.map(Some);
    };
    match scheme {
        "file" => walk(PathBuf::from(rest)).await.map(Some),
        "s3" | "s3a" | "gs" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let operator = match scheme {
                "gs" => gcs_operator(bucket, props),
                _ => s3_operator(bucket, props),
            }
            .map_err(|e| listing_error(&location, e))?;
            list_store(scheme, bucket, prefix, &operator)
                .await
                .map(Some)
        }
        _ => Ok(None),
    }
}

/// Deletes `files` through `file_io`, one request each,
/// [`DELETES_AT_ONCE`] at a time.
pub(crate) async fn delete_each(file_io: &FileIO, files: Vec<Listed>) -> Result<()> {
    futures_util::stream::iter(files)
        .map(|file| async move {
            file_io.delete(&file.location).await.map_err(|e| {
                crate::lake::iceberg_error(e, "cannot delete the table's files")
                    .with_context("location", &file.location)
            })
        })
        .buffer_unordered(DELETES_AT_ONCE)
        .try_collect()
        .await
}

/// Deletes in flight at once in [`delete_each`].
const DELETES_AT_ONCE: usize = 16;

async fn walk(folder: PathBuf) -> Result<Vec<Listed>> {
    blocking(move || {
        let mut out = Vec::new();
        let mut pending = vec![folder];
        while let Some(dir) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(listing_error(&dir.display(), e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| listing_error(&dir.display(), e))?;
                let meta = entry
                    .metadata()
                    .map_err(|e| listing_error(&dir.display(), e))?;
                if meta.is_dir() {
                    pending.push(entry.path());
                } else {
                    out.push(Listed {
                        location: format!("file://{}", entry.path().display()),
                        modified: Some(
                            meta.modified()
                                .map_err(|e| listing_error(&dir.display(), e))?,
                        ),
                    });
                }
            }
        }
        Ok(out)
    })
}

async fn list_store(
    scheme: &str,
    bucket: &str,
    prefix: &str,
    operator: &opendal::Operator,
) -> Result<Vec<Listed>> {
    let folder = format!("{scheme}://{bucket}/{prefix}");
    let failed = |e: opendal::Error| listing_error(&folder, e);
    let mut lister = operator
        .lister_with(&format!("{}/", prefix.trim_end_matches('/')))
        .recursive(true)
        .await
        .map_err(failed)?;
    let mut out = Vec::new();
    while let Some(entry) = lister.try_next().await.map_err(failed)? {
        let meta = entry.metadata();
        if meta.is_dir() {
            continue;
        }
        out.push(Listed {
            location: format!("{scheme}://{bucket}/{}", entry.path()),
            modified: meta.last_modified().map(Into::into),
        });
    }
    Ok(out)
}

/// One of opendal's S3 settings.
type Setter = fn(S3, &str) -> S3;

/// An operator on `bucket` as iceberg's S3 storage builds one from the
/// same properties: virtual-host addressing unless `s3.path-style-access`
/// says otherwise; what is not given comes from the AWS environment.
fn s3_operator(
    bucket: &str,
    props: &HashMap<String, String>,
) -> opendal::Result<opendal::Operator> {
    let get = |key: &str| props.get(key).map(String::as_str);
    let mut builder = S3::default().bucket(bucket);
    let settings: [(&str, Setter); 6] = [
        ("s3.endpoint", S3::endpoint),
        ("s3.region", S3::region),
        ("client.region", S3::region),
        ("s3.access-key-id", S3::access_key_id),
        ("s3.secret-access-key", S3::secret_access_key),
        ("s3.session-token", S3::session_token),
    ];
    for (key, set) in settings {
        if let Some(value) = get(key) {
            builder = set(builder, value);
        }
    }
    let path_style = get("s3.path-style-access")
        .is_some_and(|v| ["true", "t", "1", "on"].contains(&v.to_lowercase().as_str()));
    if !path_style {
        builder = builder.enable_virtual_host_style();
    }
    Ok(opendal::Operator::new(builder)?.finish())
}

/// An operator on `bucket` as iceberg's GCS storage builds one from the
/// same properties (`gcs.no-auth`, given at all, sends no credential);
/// what is not given comes from Google's application default credentials.
fn gcs_operator(
    bucket: &str,
    props: &HashMap<String, String>,
) -> opendal::Result<opendal::Operator> {
    let mut builder = Gcs::default().bucket(bucket);
    if let Some(endpoint) = props.get("gcs.service.path") {
        builder = builder.endpoint(endpoint);
    }
    if let Some(credential) = props.get("gcs.credentials-json") {
        builder = builder.credential(credential);
    }
    if let Some(token) = props.get("gcs.oauth2.token") {
        builder = builder.token(token.clone());
    }
    if props.contains_key("gcs.no-auth") {
        builder = builder
            .skip_signature()
            .disable_vm_metadata()
            .disable_config_load();
    }
    Ok(opendal::Operator::new(builder)?.finish())
}

fn listing_error(
    folder: &dyn std::fmt::Display,
    e: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::new(ErrorKind::Io, "cannot list the table's files")
        .with_context("folder", folder)
        .with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_folder_lists_recursively_as_file_locations_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/part=1")).unwrap();
        std::fs::write(dir.path().join("data/part=1/a.parquet"), b"x").unwrap();
        std::fs::write(dir.path().join("data/b.parquet"), b"y").unwrap();
        let root = format!("file://{}", dir.path().join("data").display());
        let mut found: Vec<String> = files_under(&root, &HashMap::new())
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|f| f.location)
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                format!("{root}/b.parquet"),
                format!("{root}/part=1/a.parquet")
            ]
        );
        let missing = format!("file://{}", dir.path().join("nothing").display());
        let listed = files_under(&missing, &HashMap::new()).await.unwrap();
        assert!(listed.unwrap().is_empty());
        let other = files_under("hdfs://nn/t", &HashMap::new()).await.unwrap();
        assert!(other.is_none());
    }
}
