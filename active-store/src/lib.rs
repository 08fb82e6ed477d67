//! The active layer of tranche: plans, claims, leases, checkpoints, retries and the
//! worker registry. [`ActiveStore`] is what the rest of the system holds, as
//! `Arc<dyn ActiveStore>`; [`RedisActiveStore`] is the real implementation and
//! [`MemoryActiveStore`] the embedded one, with the same behaviour (one test suite runs
//! against both).
//!
//! The design choice a reader might get wrong: **the active layer holds only unfinished
//! work.** A plan is a generator (bounds and per-shard cursors), so planning five billion
//! IDs writes a few hundred bytes; a partition is materialised only when it is claimed,
//! retried or released, and it leaves the active set in the same atomic step that marks
//! it completed and appends it to the shard's inbox for the archive layer. Memory stays
//! flat however much is done.
//!
//! Every lease carries a fencing token. A worker whose lease expired and was handed to
//! another gets [`Error::LeaseLost`] from every call, and changes nothing.

mod clock;
mod error;
mod layout;
mod memory;
mod model;
mod plans;
mod redis_store;
mod state;
mod store;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use error::{Error, Result};
pub use memory::MemoryActiveStore;
pub use model::{
    ActiveSnapshot, Carried, Completion, Config, FailOutcome, Lease, Plan, PlanEntry, PlanOutcome,
    StatusCounts, Unissued, WorkerInfo, WorkerState,
};
pub use redis_store::{RedisActiveStore, RedisConnection, TlsOptions, scripts};
pub use state::{ACTIVE_STATE_VERSION, ActiveState, RestoredLeases};
pub use store::{ActiveQuery, ActiveStore, Leases, Maintenance, Planner, WorkerRegistry};
