//! The fault menu and its seeded schedule.

use std::time::Duration;

/// Every fault the soak can inject.
pub(crate) const MENU: &[&str] = &[
    "kill",
    "stop",
    "panic",
    "redis-kill",
    "redis-pause",
    "proxy",
    "proxy-latency",
    "proxy-blackhole",
    "proxy-reset",
    "failover",
    "corrupt-stats",
    "corrupt-batch",
    "corrupt-active",
    "corrupt-state",
    "throttle",
];

/// The faults of `--ci`: those today's code is expected to survive. (`proxy` picks one
/// of the three network faults at random; `--faults all` is the whole menu.)
pub(crate) const CI: &str = "kill,stop,panic,redis-kill,redis-pause,proxy-latency,proxy-reset,proxy-blackhole,corrupt-stats,corrupt-active,throttle";

/// The faults of `--embedded` unless `--faults` says otherwise: all that apply there.
pub(crate) const EMBEDDED: &str = "kill,stop,panic,corrupt-state";

/// Whether the throughput must come back within 10 s once the fault is healed (a
/// lifted throttle too: the workers read the control record every second).
pub(crate) fn transient(kind: &str) -> bool {
    kind.starts_with("redis-")
        || kind.starts_with("proxy")
        || kind == "failover"
        || kind == "throttle"
}

/// How long after `tranche throttle on` a chunk may still start: the command's promise
/// ("no new chunk starts within 2 s": the workers read the control record once a
/// second) and 1 s more, as the ledger's START is written by the chunk itself once it
/// runs (an exec chunk's shell has to start first, slowly on a loaded machine).
pub(crate) const THROTTLE_GRACE: Duration = Duration::from_secs(3);

/// Whether it damages something `health` must notice within a minute. A handler's
/// panic is not damage: it fails one attempt, which is retried like any failure (the
/// ledger oracles check that its IDs are processed all the same).
/// A damaged state file is not either: the restart that reads it falls back to the
/// previous generation, and the soak checks that it said so and lost nothing.
pub(crate) fn damage(kind: &str) -> bool {
    kind.starts_with("corrupt-") && kind != "corrupt-state"
}

/// The `health` rules that name a damage kind: the one that must fire after it (any
/// other rule firing says nothing about this damage).
pub(crate) fn rules(kind: &str) -> &'static [&'static str] {
    match kind {
        "corrupt-stats" => &["statistics_damaged"],
        "corrupt-active" => &["active_records_corrupt"],
        "corrupt-batch" => &["archive_damaged"],
        _ => &[],
    }
}

/// How long a run must be for every kind of `kinds` to come once: the first fault's
/// wait, each fault's length and the recovery window after it, and the quiet end.
pub(crate) fn run_for(kinds: &[String], lease: Duration, first: Duration) -> Duration {
    let faults: Duration = kinds
        .iter()
        .map(|k| length(k, lease) + RECOVERY + EXTRA)
        .sum();
    first + faults + QUIET_END
}

/// The window after a heal in which no other fault comes (its recovery is measured).
pub(crate) const RECOVERY: Duration = Duration::from_secs(10);
/// No fault in the last seconds of a run: its recovery could not be seen.
pub(crate) const QUIET_END: Duration = Duration::from_secs(12);
/// What an injection takes beyond its length (a Redis restart, the loop's ticks).
const EXTRA: Duration = Duration::from_secs(1);

/// How long a fault lasts before the soak heals it.
pub(crate) fn length(kind: &str, lease: Duration) -> Duration {
    match kind {
        "stop" => lease * 2 + Duration::from_secs(1),
        "redis-pause" => Duration::from_secs(15),
        "proxy-latency" | "proxy-blackhole" => Duration::from_secs(10),
        // Long enough past the grace that a worker ignoring it starts chunks in it.
        "throttle" => Duration::from_secs(8),
        "corrupt-stats" | "corrupt-batch" | "corrupt-active" => Duration::from_secs(3),
        _ => Duration::ZERO,
    }
}

/// splitmix64: a seeded schedule needs nothing better.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One injected fault, as the report tells it.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) kind: String,
    /// Seconds since the fleet started.
    pub(crate) at: f64,
    /// When it was healed (seconds), for faults that last.
    pub(crate) healed: Option<f64>,
    pub(crate) target: String,
    pub(crate) note: String,
    /// For corruption: whether the corrupt value was still there when checked
    /// (`Some(false)` too when it could not be written at all).
    pub(crate) persisted: Option<bool>,
    /// Set by the oracles.
    pub(crate) recovery_s: Option<f64>,
    pub(crate) health_fired_after_s: Option<f64>,
    pub(crate) health_masked: bool,
    /// Why it did not take effect (no live worker to kill, no key to corrupt, an
    /// injection error, a panic trigger nobody took); `None` when it did.
    pub(crate) missed: Option<String>,
}

impl Fault {
    /// A fault of `kind` at `at` seconds, not yet injected anywhere.
    pub(crate) fn new(kind: &str, at: f64) -> Fault {
        Fault {
            kind: kind.to_owned(),
            at,
            healed: None,
            target: String::new(),
            note: String::new(),
            persisted: None,
            recovery_s: None,
            health_fired_after_s: None,
            health_masked: false,
            missed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--ci`'s run is long enough for every kind of its menu, each after the last
    /// one's heal and recovery window.
    #[test]
    fn a_run_sized_to_the_menu_fits_every_kind() {
        let lease = Duration::from_secs(3);
        let first = Duration::from_secs(35);
        let menu: Vec<String> = CI.split(',').map(str::to_owned).collect();
        let run = run_for(&menu, lease, first);
        let needed: Duration = menu.iter().map(|k| length(k, lease) + RECOVERY).sum();
        assert!(run >= first + needed + QUIET_END, "{run:?}");
        // One more kind, a longer run.
        let more = [menu.clone(), vec!["stop".into()]].concat();
        assert!(run_for(&more, lease, first) > run);
    }
}
