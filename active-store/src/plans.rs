//! Plan validation and the plan registry, shared by both backends (the Redis backend
//! keeps the registry in Redis and this copy as a cache for pid -> range lookups).

use crate::model::{Plan, PlanEntry, PlanOutcome};
use crate::{Error, Result};

/// A plan that passed validation, in the shape the registry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// A uniform plan and its partition count.
    Uniform {
        min: u64,
        max: u64,
        size: u64,
        count: u64,
    },
    /// Explicit ranges, sorted, each `(min, max)`.
    Ranges(Vec<(u64, u64)>),
}

/// Pids stay below 2^53 so that Lua, whose numbers are doubles, counts them exactly.
pub(crate) const MAX_PID: u64 = 1 << 53;

/// Checks a plan before anything is written.
pub(crate) fn validate(plan: &Plan) -> Result<Request> {
    match plan {
        &Plan::Uniform { min, max, size } => {
            // Plan::new checks max >= min, size > 0 and overflow; first pid 1 is the
            // worst case for the count.
            let geometry = tranche_codec::PlanGeometry::new(1, min, max, size)
                .map_err(|err| Error::InvalidPlan(err.to_string()))?;
            let count = geometry.partitions();
            if count >= MAX_PID {
                return Err(Error::InvalidPlan(format!(
                    "{count} partitions is too many; use a larger size"
                )));
            }
            Ok(Request::Uniform {
                min,
                max,
                size,
                count,
            })
        }
        Plan::Ranges(ranges) => {
            if ranges.is_empty() {
                return Err(Error::InvalidPlan("no ranges given".into()));
            }
            let mut sorted: Vec<(u64, u64)> =
                ranges.iter().map(|r| (*r.start(), *r.end())).collect();
            sorted.sort_unstable();
            for &(min, max) in &sorted {
                if max < min {
                    return Err(Error::InvalidPlan(format!("range {min}..={max} is empty")));
                }
                if min == 0 && max == u64::MAX {
                    return Err(Error::InvalidPlan("one range cannot span every u64".into()));
                }
            }
            for pair in sorted.windows(2) {
                if pair[1].0 <= pair[0].1 {
                    return Err(Error::InvalidPlan(format!(
                        "ranges {}..={} and {}..={} overlap",
                        pair[0].0, pair[0].1, pair[1].0, pair[1].1
                    )));
                }
            }
            Ok(Request::Ranges(sorted))
        }
    }
}

/// Worker ids go into `|`-separated records; they must be non-empty and free of `|`.
pub(crate) fn check_worker(worker: &str) -> Result<()> {
    if worker.is_empty() || worker.contains('|') || worker.len() > 256 {
        return Err(Error::InvalidArgument(format!(
            "worker id {worker:?} must be 1 to 256 bytes without '|'"
        )));
    }
    Ok(())
}

/// The registry of a namespace's plans, by first pid.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    entries: Vec<PlanEntry>,
}

impl Registry {
    pub(crate) fn from_entries(mut entries: Vec<PlanEntry>) -> Self {
        entries.sort_by_key(|e| e.plan.first_pid());
        Self { entries }
    }

    pub(crate) fn entries(&self) -> &[PlanEntry] {
        &self.entries
    }

    /// The entry holding `pid`.
    pub(crate) fn entry_of(&self, pid: u64) -> Option<&PlanEntry> {
        let i = self.entries.partition_point(|e| e.plan.first_pid() <= pid);
        self.entries[..i]
            .last()
            .filter(|e| e.plan.contains_pid(pid))
    }

    /// The row IDs `pid` covers.
    pub(crate) fn range_of(&self, pid: u64) -> Option<(u64, u64)> {
        let range = self.entry_of(pid)?.plan.range_of(pid)?;
        Some((*range.start(), *range.end()))
    }

    /// Adds a validated request: the same rules as `lua/plan.lua`, which is the
    /// authority on Redis. Either everything is added or nothing.
    pub(crate) fn add(&mut self, request: &Request) -> Result<PlanOutcome> {
        let mut next_pid = self
            .entries
            .iter()
            .map(|e| e.plan.last_pid() + 1)
            .max()
            .unwrap_or(1);
        let mut out = Vec::new();
        let mut new = Vec::new();
        let wanted: Vec<(bool, u64, u64, u64, u64)> = match request {
            &Request::Uniform {
                min,
                max,
                size,
                count,
            } => vec![(false, min, max, size, count)],
            Request::Ranges(ranges) => ranges
                .iter()
                .map(|&(min, max)| (true, min, max, max - min + 1, 1))
                .collect(),
        };
        for (explicit, min, max, size, count) in wanted {
            match self.find(explicit, min, max, size)? {
                Some(existing) => out.push(existing),
                None => {
                    let plan = tranche_codec::PlanGeometry::new(next_pid, min, max, size)
                        .map_err(|err| Error::InvalidPlan(err.to_string()))?;
                    debug_assert_eq!(plan.partitions(), count);
                    next_pid += count;
                    let entry = PlanEntry { plan, explicit };
                    new.push(entry);
                    out.push(entry);
                }
            }
        }
        let created = !new.is_empty();
        self.entries.extend(new);
        self.entries.sort_by_key(|e| e.plan.first_pid());
        Ok(PlanOutcome {
            entries: out,
            created,
        })
    }

    fn find(&self, explicit: bool, min: u64, max: u64, size: u64) -> Result<Option<PlanEntry>> {
        for e in &self.entries {
            let p = &e.plan;
            if e.explicit == explicit && (p.min(), p.max(), p.size()) == (min, max, size) {
                return Ok(Some(*e));
            }
            if !(max < p.min() || p.max() < min) {
                return Err(Error::InvalidPlan(format!(
                    "ids {min}..={max} overlap the existing plan {}..={}",
                    p.min(),
                    p.max()
                )));
            }
        }
        Ok(None)
    }
}

/// Refuses `entries` (what a plan would add) when a pid of theirs would have a
/// completed-index bit past what a Redis bitmap holds (2^32 bits per shard): such a
/// partition could be claimed but never completed. The bound is taken at the end of
/// the last pid's batch, the highest offset any pid up to it can have.
pub(crate) fn check_bits(schema: &tranche_codec::KeySchema, entries: &[PlanEntry]) -> Result<()> {
    const MAX_BIT: u64 = tranche_codec::lua::BITMAP_BITS - 1;
    for e in entries {
        let last = e.plan.last_pid();
        let size = schema.batch_size();
        let bound = schema.bit_offset(last) - last % size + (size - 1);
        if bound > MAX_BIT {
            return Err(Error::InvalidPlan(format!(
                "ids {}..={} in partitions of {} need {} partitions; with {} shard(s) a \
                 shard's completed index would pass the 2^32 bits of a Redis bitmap: \
                 use more shards or bigger partitions",
                e.plan.min(),
                e.plan.max(),
                e.plan.size(),
                e.plan.partitions(),
                schema.num_shards()
            )));
        }
    }
    Ok(())
}

/// Checks an adoption ([`Planner::adopt`](crate::Planner::adopt)) before anything is
/// written: the entries run from pid 1 without a gap (what a registry always holds, so
/// registering them in order gives each the pids it had), and `completed` is strictly
/// increasing and inside them. Returns how many pids will be pending.
pub(crate) fn validate_adoption(entries: &[PlanEntry], completed: &[u64]) -> Result<u64> {
    let mut next = 1;
    for e in entries {
        if e.plan.first_pid() != next {
            return Err(Error::InvalidPlan(format!(
                "exported plans must run from pid 1 without a gap; pid {next} is missing \
                 before the plan {}..={}",
                e.plan.min(),
                e.plan.max()
            )));
        }
        if e.explicit && e.plan.partitions() != 1 {
            return Err(Error::InvalidPlan(format!(
                "an explicit range is one partition, not {}",
                e.plan.partitions()
            )));
        }
        validate(&Plan::from(e))?;
        next = e.plan.last_pid() + 1;
    }
    if let Some(w) = completed.windows(2).find(|w| w[0] >= w[1]) {
        return Err(Error::InvalidArgument(format!(
            "completed pids must be strictly increasing ({} then {})",
            w[0], w[1]
        )));
    }
    if let Some(&pid) = completed.iter().find(|&&p| p == 0 || p >= next) {
        return Err(Error::InvalidArgument(format!(
            "completed pid {pid} is in no plan"
        )));
    }
    Ok(next - 1 - completed.len() as u64)
}
