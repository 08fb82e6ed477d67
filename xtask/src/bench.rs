//! `cargo xtask bench NAME`: each benchmark is a `harness = false` bench target of the
//! crate it measures. It prints a readable table and writes its figures as JSON to the
//! path in `TRANCHE_BENCH_OUT`, which this task points at `target/tranche-bench/NAME.json`.
//! A benchmark may run several targets in turn; the later ones merge their fields into
//! the file the first one wrote (`archive`: the archive's own bench, then the router's
//! latency bench, which cannot live in archive-store because the router sits above it).
//! `bench e2e --cluster` runs the end-to-end bench on a local 3-master Redis Cluster
//! beside the single server, cell by cell, with small defaults (the bench's
//! `TRANCHE_BENCH_CLUSTER`).

use anyhow::{Result, bail};

/// A bench target: the package that owns it and its `--bench` name.
type Target = (&'static str, &'static str);

/// Benchmark name, the targets it runs in order, and whether they need `redis-server`.
const BENCHES: &[(&str, &[Target], bool)] = &[
    ("codec", &[("tranche-codec", "codec")], false),
    ("window", &[("tranche-window", "window")], false),
    ("active", &[("tranche-active-store", "active")], true),
    (
        "archive",
        &[
            ("tranche-archive-store", "archive"),
            ("tranche-router", "router"),
        ],
        true,
    ),
    ("limiter", &[("tranche-control", "limiter")], true),
    ("e2e", &[("tranche-worker", "e2e")], true),
    ("ops", &[("tranche-worker", "ops")], true),
    ("backfill", &[("tranche-worker", "backfill")], true),
    (
        "embedded_state",
        &[("tranche-worker", "embedded_state")],
        false,
    ),
];

pub(crate) fn run(args: &[String]) -> Result<()> {
    let names: Vec<&str> = BENCHES.iter().map(|(name, ..)| *name).collect();
    let (args, cluster) = match args {
        [name, flag] if name == "e2e" && flag == "--cluster" => (&args[..1], true),
        _ => (args, false),
    };
    let selected: Vec<_> = match args {
        [name] if name == "all" => BENCHES.iter().collect(),
        [name] => match BENCHES.iter().find(|(n, ..)| n == name) {
            Some(bench) => vec![bench],
            None => bail!(
                "unknown benchmark `{name}`; known: {}, all",
                names.join(", ")
            ),
        },
        _ => bail!(
            "usage: cargo xtask bench NAME|all|e2e --cluster (names: {})",
            names.join(", ")
        ),
    };
    let out_dir = crate::workspace_root().join("target/tranche-bench");
    std::fs::create_dir_all(&out_dir)?;
    for (name, targets, needs_redis) in selected {
        let out = out_dir.join(format!("{name}.json"));
        for (package, target) in *targets {
            let mut cmd = crate::cargo();
            cmd.args(["bench", "--locked", "-p", package, "--bench", target]);
            if *needs_redis {
                cmd.env("TRANCHE_REDIS_SERVER", crate::redis::ensure_installed()?);
            }
            if *target == "backfill" {
                // A private PostgreSQL, psql for the per-process cells, and psycopg2
                // for the `--exec-persistent` cell (the Python example).
                crate::redis::ensure_postgres()?;
                crate::redis::ensure_psycopg()?;
            }
            cmd.env("TRANCHE_BENCH_OUT", &out);
            if cluster {
                cmd.env("TRANCHE_BENCH_CLUSTER", "1");
            }
            crate::step(&format!("bench {name} ({package} {target})"), &mut cmd)?;
        }
        eprintln!("xtask: figures written to {}", out.display());
    }
    Ok(())
}
