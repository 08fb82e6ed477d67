//! One JSON contract: every command answers `--json` with JSON, snapshotted here from
//! one job whose outcome is fixed (pids 3 and 7 fail), on a private Redis through the
//! real binary. Values that differ from run to run (times, durations, rates, sizes,
//! where the store is) are replaced by a marker; every count and every key is pinned.
//! A failure is one JSON object on stderr with the same exit code.

use crate::support;

use crate::common;

use common::{output, scratch, steady, tranche};
use serde_json::Value;
use support::TestRedis;

/// What differs from run to run in these commands beyond [`steady`]'s own list.
const ALSO: &[&str] = &[
    "bytes",
    "output",
    "keys",
    "archive_bytes_per_partition",
    "archive_bytes_measured_by",
];

/// Every line of stdout parsed as JSON (one object for most commands).
fn json_lines(stdout: &[u8], what: &str) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let mut values: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}")))
        .collect();
    assert!(!values.is_empty(), "{what} printed nothing");
    if values.len() == 1 {
        values.pop().unwrap()
    } else {
        Value::Array(values)
    }
}

#[test]
fn every_command_answers_json() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("json-contract");
    let dump = dir.join("archive.dump");
    let dump = dump.to_str().unwrap();
    let run = |args: &[&str], code: i32| -> Value {
        let out = output(tranche(
            &dir,
            &[&["--redis", &url, "--json"][..], args].concat(),
        ));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v = json_lines(&out.stdout, &format!("{args:?}"));
        steady(&mut v, ALSO);
        v
    };
    let exec = r#"test "$TRANCHE_PID" != 3 && test "$TRANCHE_PID" != 7"#;
    let steps: Vec<(&str, Vec<&str>, i32)> = vec![
        (
            "plan",
            vec!["plan", "--min", "1", "--max", "20000", "--size", "1000"],
            0,
        ),
        (
            "plan_dry_run",
            vec!["plan", "--min", "1", "--max", "20000", "--dry-run"],
            0,
        ),
        (
            "run",
            vec![
                "run",
                "--exec",
                exec,
                "--max-attempts",
                "1",
                "--parallel",
                "1",
                "--worker-id",
                "w1",
            ],
            1,
        ),
        ("status", vec!["status"], 0),
        ("get_archived", vec!["get", "5"], 0),
        ("get_failed", vec!["get", "3"], 0),
        ("locate", vec!["locate", "6500"], 0),
        ("list_failed", vec!["list", "failed"], 0),
        (
            "list_archived",
            vec!["list", "archived", "--limit", "2", "--after", "10"],
            0,
        ),
        ("stats", vec!["stats"], 0),
        ("workers", vec!["workers"], 0),
        ("health", vec!["health"], 1),
        ("check", vec!["check"], 0),
        ("dead_letters", vec!["dead-letters"], 0),
        ("plans", vec!["plans"], 0),
        ("namespaces", vec!["namespaces"], 0),
        ("retry_failed", vec!["retry-failed", "3"], 0),
        ("discard", vec!["discard", "3"], 0),
        ("pause", vec!["pause"], 0),
        ("resume", vec!["resume"], 0),
        ("compact", vec!["compact"], 0),
        ("archive", vec!["archive"], 0),
        ("export", vec!["export", "-o", dump], 0),
        (
            "export_to_hash",
            vec!["export", "--to-hash", "elk_completed_back"],
            0,
        ),
    ];
    for (name, args, code) in &steps {
        let v = run(args, *code);
        insta::assert_json_snapshot!(format!("json_{name}"), v);
    }
    // Into another namespace: import of the dump, then drop of it.
    let other = |args: &[&str], code: i32| -> Value {
        let out = output(tranche(
            &dir,
            &[
                &["--redis", &url, "--json", "--namespace", "copy"][..],
                args,
            ]
            .concat(),
        ));
        assert_eq!(out.status.code(), Some(code));
        let mut v = json_lines(&out.stdout, &format!("{args:?}"));
        steady(&mut v, ALSO);
        v
    };
    insta::assert_json_snapshot!("json_import", other(&["import", dump], 0));
    insta::assert_json_snapshot!("json_drop", other(&["drop", "--yes"], 0));

    // A failure: one JSON object on stderr, the same exit code as without --json.
    for (args, code, kind) in [
        (vec!["get", "x"], 2, "usage"),
        (vec!["discard", "5"], 2, "error"),
    ] {
        let out = output(tranche(
            &dir,
            &[&["--redis", &url, "--json"][..], &args[..]].concat(),
        ));
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let err = json_lines(&out.stderr, &format!("{args:?} stderr"));
        assert_eq!(err["error"]["kind"], kind, "{args:?}: {err}");
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}
