//! The client side of a rate limit: reserves in batches, paces each unit locally.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::{Limit, Rate, RateLimiter, Result};

/// Paces one process's use of a fleet-wide [`Limit`].
///
/// [`Pacer::acquire`] returns when `units` may be used. It reserves a batch from the
/// [`RateLimiter`] when its own reservation runs out and lets the `i`-th unit of a batch
/// start at `start + i / rate`. A batch covers a span of the rate (at most `max_batch`
/// units, a multiple of the units asked for so equal chunks waste nothing); the span
/// adapts so the fleet's queue of reservations stays near [`Pacer::QUEUE`] (see
/// [`Pacer::with_queue`]): it halves
/// when a reservation starts later than that (many workers share the limit) and doubles,
/// up to [`Pacer::BATCH_TIME`], when it starts sooner than half of it. A worker then
/// waits at most about `QUEUE` for its first chunk, and a raised rate applies within it. A
/// rate of `None` acquires at once and costs no call. Shared by every task of a process
/// (`&self`); acquisitions are served in order.
#[derive(Debug)]
pub struct Pacer {
    limiter: Arc<dyn RateLimiter>,
    limit: Limit,
    /// The rate in force; `None` is unlimited. Read at each acquisition, so
    /// [`Pacer::set_rate`] takes effect at the next one.
    rate: Mutex<Option<Rate>>,
    /// The local reservation, behind an async lock held across the reservation call so
    /// concurrent acquisitions do not each reserve a batch.
    batch: tokio::sync::Mutex<Local>,
    max_batch: u64,
    burst: Duration,
    /// The reservation wait the batch span adapts to ([`Pacer::QUEUE`] by default).
    queue: Duration,
}

#[derive(Debug)]
struct Local {
    batch: Option<Batch>,
    /// The span of the rate the next batch covers.
    batch_time: Duration,
}

#[derive(Debug)]
struct Batch {
    rate: Rate,
    start: Instant,
    granted: u64,
    used: u64,
}

impl Pacer {
    /// The span of the rate a batch covers at most: a longer one would queue other
    /// workers behind it and delay a live rate change.
    pub const BATCH_TIME: Duration = Duration::from_secs(1);
    /// The span of the rate a pacer's first batch covers.
    pub const FIRST_BATCH_TIME: Duration = Duration::from_millis(100);
    /// The shortest span a batch covers.
    pub const MIN_BATCH_TIME: Duration = Duration::from_millis(10);
    /// The wait for a reservation the batch span adapts to.
    pub const QUEUE: Duration = Duration::from_secs(2);

    /// A pacer of `limit` through `limiter`, unlimited until [`Pacer::set_rate`], with
    /// batches of at most `max_batch` units (for the ID limit: 100 chunks' worth, so
    /// the limiter costs at most one call per 100 chunks at full speed).
    pub fn new(limiter: Arc<dyn RateLimiter>, limit: Limit, max_batch: u64) -> Self {
        Self {
            limiter,
            limit,
            rate: Mutex::new(None),
            batch: tokio::sync::Mutex::new(Local {
                batch: None,
                batch_time: Self::FIRST_BATCH_TIME,
            }),
            max_batch: max_batch.max(1),
            burst: Duration::ZERO,
            queue: Self::QUEUE,
        }
    }

    /// Lets a reservation start up to `burst` in the past after an idle spell (default
    /// zero: no catch-up, the limit holds in every window).
    pub fn with_burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    /// Adapts batches to a reservation wait of `queue` rather than [`Pacer::QUEUE`]: a
    /// longer queue lets many workers at a low rate take bigger batches (fewer calls)
    /// at the price of a longer wait for the first chunk and for a raised rate.
    pub fn with_queue(mut self, queue: Duration) -> Self {
        self.queue = queue.max(Self::MIN_BATCH_TIME);
        self
    }

    /// Changes the rate (`None`: unlimited). The rest of a batch reserved at the old
    /// rate is dropped at the next acquisition: capacity is lost, never exceeded.
    pub fn set_rate(&self, rate: Option<Rate>) {
        *self.rate.lock().expect("pacer lock") = rate;
    }

    /// The rate in force.
    pub fn rate(&self) -> Option<Rate> {
        *self.rate.lock().expect("pacer lock")
    }

    /// Waits until `units` may be used, and returns the instant they were allowed at
    /// (now when unlimited). The caller may start later (a busy runtime wakes late);
    /// the limit bounds the allowed instants.
    pub async fn acquire(&self, units: u64) -> Result<Instant> {
        let units = units.max(1);
        let at = {
            let mut local = self.batch.lock().await;
            let Some(rate) = self.rate() else {
                local.batch = None;
                return Ok(Instant::now());
            };
            // A chunk may start while its first unit is in the batch; what it takes
            // beyond the batch is a debt the next reservation pays first, so chunks of
            // varying size (`--chunk-time`) waste nothing and overrun by one chunk at most.
            let usable = local
                .batch
                .as_ref()
                .is_some_and(|b| b.rate == rate && b.used < b.granted);
            if !usable {
                let debt = local
                    .batch
                    .as_ref()
                    .filter(|b| b.rate == rate)
                    .map_or(0, |b| b.used.saturating_sub(b.granted));
                let target =
                    ((rate.get() * local.batch_time.as_secs_f64()) as u64).clamp(1, self.max_batch);
                let n = units * (target / units).max(1) + debt;
                let reservation = self
                    .limiter
                    .reserve(self.limit, rate, n, self.burst)
                    .await?;
                let wait = Duration::from_micros(reservation.start_offset_us.max(0) as u64);
                local.batch_time = if wait > self.queue {
                    (local.batch_time / 2).max(Self::MIN_BATCH_TIME)
                } else if wait < self.queue / 2 {
                    (local.batch_time * 2).min(Self::BATCH_TIME)
                } else {
                    local.batch_time
                };
                local.batch = Some(Batch {
                    rate,
                    start: reservation.start_at(Instant::now()),
                    granted: n,
                    used: debt,
                });
            }
            let batch = local.batch.as_mut().expect("a batch was just reserved");
            let offset = Duration::try_from_secs_f64(batch.used as f64 / rate.get())
                .unwrap_or(Duration::MAX);
            // Past what the clock holds is later than any wait that matters: a century.
            let far = Duration::from_secs(100 * 365 * 86_400);
            let at = batch
                .start
                .checked_add(offset)
                .or_else(|| batch.start.checked_add(far))
                .unwrap_or(batch.start);
            batch.used += units;
            at
        };
        tokio::time::sleep_until(at).await;
        Ok(at)
    }
}
