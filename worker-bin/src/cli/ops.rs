//! One function per subcommand (those that move an archive are in
//! [`transfer`](crate::cli::transfer), `check` and `health` in [`health`](crate::cli::health)).
//! Each opens the namespace, does its one thing and returns an
//! [`Outcome`]; printing goes through [`render`](crate::cli::render), what every
//! command shares (options, outcome, signals) is in [`common`](crate::cli::common).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tranche_active_store::{Config as ActiveConfig, MemoryActiveStore, Plan, Planner};
use tranche_archive_store::Snapshots;

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::args::{
    ArchiveArgs, Cli, Command, ExportArgs, ImportArgs, PlanArgs, RunArgs, StatusArgs,
};
use crate::cli::common::{Global, Outcome, say, signals};
use crate::cli::inspect::{pieces_of, state_of, status_of};
use crate::cli::render;
use crate::job::Job;
use crate::runner::Runner;
use crate::slot;
use crate::sync::until;
use crate::work::Stop;

/// Runs the command the user asked for: opens what it needs and hands it to the
/// command's own function.
pub(crate) async fn dispatch(cli: Cli) -> Result<Outcome> {
    let g = &cli.global;
    let json = g.json;
    match cli.command {
        Command::Plan(args) => {
            crate::cli::doctor::warn_at_start(g).await;
            let backend = Backend::open(&g.location(), Open::Create, Tuning::default()).await?;
            plan(&backend, &args, json).await
        }
        Command::Run(args) => {
            crate::cli::doctor::warn_at_start(g).await;
            run(g, *args).await
        }
        Command::Archive(args) => archive(g, args).await,
        Command::Status(args) => status(&existing(g).await?, &args, json).await,
        Command::Get { pid } => get(existing(g).await?, pid, json).await,
        Command::Locate { id } => locate(existing(g).await?, id, json).await,
        Command::Stats { ranges } => stats(existing(g).await?, ranges, json).await,
        Command::List {
            status,
            worker,
            after,
            limit,
        } => {
            let backend = existing(g).await?;
            let page =
                crate::cli::list::page(&backend, status, worker.as_deref(), after, limit as usize)
                    .await?;
            print!("{}", crate::cli::list::render(&page, json));
            Ok(Outcome::Success)
        }
        Command::DeadLetters { limit } => {
            let dead = existing(g).await?.archive.dead_letters(limit).await?;
            print!("{}", render::dead_letters(&dead, json));
            Ok(Outcome::Success)
        }
        Command::Set(args) => crate::cli::control::set(g, &args).await,
        Command::Throttle(c) => crate::cli::control::throttle(g, &c).await,
        Command::Control(c) => crate::cli::control::control(g, &c).await,
        Command::Pause => crate::cli::namespace::set_paused(g, true).await,
        Command::Resume => crate::cli::namespace::set_paused(g, false).await,
        Command::Plans => crate::cli::namespace::plans(g).await,
        Command::ArchiveFormat { raise } => crate::cli::namespace::archive_format(g, raise).await,
        Command::Namespaces => crate::cli::namespace::list(g).await,
        Command::Serve(args) => {
            crate::cli::doctor::warn_at_start(g).await;
            crate::cli::serve::serve(g, args).await
        }
        Command::Drop { yes, force } => crate::cli::namespace::drop(g, yes, force).await,
        Command::Workers => {
            let workers = crate::query::Job::from_backend(existing(g).await?)
                .workers()
                .await?;
            print!(
                "{}",
                render::workers(&workers, crate::duration::now_ms(), json)
            );
            Ok(Outcome::Success)
        }
        Command::RetryFailed { pid } => retry_failed(&existing(g).await?, pid, json).await,
        Command::Discard { pid, force: true } => {
            existing(g).await?.force_discard(pid).await?;
            say(
                json,
                format_args!("partition {pid} discarded (its record replaced)"),
                serde_json::json!({"discarded": pid, "forced": true}),
            );
            Ok(Outcome::Success)
        }
        Command::Discard { pid, force: false } => discard(&existing(g).await?, pid, json).await,
        Command::Export(ExportArgs {
            to_hash: Some(key), ..
        }) => crate::cli::seed::export(&existing(g).await?, &key, json).await,
        Command::Export(args) => {
            crate::cli::transfer::export(&existing(g).await?, &args, json).await
        }
        Command::Import(ImportArgs {
            file: Some(file), ..
        }) => crate::cli::transfer::import(g, &file).await,
        Command::Import(args) => crate::cli::seed::import(g, &args).await,
        Command::Compact => compact(&existing(g).await?, json).await,
        Command::Check { repair } => {
            crate::cli::health::check(&existing(g).await?, repair, json).await
        }
        Command::Health(args) => crate::cli::health::health(&existing(g).await?, &args, json).await,
        Command::Doctor(args) => crate::cli::doctor::doctor(g, &args).await,
        Command::Completions { shell } => crate::cli::generate::completions(shell),
        Command::Man => crate::cli::generate::man(),
        Command::CliMarkdown => crate::cli::generate::markdown(),
    }
}

/// The namespace the global options name, which must exist (have a plan).
async fn existing(g: &Global) -> Result<Backend> {
    Ok(Backend::open(&g.location(), Open::Existing, Tuning::default()).await?)
}

/// `get`: one partition, with the pieces a split cut off it.
async fn get(backend: Backend, pid: u64, json: bool) -> Result<Outcome> {
    let active = backend.active.clone();
    let view = crate::query::Job::from_backend(backend).get(pid).await?;
    let pieces = pieces_of(active.as_ref(), &view).await?;
    print!("{}", render::view(pid, &view, &pieces, json));
    Ok(Outcome::Success)
}

/// `locate`: the partition that covered row ID `id`.
async fn locate(backend: Backend, id: u64, json: bool) -> Result<Outcome> {
    let namespace = backend.namespace.clone();
    match crate::query::Job::from_backend(backend).locate(id).await? {
        Some(located) => {
            print!("{}", render::located(&located, json));
            Ok(Outcome::Success)
        }
        None => bail!("no plan of namespace `{namespace}` covers row ID {id}"),
    }
}

/// `stats`, with every range's statistics when `ranges`.
async fn stats(backend: Backend, ranges: bool, json: bool) -> Result<Outcome> {
    let merged = if ranges {
        backend.router.stats_with_ranges().await?
    } else {
        crate::query::Job::from_backend(backend).stats().await?
    };
    print!("{}", render::stats(&merged, json)?);
    Ok(Outcome::Success)
}

/// `retry-failed`: one failed partition, or every one, pending again.
async fn retry_failed(backend: &Backend, pid: Option<u64>, json: bool) -> Result<Outcome> {
    backend.ensure_writable()?;
    let pids = backend.active.retry_failed(pid).await?;
    backend.save().await?;
    if let (Some(pid), true) = (pid, pids.is_empty()) {
        bail!("partition {pid} is not failed");
    }
    say(
        json,
        format_args!("{} failed partition(s) pending again", pids.len()),
        serde_json::json!({"retried": pids}),
    );
    Ok(Outcome::Success)
}

/// `discard` without `--force`: only a pending or failed partition, never half.
async fn discard(backend: &Backend, pid: u64, json: bool) -> Result<Outcome> {
    backend.ensure_writable()?;
    let discarded = match backend.active.discard(pid).await {
        // A record the store cannot read is never half-discarded: say so, and
        // what removes it.
        Err(err) if err.to_string().contains("corrupt record") => {
            bail!("{err}: nothing discarded (`discard {pid} --force` replaces the record)")
        }
        other => other?,
    };
    if !discarded {
        let now = state_of(backend, pid).await;
        bail!("partition {pid} is not pending or failed (it is {now}): nothing discarded");
    }
    backend.save().await?;
    say(
        json,
        format_args!("partition {pid} discarded"),
        serde_json::json!({"discarded": pid, "forced": false}),
    );
    Ok(Outcome::Success)
}

/// `compact`: seal the open archive batches now.
async fn compact(backend: &Backend, json: bool) -> Result<Outcome> {
    backend.ensure_writable()?;
    let sealed = backend.archive.compact().await?;
    backend.save().await?;
    say(
        json,
        format_args!("{sealed} batch(es) sealed"),
        serde_json::json!({"sealed": sealed}),
    );
    Ok(Outcome::Success)
}

/// How long a run stopped by a signal may take, once the grace period is over, to
/// stop its chunks and release their leases: the chunks' own stop (SIGTERM, SIGKILL two
/// seconds later) and a moment for the store.
const ABORT_BOUND: Duration = Duration::from_secs(5);

async fn plan(backend: &Backend, args: &PlanArgs, json: bool) -> Result<Outcome> {
    // Validate as the store will, before anything is written.
    let geometry = tranche_codec::PlanGeometry::new(1, args.min, args.max, args.size)
        .map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
    let plan = Plan::Uniform {
        min: args.min,
        max: args.max,
        size: args.size,
    };
    if args.dry_run {
        // The store's own validation, on a scratch copy of the plan registry: a dry
        // run refuses exactly what `plan` would (an overlap with an existing plan, a
        // plan past what the shards' bitmaps hold), with the same message.
        let scratch = MemoryActiveStore::new(ActiveConfig {
            namespace: backend.namespace.clone(),
            num_shards: backend.shards,
            layout: backend.schema()?.layout(),
            ..ActiveConfig::default()
        })?;
        for entry in backend.active.plans().await? {
            scratch.plan(&Plan::from(&entry)).await?;
        }
        scratch.plan(&plan).await.map_err(plan_refused)?;
        print!(
            "{}",
            render::plan_cost(&geometry, backend.shards, &args.tiers.tiers(), json)
        );
        return Ok(Outcome::Success);
    }
    backend.ensure_writable()?;
    let outcome = backend.active.plan(&plan).await.map_err(plan_refused)?;
    backend.register_namespace().await?;
    backend.save().await?;
    let entry = outcome
        .entries
        .last()
        .context("the store returned no plan")?;
    let p = &entry.plan;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "namespace": backend.namespace, "created": outcome.created,
                "first_pid": p.first_pid(), "last_pid": p.last_pid(), "partitions": p.partitions(),
                "min_id": p.min(), "max_id": p.max(), "size": p.size(), "shards": backend.shards,
            })
        );
    } else if outcome.created {
        println!(
            "planned {} partitions (pids {}..={}, IDs {}..={} by {}) in `{}` on {}",
            p.partitions(),
            p.first_pid(),
            p.last_pid(),
            p.min(),
            p.max(),
            p.size(),
            backend.namespace,
            backend.location()
        );
    } else {
        println!(
            "already planned: pids {}..={} in `{}`; nothing changed",
            p.first_pid(),
            p.last_pid(),
            backend.namespace
        );
    }
    Ok(Outcome::Success)
}

/// The store's refusal of a plan as the command says it.
fn plan_refused(e: tranche_active_store::Error) -> anyhow::Error {
    match e {
        // The store's refusal already says "invalid plan: …".
        tranche_active_store::Error::InvalidPlan(_) => anyhow::Error::new(e),
        other => anyhow::Error::new(other).context("cannot register the plan"),
    }
}

/// `tranche run`'s flags mapped onto the library's [`Runner`]: the one place a run is
/// assembled. Refuses what the flags cannot mean together.
fn runner_of(g: &Global, args: &RunArgs) -> Result<Runner> {
    if args.lease < Duration::from_millis(300) {
        bail!("--lease must be at least 300ms");
    }
    let control = crate::cli::control::options(&args.control)?;
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
    Ok(runner)
}

/// What each chunk runs: `--exec`'s command, or `--simulate`'s load.
fn job_of(args: &RunArgs) -> Result<Job> {
    match (&args.exec, args.simulate) {
        (Some(cmd), false) => Ok(Job::Exec(cmd.clone())),
        (None, true) => {
            tracing::warn!("SIMULATED load: chunks sleep and fail at random; nothing is processed");
            Ok(Job::Simulate {
                latency: args.sim_latency.unwrap_or((1, 5)),
                fail: args.sim_fail.unwrap_or(0.0),
            })
        }
        _ => bail!("give exactly one of --exec CMD or --simulate"),
    }
}

/// `run --min A --max B`: plans the range through the library's own plan path
/// ([`Runner::plan`]) when the namespace has no plan; the same plan again is a rerun
/// (it resumes); any other plan is refused, naming both, before anything is written.
async fn plan_once(runner: &Runner, min: u64, max: u64, size: u64) -> Result<()> {
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

async fn run(g: &Global, args: RunArgs) -> Result<Outcome> {
    let runner = runner_of(g, &args)?;
    if let (Some(min), Some(max)) = (args.min, args.max) {
        plan_once(&runner, min, max, args.size).await?;
    }
    // Held until `run` returns: a restart takes the same name back (see `slot`).
    let mut slot = None;
    let worker = runner.worker_name(&mut slot);
    let stop = signals(args.grace)?;
    let backend =
        Backend::open_writable(runner.location(), Open::Existing, runner.tuning(&worker)).await?;
    let job = job_of(&args)?;
    let memory_before = backend.used_memory().await;
    let mut watched = stop.clone();
    let run = runner.run_on(&backend, job, worker, stop);
    tokio::pin!(run);
    // A signal's drain is bounded even when every store call fails (Redis gone): once
    // the grace period is over and chunks are stopped, the run gets ABORT_BOUND to
    // release its leases, then it is dropped (its chunks' guards kill what is left)
    // and the leases expire on their own.
    let result = tokio::select! {
        result = &mut run => result,
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

/// The one line a drain that ended on stalled shards says: which, what is left, why
/// and how to repair.
fn stalled_outcome(stalls: &[tranche_archive_store::Stall], left: &str) -> String {
    let shards: Vec<String> = stalls.iter().map(|s| s.shard.to_string()).collect();
    let why: Vec<String> = stalls
        .iter()
        .map(|s| format!("shard {}: {}", s.shard, render::shown(&s.reason)))
        .collect();
    let repair = if stalls.iter().all(|s| s.stats_damaged()) {
        "`tranche check --repair` rebuilds damaged statistics, then `tranche archive` drains them"
    } else {
        "`tranche check` names the damage and `tranche check --repair` repairs it, then `tranche archive` drains them"
    };
    format!(
        "archive stalled on shard{} {}: {left} left ({}); {repair}",
        if shards.len() == 1 { "" } else { "s" },
        shards.join(", "),
        why.join("; "),
    )
}

/// `n inbox entries`.
fn entries(n: u64) -> String {
    format!("{n} inbox entr{}", if n == 1 { "y" } else { "ies" })
}

/// Archive bytes per archived partition in the embedded store: its dump's size.
async fn embedded_archive_bytes(backend: &Backend) -> Option<render::ArchiveBytes> {
    let dump = backend
        .archive
        .export(crate::duration::now_ms())
        .await
        .ok()?;
    let entries = dump.entries();
    let bytes = dump.to_bytes().ok()?.len();
    (entries > 0).then(|| render::ArchiveBytes::Dump(bytes as f64 / entries as f64))
}

async fn archive(g: &Global, args: ArchiveArgs) -> Result<Outcome> {
    let ArchiveArgs {
        follow,
        tiers,
        snapshots,
    } = args;
    let mut slot = None;
    let tuning = Tuning {
        tiers: Some(tiers.tiers()),
        consumer: format!("archiver-{}", slot::default_name("archiver", &mut slot)),
        claim_idle: crate::duration::claim_idle(),
        ..Tuning::default()
    };
    let stop = signals(Duration::from_secs(5))?;
    let backend = Backend::open_writable(&g.location(), Open::Existing, tuning).await?;
    if follow {
        let mut s = stop.clone();
        let snapshots = Snapshots {
            stats: backend.stats.clone(),
            policy: snapshots.policy(),
        };
        tranche_archive_store::run(backend.archive.as_ref(), Some(snapshots), async move {
            let _ = s.wait_for(|s| *s != Stop::Running).await;
        })
        .await;
    }
    let stalls = crate::work::drain_archive(&backend, &stop).await;
    if let Err(err) = backend.stats.publish_snapshot().await {
        tracing::warn!(%err, "statistics snapshot failed");
    }
    backend.save().await?;
    let left = backend.inbox_len().await?;
    if left == 0 || stalls.is_empty() {
        say(
            g.json,
            format_args!("archive drained; {} left", entries(left)),
            serde_json::json!({"inbox_left": left}),
        );
    } else {
        let mut text = format!(
            "archived what could be; {} left, on stalled shard(s):",
            entries(left)
        );
        for s in &stalls {
            text.push_str(&format!(
                "\n  shard {}: {}",
                s.shard,
                render::shown(&s.reason)
            ));
        }
        say(
            g.json,
            text,
            serde_json::json!({"inbox_left": left, "stalled": stalls}),
        );
    }
    if *stop.borrow() != Stop::Running {
        return Ok(Outcome::Interrupted);
    }
    if left > 0 && !stalls.is_empty() {
        return Ok(Outcome::Failed(stalled_outcome(&stalls, &entries(left))));
    }
    Ok(Outcome::Success)
}

async fn status(backend: &Backend, args: &StatusArgs, json: bool) -> Result<Outcome> {
    let stop = if args.watch {
        Some(signals(Duration::ZERO)?)
    } else {
        None
    };
    loop {
        let status = status_of(backend).await?;
        let out = render::status(&status, json);
        let Some(stop) = &stop else {
            print!("{out}");
            return Ok(Outcome::Success);
        };
        if json {
            // One JSON object per line and refresh: a stream a program can read.
            use std::io::Write;
            print!("{out}");
            let _ = std::io::stdout().flush();
        } else {
            // Clear the screen and redraw, as `watch` does.
            print!("\x1b[2J\x1b[H{out}");
        }
        let mut s = stop.clone();
        tokio::select! {
            () = until(&mut s, |s| *s != Stop::Running) => return Ok(Outcome::Success),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}
