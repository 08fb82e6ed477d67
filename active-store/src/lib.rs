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
//!
//! Plan, claim, complete, on the embedded backend (the Redis one takes a
//! [`RedisConnection`] instead and behaves the same):
//!
//! ```
//! use tranche_active_store::{
//!     ActiveQuery, Config, Leases, MemoryActiveStore, Plan, Planner,
//! };
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryActiveStore::new(Config { num_shards: 1, ..Config::default() })?;
//! // Three partitions of 1000 IDs; nothing is materialised yet.
//! store.plan(&Plan::Uniform { min: 1, max: 3000, size: 1000 }).await?;
//! assert_eq!(store.counts().await?.unissued, 3);
//!
//! let leases = store.claim("worker-1", 2).await?;
//! assert_eq!((leases[0].min_id, leases[0].max_id), (1, 1000));
//! for lease in &leases {
//!     // ... process lease.min_id..=lease.max_id, then:
//!     store.complete(lease, 250).await?;
//! }
//! // Completed partitions left the active set for the archive's inbox.
//! let counts = store.counts().await?;
//! assert_eq!((counts.unissued, counts.claimed, counts.outstanding()), (1, 0, 1));
//! assert_eq!(store.inbox(0).unwrap().len(), 2);
//! # Ok::<(), tranche_active_store::Error>(())
//! # }).unwrap();
//! ```

mod clock;
mod error;
mod layout;
mod memory;
mod model;
mod plans;
mod redis_store;
mod split;
mod state;
mod store;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use error::{Error, Result};
pub use layout::CLAIM_TURN_MS;
pub use memory::MemoryActiveStore;
pub use model::{
    ActiveSnapshot, Carried, Completion, Config, CorruptRecord, FailOutcome, FailPolicy, Lease,
    Plan, PlanEntry, PlanOutcome, Repair, StatusCounts, Unissued, WorkerInfo, WorkerState,
};
/// The RESP reply reader's fuzz entry (`active-store/fuzz`); not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use redis_store::fuzz_replies;
#[cfg(feature = "testing")]
pub use redis_store::scripts;
pub use redis_store::{KeysMeta, RedisActiveStore, RedisConnection, TlsOptions};
pub use split::{Beat, Part, PartBeat, Piece, PieceDone, Running, SplitAnswer, Splits};
pub use state::{ACTIVE_STATE_VERSION, ActiveState, RestoredLeases};
pub use store::{ActiveQuery, ActiveStore, Leases, Maintenance, Planner, WorkerRegistry};
