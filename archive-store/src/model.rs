//! Settings and the values the archive answers with.

use std::time::Duration;

use tranche_codec::{CompletedRecord, KeyLayout, KeySchema};

use crate::{Error, Result};

/// How the archive is set up. The same settings serve both backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The namespace all keys live under (`elk` in the seed).
    pub namespace: String,
    /// Shards, 1..=1024; must match the active store's.
    pub num_shards: u32,
    /// How the shards' keys are named; must match the active store's (the layout
    /// `{ns}:meta` records for the namespace).
    pub layout: KeyLayout,
    /// Inbox entries read per shard and pass at most (the seed's "every 100 updates";
    /// an entry is one group commit, often many records).
    pub batch: usize,
    /// How often [`run`](crate::run) sweeps every shard (the seed's "or every 30 s"),
    /// taking over a dead archiver's entries (XAUTOCLAIM) on the way. Between sweeps it
    /// visits only the shards completing clients marked dirty (`{ns}:dirty`), so an
    /// idle archiver costs one small read per poll whatever the shard count; the sweep
    /// finds what a lost mark left behind. It polls rather than blocking in `XREADGROUP
    /// BLOCK`: a blocked connection serves nobody else, and one blocking read cannot span
    /// the shards' inboxes (they lie in different cluster slots).
    pub block: Duration,
    /// The least time between two woken reads of one shard's inbox (a shard whose last
    /// read came back full is read again at once). Every archive call costs a fixed
    /// statistics update whatever it carries, so a shard's records are gathered into
    /// fewer, larger calls, and that cost stays flat in the shard count.
    pub gather: Duration,
    /// Archived count from which new records go to the compressed tier.
    pub compressed_at: u64,
    /// Archived count from which new records go to the summary tier.
    pub summary_at: u64,
    /// How long sealed batches of the summary tier live.
    pub summary_ttl: Duration,
    /// How long an inbox entry must sit unacknowledged with another archiver before
    /// this one's sweeps take it over (XAUTOCLAIM): longer than any sane pass, so a
    /// live archiver does not lose its entries to a colleague while a job runs. The
    /// drain at a job's end takes over sooner
    /// ([`Archiver::archive_taking_over`](crate::Archiver::archive_taking_over)).
    pub claim_idle: Duration,
    /// The lowest pid any plan issues (the seed numbers from 1): a batch counts as full,
    /// and is sealed, once it holds every pid of its range from here on.
    pub first_pid: u64,
    /// This archiver's consumer name in the `archivers` group; unique per process.
    pub consumer: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: "elk".to_owned(),
            num_shards: 1,
            layout: KeyLayout::default(),
            batch: 100,
            block: Duration::from_secs(30),
            gather: Duration::from_millis(250),
            compressed_at: 100_000,
            summary_at: 500_000,
            summary_ttl: Duration::from_secs(24 * 3600),
            claim_idle: Duration::from_secs(60),
            first_pid: 1,
            consumer: format!("archiver-{}", std::process::id()),
        }
    }
}

impl Config {
    /// Checks the settings and returns the key schema they imply.
    pub fn schema(&self) -> Result<KeySchema> {
        if self.batch == 0 {
            return Err(Error::InvalidArgument("batch must be at least 1".into()));
        }
        if self.summary_at < self.compressed_at {
            return Err(Error::InvalidArgument(format!(
                "summary_at {} is below compressed_at {}",
                self.summary_at, self.compressed_at
            )));
        }
        if self.consumer.is_empty() {
            return Err(Error::InvalidArgument("empty consumer name".into()));
        }
        Ok(KeySchema::new(&self.namespace, self.num_shards)?.with_layout(self.layout))
    }

    /// How many pids batch `batch` of `batch_size` can hold: those from `first_pid` on.
    pub fn planned(&self, batch: u64, batch_size: u64) -> u64 {
        let start = batch.saturating_mul(batch_size);
        let end = start.saturating_add(batch_size);
        end.saturating_sub(start.max(self.first_pid))
    }

    /// How many records the archive holds when new records next change tier, once
    /// `archived` are in it; `None` past the last threshold.
    pub fn next_tier_at(&self, archived: u64) -> Option<u64> {
        [self.compressed_at, self.summary_at]
            .into_iter()
            .find(|&at| archived < at)
    }

    /// The tier new records go to once `archived` records are in the archive.
    pub fn tier_for(&self, archived: u64) -> Tier {
        if archived >= self.summary_at {
            Tier::Summary
        } else if archived >= self.compressed_at {
            Tier::Compressed
        } else {
            Tier::Simple
        }
    }
}

/// Where a record is kept: the tier new records go to ([`Config::tier_for`]), and the
/// tier a [`Lookup::Archived`] or a dump's batch reports, which is where the record is
/// stored now. A batch still filling (open, not sealed) answers [`Tier::Compressed`]
/// in the compressed and the summary tier alike: it has no expiry yet. It answers
/// [`Tier::Summary`] from when it is sealed under the summary tier (and so expires).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[non_exhaustive]
pub enum Tier {
    /// The shard's hash of the seed's JSON, pid -> record.
    Simple,
    /// Batches of 100: open hashes while they fill, sealed binary v2 strings once full,
    /// joined ten at a time into segment strings once their neighbours are full too.
    Compressed,
    /// As compressed, but sealed batches expire; the statistics layer answers after.
    /// Only sealed batches report it: an open batch does not expire.
    Summary,
}

impl Tier {
    /// `simple`, `compressed` or `summary`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Simple => "simple",
            Tier::Compressed => "compressed",
            Tier::Summary => "summary",
        }
    }
}

/// How a namespace's archive writes what readers of several versions share: the
/// namespace format version, in `{ns}:meta` field `archive_format` (absent: `V1`).
///
/// Every reader decodes every format; a writer writes the highest format it knows up to
/// the namespace's, so the version is raised only when asked (a new namespace, or an
/// explicit upgrade once no binary older than the format raised to reads the
/// namespace), never lowered by a writer, and what was written before stays as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[non_exhaustive]
pub enum ArchiveFormat {
    /// Segments hold each batch's binary v2 bytes whole (segment layout 1): what every
    /// version reads.
    #[default]
    V1,
    /// Segments hold each batch without the header fields the segment implies
    /// (segment layout 2: magic, version, batch id, batch size and payload length),
    /// restored byte for byte on reading, checksum included: about 11 bytes less per
    /// batch of 100. Batches are sealed with their workers column as ranks where that
    /// is smaller (binary v2 flag bit 2): about 20 bytes less per batch of seed-shaped
    /// work. Binaries before this format read neither. Exports stay in format 1's
    /// encoding (a dump re-encodes its batches).
    V2,
    /// Format 2, and the statistics' per-range values that an archive write touches are
    /// written as packed bodies (`tranche-stats`' `apply_delta.lua`, flag 16: each
    /// range's per-worker counts and durations bit-packed, a whole range's bounds and
    /// its IDs per partition left out), so that a block of 64 ranges fits a smaller
    /// allocation. Binaries before this format read the ranges as damaged. Untouched
    /// ranges keep their bytes; repairs write the compact form every version reads.
    V3,
}

impl ArchiveFormat {
    /// The highest format this version writes.
    pub const LATEST: ArchiveFormat = ArchiveFormat::V3;

    /// Its number in `{ns}:meta` (1, 2, 3).
    pub const fn number(self) -> u8 {
        match self {
            ArchiveFormat::V1 => 1,
            ArchiveFormat::V2 => 2,
            ArchiveFormat::V3 => 3,
        }
    }

    /// The format a recorded number asks writers for: a number above what this version
    /// knows (a later binary raised it) writes the latest this one knows, which every
    /// later reader reads too. `None` for 0.
    pub const fn from_number(n: u64) -> Option<ArchiveFormat> {
        match n {
            0 => None,
            1 => Some(ArchiveFormat::V1),
            2 => Some(ArchiveFormat::V2),
            _ => Some(ArchiveFormat::V3),
        }
    }
}

/// What the archive says about one pid.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lookup {
    /// The record, decoded, and the tier it was found in.
    Archived {
        /// The record, exactly as completed.
        record: CompletedRecord,
        /// Where it was found.
        tier: Tier,
    },
    /// Completed (the active store set its index bit) but not archived yet: "completed,
    /// archiving", never "unknown".
    Archiving,
    /// Archived, but its batch expired (summary tier): ask the statistics layer.
    Expired,
    /// Archived, but its batch does not decode; the failure was counted. Ask the
    /// statistics layer.
    Undecodable {
        /// What was wrong.
        detail: String,
    },
    /// The archive knows nothing of this pid.
    Unknown,
}

/// What one archiver pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchivePass {
    /// Inbox entries read (each may carry several records).
    pub entries: usize,
    /// Records written to the archive (and counted) by this pass.
    pub archived: usize,
    /// Records dropped because they were archived already.
    pub duplicates: usize,
    /// Inbox entries taken over from a dead archiver.
    pub claimed: usize,
    /// Inbox lines that did not decode; acknowledged and dropped, and logged.
    pub malformed: usize,
    /// Records that can never be archived (the archive script refuses them alone, or
    /// their bit offset is past a Redis bitmap): moved to the shard's dead-letter stream
    /// `{ns:s}:dead` with the reason, acknowledged, logged.
    pub dead_lettered: usize,
    /// Inbox entries (records, in memory) of stalled shards, left unacknowledged for a
    /// later pass: a shard whose archive call is refused for its own state (its
    /// statistics damaged, ...) stalls alone, and the other shards go on. Not counted
    /// in [`entries`](Self::entries), so a pass that did nothing else has `entries ==
    /// 0`; [`ArchiveQuery::stalled`](crate::ArchiveQuery::stalled) says which shards
    /// and why.
    pub stalled: usize,
}

impl ArchivePass {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: ArchivePass) {
        self.entries += other.entries;
        self.archived += other.archived;
        self.duplicates += other.duplicates;
        self.claimed += other.claimed;
        self.malformed += other.malformed;
        self.dead_lettered += other.dead_lettered;
        self.stalled += other.stalled;
    }
}

/// A shard whose archiving is stalled: its archive calls are refused for the shard's
/// own state, so its records stay in the inbox until it is repaired. Kept on Redis in
/// the hash `{ns}:archive:stalled` (shard -> `since_ms reason`, one read for every
/// shard), set by the pass that first meets the refusal and cleared by the first
/// pass that archives the shard again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stall {
    /// The shard.
    pub shard: u32,
    /// When a pass first found it stalled, in ms since the Unix epoch.
    pub since_ms: u64,
    /// Why, as the refusal said it; starts with [`STATS_DAMAGED`] when the shard's
    /// statistics are damaged (`check --repair` rebuilds them).
    pub reason: String,
}

/// The start of a [`Stall::reason`] whose cause is damaged statistics.
pub const STATS_DAMAGED: &str = "statistics damaged";

impl Stall {
    /// Whether the shard is stalled on damaged statistics.
    pub fn stats_damaged(&self) -> bool {
        self.reason.starts_with(STATS_DAMAGED)
    }
}

/// The reason a stall records for `err`: prefixed with [`STATS_DAMAGED`] when the
/// statistics refused for a stored value that does not decode (the statistics
/// layer's Lua says `corrupt` or `not an integer`; in memory its `Corrupt` error).
pub(crate) fn stall_reason(err: &Error) -> String {
    let text = err.to_string();
    let damaged = matches!(err, Error::Stats(tranche_stats::Error::Corrupt { .. }))
        || (text.contains("stats:")
            && (text.contains("corrupt") || text.contains("not an integer")));
    if damaged {
        format!("{STATS_DAMAGED}: {text}")
    } else {
        text
    }
}

/// What a lookup of a pid whose archived value is damaged says (before and after the
/// repair sets it aside): [`Lookup::Undecodable`]'s detail starts with it.
pub const ARCHIVE_DAMAGED: &str = "archived record damaged";

/// An archived value that does not decode, as a read met it: one record of the simple
/// tier or of an open batch (a hash field), a sealed batch string, or a batch's slot
/// of a segment. Its records' statistics were counted when they were archived and
/// stay counted; `tranche check --repair` sets the value aside
/// ([`Archiver::repair_damage`](crate::Archiver::repair_damage)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArchiveDamage {
    /// The shard it belongs to.
    pub shard: u32,
    /// The key holding it.
    pub key: String,
    /// The hash field (a pid) for one record; none for a whole string.
    pub field: Option<String>,
    /// The batch it belongs to.
    pub batch: u64,
    /// What is wrong with it.
    pub detail: String,
}

impl ArchiveDamage {
    /// The key, and the field if any: `key` or `key field`.
    pub fn location(&self) -> String {
        match &self.field {
            Some(f) => format!("{} {f}", self.key),
            None => self.key.clone(),
        }
    }
}

impl std::fmt::Display for ArchiveDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {} {}{}: {}",
            self.shard,
            self.key,
            self.field
                .as_ref()
                .map(|p| format!(" field {p:?}"))
                .unwrap_or_default(),
            self.detail
        )
    }
}

/// A record that can never be archived, as its shard's dead-letter stream keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    /// The shard whose inbox it came from.
    pub shard: u32,
    /// Its entry in the dead-letter stream (`{ns:s}:dead`), in time order.
    pub id: String,
    /// The inbox line as it arrived (the seed's JSON).
    pub record: String,
    /// Why the archive refused it.
    pub reason: String,
}

/// What re-driving the dead letters did (`tranche check --repair`): each one is
/// validated again and archived through the ordinary archive path, dropped as a
/// duplicate, or kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Redrive {
    /// Dead letters read.
    pub found: usize,
    /// Archived (and counted) now, once, and taken off the dead-letter stream.
    pub archived: usize,
    /// Taken off the stream without a write: their pid is archived already (or came
    /// twice in the stream).
    pub duplicates: usize,
    /// Still not archivable, left in the stream; `reason` says why now.
    pub kept: Vec<DeadLetter>,
}

/// One page of a range scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePage {
    /// The archived records found, in pid order.
    pub records: Vec<CompletedRecord>,
    /// Where the next page starts, or `None` when the range is done.
    pub next: Option<u64>,
    /// Archived values in the page's batches that do not decode (their records are
    /// left out of `records`), each once.
    pub damaged: Vec<ArchiveDamage>,
}
