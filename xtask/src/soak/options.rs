//! What one soak run is asked for: the command line, and `--ci`'s fixed profile.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::faults;
use super::fleet::now_us;

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
    pub(super) lease: Duration,
    pub(super) drain: Duration,
    pub(super) max_redis_mib: u64,
    pub(super) max_rss_mib: u64,
}

const USAGE: &str = "usage: cargo xtask soak [--ci] [--seed N] [--duration SECS] [--interval SECS] \
[--partitions N] [--workers N] [--faults kill,stop,...] [--cluster] [--release] \
[--lease MS] [--drain SECS]";

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
            lease: Duration::from_secs(3),
            drain: Duration::from_secs(90),
            max_redis_mib: 256,
            max_rss_mib: 256,
        };
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
                    o.seed = 22;
                    o.duration = Duration::from_secs(120);
                    o.interval = Duration::from_secs(15);
                    o.faults = faults::CI.split(',').map(str::to_owned).collect();
                }
                "--seed" => o.seed = number(value()?)?,
                "--duration" => o.duration = Duration::from_secs(number(value()?)?),
                "--interval" => o.interval = Duration::from_secs(number(value()?)?.max(1)),
                "--partitions" => o.partitions = number(value()?)?,
                "--workers" => o.workers = number(value()?)?.clamp(1, 64) as usize,
                "--lease" => o.lease = Duration::from_millis(number(value()?)?.max(500)),
                "--drain" => o.drain = Duration::from_secs(number(value()?)?),
                "--faults" => {
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
                "--cluster" => o.cluster = true,
                "--release" => o.release = true,
                "--embedded" => bail!(
                    "--embedded (and the corrupt-state fault) is not built yet: the soak \
                     runs on Redis only"
                ),
                _ => bail!("unknown option `{flag}`; {USAGE}"),
            }
        }
        Ok(o)
    }
}
