//! Progress of a run: a bar on a terminal, plain periodic log lines otherwise.
//!
//! The bar shows the whole namespace (with many workers every bar tells the same
//! story). Beside it stand two rates since this run started: this process's own
//! completions ("here") and the namespace's ("all", every worker's, which the ETA
//! follows), so a resumed job does not count earlier partitions as this run's and a
//! fleet does not count its neighbours' as this process's. No rate or ETA is shown
//! before anything finished since the start. When
//! nothing can be done it says why (paused; partitions held by other or departed
//! workers). The last frame stays where the run stopped: an interrupted run does not
//! draw a full bar.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tranche_active_store::{ActiveStore, StatusCounts};

/// This process's own completions so far.
pub(crate) type Mine = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The progress reporter of one run; stops with the run's background tasks.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    task: JoinHandle<()>,
    total: u64,
    clock: RunClock,
    mine: Mine,
}

/// This run's own progress: where the namespace stood when it started.
#[derive(Debug, Clone, Copy)]
struct RunClock {
    started: Instant,
    done_at_start: u64,
}

impl RunClock {
    /// Partitions per second the namespace finished since this run started; `None`
    /// before the first.
    fn rate(&self, done: u64) -> Option<f64> {
        let finished = done.saturating_sub(self.done_at_start);
        let secs = self.started.elapsed().as_secs_f64();
        (finished > 0 && secs > 0.0).then(|| finished as f64 / secs)
    }

    /// Partitions per second this process completed since it started.
    fn own_rate(&self, mine: u64) -> f64 {
        mine as f64 / self.started.elapsed().as_secs_f64().max(1e-3)
    }
}

impl Progress {
    /// Starts reporting until `done` turns true.
    pub(crate) async fn start(
        active: Arc<dyn ActiveStore>,
        mine: Mine,
        done: watch::Receiver<bool>,
    ) -> Result<Self> {
        let total = total_partitions(active.as_ref()).await?;
        let counts = active.counts().await?;
        let clock = RunClock {
            started: Instant::now(),
            done_at_start: finished(total, &counts),
        };
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} partitions  {msg}",
                )
                .expect("valid template"),
            );
            bar.set_position(clock.done_at_start);
            bar
        });
        let task = tokio::spawn(report(
            active,
            bar.clone(),
            total,
            clock,
            mine.clone(),
            done,
        ));
        Ok(Self {
            bar,
            task,
            total,
            clock,
            mine,
        })
    }

    /// Draws the final state: where the namespace stands, not a full bar.
    pub(crate) fn finish(self, counts: &StatusCounts) {
        self.task.abort();
        let done = finished(self.total, counts);
        match self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.set_message(message(
                    counts,
                    self.total,
                    done,
                    (self.mine)(),
                    &self.clock,
                    false,
                ));
                // `abandon` keeps the position; `finish` would fill the bar.
                bar.abandon();
            }
            None => tracing::info!(
                done,
                total = self.total,
                failed = counts.failed,
                "run finished"
            ),
        }
    }
}

async fn report(
    active: Arc<dyn ActiveStore>,
    bar: Option<ProgressBar>,
    mut total: u64,
    clock: RunClock,
    mine: Mine,
    mut stop: watch::Receiver<bool>,
) {
    let every = if bar.is_some() {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(10)
    };
    loop {
        tokio::select! {
            // The guard `wait_for` returns is dropped at once: the future stays `Send`.
            _ = async { stop.wait_for(|d| *d).await.is_ok() } => return,
            () = tokio::time::sleep(every) => {}
        }
        // Plans may grow while following.
        if let Ok(t) = total_partitions(active.as_ref()).await {
            total = t;
        }
        let Ok(counts) = active.counts().await else {
            continue;
        };
        let paused = active.is_paused().await.unwrap_or(false);
        let done = finished(total, &counts);
        let msg = message(&counts, total, done, mine(), &clock, paused);
        match &bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(msg);
            }
            None => tracing::info!(done, total, "progress: {msg}"),
        }
    }
}

/// This process's rate, the namespace's rate and its ETA since this run started, the
/// namespace's running and failed partitions, and why nothing moves when nothing can.
fn message(
    counts: &StatusCounts,
    total: u64,
    done: u64,
    mine: u64,
    clock: &RunClock,
    paused: bool,
) -> String {
    let mut parts = Vec::new();
    match clock.rate(done) {
        Some(rate) => {
            let left = total.saturating_sub(done + counts.failed + counts.discarded);
            parts.push(format!(
                "{} here, {} all",
                per_second(clock.own_rate(mine)),
                per_second(rate)
            ));
            if left > 0 {
                parts.push(format!("ETA {}", eta(left as f64 / rate)));
            }
        }
        None => parts.push("-/s".to_owned()),
    }
    parts.push(format!("{} running", counts.claimed + counts.running));
    if counts.failed > 0 {
        parts.push(format!("{} failed", counts.failed));
    }
    if paused {
        parts.push("PAUSED: waiting for `tranche resume`".to_owned());
    } else if counts.unissued + counts.pending == 0 && counts.claimed + counts.running > 0 {
        parts.push(format!(
            "waiting: the last {} held by running or departed workers (a departed worker's lease expires)",
            counts.claimed + counts.running
        ));
    }
    parts.join("  ")
}

/// `12.3/s`, `1523/s`, `0.25/s`: three significant figures at most.
fn per_second(rate: f64) -> String {
    if rate >= 100.0 {
        format!("{rate:.0}/s")
    } else if rate >= 10.0 {
        format!("{rate:.1}/s")
    } else {
        format!("{rate:.2}/s")
    }
}

/// `45s`, `12m 5s`, `3h 20m`.
fn eta(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

/// Partitions finished (completed or discarded): planned minus still active.
fn finished(total: u64, counts: &StatusCounts) -> u64 {
    total.saturating_sub(counts.outstanding() + counts.failed)
}

/// Partitions of every plan of the namespace.
pub(crate) async fn total_partitions(active: &dyn ActiveStore) -> Result<u64> {
    Ok(active
        .plans()
        .await?
        .iter()
        .map(|p| p.plan.partitions())
        .fold(0u64, u64::saturating_add))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(unissued: u64, pending: u64, running: u64, failed: u64) -> StatusCounts {
        StatusCounts {
            unissued,
            pending,
            running,
            failed,
            ..StatusCounts::default()
        }
    }

    #[test]
    fn the_rate_is_this_runs_and_absent_before_its_first() {
        let clock = RunClock {
            started: Instant::now() - Duration::from_secs(10),
            done_at_start: 50,
        };
        // Resumed at 50 of 200: nothing finished by this run yet.
        let msg = message(&counts(100, 0, 50, 0), 200, 50, 0, &clock, false);
        assert!(msg.starts_with("-/s  50 running"), "{msg}");
        assert!(!msg.contains("ETA"), "{msg}");
        // 20 more in 10 s: 2/s, not 7/s; 130 left take about 65 s.
        let msg = message(&counts(80, 0, 50, 0), 200, 70, 20, &clock, false);
        assert!(
            msg.starts_with("2.00/s here, 2.00/s all  ETA 1m 5s"),
            "{msg}"
        );
        // Beside other workers: 5 of those 20 were this process's.
        let msg = message(&counts(80, 0, 50, 0), 200, 70, 5, &clock, false);
        assert!(
            msg.starts_with("0.50/s here, 2.00/s all  ETA 1m 5s"),
            "{msg}"
        );
    }

    #[test]
    fn it_says_why_nothing_moves() {
        let clock = RunClock {
            started: Instant::now(),
            done_at_start: 0,
        };
        let msg = message(&counts(0, 0, 2, 0), 20, 18, 0, &clock, false);
        assert!(msg.contains("waiting: the last 2 held by"), "{msg}");
        let msg = message(&counts(5, 0, 0, 0), 20, 15, 0, &clock, true);
        assert!(msg.contains("PAUSED"), "{msg}");
        assert_eq!(eta(3725.0), "1h 2m");
        assert_eq!(per_second(1523.4), "1523/s");
    }
}
