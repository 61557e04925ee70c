//! Reading a table's current snapshot (deletes applied): iceberg-rust's
//! scan, a reader independent of autocdc's writer, used by the tests, the
//! benches and `autocdc show`; autocdc's own reader (compaction's) where
//! iceberg-rust 0.10 cannot read the table or stalls.

use std::time::Duration;

use arrow_array::RecordBatch;
use futures::{Stream, TryStreamExt};

use crate::error::Result;
use crate::table::catalog::{Catalog, TableState};
use crate::table::compact;

/// iceberg-rust 0.10's reader can wait forever for a delete file another
/// of its tasks loads: the waiter takes the load's `Notify` under a lock
/// but awaits it after the lock is released, so a load that finishes in
/// between wakes no one (apache/iceberg-rust#2859, merged after 0.10.1;
/// its equality-delete path has the same shape). A scan that yields no
/// batch for this long is dropped and started again.
const READ_STALL: Duration = Duration::from_secs(30);

/// Scans with iceberg-rust's reader before autocdc's own reads the table.
const READ_ATTEMPTS: u32 = 2;

/// Reads the current snapshot of a table (deletes applied), with
/// iceberg-rust's scan, else with autocdc's own where iceberg-rust 0.10
/// cannot read the table or its scan stalls.
pub async fn scan(catalog: &dyn Catalog, table: &TableState) -> Result<Vec<RecordBatch>> {
    if table.metadata.current_snapshot().is_none() {
        return Ok(Vec::new());
    }
    // iceberg-rust 0.10 takes columns named like its metadata columns
    // (`pos`, `file_path`, ...) for those and cannot find them: such
    // tables are read with autocdc's own reader (compaction's).
    let reserved = table
        .metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .any(|f| iceberg::metadata_columns::is_metadata_column_name(&f.name));
    if reserved {
        return compact::scan(catalog.file_io(), table).await;
    }
    let t = table.table(catalog.file_io())?;
    for attempt in 1..=READ_ATTEMPTS {
        match iceberg_scan(&t, READ_STALL).await {
            Ok(Some(batches)) => return Ok(batches),
            Ok(None) => tracing::warn!(
                table = %table.ident,
                attempt,
                "iceberg-rust's scan yielded nothing for {READ_STALL:?} (a lost wake-up in its delete loading); {}",
                if attempt < READ_ATTEMPTS {
                    "reading again"
                } else {
                    "reading with autocdc's reader"
                }
            ),
            // It also cannot read a file written before a nested column was
            // added or changed; autocdc's reader can.
            Err(e) => {
                tracing::debug!(table = %table.ident, error = %e, "iceberg-rust's scan failed; reading with autocdc's reader");
                break;
            }
        }
    }
    compact::scan(catalog.file_io(), table).await
}

/// One scan with iceberg-rust's reader: None when it stalled.
async fn iceberg_scan(
    t: &iceberg::table::Table,
    stall: Duration,
) -> Result<Option<Vec<RecordBatch>>> {
    let scan = t.scan().select_all().build()?;
    let Ok(stream) = tokio::time::timeout(stall, scan.to_arrow()).await else {
        return Ok(None);
    };
    collect_unstalled(stream?, stall).await
}

/// Every batch of `stream`; None as soon as no batch comes for `stall`.
async fn collect_unstalled<S, E>(mut stream: S, stall: Duration) -> Result<Option<Vec<RecordBatch>>>
where
    S: Stream<Item = std::result::Result<RecordBatch, E>> + Unpin,
    crate::error::Error: From<E>,
{
    let mut batches = Vec::new();
    loop {
        match tokio::time::timeout(stall, stream.try_next()).await {
            Err(_) => return Ok(None),
            Ok(next) => match next? {
                Some(b) => batches.push(b),
                None => return Ok(Some(batches)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::Int64Array;
    use futures::StreamExt;

    use super::*;

    fn batch(v: i64) -> RecordBatch {
        RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from(vec![v])) as arrow_array::ArrayRef,
        )])
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_stops_yielding_is_a_stall_and_one_that_ends_is_read_whole() {
        let stall = Duration::from_secs(30);
        let ok = |v| Ok::<_, crate::error::Error>(batch(v));
        // Two batches, then nothing ever again (a lost wake-up).
        let stuck = futures::stream::iter([ok(1), ok(2)]).chain(futures::stream::pending());
        assert!(collect_unstalled(stuck, stall).await.unwrap().is_none());
        // Slow but moving: each batch within the limit.
        let slow = futures::stream::iter([1, 2, 3]).then(|v| async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            ok(v)
        });
        let got = collect_unstalled(Box::pin(slow), stall)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![batch(1), batch(2), batch(3)]);
        // An error is the reader's, not a stall.
        let failing =
            futures::stream::iter([ok(1), Err(crate::error::Error::Unavailable("gone".into()))]);
        assert!(collect_unstalled(failing, stall).await.is_err());
    }
}
