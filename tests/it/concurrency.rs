//! Other writers and lost answers, on every catalog: a maintenance job that
//! rewrites the target's files between our commits, another writer
//! appending rows, a commit whose answer is lost after it landed, and one
//! that failed before landing; and, at the start, another instance creating
//! each table just before ours. Nothing may be lost or duplicated, and no
//! batch may be committed twice.
//!
//! The Hadoop catalog runs on local disk; the SQL and REST catalogs on the
//! servers `integration/backends.sh` starts (scripts/test does).

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use arrow_array::RecordBatch;
use autocdc::core::flow::Flow;
use autocdc::error::{Error, Result};
use autocdc::fault::Faults;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::catalog::rest::RestCatalog;
use autocdc::table::catalog::sql::SqlCatalog;
use autocdc::table::catalog::{Catalog, TableState};
use autocdc::table::engine::PROP_FLOW;
use autocdc::table::read::scan;
use common::*;
use iceberg::spec::{Schema, UnboundPartitionSpec};
use iceberg::{TableIdent, TableRequirement, TableUpdate};

const NOTHING: u8 = 0;
/// Rewrite the whole target into one file just before our next target commit.
const COMPACT_FIRST: u8 = 1;
/// Commit our next target commit, then answer as if the connection dropped.
const LOSE_ANSWER: u8 = 2;
/// Fail our next target commit without committing, as a 503 would.
const FAIL_BEFORE: u8 = 3;
/// Another writer appends a row just before our next target commit.
const APPEND_FIRST: u8 = 4;

/// A catalog with another writer and an unreliable network in front of it.
#[derive(Debug)]
struct Unruly {
    inner: Arc<dyn Catalog>,
    next: AtomicU8,
    /// Another instance creates each table just before we do (two
    /// instances starting one flow on a shared log).
    race_create: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Catalog for Unruly {
    fn file_io(&self) -> &iceberg::io::FileIO {
        self.inner.file_io()
    }
    async fn load_table(&self, ident: &TableIdent) -> Result<Option<TableState>> {
        self.inner.load_table(ident).await
    }
    async fn create_table(
        &self,
        ident: &TableIdent,
        schema: Schema,
        spec: UnboundPartitionSpec,
        properties: HashMap<String, String>,
    ) -> Result<TableState> {
        if self.race_create.load(Ordering::SeqCst) {
            self.inner
                .create_table(ident, schema.clone(), spec.clone(), properties.clone())
                .await
                .unwrap();
        }
        self.inner
            .create_table(ident, schema, spec, properties)
            .await
    }
    async fn commit(
        &self,
        base: &TableState,
        updates: Vec<TableUpdate>,
        requirements: Vec<TableRequirement>,
    ) -> Result<TableState> {
        if base.ident.name().ends_with("__autocdc_state") {
            return self.inner.commit(base, updates, requirements).await;
        }
        match self.next.swap(NOTHING, Ordering::SeqCst) {
            COMPACT_FIRST => {
                compact(self.inner.as_ref(), &base.ident).await;
                self.inner.commit(base, updates, requirements).await
            }
            LOSE_ANSWER => {
                self.inner.commit(base, updates, requirements).await?;
                Err(Error::Unavailable(
                    "connection reset after the request was sent".into(),
                ))
            }
            FAIL_BEFORE => Err(Error::Unavailable("503 Service Unavailable".into())),
            APPEND_FIRST => {
                let row = target_rows(&[(102, "Racer", 0)]);
                foreign_commit(self.inner.as_ref(), &base.ident, &row, false).await;
                self.inner.commit(base, updates, requirements).await
            }
            _ => self.inner.commit(base, updates, requirements).await,
        }
    }
    async fn drop_table(&self, ident: &TableIdent) -> Result<bool> {
        self.inner.drop_table(ident).await
    }
}

/// A compaction: every live row, deletes applied, rewritten into one new file.
async fn compact(cat: &dyn Catalog, ident: &TableIdent) {
    let t = cat.load_table(ident).await.unwrap().unwrap();
    let batches = scan(cat, &t).await.unwrap();
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    foreign_commit(cat, ident, &all, true).await;
}

/// (id, city, seq) rows in the target's column order.
fn target_rows(rows: &[(i64, &str, i64)]) -> RecordBatch {
    use arrow_array::{Int64Array, StringArray};
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as _,
        ),
        (
            "city",
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))) as _,
        ),
        (
            "seq",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))) as _,
        ),
    ])
    .unwrap()
}

fn our_snapshots(t: &TableState, flow: &Flow) -> usize {
    t.metadata
        .snapshots()
        .filter(|s| s.summary().additional_properties.get(PROP_FLOW) == Some(&flow.name))
        .count()
}

async fn scenario(inner: Arc<dyn Catalog>) {
    let flow = {
        let mut cfg = flow_in(&unique("conc")).config;
        cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
            min_input_files: Some(2),
            ..Default::default()
        });
        Flow::new(cfg).unwrap()
    };
    let unruly = Arc::new(Unruly {
        inner: inner.clone(),
        next: AtomicU8::new(NOTHING),
        race_create: true.into(),
    });
    let cat: Arc<dyn Catalog> = unruly.clone();
    let mut engine = open_engine(&cat, &flow).await;
    unruly.race_create.store(false, Ordering::SeqCst);
    let first: Vec<Ev> = (1..=6).map(|k| u(k, "Leeds", 1)).collect();
    engine.apply(&batch(&flow, &first), 1).await.unwrap();

    // Another writer appends two rows autocdc never saw.
    foreign_commit(
        inner.as_ref(),
        &flow.target,
        &target_rows(&[(100, "Foreign", 0), (101, "Foreign", 0)]),
        false,
    )
    .await;
    // Then, racing our next commit, a compaction rewrites every file our
    // state points into. Our commit loses; the rebuilt one must remove the
    // old rows by key, in their new file.
    unruly.next.store(COMPACT_FIRST, Ordering::SeqCst);
    let r = engine
        .apply(
            &batch(&flow, &[u(1, "York", 2), d(2, 2), u(100, "Mine", 1)]),
            2,
        )
        .await
        .unwrap();
    assert_eq!(r.commit_retries, 1, "{r:?}");
    assert!(r.stats.removed_by_key >= 3, "{:?}", r.stats);

    // The answer to a commit that landed is lost: the engine finds its
    // snapshot and does not commit again.
    unruly.next.store(LOSE_ANSWER, Ordering::SeqCst);
    let r = engine
        .apply(&batch(&flow, &[u(3, "Bath", 3)]), 3)
        .await
        .unwrap();
    assert_eq!(r.commit_retries, 1);
    // A commit that failed before landing is rebuilt and lands once.
    unruly.next.store(FAIL_BEFORE, Ordering::SeqCst);
    let r = engine
        .apply(&batch(&flow, &[u(4, "Ely", 4)]), 4)
        .await
        .unwrap();
    assert_eq!(r.commit_retries, 1);

    let fresh = open_engine(&inner, &flow).await;
    assert_eq!(
        our_snapshots(fresh.target(), &flow),
        4,
        "one snapshot per batch"
    );
    assert_eq!(fresh.summary().input_offset, engine.summary().input_offset);
    let want = rows(&[
        &["1", "York", "2"],
        &["3", "Bath", "3"],
        &["4", "Ely", "4"],
        &["5", "Leeds", "1"],
        &["6", "Leeds", "1"],
        &["100", "Mine", "1"],
        &["101", "Foreign", "0"],
    ]);
    assert_eq!(table_rows(&fresh).await, want);
    // And it goes on: a later update of a compacted row replaces it once.
    let mut fresh = fresh;
    fresh
        .apply(&batch(&flow, &[u(5, "Hull", 5), u(101, "Mine", 1)]), 5)
        .await
        .unwrap();
    let t = table_rows(&open_engine(&inner, &flow).await).await;
    assert!(
        t.contains(&vec!["5".into(), "Hull".into(), "5".into()]),
        "{t:?}"
    );
    assert!(
        t.contains(&vec!["101".into(), "Mine".into(), "1".into()]),
        "{t:?}"
    );
    assert_eq!(t.len(), 7, "{t:?}");

    // Our compaction races another writer's append: it loses the target's
    // compare-and-swap, nothing of it lands, and the next run compacts on
    // the new base. No row is lost or comes back.
    let engine_cat: Arc<dyn Catalog> = unruly.clone();
    let mut ours = open_engine(&engine_cat, &flow).await;
    unruly.next.store(APPEND_FIRST, Ordering::SeqCst);
    let r = ours.compact(10, false).await.unwrap();
    assert!(
        r.skipped
            .as_deref()
            .is_some_and(|s| s.starts_with("abandoned")),
        "{r:?}"
    );
    let mut want = t.clone();
    want.insert(vec!["102".into(), "Racer".into(), "0".into()]);
    assert_eq!(table_rows(&open_engine(&inner, &flow).await).await, want);
    let r = ours.compact(11, false).await.unwrap();
    assert!(r.skipped.is_none() && r.data_files_written >= 1, "{r:?}");
    let fresh = open_engine(&inner, &flow).await;
    assert_eq!(table_rows(&fresh).await, want);
    // Rows moved by it are still replaced exactly once.
    let mut fresh = fresh;
    fresh
        .apply(&batch(&flow, &[u(6, "Kent", 6)]), 6)
        .await
        .unwrap();
    want.remove(&vec!["6".into(), "Leeds".into(), "1".into()]);
    want.insert(vec!["6".into(), "Kent".into(), "6".into()]);
    assert_eq!(table_rows(&open_engine(&inner, &flow).await).await, want);
}

#[test]
fn other_writers_and_lost_answers_on_the_hadoop_catalog() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = HadoopCatalog::new(
            tmp.path().to_str().unwrap(),
            None,
            Arc::new(Faults::default()),
        );
        scenario(Arc::new(cat.unwrap())).await;
    });
}

#[test]
fn other_writers_and_lost_answers_on_the_sql_catalog() {
    rt().block_on(async {
        let cat = SqlCatalog::new(
            &backend_env("AUTOCDC_TEST_POSTGRES_URL"),
            &unique("conc"),
            &s3_warehouse("conc"),
            Some(&s3_config()),
            Arc::new(Faults::default()),
        );
        scenario(Arc::new(cat.unwrap())).await;
    });
}

#[test]
fn other_writers_and_lost_answers_on_the_rest_catalog() {
    let cfg = rest_config();
    rt().block_on(async {
        scenario(Arc::new(RestCatalog::new(&cfg).unwrap())).await;
    });
}

/// The lease epoch is a fencing token: once an instance committed under a
/// newer epoch, an instance still holding an older one (deposed while
/// paused) gets `AUTOCDC_LEASE_LOST` and changes nothing, whether its
/// engine's view of the target is stale (it loses the compare-and-swap
/// first) or fresh.
#[test]
fn a_commit_under_an_older_lease_epoch_is_refused_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat: Arc<dyn Catalog> = Arc::new(
            HadoopCatalog::new(
                tmp.path().to_str().unwrap(),
                None,
                Arc::new(Faults::default()),
            )
            .unwrap(),
        );
        let flow = flow_in(&unique("fence"));
        let mut old = open_engine(&cat, &flow).await;
        old.set_lease("a", 5);
        old.apply_at(&batch(&flow, &[u(1, "Oslo", 1)]), 1, 1)
            .await
            .unwrap();
        assert_eq!(
            snapshot_property(&old, "autocdc.lease-epoch").as_deref(),
            Some("5")
        );
        assert_eq!(
            snapshot_property(&old, "autocdc.committer").as_deref(),
            Some("a")
        );

        let mut new = open_engine(&cat, &flow).await;
        new.set_lease("b", 9);
        new.apply_at(&batch(&flow, &[u(2, "Rome", 1)]), 2, 2)
            .await
            .unwrap();
        let rows = table_rows(&new).await;
        let snapshots = new.target().metadata.snapshots().count();

        // Stale view: the commit loses the race, reloads, sees epoch 9.
        let err = old
            .apply_at(&batch(&flow, &[u(3, "Lima", 1)]), 3, 3)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "AUTOCDC_LEASE_LOST", "{err}");
        assert!(err.to_string().contains("`b`"), "{err}");
        // Fresh view (reopened after the race): refused before any file.
        let mut reopened = open_engine(&cat, &flow).await;
        reopened.set_lease("a", 5);
        let err = reopened
            .apply_at(&batch(&flow, &[u(4, "Bern", 1)]), 4, 4)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "AUTOCDC_LEASE_LOST", "{err}");

        let after = open_engine(&cat, &flow).await;
        assert_eq!(after.target().metadata.snapshots().count(), snapshots);
        assert_eq!(table_rows(&after).await, rows);
        assert_eq!(
            autocdc::table::engine::Engine::lease_of(&after.target().metadata, &flow.name),
            Some((9, "b".to_string()))
        );
        // The same epoch (the holder itself) and a newer one go on.
        let mut newest = open_engine(&cat, &flow).await;
        newest.set_lease("c", 12);
        newest
            .apply_at(&batch(&flow, &[u(5, "Kyiv", 1)]), 5, 5)
            .await
            .unwrap();
        assert_eq!(table_rows(&newest).await.len(), rows.len() + 1);
    });
}
