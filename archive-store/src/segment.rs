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
//! Layout of a segment value:
//!
//! ```text
//! version (u8, 1) | batches per segment (varint) | per slot: blob length (varint, 0: none)
//! | the blobs, in slot order, each a whole binary v2 batch with its own CRC32
//! ```
//!
//! Slot `j` of segment `K` of shard `s` is batch `(K * SEGMENT_BATCHES + j) *
//! num_shards + s`: segments count shard-local batches, as the bitmaps do.

use tranche_codec::KeySchema;

/// Shard-local batches per segment.
pub const SEGMENT_BATCHES: u64 = 10;

/// The only segment layout version.
const VERSION: u8 = 1;

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

/// The blob of slot `slot` in segment bytes `bytes`: `Ok(None)` when the slot is
/// empty, `Err` when the bytes are not a segment. Never panics.
pub(crate) fn slot_of(bytes: &[u8], slot: usize) -> Result<Option<&[u8]>, String> {
    let mut at = 0usize;
    let mut byte = || -> Result<u8, String> {
        let b = *bytes.get(at).ok_or("segment truncated")?;
        at += 1;
        Ok(b)
    };
    if byte()? != VERSION {
        return Err("unknown segment version".into());
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
    let mut lens = [0u64; SEGMENT_BATCHES as usize];
    for len in &mut lens {
        *len = varint()?;
    }
    let mut start = at as u64;
    for (j, &len) in lens.iter().enumerate() {
        let end = start
            .checked_add(len)
            .filter(|&e| e <= bytes.len() as u64)
            .ok_or("segment blob beyond its end")?;
        if j == slot {
            // Both bounds are within `bytes`, so the casts are exact.
            return Ok((len > 0).then(|| &bytes[start as usize..end as usize]));
        }
        start = end;
    }
    Ok(None)
}

/// Segment bytes holding `blobs` (one per slot, empty for none): what `join.lua`
/// writes, for rewriting a segment outside Lua (tests of corruption).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn build(blobs: &[Vec<u8>]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = vec![VERSION];
    varint(&mut out, SEGMENT_BATCHES);
    for j in 0..SEGMENT_BATCHES as usize {
        varint(&mut out, blobs.get(j).map_or(0, |b| b.len() as u64));
    }
    for b in blobs.iter().take(SEGMENT_BATCHES as usize) {
        out.extend_from_slice(b);
    }
    out
}

/// Every slot's blob (empty for none), or `Err` when the bytes are not a segment.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn blobs(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    (0..SEGMENT_BATCHES as usize)
        .map(|j| slot_of(bytes, j).map(|b| b.map(<[u8]>::to_vec).unwrap_or_default()))
        .collect()
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
            let found = slot_of(&bytes, j).unwrap();
            assert_eq!(
                found.map(<[u8]>::to_vec).unwrap_or_default(),
                *b,
                "slot {j}"
            );
        }
        assert_eq!(super::blobs(&bytes).unwrap(), blobs);
        for cut in 0..bytes.len() {
            // Truncated: an error or (for a slot before the cut) the right blob.
            for (j, blob) in blobs.iter().enumerate() {
                if let Ok(Some(b)) = slot_of(&bytes[..cut], j) {
                    assert_eq!(b, &blob[..]);
                }
            }
        }
        assert!(slot_of(b"TRCB garbage", 0).is_err());
        assert!(slot_of(&[], 0).is_err());
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
