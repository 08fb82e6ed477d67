//! The control store of a fleet: the scripts of `lua/` on the namespace's `{ns}` slot.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use tranche_codec::lua::{self, Fragment};
use tranche_codec::{Clock, KeySchema};

use super::{
    ControlKeys, ControlStore, LOG_CAP, Lead, Repaired, SetOutcome, check_term, check_worker,
    fit_report,
};
use crate::record::change_json;
use crate::{Change, ControlRecord, Error, LogEntry, ProbeReport, Result};

/// The control store of a fleet: `lua/set.lua`, `lua/probe.lua`, `lua/lead.lua` and
/// `lua/repair.lua` on the namespace's `{ns}` slot.
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
    repair: redis::Script,
    retire: redis::Script,
}

/// `lua/control.lua`: the prelude of every script of the crate, after `common.lua`.
const CONTROL: Fragment = Fragment::new(include_str!("../../lua/control.lua"));

/// The script `lua/NAME.lua` composed by [`lua::compose`]: `common.lua`, the crate's
/// prelude, then the script. Composed once, so its text is `&'static str`.
macro_rules! composed {
    ($name:literal) => {{
        static TEXT: LazyLock<String> = LazyLock::new(|| {
            lua::compose(&[
                &CONTROL,
                &Fragment::new(include_str!(concat!("../../lua/", $name, ".lua"))),
            ])
        });
        TEXT.as_str()
    }};
}

/// `take.lua`, composed: the rate limiter's script (`limiter.rs`).
pub(crate) fn take_lua() -> &'static str {
    composed!("take")
}

impl Scripts {
    fn new() -> Self {
        Self {
            set: redis::Script::new(composed!("set")),
            probe: redis::Script::new(composed!("probe")),
            lead: redis::Script::new(composed!("lead")),
            repair: redis::Script::new(composed!("repair")),
            retire: redis::Script::new(composed!("retire")),
        }
    }
}

/// Every script of the crate with the keys it is given for `schema`, for the tests that
/// run each with bad arguments and check each keeps to one slot. Not an API.
#[cfg(feature = "testing")]
pub fn scripts(schema: &KeySchema) -> Vec<(&'static str, &'static str, Vec<String>)> {
    let keys = ControlKeys::new(schema);
    vec![
        ("take.lua", take_lua(), vec![keys.rate(crate::Limit::Ids)]),
        (
            "set.lua",
            composed!("set"),
            vec![keys.record(), keys.log(), keys.quarantine()],
        ),
        (
            "probe.lua",
            composed!("probe"),
            vec![keys.record(), keys.log(), keys.prober()],
        ),
        ("lead.lua", composed!("lead"), vec![keys.prober()]),
        (
            "repair.lua",
            composed!("repair"),
            vec![keys.record(), keys.log(), keys.quarantine()],
        ),
        (
            "retire.lua",
            composed!("retire"),
            vec![keys.record(), keys.log(), keys.prober()],
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

    async fn change(
        &self,
        change: String,
        origin: &str,
        since_ms: Option<u64>,
    ) -> Result<SetOutcome> {
        let now = self.clock.now_ms();
        let keys = [self.keys.record(), self.keys.log(), self.keys.quarantine()];
        // Not retried: a change whose reply was lost may have been applied, and applying
        // it twice would log it twice. The caller (a person at the CLI) sees the error.
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.set.prepare_invoke();
        invocation.key(&keys[0]).key(&keys[1]).key(&keys[2]);
        invocation.arg(now).arg(origin).arg(&change);
        if let Some(since) = since_ms {
            invocation.arg(since);
        }
        let (record, skipped): (Vec<u8>, String) = invocation.invoke_async(&mut conn).await?;
        let skipped = serde_json::from_str(&skipped)
            .map_err(|e| Error::Corrupt(format!("set.lua's skipped list: {e}")))?;
        Ok(SetOutcome {
            record: ControlRecord::decode(&record),
            skipped,
        })
    }

    /// The record's bytes as stored.
    async fn raw(&self) -> Result<Option<Vec<u8>>> {
        let key = self.keys.record();
        Ok(tranche_codec::retry::retry(&self.conn, |mut conn| {
            let key = key.clone();
            async move { redis::cmd("GET").arg(key).query_async(&mut conn).await }
        })
        .await?)
    }
}

#[async_trait]
impl<C> ControlStore for RedisControlStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn read(&self) -> Result<ControlRecord> {
        Ok(self
            .raw()
            .await?
            .map_or_else(ControlRecord::default, |raw| ControlRecord::decode(&raw)))
    }

    async fn set_if(
        &self,
        changes: &[Change],
        origin: &str,
        since_ms: Option<u64>,
    ) -> Result<SetOutcome> {
        self.change(change_json(changes, None)?, origin, since_ms)
            .await
    }

    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        Ok(self
            .change(change_json(&[], Some((on, reason)))?, origin, None)
            .await?
            .record)
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
                        .arg(n.clamp(1, LOG_CAP))
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
        let report = fit_report(report);
        let now = self.clock.now_ms();
        let json = serde_json::to_string(&report).expect("a report serializes");
        let keys = [self.keys.record(), self.keys.log(), self.keys.prober()];
        // Safe to repeat: a repeated report writes the same finding.
        let leads: i64 = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.scripts.probe.prepare_invoke();
            invocation.key(&keys[0]).key(&keys[1]).key(&keys[2]);
            invocation.arg(now).arg(worker).arg(&json);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        Ok(leads == 1)
    }

    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<Lead> {
        check_worker(worker)?;
        let term = check_term(term)?;
        let key = self.keys.prober();
        // Safe to repeat: a renewal by the leader is idempotent.
        let (leads, repaired): (i64, i64) = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.scripts.lead.key(&key);
            invocation.arg(worker).arg(term);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        if repaired == 1 {
            tracing::warn!(%key, "the prober key had no TTL; gave it the term as one");
        }
        Ok(Lead {
            leads: leads == 1,
            repaired_ttl: repaired == 1,
        })
    }

    async fn retire_probe(&self, worker: &str) -> Result<bool> {
        check_worker(worker)?;
        let now = self.clock.now_ms();
        let keys = [self.keys.record(), self.keys.log(), self.keys.prober()];
        // Safe to repeat: a second retirement finds nothing and writes nothing.
        let removed: i64 = tranche_codec::retry::retry(&self.conn, |mut conn| {
            let mut invocation = self.scripts.retire.prepare_invoke();
            invocation.key(&keys[0]).key(&keys[1]).key(&keys[2]);
            invocation.arg(now).arg(worker);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await?;
        Ok(removed == 1)
    }

    async fn repair(&self, origin: &str) -> Result<Option<Repaired>> {
        crate::record::check_origin(origin)?;
        let keys = [self.keys.record(), self.keys.log(), self.keys.quarantine()];
        // A change between the read and the write makes the script refuse; read again.
        for _ in 0..5 {
            let Some(raw) = self.raw().await? else {
                return Ok(None);
            };
            let record = ControlRecord::decode(&raw);
            if record.rejected.is_empty() {
                return Ok(None);
            }
            let log = self.log(LOG_CAP).await?;
            let (fixed, note) = crate::repair::rebuild(&record, &log);
            let encoded = fixed.encode();
            let now = self.clock.now_ms();
            let mut conn = self.conn.clone();
            let mut invocation = self.scripts.repair.prepare_invoke();
            invocation.key(&keys[0]).key(&keys[1]).key(&keys[2]);
            invocation
                .arg(now)
                .arg(origin)
                .arg(&raw)
                .arg(&encoded)
                .arg(&note);
            let replaced: i64 = invocation.invoke_async(&mut conn).await?;
            if replaced == 1 {
                return Ok(Some(Repaired {
                    rejected: record.rejected,
                    record: ControlRecord::decode(encoded.as_bytes()),
                    note,
                }));
            }
        }
        Err(Error::Corrupt(
            "{ns}:control kept changing during the repair".to_owned(),
        ))
    }
}

impl<C> std::fmt::Debug for RedisControlStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisControlStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}
