//! The fleet-wide rate limit: a GCRA with reservations, in Redis or in memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use tokio::time::Instant;
use tranche_codec::KeySchema;

use crate::{Rate, Result};

/// Which of a namespace's two limits a reservation is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// IDs per second (`--max-rate`).
    Ids,
    /// Partitions claimed per second (`--max-partitions-rate`).
    Partitions,
}

impl Limit {
    /// The limit's name in its key, `{ns}:control:rate:<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Ids => "ids",
            Limit::Partitions => "partitions",
        }
    }
}

/// A reservation of units: unit `i` may be used at `start + i / rate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reservation {
    /// When the first unit may be used, relative to the moment the limiter answered, in
    /// microseconds: positive means wait, negative (within the burst) means already due.
    pub start_offset_us: i64,
}

impl Reservation {
    /// The reservation's start on this process's monotonic clock, given when the answer
    /// arrived.
    pub fn start_at(self, answered: Instant) -> Instant {
        let magnitude = Duration::from_micros(self.start_offset_us.unsigned_abs());
        if self.start_offset_us >= 0 {
            answered + magnitude
        } else {
            answered.checked_sub(magnitude).unwrap_or(answered)
        }
    }
}

/// A shared rate limit: reserves units for one client of the fleet.
///
/// Object safe (`Arc<dyn RateLimiter>`); callers normally go through a [`crate::Pacer`],
/// which batches reservations and paces their use.
#[async_trait]
pub trait RateLimiter: Send + Sync + std::fmt::Debug {
    /// Reserves `units` (at least 1) of `limit` at `rate`, allowing a start at most
    /// `burst` in the past.
    async fn reserve(
        &self,
        limit: Limit,
        rate: Rate,
        units: u64,
        burst: Duration,
    ) -> Result<Reservation>;
}

#[async_trait]
impl<L: RateLimiter + ?Sized> RateLimiter for std::sync::Arc<L> {
    async fn reserve(
        &self,
        limit: Limit,
        rate: Rate,
        units: u64,
        burst: Duration,
    ) -> Result<Reservation> {
        (**self).reserve(limit, rate, units, burst).await
    }
}

fn check_units(units: u64) -> Result<()> {
    if units == 0 || units > 1_000_000_000_000 {
        return Err(crate::Error::invalid(
            "units",
            format!("{units} is not in [1, 1e12]"),
        ));
    }
    Ok(())
}

/// The furthest a reservation is put ahead when its span would overflow the clock.
const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The limiter of an embedded run: every pacer of one process shares it. Time is tokio's
/// (`tokio::time::pause` controls it in tests).
#[derive(Debug, Default)]
pub struct MemoryRateLimiter {
    /// Each limit's theoretical arrival time.
    tat: Mutex<HashMap<Limit, Instant>>,
}

impl MemoryRateLimiter {
    /// A limiter with no reservations.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl RateLimiter for MemoryRateLimiter {
    async fn reserve(
        &self,
        limit: Limit,
        rate: Rate,
        units: u64,
        burst: Duration,
    ) -> Result<Reservation> {
        check_units(units)?;
        let now = Instant::now();
        let floor = now.checked_sub(burst).unwrap_or(now);
        let mut tat = self.tat.lock().expect("limiter lock");
        let entry = tat.entry(limit).or_insert(now);
        let start = (*entry).max(floor);
        // Bounded by the rate's range (at most 10¹⁶ s), yet saturate rather than trust
        // it: a limiter must not panic on arithmetic.
        let span = Duration::try_from_secs_f64(units as f64 * rate.interval_secs())
            .unwrap_or(Duration::MAX);
        *entry = start
            .checked_add(span)
            .or_else(|| start.checked_add(FAR))
            .unwrap_or(start);
        let offset = if start >= now {
            i64::try_from((start - now).as_micros()).unwrap_or(i64::MAX)
        } else {
            -i64::try_from((now - start).as_micros()).unwrap_or(i64::MAX)
        };
        Ok(Reservation {
            start_offset_us: offset,
        })
    }
}

/// The limiter of a fleet: `lua/take.lua` on the namespace's `{ns}` slot, one call per
/// reservation.
#[derive(Clone)]
pub struct RedisRateLimiter<C> {
    conn: C,
    keys: crate::ControlKeys,
    script: redis::Script,
}

impl<C> RedisRateLimiter<C> {
    /// The limiter of the namespace `schema` names, over `conn` (a standalone or cluster
    /// connection; `tranche_active_store::RedisConnection` fits).
    pub fn new(conn: C, schema: &KeySchema) -> Self {
        Self {
            conn,
            keys: crate::ControlKeys::new(schema),
            script: redis::Script::new(crate::store::take_lua()),
        }
    }

    /// `{ns}:control:rate:<limit>`: the limit's theoretical arrival time.
    pub fn key(&self, limit: Limit) -> String {
        self.keys.rate(limit)
    }
}

#[async_trait]
impl<C> RateLimiter for RedisRateLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn reserve(
        &self,
        limit: Limit,
        rate: Rate,
        units: u64,
        burst: Duration,
    ) -> Result<Reservation> {
        check_units(units)?;
        let key = self.key(limit);
        let burst_us = u64::try_from(burst.as_micros()).unwrap_or(u64::MAX);
        // Retrying a lost reply may reserve twice: that wastes capacity (the fleet runs
        // slower), never exceeds the limit.
        let offset: i64 = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.script.key(&key);
            invocation.arg(rate.get()).arg(units).arg(burst_us);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        Ok(Reservation {
            start_offset_us: offset,
        })
    }
}

impl<C> std::fmt::Debug for RedisRateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}
