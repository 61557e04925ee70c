//! The ingest log on NATS JetStream (`[ingest] type = "nats"`): one stream
//! per flow, `<stream_prefix>_<flow>`, holding the subject
//! `<subject_prefix>.<flow>`. A batch is acknowledged once JetStream has
//! acknowledged its publish, so its durability is the stream's (replicated
//! when `replicas = 3`), not this machine's disk.
//!
//! API boundary: `NatsLogs` is a `LogFactory`, `NatsLog` an `IngestLog`; the
//! service does not know which log it runs on.
//!
//! Invariants:
//! - Offsets are the stream's sequences: dense and increasing, since only
//!   autocdc publishes to the subject and only `release` removes messages,
//!   from the front. A gap found at replay is an error, never skipped.
//! - Every publish carries `Nats-Msg-Id`: `k:<Idempotency-Key>`, or
//!   `h:<xxh3-128 of the payload>` without one. Within the stream's
//!   duplicate window (`server.idempotency_window`) a repeat is answered
//!   with the first publish's sequence and stores nothing.
//! - The stream never drops what is not committed: appends are refused
//!   (429) once it holds the flow's `max_log_bytes` (checked here, not set
//!   as the stream's `max_bytes`, which JetStream would reserve on disk for
//!   every stream); `release` purges committed messages once their window
//!   has passed, or sooner when the stream nears its bound (as the local
//!   log does). `ingest.max_age` is the one exception, off by default.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use bytes::Bytes;

use crate::config::NatsConfig;
use crate::error::{Error, Result, codes};
use crate::service::nats_conn::retrying;
use crate::service::wal::{Appended, IngestLog, LogFactory, LogStats, Record};

/// A stream per flow on one NATS connection.
pub struct NatsLogs {
    client: async_nats::Client,
    js: jetstream::Context,
    cfg: NatsConfig,
    window: Duration,
    publish_timeout: Duration,
    max_age: Duration,
}

impl NatsLogs {
    /// Connects to `cfg.url` and checks that JetStream answers.
    pub async fn connect(cfg: &NatsConfig, window: Duration) -> Result<NatsLogs> {
        cfg.validate()?;
        let publish_timeout = cfg.publish_timeout()?;
        let mut opts = async_nats::ConnectOptions::new()
            .name("autocdc")
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(publish_timeout))
            // Reconnect for ever: a NATS node restarting must not stop the
            // service; pushes get 503 (and /readyz says why) meanwhile.
            .max_reconnects(None);
        if let (Some(user), Some(password)) = (&cfg.user, &cfg.password) {
            opts = opts.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &cfg.token {
            opts = opts.token(token.clone());
        }
        let urls: Vec<&str> = cfg.url.split(',').map(str::trim).collect();
        let client = opts
            .connect(urls)
            .await
            .map_err(|e| Error::Config(format!("ingest.url = {}: {e}", cfg.url)))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(publish_timeout);
        // A server without JetStream says so at once (no responders). A
        // cluster electing its meta leader (a server just lost) lets the
        // request time out, or answers "temporarily unavailable", for
        // seconds: that is waited for, as for the streams, not a reason to
        // exit (an instance starting while a NATS node died did).
        let asking = &js;
        retrying("JetStream", || async move {
            use jetstream::context::AccountErrorKind;
            match asking.query_account().await {
                Ok(_) => Ok(()),
                Err(e) => match e.kind() {
                    AccountErrorKind::TimedOut => Err(Error::Unavailable(e.to_string())),
                    AccountErrorKind::JetStream(j)
                        if j.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE =>
                    {
                        Err(Error::Unavailable(e.to_string()))
                    }
                    _ => Err(Error::Config(e.to_string())),
                },
            }
        })
        .await
        .map_err(|e| {
            let e = match e {
                Error::Unavailable(m) | Error::Config(m) => m,
                e => e.to_string(),
            };
            Error::Config(format!(
                "ingest.url = {}: JetStream does not answer ({e}); start nats-server with -js",
                cfg.url
            ))
        })?;
        Ok(NatsLogs {
            client,
            js,
            cfg: cfg.clone(),
            window,
            publish_timeout,
            max_age: cfg.max_age()?,
        })
    }

    /// The leases of the flows this log serves, in buckets beside the
    /// streams (`<stream_prefix>_LEASES`, `<stream_prefix>_INSTANCES`).
    pub async fn leases(&self) -> Result<crate::service::lease::Leases> {
        let me = match &self.cfg.instance {
            Some(i) => i.clone(),
            None => format!(
                "autocdc-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
        };
        let ttl = self.cfg.lease_ttl()?;
        retrying("opening the lease buckets", || {
            crate::service::lease::Leases::open(
                &self.js,
                &self.cfg.stream_prefix,
                self.cfg.replicas,
                me.clone(),
                ttl,
            )
        })
        .await
    }

    /// The flow definitions every instance shares.
    pub async fn definitions(&self) -> Result<crate::service::definitions::NatsDefinitions> {
        retrying("opening the definitions bucket", || {
            crate::service::definitions::NatsDefinitions::open(
                &self.js,
                &self.cfg.stream_prefix,
                self.cfg.replicas,
            )
        })
        .await
    }

    pub fn stream_name(&self, flow: &str) -> String {
        format!("{}_{flow}", self.cfg.stream_prefix)
    }

    fn subject(&self, flow: &str) -> String {
        format!("{}.{flow}", self.cfg.subject_prefix)
    }

    fn config(&self, flow: &str) -> stream::Config {
        stream::Config {
            name: self.stream_name(flow),
            subjects: vec![self.subject(flow)],
            description: Some(format!("autocdc ingest log of flow `{flow}`")),
            storage: stream::StorageType::File,
            num_replicas: self.cfg.replicas,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::New,
            max_bytes: -1,
            max_age: self.max_age,
            duplicate_window: self.window,
            max_message_size: -1,
            allow_direct: true,
            ..Default::default()
        }
    }

    /// `flow`'s stream, brought to the settings of this process. One that
    /// is not found is made only with `recorded` (the logs the flow's target
    /// records offsets of) naming no NATS log but those of other flows'
    /// streams under this `stream_prefix` (flows sharing the target): a new
    /// flow's. Else, and when opening (`None`), it is `AUTOCDC_UNAVAILABLE`:
    /// a cluster electing its meta leader answers "not found" for a stream
    /// that exists, and a new, empty stream would lose what the old one held.
    async fn stream(&self, flow: &str, recorded: Option<&[String]>) -> Result<stream::Stream> {
        let name = self.stream_name(flow);
        match self.js.get_stream(&name).await {
            Ok(mut s) => {
                let have = s
                    .info()
                    .await
                    .map_err(|e| unavailable(&name, e))?
                    .config
                    .clone();
                let want = self.config(flow);
                if have.subjects != want.subjects {
                    return Err(Error::Config(format!(
                        "NATS stream `{name}` holds subjects {:?}, not `{}`: it belongs to something else; set ingest.stream_prefix",
                        have.subjects,
                        self.subject(flow)
                    )));
                }
                if (
                    have.max_bytes,
                    have.max_age,
                    have.duplicate_window,
                    have.discard,
                    have.num_replicas,
                ) != (
                    want.max_bytes,
                    want.max_age,
                    want.duplicate_window,
                    want.discard,
                    want.num_replicas,
                ) {
                    self.js
                        .update_stream(want)
                        .await
                        .map_err(|e| unavailable(&name, e))?;
                    return self
                        .js
                        .get_stream(&name)
                        .await
                        .map_err(|e| unavailable(&name, e));
                }
                Ok(s)
            }
            Err(e) if not_found(&e) => {
                // Streams of other flows of this deployment are the logs of
                // flows sharing the target: theirs, not this flow's.
                let ours = format!("nats:{name}:");
                let deployment = format!("nats:{}_", self.cfg.stream_prefix);
                let nats: Vec<&String> = recorded
                    .unwrap_or_default()
                    .iter()
                    .filter(|id| {
                        id.starts_with(&ours)
                            || (id.starts_with("nats:") && !id.starts_with(&deployment))
                    })
                    .collect();
                if recorded.is_none() || !nats.is_empty() {
                    return Err(Error::Unavailable(format!(
                        "NATS stream `{name}` of flow `{flow}` is not found, and the flow's target records offsets of {}: it is not made again, empty (what the old stream held and was acknowledged would be lost); waiting for it (a cluster electing its leader answers so for a while). If it was deleted for good, drop the flow's target and state tables to start the flow from nothing",
                        if nats.is_empty() {
                            "it (the stream went after the flow opened)".to_string()
                        } else {
                            nats.iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    )));
                }
                self.js
                    .create_stream(self.config(flow))
                    .await
                    .map_err(|e| unavailable(&name, e))
            }
            Err(e) => Err(unavailable(&name, e)),
        }
    }
}

fn not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

fn unavailable(stream: &str, e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("NATS stream `{stream}`: {e}"))
}

fn created_nanos(info: &stream::Info) -> i128 {
    info.created.unix_timestamp_nanos()
}

#[async_trait::async_trait]
impl LogFactory for NatsLogs {
    /// `nats:<stream>:<created>`: a stream deleted and made again is
    /// another log, whose offsets start again.
    async fn identity(&self, flow: &str, recorded: &[String]) -> Result<String> {
        retrying(&format!("flow `{flow}`"), || {
            self.identity_once(flow, recorded)
        })
        .await
    }

    async fn open(&self, flow: &str, committed: i64, max_bytes: u64) -> Result<Arc<dyn IngestLog>> {
        retrying(&format!("flow `{flow}`"), || {
            self.open_once(flow, committed, max_bytes)
        })
        .await
    }

    fn adopts(&self) -> bool {
        true
    }
}

/// What a flow's stream holds, as `autocdc log` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHolding {
    /// Its identity (`nats:<stream>:<created>`).
    pub id: String,
    pub messages: u64,
    pub first: u64,
    pub last: u64,
}

impl NatsLogs {
    /// What `flow`'s stream holds; `None` when there is no such stream.
    pub async fn holding(&self, flow: &str) -> Result<Option<StreamHolding>> {
        let name = self.stream_name(flow);
        let mut s = match self.js.get_stream(&name).await {
            Ok(s) => s,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(unavailable(&name, e)),
        };
        let info = s.info().await.map_err(|e| unavailable(&name, e))?;
        Ok(Some(StreamHolding {
            id: format!("nats:{name}:{}", created_nanos(info)),
            messages: info.state.messages,
            first: info.state.first_sequence,
            last: info.state.last_sequence,
        }))
    }

    /// Drops every message of `flow`'s stream (its sequences go on from
    /// the last one); how many there were.
    pub async fn purge(&self, flow: &str) -> Result<u64> {
        let name = self.stream_name(flow);
        let s = self
            .js
            .get_stream(&name)
            .await
            .map_err(|e| unavailable(&name, e))?;
        let r = s.purge().await.map_err(|e| unavailable(&name, e))?;
        Ok(r.purged)
    }
}

/// The error for a stream holding messages its flow's target has no
/// record of: written for another table (a `stream_prefix` used with
/// another warehouse, or a target dropped and made again). Replaying them
/// would put another table's changes into this one; dropping them would
/// lose what may be acknowledged. The operator says which.
fn foreign(flow: &str, name: &str, messages: u64, first: u64, last: u64) -> Error {
    Error::State {
        code: codes::FOREIGN_LOG,
        message: format!(
            "NATS stream `{name}` holds {messages} messages (sequences {first}..={last}) that the target of flow `{flow}` has no record of: they were written for another table (a stream_prefix used with another warehouse, or a target dropped and made again). Run `autocdc log adopt --flow {flow}` to apply them to this target, or `autocdc log reset --flow {flow}` to drop them"
        ),
    }
}

impl NatsLogs {
    async fn identity_once(&self, flow: &str, recorded: &[String]) -> Result<String> {
        let name = self.stream_name(flow);
        let mut s = self.stream(flow, Some(recorded)).await?;
        let info = s.info().await.map_err(|e| unavailable(&name, e))?;
        let id = format!("nats:{name}:{}", created_nanos(info));
        let held = &info.state;
        if held.messages > 0 && !recorded.contains(&id) {
            return Err(foreign(
                flow,
                &name,
                held.messages,
                held.first_sequence,
                held.last_sequence,
            ));
        }
        Ok(id)
    }

    async fn open_once(
        &self,
        flow: &str,
        committed: i64,
        max_bytes: u64,
    ) -> Result<Arc<dyn IngestLog>> {
        let name = self.stream_name(flow);
        // Made, if it had to be, when its identity was read.
        let mut s = self.stream(flow, None).await?;
        let state = s
            .info()
            .await
            .map_err(|e| unavailable(&name, e))?
            .state
            .clone();
        let last = state.last_sequence as i64;
        if last < committed {
            if state.messages > 0 {
                return Err(Error::State {
                    code: codes::INPUT_OFFSETS,
                    message: format!(
                        "NATS stream `{name}` ends at sequence {last}, but the target has committed it through {committed}"
                    ),
                });
            }
            // An empty stream (its messages purged): new offsets follow the
            // committed one, never reuse it.
            s.purge()
                .sequence(committed as u64 + 1)
                .await
                .map_err(|e| unavailable(&name, e))?;
        }
        let log = NatsLog {
            flow: flow.to_string(),
            client: self.client.clone(),
            js: self.js.clone(),
            stream: s,
            subject: self.subject(flow),
            publish_timeout: self.publish_timeout,
            max_bytes,
            inner: Mutex::new(Inner {
                next_offset: last.max(committed) + 1,
                bytes: state.bytes,
                messages: state.messages,
                purged_through: (state.first_sequence as i64 - 1).max(committed.min(last)),
                ..Default::default()
            }),
        };
        Ok(Arc::new(log))
    }
}

/// One flow's stream.
pub struct NatsLog {
    flow: String,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    subject: String,
    publish_timeout: Duration,
    max_bytes: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for NatsLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLog")
            .field("flow", &self.flow)
            .field("subject", &self.subject)
            .finish()
    }
}

#[derive(Default)]
struct Inner {
    next_offset: i64,
    /// When each retained record known here was appended (offset -> ms):
    /// what `release` needs to keep records for their idempotency window.
    appended: BTreeMap<i64, i64>,
    /// Everything through this offset was purged.
    purged_through: i64,
    bytes: u64,
    messages: u64,
    early_released: u64,
    idempotency_floor_ms: Option<i64>,
    failing: bool,
    write_failures: u64,
}

impl NatsLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream answered `info` with a leader, which takes publishes:
    /// the log is writable again. Without this a failed publish would
    /// leave `failing` (and /readyz 503) until a push went through, which
    /// an instance taken out of rotation for being unready is never sent.
    /// (A member of a leaderless group answers info too, so the leader is
    /// what counts, not the answer.)
    fn answered(&self, info: &stream::Info) {
        let led = info.cluster.as_ref().is_none_or(|c| c.leader.is_some());
        let mut g = self.lock();
        if led && g.failing {
            g.failing = false;
            drop(g);
            tracing::info!(flow = %self.flow, "log_recovered");
        }
    }

    fn failed(&self, e: impl std::fmt::Display) -> Error {
        let mut g = self.lock();
        g.failing = true;
        g.write_failures += 1;
        drop(g);
        tracing::error!(flow = %self.flow, error = %e, "log_write_failed");
        Error::State {
            code: codes::WAL_WRITE_FAILED,
            message: format!(
                "the flow's log (NATS subject {}) did not acknowledge the batch ({e}); retry with the same Idempotency-Key",
                self.subject
            ),
        }
    }
}

/// `Nats-Msg-Id` of a publish.
fn message_id(key: Option<&str>, payload: &[u8]) -> String {
    match key {
        Some(k) => format!("k:{k}"),
        None => format!("h:{:032x}", xxhash_rust::xxh3::xxh3_128(payload)),
    }
}

/// The Idempotency-Key a stored message was published with.
fn key_of(msg: &async_nats::Message) -> Option<String> {
    let id = msg.headers.as_ref()?.get("Nats-Msg-Id")?.as_str();
    id.strip_prefix("k:").map(str::to_string)
}

#[async_trait::async_trait]
impl IngestLog for NatsLog {
    async fn append(&self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended> {
        let max_payload = self.client.server_info().max_payload;
        if payload.len() + 512 > max_payload {
            return Err(Error::Input {
                code: codes::BODY_TOO_LARGE,
                flow: self.flow.clone(),
                message: format!(
                    "the batch is {} bytes as logged; the NATS server takes messages of at most {max_payload} bytes (max_payload): split it, or raise max_payload",
                    payload.len()
                ),
            });
        }
        let size = payload.len() as u64;
        {
            let g = self.lock();
            if g.bytes + size > self.max_bytes {
                return Err(Error::Overloaded {
                    message: format!(
                        "its log (NATS stream `{}`) is full: {} of max_log_bytes = {} held by uncommitted or recent batches; retry after a commit",
                        self.stream.cached_info().config.name,
                        g.bytes,
                        self.max_bytes
                    ),
                    retry_after_secs: 1,
                });
            }
        }
        let msg = jetstream::message::PublishMessage::build()
            .message_id(message_id(key.as_deref(), &payload))
            .payload(payload);
        let sent = tokio::time::timeout(self.publish_timeout, async {
            self.js.send_publish(self.subject.clone(), msg).await?.await
        })
        .await;
        let ack = match sent {
            Err(_) => return Err(self.failed("no acknowledgement within ingest.publish_timeout")),
            Ok(Err(e)) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                return Err(Error::Input {
                    code: codes::BODY_TOO_LARGE,
                    flow: self.flow.clone(),
                    message: format!("the batch is too large for the NATS server ({e})"),
                });
            }
            Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound => {
                // No responders: no server took the subject, so nothing
                // was stored. On a cluster that is mostly a stream without
                // a leader for the seconds of an election (async-nats
                // words it "no stream found for given subject").
                return Err(self.failed(format!(
                    "no JetStream server took the publish (no responders), so nothing was stored: the stream `{}` has no leader at the moment (a cluster elects one within seconds of losing a server), or it was deleted",
                    self.stream.cached_info().config.name
                )));
            }
            Ok(Err(e)) => {
                let text = e.to_string();
                // A full stream (discard = new) refuses: nothing is lost,
                // the client retries after a commit released some.
                if text.contains("maximum bytes") || text.contains("resource limits") {
                    return Err(Error::Overloaded {
                        message: format!(
                            "its log (NATS stream `{}`) is full: max_log_bytes = {} of uncommitted or recent batches; retry after a commit",
                            self.stream.cached_info().config.name,
                            self.max_bytes
                        ),
                        retry_after_secs: 1,
                    });
                }
                return Err(self.failed(text));
            }
            Ok(Ok(ack)) => ack,
        };
        let offset = ack.sequence as i64;
        let mut g = self.lock();
        if g.failing {
            tracing::info!(flow = %self.flow, "log_recovered");
        }
        g.failing = false;
        if !ack.duplicate && offset > g.purged_through {
            g.appended.insert(offset, now_ms);
            g.bytes += size;
            g.messages += 1;
        }
        g.next_offset = g.next_offset.max(offset + 1);
        Ok(Appended {
            offset,
            duplicate: ack.duplicate,
        })
    }

    async fn replay(&self, after: i64) -> Result<Vec<Record>> {
        use futures::StreamExt;
        let name = self.stream.cached_info().config.name.clone();
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| unavailable(&name, e))?;
        self.answered(&info);
        let (first, last) = (
            info.state.first_sequence as i64,
            info.state.last_sequence as i64,
        );
        if info.state.messages == 0 || last <= after {
            return Ok(Vec::new());
        }
        let start = (after + 1).max(first);
        let consumer = self
            .stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: self.subject.clone(),
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: start as u64,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(&name, e))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| unavailable(&name, e))?;
        let mut out = Vec::new();
        let mut expect = start;
        let mut times = Vec::new();
        while expect <= last {
            let next = tokio::time::timeout(self.publish_timeout, messages.next())
                .await
                .map_err(|_| {
                    unavailable(&name, format!("replay stalled before sequence {expect}"))
                })?;
            let Some(msg) = next else { break };
            let msg = msg.map_err(|e| unavailable(&name, e))?;
            let info = msg.info().map_err(|e| unavailable(&name, e))?;
            let seq = info.stream_sequence as i64;
            if seq != expect {
                return Err(Error::State {
                    code: codes::WAL_CORRUPT,
                    message: format!(
                        "NATS stream `{name}` lacks sequence {expect} (next is {seq}): a message was deleted outside autocdc"
                    ),
                });
            }
            let appended_ms = (info.published.unix_timestamp_nanos() / 1_000_000) as i64;
            times.push((seq, appended_ms));
            out.push(Record {
                offset: seq,
                key: key_of(&msg.message),
                appended_ms,
                payload: msg.message.payload.clone(),
            });
            expect += 1;
        }
        if expect <= last {
            return Err(unavailable(
                &name,
                format!("replay ended at sequence {} of {last}", expect - 1),
            ));
        }
        let mut g = self.lock();
        g.appended.extend(times);
        g.next_offset = g.next_offset.max(last + 1);
        Ok(out)
    }

    async fn release(&self, offset: i64, keep_after_ms: i64) -> Result<()> {
        let name = self.stream.cached_info().config.name.clone();
        let through = {
            let g = self.lock();
            if offset <= g.purged_through {
                return Ok(());
            }
            // Records past their idempotency window, oldest first.
            let mut through = g.purged_through;
            for (&o, &ms) in g.appended.range(..=offset) {
                if ms >= keep_after_ms {
                    break;
                }
                through = o;
            }
            // Near the stream's bound, committed records go early.
            if g.bytes >= self.max_bytes / 4 * 3 {
                through = offset;
            }
            through
        };
        if through <= self.lock().purged_through {
            return Ok(());
        }
        self.stream
            .purge()
            .sequence(through as u64 + 1)
            .await
            .map_err(|e| unavailable(&name, e))?;
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| unavailable(&name, e))?;
        self.answered(&info);
        let mut g = self.lock();
        let early: Vec<i64> = g
            .appended
            .range(..=through)
            .filter(|&(_, &ms)| ms >= keep_after_ms)
            .map(|(_, &ms)| ms)
            .collect();
        if !early.is_empty() {
            g.early_released += 1;
            let newest = early.into_iter().max();
            g.idempotency_floor_ms = g.idempotency_floor_ms.max(newest);
        }
        g.appended = g.appended.split_off(&(through + 1));
        g.purged_through = through;
        g.bytes = info.state.bytes;
        g.messages = info.state.messages;
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    async fn last_offset(&self) -> Result<i64> {
        let name = self.stream.cached_info().config.name.clone();
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| unavailable(&name, e))?;
        self.answered(&info);
        let last = info.state.last_sequence as i64;
        let mut g = self.lock();
        g.next_offset = g.next_offset.max(last + 1);
        Ok(g.next_offset - 1)
    }

    async fn read(&self, offset: i64) -> Result<Option<Record>> {
        let name = self.stream.cached_info().config.name.clone();
        let msg = match self.stream.get_raw_message(offset as u64).await {
            Ok(m) => m,
            Err(e) if e.to_string().contains("no message found") => return Ok(None),
            Err(e) => return Err(unavailable(&name, e)),
        };
        let key = msg
            .headers
            .get("Nats-Msg-Id")
            .and_then(|id| id.as_str().strip_prefix("k:").map(str::to_string));
        let appended_ms = (msg.time.unix_timestamp_nanos() / 1_000_000) as i64;
        let mut g = self.lock();
        if offset > g.purged_through {
            g.appended.insert(offset, appended_ms);
        }
        Ok(Some(Record {
            offset,
            key,
            appended_ms,
            payload: msg.payload,
        }))
    }

    fn stats(&self) -> LogStats {
        let g = self.lock();
        let connected = matches!(
            self.client.connection_state(),
            async_nats::connection::State::Connected
        );
        LogStats {
            bytes: g.bytes,
            segments: 0,
            next_offset: g.next_offset,
            remembered_keys: g.appended.len(),
            max_bytes: self.max_bytes,
            oldest_appended_ms: g.appended.values().next().copied(),
            early_released_segments: g.early_released,
            idempotency_floor_ms: g.idempotency_floor_ms,
            failing: g.failing || !connected,
            write_failures: g.write_failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_the_key_or_a_hash_of_the_payload() {
        assert_eq!(message_id(Some("b-1"), b"x"), "k:b-1");
        let h = message_id(None, b"x");
        assert!(h.starts_with("h:") && h.len() == 34, "{h}");
        assert_eq!(h, message_id(None, b"x"));
        assert_ne!(h, message_id(None, b"y"));
    }
}
