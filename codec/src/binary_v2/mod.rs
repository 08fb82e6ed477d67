//! Binary v2: a sealed batch of completed records as adaptive columns.
//!
//! ```text
//! header   magic "TRCB" | version 2 | flags (u8) | batch_id | batch_size | count
//!          | [raw_len, if zstd] | payload_len                       (varints after flags)
//! payload  pids | ranges | workers | durations | chained starts | first starts
//! trailer  CRC32 (LE) of every byte before it
//! ```
//!
//! Flags: bit 0 the payload is zstd-compressed, bit 1 every time and duration is a
//! whole second and the payload stores seconds, bit 2 the workers column holds ranks
//! (below). Records are stored in pid order. Bit 2 is written only when
//! [`BinaryV2Options::with_ranks`] asks for it: decoders before it refuse the flag.
//!
//! - **pids**: mode byte. 0: the batch is full, every pid is implied by its position.
//!   1: a presence bitmap of `batch_size` bits. 2: a column of gaps between offsets.
//! - **ranges**: mode byte. 0: a model `min = a + offset * (span + 1)`,
//!   `max = min + span` (varints `a`, `span`) and a list of exceptions (index gap,
//!   zigzag min and span deltas). 1: two columns, the zigzag gap from the previous
//!   range's end and the span.
//! - **workers**: the batch's palette of dictionary indices (count, first, gaps), then a
//!   column of palette positions.
//!
//! Flag bit 2 (palettes of at most 16) changes two sections. **ranges**: the model
//! writes `span`, then `a` as the zigzag difference from the seed plan's
//! `(first_pid - 1) * (span + 1) + 1`. **workers**: the palette lists the dictionary
//! indices in the order the workers first appear in the batch (count, then each
//! index), and the column holds ranks: a worker takes the next partition when it
//! finishes its last, so the candidates for a record are the next palette entry not
//! seen yet (while there is one), then the workers seen so far by their last completion
//! time (ties by position), and a record's rank is its worker's place in that order:
//! mostly 0.
//! - **durations**: a column.
//! - **starts** (`completed_at - duration`): a worker completes partitions in turn, so a
//!   partition's start is predicted by its worker's previous completion in the batch; the
//!   zigzag residuals form one column. The first partition of each worker in the batch is
//!   predicted by the previous record's start, in a second column.
//!
//! A column is an adaptive frame-of-reference block with patched exceptions (see
//! `wire::put_column`): seed-shaped data (eight workers in turn, whole seconds,
//! durations of 200-400 s, uniform ranges) costs about 11 bits a record.

use std::sync::Arc;

use crate::keys::{DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE};
use crate::wire::{Reader, add_zigzag, get_column, put_column, put_varint, zigzag_diff};
use crate::{CompletedRecord, Error, WorkerDict};

mod header;
mod ranks;

pub use header::{restore_binary_v2_header, strip_binary_v2_header};
use ranks::{Ranker, put_ranked_workers};

const MAGIC: [u8; 4] = *b"TRCB";
const VERSION: u8 = 2;
const FLAG_ZSTD: u8 = 1;
const FLAG_SECONDS: u8 = 2;
const FLAG_RANKS: u8 = 4;
const KNOWN_FLAGS: u8 = FLAG_ZSTD | FLAG_SECONDS | FLAG_RANKS;
/// The largest palette whose workers column may hold ranks: ranking costs the decoder
/// a sort of the palette per record.
const MAX_RANKED_PALETTE: usize = 16;

const TIME_OVERFLOW: &str = "time beyond u64::MAX milliseconds";
const UNUSED_PALETTE_ENTRY: &str = "worker palette entry without a record";

const PIDS_FULL: u8 = 0;
const PIDS_BITMAP: u8 = 1;
const PIDS_GAPS: u8 = 2;
const RANGES_MODEL: u8 = 0;
const RANGES_COLUMNS: u8 = 1;

/// How binary v2 seals batches: the batch size and whether to try zstd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryV2Options {
    batch_size: u64,
    zstd_level: Option<i32>,
    ranks: bool,
}

impl Default for BinaryV2Options {
    /// Batches of [`DEFAULT_BATCH_SIZE`] pids, no zstd.
    fn default() -> Self {
        BinaryV2Options {
            batch_size: DEFAULT_BATCH_SIZE,
            zstd_level: None,
            ranks: false,
        }
    }
}

impl BinaryV2Options {
    /// Batches of `batch_size` pids (`1..=65536`), no zstd.
    pub fn new(batch_size: u64) -> Result<Self, Error> {
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            return Err(Error::InvalidBatchSize(batch_size));
        }
        Ok(BinaryV2Options {
            batch_size,
            zstd_level: None,
            ranks: false,
        })
    }

    /// Also compress the payload with zstd at `level`, keeping the result only when it
    /// is smaller (the header says which).
    pub const fn with_zstd(mut self, level: i32) -> Self {
        self.zstd_level = Some(level);
        self
    }

    /// Also try the workers column as ranks (flag bit 2, see the module docs), keeping
    /// it only when it is smaller. Decoders before the flag refuse such batches: ask for
    /// it only where every reader knows it (archive format 2).
    pub const fn with_ranks(mut self) -> Self {
        self.ranks = true;
        self
    }

    /// Whether ranks are tried.
    pub const fn ranks(&self) -> bool {
        self.ranks
    }

    /// Pids per batch.
    pub const fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// The zstd level, if zstd is tried.
    pub const fn zstd_level(&self) -> Option<i32> {
        self.zstd_level
    }
}

/// A decoded binary v2 batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedBatch {
    /// The batch id: the batch holds pids `batch_id * batch_size ..` up to the next batch.
    pub batch_id: u64,
    /// Pids per batch when the batch was sealed.
    pub batch_size: u64,
    /// The records, in pid order.
    pub records: Vec<CompletedRecord>,
}

/// An upper bound on a raw payload, so a zstd header cannot make the decoder allocate
/// more than the records could ever need.
const fn max_raw_len(count: u64, batch_size: u64) -> u64 {
    256 * count + batch_size / 8 + 1024
}

/// Seals `records` (any order; pid order is what gets stored) as batch `batch_id`.
///
/// Every record's pid must lie in `batch_id * batch_size ..` the next batch, once;
/// every worker must be in `dict` (its index is what is stored). A batch may be partial.
pub fn encode_binary_v2(
    batch_id: u64,
    records: &[CompletedRecord],
    dict: &WorkerDict,
    options: &BinaryV2Options,
) -> Result<Vec<u8>, Error> {
    let batch_size = options.batch_size;
    let first_pid = batch_id
        .checked_mul(batch_size)
        .ok_or(Error::BatchIdOutOfRange {
            batch_id,
            batch_size,
        })?;
    let mut sorted: Vec<&CompletedRecord> = records.iter().collect();
    if !records.windows(2).all(|w| w[0].pid < w[1].pid) {
        sorted.sort_unstable_by_key(|r| r.pid);
    }
    let n = sorted.len();
    let mut offsets = Vec::with_capacity(n);
    let mut workers = Vec::with_capacity(n);
    for r in &sorted {
        let offset = r
            .pid
            .checked_sub(first_pid)
            .filter(|&o| o < batch_size)
            .ok_or(Error::PidOutsideBatch {
                pid: r.pid,
                batch_id,
                batch_size,
            })?;
        if offsets.last() == Some(&offset) {
            return Err(Error::DuplicatePid(r.pid));
        }
        offsets.push(offset);
        let index = dict
            .index_of(&r.worker)
            .ok_or_else(|| Error::UnknownWorker(r.worker.to_string()))?;
        workers.push(index);
    }

    let seconds = sorted
        .iter()
        .all(|r| r.completed_at_ms % 1000 == 0 && r.duration_ms % 1000 == 0);
    let mut raw = Vec::with_capacity(64 + 2 * n);
    put_pids(&mut raw, &offsets, batch_size);
    let unit = if seconds { 1000 } else { 1 };
    let completed: Vec<u64> = sorted.iter().map(|r| r.completed_at_ms / unit).collect();
    let mut plain = Vec::new();
    put_ranges(&mut plain, &sorted, &offsets, None);
    let plain_workers = put_workers(&mut plain, &workers);
    let ranked = options
        .ranks
        .then(|| {
            let mut out = Vec::new();
            put_ranges(&mut out, &sorted, &offsets, Some(first_pid));
            put_ranked_workers(&mut out, &workers, &completed).map(|local| (out, local))
        })
        .flatten()
        .filter(|(out, _)| out.len() < plain.len());
    let local = match &ranked {
        Some((out, local)) => {
            raw.extend_from_slice(out);
            local.clone()
        }
        None => {
            raw.extend_from_slice(&plain);
            plain_workers
        }
    };
    put_times(&mut raw, &sorted, &local, unit);

    let mut flags = if seconds { FLAG_SECONDS } else { 0 };
    if ranked.is_some() {
        flags |= FLAG_RANKS;
    }
    let mut raw_len = None;
    let mut payload = raw;
    if let Some(level) = options.zstd_level {
        // Keep zstd only when it pays for itself and its raw_len varint.
        if let Ok(packed) = zstd::bulk::compress(&payload, level)
            && packed.len() + 3 < payload.len()
            && payload.len() as u64 <= max_raw_len(n as u64, batch_size)
        {
            raw_len = Some(payload.len());
            payload = packed;
            flags |= FLAG_ZSTD;
        }
    }

    let mut out = Vec::with_capacity(payload.len() + 32);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(flags);
    put_varint(&mut out, batch_id);
    put_varint(&mut out, batch_size);
    put_varint(&mut out, n as u64);
    if let Some(raw_len) = raw_len {
        put_varint(&mut out, raw_len as u64);
    }
    put_varint(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

fn put_pids(out: &mut Vec<u8>, offsets: &[u64], batch_size: u64) {
    if offsets.len() as u64 == batch_size {
        // Sorted, distinct and below batch_size: exactly 0..batch_size.
        out.push(PIDS_FULL);
        return;
    }
    let mut gaps = Vec::with_capacity(offsets.len());
    let mut next = 0;
    for &o in offsets {
        gaps.push(o - next);
        next = o + 1;
    }
    let mut gap_column = Vec::new();
    put_column(&mut gap_column, &gaps);
    let bitmap_len = batch_size.div_ceil(8) as usize;
    if gap_column.len() < bitmap_len {
        out.push(PIDS_GAPS);
        out.extend_from_slice(&gap_column);
    } else {
        out.push(PIDS_BITMAP);
        let start = out.len();
        out.resize(start + bitmap_len, 0);
        for &o in offsets {
            out[start + (o / 8) as usize] |= 1 << (o % 8);
        }
    }
}

/// The uniform range model: `min = a + offset * (span + 1)`, `max = min + span`,
/// all wrapping, so any record can seed a model and every record can be tested.
#[derive(Clone, Copy)]
struct RangeModel {
    a: u64,
    span: u64,
}

impl RangeModel {
    fn min_at(self, offset: u64) -> u64 {
        self.a
            .wrapping_add(offset.wrapping_mul(self.span.wrapping_add(1)))
    }
}

/// The seed plan's first ID of batch pid `first_pid` for ranges of `span + 1` IDs:
/// what flag bit 2 predicts the range model's `a` by (wrapping, like the model).
fn predicted_a(first_pid: u64, span: u64) -> u64 {
    first_pid
        .wrapping_sub(1)
        .wrapping_mul(span.wrapping_add(1))
        .wrapping_add(1)
}

/// Writes the ranges section; with `predict` (the batch's first pid, flag bit 2) the
/// model's `a` is written after `span`, as its difference from [`predicted_a`].
fn put_ranges(
    out: &mut Vec<u8>,
    records: &[&CompletedRecord],
    offsets: &[u64],
    predict: Option<u64>,
) {
    let n = records.len();
    let span = |r: &CompletedRecord| r.max_id.wrapping_sub(r.min_id);
    let fits = |m: RangeModel, i: usize| {
        records[i].min_id == m.min_at(offsets[i]) && span(records[i]) == m.span
    };
    // A model seeded from a few records finds the uniform plan even when some ranges
    // (first, middle or last) are exceptions.
    let mut best: Option<(usize, RangeModel)> = None;
    for seed in [0, n / 2, n.saturating_sub(1)] {
        let (Some(r), Some(&o)) = (records.get(seed), offsets.get(seed)) else {
            continue;
        };
        let s = span(r);
        let m = RangeModel {
            a: r.min_id.wrapping_sub(o.wrapping_mul(s.wrapping_add(1))),
            span: s,
        };
        let misses = (0..n).filter(|&i| !fits(m, i)).count();
        if best.is_none_or(|(b, _)| misses < b) {
            best = Some((misses, m));
        }
    }
    let (misses, model) = best.unwrap_or((0, RangeModel { a: 0, span: 0 }));

    let mut modelled = vec![RANGES_MODEL];
    match predict {
        None => {
            put_varint(&mut modelled, model.a);
            put_varint(&mut modelled, model.span);
        }
        Some(first_pid) => {
            put_varint(&mut modelled, model.span);
            put_varint(
                &mut modelled,
                zigzag_diff(model.a, predicted_a(first_pid, model.span)),
            );
        }
    }
    put_varint(&mut modelled, misses as u64);
    let mut last = None;
    for i in (0..n).filter(|&i| !fits(model, i)) {
        let gap = last.map_or(i, |prev| i - prev - 1);
        put_varint(&mut modelled, gap as u64);
        put_varint(
            &mut modelled,
            zigzag_diff(records[i].min_id, model.min_at(offsets[i])),
        );
        put_varint(&mut modelled, zigzag_diff(span(records[i]), model.span));
        last = Some(i);
    }
    if misses == 0 {
        out.extend_from_slice(&modelled);
        return;
    }
    // Many exceptions: explicit columns may be smaller (variable but contiguous ranges).
    let mut columns = vec![RANGES_COLUMNS];
    let mut end = 0u64;
    let starts: Vec<u64> = records
        .iter()
        .map(|r| {
            let d = zigzag_diff(r.min_id, end);
            end = r.max_id.wrapping_add(1);
            d
        })
        .collect();
    put_column(&mut columns, &starts);
    let spans: Vec<u64> = records.iter().map(|r| span(r)).collect();
    put_column(&mut columns, &spans);
    out.extend_from_slice(if columns.len() < modelled.len() {
        &columns
    } else {
        &modelled
    });
}

/// Writes the palette (sorted dictionary indices as gaps) and the per-record palette
/// positions; returns the positions.
fn put_workers(out: &mut Vec<u8>, workers: &[u32]) -> Vec<u64> {
    let mut palette = workers.to_vec();
    palette.sort_unstable();
    palette.dedup();
    put_varint(out, palette.len() as u64);
    let mut next = 0u64;
    for &w in &palette {
        put_varint(out, u64::from(w) - next);
        next = u64::from(w) + 1;
    }
    let local: Vec<u64> = workers
        .iter()
        .map(|w| palette.binary_search(w).unwrap_or_default() as u64)
        .collect();
    put_column(out, &local);
    local
}

fn put_times(out: &mut Vec<u8>, records: &[&CompletedRecord], local: &[u64], unit: u64) {
    let n = records.len();
    let completed: Vec<u64> = records.iter().map(|r| r.completed_at_ms / unit).collect();
    let durations: Vec<u64> = records.iter().map(|r| r.duration_ms / unit).collect();
    put_column(out, &durations);

    let workers = local.iter().max().map_or(0, |&m| m as usize + 1);
    let mut last_completed: Vec<Option<u64>> = vec![None; workers];
    let mut chained = Vec::with_capacity(n);
    let mut firsts = Vec::with_capacity(workers);
    let mut prev_start = 0u64;
    for i in 0..n {
        let start = completed[i].wrapping_sub(durations[i]);
        let w = local[i] as usize;
        match last_completed[w] {
            Some(done) => chained.push(zigzag_diff(start, done)),
            None => firsts.push(zigzag_diff(start, prev_start)),
        }
        last_completed[w] = Some(completed[i]);
        prev_start = start;
    }
    put_column(out, &chained);
    put_column(out, &firsts);
}

/// Decodes a batch written by [`encode_binary_v2`], resolving worker indices through
/// `dict`. Validates the checksum, every length, count, mode and index, and never
/// panics or over-allocates on hostile input.
pub fn decode_binary_v2(bytes: &[u8], dict: &WorkerDict) -> Result<SealedBatch, Error> {
    let mut r = Reader::new(bytes);
    r.header(MAGIC, VERSION)?;
    let flags = r.u8()?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Error::UnknownFlags(flags));
    }
    let batch_id = r.varint()?;
    let batch_size = r.varint()?;
    let count = r.varint()?;
    let raw_len = if flags & FLAG_ZSTD != 0 {
        Some(r.varint()?)
    } else {
        None
    };
    let payload_len = r.varint()?;
    let payload = usize::try_from(payload_len)
        .ok()
        .and_then(|len| r.bytes(len).ok())
        .ok_or(Error::Truncated)?;
    let stored = u32::from_le_bytes(r.array::<4>()?);
    if r.remaining() > 0 {
        return Err(Error::TrailingBytes(r.remaining()));
    }
    let (covered, _) = bytes.split_last_chunk::<4>().ok_or(Error::Truncated)?;
    let computed = crc32fast::hash(covered);
    if stored != computed {
        return Err(Error::ChecksumMismatch { stored, computed });
    }

    // The bytes are as written; what follows checks they were written by a sane encoder.
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        return Err(Error::InvalidBatchSize(batch_size));
    }
    if count > batch_size {
        return Err(Error::CountExceedsBatch { count, batch_size });
    }
    let first_pid = batch_id
        .checked_mul(batch_size)
        .ok_or(Error::BatchIdOutOfRange {
            batch_id,
            batch_size,
        })?;
    let decompressed;
    let raw = match raw_len {
        None => payload,
        Some(raw_len) => {
            if raw_len > max_raw_len(count, batch_size) {
                return Err(Error::Corrupt("zstd raw length"));
            }
            // Bounded above, so the cast is exact.
            let raw_len = raw_len as usize;
            decompressed = zstd::bulk::decompress(payload, raw_len)
                .map_err(|e| Error::Decompress(e.to_string()))?;
            if decompressed.len() != raw_len {
                return Err(Error::Decompress(format!(
                    "{} bytes instead of {raw_len}",
                    decompressed.len()
                )));
            }
            &decompressed[..]
        }
    };
    let unit = if flags & FLAG_SECONDS != 0 { 1000 } else { 1 };
    let ranked = flags & FLAG_RANKS != 0;
    // count <= batch_size <= 65536.
    let records = decode_payload(
        raw,
        count as usize,
        batch_size,
        first_pid,
        unit,
        ranked,
        dict,
    )?;
    Ok(SealedBatch {
        batch_id,
        batch_size,
        records,
    })
}

fn decode_payload(
    raw: &[u8],
    n: usize,
    batch_size: u64,
    first_pid: u64,
    unit: u64,
    ranked: bool,
    dict: &WorkerDict,
) -> Result<Vec<CompletedRecord>, Error> {
    let mut r = Reader::new(raw);
    // The last batch of the u64 pid space is cut short at u64::MAX.
    let limit = (u64::MAX - first_pid).saturating_add(1).min(batch_size);
    let offsets = get_pids(&mut r, n, batch_size, limit)?;
    let ranges = get_ranges(&mut r, n, &offsets, ranked.then_some(first_pid))?;
    let (names, local) = get_workers(&mut r, n, dict, ranked)?;
    let mut durations = Vec::new();
    get_column(&mut r, n, &mut durations)?;
    // Every palette entry starts one chain; the rest of the records extend one.
    let firsts_len = names.len();
    let mut chained = Vec::new();
    get_column(&mut r, n - firsts_len, &mut chained)?;
    let mut firsts = Vec::new();
    get_column(&mut r, firsts_len, &mut firsts)?;
    if r.remaining() > 0 {
        return Err(Error::TrailingBytes(r.remaining()));
    }

    let mut last_completed: Vec<Option<u64>> = vec![None; names.len()];
    let mut ranker = Ranker::new(names.len());
    let (mut chained, mut firsts) = (chained.iter(), firsts.iter());
    let mut prev_start = 0u64;
    let mut records = Vec::with_capacity(n);
    for i in 0..n {
        // Positions were checked against the palette, and every column has n values.
        let w = if ranked {
            ranker
                .worker_at(local[i] as usize)
                .ok_or(Error::Corrupt("worker rank"))?
        } else {
            local[i] as usize
        };
        let (predicted, residual) = match last_completed[w] {
            Some(done) => (done, chained.next()),
            None => (prev_start, firsts.next()),
        };
        // The chained column runs out only if some palette entry has no record.
        // (let-else rather than ok_or: an eagerly built Error costs a drop per record.)
        let Some(&residual) = residual else {
            return Err(Error::Corrupt(UNUSED_PALETTE_ENTRY));
        };
        let start = add_zigzag(predicted, residual);
        let duration = durations[i];
        let completed = start.wrapping_add(duration);
        last_completed[w] = Some(completed);
        ranker.done(w, completed);
        prev_start = start;
        let (Some(completed_at_ms), Some(duration_ms)) =
            (completed.checked_mul(unit), duration.checked_mul(unit))
        else {
            return Err(Error::Corrupt(TIME_OVERFLOW));
        };
        let (min_id, max_id) = ranges[i];
        records.push(CompletedRecord {
            pid: first_pid + offsets[i],
            min_id,
            max_id,
            worker: Arc::clone(&names[w]),
            completed_at_ms,
            duration_ms,
        });
    }
    if firsts.next().is_some() {
        return Err(Error::Corrupt(UNUSED_PALETTE_ENTRY));
    }
    Ok(records)
}

/// Reads the pid section as offsets from the batch's first pid, each below `limit`.
fn get_pids(r: &mut Reader<'_>, n: usize, batch_size: u64, limit: u64) -> Result<Vec<u64>, Error> {
    let mode = r.u8()?;
    let offsets: Vec<u64> = match mode {
        PIDS_FULL => {
            if n as u64 != batch_size {
                return Err(Error::CountMismatch {
                    declared: n as u64,
                    found: batch_size,
                });
            }
            if limit < batch_size {
                return Err(Error::Corrupt("pid beyond u64::MAX"));
            }
            (0..batch_size).collect()
        }
        PIDS_BITMAP => {
            let bitmap = r.bytes(batch_size.div_ceil(8) as usize)?;
            let mut offsets = Vec::with_capacity(n);
            for (byte_index, &byte) in bitmap.iter().enumerate() {
                let mut bits = byte;
                while bits != 0 {
                    let o = byte_index as u64 * 8 + u64::from(bits.trailing_zeros());
                    if o >= limit {
                        return Err(Error::Corrupt("pid bitmap bit beyond the batch"));
                    }
                    offsets.push(o);
                    bits &= bits - 1;
                }
            }
            if offsets.len() != n {
                return Err(Error::CountMismatch {
                    declared: n as u64,
                    found: offsets.len() as u64,
                });
            }
            offsets
        }
        PIDS_GAPS => {
            let mut gaps = Vec::new();
            get_column(r, n, &mut gaps)?;
            let mut next = 0u64;
            for g in &mut gaps {
                let Some(o) = next.checked_add(*g).filter(|&o| o < limit) else {
                    return Err(Error::Corrupt("pid gap beyond the batch"));
                };
                *g = o;
                next = o + 1;
            }
            gaps
        }
        _ => return Err(Error::Corrupt("pid section mode")),
    };
    Ok(offsets)
}

/// Reads the ranges section as `(min_id, max_id)` pairs in record order.
/// With `predict` (flag bit 2: the batch's first pid), the model's `a` follows `span`
/// as its difference from [`predicted_a`].
fn get_ranges(
    r: &mut Reader<'_>,
    n: usize,
    offsets: &[u64],
    predict: Option<u64>,
) -> Result<Vec<(u64, u64)>, Error> {
    match r.u8()? {
        RANGES_MODEL => {
            let model = match predict {
                None => RangeModel {
                    a: r.varint()?,
                    span: r.varint()?,
                },
                Some(first_pid) => {
                    let span = r.varint()?;
                    RangeModel {
                        a: add_zigzag(predicted_a(first_pid, span), r.varint()?),
                        span,
                    }
                }
            };
            let mut pairs: Vec<(u64, u64)> = offsets
                .iter()
                .map(|&o| {
                    let min = model.min_at(o);
                    (min, min.wrapping_add(model.span))
                })
                .collect();
            let misses = r.len(n, "range exception count")?;
            let mut next = 0usize;
            for _ in 0..misses {
                let i = usize::try_from(r.varint()?)
                    .ok()
                    .and_then(|gap| next.checked_add(gap))
                    .filter(|&i| i < n)
                    .ok_or(Error::Corrupt("range exception index"))?;
                // i < n and pairs has n entries.
                let min = add_zigzag(pairs[i].0, r.varint()?);
                let span = add_zigzag(model.span, r.varint()?);
                pairs[i] = (min, min.wrapping_add(span));
                next = i + 1;
            }
            Ok(pairs)
        }
        RANGES_COLUMNS => {
            let (mut starts, mut spans) = (Vec::new(), Vec::new());
            get_column(r, n, &mut starts)?;
            get_column(r, n, &mut spans)?;
            let mut end = 0u64;
            let pairs = starts
                .iter()
                .zip(&spans)
                .map(|(&d, &span)| {
                    let min = add_zigzag(end, d);
                    let max = min.wrapping_add(span);
                    end = max.wrapping_add(1);
                    (min, max)
                })
                .collect();
            Ok(pairs)
        }
        _ => Err(Error::Corrupt("range section mode")),
    }
}

/// Reads the palette (as worker ids) and the per-record palette positions.
/// With `ranked` (flag bit 2) the palette is at most 16 distinct indices in order of
/// first appearance, and the column holds ranks.
fn get_workers(
    r: &mut Reader<'_>,
    n: usize,
    dict: &WorkerDict,
    ranked: bool,
) -> Result<(Vec<Arc<str>>, Vec<u64>), Error> {
    let palette_len = r.len(n, "worker palette length")?;
    if (palette_len == 0) != (n == 0) || (ranked && palette_len > MAX_RANKED_PALETTE) {
        return Err(Error::Corrupt("worker palette length"));
    }
    let mut names = Vec::with_capacity(palette_len);
    let mut indices = Vec::with_capacity(if ranked { palette_len } else { 0 });
    let mut next = 0u64;
    for _ in 0..palette_len {
        let index = if ranked {
            let index = r.varint()?;
            if indices.contains(&index) {
                return Err(Error::Corrupt("worker palette index"));
            }
            indices.push(index);
            index
        } else {
            next.checked_add(r.varint()?)
                .ok_or(Error::Corrupt("worker palette index"))?
        };
        let entry = u32::try_from(index)
            .ok()
            .and_then(|i| dict.get(i))
            .ok_or(Error::UnknownWorkerIndex(index))?;
        names.push(Arc::from(entry.id.as_str()));
        next = index + 1;
    }
    let mut local = Vec::new();
    get_column(r, n, &mut local)?;
    if local.iter().any(|&l| l >= palette_len as u64) {
        return Err(Error::Corrupt("worker palette position"));
    }
    Ok((names, local))
}
