//! The partition record, its status, and the archived form of a completed one.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Error;

/// Where a partition is in its life.
///
/// All but `Completed` live in the active store: a partition that completes leaves it at
/// once for the archive, as a [`CompletedRecord`]; one an operator discards stays there,
/// marked, so it answers "discarded" for ever instead of looking completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting to be claimed (a retry, a released lease, or an explicit range).
    Pending,
    /// Leased by a worker that has not yet reported progress.
    Claimed,
    /// Leased by a worker that has heartbeated at least once.
    Running,
    /// Out of attempts; kept for an operator to retry or discard.
    Failed,
    /// Done; archived.
    Completed,
    /// Given up by an operator (`discard`): never claimed again, never archived.
    Discarded,
}

impl Status {
    /// Every status, in life order.
    pub const ALL: [Status; 6] = [
        Status::Pending,
        Status::Claimed,
        Status::Running,
        Status::Failed,
        Status::Completed,
        Status::Discarded,
    ];

    /// The lowercase name used in JSON, logs and the CLI.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Claimed => "claimed",
            Status::Running => "running",
            Status::Failed => "failed",
            Status::Completed => "completed",
            Status::Discarded => "discarded",
        }
    }

    /// Whether a worker currently holds a lease on the partition.
    pub const fn is_leased(self) -> bool {
        matches!(self, Status::Claimed | Status::Running)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a [`Status`] from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct ParseStatusError(String);

impl FromStr for Status {
    type Err = ParseStatusError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| ParseStatusError(s.to_owned()))
    }
}

/// One partition of a plan: a range of row IDs and the state of the work on it.
///
/// Times are milliseconds since the Unix epoch and durations are milliseconds, both
/// `u64`, everywhere in tranche. The struct is deliberately plain (no skipped or
/// flattened fields) because the active store serializes it with bincode's serde path,
/// which rejects those attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// The partition id; the plan maps it to `min_id..=max_id`.
    pub pid: u64,
    /// First row ID of the partition.
    pub min_id: u64,
    /// Last row ID of the partition (inclusive).
    pub max_id: u64,
    /// Where the partition is in its life.
    pub status: Status,
    /// The worker that holds (or last held) the partition.
    pub worker: Option<String>,
    /// How many times the partition has been claimed; bounded by the job's `max_attempts`.
    pub attempts: u32,
    /// The checkpoint: every ID in `min_id..progress` is done, so a new claimant resumes
    /// here. Starts at `min_id`. It saturates at `u64::MAX`, which only ever under-states
    /// the work done (the last ID is redone), never over-states it.
    pub progress: u64,
    /// The fencing token of the current lease: a holder whose token no longer matches
    /// has lost the lease and must not write.
    pub lease_token: Option<u64>,
    /// When the current lease expires unless renewed.
    pub deadline_ms: Option<u64>,
    /// When the partition was first materialised.
    pub created_at_ms: u64,
    /// When the current (or last) lease was granted.
    pub claimed_at_ms: Option<u64>,
    /// When anything about the partition last changed.
    pub updated_at_ms: u64,
    /// When the partition completed.
    pub completed_at_ms: Option<u64>,
    /// How long the successful attempt took.
    pub duration_ms: Option<u64>,
    /// The error of the last failed attempt, for the operator.
    pub last_error: Option<String>,
}

impl Partition {
    /// A fresh pending partition over `min_id..=max_id`, created at `now_ms`.
    pub fn pending(pid: u64, min_id: u64, max_id: u64, now_ms: u64) -> Self {
        Partition {
            pid,
            min_id,
            max_id,
            status: Status::Pending,
            worker: None,
            attempts: 0,
            progress: min_id,
            lease_token: None,
            deadline_ms: None,
            created_at_ms: now_ms,
            claimed_at_ms: None,
            updated_at_ms: now_ms,
            completed_at_ms: None,
            duration_ms: None,
            last_error: None,
        }
    }
}

/// What the archive keeps of a completed partition: the seed's six fields.
///
/// Every encoding in this crate (JSON, text v1, binary v2) stores exactly this,
/// losslessly, millisecond parts included.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompletedRecord {
    /// The partition id.
    pub pid: u64,
    /// First row ID of the partition.
    pub min_id: u64,
    /// Last row ID of the partition (inclusive).
    pub max_id: u64,
    /// The full worker id (not its short code). Shared: a batch of a thousand records
    /// by eight workers holds eight strings, and decoding it allocates eight, not a
    /// thousand (which would cost more than the decoding itself).
    pub worker: Arc<str>,
    /// When the partition completed, in milliseconds since the Unix epoch.
    pub completed_at_ms: u64,
    /// How long the successful attempt took, in milliseconds.
    pub duration_ms: u64,
}

impl TryFrom<&Partition> for CompletedRecord {
    type Error = Error;

    fn try_from(p: &Partition) -> Result<Self, Error> {
        if p.status != Status::Completed {
            return Err(Error::NotCompleted {
                pid: p.pid,
                status: p.status,
            });
        }
        let missing = |field| Error::MissingField { pid: p.pid, field };
        Ok(CompletedRecord {
            pid: p.pid,
            min_id: p.min_id,
            max_id: p.max_id,
            worker: p
                .worker
                .as_deref()
                .map(Arc::from)
                .ok_or_else(|| missing("worker"))?,
            completed_at_ms: p
                .completed_at_ms
                .ok_or_else(|| missing("completed_at_ms"))?,
            duration_ms: p.duration_ms.ok_or_else(|| missing("duration_ms"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for status in Status::ALL {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
            assert_eq!(
                serde_json::to_string(&status).ok(),
                Some(format!("\"{status}\""))
            );
        }
        assert!("Completed".parse::<Status>().is_err());
    }

    #[test]
    fn only_a_complete_completed_partition_converts() {
        let mut p = Partition::pending(4970, 4969001, 4970000, 1);
        assert!(matches!(
            CompletedRecord::try_from(&p),
            Err(Error::NotCompleted {
                status: Status::Pending,
                ..
            })
        ));
        p.status = Status::Completed;
        p.worker = Some("worker1".into());
        assert!(matches!(
            CompletedRecord::try_from(&p),
            Err(Error::MissingField {
                field: "completed_at_ms",
                ..
            })
        ));
        p.completed_at_ms = Some(1_719_234_405_000);
        p.duration_ms = Some(295_000);
        let r = CompletedRecord::try_from(&p).expect("complete");
        assert_eq!(
            r,
            CompletedRecord {
                pid: 4970,
                min_id: 4969001,
                max_id: 4970000,
                worker: "worker1".into(),
                completed_at_ms: 1_719_234_405_000,
                duration_ms: 295_000,
            }
        );
    }
}
