//! `run --min --max --size`: one command plans and runs; the same again resumes; a
//! different plan is refused in one line naming both, with nothing written.

use super::*;

#[test]
fn one_command_plans_runs_and_reruns_embedded() {
    let dir = scratch("oneshot");
    let log = dir.join("chunks.log");
    let exec = format!(
        "echo $TRANCHE_PID $TRANCHE_FROM $TRANCHE_TO >> {}",
        log.display()
    );
    let run = |max: &str| {
        tranche(
            &dir,
            &[
                "run", "--min", "1", "--max", max, "--size", "100", "--chunk", "50", "--exec",
                &exec,
            ],
        )
    };
    ok(run("1000"));
    let chunks = common::chunk_log(&log);
    common::assert_every_id_processed(&chunks, 1, 1000);
    let plans = ok(tranche(&dir, &["plans"]));
    // The same plan again is a rerun: accepted, nothing left to do.
    ok(run("1000"));
    assert_eq!(
        common::chunk_log(&log).len(),
        chunks.len(),
        "nothing redone"
    );
    assert_eq!(ok(tranche(&dir, &["plans"])), plans);
    let state = std::fs::read(dir.join(".tranche/tranche.state")).unwrap();
    fails(
        &dir,
        &args(
            &[
                "run", "--min", "1", "--max", "2000", "--size", "100", "--exec", "true",
            ]
            .map(String::from),
        ),
        2,
        "holds plan IDs 1..=1000 by 100, not IDs 1..=2000 by 100: nothing written",
    );
    assert_eq!(
        std::fs::read(dir.join(".tranche/tranche.state")).unwrap(),
        state
    );
    // --max without --min means nothing.
    let out = output(tranche(&dir, &["run", "--max", "5", "--exec", "true"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min <A>"));
}

#[test]
fn a_different_plan_is_refused_on_redis_with_nothing_written() {
    let redis = TestRedis::start();
    let dir = scratch("oneshot-redis");
    let url = redis.url();
    ok(tranche(
        &dir,
        &[
            "run", "--redis", &url, "--min", "1", "--max", "300", "--size", "100", "--exec", "true",
        ],
    ));
    let status: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["status", "--redis", &url, "--json"]))).unwrap();
    assert_eq!(status["finished"], 3, "{status}");
    let before = redis.dump_all();
    fails(
        &dir,
        &[
            "run", "--redis", &url, "--min", "1", "--max", "300", "--size", "50", "--exec", "true",
        ],
        2,
        "namespace `tranche` holds plan IDs 1..=300 by 100, not IDs 1..=300 by 50",
    );
    assert_eq!(redis.dump_all(), before, "nothing written");
}
