//! `run`: maps the command line onto a [`Runner`](crate::Runner) (the one composition
//! root), plans first when `--min`/`--max` ask for a one-shot run, and reports the
//! outcome.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use tranche_active_store::{Plan, Planner};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::archive::{embedded_archive_bytes, entries, stalled_outcome};
use crate::cli::args::RunArgs;
use crate::cli::common::{Global, Outcome, signals};
use crate::cli::render;
use crate::job::Job;
use crate::runner::Runner;
use crate::sync::until;
use crate::work::Stop;

/// How long a run stopped by a signal may take, once the grace period is over, to
/// stop its chunks and release their leases: the chunks' own stop (SIGTERM, SIGKILL two
/// seconds later) and a moment for the store.
const ABORT_BOUND: Duration = Duration::from_secs(5);

/// `tranche run`'s flags mapped onto the library's [`Runner`]: the one place a run is
/// assembled. Refuses what the flags cannot mean together.
pub(super) fn runner_of(g: &Global, args: &RunArgs) -> Result<Runner> {
    if args.lease < Duration::from_millis(300) {
        bail!("--lease must be at least 300ms");
    }
    let control = crate::cli::control::options(&args.control, args.database_url.as_deref())?;
    if !args.simulate && (args.sim_fail.is_some() || args.sim_latency.is_some()) {
        bail!("--sim-fail and --sim-latency only shape --simulate; they do nothing with --exec");
    }
    let mut runner = Runner::at(g.location())
        .concurrency(args.concurrency as usize)
        .parallel(args.parallel as usize)
        .chunk(args.chunk)
        .split(!args.no_split)
        .split_min(args.split_min)
        .lease(args.lease)
        .max_attempts(args.max_attempts)
        .backoff(args.backoff)
        .grace(args.grace)
        .follow(args.follow)
        .tiers(args.tiers.tiers())
        .background(!args.no_reaper, !args.no_archiver, !args.no_heartbeat)
        .snapshots(args.snapshots.policy())
        .control_options(control)
        .observer(Arc::new(crate::cli::observe::RunObserver::new(
            args.metrics_listen,
        )));
    if let Some(window) = args.window {
        runner = runner.window(window as usize);
    }
    if let Some(prefetch) = args.prefetch {
        runner = runner.prefetch(prefetch as usize);
    }
    if let Some(id) = &args.worker_id {
        runner = runner.worker_id(id.clone());
    }
    if let Some(trace) = crate::cli::telemetry::trace_context() {
        runner = runner.trace_context(trace);
    }
    Ok(runner)
}

/// `--sql`'s statement_timeout and lock_timeout without `--chunk-timeout`.
const SQL_CHUNK_TIMEOUT: Duration = Duration::from_secs(60);

/// What each chunk runs: `--exec`'s command, `--exec-persistent`'s warm processes,
/// `--sql`'s statement or `--simulate`'s load. `--sql` connects and prepares its
/// statement here, before anything is planned or claimed: a statement the database
/// refuses, or a database out of reach, ends the run in one line, nothing written.
pub(super) async fn job_of(args: &RunArgs) -> Result<Job> {
    if let Some(cmd) = &args.exec_persistent {
        let warm = crate::job::Persistent::new(cmd.clone(), args.chunk_timeout);
        return Ok(Job::Persistent(Arc::new(warm)));
    }
    match (&args.exec, &args.sql, args.simulate) {
        (Some(cmd), None, false) => Ok(Job::Exec(cmd.clone())),
        (None, Some(statement), false) => {
            let Some(url) = &args.database_url else {
                bail!("--sql needs --database-url (or TRANCHE_DATABASE_URL)");
            };
            let slots = args.concurrency as usize * args.parallel as usize;
            let mut config = crate::SqlConfig::new(url.clone(), statement.clone())
                .slots(slots)
                .chunk_timeout(args.chunk_timeout.unwrap_or(SQL_CHUNK_TIMEOUT))
                .constraint_violations_permanent(args.constraint_permanent);
            if let Some(n) = args.db_connections {
                config = config.db_connections(n as usize);
            }
            if let Some(column) = &args.fence_column {
                config = config.fence_column(column.clone());
            }
            let sql = crate::SqlHandler::connect(config)
                .await
                .map_err(|e| anyhow::anyhow!("--sql: {e}"))?;
            Ok(Job::Handler(crate::handler::HandlerRef(Arc::new(sql))))
        }
        (None, None, true) => Ok(Job::Simulate {
            latency: args.sim_latency.unwrap_or((1, 5)),
            fail: args.sim_fail.unwrap_or(0.0),
        }),
        _ => bail!("give exactly one of --exec CMD, --sql STATEMENT or --simulate"),
    }
}

/// `run --min A --max B`: plans the range through the library's own plan path
/// ([`Runner::plan`]) when the namespace has no plan; the same plan again is a rerun
/// (it resumes); any other plan is refused, naming both, before anything is written.
pub(super) async fn plan_once(runner: &Runner, min: u64, max: u64, size: u64) -> Result<()> {
    tranche_codec::PlanGeometry::new(1, min, max, size)
        .map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
    let wanted = crate::Plan::ids(min..=max).partition_size(size);
    let namespace = &runner.location().namespace;
    // Opened as `plan` opens it; closed again before `Runner::plan` opens its own.
    let held = runner
        .open(Open::Create, Tuning::default())
        .await?
        .active
        .plans()
        .await?;
    if held.is_empty() {
        runner.plan(wanted.clone()).await?;
        tracing::info!(
            "planned {} partitions (IDs {min}..={max} by {size}) in `{namespace}`",
            wanted.partitions()
        );
        return Ok(());
    }
    if held.iter().any(|e| Plan::from(e) == wanted.to_store()) {
        tracing::info!("`{namespace}` already holds this plan: resuming it");
        return Ok(());
    }
    let plans: Vec<String> = held
        .iter()
        .map(|e| {
            format!(
                "IDs {}..={} by {}",
                e.plan.min(),
                e.plan.max(),
                e.plan.size()
            )
        })
        .collect();
    bail!(
        "namespace `{namespace}` holds plan {}, not IDs {min}..={max} by {size}: nothing written (run without --min/--max to resume it, or pick another --namespace)",
        plans.join(", ")
    )
}

pub(super) async fn run(g: &Global, args: RunArgs) -> Result<Outcome> {
    let runner = runner_of(g, &args)?;
    // Before the plan and the store: a job that cannot run writes nothing.
    let job = job_of(&args).await?;
    if let (Some(min), Some(max)) = (args.min, args.max) {
        plan_once(&runner, min, max, args.size).await?;
    }
    // Held until `run` returns: a restart takes the same name back (see `slot`).
    let mut slot = None;
    let worker = runner.worker_name(&mut slot);
    let stop = signals(args.grace)?;
    let backend =
        Backend::open_writable(runner.location(), Open::Existing, runner.tuning(&worker)).await?;
    // Once the namespace is known to exist: bad input stays a one-line error.
    if args.simulate {
        tracing::warn!("SIMULATED load: chunks sleep and fail at random; nothing is processed");
    }
    let memory_before = backend.used_memory().await;
    let mut watched = stop.clone();
    let run = runner.run_on(&backend, job, worker, stop);
    tokio::pin!(run);
    // A signal's drain is bounded even when every store call fails (Redis gone): once
    // the grace period is over and chunks are stopped, the run gets ABORT_BOUND to
    // release its leases, then it is dropped (its chunks' guards kill what is left)
    // and the leases expire on their own.
    let result = tokio::select! {
        result = &mut run => result.map_err(anyhow::Error::from),
        () = async {
            until(&mut watched, |s| *s == Stop::Abort).await;
            tokio::time::sleep(ABORT_BOUND).await;
        } => {
            tracing::warn!(
                "the store did not answer within {ABORT_BOUND:?} of the abort: exiting; unreleased leases expire on their own"
            );
            return Ok(Outcome::Interrupted);
        }
    };
    let signalled = *watched.borrow() != Stop::Running;
    let report = match result {
        Ok(report) => report,
        // A signal asked to stop: the store's trouble on the way out does not change
        // why the run ended.
        Err(err) if signalled => {
            tracing::warn!(
                err = %crate::cli::common::one_line(&err),
                "stopped by a signal; the store failed on the way out (unreleased leases expire on their own)"
            );
            return Ok(Outcome::Interrupted);
        }
        Err(err) => return Err(err),
    };
    // The summary's reads wait no longer than the abort did once a signal came.
    let bound = if signalled {
        ABORT_BOUND
    } else {
        Duration::MAX
    };
    let memory_after = tokio::time::timeout(bound, backend.used_memory())
        .await
        .ok()
        .flatten();
    let stats = tokio::time::timeout(bound, backend.stats.summary())
        .await
        .ok()
        .and_then(Result::ok);
    let archive_bytes = match (memory_before, memory_after) {
        // Below ten thousand partitions fixed overheads would dominate the figure.
        (Some(a), Some(b)) if report.completed >= 10_000 => Some(
            render::ArchiveBytes::RedisGrowth(b.saturating_sub(a) as f64 / report.completed as f64),
        ),
        _ if backend.is_embedded() => embedded_archive_bytes(&backend).await,
        _ => None,
    };
    if g.json {
        println!(
            "{}",
            render::run_summary_json(&report, stats.as_ref(), archive_bytes.as_ref())
        );
    } else {
        print!(
            "{}",
            render::run_summary(&report, stats.as_ref(), archive_bytes.as_ref())
        );
    }
    if let Some(reason) = report.broken {
        return Ok(Outcome::Failed(format!(
            "{reason}; stopped before spending any attempt (its partitions are pending again)"
        )));
    }
    if report.interrupted {
        return Ok(Outcome::Interrupted);
    }
    if report.counts.failed > 0 {
        return Ok(Outcome::Failed(format!(
            "{} partition(s) failed (see `tranche status`; `tranche retry-failed` requeues them)",
            report.counts.failed
        )));
    }
    if !report.stalls.is_empty() {
        let left = match backend.inbox_len().await {
            Ok(n) => entries(n),
            Err(_) => "inbox entries".to_owned(),
        };
        return Ok(Outcome::Failed(stalled_outcome(&report.stalls, &left)));
    }
    Ok(Outcome::Success)
}
