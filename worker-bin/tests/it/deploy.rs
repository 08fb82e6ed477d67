//! The files of `deploy/` that are not rules: the systemd unit passes `systemd-analyze
//! verify` and its stop timeout outlasts the drain it asks for. (The alerting rules are
//! checked in `serve.rs`, beside the scrape they use.)

use crate::common;

use std::process::Command;

use common::{BIN, ok, scratch, tranche};

const UNIT: &str = include_str!("../../../deploy/systemd/tranche-worker@.service");

/// Where the shipped unit expects the binary (`cargo install` puts it in ~/.cargo/bin;
/// the docs say to copy it here).
const INSTALLED: &str = "/usr/local/bin/tranche";

/// `systemd-analyze verify` accepts the unit, as an instance, with `ExecStart` pointing
/// at the binary under test (verify refuses a command that does not exist). Any line it
/// prints about the unit fails the test: systemd only warns about an unknown key or a
/// bad value, and ignores it.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    assert!(
        UNIT.contains(&format!("ExecStart={INSTALLED} run ")),
        "the unit runs something else than `{INSTALLED} run`"
    );
    let dir = scratch("deploy-unit");
    let unit = dir.join("tranche-worker@reindex.service");
    std::fs::write(&unit, UNIT.replace(INSTALLED, BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze not found: apt-get install systemd");
    let said = [out.stdout, out.stderr].concat();
    let said = String::from_utf8_lossy(&said);
    let about_the_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("tranche-worker@"))
        .collect();
    assert!(
        out.status.success() && about_the_unit.is_empty(),
        "systemd-analyze verify ({}):\n{said}",
        out.status
    );

    // The check can fail: a misspelt key is reported.
    let bad = dir.join("tranche-worker@typo.service");
    std::fs::write(
        &bad,
        UNIT.replace(INSTALLED, BIN)
            .replace("KillMode=mixed", "KillMode=mixd"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("tranche-worker@typo.service"), "{said}");
}

/// The unit's stop timeout covers what tranche may take after SIGTERM: its `--grace`,
/// then at most 5 s to stop chunks and release leases with Redis gone (docs/guide.md),
/// plus a margin; its grace is the binary's default, which the docs state; SIGTERM goes
/// to tranche alone, so the chunks get their grace; the drain's exit is a clean stop.
#[test]
fn the_units_stop_timeout_outlasts_the_drain() {
    let directive = |key: &str| -> Vec<&str> {
        UNIT.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let seconds = |value: &str| -> u64 {
        value
            .strip_suffix('s')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{value:?} is not whole seconds"))
    };
    let exec = directive("ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    let grace = words
        .windows(2)
        .find(|w| w[0] == "--grace")
        .map(|w| seconds(w[1]))
        .expect("the unit's ExecStart sets --grace, beside TimeoutStopSec");
    let timeout = seconds(directive("TimeoutStopSec")[0]);
    assert!(
        timeout > grace + 5,
        "TimeoutStopSec={timeout}s leaves no margin over --grace {grace}s + 5 s"
    );
    assert_eq!(directive("KillMode"), ["mixed"]);
    assert_eq!(directive("KillSignal"), ["SIGTERM"]);
    assert_eq!(directive("SuccessExitStatus"), ["130"]);

    let help = ok(tranche(&scratch("deploy-help"), &["run", "--help"]));
    let default = help
        .split("--grace <DURATION>")
        .nth(1)
        .and_then(|h| h.split("[default: ").nth(1))
        .and_then(|h| h.split(']').next())
        .unwrap_or_else(|| panic!("no default --grace in:\n{help}"));
    assert_eq!(
        seconds(default),
        grace,
        "the unit's --grace is not the default"
    );
    let guide = include_str!("../../../docs/guide.md");
    assert!(
        guide.contains(&format!("(`--grace`, {grace} s)")) && guide.contains("`--grace` plus 5 s"),
        "docs/guide.md no longer states the grace and the stop bound the unit follows"
    );
}
