//! The seed's layout, one Redis hash of JSON per layer, adopted and rolled back:
//! `tranche import --from-hash` takes a job over from it, `tranche export --to-hash`
//! writes the archive back into it.
//!
//! Completed partitions are a hash of pid -> the seed's record
//! (`{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}`);
//! active ones a hash of pid -> `{"pid":..,"min_id":..,"max_id":..,"worker_id":..,
//! "status":"pending|claimed|running|failed","attempts":..}`. The plan is derived from
//! the partitions' ranges: one uniform plan when every partition has the same size and
//! they follow each other from pid 1 (the last may be shorter), one explicit range per
//! partition otherwise.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use tranche_active_store::{Carried, PlanEntry};
use tranche_archive_store::Tier;
use tranche_codec::{CompletedRecord, PlanGeometry, decode_json, encode_json};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::args::ImportArgs;
use crate::cli::common::Global;
use crate::cli::common::Outcome;

/// A partition of the seed's active hash. Fields this version does not use (lease
/// times, checkpoints) are ignored.
#[derive(Debug, Deserialize)]
struct SeedPartition {
    pid: u64,
    min_id: u64,
    max_id: u64,
    #[serde(default)]
    worker_id: Option<String>,
    status: String,
    #[serde(default)]
    attempts: u32,
}

/// What the two hashes hold, checked.
#[derive(Debug)]
struct Adoption {
    /// The plan registry they describe, from pid 1.
    entries: Vec<PlanEntry>,
    /// The completed records, in pid order.
    completed: Vec<CompletedRecord>,
    /// The unfinished partitions' state to carry over.
    carried: Vec<Carried>,
}

/// Reads the hashes' entries: `active` and `completed` as (field, value) pairs.
fn adoption(active: &[(String, String)], completed: &[(String, String)]) -> Result<Adoption> {
    let field_pid = |key: &str, field: &str, pid: u64| -> Result<()> {
        if field.parse::<u64>().ok() != Some(pid) {
            bail!("field {field:?} of {key} holds partition {pid}: the field must be its pid");
        }
        Ok(())
    };
    let mut done = Vec::with_capacity(completed.len());
    for (field, value) in completed {
        let r = decode_json(value)
            .with_context(|| format!("completed partition {field:?} is not the seed's record"))?;
        field_pid("the completed hash", field, r.pid)?;
        done.push(r);
    }
    done.sort_unstable_by_key(|r| r.pid);
    let mut carried = Vec::with_capacity(active.len());
    // (pid, min, max) of every partition, to derive the plan from.
    let mut ranges: Vec<(u64, u64, u64)> =
        done.iter().map(|r| (r.pid, r.min_id, r.max_id)).collect();
    for (field, value) in active {
        let p: SeedPartition = serde_json::from_str(value)
            .with_context(|| format!("active partition {field:?} is not a seed partition"))?;
        field_pid("the active hash", field, p.pid)?;
        let failed = match p.status.as_str() {
            "failed" => true,
            // Claimed and running ones were held by the old system's workers: pending
            // here, their attempts kept.
            "pending" | "claimed" | "running" => false,
            other => bail!(
                "active partition {} has status {other:?}, not pending, claimed, running or failed",
                p.pid
            ),
        };
        ranges.push((p.pid, p.min_id, p.max_id));
        carried.push(Carried {
            pid: p.pid,
            attempts: p.attempts,
            failed,
            worker: if failed {
                p.worker_id.unwrap_or_default()
            } else {
                String::new()
            },
        });
    }
    ranges.sort_unstable();
    carried.sort_unstable_by_key(|c| c.pid);
    Ok(Adoption {
        entries: derive_plans(&ranges)?,
        completed: done,
        carried,
    })
}

/// The plan registry that `ranges` (pid, min id, max id; sorted) describe.
fn derive_plans(ranges: &[(u64, u64, u64)]) -> Result<Vec<PlanEntry>> {
    let Some(&(_, first_min, first_max)) = ranges.first() else {
        bail!("both hashes are empty: nothing to import");
    };
    for (i, &(pid, min, max)) in ranges.iter().enumerate() {
        let want = i as u64 + 1;
        if pid != want {
            if pid < want {
                bail!("partition {pid} is in both hashes (or twice)");
            }
            bail!(
                "the partitions must be pids 1, 2, 3, … without a gap; pid {want} is in neither hash"
            );
        }
        if max < min {
            bail!("partition {pid} has max_id {max} below its min_id {min}");
        }
        if let Some(&(_, _, before)) = i.checked_sub(1).and_then(|j| ranges.get(j))
            && min <= before
        {
            bail!("partition {pid} ({min}..={max}) overlaps or precedes the partition before it");
        }
    }
    let &(last_pid, _, last_max) = ranges.last().unwrap_or(&(1, first_min, first_max));
    let size = first_max - first_min + 1;
    if let Ok(plan) = PlanGeometry::new(1, first_min, last_max, size)
        && plan.last_pid() == last_pid
        && ranges
            .iter()
            .all(|&(pid, min, max)| plan.range_of(pid) == Some(min..=max))
    {
        return Ok(vec![PlanEntry {
            plan,
            explicit: false,
        }]);
    }
    ranges
        .iter()
        .map(|&(pid, min, max)| {
            Ok(PlanEntry {
                plan: PlanGeometry::new(pid, min, max, max - min + 1)
                    .with_context(|| format!("partition {pid}"))?,
                explicit: true,
            })
        })
        .collect()
}

/// `tranche import --from-hash ACTIVE --completed-hash COMPLETED`.
pub(crate) async fn import(g: &Global, args: &ImportArgs) -> Result<Outcome> {
    if g.redis.is_none() && g.redis_file.is_none() {
        bail!("--from-hash and --completed-hash read hashes on Redis: give --redis");
    }
    let backend = Backend::open(&g.location(), Open::Create, Tuning::default()).await?;
    let read = |key: &Option<String>| {
        let backend = &backend;
        let key = key.clone();
        async move {
            match key {
                Some(key) => backend
                    .hash_entries(&key)
                    .await
                    .with_context(|| format!("cannot read the hash {key}")),
                None => Ok(Vec::new()),
            }
        }
    };
    let active = read(&args.from_hash).await?;
    let completed = read(&args.completed_hash).await?;
    let adoption = adoption(&active, &completed)?;
    let pending = adoption.carried.iter().filter(|c| !c.failed).count();
    let failed = adoption.carried.len() - pending;
    if !backend.is_empty().await? {
        // The same adoption again changes nothing; anything else is refused.
        let plans = backend.active.plans().await?;
        let archived = backend.stats.summary().await?.global_stats.total_completed;
        if plans == adoption.entries && archived >= adoption.completed.len() as u64 {
            crate::cli::common::say(
                g.json,
                format_args!(
                    "namespace `{}` on {} already holds these partitions: nothing changed",
                    backend.namespace,
                    backend.location()
                ),
                serde_json::json!({"namespace": backend.namespace, "changed": false}),
            );
            return Ok(Outcome::Success);
        }
        bail!(
            "namespace `{}` on {} is not empty and holds another job; import only adopts into an empty one",
            backend.namespace,
            backend.location()
        );
    }
    let pids: Vec<u64> = adoption.completed.iter().map(|r| r.pid).collect();
    backend
        .active
        .adopt(&adoption.entries, &pids)
        .await
        .context("the derived plan does not fit")?;
    backend.carry(&adoption.carried).await?;
    let schema = backend.schema()?;
    let tier = if pids.len() as u64 >= backend.archive_config.compressed_at {
        Tier::Compressed
    } else {
        Tier::Simple
    };
    let dump =
        crate::cli::jsonl::dump_of(&schema, adoption.completed, crate::duration::now_ms(), tier)?;
    let restored = backend.archive.import(&dump).await?;
    backend.register_namespace().await?;
    let plan = match adoption.entries.as_slice() {
        [e] if !e.explicit => format!(
            "one plan of {} partitions of {} IDs",
            e.plan.partitions(),
            e.plan.size()
        ),
        entries => format!("{} explicit ranges", entries.len()),
    };
    crate::cli::common::say(
        g.json,
        format_args!(
            "adopted {plan} into `{}` on {}: {restored} completed (archived), {pending} pending, {failed} failed",
            backend.namespace,
            backend.location()
        ),
        serde_json::json!({
            "namespace": backend.namespace, "changed": true, "plans": adoption.entries.len(),
            "completed": restored, "pending": pending, "failed": failed,
        }),
    );
    Ok(Outcome::Success)
}

/// `tranche export --to-hash KEY`: every archived record as `HSET KEY pid <seed JSON>`.
pub(crate) async fn export(backend: &Backend, key: &str, json: bool) -> Result<Outcome> {
    if backend.is_embedded() {
        bail!("--to-hash writes a hash on Redis: give --redis");
    }
    let mut written = 0u64;
    for entry in backend.active.plans().await? {
        let mut from = entry.plan.first_pid();
        let last = entry.plan.last_pid();
        loop {
            let page = backend.archive.range(from..=last, 10_000).await?;
            let pairs: Vec<(String, String)> = page
                .records
                .iter()
                .map(|r| (r.pid.to_string(), encode_json(&whole_seconds(r))))
                .collect();
            backend.write_hash(key, &pairs).await?;
            written += pairs.len() as u64;
            match page.next {
                Some(next) => from = next,
                None => break,
            }
        }
    }
    crate::cli::common::say(
        json,
        format_args!(
            "exported {written} records to the hash {key} on {}",
            backend.location()
        ),
        serde_json::json!({"exported": written, "hash": key}),
    );
    Ok(Outcome::Success)
}

/// `r` with its times cut to whole seconds: the seed's readers take `completed_at` and
/// `duration` as integers, which `encode_json` writes only for whole seconds.
fn whole_seconds(r: &CompletedRecord) -> CompletedRecord {
    CompletedRecord {
        completed_at_ms: r.completed_at_ms / 1000 * 1000,
        duration_ms: r.duration_ms / 1000 * 1000,
        ..r.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(ranges: &[(u64, u64, u64)]) -> Option<(u64, u64, u64)> {
        match derive_plans(ranges).ok()?.as_slice() {
            [e] if !e.explicit => Some((e.plan.min(), e.plan.max(), e.plan.size())),
            _ => None,
        }
    }

    #[test]
    fn plans_are_derived_from_the_ranges() {
        let seed = [(1, 1, 1000), (2, 1001, 2000), (3, 2001, 2500)];
        assert_eq!(uniform(&seed), Some((1, 2500, 1000)));
        let uneven = [(1, 1, 1000), (2, 1001, 1500), (3, 1501, 2500)];
        assert_eq!(uniform(&uneven), None);
        let explicit = derive_plans(&uneven).unwrap();
        assert_eq!(explicit.len(), 3);
        assert!(explicit.iter().all(|e| e.explicit));
        assert_eq!(explicit[1].plan.range_of(2), Some(1001..=1500));
        assert!(derive_plans(&[(1, 1, 10), (3, 21, 30)]).is_err(), "a gap");
        assert!(derive_plans(&[(1, 1, 10), (1, 1, 10)]).is_err(), "twice");
        assert!(derive_plans(&[(1, 1, 10), (2, 5, 30)]).is_err(), "overlap");
        assert!(derive_plans(&[]).is_err());
    }

    #[test]
    fn records_go_back_in_whole_seconds() {
        let r = CompletedRecord {
            pid: 4970,
            min_id: 4_969_001,
            max_id: 4_970_000,
            worker: "worker1".into(),
            completed_at_ms: 1_719_234_405_678,
            duration_ms: 295_999,
        };
        assert_eq!(
            encode_json(&whole_seconds(&r)),
            r#"{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}"#
        );
    }

    #[test]
    fn the_seed_layout_is_read() {
        let completed = [(
            "2".to_owned(),
            r#"{"pid":2,"min_id":1001,"max_id":2000,"worker_id":"worker1","completed_at":1719234405,"duration":295}"#.to_owned(),
        )];
        let active = [
            (
                "1".to_owned(),
                r#"{"pid":1,"min_id":1,"max_id":1000,"worker_id":"w9","status":"running","attempts":2}"#.to_owned(),
            ),
            (
                "3".to_owned(),
                r#"{"pid":3,"min_id":2001,"max_id":3000,"worker_id":"w9","status":"failed","attempts":5}"#.to_owned(),
            ),
        ];
        let a = adoption(&active, &completed).unwrap();
        assert_eq!(a.entries.len(), 1);
        assert_eq!(a.completed[0].pid, 2);
        assert_eq!(
            a.carried,
            [
                Carried {
                    pid: 1,
                    attempts: 2,
                    failed: false,
                    worker: String::new()
                },
                Carried {
                    pid: 3,
                    attempts: 5,
                    failed: true,
                    worker: "w9".into()
                },
            ]
        );
        let wrong_field = [("7".to_owned(), completed[0].1.clone())];
        assert!(adoption(&active, &wrong_field).is_err());
    }
}
