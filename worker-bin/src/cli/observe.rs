//! What `tranche run` attaches to the run loop from outside: the progress reporter, and
//! with `--metrics-listen` this worker's own `/metrics` (beside the orchestrator's
//! `/healthz` and `/readyz`, see `cli::serve::probes`), fed by the run's counters and a
//! chunk-duration histogram, both built from the run's [`Event`]s as a library user's
//! subscriber would (`ChunkDone` fills the histogram, `PartitionDone` counts the
//! progress reporter's own completions).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tranche_active_store::StatusCounts;

use crate::cli::progress::{Mine, Progress};
use crate::event::Event;
use crate::work::{Observer, Watched};

/// The command line's observer of one run.
pub(crate) struct RunObserver {
    /// Where to serve this worker's own metrics, if anywhere.
    metrics: Option<SocketAddr>,
    /// Chunk durations, seconds, for `--metrics-listen` (atomic buckets: no lock taken
    /// per chunk beyond the histogram's own).
    chunk_seconds: Histogram,
    /// The progress reporter, from `attach` until `finish`.
    progress: Mutex<Option<Progress>>,
    /// Partitions completed here, counted from [`Event::PartitionDone`]: the
    /// progress reporter's "here" rate.
    completed: Arc<AtomicU64>,
}

impl RunObserver {
    pub(crate) fn new(metrics: Option<SocketAddr>) -> Self {
        Self {
            metrics,
            chunk_seconds: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            progress: Mutex::new(None),
            completed: Arc::default(),
        }
    }
}

#[async_trait::async_trait]
impl Observer for RunObserver {
    async fn attach(
        &self,
        watched: Watched,
        done: watch::Receiver<bool>,
        background: &mut JoinSet<()>,
    ) -> Result<(), crate::error::Error> {
        self.attach_cli(watched, done, background)
            .await
            .map_err(|err| crate::error::Error::Other(err.into()))
    }

    fn event(&self, event: &Event) {
        match event {
            Event::ChunkDone { duration, .. } => {
                self.chunk_seconds.observe(duration.as_secs_f64());
            }
            Event::PartitionDone { .. } => {
                self.completed.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    fn finish(&self, counts: &StatusCounts) {
        if let Some(progress) = self.progress.lock().expect("not poisoned").take() {
            progress.finish(counts);
        }
    }
}

impl RunObserver {
    /// [`Observer::attach`], its errors the command line's.
    async fn attach_cli(
        &self,
        watched: Watched,
        done: watch::Receiver<bool>,
        background: &mut JoinSet<()>,
    ) -> Result<()> {
        if let Some(addr) = self.metrics {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                anyhow::anyhow!("cannot listen on {addr} for --metrics-listen: {e}")
            })?;
            tracing::info!(addr = %listener.local_addr()?, "worker metrics on /metrics, probes on /healthz and /readyz");
            let draining = crate::cli::serve::draining_flag(done.clone(), background)?;
            let readiness =
                crate::cli::serve::Readiness::of(watched.active.clone(), watched.control, draining);
            let (counters, chunk_seconds, mut rx) =
                (watched.counters, self.chunk_seconds.clone(), done.clone());
            background.spawn(async move {
                let app = crate::cli::serve::worker_metrics(counters, chunk_seconds)
                    .merge(crate::cli::serve::probe_routes(readiness));
                crate::cli::serve::serve_http(listener, app, async move {
                    let _ = rx.wait_for(|done| *done).await;
                })
                .await;
            });
        }
        let completed = self.completed.clone();
        let mine: Mine = Arc::new(move || completed.load(Relaxed));
        let progress = Progress::start(watched.active, mine, done).await?;
        *self.progress.lock().expect("not poisoned") = Some(progress);
        Ok(())
    }
}
