//! Shared test support: the customers flow, batch builders, the oracle, and
//! `Sim`, a model table that applies resolutions exactly as Iceberg readers
//! would (position deletes by file + row, equality deletes by key).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use autocdc::core::flow::{Flow, FlowConfig};
use autocdc::core::resolve::{self, BatchStats, Codec};
use autocdc::core::state::{KeyIndex, Loc};
use autocdc::table::state_table;

pub mod http;
pub mod scd;

pub const CUSTOMERS: &str = r#"
name = "customers"
target = "crm.customers"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
columns = [
  { name = "id", type = "long", required = true },
  { name = "city", type = "string" },
  { name = "op", type = "string", required = true },
  { name = "seq", type = "long", required = true },
]
"#;

pub fn customers_config() -> FlowConfig {
    toml::from_str(CUSTOMERS).unwrap()
}

pub fn customers() -> Flow {
    Flow::new(customers_config()).unwrap()
}

/// One change: (id, op, city, seq). `op` is "U" (UPSERT) or "D" (DELETE).
pub type Ev = (i64, &'static str, Option<&'static str>, i64);

pub fn u(id: i64, city: &'static str, seq: i64) -> Ev {
    (id, "U", Some(city), seq)
}

pub fn d(id: i64, seq: i64) -> Ev {
    (id, "D", None, seq)
}

/// A customers batch from events in arrival order.
pub fn batch(flow: &Flow, evs: &[Ev]) -> RecordBatch {
    let ids = Int64Array::from(evs.iter().map(|e| e.0).collect::<Vec<_>>());
    let city = StringArray::from(evs.iter().map(|e| e.2).collect::<Vec<_>>());
    let op = StringArray::from(
        evs.iter()
            .map(|e| match e.1 {
                "D" => "DELETE",
                "T" => "TRUNCATE",
                _ => "UPSERT",
            })
            .collect::<Vec<_>>(),
    );
    let seq = Int64Array::from(evs.iter().map(|e| e.3).collect::<Vec<_>>());
    let cols: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(city), Arc::new(op), Arc::new(seq)];
    RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
}

/// Renders rows of `batch` (only `cols`, source indices) as strings.
pub fn render(batch: &RecordBatch, rows: &[u32], cols: &[usize]) -> Vec<Vec<String>> {
    let opts = FormatOptions::default().with_null("NULL");
    let fmts: Vec<_> = cols
        .iter()
        .map(|&c| ArrayFormatter::try_new(batch.column(c).as_ref(), &opts).unwrap())
        .collect();
    rows.iter()
        .map(|&r| {
            fmts.iter()
                .map(|f| f.value(r as usize).to_string())
                .collect()
        })
        .collect()
}

/// Renders a whole target-shaped batch (all its columns).
pub fn render_all(batch: &RecordBatch) -> Vec<Vec<String>> {
    let cols: Vec<usize> = (0..batch.num_columns()).collect();
    let rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
    render(batch, &rows, &cols)
}

/// The oracle: per key, sort all changes by (sequence, upsert over delete,
/// fingerprint), keep the last, drop it if it is a delete. Returns the target rows, sorted.
pub fn oracle(flow: &Flow, batches: &[RecordBatch]) -> BTreeSet<Vec<String>> {
    let codec = Codec::new(flow).unwrap();
    // key -> (sequence, fingerprint, is delete, rendered target row)
    type Winner = (Vec<u8>, u64, bool, Vec<String>);
    let mut best: BTreeMap<Vec<u8>, Winner> = BTreeMap::new();
    for b in batches {
        let keys = codec
            .keys
            .convert_columns(
                &flow
                    .key_idx
                    .iter()
                    .map(|&i| b.column(i).clone())
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let seqs = codec
            .seqs
            .convert_columns(
                &flow
                    .seq_idx
                    .iter()
                    .map(|&i| b.column(i).clone())
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let fps = codec.fingerprints(b).unwrap();
        let del = flow.deletes.as_ref().map(|p| p.evaluate(b).unwrap());
        let all: Vec<u32> = (0..b.num_rows() as u32).collect();
        let rendered = render(b, &all, &flow.target_cols);
        for r in 0..b.num_rows() {
            let cand = (
                seqs.row(r).as_ref().to_vec(),
                fps[r],
                del.as_ref().is_some_and(|d| d.value(r)),
                rendered[r].clone(),
            );
            let k = keys.row(r).as_ref().to_vec();
            match best.get(&k) {
                // At one sequence an upsert wins over a delete (SCD Type 1).
                Some(cur) if (&cur.0, !cur.2, cur.1) >= (&cand.0, !cand.2, cand.1) => {}
                _ => {
                    best.insert(k, cand);
                }
            }
        }
    }
    best.into_values().filter(|v| !v.2).map(|v| v.3).collect()
}

/// A model of the target table: data files as vectors of rows, removed rows
/// set to `None`. Position deletes must hit a live row (asserted); equality
/// deletes remove every live row with the key in files written before.
pub struct Sim {
    pub flow: Flow,
    codec: Codec,
    pub state: KeyIndex,
    files: Vec<(String, Vec<Option<Vec<String>>>)>,
    pub now_ms: i64,
    pub stats: BatchStats,
}

impl Sim {
    pub fn new(flow: Flow) -> Sim {
        let codec = Codec::new(&flow).unwrap();
        Sim {
            flow,
            codec,
            state: KeyIndex::new(),
            files: Vec::new(),
            now_ms: 1_000,
            stats: BatchStats::default(),
        }
    }

    pub fn apply(&mut self, batch: &RecordBatch) -> autocdc::Result<BatchStats> {
        let res = resolve::resolve(&self.flow, &self.codec, batch, &self.state, true, None)?;
        for loc in &res.remove_positions {
            let path = self.state.files.path(loc.file).to_string();
            let f = self
                .files
                .iter_mut()
                .find(|f| f.0 == path)
                .expect("file of a position delete exists");
            let row = &mut f.1[loc.pos as usize];
            assert!(
                row.is_some(),
                "position delete of a row already removed: {path}:{}",
                loc.pos
            );
            *row = None;
        }
        assert!(
            res.remove_keys.is_empty(),
            "a complete state never needs equality deletes"
        );
        let rows = render(batch, &res.inserts, &self.flow.target_cols);
        let path = format!("sim-{}.parquet", self.files.len());
        let id = self.state.files.intern(&path);
        let locs: Vec<Loc> = (0..rows.len() as u32)
            .map(|pos| Loc { file: id, pos })
            .collect();
        self.files
            .push((path, rows.into_iter().map(Some).collect()));
        resolve::apply(&mut self.state, &res, &locs, self.now_ms);
        self.state.check_invariants();
        self.stats.add(&res.stats);
        self.now_ms += 1;
        Ok(res.stats)
    }

    /// Persists the state to the state-table form and loads it back, as a
    /// restart on a fresh machine would.
    pub fn restart(&mut self) {
        let b = state_table::to_batch(&self.flow, &self.codec, &self.state, self.state.iter(), 7)
            .unwrap();
        let mut fresh = KeyIndex::new();
        state_table::load(&self.flow, &self.codec, &mut fresh, &[b]).unwrap();
        assert_eq!(fresh.len(), self.state.len());
        self.state = fresh;
    }

    pub fn table(&self) -> BTreeSet<Vec<String>> {
        let key_pos: Vec<usize> = self
            .flow
            .key_idx
            .iter()
            .map(|k| self.flow.target_cols.iter().position(|c| c == k).unwrap())
            .collect();
        let mut out = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for (_, rows) in &self.files {
            for r in rows.iter().flatten() {
                let k: Vec<&String> = key_pos.iter().map(|&p| &r[p]).collect();
                assert!(keys.insert(format!("{k:?}")), "two live rows for key {k:?}");
                out.insert(r.clone());
            }
        }
        out
    }
}

pub fn rows(v: &[&[&str]]) -> BTreeSet<Vec<String>> {
    v.iter()
        .map(|r| r.iter().map(|s| s.to_string()).collect())
        .collect()
}

/// A named case of the edge-case battery: micro-batches in arrival order and
/// the expected target rows (id, city, seq).
pub struct Case {
    pub name: &'static str,
    pub batches: Vec<Vec<Ev>>,
    pub expected: BTreeSet<Vec<String>>,
}

pub mod cases {
    use super::*;

    fn case(name: &'static str, batches: Vec<Vec<Ev>>, expected: &[&[&str]]) -> Case {
        Case {
            name,
            batches,
            expected: rows(expected),
        }
    }

    pub fn upsert_new_key() -> Case {
        case(
            "upsert to a new key",
            vec![vec![u(1, "Leeds", 1)]],
            &[&["1", "Leeds", "1"]],
        )
    }
    pub fn delete_never_existed() -> Case {
        case(
            "delete of a key that never existed",
            vec![vec![d(1, 1)]],
            &[],
        )
    }
    pub fn several_updates_one_batch() -> Case {
        case(
            "several updates in one batch",
            vec![vec![u(1, "A", 1), u(1, "B", 2), u(1, "C", 3)]],
            &[&["1", "C", "3"]],
        )
    }
    pub fn stale_delete() -> Case {
        case(
            "stale delete",
            vec![vec![u(1, "A", 1)], vec![u(1, "C", 3)], vec![d(1, 2)]],
            &[&["1", "C", "3"]],
        )
    }
    pub fn stale_insert_after_delete() -> Case {
        case(
            "stale insert after a delete",
            vec![vec![u(1, "C", 3)], vec![d(1, 5)], vec![u(1, "B", 2)]],
            &[],
        )
    }
    pub fn delete_before_older_insert() -> Case {
        case(
            "delete before an older insert",
            vec![vec![d(1, 5)], vec![u(1, "B", 2)]],
            &[],
        )
    }
    pub fn resurrection() -> Case {
        case(
            "resurrection",
            vec![vec![u(1, "A", 1)], vec![d(1, 2)], vec![u(1, "C", 3)]],
            &[&["1", "C", "3"]],
        )
    }
    pub fn exact_duplicate() -> Case {
        case(
            "exact duplicate",
            vec![
                vec![u(1, "Boston", 5), u(1, "Boston", 5)],
                vec![u(1, "Boston", 5)],
            ],
            &[&["1", "Boston", "5"]],
        )
    }
    /// Customers: applying by arrival order would give 1 Hull, 2 Derby.
    pub fn customers_scenario() -> Case {
        case(
            "customers",
            vec![
                vec![u(1, "Leeds", 1)],
                vec![u(2, "York", 2)],
                vec![u(1, "Bath", 5)],
                vec![u(1, "Hull", 3)],
                vec![d(2, 6)],
                vec![u(2, "Derby", 4)],
            ],
            &[&["1", "Bath", "5"]],
        )
    }
    pub fn kitchen_locations() -> Case {
        case(
            "kitchen locations",
            vec![
                vec![
                    u(1, "San Francisco", 1),
                    u(2, "Los Angeles", 1),
                    u(3, "Chicago", 1),
                    u(4, "Austin", 1),
                ],
                vec![u(2, "Los Angeles - Arts District", 5)],
                vec![u(1, "San Francisco - SoMa", 4)],
                vec![(3, "D", Some("Chicago"), 6)],
                vec![u(2, "Los Angeles (STALE)", 3)],
            ],
            &[
                &["1", "San Francisco - SoMa", "4"],
                &["2", "Los Angeles - Arts District", "5"],
                &["4", "Austin", "1"],
            ],
        )
    }
    /// 500 keys, each UPSERT@1, @3, @2 shuffled across 5 batches, plus DELETE@5 for 100.
    pub fn volume_out_of_order() -> Case {
        let cities: [&'static str; 3] = ["one", "two", "three"];
        let mut evs: Vec<Ev> = Vec::new();
        for k in 0..500i64 {
            for s in [1i64, 3, 2] {
                evs.push((k, "U", Some(cities[s as usize - 1]), s));
            }
            if k % 5 == 0 {
                evs.push(d(k, 5));
            }
        }
        // A fixed pseudo-random shuffle (xorshift), so the case is reproducible.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in (1..evs.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            evs.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let batches: Vec<Vec<Ev>> = evs
            .chunks(evs.len().div_ceil(5))
            .map(|c| c.to_vec())
            .collect();
        let expected: BTreeSet<Vec<String>> = (0..500i64)
            .filter(|k| k % 5 != 0)
            .map(|k| vec![k.to_string(), "three".to_string(), "3".to_string()])
            .collect();
        Case {
            name: "volume, out of order",
            batches,
            expected,
        }
    }

    pub fn all() -> Vec<Case> {
        vec![
            upsert_new_key(),
            delete_never_existed(),
            several_updates_one_batch(),
            stale_delete(),
            stale_insert_after_delete(),
            delete_before_older_insert(),
            resurrection(),
            exact_duplicate(),
            customers_scenario(),
            kitchen_locations(),
            volume_out_of_order(),
        ]
    }
}

/// A two-worker runtime, like the machines CI runs on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub async fn open_engine(
    cat: &Arc<dyn autocdc::table::catalog::Catalog>,
    flow: &Flow,
) -> autocdc::table::engine::Engine {
    autocdc::table::engine::Engine::open(
        flow.clone(),
        cat.clone(),
        Arc::new(autocdc::fault::Faults::default()),
    )
    .await
    .unwrap()
}

/// Every row of the target, each exactly once.
pub async fn table_rows(engine: &autocdc::table::engine::Engine) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for b in engine.scan_target().await.unwrap() {
        for r in render_all(&b) {
            assert!(out.insert(r.clone()), "row {r:?} read twice");
        }
    }
    out
}

/// A property of the target's current snapshot summary (`total-equality-deletes`...).
pub fn snapshot_property(engine: &autocdc::table::engine::Engine, key: &str) -> Option<String> {
    let snapshot = engine.target().metadata.current_snapshot()?;
    snapshot.summary().additional_properties.get(key).cloned()
}

/// The names of the target's current columns, in schema order.
pub fn column_names(engine: &autocdc::table::engine::Engine) -> Vec<String> {
    let schema = engine.target().metadata.current_schema().clone();
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A backend endpoint from `integration/backends.sh`, which `scripts/test` starts.
pub fn backend_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `eval \"$(bash integration/backends.sh up)\"` first (scripts/test does)")
    })
}

/// The S3 store `integration/backends.sh up weed` started.
pub fn s3_config() -> autocdc::config::S3Config {
    autocdc::config::S3Config {
        endpoint: Some(backend_env("AUTOCDC_TEST_S3_ENDPOINT")),
        region: Some(backend_env("AUTOCDC_TEST_S3_REGION")),
        path_style: None,
        access_key_id: Some(backend_env("AUTOCDC_TEST_S3_ACCESS_KEY_ID")),
        secret_access_key: Some(backend_env("AUTOCDC_TEST_S3_SECRET_ACCESS_KEY")),
        session_token: None,
    }
}

/// A fresh warehouse prefix in the test bucket.
pub fn s3_warehouse(prefix: &str) -> String {
    format!(
        "s3://{}/{}",
        backend_env("AUTOCDC_TEST_S3_BUCKET"),
        unique(prefix)
    )
}

/// Events split into batches wherever `cuts` says.
pub fn cut_batches(flow: &Flow, evs: &[Ev], cuts: &[bool]) -> Vec<RecordBatch> {
    let mut batches: Vec<Vec<Ev>> = vec![Vec::new()];
    for (i, e) in evs.iter().enumerate() {
        batches.last_mut().unwrap().push(*e);
        if cuts[i] && i + 1 < evs.len() {
            batches.push(Vec::new());
        }
    }
    batches.iter().map(|b| batch(flow, b)).collect()
}

/// The REST catalog `integration/backends.sh up weed` started, with OAuth2
/// client credentials and its S3 store for the table files.
pub fn rest_config() -> autocdc::config::RestConfig {
    let mut cfg: autocdc::config::RestConfig = toml::from_str(&format!(
        "uri = \"{}\"\nwarehouse = \"{}\"\ncredential = \"{}:{}\"",
        backend_env("AUTOCDC_TEST_REST_URI"),
        backend_env("AUTOCDC_TEST_REST_WAREHOUSE"),
        backend_env("AUTOCDC_TEST_S3_ACCESS_KEY_ID"),
        backend_env("AUTOCDC_TEST_S3_SECRET_ACCESS_KEY"),
    ))
    .unwrap();
    cfg.s3 = Some(s3_config());
    cfg
}

/// The customers flow with its target in namespace `ns`.
pub fn flow_in(ns: &str) -> Flow {
    let mut cfg = customers_config();
    cfg.target = format!("{ns}.customers");
    Flow::new(cfg).unwrap()
}

/// The property test through a real catalog: random changes, split into
/// random batches, applied with random restarts (each a fresh catalog client
/// from `open_catalog`, as a new process would make), must give the oracle.
/// `case` makes each case's flow and its catalog opener.
pub fn random_batchings_match_the_oracle<C>(cases: u32, case: impl Fn() -> (Flow, C))
where
    C: Fn() -> Arc<dyn autocdc::table::catalog::Catalog>,
{
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec((0i64..4, any::<bool>(), 0usize..3, 0i64..5), 1..16),
        prop::collection::vec(any::<bool>(), 16),
        prop::collection::vec(any::<bool>(), 16),
    );
    runner
        .run(&strategy, |(changes, cuts, restarts)| {
            let cities = ["Leeds", "York", "Bath"];
            let (flow, open_catalog) = case();
            let evs: Vec<Ev> = changes
                .iter()
                .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, cities[c], s) })
                .collect();
            let arrow = cut_batches(&flow, &evs, &cuts);
            let got = rt.block_on(async {
                let mut engine = open_engine(&open_catalog(), &flow).await;
                for (i, b) in arrow.iter().enumerate() {
                    engine.apply(b, i as i64).await.unwrap();
                    if restarts[i] {
                        engine = open_engine(&open_catalog(), &flow).await;
                    }
                }
                table_rows(&engine).await
            });
            prop_assert_eq!(got, oracle(&flow, &arrow));
            Ok(())
        })
        .unwrap();
}

/// `batch` (source columns) cut to the flow's target columns, in order.
pub fn target_rows_of(flow: &Flow, batch: &RecordBatch) -> RecordBatch {
    let fields: Vec<_> = flow
        .target_cols
        .iter()
        .map(|&c| batch.schema().field(c).clone())
        .collect();
    let cols = flow
        .target_cols
        .iter()
        .map(|&c| batch.column(c).clone())
        .collect();
    RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), cols).unwrap()
}

/// A foreign snapshot (another writer's, no autocdc marker): `rows` (in
/// the table's column order) appended, or (with `replace`) the table's
/// whole content rewritten into them.
pub async fn foreign_commit(
    cat: &dyn autocdc::table::catalog::Catalog,
    ident: &iceberg::TableIdent,
    rows: &RecordBatch,
    replace: bool,
) {
    use autocdc::table::row_delta::{RowDelta, produce};
    use autocdc::table::write::{FileNamer, single_data_file};
    let t = cat.load_table(ident).await.unwrap().unwrap();
    let schema = t.metadata.current_schema().clone();
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap());
    let rows = RecordBatch::try_new(arrow, rows.columns().to_vec()).unwrap();
    let mut namer = FileNamer::new(t.location());
    let file = single_data_file(
        cat.file_io(),
        &mut namer,
        schema,
        t.metadata.default_partition_spec_id(),
        &rows,
    )
    .await
    .unwrap();
    let p = produce(
        cat.file_io(),
        &t,
        RowDelta {
            data: file.into_iter().collect(),
            deletes: Vec::new(),
            base_snapshot: t.metadata.current_snapshot_id(),
            replace,
            properties: std::collections::HashMap::from([(
                "engine".to_string(),
                "maintenance".to_string(),
            )]),
            now_ms: 1,
            rewrite: None,
        },
    )
    .await
    .unwrap();
    cat.commit(&t, p.updates, p.requirements).await.unwrap();
}
