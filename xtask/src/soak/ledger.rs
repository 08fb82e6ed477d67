//! Reading the ledgers back, and the oracles over them: every planned ID processed, no
//! range run by two live workers at once, no chunk outliving its worker, and the
//! throughput per second.

use std::collections::HashMap;
use std::path::Path;

use super::fleet::Incarnation;

/// One run of one chunk, as its ledger lines tell it.
#[derive(Debug, Clone)]
pub(crate) struct ChunkRun {
    pub(crate) partition: u64,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) worker: String,
    pub(crate) chunk_pid: u32,
    pub(crate) start_us: u64,
    /// The END (or KILL, PANIC) line's time; None when the chunk wrote none.
    pub(crate) end_us: Option<u64>,
    /// `END`, `KILL`, `PANIC` or empty.
    pub(crate) end: &'static str,
}

/// Every chunk run of every ledger file under `dir`, and the count of lines that did
/// not parse (a torn line would be a harness bug).
pub(crate) fn read(dir: &Path) -> (Vec<ChunkRun>, u64) {
    let mut runs: Vec<ChunkRun> = Vec::new();
    let mut bad = 0;
    // Open runs by (worker, chunk pid, from): the index of their START.
    let mut open: HashMap<(String, u32, u64), Vec<usize>> = HashMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let parsed = (|| {
                let [what, pid, from, to, worker, cpid, t] = f.as_slice() else {
                    return None;
                };
                Some((
                    *what,
                    pid.parse::<u64>().ok()?,
                    from.parse::<u64>().ok()?,
                    to.parse::<u64>().ok()?,
                    worker.to_string(),
                    cpid.parse::<u32>().ok()?,
                    t.parse::<u64>().ok()?,
                ))
            })();
            let Some((what, partition, from, to, worker, chunk_pid, t)) = parsed else {
                bad += 1;
                continue;
            };
            let key = (worker.clone(), chunk_pid, from);
            match what {
                "START" => {
                    open.entry(key).or_default().push(runs.len());
                    runs.push(ChunkRun {
                        partition,
                        from,
                        to,
                        worker,
                        chunk_pid,
                        start_us: t,
                        end_us: None,
                        end: "",
                    });
                }
                "END" | "KILL" | "PANIC" => {
                    let Some(i) = open.get_mut(&key).and_then(|v| {
                        let first = *v.first()?;
                        v.remove(0);
                        Some(first)
                    }) else {
                        bad += 1;
                        continue;
                    };
                    runs[i].end_us = Some(t);
                    runs[i].end = match what {
                        "END" => "END",
                        "KILL" => "KILL",
                        _ => "PANIC",
                    };
                }
                _ => bad += 1,
            }
        }
    }
    (runs, bad)
}

/// IDs of `planned` (inclusive ranges) that no END line covers, and the first gaps.
pub(crate) fn lost(runs: &[ChunkRun], planned: &[(u64, u64)]) -> (u64, Vec<(u64, u64)>) {
    let mut done: Vec<(u64, u64)> = runs
        .iter()
        .filter(|r| r.end == "END")
        .map(|r| (r.from, r.to))
        .collect();
    done.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in done {
        match merged.last_mut() {
            Some((_, end)) if a <= end.saturating_add(1) => *end = (*end).max(b),
            _ => merged.push((a, b)),
        }
    }
    let mut lost = 0;
    let mut gaps = Vec::new();
    for &(min, max) in planned {
        let mut next = min;
        for &(a, b) in &merged {
            if b < next {
                continue;
            }
            if a > max {
                break;
            }
            if a > next {
                lost += a - next;
                gaps.push((next, a - 1));
            }
            next = b.saturating_add(1);
            if next > max {
                break;
            }
        }
        if next <= max {
            lost += max - next + 1;
            gaps.push((next, max));
        }
    }
    gaps.truncate(10);
    (lost, gaps)
}

/// A pair of chunk runs of intersecting ranges, by two incarnations, at the same time.
#[derive(Debug, Clone)]
pub(crate) struct Overlap {
    pub(crate) a: ChunkRun,
    pub(crate) b: ChunkRun,
    /// How long both ran, in ms.
    pub(crate) both_ms: f64,
}

/// Every overlap; a run without an end line lasts until its incarnation ended (or
/// `run_end_us`).
pub(crate) fn overlaps(
    runs: &[ChunkRun],
    incarnations: &[Incarnation],
    run_end_us: u64,
) -> Vec<Overlap> {
    let ended: HashMap<&str, u64> = incarnations
        .iter()
        .map(|i| (i.name.as_str(), i.ended_us.unwrap_or(run_end_us)))
        .collect();
    let end_of = |r: &ChunkRun| {
        r.end_us
            .unwrap_or_else(|| ended.get(r.worker.as_str()).copied().unwrap_or(run_end_us))
    };
    let mut by_partition: HashMap<u64, Vec<&ChunkRun>> = HashMap::new();
    for r in runs {
        by_partition.entry(r.partition).or_default().push(r);
    }
    let mut found = Vec::new();
    for list in by_partition.values() {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.worker == b.worker || a.to < b.from || b.to < a.from {
                    continue;
                }
                let (ea, eb) = (end_of(a), end_of(b));
                let both = ea.min(eb) as i64 - a.start_us.max(b.start_us) as i64;
                if both > 0 {
                    found.push(Overlap {
                        a: (*a).clone(),
                        b: (*b).clone(),
                        both_ms: both as f64 / 1000.0,
                    });
                }
            }
        }
    }
    found.sort_by_key(|o| o.a.start_us.min(o.b.start_us));
    found
}

/// Chunk lines written after their worker was seen dead: an END (work finished by an
/// orphan) or a START at any time after, a KILL more than `slack_us` after.
pub(crate) fn outlived(runs: &[ChunkRun], incarnations: &[Incarnation]) -> Vec<(ChunkRun, u64)> {
    let slack_us = 500_000;
    let ended: HashMap<&str, u64> = incarnations
        .iter()
        .filter_map(|i| Some((i.name.as_str(), i.ended_us?)))
        .collect();
    let mut found = Vec::new();
    for r in runs {
        let Some(&dead) = ended.get(r.worker.as_str()) else {
            continue;
        };
        let late = r.start_us > dead
            || match (r.end, r.end_us) {
                ("END", Some(t)) => t > dead,
                (_, Some(t)) => t > dead + slack_us,
                _ => false,
            };
        if late {
            found.push((r.clone(), dead));
        }
    }
    found
}

/// IDs finished per second since `t0_us` (END lines), `seconds` buckets.
pub(crate) fn throughput(runs: &[ChunkRun], t0_us: u64, seconds: usize) -> Vec<f64> {
    let mut per = vec![0.0; seconds];
    for r in runs.iter().filter(|r| r.end == "END") {
        let Some(t) = r.end_us else { continue };
        let s = (t.saturating_sub(t0_us) / 1_000_000) as usize;
        if s < seconds {
            per[s] += (r.to - r.from + 1) as f64;
        }
    }
    per
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(worker: &str, from: u64, to: u64, start: u64, end: Option<u64>) -> ChunkRun {
        ChunkRun {
            partition: 1,
            from,
            to,
            worker: worker.into(),
            chunk_pid: 1,
            start_us: start,
            end_us: end,
            end: if end.is_some() { "END" } else { "" },
        }
    }

    #[test]
    fn lost_counts_the_gaps() {
        let runs = [run("a", 1, 10, 0, Some(1)), run("a", 16, 20, 0, Some(1))];
        assert_eq!(lost(&runs, &[(1, 25)]), (10, vec![(11, 15), (21, 25)]));
    }

    #[test]
    fn an_open_run_lasts_until_its_worker_died() {
        let inc = |name: &str, ended| Incarnation {
            name: name.into(),
            pid: 0,
            started_us: 0,
            ended_us: ended,
            end: String::new(),
        };
        let runs = [run("a", 1, 10, 0, None), run("b", 5, 10, 50, Some(60))];
        assert_eq!(
            overlaps(&runs, &[inc("a", Some(40)), inc("b", None)], 99).len(),
            0
        );
        assert_eq!(
            overlaps(&runs, &[inc("a", Some(55)), inc("b", None)], 99).len(),
            1
        );
        let late = [run("a", 1, 10, 0, Some(70))];
        assert_eq!(outlived(&late, &[inc("a", Some(55))]).len(), 1);
    }
}
