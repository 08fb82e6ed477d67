//! `run`'s SQL probe flags (`--throttle-sql`, `--throttle-pg`, `--keep-below-sql`)
//! mapped onto one [`SqlProbe`] on `--probe-database-url`, or `--database-url` without it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tranche_control::Probe;

use crate::SqlProbe;
use crate::cli::args::RunControlArgs;

/// The SQL probe the flags ask for, if any: its queries in the order throttle, the
/// indicators, then the metric, each answering within `timeout`.
pub(crate) fn probe(
    a: &RunControlArgs,
    database_url: Option<&str>,
    timeout: Duration,
) -> Result<Option<Arc<dyn Probe>>> {
    if a.throttle_sql.is_none() && a.throttle_pg.is_none() && a.keep_below_sql.is_none() {
        return Ok(None);
    }
    // clap requires one of the two with each of them.
    let url = a
        .probe_database_url
        .as_deref()
        .or(database_url)
        .context("the SQL probes need --probe-database-url or --database-url")?;
    let mut probe = SqlProbe::new(url, timeout);
    if let Some(query) = &a.throttle_sql {
        probe = probe.throttle_when(query.clone());
    }
    if let Some(spec) = &a.throttle_pg {
        probe = probe.pg_indicators(spec)?;
    }
    if let Some(query) = &a.keep_below_sql {
        probe = probe.metric(query.clone());
    }
    Ok(Some(Arc::new(probe)))
}
