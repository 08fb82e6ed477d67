//! What a running worker does to its chunks: `--chunk-time` sizes them to a target
//! duration and resumes exactly; `tranche set --parallel` reaches a partition in flight.

use super::*;

/// `--chunk-time`: a chunk takes 1 s per 20 000 IDs (plus a fork), so 200 ms chunks are
/// about 4000 IDs. The sizes converge there from 100; a worker killed half way leaves a
/// checkpoint another resumes from exactly, and every ID is processed.
fn chunk_time(place: Place<'_>, name: &str) {
    let job = Job::new(name, &place);
    job.plan(200_000, 200_000);
    let sleep = "$(awk \"BEGIN { print ($TRANCHE_TO - $TRANCHE_FROM + 1) / 20000 }\")";
    let args = [
        "--chunk",
        "100",
        "--parallel",
        "2",
        "--chunk-time",
        "200ms",
        "--chunk-min",
        "50",
        "--chunk-max",
        "50000",
        // One range sized by one sizer: the resume is judged on one partition's chunks
        // (the next test lets it split).
        "--no-split",
    ];
    let mut first = job.spawn(sleep, &args);
    // Past the first heartbeats (every lease / 3) and, embedded, a save of the state
    // (every 2 s), so a checkpoint is stored.
    eventually(Duration::from_secs(30), "a dozen chunks", || {
        job.starts().len() >= 12
    });
    std::thread::sleep(Duration::from_millis(2500));
    signal(&first, "KILL");
    wait(&mut first, Duration::from_secs(10));
    let before = job.starts();
    let second = job.spawn(sleep, &args);
    let report = summary(second, Duration::from_secs(120));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    let all = job.starts();
    let after = &all[before.len()..];
    // Resumed at the start of a chunk of the first run (the first unfinished one), past
    // the beginning.
    let resumed = after.iter().map(|s| s.from).min().unwrap();
    assert!(resumed > 1, "resumed from the start: no checkpoint");
    assert!(
        before.iter().any(|s| s.from == resumed),
        "resumed at {resumed}, not at a chunk start of the first run"
    );
    let log: Vec<(u64, u64, u64)> = all.iter().map(|s| (s.pid, s.from, s.to)).collect();
    common::assert_every_id_processed(&log, 1, 200_000);
    // Converged near 4000 IDs (the last chunk is cut by the partition's end).
    let sizes: Vec<u64> = after.iter().map(|s| s.to - s.from + 1).collect();
    let tail = &sizes[sizes.len().saturating_sub(6)..sizes.len() - 1];
    assert!(
        tail.iter().all(|&n| (2000..=8000).contains(&n)),
        "chunk sizes {sizes:?}"
    );
    assert!(sizes[0] <= 200, "the second run starts small: {sizes:?}");
}

#[test]
fn chunk_time_converges_and_resumes_on_redis() {
    let redis = TestRedis::start();
    chunk_time(Place::Redis(&redis), "chunk-time-redis");
}

#[test]
fn chunk_time_converges_and_resumes_embedded() {
    chunk_time(Place::Embedded, "chunk-time-embedded");
}

/// `--chunk-time` with splitting: a piece an idle slot takes starts at the size the
/// worker learned (the first split comes with a beat, after chunks have been timed),
/// not at `--chunk` again, so the only chunk of `--chunk`'s 100 IDs is the run's first.
#[test]
fn chunk_time_pieces_start_at_the_learned_size() {
    let redis = TestRedis::start();
    let job = Job::new("chunk-time-split", &Place::Redis(&redis));
    job.plan(200_000, 200_000);
    let sleep = "$(awk \"BEGIN { print ($TRANCHE_TO - $TRANCHE_FROM + 1) / 20000 }\")";
    let args = [
        "--chunk",
        "100",
        "--concurrency",
        "2",
        "--parallel",
        "1",
        "--chunk-time",
        "200ms",
        "--chunk-min",
        "50",
        "--chunk-max",
        "50000",
    ];
    let report = summary(job.spawn(sleep, &args), Duration::from_secs(120));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    let mut starts = job.starts();
    starts.sort_by_key(|s| s.at_ns);
    let log: Vec<(u64, u64, u64)> = starts.iter().map(|s| (s.pid, s.from, s.to)).collect();
    common::assert_every_id_processed(&log, 1, 200_000);
    let pids: std::collections::BTreeSet<u64> = starts.iter().map(|s| s.pid).collect();
    let at_chunk: Vec<(u64, u64)> = starts
        .iter()
        .filter(|s| s.to - s.from + 1 == 100)
        .map(|s| (s.pid, s.from))
        .collect();
    assert_eq!(
        at_chunk,
        [(starts[0].pid, 1)],
        "chunks of --chunk's size (pids {pids:?}); sizes {:?}",
        starts.iter().map(|s| s.to - s.from + 1).collect::<Vec<_>>()
    );
}

/// The most chunks in flight at once among those started in `[from_ns, until_ns)`; a
/// chunk with no end line yet is still running.
fn peak_in_flight(
    starts: &[Start],
    ends: &[(u128, u64, u64)],
    from_ns: u128,
    until_ns: u128,
) -> usize {
    let mut events: Vec<(u128, i32)> = Vec::new();
    for s in starts
        .iter()
        .filter(|s| s.at_ns >= from_ns && s.at_ns < until_ns)
    {
        events.push((s.at_ns, 1));
        if let Some(&(end, _, _)) = ends.iter().find(|e| (e.1, e.2) == (s.pid, s.from)) {
            events.push((end, -1));
        }
    }
    // At one instant an end comes before a start.
    events.sort();
    let mut now = 0i32;
    let mut peak = 0i32;
    for (_, step) in events {
        now += step;
        peak = peak.max(now);
    }
    peak as usize
}

/// `tranche set --parallel` reaches a partition in flight: one long partition at
/// `--parallel 1` (with a window of 8) runs four chunks at once after the change, then
/// never more than one again from 2 s after the change back. Counted as chunks in
/// flight (each chunk writes its start and its end), not as chunks per second, which a
/// loaded machine slows.
#[test]
fn parallel_grows_and_shrinks_in_flight() {
    let redis = TestRedis::start();
    let job = Job::new("parallel", &Place::Redis(&redis));
    let ends_path = job.dir.join("ends");
    let ends = || -> Vec<(u128, u64, u64)> {
        std::fs::read_to_string(&ends_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                ))
            })
            .collect()
    };
    // One partition of 400 chunks of 100 ms.
    job.plan(40_000, 40_000);
    let exec = format!(
        "{} && echo \"$(date +%s%N) $TRANCHE_PID $TRANCHE_FROM\" >> {}",
        exec(&job.ledger, "0.1"),
        ends_path.display()
    );
    // The window bounds the chunks in flight: room for four. Not split: the idle slots
    // would take pieces of the partition, each with a `--parallel` of its own.
    let mut run = job.spawn_exec(
        &exec,
        &[
            "--chunk",
            "100",
            "--parallel",
            "1",
            "--window",
            "8",
            "--no-split",
        ],
    );
    eventually(Duration::from_secs(20), "the first chunks", || {
        job.starts().len() >= 3
    });
    let before = now_ns();
    assert_eq!(
        peak_in_flight(&job.starts(), &ends(), 0, before),
        1,
        "more than one chunk at once at --parallel 1"
    );
    let set = now_ns();
    ok(job.cmd(&["set", "--parallel", "4"]));
    eventually(Duration::from_secs(15), "four chunks in flight", || {
        peak_in_flight(&job.starts(), &ends(), set, u128::MAX) >= 4
    });
    let set = now_ns();
    ok(job.cmd(&["set", "--parallel", "1"]));
    let settled = set + 2_000_000_000;
    eventually(
        Duration::from_secs(20),
        "five chunks after the change back",
        || job.starts().iter().filter(|s| s.at_ns >= settled).count() >= 5,
    );
    let peak = peak_in_flight(&job.starts(), &ends(), settled, u128::MAX);
    assert_eq!(peak, 1, "{peak} chunks at once 2 s after --parallel 1");
    signal(&run, "INT");
    wait(&mut run, Duration::from_secs(30));
}
