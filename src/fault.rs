//! Fault injection for crash tests: a named point in the commit protocol
//! where a test can make the process "crash" (return an error and stop).

use std::sync::Mutex;

/// The steps of one commit, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Data and delete files of the target are written.
    AfterTargetFiles,
    /// The state delta file is written.
    AfterStateFile,
    /// The state table's new metadata file exists (its commit point) but its
    /// version hint is not updated.
    AfterStateMetadata,
    /// The state table is committed; the target is not.
    AfterStateCommit,
    /// The target's new metadata file exists but its version hint is not updated.
    AfterTargetMetadata,
    /// Everything is committed; the caller has not been told.
    AfterTargetCommit,
    /// Opening an evolved definition: the state table's schema is
    /// committed; the target's is not.
    AfterStateSchema,
    /// Merged manifests are written; the commit that names them is not made.
    AfterManifestMerge,
    /// Compaction: the rewritten data files and merged deletes are written;
    /// nothing is committed.
    AfterCompactionFiles,
    /// Maintenance: the expiry is committed; no expired file is deleted yet.
    AfterExpireCommit,
    /// Maintenance: half of the expired files are deleted.
    MidMaintenanceDeletes,
    /// Not a commit step: an ingest log's fsync fails (a full or failing
    /// disk). Not in `ALL`.
    LogSync,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 6] = [
        FaultPoint::AfterTargetFiles,
        FaultPoint::AfterStateFile,
        FaultPoint::AfterStateMetadata,
        FaultPoint::AfterStateCommit,
        FaultPoint::AfterTargetMetadata,
        FaultPoint::AfterTargetCommit,
    ];
}

/// Armed faults: each fires once, the `n`-th time its point is reached,
/// as an error (a crash) or as a panic (a bug).
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Vec<(FaultPoint, usize, bool)>>,
}

impl Faults {
    /// Fires at the `nth` (0-based) time `point` is reached from now on.
    pub fn arm(&self, point: FaultPoint, nth: usize) {
        self.armed
            .lock()
            .expect("faults lock")
            .push((point, nth, false));
    }

    /// Like `arm`, but the fault panics: a bug in the commit path.
    pub fn arm_panic(&self, point: FaultPoint, nth: usize) {
        self.armed
            .lock()
            .expect("faults lock")
            .push((point, nth, true));
    }

    /// The point, when a fault fires here (`crate::error::Error` converts
    /// from it: `InjectedFault`). A leaf: the error type knows faults, not
    /// the other way round.
    pub fn hit(&self, point: FaultPoint) -> Result<(), FaultPoint> {
        let mut fire = None;
        self.armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain_mut(|(p, n, panics)| {
                if *p != point {
                    return true;
                }
                if *n == 0 {
                    fire = Some(*panics);
                    return false;
                }
                *n -= 1;
                true
            });
        match fire {
            None => Ok(()),
            Some(false) => Err(point),
            Some(true) => panic!("injected panic at {point:?}"),
        }
    }
}
