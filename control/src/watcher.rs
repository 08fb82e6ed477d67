//! Publishes the control record in force to a run loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{ControlRecord, ControlStore};

/// Polls a [`ControlStore`] every interval (one call per process per interval) and
/// publishes the record through a `tokio::sync::watch` channel when it changed.
///
/// A failed read keeps the last record in force and is logged: a worker does not stop
/// because Redis hiccupped. A record with values that break the rules is published
/// with them dropped (see [`ControlRecord::rejected`]) and each is logged at WARN when
/// it first appears. The polling task stops when the watcher is dropped.
#[derive(Debug)]
pub struct ControlWatcher {
    receiver: watch::Receiver<ControlRecord>,
    task: JoinHandle<()>,
}

impl ControlWatcher {
    /// The poll interval the issue asks for: every worker applies a change within 2 s.
    pub const INTERVAL: Duration = Duration::from_secs(1);

    /// Reads the record once (so the first value is current; an error here is
    /// returned), then spawns the polling task on the current runtime.
    pub async fn start(store: Arc<dyn ControlStore>, interval: Duration) -> crate::Result<Self> {
        let first = store.read().await?;
        warn_rejected(&[], &first);
        let (sender, receiver) = watch::channel(first);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match store.read().await {
                    Ok(record) => {
                        sender.send_if_modified(|current| {
                            let changed = *current != record;
                            if changed {
                                warn_rejected(&current.rejected, &record);
                                *current = record;
                            }
                            changed
                        });
                    }
                    Err(err) => tracing::warn!(%err, "reading the control record failed"),
                }
                if sender.is_closed() {
                    return;
                }
            }
        });
        Ok(Self { receiver, task })
    }

    /// A receiver of the record in force (clone it per task).
    pub fn subscribe(&self) -> watch::Receiver<ControlRecord> {
        self.receiver.clone()
    }

    /// The record in force now.
    pub fn current(&self) -> ControlRecord {
        self.receiver.borrow().clone()
    }
}

/// Logs each value of `record` a reader ignored that `before` did not list.
fn warn_rejected(before: &[crate::Rejected], record: &ControlRecord) {
    for r in record.rejected.iter().filter(|r| !before.contains(r)) {
        tracing::warn!(key = %r.key, value = %r.value, why = %r.why,
            "ignoring a control record value (tranche check --repair)");
    }
}

impl Drop for ControlWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
