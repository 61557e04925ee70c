//! Where the flow definitions made over HTTP (`PUT /v1/flows/{flow}`) are
//! kept: one `flow.json` per flow under `data_dir` on one instance, or a
//! JetStream key-value bucket that every instance sharing a NATS log reads
//! and watches.
//!
//! API boundary: `Service` loads the definitions at start, writes them on
//! `PUT`/`DELETE`, and applies the changes `watch` reports (made by other
//! instances). Nothing here starts or stops a flow.
//!
//! Invariants:
//! - A revision orders the changes of one store: a change at or below a
//!   revision already applied for that flow is stale and skipped.
//! - `load` returns a revision taken before the listing, so a change made
//!   while listing is reported again by `watch(revision)`, never missed.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::core::flow::FlowConfig;
use crate::error::{Error, Result};

/// A definition written or removed by some instance.
#[derive(Debug)]
pub enum Change {
    /// `config` is `None` when the stored bytes no longer decode.
    Put {
        flow: String,
        config: Option<Box<FlowConfig>>,
        revision: u64,
    },
    Removed {
        flow: String,
        revision: u64,
    },
}

/// The stored definitions at one revision.
pub struct Loaded {
    pub flows: Vec<(FlowConfig, u64)>,
    pub revision: u64,
}

#[async_trait::async_trait]
pub trait Definitions: Send + Sync {
    /// Every stored definition, and the revision to watch after.
    async fn load(&self) -> Result<Loaded>;
    /// Stores `config` as its flow's definition; returns its revision.
    async fn put(&self, config: &FlowConfig) -> Result<u64>;
    /// Forgets `flow`'s definition (absent is fine); returns its revision.
    async fn remove(&self, flow: &str) -> Result<u64>;
    /// Changes after `revision`, by any instance; `None` when this process
    /// is the only writer (nothing to watch).
    async fn watch(&self, revision: u64) -> Result<Option<BoxStream<'static, Result<Change>>>>;
}

/// `<data_dir>/flows/<flow>/flow.json`, written by a rename.
pub struct LocalDefinitions {
    dir: PathBuf,
}

impl LocalDefinitions {
    pub fn new(dir: PathBuf) -> LocalDefinitions {
        LocalDefinitions { dir }
    }

    fn file(&self, flow: &str) -> PathBuf {
        self.dir.join(flow).join("flow.json")
    }
}

#[async_trait::async_trait]
impl Definitions for LocalDefinitions {
    async fn load(&self) -> Result<Loaded> {
        let mut flows = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path().join("flow.json");
            if let Ok(text) = std::fs::read_to_string(&path) {
                let cfg: FlowConfig = serde_json::from_str(&text)
                    .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
                flows.push((cfg, 0));
            }
        }
        Ok(Loaded { flows, revision: 0 })
    }

    async fn put(&self, config: &FlowConfig) -> Result<u64> {
        let file = self.file(&config.name);
        let dir = file.parent().expect("flow.json has a folder");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join("flow.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(config)?)?;
        std::fs::rename(&tmp, &file)?;
        Ok(0)
    }

    async fn remove(&self, flow: &str) -> Result<u64> {
        match std::fs::remove_file(self.file(flow)) {
            Ok(()) => Ok(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    async fn watch(&self, _revision: u64) -> Result<Option<BoxStream<'static, Result<Change>>>> {
        Ok(None)
    }
}

/// The key-value bucket `<stream_prefix>_FLOWS`: key = flow name, value =
/// the definition as JSON. History 1, no expiry.
pub struct NatsDefinitions {
    store: kv::Store,
    bucket: String,
}

/// A definition is small; a bigger value is refused before it is stored.
const MAX_DEFINITION_BYTES: usize = 1 << 20;

impl NatsDefinitions {
    pub async fn open(js: &jetstream::Context, prefix: &str, replicas: usize) -> Result<Self> {
        let bucket = format!("{prefix}_FLOWS");
        let store = crate::service::nats_conn::key_value(
            js,
            kv::Config {
                bucket: bucket.clone(),
                history: 1,
                num_replicas: replicas,
                max_value_size: MAX_DEFINITION_BYTES as i32,
                ..Default::default()
            },
        )
        .await?;
        Ok(NatsDefinitions { store, bucket })
    }

    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Unavailable(format!(
            "NATS key-value bucket `{}`: {what}: {e}",
            self.bucket
        ))
    }
}

fn change(entry: kv::Entry) -> Change {
    match entry.operation {
        kv::Operation::Put => Change::Put {
            config: serde_json::from_slice(&entry.value).ok().map(Box::new),
            flow: entry.key,
            revision: entry.revision,
        },
        kv::Operation::Delete | kv::Operation::Purge => Change::Removed {
            flow: entry.key,
            revision: entry.revision,
        },
    }
}

#[async_trait::async_trait]
impl Definitions for NatsDefinitions {
    async fn load(&self) -> Result<Loaded> {
        crate::service::nats_conn::retrying("loading the flow definitions", || self.load_once())
            .await
    }

    async fn put(&self, config: &FlowConfig) -> Result<u64> {
        let value = serde_json::to_vec(config)?;
        if value.len() > MAX_DEFINITION_BYTES {
            return Err(Error::Config(format!(
                "flow `{}`: the definition is {} bytes; at most {MAX_DEFINITION_BYTES}",
                config.name,
                value.len()
            )));
        }
        self.store
            .put(&config.name, value.into())
            .await
            .map_err(|e| self.unavailable("writing", e))
    }

    async fn remove(&self, flow: &str) -> Result<u64> {
        self.store
            .delete(flow)
            .await
            .map_err(|e| self.unavailable("deleting", e))?;
        Ok(0)
    }

    async fn watch(&self, revision: u64) -> Result<Option<BoxStream<'static, Result<Change>>>> {
        // Follows the bucket from `revision + 1`; when the watch breaks
        // (NATS restarted, connection lost), it resumes after the last
        // revision seen, once a second.
        let store = self.store.clone();
        let bucket = self.bucket.clone();
        let stream = futures::stream::unfold(
            (store, bucket, revision, None::<kv::Watch>),
            |(store, bucket, mut seen, mut watch)| async move {
                loop {
                    let w = match watch.as_mut() {
                        Some(w) => w,
                        None => match store.watch_all_from_revision(seen + 1).await {
                            Ok(w) => watch.insert(w),
                            Err(e) => {
                                tracing::warn!(bucket = %bucket, error = %e, "definitions_watch_failed");
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                continue;
                            }
                        },
                    };
                    match w.next().await {
                        Some(Ok(entry)) => {
                            seen = seen.max(entry.revision);
                            return Some((Ok(change(entry)), (store, bucket, seen, watch)));
                        }
                        Some(Err(e)) => {
                            tracing::warn!(bucket = %bucket, error = %e, "definitions_watch_failed");
                            watch = None;
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        None => {
                            watch = None;
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            },
        );
        Ok(Some(stream.boxed()))
    }
}

impl NatsDefinitions {
    async fn load_once(&self) -> Result<Loaded> {
        let store = &self.store;
        let status = store
            .status()
            .await
            .map_err(|e| self.unavailable("status", e))?;
        let revision = status.info.state.last_sequence;
        let mut keys = store
            .keys()
            .await
            .map_err(|e| self.unavailable("listing", e))?;
        let mut names = Vec::new();
        while let Some(k) = keys.next().await {
            names.push(k.map_err(|e| self.unavailable("listing", e))?);
        }
        let mut flows = Vec::new();
        for name in names {
            let Some(entry) = store
                .entry(name.clone())
                .await
                .map_err(|e| self.unavailable("reading", e))?
            else {
                continue;
            };
            if entry.operation != kv::Operation::Put {
                continue;
            }
            let cfg: FlowConfig = serde_json::from_slice(&entry.value).map_err(|e| {
                Error::Config(format!(
                    "flow `{name}` in NATS key-value bucket `{}`: {e}",
                    self.bucket
                ))
            })?;
            flows.push((cfg, entry.revision));
        }
        Ok(Loaded { flows, revision })
    }
}
