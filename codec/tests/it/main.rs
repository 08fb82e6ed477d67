//! Integration tests of tranche-codec, in one binary so they link once.

mod bad_inputs;
mod keys;
mod round_trip;
mod seed;
mod snapshots;

use tranche_codec::{CompletedRecord, WorkerDict};

/// A record with times in milliseconds.
pub(crate) fn record(
    pid: u64,
    min_id: u64,
    max_id: u64,
    worker: &str,
    completed_at_ms: u64,
    duration_ms: u64,
) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id,
        max_id,
        worker: worker.into(),
        completed_at_ms,
        duration_ms,
    }
}

/// A dictionary holding `ids`, in order.
pub(crate) fn dict(ids: &[&str]) -> WorkerDict {
    let mut dict = WorkerDict::new();
    for id in ids {
        dict.insert(id).expect("a small dictionary has room");
    }
    dict
}
