//! Helpers for tests of `autocdc serve` over real HTTP on a loopback port.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use autocdc::config::{CatalogConfig, Config, ServerConfig};
use autocdc::core::flow::FlowConfig;
use autocdc::fault::Faults;
use autocdc::service::run::{self, Running};
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use serde_json::{Value, json};

use super::*;

pub fn flow_cfg(name: &str, interval: &str) -> FlowConfig {
    let mut c = customers_config();
    c.name = name.to_string();
    c.target = format!("crm.{name}");
    c.commit_interval = Some(interval.to_string());
    c
}

pub fn config(dir: &Path, flows: Vec<FlowConfig>) -> Config {
    Config {
        server: ServerConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: dir.join("data").to_string_lossy().to_string(),
            ..ServerConfig::default()
        },
        catalog: CatalogConfig::Hadoop {
            warehouse: dir.join("wh").to_string_lossy().to_string(),
            s3: None,
        },
        flows,
        maintenance: Default::default(),
        ingest: Default::default(),
    }
}

pub async fn start(cfg: Config) -> Running {
    run::start(cfg, Arc::new(Faults::default())).await.unwrap()
}

pub fn url(r: &Running, path: &str) -> String {
    format!("http://{}{path}", r.addr)
}

pub fn ndjson(evs: &[Ev]) -> String {
    evs.iter()
        .map(|&(id, op, city, seq)| {
            json!({ "id": id, "op": if op == "D" { "DELETE" } else { "UPSERT" }, "city": city, "seq": seq })
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn post(
    client: &reqwest::Client,
    url: &str,
    ctype: &str,
    body: impl Into<reqwest::Body>,
    key: Option<&str>,
) -> (u16, Value) {
    let mut req = client.post(url).header("content-type", ctype).body(body);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub async fn flow_status(client: &reqwest::Client, r: &Running, flow: &str) -> Value {
    let resp = client
        .get(url(r, &format!("/v1/flows/{flow}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

/// The body of `GET path`, as text.
pub async fn get_text(client: &reqwest::Client, r: &Running, path: &str) -> String {
    client
        .get(url(r, path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The JSON body of `GET path`.
pub async fn get_json(client: &reqwest::Client, r: &Running, path: &str) -> Value {
    client
        .get(url(r, path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn commit(client: &reqwest::Client, r: &Running, flow: &str) -> Value {
    let resp = client
        .post(url(r, &format!("/v1/flows/{flow}/commit")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

pub async fn table(dir: &Path, flow: &str) -> BTreeSet<Vec<String>> {
    let faults = Arc::new(Faults::default());
    let cat = HadoopCatalog::new(dir.join("wh").to_str().unwrap(), None, faults).unwrap();
    let ident = autocdc::core::flow::parse_table_ident(flow, &format!("crm.{flow}")).unwrap();
    let Some(t) = cat.load_table(&ident).await.unwrap() else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for b in autocdc::table::read::scan(&cat, &t).await.unwrap() {
        for r in render_all(&b) {
            assert!(out.insert(r.clone()), "row {r:?} read twice");
        }
    }
    out
}

pub fn expected(evs: &[Ev]) -> BTreeSet<Vec<String>> {
    let flow = customers();
    oracle(&flow, &[batch(&flow, evs)])
}

pub fn arrow_body(evs: &[Ev]) -> Vec<u8> {
    autocdc::service::input::encode_arrow_ipc(&batch(&customers(), evs)).unwrap()
}

pub const CUSTOMERS_EVENTS: [Ev; 6] = [
    (1, "U", Some("Leeds"), 1),
    (2, "U", Some("York"), 2),
    (1, "U", Some("Bath"), 5),
    (1, "U", Some("Hull"), 3),
    (2, "D", None, 6),
    (2, "U", Some("Derby"), 4),
];
