//! The tranche partition record, its reversible encodings, and the Redis key schema.
//!
//! A [`Partition`] is one range of row IDs and the state of the work on it; when it
//! completes, the archive keeps a [`CompletedRecord`] in one of three encodings:
//!
//! - [`encode_json`] / [`decode_json`]: the seed's simple-archive JSON, one record;
//! - [`encode_text_v1`] / [`decode_text_v1`]: the seed's `P4970:4969001-4970000:w1:…`
//!   text, comma-joined per batch;
//! - [`encode_binary_v2`] / [`decode_binary_v2`]: a sealed batch as adaptive columns
//!   with a checksum, about 1.5 bytes per seed-shaped record.
//!
//! [`PlanGeometry`] is the arithmetic between pids and row IDs (a [`PlanEntry`] one entry
//! of a namespace's plan registry), and [`KeySchema`] names every Redis key so that one
//! shard's keys share one cluster slot ([`key_slot`]). [`Clock`] is the source of "now"
//! every store takes; the `retry` feature adds the module `retry`, the stores' one
//! retry policy for Redis calls. The module [`state`] holds the rules the memory stores'
//! saved states share (the version check, pid sets as runs). The module [`lua`] holds
//! `common.lua`, the prelude of every Lua script of the stores, and `compose`, the one
//! way their scripts are put together with the Rust constants they read.
//!
//! **The design choice to keep in mind:** the short worker codes look derivable
//! (`worker1` is `w1`) but are not. Codes and binary indices are assigned by a
//! [`WorkerDict`] in insertion order and only ever looked up, so every text and binary
//! decode takes the dictionary the data was written with. Store the dictionary next to
//! the data (`{ns}:dict`, every export); an archive is unreadable without it, whatever
//! the workers are called. JSON carries full worker ids and needs no dictionary.
//!
//! ```
//! use tranche_codec::{BinaryV2Options, WorkerDict, decode_binary_v2, decode_text_v1, encode_binary_v2, encode_json};
//!
//! let mut dict = WorkerDict::new();
//! dict.insert("worker1")?;
//! dict.insert("worker2")?;
//! let text = "P4970:4969001-4970000:w1:1719234405:295,P4971:4970001-4971000:w2:1719234410:300";
//! let records = decode_text_v1(text, &dict)?;
//! assert_eq!(&*records[1].worker, "worker2");
//! assert_eq!(records[1].completed_at_ms, 1_719_234_410_000);
//! assert_eq!(
//!     encode_json(&records[0]),
//!     r#"{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}"#
//! );
//!
//! // Pids 4970 and 4971 belong to batch 49 of 100.
//! let sealed = encode_binary_v2(49, &records, &dict, &BinaryV2Options::default())?;
//! assert_eq!(decode_binary_v2(&sealed, &dict)?.records, records);
//! # Ok::<(), tranche_codec::Error>(())
//! ```
//!
//! Times are `u64` milliseconds since the Unix epoch and durations `u64` milliseconds,
//! everywhere; the seed's formats print seconds and grow up to three decimals only
//! when a time has a millisecond part, so no encoding loses precision. Nothing here
//! does I/O (the `retry` feature only sleeps between its caller's attempts), and no
//! decoder panics on any input.

mod binary_v2;
mod clock;
mod dict;
mod error;
mod json;
mod keys;
pub mod lua;
mod plan;
mod record;
#[cfg(feature = "retry")]
pub mod retry;
mod seconds;
pub mod state;
mod text_v1;
mod wire;

pub use binary_v2::{
    BinaryV2Options, SealedBatch, decode_binary_v2, encode_binary_v2, restore_binary_v2_header,
    strip_binary_v2_header,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use dict::{WorkerDict, WorkerEntry};
pub use error::Error;
pub use json::{decode_json, encode_json};
pub use keys::{DEFAULT_BATCH_SIZE, KeyLayout, KeySchema, MAX_BATCH_SIZE, MAX_SHARDS, key_slot};
pub use plan::{PlanEntry, PlanGeometry};
pub use record::{CompletedRecord, ParseStatusError, Partition, Status};
pub use text_v1::{decode_text_v1, encode_text_v1};
