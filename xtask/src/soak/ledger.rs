//! Reading the ledgers back, and the oracles over them: every planned ID processed, no
//! range run by two live workers at once, no chunk outliving its worker, and the
//! throughput per second.
//!
//! A million-partition run writes a few million lines: the ledgers are read line by
//! line into compact runs (worker names interned), and every oracle sorts by range or
//! goes through once, none compares all pairs.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::Path;

use super::fleet::Incarnation;

/// How a chunk run's last line ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// No end line: still running, or its worker died.
    Open,
    /// Finished.
    End,
    /// SIGTERMed by its worker (lease lost, drain).
    Kill,
    /// The runner's handler panicked in it.
    Panic,
}

impl Ending {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Ending::Open => "no end line",
            Ending::End => "END",
            Ending::Kill => "KILL",
            Ending::Panic => "PANIC",
        }
    }
}

/// One run of one chunk, as its ledger lines tell it.
#[derive(Debug, Clone)]
pub(crate) struct ChunkRun {
    pub(crate) partition: u64,
    pub(crate) from: u64,
    pub(crate) to: u64,
    /// The incarnation, an index into [`Ledgers::workers`].
    pub(crate) worker: u32,
    pub(crate) chunk_pid: u32,
    pub(crate) start_us: u64,
    /// The END (or KILL, PANIC) line's time; None when the chunk wrote none.
    pub(crate) end_us: Option<u64>,
    pub(crate) end: Ending,
}

/// Every chunk run of every ledger, the incarnation names they use, the count of lines
/// that did not parse (torn: two writers' lines run into each other, or one cut short)
/// and of end lines with no open START before them (unpaired).
#[derive(Debug, Default)]
pub(crate) struct Ledgers {
    pub(crate) runs: Vec<ChunkRun>,
    pub(crate) workers: Vec<String>,
    pub(crate) bad: u64,
    pub(crate) unpaired: u64,
    /// The first torn lines, for the report.
    pub(crate) torn: Vec<String>,
}

impl Ledgers {
    /// The name of run `r`'s incarnation.
    pub(crate) fn worker(&self, r: &ChunkRun) -> &str {
        &self.workers[r.worker as usize]
    }

    /// Per worker index, when its incarnation was seen dead (None: never, or unknown).
    fn deaths(&self, incarnations: &[Incarnation]) -> Vec<Option<u64>> {
        let ended: HashMap<&str, Option<u64>> = incarnations
            .iter()
            .map(|i| (i.name.as_str(), i.ended_us))
            .collect();
        self.workers
            .iter()
            .map(|w| ended.get(w.as_str()).copied().flatten())
            .collect()
    }
}

/// Reads every ledger file under `dir`, line by line.
pub(crate) fn read(dir: &Path) -> Ledgers {
    let mut out = Ledgers::default();
    let mut names: HashMap<String, u32> = HashMap::new();
    // Open runs by (worker, chunk pid, from): the indices of their STARTs, oldest first.
    let mut open: HashMap<(u32, u32, u64), VecDeque<usize>> = HashMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let Ok(f) = std::fs::File::open(&file) else {
            continue;
        };
        for line in std::io::BufReader::with_capacity(1 << 16, f).lines() {
            let Ok(line) = line else {
                out.bad += 1;
                continue;
            };
            let Some((what, partition, from, to, worker, chunk_pid, t)) = parse(&line) else {
                out.bad += 1;
                if out.torn.len() < 5 {
                    out.torn.push(line.chars().take(200).collect());
                }
                continue;
            };
            let worker = match names.get(worker) {
                Some(&i) => i,
                None => {
                    let i = out.workers.len() as u32;
                    out.workers.push(worker.to_owned());
                    names.insert(worker.to_owned(), i);
                    i
                }
            };
            let key = (worker, chunk_pid, from);
            let end = match what {
                "START" => {
                    open.entry(key).or_default().push_back(out.runs.len());
                    out.runs.push(ChunkRun {
                        partition,
                        from,
                        to,
                        worker,
                        chunk_pid,
                        start_us: t,
                        end_us: None,
                        end: Ending::Open,
                    });
                    continue;
                }
                "END" => Ending::End,
                "KILL" => Ending::Kill,
                "PANIC" => Ending::Panic,
                _ => {
                    out.bad += 1;
                    if out.torn.len() < 5 {
                        out.torn.push(line.chars().take(200).collect());
                    }
                    continue;
                }
            };
            let Some(queue) = open.get_mut(&key) else {
                out.unpaired += 1;
                continue;
            };
            let i = queue.pop_front().expect("no empty queue is kept");
            if queue.is_empty() {
                open.remove(&key);
            }
            out.runs[i].end_us = Some(t);
            out.runs[i].end = end;
        }
    }
    out
}

/// `WHAT partition from to worker chunk_pid time_us`.
fn parse(line: &str) -> Option<(&str, u64, u64, u64, &str, u32, u64)> {
    let mut f = line.split(' ');
    let parsed = (
        f.next()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    f.next().is_none().then_some(parsed)
}

/// IDs of `planned` (inclusive ranges) that no END line covers, and the first gaps.
pub(crate) fn lost(runs: &[ChunkRun], planned: &[(u64, u64)]) -> (u64, Vec<(u64, u64)>) {
    let mut done: Vec<(u64, u64)> = runs
        .iter()
        .filter(|r| r.end == Ending::End)
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
        // The first merged range that ends at or after `min`.
        let first = merged.partition_point(|&(_, b)| b < min);
        for &(a, b) in &merged[first..] {
            if a > max {
                break;
            }
            if a > next {
                lost += a - next;
                gaps.push((next, a - 1));
            }
            next = next.max(b.saturating_add(1));
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

/// A pair of chunk runs of intersecting ranges at the same time: by two incarnations,
/// or by one (both runs with an end line: a run without one is only known to have
/// ended by its incarnation's death, which says nothing within the incarnation).
#[derive(Debug, Clone)]
pub(crate) struct Overlap {
    pub(crate) a: ChunkRun,
    pub(crate) b: ChunkRun,
    /// How long both ran, in ms.
    pub(crate) both_ms: f64,
}

/// Every overlap; a run without an end line lasts until its incarnation ended (or
/// `run_end_us`), or until its incarnation was frozen if it is one of `frozen`: the
/// incarnations whose work runs in their own process (a runner's handler), with the
/// intervals (µs) they were SIGSTOPped for longer than a lease. Such work does nothing
/// while its process is stopped and is not polled again after the thaw (`job/mod.rs`):
/// the runner drops it, writing its KILL line then, so a run of it that was open at
/// the stop and ended in a KILL (or in no line) ended when the stop began; one that
/// went on after the thaw would have written its END. Runs sorted by their first ID,
/// each is compared with those that start inside its range only: O(n log n) plus the
/// re-runs of each range.
pub(crate) fn overlaps(
    ledgers: &Ledgers,
    incarnations: &[Incarnation],
    frozen: &[(String, u64, u64)],
    run_end_us: u64,
) -> Vec<Overlap> {
    let runs = &ledgers.runs;
    let deaths = ledgers.deaths(incarnations);
    let freezes = Freezes::new(ledgers, frozen);
    let end_of = |r: &ChunkRun| match (r.end_us, freezes.stopped(r)) {
        (Some(t), Some(frozen)) => t.min(frozen),
        (Some(t), None) => t,
        (None, Some(frozen)) => frozen,
        (None, None) => deaths[r.worker as usize].unwrap_or(run_end_us),
    };
    let mut order: Vec<u32> = (0..runs.len() as u32).collect();
    order.sort_unstable_by_key(|&i| (runs[i as usize].from, runs[i as usize].start_us));
    let mut found = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let a = &runs[i as usize];
        for &j in &order[k + 1..] {
            let b = &runs[j as usize];
            if b.from > a.to {
                break;
            }
            if a.worker == b.worker && (a.end_us.is_none() || b.end_us.is_none()) {
                continue;
            }
            let (ea, eb) = (end_of(a), end_of(b));
            let both = ea.min(eb) as i64 - a.start_us.max(b.start_us) as i64;
            if both > 0 {
                found.push(Overlap {
                    a: a.clone(),
                    b: b.clone(),
                    both_ms: both as f64 / 1000.0,
                });
            }
        }
    }
    found.sort_by_key(|o| o.a.start_us.min(o.b.start_us));
    found
}

/// Per worker index, the intervals (µs) its process was frozen, earliest first.
struct Freezes(Vec<Vec<(u64, u64)>>);

impl Freezes {
    fn new(ledgers: &Ledgers, frozen: &[(String, u64, u64)]) -> Freezes {
        let mut by = vec![Vec::new(); ledgers.workers.len()];
        for (name, from, to) in frozen {
            if let Some(i) = ledgers.workers.iter().position(|w| w == name) {
                by[i].push((*from, *to));
            }
        }
        by.iter_mut().for_each(|f| f.sort_unstable());
        Freezes(by)
    }

    /// Where a run that never finished (no end line, or a KILL) stopped at a freeze:
    /// the first one it was open at (its START written before the process actually
    /// stopped, maybe just after the stop was decided). A finished run (END, PANIC) ran
    /// at its end, so it was not stopped.
    fn stopped(&self, r: &ChunkRun) -> Option<u64> {
        if !matches!(r.end, Ending::Open | Ending::Kill) {
            return None;
        }
        self.0[r.worker as usize]
            .iter()
            .find(|(_, to)| r.start_us < *to)
            .map(|&(from, _)| from.max(r.start_us))
            .filter(|&from| r.end_us.is_none_or(|t| t > from))
    }
}

/// How many runs that never finished [`overlaps`] reads as ended at a freeze of theirs.
pub(crate) fn ended_at_a_freeze(ledgers: &Ledgers, frozen: &[(String, u64, u64)]) -> u64 {
    let freezes = Freezes::new(ledgers, frozen);
    ledgers
        .runs
        .iter()
        .filter(|r| freezes.stopped(r).is_some())
        .count() as u64
}

/// How late a chunk's line may land after its worker died. When a worker dies its
/// chunks' lifeline pipe reaches end-of-file and their watcher kills the group
/// (`job/guard.rs`), as soon as the scheduler runs it: until then a chunk that was starting
/// writes its START, one that was finishing its END. On a loaded machine that takes
/// milliseconds (the 30-minute runs saw up to 21 ms); the bound is a chunk gone
/// within 1 s, and no other worker can hold the range before the dead one's lease
/// (at least 500 ms) expires.
const SLACK_US: u64 = 500_000;

/// Chunk lines written more than [`SLACK_US`] after their worker was seen dead: a
/// START, an END (work finished by an orphan) or a KILL.
pub(crate) fn outlived(ledgers: &Ledgers, incarnations: &[Incarnation]) -> Vec<(ChunkRun, u64)> {
    let deaths = ledgers.deaths(incarnations);
    let mut found = Vec::new();
    for r in &ledgers.runs {
        let Some(dead) = deaths[r.worker as usize] else {
            continue;
        };
        let late = r.start_us > dead + SLACK_US || r.end_us.is_some_and(|t| t > dead + SLACK_US);
        if late {
            found.push((r.clone(), dead));
        }
    }
    found
}

/// IDs finished per second since `t0_us` (END lines), `seconds` buckets.
pub(crate) fn throughput(runs: &[ChunkRun], t0_us: u64, seconds: usize) -> Vec<f64> {
    let mut per = vec![0.0; seconds];
    for r in runs.iter().filter(|r| r.end == Ending::End) {
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
    use super::super::fleet::Kind;
    use super::*;

    fn run(worker: u32, from: u64, to: u64, start: u64, end: Option<u64>) -> ChunkRun {
        ChunkRun {
            partition: 1,
            from,
            to,
            worker,
            chunk_pid: 1,
            start_us: start,
            end_us: end,
            end: if end.is_some() {
                Ending::End
            } else {
                Ending::Open
            },
        }
    }

    fn ledgers(runs: Vec<ChunkRun>) -> Ledgers {
        Ledgers {
            runs,
            workers: vec!["a".into(), "b".into(), "c".into()],
            ..Ledgers::default()
        }
    }

    fn inc(name: &str, ended: Option<u64>) -> Incarnation {
        Incarnation {
            name: name.into(),
            kind: Kind::Exec,
            pid: 0,
            started_us: 0,
            ended_us: ended,
            end: String::new(),
        }
    }

    #[test]
    fn lost_counts_the_gaps() {
        let runs = [run(0, 1, 10, 0, Some(1)), run(0, 16, 20, 0, Some(1))];
        assert_eq!(lost(&runs, &[(1, 25)]), (10, vec![(11, 15), (21, 25)]));
        // A range covered by a wider run before it, and a second plan.
        let runs = [
            run(0, 1, 30, 0, Some(1)),
            run(1, 5, 8, 0, Some(1)),
            run(0, 41, 50, 0, Some(1)),
        ];
        assert_eq!(lost(&runs, &[(1, 25), (31, 50)]), (10, vec![(31, 40)]));
    }

    #[test]
    fn an_open_run_lasts_until_its_worker_died() {
        let l = ledgers(vec![run(0, 1, 10, 0, None), run(1, 5, 10, 50, Some(60))]);
        assert_eq!(
            overlaps(&l, &[inc("a", Some(40)), inc("b", None)], &[], 99).len(),
            0
        );
        assert_eq!(
            overlaps(&l, &[inc("a", Some(55)), inc("b", None)], &[], 99).len(),
            1
        );
        // A line past the slack is an orphan at work; within it, a chunk the watcher
        // had not been scheduled to kill yet.
        let late = ledgers(vec![run(0, 1, 10, 0, Some(55 + SLACK_US + 1))]);
        assert_eq!(outlived(&late, &[inc("a", Some(55))]).len(), 1);
        let printing = ledgers(vec![run(0, 1, 10, 0, Some(55 + 21_000))]);
        assert_eq!(outlived(&printing, &[inc("a", Some(55))]).len(), 0);
        let started = ledgers(vec![run(0, 1, 10, 55 + SLACK_US + 1, None)]);
        assert_eq!(outlived(&started, &[inc("a", Some(55))]).len(), 1);
        let starting = ledgers(vec![run(0, 1, 10, 56, None)]);
        assert_eq!(outlived(&starting, &[inc("a", Some(55))]).len(), 0);
    }

    /// An open run of in-process work ended when its process was frozen; one that
    /// wrote its END after the thaw ran on, and an open run of another incarnation
    /// (an `--exec` chunk runs on while its worker is frozen) lasts as before.
    #[test]
    fn an_open_run_of_frozen_work_ended_at_the_freeze() {
        let frozen = [("a".to_owned(), 100, 800)];
        let incs = [inc("a", None), inc("b", None), inc("c", None)];
        let dropped = ledgers(vec![run(0, 1, 10, 90, None), run(1, 1, 10, 400, Some(500))]);
        assert_eq!(overlaps(&dropped, &incs, &frozen, 999).len(), 0);
        assert_eq!(ended_at_a_freeze(&dropped, &frozen), 1);
        assert_eq!(overlaps(&dropped, &incs, &[], 999).len(), 1);
        let resumed = ledgers(vec![
            run(0, 1, 10, 90, Some(801)),
            run(1, 1, 10, 400, Some(500)),
        ]);
        assert_eq!(overlaps(&resumed, &incs, &frozen, 999).len(), 1);
        let exec = ledgers(vec![run(2, 1, 10, 90, None), run(1, 1, 10, 400, Some(500))]);
        assert_eq!(overlaps(&exec, &incs, &frozen, 999).len(), 1);
        // Started after the thaw: the freeze before it does not end it.
        let later = ledgers(vec![
            run(0, 1, 10, 850, None),
            run(1, 1, 10, 900, Some(950)),
        ]);
        assert_eq!(overlaps(&later, &incs, &frozen, 999).len(), 1);
        // The runner writes a KILL when it drops the chunk at the first poll after the
        // thaw: the chunk still stopped at the freeze. Dropped before the freeze, it
        // stopped at its KILL.
        let kill = |start, end| ChunkRun {
            end: Ending::Kill,
            ..run(0, 1, 10, start, Some(end))
        };
        let thawed = ledgers(vec![kill(90, 801), run(1, 1, 10, 400, Some(500))]);
        assert_eq!(overlaps(&thawed, &incs, &frozen, 999).len(), 0);
        assert_eq!(ended_at_a_freeze(&thawed, &frozen), 1);
        assert_eq!(overlaps(&thawed, &incs, &[], 999).len(), 1);
        let before = ledgers(vec![kill(10, 60), run(1, 1, 10, 50, Some(70))]);
        assert_eq!(overlaps(&before, &incs, &frozen, 999).len(), 1);
        assert_eq!(ended_at_a_freeze(&before, &frozen), 0);
    }

    /// A runner's chunk dropped when its lease was lost (no freeze) ends at its KILL
    /// line: a later run of its range by another incarnation is no overlap.
    #[test]
    fn a_dropped_chunk_ends_at_its_kill_line() {
        let incs = [inc("a", None), inc("b", None)];
        let dropped = ledgers(vec![
            ChunkRun {
                end: Ending::Kill,
                ..run(0, 1, 10, 100, Some(150))
            },
            run(1, 1, 10, 5_000, Some(5_100)),
        ]);
        assert_eq!(overlaps(&dropped, &incs, &[], 9_999).len(), 0);
        let open = ledgers(vec![
            run(0, 1, 10, 100, None),
            run(1, 1, 10, 5_000, Some(5_100)),
        ]);
        assert_eq!(overlaps(&open, &incs, &[], 9_999).len(), 1);
    }

    /// Overlaps are found whatever the order of the runs, a wide run against the
    /// narrow ones inside it included, and only between two incarnations.
    #[test]
    fn overlaps_are_found_by_range_not_by_order() {
        let l = ledgers(vec![
            run(1, 501, 750, 10, Some(20)),
            run(0, 1, 1000, 0, Some(100)),
            run(1, 1, 250, 200, Some(300)),
            run(2, 751, 1000, 50, Some(60)),
            run(0, 1001, 2000, 0, Some(100)),
            run(1, 1001, 2000, 100, Some(200)),
        ]);
        let found = overlaps(&l, &[], &[], 999);
        let pairs: Vec<_> = found
            .iter()
            .map(|o| (o.a.from.min(o.b.from), o.a.to.max(o.b.to)))
            .collect();
        assert_eq!(pairs, vec![(1, 1000), (1, 1000)], "{found:?}");
    }

    /// One incarnation running one range twice at once is an overlap; running it
    /// again after the first run ended, or a run with no end line, is not.
    #[test]
    fn one_worker_running_a_range_twice_at_once_overlaps() {
        let incs = [inc("a", None)];
        let twice = ledgers(vec![
            run(0, 1, 10, 100, Some(200)),
            run(0, 1, 10, 150, Some(250)),
        ]);
        assert_eq!(overlaps(&twice, &incs, &[], 999).len(), 1);
        let again = ledgers(vec![
            run(0, 1, 10, 100, Some(200)),
            run(0, 1, 10, 201, Some(250)),
        ]);
        assert_eq!(overlaps(&again, &incs, &[], 999).len(), 0);
        let open = ledgers(vec![
            run(0, 1, 10, 100, None),
            run(0, 1, 10, 150, Some(250)),
        ]);
        assert_eq!(overlaps(&open, &incs, &[], 999).len(), 0);
    }

    #[test]
    fn a_ledger_is_read_line_by_line_and_torn_lines_counted() {
        let dir = std::env::temp_dir().join(format!("soak-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("w0.log"),
            "START 1 1 250 w0.0 7 100\nSTART 1 251 500 w0.0 8 101\nEND 1 1 250 w0.0 7 150\n\
             KILL 1 251 500 w0.0 8 160\nEND 1 1 250 w0.0 7\nSTART 2 1001 2000 w0.1 9 170\n",
        )
        .unwrap();
        let l = read(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((l.bad, l.unpaired), (1, 0));
        assert_eq!(l.torn, vec!["END 1 1 250 w0.0 7".to_owned()]);
        assert_eq!(l.runs.len(), 3);
        assert_eq!((l.runs[0].end, l.runs[0].end_us), (Ending::End, Some(150)));
        assert_eq!(l.runs[1].end, Ending::Kill);
        assert_eq!(l.runs[2].end, Ending::Open);
        assert_eq!(l.worker(&l.runs[2]), "w0.1");
    }
}
