//! The JSON-lines export (`tranche export --jsonl`) and its way back (`tranche import`).
//!
//! The first line is a header object that carries what the records alone cannot: the
//! namespace's shard count, batch size and plan registry, so that an import answers for
//! every pid and never issues an archived one again, exactly as from a dump. Every
//! other line is one archived partition in the seed's JSON
//! (`{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1",...}`), in
//! pid order within each batch. The header is told apart by its `tranche_jsonl` field,
//! which no record has.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tranche_archive_store::{Dump, DumpBatch, Tier};
use tranche_codec::{CompletedRecord, KeySchema, PlanGeometry, WorkerDict, decode_json};

/// The format version written in the header.
const VERSION: u32 = 1;

/// The header line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    /// The format version; its presence marks the line as the header.
    tranche_jsonl: u32,
    namespace: String,
    shards: u32,
    batch_size: u64,
    plans: Vec<HeaderPlan>,
}

/// One plan of the registry, as a `PlanEntry` holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderPlan {
    first_pid: u64,
    min_id: u64,
    max_id: u64,
    size: u64,
    explicit: bool,
}

/// Whether `bytes` look like JSON lines rather than a binary dump: the first byte that
/// is not white space is `{` (a dump starts with its magic, `TRDUMP01`).
pub(crate) fn looks_like_jsonl(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// `dump` as JSON lines: the header, then one record per line.
pub(crate) fn write(dump: &Dump) -> String {
    let header = Header {
        tranche_jsonl: VERSION,
        namespace: dump.namespace.clone(),
        shards: dump.num_shards,
        batch_size: dump.batch_size,
        plans: dump
            .plans
            .iter()
            .map(|p| HeaderPlan {
                first_pid: p.plan.first_pid(),
                min_id: p.plan.min(),
                max_id: p.plan.max(),
                size: p.plan.size(),
                explicit: p.explicit,
            })
            .collect(),
    };
    // Serializing plain structs of numbers and strings cannot fail.
    let mut out = serde_json::to_string(&header).unwrap_or_default();
    out.push('\n');
    out.push_str(&dump.to_json_lines());
    out
}

/// Reads JSON lines written by [`write`] back into a dump whose batches are all in
/// `tier`. Blank lines are skipped; anything else that is not the header (first) or a
/// record is an error naming its line.
pub(crate) fn read(text: &str, created_ms: u64, tier: Tier) -> Result<Dump> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((n, first)) = lines.next() else {
        bail!("empty file");
    };
    let header: Header = serde_json::from_str(first).with_context(|| {
        format!(
            "line {}: not the header of `tranche export --jsonl` (an export of an older version has none: its plans are missing)",
            n + 1
        )
    })?;
    if header.tranche_jsonl != VERSION {
        bail!(
            "JSON lines format version {} is not {VERSION}",
            header.tranche_jsonl
        );
    }
    let schema =
        KeySchema::new(&header.namespace, header.shards)?.with_batch_size(header.batch_size)?;
    let plans = header
        .plans
        .iter()
        .map(|p| {
            Ok(tranche_codec::PlanEntry {
                plan: PlanGeometry::new(p.first_pid, p.min_id, p.max_id, p.size)
                    .with_context(|| format!("plan {}..={}", p.min_id, p.max_id))?,
                explicit: p.explicit,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut records: Vec<CompletedRecord> = Vec::new();
    for (n, line) in lines {
        let record = decode_json(line.trim()).with_context(|| format!("line {}", n + 1))?;
        check_record(&record).with_context(|| format!("line {}", n + 1))?;
        records.push(record);
    }
    let mut dump = dump_of(&schema, records, created_ms, tier)?;
    dump.plans = plans;
    Ok(dump)
}

/// The longest worker id a record may carry: the active store's limit for the worker
/// ids it registers, so an import holds no worker a live run could not be.
pub(crate) const MAX_WORKER_ID: usize = 256;

/// The highest pid a plan issues (2^53, the active store's bound).
const MAX_PID: u64 = 1 << 53;

/// Refuses an imported record with a field out of bounds: a pid outside
/// `1..=2^53`, a range upside down, a worker id empty, longer than
/// [`MAX_WORKER_ID`] bytes or holding a `|` (records are `|`-separated). The numbers
/// are otherwise whole `u64`s and the times were parsed exactly by the codec.
pub(crate) fn check_record(r: &CompletedRecord) -> Result<()> {
    if !(1..=MAX_PID).contains(&r.pid) {
        bail!("pid {} is outside 1..=2^53", r.pid);
    }
    if r.min_id > r.max_id {
        bail!(
            "partition {}: min_id {} is above max_id {}",
            r.pid,
            r.min_id,
            r.max_id
        );
    }
    let worker: &str = &r.worker;
    if worker.is_empty() || worker.len() > MAX_WORKER_ID || worker.contains('|') {
        let shown: String = worker.chars().take(40).collect();
        bail!(
            "partition {}: worker id `{shown}{}` ({} bytes) must be 1 to {MAX_WORKER_ID} bytes without '|'",
            r.pid,
            if shown.len() < worker.len() {
                "…"
            } else {
                ""
            },
            worker.len()
        );
    }
    Ok(())
}

/// A dump of `records` (in any order; a pid twice is an error) cut into the batches of
/// `schema`, every batch in `tier`, without plans.
pub(crate) fn dump_of(
    schema: &KeySchema,
    mut records: Vec<CompletedRecord>,
    created_ms: u64,
    tier: Tier,
) -> Result<Dump> {
    records.sort_unstable_by_key(|r| r.pid);
    if let Some(w) = records.windows(2).find(|w| w[0].pid == w[1].pid) {
        bail!("partition {} appears twice", w[0].pid);
    }
    let mut dict = WorkerDict::new();
    let mut batches: Vec<DumpBatch> = Vec::new();
    for r in records {
        if dict.index_of(&r.worker).is_none() {
            dict.insert(&r.worker)?;
        }
        let id = schema.batch_of(r.pid);
        match batches.last_mut() {
            Some(b) if b.id == id => b.records.push(r),
            _ => batches.push(DumpBatch {
                id,
                tier,
                records: vec![r],
            }),
        }
    }
    Ok(Dump::new(schema, created_ms, dict, batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_round_trips_with_its_plans() {
        let schema = KeySchema::new("ns", 3).unwrap();
        let rec = |pid: u64| CompletedRecord {
            pid,
            min_id: pid * 10 - 9,
            max_id: pid * 10,
            worker: format!("w{}", pid % 2).into(),
            completed_at_ms: 1_719_234_405_000 + pid,
            duration_ms: 295_000,
        };
        let mut dump = dump_of(&schema, vec![rec(250), rec(3), rec(101)], 7, Tier::Simple).unwrap();
        dump.plans = vec![tranche_codec::PlanEntry {
            plan: PlanGeometry::new(1, 1, 3000, 10).unwrap(),
            explicit: false,
        }];
        let text = write(&dump);
        assert!(looks_like_jsonl(text.as_bytes()));
        assert!(!looks_like_jsonl(b"TRDUMP01"));
        assert_eq!(text.lines().count(), 4, "{text}");
        let back = read(&text, 7, Tier::Simple).unwrap();
        assert_eq!(back, dump);
        assert!(read("{\"pid\":1}\n", 7, Tier::Simple).is_err());
        let twice = format!("{text}{}\n", text.lines().nth(1).unwrap());
        assert!(read(&twice, 7, Tier::Simple).is_err());
    }
}
