//! Reading the packed values that `apply_delta.lua` writes: the per-range statistics,
//! 64 ranges to a hash field, and the hourly counts, 24 to a field per day.
//!
//! Only Lua writes them (its header documents the layout); Rust only reads, so there is
//! one encoder. A range's count and summed duration are not stored: they are the sums
//! over its workers. Every decoder returns [`Error::Corrupt`] on bytes it cannot read,
//! never panics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::aggregate::{Counters, RANGE_SIZE, RangeAgg};
use crate::{Error, Result};

/// Ranges per block: one field of the ranges hash holds 64 consecutive ranges, so a
/// shard of 50,000 ranges needs about 800 fields rather than 50,000 (a hash field costs
/// Redis some 50 bytes of its own whatever its value).
pub(crate) const RANGES_PER_BLOCK: u64 = 64;

/// The block and slot of range `r`.
pub(crate) fn block_of(r: u64) -> (u64, u64) {
    (r / RANGES_PER_BLOCK, r % RANGES_PER_BLOCK)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    key: &'a str,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &str) -> Error {
        Error::Corrupt {
            key: self.key.to_owned(),
            detail: format!("{what} at byte {}", self.at),
        }
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn byte(&mut self) -> Result<u8> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| self.bad("truncated"))?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| self.bad("truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    /// A LEB128 varint; Lua writes at most 8 bytes (values below 2^53).
    fn varint(&mut self) -> Result<u64> {
        let mut x = 0u64;
        for shift in (0..56).step_by(7) {
            let b = self.byte()?;
            x |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(x);
            }
        }
        Err(self.bad("varint too long"))
    }

    fn zigzag(&mut self) -> Result<i128> {
        let z = i128::from(self.varint()?);
        Ok(if z % 2 == 0 { z / 2 } else { -(z + 1) / 2 })
    }

    /// A decimal string `varint(len) digits` (the wide form).
    fn decimal(&mut self) -> Result<u128> {
        let len = usize::try_from(self.varint()?).map_err(|_| self.bad("length"))?;
        let digits = self.take(len)?;
        if digits.is_empty() || digits.len() > 39 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(self.bad("not a decimal number"));
        }
        std::str::from_utf8(digits)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.bad("decimal number too large"))
    }
}

/// One range as stored, with IDs and times still relative.
struct Packed {
    min_rel: i128,
    max_rel: i128,
    first: i128,
    last: i128,
    /// Palette index -> (count, summed ms, summed IDs).
    workers: Vec<(u64, u128, u128, u128)>,
}

fn read_range(rd: &mut Reader<'_>, base: u64) -> Result<Packed> {
    let flags = rd.byte()?;
    if flags == 1 {
        let dec = |rd: &mut Reader<'_>| -> Result<i128> {
            i128::try_from(rd.decimal()?).map_err(|_| rd.bad("number too large"))
        };
        let (min_rel, max_rel, first, last) = (dec(rd)?, dec(rd)?, dec(rd)?, dec(rd)?);
        let nw = rd.decimal()?;
        let mut workers = Vec::new();
        for _ in 0..nw {
            let idx = u64::try_from(rd.decimal()?).map_err(|_| rd.bad("worker index"))?;
            workers.push((idx, rd.decimal()?, rd.decimal()?, rd.decimal()?));
            if rd.done() && (workers.len() as u128) < nw {
                return Err(rd.bad("truncated"));
            }
        }
        return Ok(Packed {
            min_rel,
            max_rel,
            first,
            last,
            workers,
        });
    }
    let (packed, whole, implied) = (flags & 16 != 0, flags & 32 != 0, flags & 64 != 0);
    if flags & !0b111_1110 != 0 || (!packed && (whole || implied)) || (implied && flags & 4 == 0) {
        return Err(rd.bad("unknown range flags"));
    }
    let k: i128 = if flags & 2 != 0 { 1000 } else { 1 };
    let (min_rel, max_rel) = if whole {
        (1, i128::from(RANGE_SIZE))
    } else {
        (
            i128::from(rd.varint()?),
            i128::from(RANGE_SIZE) + rd.zigzag()?,
        )
    };
    let first = i128::from(base) + rd.zigzag()? * k;
    let last = first + i128::from(rd.varint()?) * k;
    let unit = if flags & 4 != 0 && !implied {
        Some(u128::from(rd.varint()?))
    } else {
        None
    };
    let mut idxs = Vec::new();
    if flags & 8 != 0 {
        let len = usize::try_from(rd.varint()?).map_err(|_| rd.bad("bitmap length"))?;
        for (byte, &b) in rd.take(len)?.iter().enumerate() {
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    idxs.push(byte as u64 * 8 + bit);
                }
            }
        }
    } else {
        let nw = rd.varint()?;
        for _ in 0..nw {
            idxs.push(rd.varint()?);
        }
    }
    if packed {
        let workers = read_packed_workers(rd, &idxs, k as u128, flags & 4 != 0, unit, |total| {
            // Flag 64: U is the range's ID span over its count, exactly.
            let span = u128::try_from(max_rel - min_rel + 1).ok()?;
            (total > 0 && span % total == 0).then(|| span / total)
        })?;
        return Ok(Packed {
            min_rel,
            max_rel,
            first,
            last,
            workers,
        });
    }
    let mut workers = Vec::with_capacity(idxs.len());
    for idx in idxs {
        let count = rd.varint()?;
        let dur = u128::from(rd.varint()?) * k as u128;
        let ids = match unit {
            Some(u) => u128::from(count) * u,
            None => u128::from(rd.varint()?),
        };
        workers.push((idx, u128::from(count), dur, ids));
    }
    Ok(Packed {
        min_rel,
        max_rel,
        first,
        last,
        workers,
    })
}

/// A packed body's workers (flag 16): the bit-packed count and duration columns, then
/// the IDs column unless every worker's IDs are its count times the unit (`unit`, or
/// `implied` from the counts' total when flag 64 left it out).
fn read_packed_workers(
    rd: &mut Reader<'_>,
    idxs: &[u64],
    k: u128,
    by_unit: bool,
    unit: Option<u128>,
    implied: impl Fn(u128) -> Option<u128>,
) -> Result<Vec<(u64, u128, u128, u128)>> {
    let cbase = rd.varint()?;
    let cw = rd.varint()?;
    let dbase = rd.varint()?;
    let dw = rd.varint()?;
    if cw > 53 || dw > 53 {
        return Err(rd.bad("bit width"));
    }
    let (cw, dw) = (cw as u32, dw as u32);
    let mut bits = Bits { at: 0 };
    let mut cols = Vec::with_capacity(idxs.len());
    for _ in idxs {
        let count = u128::from(cbase) + u128::from(bits.take(rd, cw)?);
        let dur = (u128::from(dbase) + u128::from(bits.take(rd, dw)?)) * k;
        cols.push((count, dur));
    }
    // The columns end on a byte boundary.
    rd.at += bits.at.div_ceil(8);
    if rd.at > rd.bytes.len() {
        return Err(rd.bad("truncated"));
    }
    let unit = match (by_unit, unit) {
        (false, _) => None,
        (true, Some(u)) => Some(u),
        (true, None) => {
            let total = cols.iter().map(|&(c, _)| c).sum();
            Some(implied(total).ok_or_else(|| rd.bad("no unit"))?)
        }
    };
    let mut workers = Vec::with_capacity(idxs.len());
    for (&idx, (count, dur)) in idxs.iter().zip(cols) {
        let ids = match unit {
            Some(u) => count * u,
            None => u128::from(rd.varint()?),
        };
        workers.push((idx, count, dur, ids));
    }
    Ok(workers)
}

/// A reader of bits after `Reader`'s position, least significant first: `at` counts
/// the bits taken so far.
struct Bits {
    at: usize,
}

impl Bits {
    fn take(&mut self, rd: &Reader<'_>, w: u32) -> Result<u64> {
        let mut x = 0u64;
        for i in 0..w {
            let bit = rd.at * 8 + self.at;
            let byte = rd
                .bytes
                .get(bit / 8)
                .ok_or_else(|| rd.bad("truncated bits"))?;
            x |= u64::from((byte >> (bit % 8)) & 1) << i;
            self.at += 1;
        }
        Ok(x)
    }
}

fn to_u64(v: i128, rd: &Reader<'_>, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| rd.bad(what))
}

/// Decodes block `block`'s value into `out` (range number -> range), naming workers by
/// `palette` (palette index -> worker id).
pub(crate) fn read_block(
    key: &str,
    block: u64,
    bytes: &[u8],
    palette: &HashMap<u64, Arc<str>>,
    out: &mut BTreeMap<u64, RangeAgg>,
) -> Result<()> {
    let mut rd = Reader { bytes, at: 0, key };
    let base = rd.varint()?;
    while !rd.done() {
        let slot = u64::from(rd.byte()?);
        let len = usize::try_from(rd.varint()?).map_err(|_| rd.bad("length"))?;
        let body = rd.take(len)?;
        if slot >= RANGES_PER_BLOCK {
            return Err(rd.bad("slot out of the block"));
        }
        let r = block
            .checked_mul(RANGES_PER_BLOCK)
            .and_then(|b| b.checked_add(slot))
            .filter(|r| r.checked_mul(RANGE_SIZE).is_some())
            .ok_or_else(|| rd.bad("range number out of bounds"))?;
        let mut body_rd = Reader {
            bytes: body,
            at: 0,
            key,
        };
        let p = read_range(&mut body_rd, base)?;
        if !body_rd.done() {
            return Err(body_rd.bad("trailing bytes"));
        }
        let lo = i128::from(r) * i128::from(RANGE_SIZE);
        let mut range = RangeAgg {
            count: 0,
            dur: 0,
            min: to_u64(lo + p.min_rel, &rd, "min_id")?,
            max: to_u64(lo + p.max_rel, &rd, "max_id")?,
            first: to_u64(p.first, &rd, "first completion")?,
            last: to_u64(p.last, &rd, "last completion")?,
            workers: BTreeMap::new(),
        };
        if p.min_rel >= i128::from(RANGE_SIZE) || p.workers.is_empty() {
            return Err(rd.bad("not a range"));
        }
        for (idx, count, dur, ids) in p.workers {
            let name = palette
                .get(&idx)
                .ok_or_else(|| rd.bad(&format!("worker index {idx} not in the palette")))?;
            let count = u64::try_from(count).map_err(|_| rd.bad("count"))?;
            range.count = range.count.saturating_add(count);
            range.dur += dur;
            let c = Counters { count, ids, dur };
            if range.workers.insert(name.clone(), c).is_some() {
                return Err(rd.bad("a worker twice"));
            }
        }
        if out.insert(r, range).is_some() {
            return Err(rd.bad("a range twice"));
        }
    }
    Ok(())
}

/// Decodes one day's 24 hourly counts.
pub(crate) fn read_day(key: &str, bytes: &[u8]) -> Result<[u64; 24]> {
    let mut rd = Reader { bytes, at: 0, key };
    let wide = match rd.byte()? {
        0 => false,
        1 => true,
        _ => return Err(rd.bad("unknown day format")),
    };
    let mut hours = [0u64; 24];
    for h in &mut hours {
        *h = if wide {
            u64::try_from(rd.decimal()?).map_err(|_| rd.bad("count"))?
        } else {
            rd.varint()?
        };
    }
    if !rd.done() {
        return Err(rd.bad("trailing bytes"));
    }
    Ok(hours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let palette: HashMap<u64, Arc<str>> = [(0, Arc::from("w"))].into_iter().collect();
        // base 0, slot 0, a compact body of one worker: flags 8 (bitmap), min_rel 1,
        // max_rel zz(0), first zz(5), span 0, bitmap of one byte, count 1, dur 7, ids 1000.
        let good = [0, 0, 11, 8, 1, 0, 10, 0, 1, 1, 1, 7, 0xe8, 0x07];
        let mut out = BTreeMap::new();
        read_block("k", 0, &good, &palette, &mut out).unwrap();
        let r = &out[&0];
        assert_eq!(
            (r.count, r.dur, r.min, r.max, r.first),
            (1, 7, 1, 100_000, 5)
        );
        assert_eq!(r.workers[&Arc::from("w")].ids, 1000);
        for cut in 0..good.len() {
            let mut out = BTreeMap::new();
            assert!(read_block("k", 0, &good[..cut], &palette, &mut out).is_err() || cut <= 1);
        }
        for (at, b) in [(2, 12), (3, 0x80), (4, 0xff), (9, 0x80)] {
            let mut bad = good;
            bad[at] = b;
            let _ = read_block("k", 0, &bad, &palette, &mut BTreeMap::new());
        }
        let mut bad = good;
        bad[1] = 64;
        assert!(read_block("k", 0, &bad, &palette, &mut BTreeMap::new()).is_err());
        assert!(read_block("k", 0, &good, &HashMap::new(), &mut BTreeMap::new()).is_err());
        // A packed body (flags 4 unit, 8 bitmap, 16 packed, 32 whole, 64 implied unit):
        // first zz(5), span 0, workers 0 and 1, counts 1 and 3 (base 1, 2 bits),
        // durations 7 and 9 (base 7, 2 bits), bits 0,0 | 0,0 | 2 | 2 = 0xa0.
        let palette: HashMap<u64, Arc<str>> = [(0, Arc::from("w")), (1, Arc::from("v"))]
            .into_iter()
            .collect();
        let packed = [0, 0, 10, 124, 10, 0, 1, 3, 1, 2, 7, 2, 0xa0];
        let mut out = BTreeMap::new();
        read_block("k", 0, &packed, &palette, &mut out).unwrap();
        let r = &out[&0];
        assert_eq!(
            (r.count, r.dur, r.min, r.max, r.first, r.last),
            (4, 16, 1, 100_000, 5, 5)
        );
        assert_eq!(r.workers[&Arc::from("w")].ids, 25_000);
        assert_eq!(r.workers[&Arc::from("v")].dur, 9);
        assert_eq!(r.workers[&Arc::from("v")].ids, 75_000);
        for cut in 3..packed.len() {
            let mut bad = packed[..cut].to_vec();
            bad[2] = (cut - 3) as u8;
            assert!(read_block("k", 0, &bad, &palette, &mut BTreeMap::new()).is_err());
        }
        // Whole or implied without packed, implied without unit: refused.
        for flags in [124 - 16, 124 - 4, 128 + 124] {
            let mut bad = packed;
            bad[3] = flags;
            assert!(read_block("k", 0, &bad, &palette, &mut BTreeMap::new()).is_err());
        }
        assert!(read_day("k", &[0; 25]).is_ok());
        assert!(read_day("k", &[0; 24]).is_err());
        assert!(read_day("k", &[2; 25]).is_err());
    }
}
