//! Every ready-made configuration under `catalogs/` loads and its flows validate.

use autocdc::config::Config;

#[test]
fn every_config_under_catalogs_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("catalogs");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let flows = config
            .flows()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!flows.is_empty(), "{} declares no flow", path.display());
        config.server.request_timeout().unwrap();
        config.server.idempotency_window().unwrap();
        if let autocdc::config::IngestConfig::Nats(nats) = &config.ingest {
            nats.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        n += 1;
    }
    assert!(n >= 1, "no configs under {}", dir.display());
}
