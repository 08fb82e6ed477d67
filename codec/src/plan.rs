//! Plan geometry: which pid covers which IDs, computed, never stored; and the plan
//! registry's entries.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The geometry of a uniform plan: the IDs `min..=max` cut into partitions of `size` IDs, numbered
/// from `first_pid`. The last partition is short when `size` does not divide the span.
///
/// A plan is a generator, not a list: the pid of any ID and the range of any pid are
/// arithmetic, which is what lets the active store plan 5 billion IDs in a few bytes
/// and the router `locate` an ID without a lookup. The seed's numbering is
/// `PlanGeometry::new(1, 1, max, 1000)`: pid 4970 covers `4969001..=4970000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PlanFields", into = "PlanFields")]
pub struct PlanGeometry {
    first_pid: u64,
    min: u64,
    max: u64,
    size: u64,
    /// Cached `last_pid`; validated once so no method has to handle overflow again.
    last_pid: u64,
}

/// The serialized form of a [`PlanGeometry`]: its four defining fields, validated on the way in.
#[derive(Serialize, Deserialize)]
struct PlanFields {
    first_pid: u64,
    min: u64,
    max: u64,
    size: u64,
}

impl TryFrom<PlanFields> for PlanGeometry {
    type Error = Error;
    fn try_from(f: PlanFields) -> Result<Self, Error> {
        PlanGeometry::new(f.first_pid, f.min, f.max, f.size)
    }
}

impl From<PlanGeometry> for PlanFields {
    fn from(p: PlanGeometry) -> Self {
        PlanFields {
            first_pid: p.first_pid,
            min: p.min,
            max: p.max,
            size: p.size,
        }
    }
}

impl PlanGeometry {
    /// A plan over `min..=max` in partitions of `size` IDs, the first numbered `first_pid`.
    ///
    /// Fails when `max < min`, `size == 0`, or the last pid would exceed `u64::MAX`.
    pub fn new(first_pid: u64, min: u64, max: u64, size: u64) -> Result<Self, Error> {
        if max < min {
            return Err(Error::PlanInverted { min, max });
        }
        if size == 0 {
            return Err(Error::PlanZeroSize);
        }
        // The span may be 2^64 IDs (0..=u64::MAX), so count in u128.
        let span = u128::from(max - min) + 1;
        let partitions = span.div_ceil(u128::from(size));
        let last_pid = u128::from(first_pid) + partitions - 1;
        let last_pid = u64::try_from(last_pid).map_err(|_| Error::PlanOverflow)?;
        Ok(PlanGeometry {
            first_pid,
            min,
            max,
            size,
            last_pid,
        })
    }

    /// The pid of the first partition.
    pub const fn first_pid(&self) -> u64 {
        self.first_pid
    }

    /// The pid of the last partition.
    pub const fn last_pid(&self) -> u64 {
        self.last_pid
    }

    /// The first ID of the plan.
    pub const fn min(&self) -> u64 {
        self.min
    }

    /// The last ID of the plan (inclusive).
    pub const fn max(&self) -> u64 {
        self.max
    }

    /// IDs per partition (the last one may hold fewer).
    pub const fn size(&self) -> u64 {
        self.size
    }

    /// How many partitions the plan has (at least one). Saturates at `u64::MAX` for
    /// the one plan with 2^64 partitions (every ID of `u64` its own partition).
    pub const fn partitions(&self) -> u64 {
        (self.last_pid - self.first_pid).saturating_add(1)
    }

    /// The pids of the plan.
    pub fn pids(&self) -> RangeInclusive<u64> {
        self.first_pid..=self.last_pid
    }

    /// Whether `pid` belongs to the plan.
    pub const fn contains_pid(&self, pid: u64) -> bool {
        self.first_pid <= pid && pid <= self.last_pid
    }

    /// The IDs partition `pid` covers, or `None` if the plan has no such pid.
    pub fn range_of(&self, pid: u64) -> Option<RangeInclusive<u64>> {
        if !self.contains_pid(pid) {
            return None;
        }
        // In range by construction: offset * size < span <= 2^64, and min + that <= max.
        let lo = self.min + (pid - self.first_pid) * self.size;
        let hi = lo.saturating_add(self.size - 1).min(self.max);
        Some(lo..=hi)
    }

    /// The pid of the partition that covers row ID `id`, or `None` outside the plan.
    pub const fn pid_of(&self, id: u64) -> Option<u64> {
        if id < self.min || id > self.max {
            return None;
        }
        Some(self.first_pid + (id - self.min) / self.size)
    }
}

/// One entry of a namespace's plan registry: a run of consecutive pids and the row IDs
/// they cover. An explicit range is an entry of one partition as wide as the range.
///
/// The active store keeps the registry; an export carries it, so an import plans the
/// same pids again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlanEntry {
    /// The geometry: pids, IDs and partition size.
    pub plan: PlanGeometry,
    /// True for an explicit range (materialised at once); false for a uniform plan
    /// (issued lazily from per-shard cursors).
    pub explicit: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_numbering() {
        let plan = PlanGeometry::new(1, 1, 5_000_000_000, 1000).expect("valid plan");
        assert_eq!(plan.range_of(4970), Some(4_969_001..=4_970_000));
        assert_eq!(plan.pid_of(4_969_001), Some(4970));
        assert_eq!(plan.pid_of(4_970_000), Some(4970));
        assert_eq!(plan.pid_of(4_970_001), Some(4971));
        assert_eq!(plan.partitions(), 5_000_000);
        assert_eq!(plan.range_of(0), None);
        assert_eq!(plan.range_of(5_000_001), None);
        assert_eq!(plan.pid_of(0), None);
    }

    #[test]
    fn short_last_partition() {
        let plan = PlanGeometry::new(0, 10, 2_504, 1000).expect("valid plan");
        assert_eq!(plan.pids(), 0..=2);
        assert_eq!(plan.range_of(2), Some(2_010..=2_504));
    }

    #[test]
    fn whole_u64_space() {
        let plan = PlanGeometry::new(0, 0, u64::MAX, 1 << 32).expect("valid plan");
        assert_eq!(plan.last_pid(), (1 << 32) - 1);
        assert_eq!(
            plan.range_of(plan.last_pid()),
            Some(u64::MAX - ((1 << 32) - 1)..=u64::MAX)
        );
        assert_eq!(plan.pid_of(u64::MAX), Some(plan.last_pid()));
        let one_per_id = PlanGeometry::new(0, 0, u64::MAX, 1).expect("valid plan");
        assert_eq!(one_per_id.partitions(), u64::MAX);
    }

    #[test]
    fn invalid_plans() {
        assert!(matches!(
            PlanGeometry::new(1, 10, 9, 1),
            Err(Error::PlanInverted { min: 10, max: 9 })
        ));
        assert!(matches!(
            PlanGeometry::new(1, 1, 9, 0),
            Err(Error::PlanZeroSize)
        ));
        assert!(matches!(
            PlanGeometry::new(1, 0, u64::MAX, 1),
            Err(Error::PlanOverflow)
        ));
        assert!(matches!(
            PlanGeometry::new(u64::MAX, 0, 1, 1),
            Err(Error::PlanOverflow)
        ));
    }

    #[test]
    fn serde_validates() {
        let json = r#"{"first_pid":1,"min":1,"max":1000000,"size":1000}"#;
        let plan: PlanGeometry = serde_json::from_str(json).expect("valid plan");
        assert_eq!(serde_json::to_string(&plan).ok().as_deref(), Some(json));
        let bad = r#"{"first_pid":1,"min":1,"max":10,"size":0}"#;
        assert!(serde_json::from_str::<PlanGeometry>(bad).is_err());
    }
}
