//! Unit tests of the embedded state: one instant of all three stores, the file format,
//! its two generations and the bounded decode.

use std::collections::BTreeSet;
use std::fs;

use tranche_active_store::{
    ActiveQuery, Leases, ManualClock, Plan, Planner, WorkerInfo, WorkerRegistry,
};
use tranche_archive_store::{ArchiveQuery, Archiver, Lookup};
use tranche_stats::StatsStore;

use super::file::*;
use super::*;

const T0: u64 = 1_719_234_405_000;

fn configs(shards: u32) -> (tranche_active_store::Config, tranche_archive_store::Config) {
    let active = tranche_active_store::Config {
        num_shards: shards,
        ..Default::default()
    };
    let archive = tranche_archive_store::Config {
        num_shards: shards,
        consumer: "embedded".into(),
        compressed_at: 100,
        summary_at: 200,
        ..Default::default()
    };
    (active, archive)
}

/// A fresh file path in the temporary directory, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tranche-state-{}-{name}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir.join("run.state"))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

fn new_run(shards: u32, clock: &Arc<ManualClock>) -> Embedded {
    let (a, b) = configs(shards);
    Embedded::new(a, b, clock.clone()).unwrap()
}

async fn drain(run: &Embedded) {
    while run.archive.archive_once().await.unwrap().entries > 0 {}
}

/// Works on 300 partitions until at least `done` are completed, ten per claim,
/// archiving every other round; then claims three more and checkpoints them
/// (`min_id + 250`) without finishing them. Returns the pids it completed.
async fn work(run: &Embedded, clock: &ManualClock, done: usize) -> BTreeSet<u64> {
    let mut completed = BTreeSet::new();
    let mut round = 0;
    while completed.len() < done {
        let leases = run.active.claim("w1", 10).await.unwrap();
        assert!(!leases.is_empty(), "ran out of work at {}", completed.len());
        clock.advance(100);
        for l in &leases {
            run.active.complete(l, 1000 + l.pid).await.unwrap();
            completed.insert(l.pid);
        }
        round += 1;
        if round % 2 == 0 {
            run.archive.archive_once().await.unwrap();
        }
    }
    for l in run.active.claim("w1", 3).await.unwrap() {
        run.active.heartbeat(&l, l.min_id + 250).await.unwrap();
    }
    completed
}

/// Every answer the three layers give, to compare two runs by.
async fn answers(run: &Embedded) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", run.active.all_active().await.unwrap()),
        format!("{:?}", run.active.counts().await.unwrap()),
        format!("{:?}", run.stats.stats().await.unwrap()),
        format!("{:?}", run.archive.decode_failures().await.unwrap()),
    ];
    for pid in 0..=310 {
        out.push(format!(
            "{pid}: {:?} {:?}",
            run.active.get(pid).await.unwrap(),
            run.archive.get(pid).await.unwrap()
        ));
    }
    out
}

#[tokio::test]
async fn a_saved_run_loads_and_answers_as_it_did() {
    for shards in [1, 4] {
        let clock = Arc::new(ManualClock::new(T0));
        let run = new_run(shards, &clock);
        run.active
            .plan(&Plan::Uniform {
                min: 1,
                max: 300_000,
                size: 1000,
            })
            .await
            .unwrap();
        run.active
            .worker_heartbeat(WorkerInfo {
                id: "w1".into(),
                host: "h".into(),
                process_id: 1,
                started_ms: T0,
                last_beat_ms: 0,
                in_flight: 3,
                completed: 0,
                rate_per_s: 0.0,
                latency_p50_ms: 0.0,
                latency_p99_ms: 0.0,
                version: "0".into(),
            })
            .await
            .unwrap();
        work(&run, &clock, 250).await;
        let path = TempPath::new(&format!("answers{shards}"));
        let report = run.save(&path.0).unwrap();
        assert_eq!(report.bytes, fs::metadata(&path.0).unwrap().len());
        assert!(!path.0.with_file_name("run.state.tmp").exists());
        let state = load(&path.0).unwrap().unwrap();
        assert_eq!(state, run.state());
        let (a, b) = configs(shards);
        let back = Embedded::restore(a, b, clock.clone(), state, RestoredLeases::Keep).unwrap();
        assert_eq!(answers(&back).await, answers(&run).await);
        // Saved again, the restored run loads as it is.
        let again = TempPath::new(&format!("again{shards}"));
        back.save(&again.0).unwrap();
        assert_eq!(load(&again.0).unwrap().unwrap(), back.state());
    }
}

#[tokio::test]
async fn an_interrupted_run_resumes_and_redoes_no_finished_partition() {
    for shards in [1, 4] {
        let clock = Arc::new(ManualClock::new(T0));
        let path = TempPath::new(&format!("resume{shards}"));
        let (a, b) = configs(shards);
        let (run, resumed) = Embedded::open(&path.0, a, b, clock.clone()).unwrap();
        assert!(!resumed);
        run.active
            .plan(&Plan::Uniform {
                min: 1,
                max: 300_000,
                size: 1000,
            })
            .await
            .unwrap();
        let first = work(&run, &clock, 120).await;
        // Some completions are still in the inbox, three leases are held.
        run.save(&path.0).unwrap();
        let in_flight = run.active.counts().await.unwrap();
        assert_eq!(in_flight.running, 3);
        drop(run);

        let (a, b) = configs(shards);
        let (run, resumed) = Embedded::open(&path.0, a, b, clock.clone()).unwrap();
        assert!(resumed);
        let counts = run.active.counts().await.unwrap();
        assert_eq!((counts.claimed, counts.running, counts.pending), (0, 0, 3));
        // The released partitions come back first, from their checkpoints.
        let leases = run.active.claim("w1", 3).await.unwrap();
        assert_eq!(leases.len(), 3);
        for l in &leases {
            assert_eq!(l.progress, l.min_id + 250, "{l:?}");
            run.active.complete(l, 5).await.unwrap();
        }
        let mut rest = BTreeSet::new();
        loop {
            let leases = run.active.claim("w1", 50).await.unwrap();
            if leases.is_empty() {
                break;
            }
            for l in &leases {
                run.active.complete(l, 5).await.unwrap();
                rest.insert(l.pid);
            }
        }
        assert!(first.is_disjoint(&rest), "a finished partition was redone");
        drain(&run).await;
        assert_eq!(first.len() + 3 + rest.len(), 300);
        let stats = run.stats.stats().await.unwrap();
        assert_eq!(stats.global_stats.total_completed, 300);
        for pid in 1..=300 {
            assert!(
                matches!(run.archive.get(pid).await.unwrap(), Lookup::Archived { .. }),
                "pid {pid}"
            );
        }
    }
}

/// A length field asking for more than the payload could hold is refused before
/// anything is allocated. The fuzzer's find (`cargo xtask fuzz state`): this
/// 130-byte payload's string length of 0xfcfcfcfc made bincode, under the old fixed
/// 16 GiB limit, allocate 4 GB before finding the bytes missing.
#[test]
fn a_length_past_the_payload_is_refused_unallocated() {
    let payload: &[u8] = &[
        1, 7, 116, 114, 97, 110, 99, 104, 101, 4, 1, 0, 0, 252, 252, 252, 252, 252, 252, 252, 252,
        252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
        252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
        252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
        252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
        252, 252, 252, 252, 0, 0, 1, 1, 10, 1, 37, 0, 14, 0, 0, 0, 0, 162, 1, 0, 0, 1, 1, 1, 251,
        16, 39, 251, 232, 3, 0, 253, 4,
    ];
    let err = decode_bounded(payload).unwrap_err();
    assert!(
        matches!(err, bincode::error::DecodeError::LimitExceeded),
        "{err:?}"
    );
    let bytes = [header(payload).as_slice(), payload].concat();
    let err = decode(Path::new("t.state"), &bytes).unwrap_err();
    assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
}

#[test]
fn a_bad_file_is_refused_with_a_clear_error() {
    let clock = Arc::new(ManualClock::new(T0));
    let run = new_run(2, &clock);
    let path = TempPath::new("bad");
    assert!(load(&path.0).unwrap().is_none());
    run.save(&path.0).unwrap();
    // Without a previous generation to fall back to.
    fs::remove_file(previous(&path.0)).unwrap();
    let good = fs::read(&path.0).unwrap();
    let check = |bytes: &[u8], want: &str| {
        fs::write(&path.0, bytes).unwrap();
        let err = load(&path.0).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        assert!(err.contains("run.state"), "{err}");
    };
    check(b"hello", "is not a tranche state file");
    check(&good[..HEADER_LEN - 1], "too short");
    check(&good[..good.len() - 1], "is corrupt");
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    check(&flipped, "checksum mismatch");
    let mut newer = good.clone();
    newer[8] += 1;
    check(&newer, "format version 2");

    // Another job's state.
    fs::write(&path.0, &good).unwrap();
    let state = load(&path.0).unwrap().unwrap();
    let (a, b) = configs(3);
    let err = Embedded::restore(a, b, clock.clone(), state, RestoredLeases::Release)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 shards") && err.contains("with 3"), "{err}");
}

/// Plans 300 partitions of 1000 IDs.
async fn plan_300(run: &Embedded) {
    run.active
        .plan(&Plan::Uniform {
            min: 1,
            max: 300_000,
            size: 1000,
        })
        .await
        .unwrap();
}

/// One byte of `path` at `at` flipped in place.
fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at] ^= 0x5a;
    fs::write(path, bytes).unwrap();
}

/// A state file damaged after its save (a flipped byte anywhere outside the version
/// field) loads as its previous generation: the partitions finished since are
/// pending again, done once more, and in the end every partition is counted once.
#[tokio::test]
async fn a_damaged_state_file_falls_back_to_its_previous_generation() {
    for at in [0, 13, 22, HEADER_LEN, HEADER_LEN + 50, usize::MAX] {
        let clock = Arc::new(ManualClock::new(T0));
        let path = TempPath::new(&format!("fallback{at}"));
        let run = new_run(2, &clock);
        plan_300(&run).await;
        let early = work(&run, &clock, 60).await;
        // The first save of a process writes both generations.
        run.save(&path.0).unwrap();
        assert_eq!(load(&previous(&path.0)).unwrap().unwrap(), run.state());
        let older = run.state();
        let later = work(&run, &clock, 60).await;
        run.save(&path.0).unwrap();
        assert_eq!(load(&previous(&path.0)).unwrap().unwrap(), older);
        drop(run);

        let len = fs::metadata(&path.0).unwrap().len() as usize;
        flip(&path.0, at.min(len - 1));
        let state = load(&path.0).unwrap().unwrap();
        assert_eq!(state, older, "byte {at}");
        let (a, b) = configs(2);
        let run = Embedded::restore(a, b, clock.clone(), state, RestoredLeases::Release).unwrap();
        for pid in later.difference(&early) {
            assert!(
                !matches!(
                    run.archive.get(*pid).await.unwrap(),
                    Lookup::Archived { .. }
                ),
                "pid {pid} finished after the older generation is archived in it"
            );
        }
        // The next save keeps the damaged file aside, not as the previous generation.
        run.save(&path.0).unwrap();
        assert!(quarantined(&path.0).exists());
        let mut redone = 0;
        loop {
            let leases = run.active.claim("w2", 50).await.unwrap();
            if leases.is_empty() {
                break;
            }
            for l in &leases {
                run.active.complete(l, 5).await.unwrap();
                redone += u64::from(later.contains(&l.pid) && !early.contains(&l.pid));
            }
        }
        assert!(
            redone > 0,
            "nothing finished after the older generation was redone"
        );
        drain(&run).await;
        let stats = run.stats.stats().await.unwrap();
        assert_eq!(stats.global_stats.total_completed, 300, "byte {at}");
        for pid in 1..=300 {
            assert!(
                matches!(run.archive.get(pid).await.unwrap(), Lookup::Archived { .. }),
                "pid {pid}"
            );
        }
    }
}

/// A damaged file found at a save is kept aside and the previous generation stays:
/// damage between two saves never becomes the generation to fall back to.
#[tokio::test]
async fn a_save_over_a_damaged_file_keeps_the_older_generation() {
    let clock = Arc::new(ManualClock::new(T0));
    let path = TempPath::new("keep");
    let run = new_run(1, &clock);
    plan_300(&run).await;
    run.save(&path.0).unwrap();
    let first = run.state();
    work(&run, &clock, 20).await;
    flip(&path.0, HEADER_LEN + 3);
    let damaged = fs::read(&path.0).unwrap();
    run.save(&path.0).unwrap();
    assert_eq!(fs::read(quarantined(&path.0)).unwrap(), damaged);
    assert_eq!(load(&previous(&path.0)).unwrap().unwrap(), first);
    assert_eq!(load(&path.0).unwrap().unwrap(), run.state());
}

/// Both generations damaged, a changed version field, or a `.prev` left by a
/// dropped namespace: refused with the files named, or ignored, never loaded.
#[tokio::test]
async fn what_is_never_fallen_back_to() {
    let clock = Arc::new(ManualClock::new(T0));
    let path = TempPath::new("never");
    let run = new_run(1, &clock);
    plan_300(&run).await;
    run.save(&path.0).unwrap();
    work(&run, &clock, 20).await;
    run.save(&path.0).unwrap();
    let good = fs::read(&path.0).unwrap();

    // A version field another tranche may have written: refused as it is.
    flip(&path.0, 8);
    let err = load(&path.0).unwrap_err().to_string();
    assert!(
        err.contains("format version") && err.contains("run.state"),
        "{err}"
    );

    // Both generations damaged: one error naming both files.
    fs::write(&path.0, &good).unwrap();
    flip(&path.0, HEADER_LEN + 1);
    flip(&previous(&path.0), HEADER_LEN + 1);
    let err = load(&path.0).unwrap_err().to_string();
    assert!(
        err.contains("run.state is corrupt: checksum mismatch")
            && err.contains("run.state.prev is corrupt"),
        "{err}"
    );

    // The state file removed (`drop`): no state, and the next save of a new job
    // removes the old `.prev` before anything could fall back to it.
    fs::remove_file(&path.0).unwrap();
    assert!(load(&path.0).unwrap().is_none());
    let fresh = new_run(1, &clock);
    save(&path.0, &fresh.state(), false).unwrap();
    assert!(!previous(&path.0).exists());
    flip(&path.0, HEADER_LEN);
    assert!(load(&path.0).is_err());
}

/// A temporary file planted as a symlink is never followed: the link goes, its
/// target stays as it was, and the state is written to a new private file.
#[test]
fn a_planted_temporary_symlink_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let clock = Arc::new(ManualClock::new(T0));
    let run = new_run(2, &clock);
    let path = TempPath::new("symlink");
    let victim = path.0.with_file_name("victim.txt");
    fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, path.0.with_file_name("run.state.tmp")).unwrap();
    run.save(&path.0).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(load(&path.0).unwrap().is_some());
    let mode = fs::metadata(&path.0).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    assert!(!path.0.with_file_name("run.state.tmp").exists());
}
