//! `autocdc push`: sends change files to a running `autocdc serve`, as Arrow
//! IPC, with retries and an idempotency key derived from the content, so a
//! retried (or re-run) push is applied once.

use std::path::PathBuf;
use std::time::Duration;

use crate::core::flow::{Flow, FlowConfig};
use crate::error::{Error, Result};
use crate::service::input;

pub struct PushArgs {
    pub url: String,
    pub flow: String,
    pub files: Vec<PathBuf>,
    pub token: Option<String>,
    pub batch_rows: Option<usize>,
    pub wait_commit: bool,
    pub max_attempts: u32,
}

fn net(url: &str, e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("{url}: {e}"))
}

/// Pushes every file (cut into batches of `batch_rows`); returns (batches, rows).
pub async fn push(args: &PushArgs) -> Result<(usize, usize)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| net(&args.url, e))?;
    let base = args.url.trim_end_matches('/');
    let auth = |r: reqwest::RequestBuilder| match &args.token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    // The flow's definition gives the schema the files are read into.
    let url = format!("{base}/v1/flows/{}", args.flow);
    let resp = auth(client.get(&url))
        .send()
        .await
        .map_err(|e| net(&url, e))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| net(&url, e))?;
    if !status.is_success() {
        return Err(Error::Config(format!("GET {url}: {status}: {text}")));
    }
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let cfg: FlowConfig = serde_json::from_value(v["definition"].clone())?;
    let flow = Flow::new(cfg)?;
    let url = format!(
        "{base}/v1/flows/{}/changes{}",
        args.flow,
        if args.wait_commit { "?wait=commit" } else { "" }
    );
    let (mut batches, mut rows) = (0, 0);
    for path in &args.files {
        let batch = input::read_file(&flow, path)?;
        let step = args.batch_rows.unwrap_or(batch.num_rows()).max(1);
        let mut start = 0;
        while start < batch.num_rows() {
            let part = batch.slice(start, step.min(batch.num_rows() - start));
            start += part.num_rows();
            let body = input::encode_arrow_ipc(&part)?;
            let key = format!("{}-{:016x}", args.flow, xxhash_rust::xxh3::xxh3_64(&body));
            send(&client, &url, &args.token, &key, body, args.max_attempts).await?;
            batches += 1;
            rows += part.num_rows();
        }
    }
    Ok((batches, rows))
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    token: &Option<String>,
    key: &str,
    body: Vec<u8>,
    max_attempts: u32,
) -> Result<serde_json::Value> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut req = client
            .post(url)
            .header("content-type", crate::service::http::ARROW_STREAM)
            .header("idempotency-key", key)
            .body(body.clone());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let outcome = match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let text = resp.text().await.unwrap_or_default();
                if status.is_success() {
                    return Ok(serde_json::from_str(&text).unwrap_or_default());
                }
                if status.as_u16() == 429 || status.is_server_error() {
                    if let Some(s) = retry_after {
                        delay = Duration::from_secs(s);
                    }
                    format!("{status}: {text}")
                } else {
                    // A rejected batch: retrying cannot help.
                    return Err(Error::Config(format!("POST {url}: {status}: {text}")));
                }
            }
            Err(e) => e.to_string(),
        };
        if attempt >= max_attempts {
            return Err(net(
                url,
                format!("gave up after {attempt} attempts: {outcome}"),
            ));
        }
        eprintln!("autocdc push: attempt {attempt} failed ({outcome}); retrying in {delay:?}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
