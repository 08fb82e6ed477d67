//! What one soak run is asked for: the command line, and `--ci`'s fixed profile.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::faults;
use super::fleet::{Kind, now_us};

/// The options of one soak run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(super) seed: u64,
    pub(super) duration: Duration,
    pub(super) interval: Duration,
    pub(super) partitions: u64,
    pub(super) workers: usize,
    pub(super) faults: Vec<String>,
    pub(super) cluster: bool,
    pub(super) release: bool,
    /// `--prebuilt`: run the debug binaries already in the target directory instead of
    /// building them (`cargo xtask ci`: its test step has just built both).
    pub(super) prebuilt: bool,
    pub(super) lease: Duration,
    pub(super) drain: Duration,
    pub(super) max_redis_mib: u64,
    pub(super) max_rss_mib: u64,
    /// Library runner processes (the `soak_runner` example) beside the exec workers.
    pub(super) runners: usize,
    /// Partitions each runner works on at once.
    pub(super) runner_concurrency: usize,
    /// What the fleet's work looks like.
    pub(super) profile: Profile,
    /// One `tranche run` on an embedded state file instead of Redis.
    pub(super) embedded: bool,
    /// When the first fault comes (default: 10 s after the warm-up).
    pub(super) first_fault: Option<Duration>,
    /// The end of the run in which no fault comes (its recovery could not be seen).
    pub(super) quiet_end: Duration,
    /// The workers `kill` and `stop` pick from: all (`None`) or those of one kind.
    pub(super) target: Option<Kind>,
    /// Faults aimed at what a sabotage breaks (`soak --self-test`): `kill` and `stop`
    /// strike a worker only while one of its chunks is open in its ledger, and a `stop`
    /// holds until another worker has started a chunk over one it froze (at most
    /// [`AIMED_STOP_LEASES`] leases).
    pub(super) aim: bool,
    /// A sabotage switch every worker and chunk gets as `SOAK_SABOTAGE`
    /// (`soak --self-test`).
    pub(super) sabotage: Option<String>,
    /// Whether more partitions are planned when the fleet runs low (`--partitions`
    /// alone: no).
    pub(super) top_up: bool,
    /// `--shards N`: the namespace's shard count (`tranche plan --shards`; the plan's
    /// default when `None`). A worker claims from the shards in an order of its own and
    /// takes a shard's requeued partitions before its fresh ones, but a shard late in
    /// every worker's order is reached only once the shards before it run dry: with one
    /// shard an expired lease is taken over at the next claim.
    pub(super) shards: Option<u32>,
}

/// What the fleet's work looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Profile {
    /// Four chunks of a quarter partition, 10-90 ms each, two partitions per worker; a
    /// plan sized to the duration, topped up when it runs low.
    Classic,
    /// `--fast`: chunks of a whole partition for the exec workers, short chunks for the
    /// runners; what a million partitions in 30 minutes takes.
    Fast,
    /// `--splits`: partitions of forty chunks, planned a few at a time, so that idle
    /// slots split running partitions all the time and faults land on pieces: a
    /// worker killed or frozen mid-split, a piece's lease expiring, half a split
    /// partition reclaimed.
    Splits,
}

impl Profile {
    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Profile::Classic => "classic",
            Profile::Fast => "fast",
            Profile::Splits => "splits",
        }
    }
}

/// How many leases an aimed `stop` holds at most while no other worker has taken over
/// the chunk it froze.
pub(super) const AIMED_STOP_LEASES: u32 = 4;

/// Partitions a second that make a million in 30 minutes: with `--fast` the default
/// plan is this times the duration, and more is planned when the fleet runs low.
pub(super) const FAST_RATE: u64 = 560;

const USAGE: &str = "usage: cargo xtask soak [--ci] [--fast | --splits] [--embedded] [--seed N] \
[--duration SECS] [--interval SECS] [--partitions N] [--workers N] [--runners N] \
[--runner-concurrency N] [--faults kill,stop,...] [--cluster] [--release | --prebuilt] \
[--lease MS] [--drain SECS] [--aim runner|exec|any] [--shards N]";

impl Options {
    pub(super) fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            seed: now_us() % 1_000_000,
            duration: Duration::from_secs(120),
            interval: Duration::from_secs(20),
            partitions: 0,
            workers: 4,
            faults: vec!["kill".into(), "stop".into()],
            cluster: false,
            release: false,
            prebuilt: false,
            lease: Duration::from_secs(3),
            drain: Duration::from_secs(90),
            max_redis_mib: 256,
            max_rss_mib: 256,
            runners: 1,
            runner_concurrency: 2,
            profile: Profile::Classic,
            embedded: false,
            first_fault: None,
            quiet_end: faults::QUIET_END,
            target: None,
            aim: false,
            sabotage: None,
            top_up: true,
            shards: None,
        };
        let mut drain_given = false;
        let mut runners_given = false;
        let mut concurrency_given = false;
        let mut faults_given = false;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .with_context(|| format!("{flag} wants a value; {USAGE}"))
            };
            let number = |v: &String| -> Result<u64> {
                v.parse()
                    .with_context(|| format!("{flag} {v}: not a number"))
            };
            match flag.as_str() {
                "--ci" => {
                    // Every kind of the menu once: the run is as long as the menu
                    // takes, each fault coming as soon as the last one's recovery
                    // window is over.
                    o.seed = 22;
                    o.faults = faults::CI.split(',').map(str::to_owned).collect();
                    o.interval = Duration::from_secs(1);
                    o.duration = faults::run_for(
                        &o.faults,
                        o.lease,
                        Duration::from_secs(super::report::WARM_UP_S as u64 + 10),
                    );
                }
                "--seed" => o.seed = number(value()?)?,
                "--duration" => o.duration = Duration::from_secs(number(value()?)?),
                "--interval" => o.interval = Duration::from_secs(number(value()?)?.max(1)),
                "--partitions" => o.partitions = number(value()?)?,
                "--workers" => o.workers = number(value()?)?.clamp(1, 64) as usize,
                "--lease" => o.lease = Duration::from_millis(number(value()?)?.max(500)),
                "--drain" => {
                    o.drain = Duration::from_secs(number(value()?)?);
                    drain_given = true;
                }
                "--runners" => {
                    o.runners = number(value()?)?.min(16) as usize;
                    runners_given = true;
                }
                "--runner-concurrency" => {
                    o.runner_concurrency = number(value()?)?.clamp(1, 256) as usize;
                    concurrency_given = true;
                }
                "--fast" | "--splits" => {
                    let p = if flag == "--fast" {
                        Profile::Fast
                    } else {
                        Profile::Splits
                    };
                    if o.profile != Profile::Classic && o.profile != p {
                        bail!("--fast and --splits exclude each other: one profile a run");
                    }
                    o.profile = p;
                }
                "--faults" => {
                    faults_given = true;
                    let v = value()?;
                    o.faults = if v == "all" {
                        // `proxy` stands for its three kinds.
                        faults::MENU
                            .iter()
                            .filter(|s| !s.starts_with("proxy-"))
                            .map(|s| s.to_string())
                            .collect()
                    } else {
                        v.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect()
                    };
                    for f in &o.faults {
                        if !faults::MENU.contains(&f.as_str()) {
                            bail!("unknown fault `{f}`; the menu: {}", faults::MENU.join(","));
                        }
                    }
                }
                "--aim" => {
                    // The self-test's aiming, for a run without a sabotage: what its
                    // oracles say of a sound fleet under the same faults.
                    o.aim = true;
                    o.target = match value()?.as_str() {
                        "runner" => Some(Kind::Runner),
                        "exec" => Some(Kind::Exec),
                        "any" => None,
                        v => bail!("--aim {v}: runner, exec or any"),
                    };
                }
                "--shards" => {
                    let n = number(value()?)?;
                    if !(1..=1024).contains(&n) {
                        bail!("--shards {n}: 1 to 1024");
                    }
                    o.shards = Some(n as u32);
                }
                "--cluster" => o.cluster = true,
                "--release" => o.release = true,
                "--prebuilt" => o.prebuilt = true,
                "--embedded" => o.embedded = true,
                _ => bail!("unknown option `{flag}`; {USAGE}"),
            }
        }
        if o.embedded && o.cluster {
            bail!("--embedded and --cluster exclude each other: embedded means no Redis");
        }
        if o.release && o.prebuilt {
            bail!("--release and --prebuilt exclude each other: --prebuilt runs the debug build");
        }
        if o.embedded {
            // One process holds the state file: one slot, which alternates between
            // `tranche run --exec` and the library runner at each restart.
            o.workers = 1;
            o.runners = 0;
            if !faults_given {
                o.faults = faults::EMBEDDED.split(',').map(str::to_owned).collect();
            }
            if !drain_given {
                o.drain = Duration::from_secs(180);
            }
        } else if o.profile == Profile::Fast {
            if !runners_given {
                o.runners = 3;
            }
            if !concurrency_given {
                o.runner_concurrency = 32;
            }
            if !drain_given {
                o.drain = Duration::from_secs(300);
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options> {
        Options::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn one_profile_a_run() {
        assert_eq!(parse(&[]).unwrap().profile, Profile::Classic);
        assert_eq!(parse(&["--splits"]).unwrap().profile, Profile::Splits);
        let fast = parse(&["--fast"]).unwrap();
        assert_eq!((fast.profile, fast.runners), (Profile::Fast, 3));
        let err = parse(&["--fast", "--splits"]).unwrap_err().to_string();
        assert!(err.contains("exclude each other"), "{err}");
    }

    #[test]
    fn aim_picks_the_kind_struck() {
        let o = parse(&["--aim", "runner"]).unwrap();
        assert!(o.aim);
        assert_eq!(o.target, Some(Kind::Runner));
        assert_eq!(parse(&["--aim", "any"]).unwrap().target, None);
        assert!(!parse(&[]).unwrap().aim);
        assert!(parse(&["--aim", "x"]).is_err());
    }

    #[test]
    fn shards_are_the_plans_unless_given() {
        assert_eq!(parse(&[]).unwrap().shards, None);
        assert_eq!(parse(&["--shards", "1"]).unwrap().shards, Some(1));
        assert!(parse(&["--shards", "0"]).is_err());
        assert!(parse(&["--shards", "1025"]).is_err());
    }

    #[test]
    fn prebuilt_runs_the_debug_build_only() {
        assert!(parse(&["--ci", "--prebuilt"]).unwrap().prebuilt);
        assert!(!parse(&["--ci"]).unwrap().prebuilt);
        let err = parse(&["--release", "--prebuilt"]).unwrap_err().to_string();
        assert!(err.contains("exclude each other"), "{err}");
    }
}
