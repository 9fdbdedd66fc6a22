//! Commits through a REST catalog's own atomic operation. iceberg-rust
//! 0.10 cannot build a `TableCommit` outside its crate, so the commits
//! `row_delta` and `expire` make themselves (a snapshot with delete
//! files, a rewrite, an expiry) go to the catalog here: the updates the
//! table metadata builder recorded, with the requirements that make the
//! server apply them only to the table they were planned on
//! (`assert-table-uuid`, and `assert-ref-snapshot-id` of `main`); the
//! changes of several tables as one transaction.
//!
//! Spec: the REST catalog's OpenAPI, `POST /v1/{prefix}/namespaces/{ns}/tables/{table}`
//! (updateTable) and `POST /v1/{prefix}/transactions/commit`
//! (commitTransaction): 409 is a lost race, 500, 502, 503 and 504 leave
//! the commit's outcome unknown. Kept narrow so an upstream public
//! `TableCommit` can replace it.
//!
//! Authentication follows pyiceberg's properties: `token` (a bearer
//! token), or `credential` (`client_id:client_secret`, exchanged at
//! `oauth2-server-uri`, by default `<uri>/v1/oauth/tokens`, for a token
//! with `scope`, by default `catalog`); `header.<name>` adds a header.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::io::StorageFactory;
use iceberg::spec::{MAIN_BRANCH, TableMetadataBuildResult};
use iceberg::table::Table;
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::{Error, ErrorKind, Result};

/// A REST catalog's endpoint for commits.
pub(crate) struct RestCommits {
    client: reqwest::Client,
    uri: String,
    props: HashMap<String, String>,
    /// What the tables' files are read and written through
    /// (`rest_tables`).
    storage: Arc<dyn StorageFactory>,
    /// The server's configuration and the token, once asked for.
    session: Mutex<Option<Session>>,
}

#[derive(Clone)]
struct Session {
    /// The base of every request after the configuration: the server's
    /// `uri` override, else the catalog URI (as iceberg-catalog-rest's
    /// own requests take it).
    uri: String,
    prefix: Option<String>,
    token: Option<String>,
    config: ConfigResponse,
}

#[derive(Serialize)]
struct CommitRequest<'a> {
    identifier: &'a TableIdent,
    requirements: Vec<TableRequirement>,
    updates: &'a [TableUpdate],
}

#[derive(Serialize)]
struct TransactionRequest<'a> {
    #[serde(rename = "table-changes")]
    table_changes: Vec<CommitRequest<'a>>,
}

#[derive(Deserialize, Default, Clone)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
}

impl RestCommits {
    /// Commits to the catalog at `uri` (its base, before `/v1`), with the
    /// catalog properties `props` (`warehouse`, `prefix`, `token`,
    /// `credential`, `oauth2-server-uri`, `scope`, `header.*`); its
    /// tables' files go through `storage`.
    pub(crate) fn new(
        uri: &str,
        props: HashMap<String, String>,
        storage: Arc<dyn StorageFactory>,
    ) -> RestCommits {
        RestCommits {
            client: reqwest::Client::new(),
            uri: uri.trim_end_matches('/').to_owned(),
            props,
            storage,
            session: Mutex::new(None),
        }
    }

    /// The catalog properties it was given.
    pub(in crate::lake) fn props(&self) -> &HashMap<String, String> {
        &self.props
    }

    pub(in crate::lake) fn storage(&self) -> Arc<dyn StorageFactory> {
        self.storage.clone()
    }

    /// The catalog properties under the server's overrides and over its
    /// defaults, as the REST spec merges them.
    pub(in crate::lake) async fn server_props(&self) -> Result<HashMap<String, String>> {
        let config = self.session().await?.config;
        let mut props = config.defaults;
        props.extend(self.props.clone());
        props.extend(config.overrides);
        Ok(props)
    }

    /// Applies each change (`built`, planned on `table`) to its table in
    /// the catalog, all or none, if every table is still the one its
    /// change was planned on: true when they landed, false when another
    /// commit came first.
    pub(crate) async fn commit(
        &self,
        planned: &[(&Table, &TableMetadataBuildResult)],
    ) -> Result<bool> {
        let requests: Vec<CommitRequest> = planned
            .iter()
            .map(|(table, built)| {
                let metadata = table.metadata();
                CommitRequest {
                    identifier: table.identifier(),
                    requirements: vec![
                        TableRequirement::UuidMatch {
                            uuid: metadata.uuid(),
                        },
                        TableRequirement::RefSnapshotIdMatch {
                            r#ref: MAIN_BRANCH.to_owned(),
                            snapshot_id: metadata.current_snapshot_id(),
                        },
                    ],
                    updates: &built.changes,
                }
            })
            .collect();
        let tables: Vec<String> = requests.iter().map(|r| r.identifier.to_string()).collect();
        let response = match requests.as_slice() {
            [one] => {
                let namespace = one.identifier.namespace().join("\u{1f}");
                let path = ["namespaces", &namespace, "tables", one.identifier.name()];
                self.post(&path, one, true).await?
            }
            _ => {
                let body = TransactionRequest {
                    table_changes: requests,
                };
                self.post(&["transactions", "commit"], &body, true).await?
            }
        };
        let status = response.status();
        let refused = |kind: ErrorKind, message: &str| {
            Error::new(kind, message.to_owned())
                .with_context("table", tables.join(", "))
                .with_context("status", status.as_u16())
        };
        match status.as_u16() {
            200..=299 => Ok(true),
            409 => Ok(false),
            404 => Err(refused(
                ErrorKind::Lake,
                "the table vanished from the catalog",
            )),
            // Retryable: the run starts over, every table read anew.
            500 | 502 | 503 | 504 => Err(refused(
                ErrorKind::Io,
                "the REST catalog failed the commit and cannot say whether it landed; the run \
                 starts again and reads each table's position from the catalog",
            )),
            _ => Err(refused(
                ErrorKind::Lake,
                &format!(
                    "the REST catalog refused the commit: {}",
                    server_message(response).await
                ),
            )),
        }
    }

    /// POSTs `body` to `path` under the catalog's prefix.
    async fn post(
        &self,
        path: &[&str],
        body: &(impl Serialize + Sync),
        retry_auth: bool,
    ) -> Result<reqwest::Response> {
        self.send(path, &|url| self.client.post(url).json(body), retry_auth)
            .await
    }

    /// GETs `path` under the catalog's prefix.
    pub(in crate::lake) async fn get(&self, path: &[&str]) -> Result<reqwest::Response> {
        self.send(path, &|url| self.client.get(url), true).await
    }

    /// The request `make` makes for `path` under the catalog's prefix,
    /// with the headers and the token; a 401 with a credential gets a new
    /// token, once.
    async fn send(
        &self,
        path: &[&str],
        make: &(dyn Fn(url::Url) -> reqwest::RequestBuilder + Sync),
        retry_auth: bool,
    ) -> Result<reqwest::Response> {
        let session = self.session().await?;
        let url = session.url(path)?;
        let mut request = self.with_headers(make(url));
        if let Some(token) = &session.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| self.http_error(e))?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED
            && retry_auth
            && self.props.contains_key("credential")
        {
            *self.session.lock().await = None;
            return Box::pin(self.send(path, make, false)).await;
        }
        Ok(response)
    }

    /// The server's prefix and a token, asked for once.
    async fn session(&self) -> Result<Session> {
        let mut held = self.session.lock().await;
        if let Some(session) = held.as_ref() {
            return Ok(session.clone());
        }
        let mut session = Session {
            uri: self.uri.clone(),
            prefix: None,
            token: self.props.get("token").cloned(),
            config: ConfigResponse::default(),
        };
        if let Some(credential) = self.props.get("credential") {
            session.token = Some(self.exchange(credential).await?);
        }
        let mut url = url::Url::parse(&format!("{}/v1/config", self.uri))
            .map_err(|e| config_error(&format!("the catalog URI is not a URL: {e}")))?;
        if let Some(warehouse) = self.props.get("warehouse") {
            url.query_pairs_mut().append_pair("warehouse", warehouse);
        }
        let mut request = self.with_headers(self.client.get(url));
        if let Some(token) = &session.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| self.http_error(e))?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the REST catalog refused its configuration: {}",
                    server_message(response).await
                ),
            )
            .with_context("status", status));
        }
        let config: ConfigResponse = response.json().await.map_err(|e| self.http_error(e))?;
        session.configure(&self.props, config);
        *held = Some(session.clone());
        Ok(session)
    }

    /// A token for `credential` (`client_id:client_secret`, or a secret
    /// alone) by the OAuth2 client-credentials grant.
    async fn exchange(&self, credential: &str) -> Result<String> {
        let (id, secret) = match credential.split_once(':') {
            Some((id, secret)) => (Some(id), secret),
            None => (None, credential),
        };
        let endpoint = self
            .props
            .get("oauth2-server-uri")
            .cloned()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri));
        let scope = self.props.get("scope").map_or("catalog", String::as_str);
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_secret", secret),
            ("scope", scope),
        ];
        if let Some(id) = id {
            form.push(("client_id", id));
        }
        let response = self
            .client
            .post(&endpoint)
            .form(&form)
            .send()
            .await
            .map_err(|e| self.http_error(e))?;
        if !response.status().is_success() {
            return Err(Error::new(
                ErrorKind::Config,
                "the REST catalog's token endpoint refused the credential (check the \
                 credential and scope catalog properties)",
            )
            .with_context("status", response.status().as_u16()));
        }
        let token: TokenResponse = response.json().await.map_err(|e| self.http_error(e))?;
        Ok(token.access_token)
    }

    /// The `header.*` properties.
    fn with_headers(&self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (name, value) in self
            .props
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("header.").map(|k| (k, v)))
        {
            request = request.header(name, value);
        }
        request
    }

    fn http_error(&self, e: reqwest::Error) -> Error {
        // reqwest's message names the URL, never a header or a body.
        Error::new(ErrorKind::Io, "cannot reach the REST catalog").with_source(e)
    }
}

impl Session {
    /// Takes up the server's configuration: the prefix (the server's
    /// override, else the catalog's property, else the server's default)
    /// and the `uri` override.
    fn configure(&mut self, props: &HashMap<String, String>, config: ConfigResponse) {
        self.prefix = config
            .overrides
            .get("prefix")
            .or(props.get("prefix"))
            .or(config.defaults.get("prefix"))
            .cloned();
        if let Some(uri) = config.overrides.get("uri") {
            self.uri = uri.trim_end_matches('/').to_owned();
        }
        self.config = config;
    }

    /// `<uri>/v1[/<prefix>]` and `parts`.
    fn url(&self, parts: &[&str]) -> Result<url::Url> {
        let mut url = url::Url::parse(&self.uri)
            .map_err(|e| config_error(&format!("the catalog URI is not a URL: {e}")))?;
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| config_error("the catalog URI cannot take a path"))?;
            segments.pop_if_empty().push("v1");
            if let Some(prefix) = &self.prefix {
                segments.extend(prefix.split('/'));
            }
            segments.extend(parts);
        }
        Ok(url)
    }
}

fn config_error(message: &str) -> Error {
    Error::new(ErrorKind::Config, message.to_owned())
}

/// The `error.message` of a REST error response, cut short; never a
/// header.
pub(in crate::lake) async fn server_message(response: reqwest::Response) -> String {
    #[derive(Deserialize)]
    struct Body {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        message: String,
    }
    match response.json::<Body>().await {
        Ok(body) => body.error.message.chars().take(300).collect(),
        Err(_) => "no message".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(uri: &str) -> Session {
        Session {
            uri: uri.to_owned(),
            prefix: None,
            token: None,
            config: ConfigResponse::default(),
        }
    }

    #[test]
    fn requests_go_where_the_servers_configuration_sends_them() {
        let props = HashMap::from([("prefix".to_owned(), "mine".to_owned())]);
        let path = ["namespaces", "shop", "tables", "orders"];

        let mut plain = session("http://catalog:8181");
        plain.configure(&props, ConfigResponse::default());
        assert_eq!(
            plain.url(&path).unwrap().as_str(),
            "http://catalog:8181/v1/mine/namespaces/shop/tables/orders"
        );

        // The server's overrides win over the catalog's properties, as
        // iceberg-catalog-rest merges them, for the base URI too.
        let mut moved = session("http://catalog:8181");
        moved.configure(
            &props,
            ConfigResponse {
                defaults: HashMap::from([("prefix".to_owned(), "default".to_owned())]),
                overrides: HashMap::from([
                    ("uri".to_owned(), "https://gateway/api/catalog/".to_owned()),
                    ("prefix".to_owned(), "ws/main".to_owned()),
                ]),
            },
        );
        assert_eq!(
            moved.url(&path).unwrap().as_str(),
            "https://gateway/api/catalog/v1/ws/main/namespaces/shop/tables/orders"
        );
    }
}
