//! [`Plan`]: which row IDs a job covers, and how they are cut into partitions.

use std::ops::RangeInclusive;

/// The row IDs of a job and the size of its partitions, for
/// [`Runner::plan`](crate::Runner::plan):
///
/// ```
/// use tranche_worker::Plan;
///
/// let plan = Plan::ids(1..=200_000).partition_size(1_000);
/// assert_eq!(plan.partitions(), 200);
/// ```
///
/// A partition is what a worker claims, holds under a lease and completes as one; it
/// is processed in chunks ([`Runner::chunk`](crate::Runner::chunk)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    ids: RangeInclusive<u64>,
    size: u64,
}

impl Plan {
    /// The default partition size, in row IDs: the same as `tranche plan --size`'s.
    /// With the default [chunk](crate::Runner::chunk) of 100 a partition is ten
    /// chunks, so a lost lease redoes at most 1,000 IDs and a split has pieces to cut.
    pub const DEFAULT_PARTITION_SIZE: u64 = crate::defaults::RunDefaults::RUN.partition_size;

    /// Every row ID of `ids`, in partitions of
    /// [`DEFAULT_PARTITION_SIZE`](Self::DEFAULT_PARTITION_SIZE) IDs until
    /// [`partition_size`](Self::partition_size) says otherwise.
    pub fn ids(ids: RangeInclusive<u64>) -> Self {
        Self {
            ids,
            size: Self::DEFAULT_PARTITION_SIZE,
        }
    }

    /// Row IDs per partition (the last one may hold fewer).
    pub fn partition_size(mut self, ids: u64) -> Self {
        self.size = ids;
        self
    }

    /// How many partitions the plan makes (0 for an empty or invalid plan).
    pub fn partitions(&self) -> u64 {
        if self.ids.is_empty() || self.size == 0 {
            return 0;
        }
        let n = (*self.ids.end() - *self.ids.start()) as u128 + 1;
        n.div_ceil(self.size as u128) as u64
    }

    pub(crate) fn to_store(&self) -> tranche_active_store::Plan {
        tranche_active_store::Plan::Uniform {
            min: *self.ids.start(),
            max: *self.ids.end(),
            size: self.size,
        }
    }
}
