//! The Iceberg REST catalog. Loads and creates go through the catalog's
//! endpoints; commits are our own `CommitTableRequest`s (iceberg-rust 0.10
//! keeps its `TableCommit` construction private), with the requirements our
//! snapshot producer sets, so a 409 means another writer committed first.
//!
//! Auth: a static bearer token, or OAuth2 client credentials exchanged at
//! the token endpoint and refreshed a minute before they expire (and once on
//! a 401). `headers` are sent with every request. TLS is rustls.
//!
//! A small reqwest client rather than iceberg-catalog-rest: that crate has no
//! token refresh, does not expose its session for our own commit requests,
//! and would give us a second HTTP stack to configure; the five endpoints we
//! use are a few lines each.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use iceberg::io::{FileIO, FileIOBuilder};
use iceberg::spec::{Schema, TableMetadata, UnboundPartitionSpec};
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Catalog, TableState};
use crate::config::{RestConfig, S3Config};
use crate::error::{Error, Result, codes};

#[derive(Debug)]
pub struct RestCatalog {
    http: reqwest::Client,
    cfg: RestConfig,
    uri: String,
    session: tokio::sync::OnceCell<Session>,
    token: tokio::sync::Mutex<Option<(String, Instant)>>,
    file_io: OnceLock<FileIO>,
}

#[derive(Debug, Clone)]
struct Session {
    /// `v1/<prefix>/` or `v1/`.
    base: String,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(Deserialize)]
struct LoadTableResult {
    #[serde(rename = "metadata-location")]
    metadata_location: Option<String>,
    metadata: TableMetadata,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Serialize)]
struct CommitTableRequest<'a> {
    identifier: Identifier<'a>,
    requirements: &'a [TableRequirement],
    updates: &'a [TableUpdate],
}

#[derive(Serialize)]
struct Identifier<'a> {
    namespace: &'a [String],
    name: &'a str,
}

/// A request's outcome when the server answered.
struct Answer {
    status: StatusCode,
    body: String,
}

impl RestCatalog {
    pub fn new(cfg: &RestConfig) -> Result<Self> {
        if cfg.token.is_some() && cfg.credential.is_some() {
            return Err(Error::Config(
                "[catalog]: set `token` or `credential`, not both".into(),
            ));
        }
        if let Some(c) = &cfg.credential
            && !c.contains(':')
        {
            return Err(Error::Config(
                "catalog.credential must be `client_id:client_secret`".into(),
            ));
        }
        let timeout = match &cfg.request_timeout {
            Some(t) => humantime::parse_duration(t)
                .map_err(|e| Error::Config(format!("catalog.request_timeout `{t}`: {e}")))?,
            None => Duration::from_secs(30),
        };
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Config(format!("catalog.uri: {e}")))?;
        url::Url::parse(&cfg.uri)
            .map_err(|e| Error::Config(format!("catalog.uri `{}`: {e}", cfg.uri)))?;
        Ok(RestCatalog {
            http,
            uri: cfg.uri.trim_end_matches('/').to_string(),
            cfg: cfg.clone(),
            session: tokio::sync::OnceCell::new(),
            token: tokio::sync::Mutex::new(None),
            file_io: OnceLock::new(),
        })
    }

    fn unreachable(&self, e: reqwest::Error) -> Error {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            msg.push_str(": ");
            msg.push_str(&inner.to_string());
            source = inner.source();
        }
        Error::Unavailable(format!("REST catalog {}: {msg}", self.uri))
    }

    /// A bearer token, fetched or refreshed when missing or about to expire.
    async fn bearer(&self, force: bool) -> Result<Option<String>> {
        if let Some(t) = &self.cfg.token {
            return Ok(Some(t.clone()));
        }
        let Some(credential) = &self.cfg.credential else {
            return Ok(None);
        };
        let mut cached = self.token.lock().await;
        if !force
            && let Some((t, refresh_at)) = cached.as_ref()
            && Instant::now() < *refresh_at
        {
            return Ok(Some(t.clone()));
        }
        let (id, secret) = credential.split_once(':').unwrap_or((credential, ""));
        let url = self
            .cfg
            .oauth2_server_uri
            .clone()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri));
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", id),
            ("client_secret", secret),
            ("scope", self.cfg.scope.as_deref().unwrap_or("catalog")),
        ];
        let resp = self
            .http
            .post(&url)
            .form(&form)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| self.unreachable(e))?;
        if !status.is_success() {
            return Err(Error::Config(format!(
                "catalog.credential: the token endpoint {url} answered {status}: {}",
                server_message(&body)
            )));
        }
        let t: TokenResponse = serde_json::from_str(&body).map_err(|e| {
            Error::Config(format!(
                "catalog.credential: {url} sent no token ({e}): {body}"
            ))
        })?;
        let lifetime = Duration::from_secs(t.expires_in.unwrap_or(3600));
        // Refresh a minute early, or at half-life for short-lived tokens.
        let early = Duration::from_secs(60).min(lifetime / 2);
        *cached = Some((t.access_token.clone(), Instant::now() + lifetime - early));
        Ok(Some(t.access_token))
    }

    /// One request with auth and headers; a 401 refreshes the token once.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer> {
        let url = format!("{}/{}", self.uri, path);
        let mut force = false;
        loop {
            let mut req = self.http.request(method.clone(), &url);
            for (k, v) in &self.cfg.headers {
                req = req.header(k.as_str(), v.as_str());
            }
            if let Some(t) = self.bearer(force).await? {
                req = req.bearer_auth(t);
            }
            if let Some(b) = &body {
                req = req.json(b);
            }
            let resp = req.send().await.map_err(|e| self.unreachable(e))?;
            let status = resp.status();
            let text = resp.text().await.map_err(|e| self.unreachable(e))?;
            if status == StatusCode::UNAUTHORIZED && self.cfg.credential.is_some() && !force {
                force = true;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                let setting = if self.cfg.token.is_some() {
                    "catalog.token"
                } else {
                    "catalog.credential"
                };
                return Err(Error::Config(format!(
                    "{setting}: the REST catalog refused {method} {url} with {status}: {}",
                    server_message(&text)
                )));
            }
            return Ok(Answer { status, body: text });
        }
    }

    async fn session(&self) -> Result<&Session> {
        self.session
            .get_or_try_init(|| async {
                let mut path = "v1/config".to_string();
                if let Some(w) = &self.cfg.warehouse {
                    path.push_str(&format!("?warehouse={}", urlencode(w)));
                }
                let a = self.call(Method::GET, &path, None).await?;
                if !a.status.is_success() {
                    let what = match &self.cfg.warehouse {
                        Some(w) if a.status == StatusCode::NOT_FOUND => {
                            format!("catalog.warehouse `{w}` is not known to the REST catalog")
                        }
                        _ => format!("REST catalog {}: GET /v1/config", self.uri),
                    };
                    return Err(Error::Config(format!(
                        "{what} ({}): {}",
                        a.status,
                        server_message(&a.body)
                    )));
                }
                let c: ConfigResponse = serde_json::from_str(&a.body).map_err(|e| {
                    Error::Config(format!(
                        "REST catalog {}: /v1/config is not a catalog config ({e})",
                        self.uri
                    ))
                })?;
                let prefix = self
                    .cfg
                    .prefix
                    .clone()
                    .or_else(|| c.overrides.get("prefix").cloned())
                    .or_else(|| c.defaults.get("prefix").cloned());
                // Server defaults, then server overrides, then ours.
                let mut props = c.defaults.clone();
                props.extend(c.overrides.clone());
                let _ = self.file_io.set(file_io_for(self.cfg.s3.as_ref(), props));
                let session = Session {
                    base: match &prefix {
                        Some(p) if !p.is_empty() => format!("v1/{}/", urlencode(p)),
                        _ => "v1/".to_string(),
                    },
                };
                // Fail fast on a warehouse or prefix the server does not have:
                // listing namespaces is the cheapest call that needs both.
                let a = self
                    .call(Method::GET, &format!("{}namespaces", session.base), None)
                    .await?;
                if !a.status.is_success() {
                    return Err(Error::Config(format!(
                        "catalog.warehouse {} (prefix {}): the REST catalog {} answered {}: {}",
                        self.cfg
                            .warehouse
                            .as_deref()
                            .map(|w| format!("`{w}`"))
                            .unwrap_or_else(|| "(not set)".into()),
                        prefix.as_deref().unwrap_or("none"),
                        self.uri,
                        a.status,
                        server_message(&a.body)
                    )));
                }
                Ok(session)
            })
            .await
    }

    fn namespace_path(ident: &TableIdent) -> String {
        urlencode(&ident.namespace().as_ref().join("\u{1f}"))
    }

    fn table_path(&self, s: &Session, ident: &TableIdent) -> String {
        format!(
            "{}namespaces/{}/tables/{}",
            s.base,
            Self::namespace_path(ident),
            urlencode(ident.name())
        )
    }

    fn failed(&self, what: &str, a: &Answer) -> Error {
        let msg = format!(
            "REST catalog {}: {what}: {} {}",
            self.uri,
            a.status,
            server_message(&a.body)
        );
        if a.status.is_server_error() {
            Error::Unavailable(msg)
        } else {
            Error::Config(msg)
        }
    }

    fn state_of(&self, ident: &TableIdent, r: LoadTableResult) -> Result<TableState> {
        Ok(TableState {
            ident: ident.clone(),
            metadata_location: r.metadata_location.ok_or_else(|| Error::State {
                code: codes::METADATA_LOCATION,
                message: format!("the REST catalog returned {ident} without a metadata-location"),
            })?,
            metadata: Arc::new(r.metadata),
        })
    }

    async fn ensure_namespace(&self, s: &Session, ident: &TableIdent) -> Result<()> {
        let a = self
            .call(
                Method::GET,
                &format!("{}namespaces/{}", s.base, Self::namespace_path(ident)),
                None,
            )
            .await?;
        if a.status.is_success() {
            return Ok(());
        }
        let a = self
            .call(
                Method::POST,
                &format!("{}namespaces", s.base),
                Some(json!({ "namespace": ident.namespace().as_ref(), "properties": {} })),
            )
            .await?;
        if a.status.is_success() || a.status == StatusCode::CONFLICT {
            Ok(())
        } else {
            Err(self.failed(
                &format!("create namespace {}", ident.namespace().as_ref().join(".")),
                &a,
            ))
        }
    }
}

fn file_io_for(s3: Option<&S3Config>, server: HashMap<String, String>) -> FileIO {
    let mut props = server;
    if let Some(cfg) = s3 {
        props.extend(crate::table::storage::s3_props(cfg));
    }
    FileIOBuilder::new(Arc::new(
        iceberg_storage_opendal::OpenDalResolvingStorageFactory::new(),
    ))
    .with_props(props)
    .build()
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The `error.message` of an Iceberg REST error body, or the body itself.
fn server_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error")?;
            let msg = e.get("message")?.as_str()?.to_string();
            Some(match e.get("type").and_then(|t| t.as_str()) {
                Some(t) => format!("{t}: {msg}"),
                None => msg,
            })
        })
        .unwrap_or_else(|| body.chars().take(500).collect())
}

#[async_trait::async_trait]
impl Catalog for RestCatalog {
    fn file_io(&self) -> &FileIO {
        self.file_io
            .get_or_init(|| file_io_for(self.cfg.s3.as_ref(), HashMap::new()))
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Option<TableState>> {
        let s = self.session().await?;
        let a = self
            .call(Method::GET, &self.table_path(s, ident), None)
            .await?;
        match a.status {
            StatusCode::NOT_FOUND => Ok(None),
            st if st.is_success() => {
                let r: LoadTableResult = serde_json::from_str(&a.body)?;
                Ok(Some(self.state_of(ident, r)?))
            }
            _ => Err(self.failed(&format!("load table {ident}"), &a)),
        }
    }

    async fn create_table(
        &self,
        ident: &TableIdent,
        schema: Schema,
        spec: UnboundPartitionSpec,
        properties: HashMap<String, String>,
    ) -> Result<TableState> {
        let s = self.session().await?;
        self.ensure_namespace(s, ident).await?;
        let mut properties = properties;
        properties.insert("format-version".into(), "2".into());
        let body = json!({
            "name": ident.name(),
            "schema": schema,
            "partition-spec": spec,
            "stage-create": false,
            "properties": properties,
        });
        let a = self
            .call(
                Method::POST,
                &format!(
                    "{}namespaces/{}/tables",
                    s.base,
                    Self::namespace_path(ident)
                ),
                Some(body),
            )
            .await?;
        match a.status {
            st if st.is_success() => {
                let r: LoadTableResult = serde_json::from_str(&a.body)?;
                self.state_of(ident, r)
            }
            StatusCode::CONFLICT => Err(Error::CommitConflict(format!(
                "table {ident} was created by another writer at the same time: {}",
                server_message(&a.body)
            ))),
            _ => Err(self.failed(&format!("create table {ident}"), &a)),
        }
    }

    async fn commit(
        &self,
        base: &TableState,
        updates: Vec<TableUpdate>,
        requirements: Vec<TableRequirement>,
    ) -> Result<TableState> {
        let s = self.session().await?;
        let ident = &base.ident;
        let body = serde_json::to_value(CommitTableRequest {
            identifier: Identifier {
                namespace: ident.namespace().as_ref(),
                name: ident.name(),
            },
            requirements: &requirements,
            updates: &updates,
        })?;
        let a = self
            .call(Method::POST, &self.table_path(s, ident), Some(body))
            .await?;
        match a.status {
            st if st.is_success() => {
                let r: LoadTableResult = serde_json::from_str(&a.body)?;
                self.state_of(ident, r)
            }
            StatusCode::CONFLICT => Err(Error::CommitConflict(format!(
                "table {ident}: {}",
                server_message(&a.body)
            ))),
            // 5xx (and gateway timeouts): the commit may or may not have
            // happened; the engine reloads and looks for its snapshot.
            _ => Err(self.failed(&format!("commit to {ident}"), &a)),
        }
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<bool> {
        let s = self.session().await?;
        let a = self
            .call(
                Method::DELETE,
                &format!("{}?purgeRequested=true", self.table_path(s, ident)),
                None,
            )
            .await?;
        match a.status {
            StatusCode::NOT_FOUND => Ok(false),
            st if st.is_success() => Ok(true),
            _ => Err(self.failed(&format!("drop table {ident}"), &a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};

    use super::*;

    /// A token endpoint handing out short-lived tokens `t1`, `t2`, ..., and
    /// catalog endpoints that record the token each call carried.
    #[derive(Default)]
    struct Server {
        issued: AtomicUsize,
        expires_in: u64,
        seen: Mutex<Vec<String>>,
        /// Answer the next catalog call with 401 (a token revoked early).
        reject_next: Mutex<bool>,
    }

    async fn token(State(s): State<Arc<Server>>) -> axum::Json<serde_json::Value> {
        let n = s.issued.fetch_add(1, Ordering::SeqCst) + 1;
        axum::Json(
            json!({"access_token": format!("t{n}"), "token_type": "bearer", "expires_in": s.expires_in}),
        )
    }

    fn seen(s: &Server, h: &HeaderMap) -> Option<StatusCode> {
        let auth = h
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        s.seen.lock().unwrap().push(auth);
        // `headers` from the config go with every call.
        if h.get("x-test").and_then(|v| v.to_str().ok()) != Some("1") {
            return Some(StatusCode::BAD_REQUEST);
        }
        let mut reject = s.reject_next.lock().unwrap();
        if *reject {
            *reject = false;
            return Some(StatusCode::UNAUTHORIZED);
        }
        None
    }

    async fn config(State(s): State<Arc<Server>>, h: HeaderMap) -> (StatusCode, String) {
        match seen(&s, &h) {
            Some(st) => (st, String::new()),
            None => (
                StatusCode::OK,
                json!({"defaults": {}, "overrides": {"prefix": "p"}}).to_string(),
            ),
        }
    }

    async fn namespaces(State(s): State<Arc<Server>>, h: HeaderMap) -> (StatusCode, String) {
        match seen(&s, &h) {
            Some(st) => (st, String::new()),
            None => (StatusCode::OK, json!({"namespaces": []}).to_string()),
        }
    }

    async fn no_table(State(s): State<Arc<Server>>, h: HeaderMap) -> (StatusCode, String) {
        match seen(&s, &h) {
            Some(st) => (st, String::new()),
            None => (StatusCode::NOT_FOUND, json!({"error": {"message": "no table", "type": "NoSuchTableException", "code": 404}}).to_string()),
        }
    }

    async fn serve(expires_in: u64) -> (Arc<Server>, String) {
        let s = Arc::new(Server {
            expires_in,
            ..Default::default()
        });
        let app = Router::new()
            .route("/v1/oauth/tokens", post(token))
            .route("/v1/config", get(config))
            .route("/v1/p/namespaces", get(namespaces))
            .route("/v1/p/namespaces/{ns}/tables/{t}", get(no_table))
            .with_state(s.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (s, format!("http://{addr}"))
    }

    fn catalog(uri: &str) -> RestCatalog {
        let cfg: RestConfig = toml::from_str(&format!(
            "uri = \"{uri}\"\ncredential = \"id:secret\"\nheaders = {{ \"X-Test\" = \"1\" }}"
        ))
        .unwrap();
        RestCatalog::new(&cfg).unwrap()
    }

    fn ident() -> TableIdent {
        TableIdent::from_strs(["ns", "t"]).unwrap()
    }

    #[tokio::test]
    async fn a_token_is_reused_until_shortly_before_it_expires() {
        let (s, uri) = serve(3600).await;
        let c = catalog(&uri);
        for _ in 0..3 {
            assert!(c.load_table(&ident()).await.unwrap().is_none());
        }
        assert_eq!(s.issued.load(Ordering::SeqCst), 1);
        assert!(s.seen.lock().unwrap().iter().all(|a| a == "Bearer t1"));
    }

    #[tokio::test]
    async fn a_short_lived_token_is_refreshed_before_it_expires() {
        // A 1 s token is refreshed at half its life.
        let (s, uri) = serve(1).await;
        let c = catalog(&uri);
        c.load_table(&ident()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.load_table(&ident()).await.unwrap();
        assert_eq!(s.issued.load(Ordering::SeqCst), 2);
        assert_eq!(s.seen.lock().unwrap().last().unwrap(), "Bearer t2");
    }

    #[tokio::test]
    async fn a_401_refreshes_the_token_once_and_retries() {
        let (s, uri) = serve(3600).await;
        let c = catalog(&uri);
        c.load_table(&ident()).await.unwrap();
        *s.reject_next.lock().unwrap() = true;
        assert!(c.load_table(&ident()).await.unwrap().is_none());
        assert_eq!(s.issued.load(Ordering::SeqCst), 2);
        let seen = s.seen.lock().unwrap().clone();
        assert_eq!(&seen[seen.len() - 2..], ["Bearer t1", "Bearer t2"]);
    }
}
