//! `cargo xtask fuzz codec | active | state`: decoders under libFuzzer, through
//! cargo-fuzz on the nightly toolchain. Each name is a fuzz crate of its own: the
//! codec's decoders (`codec/fuzz`), the active store's RESP reply reader
//! (`active-store/fuzz`), the embedded state file's loader (`worker-bin/fuzz`). Not
//! part of CI (it is open-ended by nature); run it after touching a decoder.

use std::process::Command;

use anyhow::{Context, Result, bail};

const USAGE: &str =
    "usage: cargo xtask fuzz codec|active|state [--seconds N] [--runs N] [--target T]";

/// Each name `cargo xtask fuzz` takes, with its fuzz crate.
const CRATES: &[(&str, &str)] = &[
    ("codec", "codec/fuzz"),
    ("active", "active-store/fuzz"),
    ("state", "worker-bin/fuzz"),
];

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut args = args.iter();
    let dir = match args.next().map(String::as_str) {
        Some(name) => match CRATES.iter().find(|(n, _)| *n == name) {
            Some((_, dir)) => *dir,
            None => bail!("no fuzz targets for `{name}`; {USAGE}"),
        },
        None => bail!("{USAGE}"),
    };
    let mut seconds = 60u64;
    let mut runs: Option<u64> = None;
    let mut only = None;
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--seconds" => {
                seconds = value
                    .parse()
                    .with_context(|| format!("--seconds {value}: not a whole number"))?
            }
            "--runs" => {
                runs = Some(
                    value
                        .parse()
                        .with_context(|| format!("--runs {value}: not a whole number"))?,
                )
            }
            "--target" => only = Some(value.clone()),
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }

    let dir = crate::workspace_root().join(dir);
    ensure_cargo_fuzz()?;
    let listed = Command::new("cargo")
        .args(["+nightly", "fuzz", "list"])
        .current_dir(&dir)
        .output()
        .context("could not run cargo +nightly fuzz list")?;
    if !listed.status.success() {
        bail!(
            "cargo +nightly fuzz list failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let all: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let targets = match only {
        Some(target) if all.contains(&target) => vec![target],
        Some(target) => bail!("no fuzz target `{target}`; targets: {}", all.join(", ")),
        None => all,
    };
    for target in targets {
        let mut cmd = Command::new("cargo");
        // An input that takes over 30 s (libFuzzer's default is 20 minutes) or 2 GB is a
        // finding too: a loader must not hang on what a file claims.
        cmd.args(["+nightly", "fuzz", "run", &target, "--"])
            .arg("-timeout=30")
            .arg("-rss_limit_mb=2048")
            .current_dir(&dir);
        // With --runs, a number of executions (libFuzzer prints how many it did and the
        // corpus it ended with); otherwise a time budget.
        let what = match runs {
            Some(n) => {
                cmd.arg(format!("-runs={n}"));
                format!("fuzz {target} for {n} executions")
            }
            None => {
                cmd.arg(format!("-max_total_time={seconds}"));
                format!("fuzz {target} for {seconds} s")
            }
        };
        crate::step(&what, &mut cmd)?;
    }
    Ok(())
}

fn ensure_cargo_fuzz() -> Result<()> {
    let nightly = Command::new("cargo")
        .args(["+nightly", "--version"])
        .output();
    if !nightly.is_ok_and(|out| out.status.success()) {
        bail!("fuzzing needs the nightly toolchain: rustup toolchain install nightly");
    }
    let fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output();
    if fuzz.is_ok_and(|out| out.status.success()) {
        return Ok(());
    }
    eprintln!("xtask: cargo-fuzz is missing; installing it with cargo install");
    crate::step(
        "cargo install cargo-fuzz",
        Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]),
    )
}
