//! `cargo xtask`: the workspace's own automation, in Rust so it runs wherever cargo does.
//!
//! Every task is a plain function over `std::process::Command`; the binary keeps to one
//! dependency (`anyhow`) so that `cargo xtask` builds in seconds on a fresh clone.
//! `cargo xtask help` lists the tasks.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;
mod fuzz;
mod redis;
mod soak;

const HELP: &str = "\
cargo xtask TASK [ARGS]

Tasks:
  ci                       cargo fmt --check, cargo clippy and cargo doc (warnings are
                           errors), then `test`, every bench once with
                           TRANCHE_BENCH_SMOKE=1, then `soak --ci` and `soak --self-test`
  test [ARGS...]           make sure a redis-server (and the other servers the tests start)
                           is installed, then cargo nextest run --workspace (every test with
                           a deadline, .config/nextest.toml) and the doctests (ARGS go to
                           nextest, e.g. `cargo xtask test -p tranche-codec`)
  bench NAME|all           run a benchmark; it prints a table and writes
                           target/tranche-bench/NAME.json (names: codec, window, active, archive,
                           embedded_state, e2e, ops, backfill)
  bench e2e --cluster      the end-to-end bench on a local 3-master cluster beside one server
                           (N = 50,000, cell 4x64x16 unless TRANCHE_BENCH_* say otherwise)
  fuzz codec|active|state [--seconds N] [--runs N] [--target T]
                           run a crate's fuzz targets (nightly + cargo-fuzz), N seconds each
  redis [--cluster [--replicas]]
                           start a private Redis (or a 3-master cluster, with a replica
                           each) on free ports in the
                           foreground, print its URL, stop it on Ctrl-C
  soak [--ci] [--fast|--splits] [--embedded] [--seed N] [--duration SECS]
       [--interval SECS] [--partitions N] [--workers N] [--runners N]
       [--runner-concurrency N] [--faults F,F,...|all] [--cluster]
       [--release|--prebuilt] [--lease MS] [--drain SECS] [--aim runner|exec|any]
       [--shards N]
                           a fault-injecting soak: real workers on a private Redis (or
                           a 3+3 cluster, or one embedded process), a seeded fault every
                           N s (kill, stop, panic, redis-kill, redis-pause, proxy,
                           failover, corrupt-stats, corrupt-batch, corrupt-active,
                           corrupt-state, throttle), then oracles; writes target/soak/report.json
                           and timeline.svg, fails on any oracle. `--ci`: every fault
                           of its menu once, seed 22
  soak --self-test [--prebuilt] [--only SWITCH] [--skip SWITCH]
                           a short soak per sabotage switch (a worker broken on purpose:
                           ignore-cut, skip-guard, tear, ignore-fence, run-twice,
                           complete-twice, exit-on-reset, never-throttle, swallow-panic),
                           its faults aimed at what the switch breaks; fails unless each
                           one's oracles fail; reports in target/soak-self-test/
  cli-docs                 write docs/cli.md from the clap definitions (the built
                           binary's hidden `cli-markdown`); a test fails when it is stale
  help                     this text
";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = env::args().skip(1);
    let task = args.next().unwrap_or_else(|| "help".to_owned());
    let rest: Vec<String> = args.collect();
    match task.as_str() {
        "ci" => ci(),
        "test" => test(&rest),
        "bench" => bench::run(&rest),
        "fuzz" => fuzz::run(&rest),
        "redis" => redis::serve(&rest),
        "soak" => soak::run(&rest),
        "cli-docs" => cli_docs(),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => bail!("unknown task `{other}`; `cargo xtask help` lists the tasks"),
    }
}

/// `cargo xtask ci`: exactly what CI runs, in the order that fails fastest: fmt,
/// clippy (with every target, then the libraries and binary alone), worker-bin's library
/// floor alone (it builds without the `cli` feature and its dependency tree holds none
/// of the command line's crates), rustdoc (broken links and bad doc markup fail it),
/// then the tests, then a soak through every fault of its menu (under 5 minutes), then
/// the soak's self-test: each oracle failing on a worker sabotaged for it, one short
/// run per switch with its faults aimed at what the switch breaks (about 4 minutes).
fn ci() -> Result<()> {
    step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--check"]),
    )?;
    step(
        "cargo clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The libraries and the binary as users build them: without the tests' dev
    // dependencies, whose features (a crate's own `testing`) would hide code that only
    // the tests use.
    step(
        "cargo clippy (libraries and binary alone)",
        cargo().args(["clippy", "--workspace", "--locked", "--", "-D", "warnings"]),
    )?;
    // worker-bin's library floor: no command line, terminal or HTTP underneath it.
    // With warnings as errors: code only the command line uses says so (`cfg_attr`),
    // and so do the tests of it.
    step(
        "cargo clippy (tranche-worker library and tests without default features)",
        cargo().args([
            "clippy",
            "-p",
            "tranche-worker",
            "--lib",
            "--tests",
            "--no-default-features",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    eprintln!("xtask: running cargo tree (tranche-worker library without default features)");
    let tree = cargo()
        .args([
            "tree",
            "-p",
            "tranche-worker",
            "--no-default-features",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
        ])
        .output()
        .context("could not start cargo tree")?;
    if !tree.status.success() {
        bail!(
            "cargo tree failed ({}): {}",
            tree.status,
            String::from_utf8_lossy(&tree.stderr).trim()
        );
    }
    let tree = String::from_utf8_lossy(&tree.stdout);
    let cli_only = [
        "anyhow",
        "clap",
        "indicatif",
        "axum",
        "hyper",
        "prometheus-client",
        "tracing-subscriber",
    ];
    let found: Vec<&str> = cli_only
        .into_iter()
        .filter(|name| {
            tree.lines()
                .any(|line| line.split_whitespace().next() == Some(*name))
        })
        .collect();
    if !found.is_empty() {
        bail!(
            "tranche-worker without default features depends on {}: the library floor must not",
            found.join(", ")
        );
    }
    step(
        "cargo doc (warnings are errors)",
        cargo()
            .args(["doc", "--workspace", "--no-deps", "--locked"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    test(&[])?;
    // Every bench once in its smoke mode (small sizes, figures not judged), so a bench
    // that no longer builds or runs fails here: built in the test profile, whose
    // dependencies the test step built, and run by `cargo test` with no argument.
    let mut benches = cargo();
    benches.args(["test", "--workspace", "--locked", "--bench", "*"]);
    benches.env("TRANCHE_BENCH_SMOKE", "1");
    benches.env("TRANCHE_REDIS_SERVER", redis::ensure_installed()?);
    step("cargo test --bench * (smoke)", &mut benches)?;
    // The test step built the debug binary and the runner example the soak runs, so
    // these cost their own minutes and little more.
    soak::run(&["--ci".to_owned(), "--prebuilt".to_owned()])?;
    soak::run(&["--self-test", "--prebuilt"].map(str::to_owned))
}

/// `cargo xtask test`: the whole test suite against real Redis servers the tests start
/// themselves, so the only thing needed up front is the `redis-server` binary.
fn test(args: &[String]) -> Result<()> {
    let server = redis::ensure_installed()?;
    redis::ensure_browser()?;
    redis::ensure_postgres()?;
    redis::ensure_mariadb()?;
    redis::ensure_psycopg()?;
    redis::ensure_promtool()?;
    redis::ensure_systemd_analyze()?;
    ensure_nextest()?;
    if args.is_empty() {
        // The example tests build their example first (nextest builds none): done here,
        // before the tests, that is a no-op inside them rather than a compile competing
        // with the timed tests running beside them.
        step(
            "cargo build --examples",
            cargo().args(["build", "--locked", "--workspace", "--examples"]),
        )?;
    }
    // Every test under nextest, each with the deadline `.config/nextest.toml` sets, then
    // the doctests, which nextest does not run.
    let mut cmd = cargo();
    cmd.args(["nextest", "run", "--locked", "--no-tests=fail"]);
    if args.is_empty() {
        cmd.arg("--workspace");
    }
    cmd.args(args);
    // Tests look the binary up through this variable before falling back to PATH, so a
    // server installed somewhere unusual still works.
    cmd.env("TRANCHE_REDIS_SERVER", &server);
    step("cargo nextest run", &mut cmd)?;
    if args.is_empty() {
        let mut doc = cargo();
        doc.args(["test", "--workspace", "--locked", "--doc"]);
        doc.env("TRANCHE_REDIS_SERVER", &server);
        step("cargo test --doc", &mut doc)?;
    }
    Ok(())
}

/// Makes sure `cargo nextest` is there (it gives every test a deadline), installing it
/// from crates.io when it is missing.
fn ensure_nextest() -> Result<()> {
    let present = cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    eprintln!("xtask: cargo-nextest is missing; installing it with cargo install");
    step(
        "cargo install cargo-nextest",
        cargo().args(["install", "--locked", "cargo-nextest"]),
    )
}

/// A `cargo` command run from the workspace root, with the cargo that runs xtask.
fn cargo() -> Command {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// `cargo xtask cli-docs`: docs/cli.md rewritten from the binary's own help (its
/// hidden `cli-markdown` command), so the page says what the clap definitions say.
fn cli_docs() -> Result<()> {
    eprintln!("xtask: running tranche cli-markdown");
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--locked",
        "-p",
        "tranche-worker",
        "--bin",
        "tranche",
        "--",
        "cli-markdown",
    ]);
    // A TRANCHE_* variable set here would show its value in its option's help.
    for (key, _) in env::vars() {
        if key.starts_with("TRANCHE_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output().context("could not start cargo run")?;
    if !out.status.success() {
        bail!(
            "tranche cli-markdown failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let path = workspace_root().join("docs/cli.md");
    std::fs::write(&path, &out.stdout)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// Runs `cmd` with inherited stdio and fails with `what` if it does not exit 0.
fn step(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {what}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The workspace root: xtask lives one folder below it.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is a member folder of the workspace")
        .to_path_buf()
}
