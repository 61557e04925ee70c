//! Process settings: the configuration file (`autocdc.toml`) with its
//! `[server]` (listen address, data directory, tokens, request limits) and
//! `[catalog]` (Hadoop, SQL or REST, and S3 storage) tables, and the list of
//! flow definitions, which `core::flow` validates.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::core::flow::{Flow, FlowConfig, parse_duration};
use crate::error::{Error, Result, codes};

/// The whole configuration file (`autocdc.toml`).
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub catalog: CatalogConfig,
    #[serde(default, rename = "flow")]
    pub flows: Vec<FlowConfig>,
    #[serde(default)]
    pub maintenance: MaintenanceConfig,
    #[serde(default)]
    pub ingest: IngestConfig,
}

/// `[ingest]`: where `autocdc serve` logs each accepted batch before it is
/// acknowledged (see docs/scale-out.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum IngestConfig {
    /// A log of segment files per flow under `server.data_dir` (the default).
    #[default]
    Local,
    /// A NATS JetStream stream per flow.
    Nats(Box<NatsConfig>),
}

/// `[ingest] type = "nats"`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// The servers, comma-separated (`nats://host:4222,nats://other:4222`).
    pub url: String,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    /// Each flow's stream is `<stream_prefix>_<flow>`.
    #[serde(default = "default_stream_prefix")]
    pub stream_prefix: String,
    /// Each flow's batches are published to `<subject_prefix>.<flow>`.
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// Copies of each stream (1 or 3 in a cluster; 1 on a single server).
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// Messages older than this are dropped by JetStream even if not yet
    /// committed ("0s": never). A bound on age, for operators who prefer
    /// losing old batches to refusing new ones; off by default.
    #[serde(default = "default_max_age")]
    pub max_age: String,
    /// How long a publish may wait for JetStream's acknowledgement.
    #[serde(default = "default_publish_timeout")]
    pub publish_timeout: String,
    /// A flow's committer holds a lease this long unless it renews it (every
    /// quarter of it): how long a flow goes uncommitted after its instance
    /// dies.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl: String,
    /// This instance's name in the leases (default: `autocdc-` and a random
    /// suffix, new at each start).
    #[serde(default)]
    pub instance: Option<String>,
}

fn default_stream_prefix() -> String {
    "AUTOCDC".into()
}
fn default_subject_prefix() -> String {
    "autocdc".into()
}
fn default_replicas() -> usize {
    1
}
fn default_max_age() -> String {
    "0s".into()
}
fn default_publish_timeout() -> String {
    "10s".into()
}
fn default_lease_ttl() -> String {
    "10s".into()
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &self.url)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("stream_prefix", &self.stream_prefix)
            .field("subject_prefix", &self.subject_prefix)
            .field("replicas", &self.replicas)
            .field("max_age", &self.max_age)
            .field("publish_timeout", &self.publish_timeout)
            .field("lease_ttl", &self.lease_ttl)
            .field("instance", &self.instance)
            .finish()
    }
}

impl NatsConfig {
    pub fn max_age(&self) -> Result<Duration> {
        parse_duration_setting("ingest.max_age", &self.max_age)
    }
    pub fn publish_timeout(&self) -> Result<Duration> {
        let d = parse_duration_setting("ingest.publish_timeout", &self.publish_timeout)?;
        if d.is_zero() {
            return Err(Error::Config(
                "ingest.publish_timeout = \"0s\": a publish needs time to be acknowledged".into(),
            ));
        }
        Ok(d)
    }
    pub fn lease_ttl(&self) -> Result<Duration> {
        let d = parse_duration_setting("ingest.lease_ttl", &self.lease_ttl)?;
        if d < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "ingest.lease_ttl = \"{}\": at least \"1s\" (it is renewed every quarter of it)",
                self.lease_ttl
            )));
        }
        Ok(d)
    }
    /// Checks what can be checked before connecting.
    pub fn validate(&self) -> Result<()> {
        self.max_age()?;
        self.publish_timeout()?;
        self.lease_ttl()?;
        if let Some(i) = &self.instance
            && (i.is_empty()
                || i.len() > 64
                || !i
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            return Err(Error::Config(format!(
                "ingest.instance = {i:?}: 1 to 64 letters, digits, `_` and `-`"
            )));
        }
        let token_ok = |what: &str, s: &str| {
            if s.is_empty()
                || !s
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                Err(Error::Config(format!(
                    "ingest.{what} = {s:?}: letters, digits, `_` and `-` only (it names streams and subjects)"
                )))
            } else {
                Ok(())
            }
        };
        token_ok("stream_prefix", &self.stream_prefix)?;
        token_ok("subject_prefix", &self.subject_prefix)?;
        if !(1..=5).contains(&self.replicas) {
            return Err(Error::Config(format!(
                "ingest.replicas = {}: JetStream keeps 1 to 5 copies",
                self.replicas
            )));
        }
        if self.url.trim().is_empty() {
            return Err(Error::Config("ingest.url is empty".into()));
        }
        Ok(())
    }
}

/// `[maintenance]`: when `autocdc serve` maintains each flow's tables
/// (snapshot expiry, file cleanup, orphan cleanup; see docs/maintenance.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceConfig {
    /// Maintain each flow this often ("0s": never on a timer).
    #[serde(default = "default_maintenance_interval")]
    pub interval: String,
    /// ... and right after a commit once this many snapshots of the flow's
    /// two tables can expire (0: never after a commit).
    #[serde(default = "default_expire_threshold")]
    pub expire_threshold: usize,
    /// Delete files no metadata references once they are this old (at
    /// least "1h", so no commit in flight loses a file); "off" never does.
    #[serde(default = "default_orphan_older_than")]
    pub orphan_older_than: String,
    /// Orphan cleanup lists the whole table location: at most this often.
    #[serde(default = "default_orphan_interval")]
    pub orphan_interval: String,
}

fn default_maintenance_interval() -> String {
    "10m".into()
}
fn default_expire_threshold() -> usize {
    20
}
fn default_orphan_older_than() -> String {
    "3d".into()
}
fn default_orphan_interval() -> String {
    "1d".into()
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: default_maintenance_interval(),
            expire_threshold: default_expire_threshold(),
            orphan_older_than: default_orphan_older_than(),
            orphan_interval: default_orphan_interval(),
        }
    }
}

/// `[maintenance]` parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceSchedule {
    pub interval: Option<Duration>,
    pub expire_threshold: usize,
    pub orphans_older_than: Option<Duration>,
    pub orphan_interval: Duration,
}

/// The shortest orphan window: files younger than this may belong to a
/// commit in flight (here or in another writer).
pub const MIN_ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// Parses an orphan window ("3d", "off"); under `MIN_ORPHAN_AGE` is refused.
pub fn parse_orphan_window(setting: &str, text: &str) -> Result<Option<Duration>> {
    if text.trim() == "off" {
        return Ok(None);
    }
    let d = parse_duration_setting(setting, text)?;
    if d < MIN_ORPHAN_AGE {
        return Err(Error::Config(format!(
            "{setting} = \"{text}\": at least \"1h\", so that no commit in flight loses a file it is about to name"
        )));
    }
    Ok(Some(d))
}

impl MaintenanceConfig {
    pub fn schedule(&self) -> Result<MaintenanceSchedule> {
        let interval = parse_duration_setting("maintenance.interval", &self.interval)?;
        Ok(MaintenanceSchedule {
            interval: (!interval.is_zero()).then_some(interval),
            expire_threshold: self.expire_threshold,
            orphans_older_than: parse_orphan_window(
                "maintenance.orphan_older_than",
                &self.orphan_older_than,
            )?,
            orphan_interval: parse_duration_setting(
                "maintenance.orphan_interval",
                &self.orphan_interval,
            )?,
        })
    }
}

/// `[server]`: used by `autocdc serve` only.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The write-ahead logs and the flows created over HTTP live here.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// Bearer tokens; none means no authentication.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Rows in one pushed body.
    #[serde(default = "default_max_rows")]
    pub max_rows_per_request: usize,
    /// A client must send a request's head within this long, and an idle
    /// keep-alive connection is closed after it.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: String,
    /// Open client connections at most; past it a new connection is closed
    /// at once. Keep it below the process's open-file limit.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// At shutdown, how long requests in flight may take before their
    /// connections are closed; what was acknowledged is committed after.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace: String,
    /// Records kept per flow in its dead-letter area; the oldest go first.
    #[serde(default = "default_max_dead_letters")]
    pub max_dead_letters: usize,
    #[serde(default = "default_request_timeout")]
    pub request_timeout: String,
    /// How long an idempotency key is remembered after its batch was committed.
    #[serde(default = "default_idempotency_window")]
    pub idempotency_window: String,
    /// The target records each ingest log's committed offset; the entry of
    /// a log that has not committed for this long is dropped (its log is
    /// gone, e.g. an instance retired after a rolling deploy).
    #[serde(default = "default_log_offsets_retention")]
    pub log_offsets_retention: String,
    /// `[maintenance]` of the whole file, handed to the service.
    #[serde(skip)]
    pub maintenance: MaintenanceConfig,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub token: String,
    /// The flows this token may use; empty means all.
    #[serde(default)]
    pub flows: Vec<String>,
    /// The namespaces (`a` or `a.b`) whose tables this token's `PUT` may
    /// make a flow's target; empty means any namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_data_dir() -> String {
    "./autocdc-data".into()
}
fn default_max_body() -> usize {
    64 << 20
}
fn default_max_rows() -> usize {
    1_000_000
}
fn default_header_read_timeout() -> String {
    "10s".into()
}
fn default_max_connections() -> usize {
    512
}
fn default_max_dead_letters() -> usize {
    1000
}
fn default_shutdown_grace() -> String {
    "10s".into()
}
fn default_request_timeout() -> String {
    "60s".into()
}
fn default_idempotency_window() -> String {
    "15m".into()
}
fn default_log_offsets_retention() -> String {
    "7d".into()
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            data_dir: default_data_dir(),
            tokens: Vec::new(),
            max_body_bytes: default_max_body(),
            max_rows_per_request: default_max_rows(),
            header_read_timeout: default_header_read_timeout(),
            max_connections: default_max_connections(),
            shutdown_grace: default_shutdown_grace(),
            max_dead_letters: default_max_dead_letters(),
            request_timeout: default_request_timeout(),
            idempotency_window: default_idempotency_window(),
            log_offsets_retention: default_log_offsets_retention(),
            maintenance: MaintenanceConfig::default(),
        }
    }
}

impl ServerConfig {
    pub fn request_timeout(&self) -> Result<Duration> {
        parse_duration_setting("server.request_timeout", &self.request_timeout)
    }
    pub fn header_read_timeout(&self) -> Result<Duration> {
        parse_duration_setting("server.header_read_timeout", &self.header_read_timeout)
    }
    pub fn shutdown_grace(&self) -> Result<Duration> {
        parse_duration_setting("server.shutdown_grace", &self.shutdown_grace)
    }
    pub fn idempotency_window(&self) -> Result<Duration> {
        parse_duration_setting("server.idempotency_window", &self.idempotency_window)
    }
    pub fn log_offsets_retention(&self) -> Result<Duration> {
        parse_duration_setting("server.log_offsets_retention", &self.log_offsets_retention)
    }
}

fn parse_duration_setting(name: &str, s: &str) -> Result<Duration> {
    parse_duration(name, s).map_err(Error::Config)
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum CatalogConfig {
    /// Iceberg Java's HadoopCatalog layout: `<warehouse>/<ns...>/<table>/metadata/vN.metadata.json`.
    Hadoop {
        #[serde(default = "default_warehouse")]
        warehouse: String,
        /// For an `s3://` warehouse.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        s3: Option<S3Config>,
    },
    /// JDBC-compatible SQL catalog on PostgreSQL (Iceberg Java's JdbcCatalog tables).
    Sql {
        /// e.g. `postgres://user:password@host:5432/database`
        uri: String,
        /// `catalog_name` in `iceberg_tables`.
        #[serde(default = "default_catalog_name")]
        name: String,
        #[serde(default = "default_warehouse")]
        warehouse: String,
        /// For an `s3://` warehouse.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        s3: Option<S3Config>,
    },
    /// An Iceberg REST catalog.
    Rest(RestConfig),
}

/// `[catalog] type = "rest"`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RestConfig {
    /// e.g. `https://catalog.example.com` (the `/v1/...` paths go below it).
    pub uri: String,
    /// Sent as `?warehouse=` to `/v1/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warehouse: Option<String>,
    /// Overrides the prefix the server's `/v1/config` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// OAuth2 client credentials, `client_id:client_secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// A static bearer token (instead of `credential`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Token endpoint; defaults to `<uri>/v1/oauth/tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth2_server_uri: Option<String>,
    /// OAuth2 scope; defaults to `catalog`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Extra HTTP headers on every request (Java's `header.*` properties).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Bound on each catalog request; defaults to 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<String>,
    /// Credentials and endpoint for the table files, when the catalog does not vend them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
}

impl std::fmt::Debug for RestConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestConfig")
            .field("uri", &self.uri)
            .field("warehouse", &self.warehouse)
            .field("prefix", &self.prefix)
            .field(
                "credential",
                &self.credential.as_ref().map(|c| match c.split_once(':') {
                    Some((id, _)) => format!("{id}:***"),
                    None => "***".into(),
                }),
            )
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("s3", &self.s3)
            .finish()
    }
}

/// `[catalog.s3]`: an S3-compatible object store. Credentials left out come
/// from the usual AWS environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, profiles, instance metadata).
#[derive(Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// e.g. `http://127.0.0.1:8333`; AWS's own endpoint when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Defaults to `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`). Defaults to true when an
    /// endpoint is set (S3-compatible stores), false on AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl S3Config {
    pub fn path_style(&self) -> bool {
        self.path_style.unwrap_or(self.endpoint.is_some())
    }
}

fn default_catalog_name() -> String {
    "autocdc".into()
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig::Hadoop {
            warehouse: default_warehouse(),
            s3: None,
        }
    }
}

fn default_warehouse() -> String {
    "./warehouse".to_string()
}

impl Config {
    pub fn from_toml(text: &str) -> Result<Config> {
        toml::from_str(text).map_err(|e| Error::Config(format!("invalid configuration: {e}")))
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Validates every flow; the first invalid one is the error.
    pub fn flows(&self) -> Result<Vec<Flow>> {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for f in &self.flows {
            if !names.insert(f.name.clone()) {
                return Err(Error::definition(
                    &f.name,
                    codes::INVALID_DEFINITION,
                    "two flows have this name; flow names must be unique",
                ));
            }
            let flow = Flow::new(f.clone())?;
            // Flows sharing a target must agree on what its state means.
            if let Some(other) = out.iter().find(|o: &&Flow| o.target == flow.target) {
                crate::core::flow::check_shared(other, &flow)?;
            }
            out.push(flow);
        }
        Ok(out)
    }

    pub fn flow(&self, name: &str) -> Result<Flow> {
        let Some(f) = self.flows.iter().find(|f| f.name == name) else {
            let known: Vec<_> = self.flows.iter().map(|f| f.name.as_str()).collect();
            return Err(Error::Config(format!(
                "no flow named `{name}` in the configuration (flows: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let flow = Flow::new(f.clone())?;
        // Flows of a file sharing a target must agree on what its state
        // means: checked before either writes it.
        for o in self.flows.iter().filter(|o| o.name != name) {
            if crate::core::flow::parse_table_ident(&o.name, &o.target)
                .is_ok_and(|t| t == flow.target)
            {
                crate::core::flow::check_shared(&Flow::new(o.clone())?, &flow)?;
            }
        }
        Ok(flow)
    }
}
