//! Helpers the NATS JetStream parts share (the ingest log, the leases, the
//! definitions bucket): a key-value bucket made when missing, and the
//! patience with a cluster that is electing its leaders.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use crate::error::{Error, Result};

/// The key-value bucket `cfg` names, made with `cfg` if missing.
pub(crate) async fn key_value(js: &jetstream::Context, cfg: kv::Config) -> Result<kv::Store> {
    match js.get_key_value(cfg.bucket.clone()).await {
        Ok(s) => Ok(s),
        Err(_) => js.create_key_value(cfg.clone()).await.map_err(|e| {
            Error::Unavailable(format!("NATS key-value bucket `{}`: {e}", cfg.bucket))
        }),
    }
}

/// While JetStream elects leaders (a server of the cluster restarted), its
/// requests time out for a few seconds: an instance starting or opening a
/// flow then waits, up to `START_PATIENCE`, rather than exiting.
pub(crate) const START_PATIENCE: Duration = Duration::from_secs(30);

/// `f` until it does not fail with `AUTOCDC_UNAVAILABLE`, for at most
/// `START_PATIENCE`.
pub(crate) async fn retrying<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = std::time::Instant::now() + START_PATIENCE;
    let mut pause = Duration::from_millis(250);
    loop {
        match f().await {
            Err(Error::Unavailable(m)) if std::time::Instant::now() + pause < deadline => {
                tracing::warn!(what, error = %m, retry_in_ms = pause.as_millis() as u64, "nats_unavailable");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(4));
            }
            other => return other,
        }
    }
}
