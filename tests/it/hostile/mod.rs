//! Hostile input and faults against `autocdc serve` over real HTTP: each
//! case gets its 4xx (or its durable behaviour), the server stays alive and
//! nothing of a refused request is applied. `requests`: bodies, headers and
//! values; `definitions`: flow definitions and tokens; `faults`: panics,
//! failing disks, slow clients and records that cannot be applied.

mod definitions;
mod faults;
mod requests;

use crate::common;

use common::http::*;
use common::*;

/// The server answers, and the flow still commits a good batch.
async fn still_serving(
    c: &reqwest::Client,
    r: &autocdc::service::run::Running,
    dir: &std::path::Path,
) {
    let health = c.get(url(r, "/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let good = [u(1, "Leeds", 1), u(2, "York", 2)];
    let (s, body) = post(
        c,
        &url(r, "/v1/flows/c/changes?wait=commit"),
        "application/x-ndjson",
        ndjson(&good),
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(table(dir, "c").await, expected(&good));
}

/// `n` upserts of the customers flow.
fn leeds(n: i64) -> Vec<Ev> {
    (0..n).map(|i| u(i, "Leeds", i)).collect()
}
