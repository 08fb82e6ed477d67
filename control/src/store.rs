//! Where the control record lives: `{ns}:control` on Redis, or in memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use tranche_codec::{Clock, KeySchema};

use crate::record::{apply_change, change_json};
use crate::{Change, ControlRecord, Error, LogEntry, ProbeReport, Result, Throttled};

/// The change log keeps this many entries.
pub const LOG_CAP: usize = 100;

/// The control keys of a namespace, all under its `{ns}` tag (one slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlKeys {
    tag: String,
}

impl ControlKeys {
    /// The control keys of the namespace `schema` names.
    pub fn new(schema: &KeySchema) -> Self {
        Self {
            tag: schema.global_tag(),
        }
    }

    /// `{ns}:control`: the record, one JSON object.
    pub fn record(&self) -> String {
        format!("{}:control", self.tag)
    }

    /// `{ns}:control:log`: the last 100 changes, a stream.
    pub fn log(&self) -> String {
        format!("{}:control:log", self.tag)
    }

    /// `{ns}:control:prober`: the worker that leads the probes.
    pub fn prober(&self) -> String {
        format!("{}:control:prober", self.tag)
    }

    /// `{ns}:control:rate:<limit>`: a rate limit's theoretical arrival time.
    pub fn rate(&self, limit: crate::Limit) -> String {
        format!("{}:control:rate:{}", self.tag, limit.name())
    }
}

/// A namespace's control record, change log and probe leadership.
#[async_trait]
pub trait ControlStore: Send + Sync + std::fmt::Debug {
    /// The record (the default one when none was ever written).
    async fn read(&self) -> Result<ControlRecord>;

    /// Applies `changes` (checked; a refused change writes nothing), bumps the version
    /// and logs the change under `origin`. Returns the new record.
    async fn set(&self, changes: &[Change], origin: &str) -> Result<ControlRecord>;

    /// Turns the manual throttle on (with `reason`) or off, logged under `origin`.
    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord>;

    /// The last `n` changes, newest first.
    async fn log(&self, n: usize) -> Result<Vec<LogEntry>>;

    /// Records the probes' finding from `worker`; `false` (nothing written) when
    /// `worker` does not lead the probes.
    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool>;

    /// Elects `worker` to lead the probes for `term`, or renews its term; `false` while
    /// another worker leads.
    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<bool>;
}

#[async_trait]
impl<S: ControlStore + ?Sized> ControlStore for Arc<S> {
    async fn read(&self) -> Result<ControlRecord> {
        (**self).read().await
    }
    async fn set(&self, changes: &[Change], origin: &str) -> Result<ControlRecord> {
        (**self).set(changes, origin).await
    }
    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        (**self).throttle(on, reason, origin).await
    }
    async fn log(&self, n: usize) -> Result<Vec<LogEntry>> {
        (**self).log(n).await
    }
    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool> {
        (**self).report_probe(worker, report).await
    }
    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<bool> {
        (**self).lead_probes(worker, term).await
    }
}

fn check_worker(worker: &str) -> Result<()> {
    if worker.is_empty() || worker.len() > 256 {
        return Err(Error::invalid("worker", "must be 1 to 256 bytes"));
    }
    Ok(())
}

fn check_term(term: Duration) -> Result<u64> {
    let ms = u64::try_from(term.as_millis()).unwrap_or(u64::MAX);
    if !(1..=3_600_000).contains(&ms) {
        return Err(Error::invalid("term", "must be 1 ms to 1 h"));
    }
    Ok(ms)
}

fn check_report(report: &ProbeReport) -> Result<()> {
    if report
        .rate
        .is_some_and(|r| !(r > 0.0 && r <= crate::Rate::MAX))
    {
        return Err(Error::invalid("report", "rate must be in (0, 1e12]"));
    }
    if report.value.is_some_and(|v| !v.is_finite()) {
        return Err(Error::invalid("report", "value must be finite"));
    }
    if report.throttle.as_ref().is_some_and(|r| r.len() > 512) {
        return Err(Error::invalid("report", "the reason is over 512 bytes"));
    }
    Ok(())
}

/// The control store of an embedded run.
#[derive(Debug)]
pub struct MemoryControlStore {
    clock: Arc<dyn Clock>,
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    record: ControlRecord,
    log: VecDeque<LogEntry>,
    next_id: u64,
    /// The leading prober and when its term ends (clock ms).
    prober: Option<(String, u64)>,
}

impl MemoryState {
    fn push_log(&mut self, at_ms: u64, origin: &str, change: String) {
        self.next_id += 1;
        self.log.push_back(LogEntry {
            id: self.next_id.to_string(),
            at_ms,
            origin: origin.to_owned(),
            change,
            version: self.record.version,
        });
        while self.log.len() > LOG_CAP {
            self.log.pop_front();
        }
    }
}

impl MemoryControlStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::default(),
        }
    }

    fn change(&self, change: String, origin: &str) -> Result<ControlRecord> {
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        state.record = apply_change(&state.record, &change, origin, now)?;
        state.push_log(now, origin, change);
        Ok(state.record.clone())
    }
}

#[async_trait]
impl ControlStore for MemoryControlStore {
    async fn read(&self) -> Result<ControlRecord> {
        Ok(self.state.lock().expect("control lock").record.clone())
    }

    async fn set(&self, changes: &[Change], origin: &str) -> Result<ControlRecord> {
        self.change(change_json(changes, None)?, origin)
    }

    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        self.change(change_json(&[], Some((on, reason)))?, origin)
    }

    async fn log(&self, n: usize) -> Result<Vec<LogEntry>> {
        let state = self.state.lock().expect("control lock");
        Ok(state.log.iter().rev().take(n).cloned().collect())
    }

    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool> {
        check_worker(worker)?;
        check_report(report)?;
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        let leads = state
            .prober
            .as_ref()
            .is_some_and(|(w, until)| w == worker && *until > now);
        if !leads {
            return Ok(false);
        }
        let was = state
            .record
            .probe
            .as_ref()
            .and_then(|p| p.throttled.clone());
        let throttled = report.throttle.as_ref().map(|reason| Throttled {
            reason: reason.clone(),
            since_ms: was.as_ref().map_or(now, |w| w.since_ms),
        });
        let is = throttled.is_some();
        state.record.probe = Some(crate::ProbeState {
            throttled,
            value: report.value,
            error: report.error.clone(),
            rate: report.rate,
            at_ms: now,
            worker: worker.to_owned(),
        });
        state.record.version += 1;
        if was.is_some() != is {
            let change = match &report.throttle {
                Some(reason) => format!("probe throttle on: {reason}"),
                None => "probe throttle off".to_owned(),
            };
            state.push_log(now, &format!("probe@{worker}"), change);
        }
        Ok(true)
    }

    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<bool> {
        check_worker(worker)?;
        let term = check_term(term)?;
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        match &state.prober {
            Some((w, until)) if *until > now && w != worker => Ok(false),
            _ => {
                state.prober = Some((worker.to_owned(), now + term));
                Ok(true)
            }
        }
    }
}

/// The control store of a fleet: `lua/set.lua`, `lua/probe.lua` and `lua/lead.lua` on
/// the namespace's `{ns}` slot.
#[derive(Clone)]
pub struct RedisControlStore<C> {
    conn: C,
    keys: ControlKeys,
    clock: Arc<dyn Clock>,
    scripts: Scripts,
}

#[derive(Debug, Clone)]
struct Scripts {
    set: redis::Script,
    probe: redis::Script,
    lead: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            set: redis::Script::new(include_str!("../lua/set.lua")),
            probe: redis::Script::new(include_str!("../lua/probe.lua")),
            lead: redis::Script::new(include_str!("../lua/lead.lua")),
        }
    }
}

/// Every script of the crate with the keys it is given for `schema`, for the tests that
/// run each with bad arguments and check each keeps to one slot. Not an API.
#[cfg(feature = "testing")]
pub fn scripts(schema: &KeySchema) -> Vec<(&'static str, &'static str, Vec<String>)> {
    let keys = ControlKeys::new(schema);
    vec![
        (
            "take.lua",
            include_str!("../lua/take.lua"),
            vec![keys.rate(crate::Limit::Ids)],
        ),
        (
            "set.lua",
            include_str!("../lua/set.lua"),
            vec![keys.record(), keys.log()],
        ),
        (
            "probe.lua",
            include_str!("../lua/probe.lua"),
            vec![keys.record(), keys.log(), keys.prober()],
        ),
        (
            "lead.lua",
            include_str!("../lua/lead.lua"),
            vec![keys.prober()],
        ),
    ]
}

impl<C> RedisControlStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The control store of the namespace `schema` names, over `conn`, stamping changes
    /// with `clock`.
    pub fn new(conn: C, schema: &KeySchema, clock: Arc<dyn Clock>) -> Self {
        Self {
            conn,
            keys: ControlKeys::new(schema),
            clock,
            scripts: Scripts::new(),
        }
    }

    /// The keys this store uses.
    pub fn keys(&self) -> &ControlKeys {
        &self.keys
    }

    async fn change(&self, change: String, origin: &str) -> Result<ControlRecord> {
        let now = self.clock.now_ms();
        let (record, log) = (self.keys.record(), self.keys.log());
        // Not retried: a change whose reply was lost may have been applied, and applying
        // it twice would log it twice. The caller (a person at the CLI) sees the error.
        let mut conn = self.conn.clone();
        let text: String = self
            .scripts
            .set
            .key(&record)
            .key(&log)
            .arg(now)
            .arg(origin)
            .arg(&change)
            .invoke_async(&mut conn)
            .await?;
        ControlRecord::from_json(&text)
    }
}

#[async_trait]
impl<C> ControlStore for RedisControlStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn read(&self) -> Result<ControlRecord> {
        let key = self.keys.record();
        let text: Option<String> = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let key = key.clone();
            async move { redis::cmd("GET").arg(key).query_async(&mut conn).await }
        })
        .await?;
        text.map_or_else(
            || Ok(ControlRecord::default()),
            |t| ControlRecord::from_json(&t),
        )
    }

    async fn set(&self, changes: &[Change], origin: &str) -> Result<ControlRecord> {
        self.change(change_json(changes, None)?, origin).await
    }

    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        self.change(change_json(&[], Some((on, reason)))?, origin)
            .await
    }

    async fn log(&self, n: usize) -> Result<Vec<LogEntry>> {
        let key = self.keys.log();
        let reply: redis::streams::StreamRangeReply =
            tranche_codec::retry::retry(&self.conn, |mut conn| {
                let key = key.clone();
                async move {
                    redis::cmd("XREVRANGE")
                        .arg(key)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(n.max(1))
                        .query_async(&mut conn)
                        .await
                }
            })
            .await?;
        reply
            .ids
            .into_iter()
            .take(n)
            .map(|entry| {
                let text = |field: &str| -> Result<String> {
                    entry.get::<String>(field).ok_or_else(|| {
                        Error::Corrupt(format!("log entry {}: no {field}", entry.id))
                    })
                };
                let number = |field: &str| -> Result<u64> {
                    text(field)?.parse().map_err(|_| {
                        Error::Corrupt(format!("log entry {}: {field} is not a number", entry.id))
                    })
                };
                Ok(LogEntry {
                    at_ms: number("at_ms")?,
                    origin: text("origin")?,
                    change: text("change")?,
                    version: number("version")?,
                    id: entry.id.clone(),
                })
            })
            .collect()
    }

    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool> {
        check_worker(worker)?;
        check_report(report)?;
        let now = self.clock.now_ms();
        let json = serde_json::to_string(report).expect("a report serializes");
        let keys = [self.keys.record(), self.keys.log(), self.keys.prober()];
        // Safe to repeat: a repeated report writes the same finding.
        let written: i64 = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.scripts.probe.prepare_invoke();
            invocation.key(&keys[0]).key(&keys[1]).key(&keys[2]);
            invocation.arg(now).arg(worker).arg(&json);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        Ok(written == 1)
    }

    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<bool> {
        check_worker(worker)?;
        let term = check_term(term)?;
        let key = self.keys.prober();
        // Safe to repeat: a renewal by the leader is idempotent.
        let led: i64 = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.scripts.lead.key(&key);
            invocation.arg(worker).arg(term);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        Ok(led == 1)
    }
}

impl<C> std::fmt::Debug for RedisControlStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisControlStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}
