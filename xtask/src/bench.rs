//! `cargo xtask bench NAME`: each benchmark is a `harness = false` bench target of the
//! crate it measures. It prints a readable table and writes its figures as JSON to the
//! path in `TRANCHE_BENCH_OUT`, which this task points at `target/tranche-bench/NAME.json`.

use anyhow::{Result, bail};

/// Benchmark name, the package that owns it, and whether it needs `redis-server`.
const BENCHES: &[(&str, &str, bool)] = &[
    ("codec", "tranche-codec", false),
    ("window", "tranche-window", false),
    ("active", "tranche-active-store", true),
    ("archive", "tranche-archive-store", true),
    ("embedded_state", "tranche-worker", false),
];

pub(crate) fn run(args: &[String]) -> Result<()> {
    let names: Vec<&str> = BENCHES.iter().map(|(name, ..)| *name).collect();
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
            "usage: cargo xtask bench NAME|all (names: {})",
            names.join(", ")
        ),
    };
    let out_dir = crate::workspace_root().join("target/tranche-bench");
    std::fs::create_dir_all(&out_dir)?;
    for (name, package, needs_redis) in selected {
        let mut cmd = crate::cargo();
        cmd.args(["bench", "--locked", "-p", package, "--bench", name]);
        if *needs_redis {
            cmd.env("TRANCHE_REDIS_SERVER", crate::redis::ensure_installed()?);
        }
        let out = out_dir.join(format!("{name}.json"));
        cmd.env("TRANCHE_BENCH_OUT", &out);
        crate::step(&format!("bench {name}"), &mut cmd)?;
        eprintln!("xtask: figures written to {}", out.display());
    }
    Ok(())
}
