//! Progress of a run: a bar on a terminal (partitions done / total, rate, ETA,
//! failures), plain periodic log lines otherwise. It shows the whole namespace, not
//! just this process: with many workers every bar tells the same story.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tranche_active_store::{ActiveStore, StatusCounts};

use crate::backend::Backend;
use crate::work::until;

/// The progress reporter of one run; stops with the run's background tasks.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    task: JoinHandle<()>,
    total: u64,
}

impl Progress {
    /// Starts reporting until `done` turns true.
    pub(crate) async fn start(backend: &Backend, done: watch::Receiver<bool>) -> Result<Self> {
        let total = total_partitions(backend.active.as_ref()).await?;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} partitions  {per_sec}  ETA {eta}  {msg}",
                )
                .expect("valid template"),
            );
            bar
        });
        let task = tokio::spawn(report(backend.active.clone(), bar.clone(), total, done));
        Ok(Self { bar, task, total })
    }

    /// Draws the final state.
    pub(crate) fn finish(self, counts: &StatusCounts) {
        self.task.abort();
        let done = done(self.total, counts);
        match self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.set_message(message(counts));
                bar.finish();
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
    mut stop: watch::Receiver<bool>,
) {
    let every = if bar.is_some() {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(10)
    };
    let started = Instant::now();
    let mut first: Option<u64> = None;
    loop {
        tokio::select! {
            () = until(&mut stop, |d| *d) => return,
            () = tokio::time::sleep(every) => {}
        }
        // Plans may grow while following.
        if let Ok(t) = total_partitions(active.as_ref()).await {
            total = t;
        }
        let Ok(counts) = active.counts().await else {
            continue;
        };
        let done = done(total, &counts);
        match &bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(message(&counts));
            }
            None => {
                let base = *first.get_or_insert(done);
                let rate = (done - base.min(done)) as f64 / started.elapsed().as_secs_f64();
                tracing::info!(
                    done,
                    total,
                    running = counts.claimed + counts.running,
                    failed = counts.failed,
                    rate = format!("{rate:.1}/s"),
                    "progress"
                );
            }
        }
    }
}

fn message(counts: &StatusCounts) -> String {
    let mut msg = format!("{} running", counts.claimed + counts.running);
    if counts.failed > 0 {
        msg.push_str(&format!(", {} failed", counts.failed));
    }
    msg
}

/// Partitions finished (completed or discarded): planned minus still active.
fn done(total: u64, counts: &StatusCounts) -> u64 {
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
