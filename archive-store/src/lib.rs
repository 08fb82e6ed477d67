//! The archive layer of tranche: completed partitions, drained from the active store's
//! inboxes into tiers, for ever queryable.
//!
//! [`Archiver`] drains; [`ArchiveQuery`] reads ([`Lookup`] says what is known of a
//! pid). [`RedisArchive`] is the real implementation and [`MemoryArchive`] the embedded
//! one; one behaviour suite runs against both. [`run`] is the archiver loop.
//!
//! The design choice a reader might get wrong: **the archive keeps its own bitmap of
//! archived pids** (`{ns:s}:archived`), distinct from the active store's completed index.
//! The index says "completed"; the archived bit says "stored and counted". Every archive
//! batch is one Lua script that checks the archived bits first and writes nothing if any
//! is set, so the caller can drop those records and recompute the statistics delta:
//! a record delivered twice (a retried completion, an archiver that died before
//! acknowledging its entries and was taken over) is stored and counted exactly once.
//! A set index bit with a clear archived bit answers [`Lookup::Archiving`].

mod dump;
mod error;
mod memory;
mod model;
mod redis_store;
mod store;

pub use dump::{Dump, DumpBatch};
pub use error::{Error, Result};
pub use memory::MemoryArchive;
pub use model::{ArchivePass, Config, Lookup, RangePage, Tier};
pub use redis_store::{RedisArchive, scripts};
pub use store::{ArchiveQuery, Archiver, Compaction, Export, Import, run};
