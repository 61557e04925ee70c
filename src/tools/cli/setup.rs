//! What the commands share: the configuration and catalog they open, the
//! progress bar, and how a batch's counts and a size are printed.

use std::path::Path;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{CatalogConfig, Config};
use crate::core::resolve::BatchStats;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::table::catalog::{self, Catalog};

pub(super) fn load_config(path: &Path) -> Result<Config> {
    if path.exists() {
        Config::load(path)
    } else if path == Path::new("autocdc.toml") {
        Err(Error::Config(
            "no autocdc.toml here; pass --config FILE (examples under catalogs/), or run `autocdc demo`".into(),
        ))
    } else {
        Err(Error::Config(format!(
            "config file {} does not exist",
            path.display()
        )))
    }
}

pub(super) fn open_catalog(config: &CatalogConfig) -> Result<Arc<dyn Catalog>> {
    catalog::open(config, Arc::new(Faults::default()))
}

pub(super) fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {what} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

pub(super) fn stats_line(s: &BatchStats) -> String {
    let mut line = format!(
        "rows={} upserts={} deletes={} stale={} duplicates={} ties={}",
        s.rows_in, s.upserts, s.deletes, s.stale, s.duplicates, s.ties
    );
    if s.truncates > 0 {
        line += &format!(" truncates={} truncated={}", s.truncates, s.truncated);
    }
    if s.unchanged > 0 {
        line += &format!(" unchanged={}", s.unchanged);
    }
    if s.placeholders_unfilled > 0 {
        line += &format!(" placeholders_unfilled={}", s.placeholders_unfilled);
    }
    line
}
