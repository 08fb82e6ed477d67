//! A partition's chunks sized by time (`--chunk-time`): each chunk's size comes from a
//! [`ChunkSizer`] fed with how long the chunks before it took, between `--chunk-min`
//! and `--chunk-max`.
//!
//! The window still hands out sequence numbers and its low-water mark is still the
//! checkpoint; what changes is the map from a sequence number to IDs, which is no
//! longer `min_id + n × chunk`. The start ID of every issued chunk the low-water mark
//! has not passed is kept (about `--parallel` entries), the checkpoint is the start ID
//! of the first unfinished one (or where the next chunk would start, when every issued
//! one is done), and a resumed partition starts at its checkpoint itself rather than at
//! a chunk boundary. Only this path pays for the map: without `--chunk-time` a
//! partition runs as before. Chunks are handed out through the lease's hold
//! ([`Hold::issue`]), as on the fixed-size path, so a timed partition is cut by
//! straggler splitting like any other.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::task::JoinSet;
use tranche_active_store::Lease;
use tranche_control::ChunkSizer;
use tranche_window::SlidingWindow;

use super::{Ended, Failure, PartitionCtx, abort, failed, settle};
use crate::held::Hold;
use crate::job::Chunk;

/// The issued chunks' start IDs by sequence number, and where the next one starts.
#[derive(Debug)]
struct Spans {
    starts: BTreeMap<u64, u64>,
    /// The first ID not issued yet (`max_id + 1` once all are; u128 so `u64::MAX` fits).
    next: u128,
    issued: u64,
}

impl Spans {
    /// The checkpoint for a low-water mark of `progress`: every ID below it is done.
    fn checkpoint(&mut self, progress: u64) -> u64 {
        self.starts = self.starts.split_off(&progress);
        let id = self
            .starts
            .get(&progress)
            .map_or(self.next, |&from| u128::from(from));
        id.min(u128::from(u64::MAX)) as u64
    }
}

impl PartitionCtx {
    /// Runs the partition from its checkpoint in chunks sized by `sizer`.
    pub(super) async fn timed(
        &self,
        lease: &Lease,
        hold: &Arc<Hold>,
        sizer: ChunkSizer,
    ) -> (Ended, u64) {
        let resume = lease.progress.max(lease.min_id);
        let end = u128::from(lease.max_id) + 1;
        let spans = Mutex::new(Spans {
            starts: BTreeMap::new(),
            next: u128::from(resume),
            issued: 0,
        });
        if u128::from(resume) >= end {
            return (
                Ended::Done,
                spans.lock().expect("not poisoned").checkpoint(0),
            );
        }
        let mut permits = crate::control::Permits::new(self.gate.clone());
        let window = SlidingWindow::new(
            permits.window(self.settings.parallel, self.settings.window),
            0,
        );
        let sizer = Arc::new(Mutex::new(sizer));
        let failure = Failure::default();
        let checkpoint = || {
            spans
                .lock()
                .expect("not poisoned")
                .checkpoint(window.progress())
        };

        let fenced = AtomicBool::new(false);
        let closer = self.closer(lease.pid, hold, &window, &fenced);
        let mut running = JoinSet::new();
        let traced = super::super::spans::in_enabled_span();
        let issue = async {
            loop {
                let from = spans.lock().expect("not poisoned").next;
                if from >= end {
                    break;
                }
                let from = from as u64;
                let Ok(permit) = permits.acquire().await else {
                    break;
                };
                let Ok(seq) = window.next().await else {
                    break;
                };
                hold.advance(checkpoint());
                let size = sizer.lock().expect("not poisoned").size();
                // Through the hold, as the fixed-size path: it arms the lease for
                // splitting (its beats carry the frontier), ends it where a cut put
                // it, and waits while a beat that may cut it is unanswered.
                let Some(to) = hold.issue(from, size).await else {
                    break;
                };
                {
                    let mut s = spans.lock().expect("not poisoned");
                    s.starts.insert(seq, from);
                    s.next = u128::from(to) + 1;
                    s.issued = seq + 1;
                }
                let ids = to - from + 1;
                super::super::spans::gate_wait(
                    traced,
                    ids,
                    self.gate.chunk_start(ids, self.shared.rate_limit_failed()),
                )
                .await;
                let c = Chunk {
                    pid: lease.pid,
                    index: seq,
                    from,
                    to,
                    attempt: lease.attempt,
                    fence: lease.token,
                };
                let span = super::super::spans::chunk(&c);
                let (job, window, failure, stop, shared, sizer, hold, gate) = (
                    self.settings.job.clone(),
                    window.clone(),
                    failure.clone(),
                    self.stop.clone(),
                    self.shared.clone(),
                    sizer.clone(),
                    hold.clone(),
                    self.gate.clone(),
                );
                running.spawn(async move {
                    let fence = hold.fence();
                    let abort = abort(stop, hold);
                    let started = Instant::now();
                    let r = shared.chunk(&job, c, abort, fence, span).await;
                    drop(permit);
                    if r.is_ok() {
                        let next = sizer
                            .lock()
                            .expect("not poisoned")
                            .observe(to - from + 1, started.elapsed());
                        // Where this worker's next partition (a split piece too) starts.
                        gate.learned(next);
                    }
                    settle(r, seq, &window, &failure);
                });
            }
        };
        tokio::pin!(closer);
        tokio::select! {
            () = issue => {}
            () = &mut closer => {}
        }
        loop {
            tokio::select! {
                next = running.join_next() => {
                    hold.advance(checkpoint());
                    if next.is_none() { break }
                }
                () = &mut closer => {}
            }
        }
        let done = checkpoint();
        if hold.is_lost() || fenced.load(Relaxed) || hold.is_fenced() {
            return (Ended::Lost, done);
        }
        if let Some(ended) = failed(&failure) {
            return (ended, done);
        }
        let s = spans.lock().expect("not poisoned");
        // Done up to the lease's end now (earlier than `end` once cut).
        let end = end.min(u128::from(hold.end()) + 1);
        if s.next >= end && window.progress() >= s.issued {
            (Ended::Done, done)
        } else {
            (Ended::Stopped, done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_is_the_first_unfinished_start() {
        let mut s = Spans {
            starts: BTreeMap::from([(0, 100), (1, 150), (2, 400)]),
            next: 900,
            issued: 3,
        };
        assert_eq!(s.checkpoint(0), 100);
        assert_eq!(s.checkpoint(2), 400, "chunks 0 and 1 done");
        assert_eq!(s.starts.len(), 1, "passed entries are dropped");
        assert_eq!(s.checkpoint(3), 900, "every issued chunk done");
    }
}
