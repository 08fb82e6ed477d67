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
//! [`Plan`] is the arithmetic between pids and row IDs, and [`KeySchema`] names every
//! Redis key so that one shard's keys share one cluster slot ([`key_slot`]).
//!
//! **The design choice to keep in mind:** the short worker codes look derivable
//! (`worker1` is `w1`) but are not. Codes and binary indices are assigned by a
//! [`WorkerDict`] in insertion order and only ever looked up, so every text and binary
//! decode takes the dictionary the data was written with. Store the dictionary next to
//! the data (`{ns}:dict`, every export); an archive is unreadable without it, whatever
//! the workers are called. JSON carries full worker ids and needs no dictionary.
//!
//! Times are `u64` milliseconds since the Unix epoch and durations `u64` milliseconds,
//! everywhere; the seed's formats print seconds and grow up to three decimals only
//! when a time has a millisecond part, so no encoding loses precision. Nothing here
//! does I/O, and no decoder panics on any input.

mod binary_v2;
mod dict;
mod error;
mod json;
mod keys;
mod plan;
mod record;
mod seconds;
mod text_v1;
mod wire;

pub use binary_v2::{BinaryV2Options, SealedBatch, decode_binary_v2, encode_binary_v2};
pub use dict::{WorkerDict, WorkerEntry};
pub use error::Error;
pub use json::{decode_json, encode_json};
pub use keys::{DEFAULT_BATCH_SIZE, KeySchema, MAX_BATCH_SIZE, MAX_SHARDS, crc16_xmodem, key_slot};
pub use plan::Plan;
pub use record::{CompletedRecord, ParseStatusError, Partition, Status};
pub use text_v1::{decode_text_v1, encode_text_v1};
