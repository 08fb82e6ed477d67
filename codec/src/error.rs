//! The crate's one error type.

/// Everything that can go wrong in this crate.
///
/// Decoders return the most specific variant they can, so a caller (and the decode
/// failure metric) can tell a truncated value from a corrupted one from one written
/// with a dictionary it does not have.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- Plans and the key schema.
    /// A plan whose `max` lies below its `min`.
    #[error("plan max {max} is below its min {min}")]
    PlanInverted {
        /// The plan's first ID.
        min: u64,
        /// The plan's last ID.
        max: u64,
    },
    /// A plan with partitions of zero IDs.
    #[error("plan partition size must be at least 1")]
    PlanZeroSize,
    /// A plan whose pids would run past `u64::MAX`.
    #[error("plan pids would overflow u64")]
    PlanOverflow,
    /// A namespace that is empty, too long, or holds a character outside `[A-Za-z0-9_.-]`.
    #[error("invalid namespace {0:?}: use 1 to 64 characters from [A-Za-z0-9_.-]")]
    InvalidNamespace(String),
    /// A shard count outside `1..=1024`.
    #[error("num_shards {0} is outside 1..=1024")]
    InvalidShardCount(u32),
    /// A batch size outside `1..=65536`.
    #[error("batch size {0} is outside 1..=65536")]
    InvalidBatchSize(u64),

    // ---- The worker dictionary.
    /// Encoding met a worker id the dictionary does not hold.
    #[error("worker {0:?} is not in the worker dictionary")]
    UnknownWorker(String),
    /// Text v1 decoding met a short code the dictionary does not hold.
    #[error("worker short code {0:?} is not in the worker dictionary")]
    UnknownWorkerCode(String),
    /// Binary v2 decoding met a dictionary index the dictionary does not hold.
    #[error("worker index {0} is not in the worker dictionary")]
    UnknownWorkerIndex(u64),
    /// A dictionary that names one worker id twice.
    #[error("worker id {0:?} appears twice in the dictionary")]
    DuplicateWorkerId(String),
    /// A dictionary that gives one short code to two workers.
    #[error("short code {0:?} appears twice in the dictionary")]
    DuplicateWorkerCode(String),
    /// A short code that is empty, longer than 32 bytes, or not `[a-z0-9_-]`.
    #[error("invalid short code {0:?}: use 1 to 32 characters from [a-z0-9_-]")]
    InvalidWorkerCode(String),
    /// The dictionary already holds `u32::MAX` workers.
    #[error("the worker dictionary is full")]
    DictFull,

    // ---- Sealing a batch.
    /// A record whose pid does not belong to the batch being sealed.
    #[error("pid {pid} does not belong to batch {batch_id} of size {batch_size}")]
    PidOutsideBatch {
        /// The record's pid.
        pid: u64,
        /// The batch being sealed.
        batch_id: u64,
        /// Pids per batch.
        batch_size: u64,
    },
    /// A batch id whose first pid would overflow `u64`.
    #[error("batch {batch_id} of size {batch_size} starts beyond u64::MAX")]
    BatchIdOutOfRange {
        /// The batch id.
        batch_id: u64,
        /// Pids per batch.
        batch_size: u64,
    },
    /// Two records with one pid in one batch: a sealed batch holds a pid once.
    #[error("pid {0} appears twice in one batch")]
    DuplicatePid(u64),

    // ---- JSON and text v1.
    /// Input that is not the seed's JSON record (syntax, a missing, unknown or repeated
    /// field, a wrong type).
    #[error("invalid JSON record: {0}")]
    Json(#[from] serde_json::Error),
    /// A time with more precision than a millisecond.
    #[error("{field} {text:?} is not a whole number of milliseconds")]
    InexactTime {
        /// `completed_at` or `duration`.
        field: &'static str,
        /// The offending text.
        text: String,
    },
    /// A time that is not a number, is negative, exceeds `u64::MAX` milliseconds, or (in
    /// text v1, which has one spelling per value) is not written canonically.
    #[error("{field} {text:?} is not a valid time in seconds")]
    InvalidTime {
        /// `completed_at` or `duration`.
        field: &'static str,
        /// The offending text.
        text: String,
    },
    /// Text v1 that does not follow `P{pid}:{min_id}-{max_id}:{worker}:{time}:{duration}`.
    #[error("text v1 record {record}: expected {expected}")]
    TextSyntax {
        /// Index of the record within the comma-joined batch.
        record: usize,
        /// What the decoder was looking for.
        expected: &'static str,
    },
    /// A text v1 integer with a sign, a leading zero, or a value beyond `u64::MAX`.
    #[error("text v1 record {record}: {field} {text:?} is not a canonical u64")]
    TextNumber {
        /// Index of the record within the comma-joined batch.
        record: usize,
        /// `pid`, `min_id` or `max_id`.
        field: &'static str,
        /// The offending text.
        text: String,
    },

    // ---- Binary forms (binary v2 and the dictionary's bytes).
    /// The input ends before the structure it declares.
    #[error("input is truncated")]
    Truncated,
    /// The input does not start with the expected magic bytes.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A format version this build cannot read.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u8),
    /// Header flag bits this build does not know.
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// The stored CRC32 does not match the bytes: the value was corrupted.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The CRC32 in the input.
        stored: u32,
        /// The CRC32 of the bytes it covers.
        computed: u32,
    },
    /// Bytes left over after the structure the input declares.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    /// A header count larger than its batch size.
    #[error("count {count} exceeds batch size {batch_size}")]
    CountExceedsBatch {
        /// The declared record count.
        count: u64,
        /// The declared batch size.
        batch_size: u64,
    },
    /// The records present disagree with the declared count.
    #[error("declared {declared} records, found {found}")]
    CountMismatch {
        /// The header's count.
        declared: u64,
        /// What the pid section holds.
        found: u64,
    },
    /// A varint with redundant high zero groups: every value has one encoding.
    #[error("overlong varint")]
    VarintOverlong,
    /// A varint beyond `u64::MAX`.
    #[error("varint overflows u64")]
    VarintOverflow,
    /// A bit-packed column claiming more than 64 bits per value.
    #[error("bit width {0} exceeds 64")]
    InvalidBitWidth(u8),
    /// The zstd payload would not decompress to its declared length.
    #[error("zstd payload does not decompress: {0}")]
    Decompress(String),
    /// A structurally valid input whose contents contradict each other (an unknown
    /// section mode, an index out of range, a value that overflows when rebuilt).
    #[error("corrupt {0}")]
    Corrupt(&'static str),
    /// A dictionary entry that is not UTF-8.
    #[error("worker id or code is not UTF-8")]
    NotUtf8,

    // ---- Saved states.
    /// A saved state of another version than this build reads ([`crate::state::check_version`]).
    #[error("version {found} (this build reads version {reads})")]
    StateVersion {
        /// The version the state was written with.
        found: u32,
        /// The version this build reads.
        reads: u32,
    },

    // ---- Records.
    /// Only a completed partition has an archived form.
    #[error("partition {pid} is {status}, not completed")]
    NotCompleted {
        /// The partition.
        pid: u64,
        /// Its status.
        status: crate::Status,
    },
    /// A completed partition lacking a field its archived form needs.
    #[error("completed partition {pid} has no {field}")]
    MissingField {
        /// The partition.
        pid: u64,
        /// `worker`, `completed_at_ms` or `duration_ms`.
        field: &'static str,
    },
}
