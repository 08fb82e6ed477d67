//! Segments: full sealed batches grouped into one Redis string per
//! [`SEGMENT_BATCHES`] shard-local batches, so a million archived pids cost a thousand
//! keys rather than ten thousand.
//!
//! A sealed batch first lives in its own key (`{ns:s}:completed:batch:N`, binary v2).
//! Once every batch of its segment is sealed whole (each holds every planned pid), the
//! batches are joined into the segment key `{ns:s}:completed:seg:K` and their own keys
//! deleted, in one script (`join.lua`). Batches still filling, partially sealed, or in a
//! segment with such a batch keep their own key: a joined segment is never written
//! again (a record for it would be a duplicate), only read and expired.
//!
//! Each Redis key costs about a hundred bytes beside its value (the key name, the
//! main dictionary's entry and bucket, the value's header, and with a TTL an entry in
//! the expires dictionary): with batches of 100 pids, about as much as the batch
//! itself. A segment pays it once per thousand pids.
//!
//! Layout of a segment value, version 1 (what every version reads and
//! [`ArchiveFormat::V1`](crate::ArchiveFormat) writes):
//!
//! ```text
//! version (u8, 1) | batches per segment (varint) | per slot: blob length (varint, 0: none)
//! | the blobs, in slot order, each a whole binary v2 batch with its own CRC32
//! ```
//!
//! Version 2 (written only under [`ArchiveFormat::V2`](crate::ArchiveFormat)) drops
//! from each blob what the segment implies: the magic, the version, the batch id (the
//! slot's), the batch size (once, in the segment's header) and the payload length
//! (the blob's length). A reader puts them back ([`restore_binary_v2_header`]) and gets
//! the very bytes the batch had, checksum included, so one damaged batch still fails
//! alone and a blob in the wrong slot fails its checksum:
//!
//! ```text
//! version (u8, 2) | batches per segment (varint) | batch size (varint)
//! | shortest blob length B (varint) | per slot: 0 for none, else length - B + 1 (varint)
//! | the headless blobs, in slot order
//! headless blob   flags | count | [raw_len] | payload | CRC32   (codec's
//!                 strip_binary_v2_header)
//! ```
//!
//! `join.lua` strips in Lua; a batch whose header does not strip cleanly (not binary
//! v2, another batch id or size, a non-canonical varint) makes it write version 1.
//!
//! Slot `j` of segment `K` of shard `s` is batch `(K * SEGMENT_BATCHES + j) *
//! num_shards + s`: segments count shard-local batches, as the bitmaps do.

use std::borrow::Cow;

use tranche_codec::{KeySchema, restore_binary_v2_header};

/// Shard-local batches per segment.
pub const SEGMENT_BATCHES: u64 = 10;

/// Segment layout version 1: whole batches.
const V1: u8 = 1;
/// Segment layout version 2: headless batches.
const V2: u8 = 2;

/// Where a batch lives once joined: shard, segment number and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SegmentRef {
    pub(crate) shard: u32,
    pub(crate) segment: u64,
}

impl SegmentRef {
    /// The segment of `batch`, and the batch's slot in it.
    pub(crate) fn of(schema: &KeySchema, batch: u64) -> (Self, usize) {
        let shards = u64::from(schema.num_shards());
        let local = batch / shards;
        let r = SegmentRef {
            shard: schema.shard_of_batch(batch),
            segment: local / SEGMENT_BATCHES,
        };
        (r, (local % SEGMENT_BATCHES) as usize)
    }

    /// The segment's key: `{ns:s}:completed:seg:K`.
    pub(crate) fn key(&self, schema: &KeySchema) -> String {
        schema.shard_key(self.shard, &format!("completed:seg:{}", self.segment))
    }

    /// The batch ids of the segment's slots, in slot order (saturating: the last
    /// segment of the id space is cut short, and its missing slots repeat `u64::MAX`).
    pub(crate) fn batches(&self, schema: &KeySchema) -> Vec<u64> {
        let shards = u64::from(schema.num_shards());
        (0..SEGMENT_BATCHES)
            .map(|j| {
                self.segment
                    .saturating_mul(SEGMENT_BATCHES)
                    .saturating_add(j)
                    .saturating_mul(shards)
                    .saturating_add(u64::from(self.shard))
            })
            .collect()
    }
}

/// The sealed batch bytes of slot `slot` in segment bytes `bytes`, batch `batch`:
/// `Ok(None)` when the slot is empty, `Err` when the bytes are not a segment (or a
/// version 2 slot cannot be restored). Never panics.
pub(crate) fn slot_of(
    bytes: &[u8],
    slot: usize,
    batch: u64,
) -> Result<Option<Cow<'_, [u8]>>, String> {
    let mut at = 0usize;
    let mut byte = || -> Result<u8, String> {
        let b = *bytes.get(at).ok_or("segment truncated")?;
        at += 1;
        Ok(b)
    };
    let version = byte()?;
    if version != V1 && version != V2 {
        return Err(format!("unknown segment version {version}"));
    }
    let mut varint = || -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("segment varint too long".into())
    };
    let slots = varint()?;
    if slots != SEGMENT_BATCHES {
        return Err(format!("segment of {slots} batches, not {SEGMENT_BATCHES}"));
    }
    let (batch_size, base) = if version == V2 {
        (varint()?, varint()?)
    } else {
        (0, 0)
    };
    let mut lens = [0u64; SEGMENT_BATCHES as usize];
    for len in &mut lens {
        *len = stored_len(version, base, varint()?)?;
    }
    let mut start = at as u64;
    for (j, &len) in lens.iter().enumerate() {
        let end = start
            .checked_add(len)
            .filter(|&e| e <= bytes.len() as u64)
            .ok_or("segment blob beyond its end")?;
        if j == slot {
            if len == 0 {
                return Ok(None);
            }
            // Both bounds are within `bytes`, so the casts are exact.
            let blob = &bytes[start as usize..end as usize];
            if version == V1 {
                return Ok(Some(Cow::Borrowed(blob)));
            }
            return restore_binary_v2_header(batch, batch_size, blob)
                .map(|b| Some(Cow::Owned(b)))
                .map_err(|e| format!("segment slot {slot}: {e}"));
        }
        start = end;
    }
    Ok(None)
}

/// A slot's blob length from its stored value: as is in version 1; in version 2 the
/// value is 0 for none, else the length less the segment's shortest blob `base`, plus 1
/// (lengths of batches alike differ little, so each takes a byte).
fn stored_len(version: u8, base: u64, v: u64) -> Result<u64, String> {
    if version == V1 || v == 0 {
        return Ok(v);
    }
    base.checked_add(v - 1)
        .ok_or_else(|| "segment blob length overflows".to_owned())
}

/// The version 2 values of blob lengths `lens` (0 for none): the shortest length, and
/// each slot's stored value (see [`stored_len`]).
#[cfg(any(test, feature = "testing"))]
fn v2_lengths(lens: &[u64]) -> (u64, Vec<u64>) {
    let base = lens.iter().copied().filter(|&l| l > 0).min().unwrap_or(0);
    let stored = lens
        .iter()
        .map(|&l| if l == 0 { 0 } else { l - base + 1 })
        .collect();
    (base, stored)
}

#[cfg(any(test, feature = "testing"))]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Segment bytes of layout version 1 holding `blobs` (one whole batch per slot, empty
/// for none): what `join.lua` writes under [`ArchiveFormat::V1`](crate::ArchiveFormat),
/// for rewriting a segment outside Lua (tests of corruption).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn build(blobs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![V1];
    put_varint(&mut out, SEGMENT_BATCHES);
    for j in 0..SEGMENT_BATCHES as usize {
        put_varint(&mut out, blobs.get(j).map_or(0, |b| b.len() as u64));
    }
    for b in blobs.iter().take(SEGMENT_BATCHES as usize) {
        out.extend_from_slice(b);
    }
    out
}

/// Segment bytes of layout version 2 holding `headless` blobs (one per slot, empty for
/// none) of batches of `batch_size` pids: what `join.lua` writes under
/// [`ArchiveFormat::V2`](crate::ArchiveFormat).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn build_v2(batch_size: u64, headless: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![V2];
    put_varint(&mut out, SEGMENT_BATCHES);
    put_varint(&mut out, batch_size);
    let lens: Vec<u64> = (0..SEGMENT_BATCHES as usize)
        .map(|j| headless.get(j).map_or(0, |b| b.len() as u64))
        .collect();
    let (base, stored) = v2_lengths(&lens);
    put_varint(&mut out, base);
    for v in stored {
        put_varint(&mut out, v);
    }
    for b in headless.iter().take(SEGMENT_BATCHES as usize) {
        out.extend_from_slice(b);
    }
    out
}

/// The layout version of segment bytes (1 or 2), `None` if they are no segment's.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn version(bytes: &[u8]) -> Option<u8> {
    bytes.first().copied().filter(|v| *v == V1 || *v == V2)
}

/// Every slot's stored blob as it is stored (whole batches in version 1, headless in
/// version 2; empty for none), or `Err` when the bytes are not a segment.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn stored_blobs(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut r = bytes;
    let varint = |r: &mut &[u8]| -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = r.split_first().ok_or("segment truncated")?;
            *r = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("segment varint too long".into())
    };
    let version = version(bytes).ok_or("not a segment")?;
    r = &r[1..];
    varint(&mut r)?;
    let base = if version == V2 {
        varint(&mut r)?;
        varint(&mut r)?
    } else {
        0
    };
    let mut out = Vec::new();
    let lens: Vec<u64> = (0..SEGMENT_BATCHES)
        .map(|_| stored_len(version, base, varint(&mut r)?))
        .collect::<Result<_, _>>()?;
    for len in lens {
        let (blob, rest) = r
            .split_at_checked(len as usize)
            .ok_or("segment blob beyond its end")?;
        out.push(blob.to_vec());
        r = rest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_garbage_is_an_error() {
        let blobs: Vec<Vec<u8>> = (0..SEGMENT_BATCHES as usize)
            .map(|j| {
                if j == 3 {
                    Vec::new()
                } else {
                    vec![j as u8; 100 + j * 40]
                }
            })
            .collect();
        let bytes = build(&blobs);
        for (j, b) in blobs.iter().enumerate() {
            let found = slot_of(&bytes, j, 7).unwrap();
            assert_eq!(
                found.map(Cow::into_owned).unwrap_or_default(),
                *b,
                "slot {j}"
            );
        }
        assert_eq!(stored_blobs(&bytes).unwrap(), blobs);
        for cut in 0..bytes.len() {
            // Truncated: an error or (for a slot before the cut) the right blob.
            for (j, blob) in blobs.iter().enumerate() {
                if let Ok(Some(b)) = slot_of(&bytes[..cut], j, 7) {
                    assert_eq!(&*b, &blob[..]);
                }
            }
        }
        assert!(slot_of(b"TRCB garbage", 0, 7).is_err());
        assert!(slot_of(&[], 0, 7).is_err());
    }

    /// Real batches of the segment's slots, each of `batch_size` pids, slot 3 empty.
    fn batches(seg: u64, batch_size: u64) -> Vec<Vec<u8>> {
        use std::sync::Arc;
        use tranche_codec::{BinaryV2Options, CompletedRecord, WorkerDict, encode_binary_v2};
        let mut dict = WorkerDict::new();
        dict.insert("w").unwrap();
        let options = BinaryV2Options::new(batch_size).unwrap();
        (0..SEGMENT_BATCHES)
            .map(|j| {
                let batch = seg * SEGMENT_BATCHES + j;
                if j == 3 {
                    return Vec::new();
                }
                let records: Vec<CompletedRecord> = (0..batch_size - j)
                    .map(|o| CompletedRecord {
                        pid: batch * batch_size + o,
                        min_id: 1,
                        max_id: 1000 + j * o,
                        worker: Arc::from("w"),
                        completed_at_ms: 1_000_000 + o * 777,
                        duration_ms: 300 + o,
                    })
                    .collect();
                encode_binary_v2(batch, &records, &dict, &options).unwrap()
            })
            .collect()
    }

    #[test]
    fn version_2_restores_each_batch_byte_for_byte_and_fails_alone() {
        let whole = batches(12_345, 100);
        let headless: Vec<Vec<u8>> = whole
            .iter()
            .enumerate()
            .map(|(j, b)| {
                if b.is_empty() {
                    return Vec::new();
                }
                let (id, size, h) = tranche_codec::strip_binary_v2_header(b).unwrap();
                assert_eq!((id, size), (12_345 * SEGMENT_BATCHES + j as u64, 100));
                h
            })
            .collect();
        let v2 = build_v2(100, &headless);
        let v1 = build(&whole);
        assert!(v2.len() + 10 * (SEGMENT_BATCHES as usize - 1) < v1.len());
        assert_eq!((version(&v1), version(&v2)), (Some(1), Some(2)));
        assert_eq!(stored_blobs(&v2).unwrap(), headless);
        for (j, b) in whole.iter().enumerate() {
            let batch = 12_345 * SEGMENT_BATCHES + j as u64;
            for bytes in [&v1, &v2] {
                let found = slot_of(bytes, j, batch).unwrap();
                assert_eq!(
                    found.map(Cow::into_owned).unwrap_or_default(),
                    *b,
                    "slot {j}"
                );
            }
        }
        // A blob damaged in a version 2 segment fails its checksum alone.
        let mut damaged = headless.clone();
        let at = damaged[5].len() / 2;
        damaged[5][at] ^= 0x40;
        let bytes = build_v2(100, &damaged);
        let dict = {
            let mut d = tranche_codec::WorkerDict::new();
            d.insert("w").unwrap();
            d
        };
        for j in [0, 1, 2, 4, 5, 6, 7, 8, 9] {
            let batch = 12_345 * SEGMENT_BATCHES + j as u64;
            let found = slot_of(&bytes, j, batch).unwrap().unwrap();
            let decoded = tranche_codec::decode_binary_v2(&found, &dict);
            assert_eq!(decoded.is_ok(), j != 5, "slot {j}");
        }
        // Read as another batch's (a segment under the wrong key), it fails too.
        let moved = slot_of(&v2, 0, 7).unwrap().unwrap();
        assert!(tranche_codec::decode_binary_v2(&moved, &dict).is_err());
        for cut in 0..v2.len() {
            for (j, batch_bytes) in whole.iter().enumerate() {
                let batch = 12_345 * SEGMENT_BATCHES + j as u64;
                if let Ok(Some(b)) = slot_of(&v2[..cut], j, batch) {
                    assert_eq!(&*b, &batch_bytes[..]);
                }
            }
        }
    }

    #[test]
    fn segments_count_shard_local_batches() {
        let schema = KeySchema::new("elk", 4).unwrap();
        let (r, slot) = SegmentRef::of(&schema, 4 * 13 + 2);
        assert_eq!((r.shard, r.segment, slot), (2, 1, 3));
        assert_eq!(r.batches(&schema)[slot], 4 * 13 + 2);
        assert_eq!(r.key(&schema), "{elk:2~68}:completed:seg:1");
        let (last, _) = SegmentRef::of(&schema, u64::MAX);
        assert!(last.batches(&schema).contains(&u64::MAX));
    }
}
