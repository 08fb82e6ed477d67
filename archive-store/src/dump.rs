//! The dump file: a self-describing, checksummed export of a whole archive.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! header   magic "TRDUMP01" | version u16 | num_shards u32 | batch_size u64
//!          | entries u64 (records) | batches u64 | created_ms u64 | updated_ms u64
//!          | namespace (u16 length + bytes) | crc32 of the header so far
//! dict     length u32 | WorkerDict::to_bytes | crc32
//! plans    count u32 | per plan: first pid u64 | min id u64 | max id u64 | size u64
//!          | explicit u8; then the crc32 of the section (version 2 on; none in 1)
//! index    per batch: id u64 | offset u64 | size u32 | tier u8 | time_ms u64 | crc32
//!          of the batch bytes; then the crc32 of the whole index
//! data     the batches, each binary v2 (with the dictionary above), at their offsets
//!          counted from the start of the data section
//! ```
//!
//! `time_ms` is the latest completion in the batch; `tier` is where the batch lived
//! (0 simple, 1 compressed, 2 summary), and where `import` puts it back. The plans are
//! the namespace's plan registry, so that an import answers for pids (and never issues
//! an archived one again) without planning anew; a version 1 dump reads with none.

use tranche_codec::{
    BinaryV2Options, CompletedRecord, KeySchema, PlanEntry, PlanGeometry, WorkerDict,
    decode_binary_v2, encode_binary_v2,
};

use crate::model::Tier;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TRDUMP01";
const VERSION: u16 = 2;
/// The oldest version read: version 1 is version 2 without the plans section.
const OLDEST_VERSION: u16 = 1;

/// One batch of a dump: its id, the tier it lived in, and its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpBatch {
    /// The batch id (`pid / batch_size`).
    pub id: u64,
    /// The tier the batch was in when exported.
    pub tier: Tier,
    /// The records, in pid order.
    pub records: Vec<CompletedRecord>,
}

/// A whole dump, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// The namespace it was exported from.
    pub namespace: String,
    /// Its shard count.
    pub num_shards: u32,
    /// Pids per batch.
    pub batch_size: u64,
    /// When the dump was written, ms since the epoch.
    pub created_ms: u64,
    /// The latest completion in it, ms since the epoch.
    pub updated_ms: u64,
    /// The worker dictionary the batches were written with.
    pub dict: WorkerDict,
    /// The plan registry, by first pid (empty when the exporter had none to give).
    pub plans: Vec<PlanEntry>,
    /// The batches, in id order.
    pub batches: Vec<DumpBatch>,
}

impl Dump {
    /// A dump of `batches` (in id order) written with `dict`, stamped `created_ms`; its
    /// `updated_ms` is the latest completion in it.
    pub fn new(
        schema: &KeySchema,
        created_ms: u64,
        dict: WorkerDict,
        batches: Vec<DumpBatch>,
    ) -> Self {
        let updated_ms = batches
            .iter()
            .flat_map(|b| &b.records)
            .map(|r| r.completed_at_ms)
            .max()
            .unwrap_or(0);
        Dump {
            namespace: schema.namespace().to_owned(),
            num_shards: schema.num_shards(),
            batch_size: schema.batch_size(),
            created_ms,
            updated_ms,
            dict,
            plans: Vec::new(),
            batches,
        }
    }

    /// Records over all batches.
    pub fn entries(&self) -> u64 {
        self.batches.iter().map(|b| b.records.len() as u64).sum()
    }

    /// The dump as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let options = BinaryV2Options::new(self.batch_size)?;
        let mut data = Vec::new();
        let mut index = Vec::new();
        for b in &self.batches {
            let bytes = encode_binary_v2(b.id, &b.records, &self.dict, &options)?;
            let time = b
                .records
                .iter()
                .map(|r| r.completed_at_ms)
                .max()
                .unwrap_or(0);
            index.extend(b.id.to_le_bytes());
            index.extend((data.len() as u64).to_le_bytes());
            index.extend((bytes.len() as u32).to_le_bytes());
            index.push(tier_byte(b.tier));
            index.extend(time.to_le_bytes());
            index.extend(crc32fast::hash(&bytes).to_le_bytes());
            data.extend(bytes);
        }
        let mut out = Vec::with_capacity(data.len() + index.len() + 256);
        out.extend(MAGIC);
        out.extend(VERSION.to_le_bytes());
        out.extend(self.num_shards.to_le_bytes());
        out.extend(self.batch_size.to_le_bytes());
        out.extend(self.entries().to_le_bytes());
        out.extend((self.batches.len() as u64).to_le_bytes());
        out.extend(self.created_ms.to_le_bytes());
        out.extend(self.updated_ms.to_le_bytes());
        out.extend((self.namespace.len() as u16).to_le_bytes());
        out.extend(self.namespace.as_bytes());
        out.extend(crc32fast::hash(&out).to_le_bytes());
        let dict = self.dict.to_bytes();
        out.extend((dict.len() as u32).to_le_bytes());
        out.extend(&dict);
        out.extend(crc32fast::hash(&dict).to_le_bytes());
        let mut plans = Vec::with_capacity(4 + 33 * self.plans.len());
        plans.extend((self.plans.len() as u32).to_le_bytes());
        for p in &self.plans {
            for n in [
                p.plan.first_pid(),
                p.plan.min(),
                p.plan.max(),
                p.plan.size(),
            ] {
                plans.extend(n.to_le_bytes());
            }
            plans.push(u8::from(p.explicit));
        }
        out.extend(&plans);
        out.extend(crc32fast::hash(&plans).to_le_bytes());
        out.extend(&index);
        out.extend(crc32fast::hash(&index).to_le_bytes());
        out.extend(data);
        Ok(out)
    }

    /// Reads a dump, checking every checksum. Never panics on bad bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err(bad("not a tranche dump (bad magic)"));
        }
        let version = r.u16()?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(bad(&format!(
                "dump version {version} is not supported (this build reads {OLDEST_VERSION} to {VERSION})"
            )));
        }
        let num_shards = r.u32()?;
        let batch_size = r.u64()?;
        let entries = r.u64()?;
        let batches = r.u64()?;
        let created_ms = r.u64()?;
        let updated_ms = r.u64()?;
        let ns_len = r.u16()? as usize;
        let namespace = String::from_utf8(r.take(ns_len)?.to_vec())
            .map_err(|_| bad("namespace is not UTF-8"))?;
        let header_end = r.at;
        if r.u32()? != crc32fast::hash(&bytes[..header_end]) {
            return Err(bad("header checksum mismatch"));
        }
        let dict_len = r.u32()? as usize;
        let dict_bytes = r.take(dict_len)?;
        if r.u32()? != crc32fast::hash(dict_bytes) {
            return Err(bad("dictionary checksum mismatch"));
        }
        let dict = WorkerDict::from_bytes(dict_bytes)?;
        let plans = if version >= 2 {
            read_plans(&mut r, bytes)?
        } else {
            Vec::new()
        };
        let index_len = usize::try_from(batches)
            .ok()
            .and_then(|n| n.checked_mul(33))
            .filter(|&n| n <= bytes.len())
            .ok_or_else(|| bad("batch count beyond the file"))?;
        let index = r.take(index_len)?;
        if r.u32()? != crc32fast::hash(index) {
            return Err(bad("index checksum mismatch"));
        }
        let data = &bytes[r.at..];
        let mut ir = Reader {
            bytes: index,
            at: 0,
        };
        let mut out = Vec::with_capacity(index_len / 33);
        for _ in 0..batches {
            let id = ir.u64()?;
            let offset = usize::try_from(ir.u64()?).map_err(|_| bad("offset"))?;
            let size = ir.u32()? as usize;
            let tier = match ir.take(1)?[0] {
                0 => Tier::Simple,
                1 => Tier::Compressed,
                2 => Tier::Summary,
                t => return Err(bad(&format!("unknown tier {t}"))),
            };
            let _time = ir.u64()?;
            let crc = ir.u32()?;
            let blob = offset
                .checked_add(size)
                .and_then(|end| data.get(offset..end))
                .ok_or_else(|| bad(&format!("batch {id} lies beyond the file")))?;
            if crc32fast::hash(blob) != crc {
                return Err(bad(&format!("batch {id} checksum mismatch")));
            }
            let sealed = decode_binary_v2(blob, &dict)?;
            if sealed.batch_id != id {
                return Err(bad(&format!("batch {id} holds batch {}", sealed.batch_id)));
            }
            out.push(DumpBatch {
                id,
                tier,
                records: sealed.records,
            });
        }
        let dump = Dump {
            namespace,
            num_shards,
            batch_size,
            created_ms,
            updated_ms,
            dict,
            plans,
            batches: out,
        };
        if dump.entries() != entries {
            return Err(bad("entry count does not match the batches"));
        }
        Ok(dump)
    }

    /// Every record as the seed's JSON, one per line, in batch order: the input for
    /// migrating back to one hash of JSON per partition (`HSET {ns:s}:completed pid
    /// line` per line, shard `(pid / 100) % num_shards`).
    pub fn to_json_lines(&self) -> String {
        let mut out = String::new();
        for r in self.batches.iter().flat_map(|b| &b.records) {
            out.push_str(&tranche_codec::encode_json(r));
            out.push('\n');
        }
        out
    }
}

/// The plans section, its checksum checked.
fn read_plans(r: &mut Reader<'_>, bytes: &[u8]) -> Result<Vec<PlanEntry>> {
    let start = r.at;
    let count = r.u32()? as usize;
    if count.saturating_mul(33) > bytes.len() {
        return Err(bad("plan count beyond the file"));
    }
    let mut plans = Vec::with_capacity(count);
    for _ in 0..count {
        let (first, min, max, size) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let explicit = match r.take(1)?[0] {
            0 => false,
            1 => true,
            b => return Err(bad(&format!("plan flag {b}"))),
        };
        let plan = PlanGeometry::new(first, min, max, size)
            .map_err(|err| bad(&format!("plan {min}..={max}: {err}")))?;
        plans.push(PlanEntry { plan, explicit });
    }
    let section = &bytes[start..r.at];
    if r.u32()? != crc32fast::hash(section) {
        return Err(bad("plans checksum mismatch"));
    }
    Ok(plans)
}

fn tier_byte(t: Tier) -> u8 {
    match t {
        Tier::Simple => 0,
        Tier::Compressed => 1,
        Tier::Summary => 2,
    }
}

fn bad(detail: &str) -> Error {
    Error::Corrupt {
        key: "dump".into(),
        detail: detail.into(),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| bad("truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| bad("truncated"))?,
        ))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| bad("truncated"))?,
        ))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| bad("truncated"))?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn dump() -> Dump {
        let schema = KeySchema::new("elk", 2).unwrap();
        let records = (1..=3)
            .map(|pid| CompletedRecord {
                pid,
                min_id: pid * 10 - 9,
                max_id: pid * 10,
                worker: Arc::from("w1"),
                completed_at_ms: 1_719_234_405_000 + pid,
                duration_ms: 1000,
            })
            .collect();
        let mut dict = WorkerDict::new();
        dict.insert("w1").unwrap();
        let batch = DumpBatch {
            id: 0,
            tier: Tier::Simple,
            records,
        };
        let mut dump = Dump::new(&schema, 1_719_300_000_000, dict, vec![batch]);
        dump.plans = vec![
            PlanEntry {
                plan: PlanGeometry::new(1, 1, 95, 10).unwrap(),
                explicit: false,
            },
            PlanEntry {
                plan: PlanGeometry::new(11, 500, 599, 100).unwrap(),
                explicit: true,
            },
        ];
        dump
    }

    /// Where the plans section of `bytes` starts: after the header and the dictionary.
    fn plans_at(d: &Dump, bytes: &[u8]) -> (usize, usize) {
        let header_end = 8 + 2 + 4 + 8 * 5 + 2 + d.namespace.len();
        let dict_len =
            u32::from_le_bytes(bytes[header_end + 4..header_end + 8].try_into().unwrap());
        (header_end, header_end + 4 + 4 + dict_len as usize + 4)
    }

    #[test]
    fn plans_travel_with_the_dump() {
        let d = dump();
        let bytes = d.to_bytes().unwrap();
        assert_eq!(Dump::from_bytes(&bytes).unwrap(), d);
        // The plans section is checksummed like the rest.
        let (_, at) = plans_at(&d, &bytes);
        for at in at..at + 4 + 2 * 33 + 4 {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(Dump::from_bytes(&bad).is_err(), "flip at {at}");
        }
    }

    /// A version 1 dump (no plans section) still reads, with no plans.
    #[test]
    fn version_1_reads_without_plans() {
        let mut d = dump();
        d.plans.clear();
        let v2 = d.to_bytes().unwrap();
        let (header_end, plans_at) = plans_at(&d, &v2);
        let mut v1 = v2[..header_end].to_vec();
        v1[8..10].copy_from_slice(&1u16.to_le_bytes());
        v1.extend(crc32fast::hash(&v1).to_le_bytes());
        v1.extend(&v2[header_end + 4..plans_at]);
        v1.extend(&v2[plans_at + 8..]);
        assert_eq!(Dump::from_bytes(&v1).unwrap(), d);
        let mut v3 = v2.clone();
        v3[8..10].copy_from_slice(&3u16.to_le_bytes());
        let err = Dump::from_bytes(&v3).unwrap_err().to_string();
        assert!(err.contains("version 3"), "{err}");
    }
}
