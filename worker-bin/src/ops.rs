//! One function per subcommand, and the signal handling `run`, `archive` and
//! `status --watch` share. Each opens the namespace, does its one thing and returns an
//! [`Outcome`]; printing goes through [`render`](crate::render).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tranche_active_store::{Config as ActiveConfig, Plan, PlanEntry, StatusCounts};
use tranche_archive_store::{Dump, DumpPlan, Snapshots, Tier};
use tranche_codec::KeySchema;
use tranche_stats::{Stats, StatsDelta, diff};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::{
    ArchiveArgs, Cli, Command, ExportArgs, HealthArgs, ImportArgs, PlanArgs, RunArgs, StatusArgs,
};
use crate::job::Job;
use crate::render;
use crate::slot;
use crate::work::until;
use crate::work::{self, Settings, Stop};

/// How a command ended, when it did not fail outright.
#[derive(Debug)]
pub(crate) enum Outcome {
    Success,
    /// It ran, and what it found is a failure (failed partitions, a firing alert).
    Failed(String),
    /// A signal stopped it; state was checkpointed.
    Interrupted,
}

/// Runs the command the user asked for.
pub(crate) async fn dispatch(cli: Cli) -> Result<Outcome> {
    let g = &cli.global;
    let json = g.json;
    match cli.command {
        Command::Plan(args) => {
            plan(
                &Backend::open(g, Open::Create, Tuning::default()).await?,
                &args,
                json,
            )
            .await
        }
        Command::Run(args) => run(g, *args).await,
        Command::Archive(args) => archive(g, args).await,
        Command::Status(args) => {
            status(
                &Backend::open(g, Open::Existing, Tuning::default()).await?,
                &args,
                json,
            )
            .await
        }
        Command::Get { pid } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            let view = backend.router.get(pid).await?;
            print!("{}", render::view(pid, &view, json));
            Ok(Outcome::Success)
        }
        Command::Locate { id } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            match backend.router.locate(id).await? {
                Some(located) => {
                    print!("{}", render::located(&located, json));
                    Ok(Outcome::Success)
                }
                None => bail!(
                    "no plan of namespace `{}` covers row ID {id}",
                    backend.namespace
                ),
            }
        }
        Command::Stats { ranges } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            let merged = if ranges {
                backend.router.stats_with_ranges().await?
            } else {
                backend.router.stats().await?
            };
            print!("{}", render::stats(&merged, json)?);
            Ok(Outcome::Success)
        }
        Command::List {
            status,
            worker,
            after,
            limit,
        } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            let page =
                crate::list::page(&backend, status, worker.as_deref(), after, limit as usize)
                    .await?;
            print!("{}", crate::list::render(&page, json));
            Ok(Outcome::Success)
        }
        Command::DeadLetters { limit } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            let dead = backend.archive.dead_letters(limit).await?;
            print!("{}", render::dead_letters(&dead, json));
            Ok(Outcome::Success)
        }
        Command::Pause => crate::namespace::set_paused(g, true).await,
        Command::Resume => crate::namespace::set_paused(g, false).await,
        Command::Plans => crate::namespace::plans(g).await,
        Command::Namespaces => crate::namespace::list(g).await,
        Command::Serve(args) => crate::serve::serve(g, args).await,
        Command::Drop { yes, force } => crate::namespace::drop(g, yes, force).await,
        Command::Workers => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            let workers = backend.active.workers().await?;
            print!("{}", render::workers(&workers, work::now_ms(), json));
            Ok(Outcome::Success)
        }
        Command::RetryFailed { pid } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
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
        Command::Discard { pid, force: true } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            backend.force_discard(pid).await?;
            say(
                json,
                format_args!("partition {pid} discarded (its record replaced)"),
                serde_json::json!({"discarded": pid, "forced": true}),
            );
            Ok(Outcome::Success)
        }
        Command::Discard { pid, force: false } => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
            backend.ensure_writable()?;
            if !backend.active.discard(pid).await? {
                bail!(
                    "partition {pid} is not pending or failed (claimed, completed, discarded or unknown): nothing discarded"
                );
            }
            backend.save().await?;
            say(
                json,
                format_args!("partition {pid} discarded"),
                serde_json::json!({"discarded": pid, "forced": false}),
            );
            Ok(Outcome::Success)
        }
        Command::Export(ExportArgs {
            to_hash: Some(key), ..
        }) => {
            crate::seed::export(
                &Backend::open(g, Open::Existing, Tuning::default()).await?,
                &key,
                json,
            )
            .await
        }
        Command::Export(args) => {
            export(
                &Backend::open(g, Open::Existing, Tuning::default()).await?,
                &args,
                json,
            )
            .await
        }
        Command::Import(ImportArgs {
            file: Some(file), ..
        }) => import(g, &file).await,
        Command::Import(args) => crate::seed::import(g, &args).await,
        Command::Compact => {
            let backend = Backend::open(g, Open::Existing, Tuning::default()).await?;
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
        Command::Check { repair } => {
            check(
                &Backend::open(g, Open::Existing, Tuning::default()).await?,
                repair,
                json,
            )
            .await
        }
        Command::Health(args) => {
            health(
                &Backend::open(g, Open::Existing, Tuning::default()).await?,
                &args,
                json,
            )
            .await
        }
    }
}

/// SIGINT/SIGTERM: the first asks to drain (and, after `grace`, to abort: in-flight
/// chunks' process groups are stopped and their partitions released); a second aborts
/// at once, through the same path, so leases are released and locks dropped before
/// the exit; one more exits on the spot.
pub(crate) fn signals(grace: Duration) -> Result<watch::Receiver<Stop>> {
    let (tx, rx) = watch::channel(Stop::Running);
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        let mut next = async || {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        };
        next().await;
        tracing::warn!(
            grace = ?grace,
            "stopping: no new claims; in-flight chunks may finish, then partitions are checkpointed and released (signal again to stop them now)"
        );
        let _ = tx.send(Stop::Draining);
        tokio::select! {
            () = next() => {
                tracing::warn!("second signal: stopping in-flight chunks now (a third exits at once)");
            }
            () = tokio::time::sleep(grace) => {
                tracing::warn!("grace period over: stopping in-flight chunks");
            }
        }
        let _ = tx.send(Stop::Abort);
        next().await;
        eprintln!("tranche: signalled again, exiting now");
        std::process::exit(130);
    });
    Ok(rx)
}

async fn plan(backend: &Backend, args: &PlanArgs, json: bool) -> Result<Outcome> {
    // Validate as the store will, before anything is written.
    let geometry = tranche_codec::Plan::new(1, args.min, args.max, args.size)
        .map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
    if args.dry_run {
        print!(
            "{}",
            render::plan_cost(&geometry, backend.shards, &args.tiers, json)
        );
        return Ok(Outcome::Success);
    }
    backend.ensure_writable()?;
    let outcome = backend
        .active
        .plan(&Plan::Uniform {
            min: args.min,
            max: args.max,
            size: args.size,
        })
        .await
        .map_err(|e| match e {
            // The store's refusal already says "invalid plan: …".
            tranche_active_store::Error::InvalidPlan(_) => anyhow::Error::new(e),
            other => anyhow::Error::new(other).context("cannot register the plan"),
        })?;
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

async fn run(g: &crate::cli::Global, args: RunArgs) -> Result<Outcome> {
    // Held until `run` returns: a restart takes the same name back (see `slot`).
    let mut slot = None;
    let worker = args
        .worker_id
        .clone()
        .unwrap_or_else(|| slot::default_name("worker", &mut slot));
    let active = ActiveConfig {
        lease: args.lease,
        max_attempts: args.max_attempts,
        backoff_base: args.backoff,
        ..ActiveConfig::default()
    };
    if args.lease < Duration::from_millis(300) {
        bail!("--lease must be at least 300ms");
    }
    if !args.simulate && (args.sim_fail.is_some() || args.sim_latency.is_some()) {
        bail!("--sim-fail and --sim-latency only shape --simulate; they do nothing with --exec");
    }
    let tuning = Tuning {
        active,
        tiers: Some(args.tiers.clone()),
        consumer: worker.clone(),
        claim_idle: claim_idle(),
    };
    let stop = signals(args.grace)?;
    let backend = Backend::open(g, Open::Existing, tuning).await?;
    backend.ensure_writable()?;
    let job = match (&args.exec, args.simulate) {
        (Some(cmd), false) => Job::Exec(cmd.clone()),
        (None, true) => {
            tracing::warn!("SIMULATED load: chunks sleep and fail at random; nothing is processed");
            Job::Simulate {
                latency: args.sim_latency.unwrap_or((1, 5)),
                fail: args.sim_fail.unwrap_or(0.0),
            }
        }
        _ => bail!("give exactly one of --exec CMD or --simulate"),
    };
    let parallel = args.parallel as usize;
    let settings = Settings {
        job,
        chunk: args.chunk,
        parallel,
        window: args.window.map_or(2 * parallel, |w| w as usize),
        concurrency: args.concurrency as usize,
        prefetch: args.prefetch.map(|p| p as usize),
        worker,
        lease: args.lease,
        max_attempts: args.max_attempts,
        follow: args.follow,
        reaper: !args.no_reaper,
        archiver: !args.no_archiver,
        heartbeat: !args.no_heartbeat,
        snapshots: args.snapshots.policy(),
        save_every: Duration::from_secs(2),
        metrics: args.metrics_listen,
    };
    let memory_before = backend.used_memory().await;
    let report = work::run(&backend, settings, stop).await?;
    let memory_after = backend.used_memory().await;
    let stats = backend.stats.summary().await.ok();
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
    Ok(Outcome::Success)
}

/// Prints a command's outcome: `text` for a person, or with `--json` the one object
/// `value` (a script reads JSON on both streams: errors are JSON too).
pub(crate) fn say(json: bool, text: impl std::fmt::Display, value: serde_json::Value) {
    if json {
        println!("{value}");
    } else {
        println!("{text}");
    }
}

/// How long an archiver's unacknowledged inbox entries must sit before another takes
/// them over. `TRANCHE_ARCHIVE_CLAIM_IDLE` shortens it for tests and demos.
pub(crate) fn claim_idle() -> Duration {
    std::env::var("TRANCHE_ARCHIVE_CLAIM_IDLE")
        .ok()
        .and_then(|s| crate::cli::parse_duration(&s).ok())
        .unwrap_or(Duration::from_secs(60))
}

/// Archive bytes per archived partition in the embedded store: its dump's size.
async fn embedded_archive_bytes(backend: &Backend) -> Option<render::ArchiveBytes> {
    let dump = backend.archive.export(work::now_ms()).await.ok()?;
    let entries = dump.entries();
    let bytes = dump.to_bytes().ok()?.len();
    (entries > 0).then(|| render::ArchiveBytes::Dump(bytes as f64 / entries as f64))
}

async fn archive(g: &crate::cli::Global, args: ArchiveArgs) -> Result<Outcome> {
    let ArchiveArgs {
        follow,
        tiers,
        snapshots,
    } = args;
    let mut slot = None;
    let tuning = Tuning {
        tiers: Some(tiers),
        consumer: format!("archiver-{}", slot::default_name("archiver", &mut slot)),
        claim_idle: claim_idle(),
        ..Tuning::default()
    };
    let stop = signals(Duration::from_secs(5))?;
    let backend = Backend::open(g, Open::Existing, tuning).await?;
    backend.ensure_writable()?;
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
    work::drain_archive(&backend, &stop).await;
    backend.save().await?;
    let left = backend.inbox_len().await?;
    say(
        g.json,
        format_args!(
            "archive drained; {left} inbox entr{} left",
            if left == 1 { "y" } else { "ies" }
        ),
        serde_json::json!({"inbox_left": left}),
    );
    Ok(if *stop.borrow() == Stop::Running {
        Outcome::Success
    } else {
        Outcome::Interrupted
    })
}

/// What `status` shows, read in O(shards).
pub(crate) async fn status_of(backend: &Backend) -> Result<render::Status> {
    Ok(render::Status {
        namespace: backend.namespace.clone(),
        location: backend.location(),
        shards: backend.shards,
        total: crate::progress::total_partitions(backend.active.as_ref()).await?,
        counts: backend.active.counts().await?,
        archived: backend.stats.summary().await?.global_stats.total_completed,
        inbox: backend.inbox_len().await?,
        workers: backend
            .active
            .workers()
            .await?
            .iter()
            .filter(|w| w.active)
            .count(),
        decode_failures: backend.archive.decode_failures().await?,
        dead_letters: backend.archive.dead_letter_count().await?,
        paused: backend.active.is_paused().await?,
    })
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

async fn export(backend: &Backend, args: &ExportArgs, json: bool) -> Result<Outcome> {
    let output = args
        .output
        .as_deref()
        .context("give -o FILE or --to-hash KEY")?;
    let mut dump = backend.archive.export(work::now_ms()).await?;
    // The plan registry travels with the archive, so that an import answers for pids
    // and never issues an archived one again.
    dump.plans = backend
        .active
        .plans()
        .await?
        .into_iter()
        .map(|e| DumpPlan {
            plan: e.plan,
            explicit: e.explicit,
        })
        .collect();
    let bytes = if args.jsonl {
        crate::jsonl::write(&dump).into_bytes()
    } else {
        dump.to_bytes()?
    };
    let summary = format!(
        "exported {} records in {} batches to {} ({} bytes)",
        dump.entries(),
        dump.batches.len(),
        output.display(),
        bytes.len()
    );
    let summary = if json {
        serde_json::json!({
            "records": dump.entries(), "batches": dump.batches.len(),
            "output": output.display().to_string(), "bytes": bytes.len(),
            "format": if args.jsonl { "jsonl" } else { "dump" },
        })
        .to_string()
    } else {
        summary
    };
    if output == Path::new("-") {
        // The dump is the output: the summary goes to stderr.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .context("cannot write to stdout")?;
        eprintln!("{summary}");
    } else {
        write_atomically(output, &bytes)?;
        println!("{summary}");
    }
    Ok(Outcome::Success)
}

async fn import(g: &crate::cli::Global, file: &Path) -> Result<Outcome> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut dump = if crate::jsonl::looks_like_jsonl(&bytes) {
        let text = std::str::from_utf8(&bytes)
            .with_context(|| format!("{} is not UTF-8 JSON lines", file.display()))?;
        crate::jsonl::read(text, work::now_ms(), Tier::Simple).with_context(|| {
            format!(
                "{} is not JSON lines of `tranche export --jsonl`",
                file.display()
            )
        })?
    } else {
        Dump::from_bytes(&bytes)
            .with_context(|| format!("{} is not a tranche dump", file.display()))?
    };
    if let Some(shards) = g.shards
        && shards != dump.num_shards
    {
        bail!("the dump has {} shards, not {shards}", dump.num_shards);
    }
    let mut global = g.clone();
    global.shards = Some(dump.num_shards);
    let backend = Backend::open(&global, Open::Create, Tuning::default()).await?;
    if !backend.is_empty().await? {
        bail!(
            "namespace `{}` on {} is not empty; import only restores into an empty one",
            backend.namespace,
            backend.location()
        );
    }
    backend.ensure_writable()?;
    if crate::jsonl::looks_like_jsonl(&bytes) {
        // JSON lines do not say where a batch lived: as many records as the archiver
        // would have kept simple stay simple, more go to the compressed tier.
        if dump.entries() >= backend.archive_config.compressed_at {
            for b in &mut dump.batches {
                b.tier = Tier::Compressed;
            }
        }
    }
    // Plans first: their checks run before anything is written, and they refuse a dump
    // whose records lie outside its plans.
    let entries: Vec<PlanEntry> = dump
        .plans
        .iter()
        .map(|p| PlanEntry {
            plan: p.plan,
            explicit: p.explicit,
        })
        .collect();
    let pending = if entries.is_empty() {
        None
    } else {
        let mut completed: Vec<u64> = dump
            .batches
            .iter()
            .flat_map(|b| &b.records)
            .map(|r| r.pid)
            .collect();
        completed.sort_unstable();
        completed.dedup();
        Some(
            backend
                .active
                .adopt(&entries, &completed)
                .await
                .with_context(|| format!("the plans of {} do not fit", file.display()))?,
        )
    };
    let restored = backend.archive.import(&dump).await?;
    backend.register_namespace().await?;
    backend.save().await?;
    if g.json {
        println!(
            "{}",
            serde_json::json!({
                "namespace": backend.namespace, "imported": restored,
                "plans": entries.len(), "pending": pending,
            })
        );
        return Ok(Outcome::Success);
    }
    println!(
        "imported {restored} records into `{}` on {}",
        backend.namespace,
        backend.location()
    );
    match pending {
        Some(0) => println!(
            "restored {} plan(s); every planned partition was archived",
            entries.len()
        ),
        Some(n) => println!(
            "restored {} plan(s); {n} partition(s) the export did not hold as archived are pending again (`tranche run` does them)",
            entries.len()
        ),
        None => println!(
            "the dump carries no plans (format version 1): `get` answers `unknown` for its pids, and planning them again would issue them again"
        ),
    }
    Ok(Outcome::Success)
}

/// The statistics delta of every archived record, one per shard, read page by page
/// across the plans: memory grows with workers, ranges and days, never with the archive.
async fn archived_deltas(backend: &Backend) -> Result<Vec<StatsDelta>> {
    let schema = KeySchema::new(&backend.namespace, backend.shards)?;
    let mut deltas = vec![StatsDelta::default(); backend.shards as usize];
    for entry in backend.active.plans().await? {
        let mut from = entry.plan.first_pid();
        let last = entry.plan.last_pid();
        loop {
            let page = backend.archive.range(from..=last, 10_000).await?;
            for r in &page.records {
                deltas[schema.shard_of(r.pid) as usize].add(r);
            }
            match page.next {
                Some(next) => from = next,
                None => break,
            }
        }
    }
    Ok(deltas)
}

/// Recomputes the statistics from the archive; repairs each shard if asked.
async fn check_stats(
    backend: &Backend,
    repair: bool,
) -> Result<(Vec<tranche_stats::Difference>, u64)> {
    let deltas = archived_deltas(backend).await?;
    let expected = Stats::from_deltas(&deltas);
    let found = backend.stats.stats().await?;
    let differences = diff(&expected, &found);
    let count = deltas.iter().map(StatsDelta::len).sum();
    if repair && !differences.is_empty() {
        backend.ensure_writable()?;
        for (shard, delta) in deltas.iter().enumerate() {
            backend.stats.replace(shard as u32, delta).await?;
        }
        backend.save().await?;
    }
    Ok((differences, count))
}

/// The active layer's kept status counts against a count of its records, as
/// differences under `active_counts.` (the counters are kept by the Redis scripts; a
/// process of a version without them, writing alongside, puts them off). Read while
/// nothing runs: a claim between the two reads shows as a difference.
async fn check_counts(backend: &Backend, repair: bool) -> Result<Vec<tranche_stats::Difference>> {
    let kept = backend.active.counts().await?;
    let snapshot = backend.active.all_active().await?;
    let mut counted = StatusCounts {
        unissued: snapshot.unissued.iter().map(|u| u.count).sum(),
        ..StatusCounts::default()
    };
    for p in &snapshot.partitions {
        counted.add(p.status);
    }
    let differences: Vec<_> = [
        ("unissued", counted.unissued, kept.unissued),
        ("pending", counted.pending, kept.pending),
        ("claimed", counted.claimed, kept.claimed),
        ("running", counted.running, kept.running),
        ("failed", counted.failed, kept.failed),
        ("discarded", counted.discarded, kept.discarded),
    ]
    .into_iter()
    .filter(|(_, want, got)| want != got)
    .map(|(name, want, got)| tranche_stats::Difference {
        path: format!("active_counts.{name}"),
        expected: Some(want.to_string()),
        found: Some(got.to_string()),
    })
    .collect();
    if repair && !differences.is_empty() {
        backend.ensure_writable()?;
        backend.recount_active().await?;
    }
    Ok(differences)
}

async fn check(backend: &Backend, repair: bool, json: bool) -> Result<Outcome> {
    let (mut differences, records) = check_stats(backend, repair).await?;
    differences.extend(check_counts(backend, repair).await?);
    print!("{}", render::check(&differences, records, repair, json));
    if differences.is_empty() || repair {
        Ok(Outcome::Success)
    } else {
        Ok(Outcome::Failed(format!(
            "{} difference(s); `tranche check --repair` rewrites the statistics and the active counts",
            differences.len()
        )))
    }
}

async fn health(backend: &Backend, args: &HealthArgs, json: bool) -> Result<Outcome> {
    let rules = health_rules(backend, args).await?;
    print!("{}", render::health(&rules, json));
    let firing: Vec<&str> = rules
        .iter()
        .filter(|r| r.firing())
        .map(|r| r.name)
        .collect();
    if firing.is_empty() {
        Ok(Outcome::Success)
    } else {
        Ok(Outcome::Failed(format!(
            "alert firing: {}",
            firing.join(", ")
        )))
    }
}

/// Every alert rule with its reading, in O(shards) (plus a full check with `--check`).
pub(crate) async fn health_rules(
    backend: &Backend,
    args: &HealthArgs,
) -> Result<Vec<render::Rule>> {
    let counts = backend.active.counts().await?;
    let inbox = backend.inbox_len().await?;
    let stats = backend.stats.summary().await?;
    let failures = backend.archive.decode_failures().await?;
    let dead_letters = backend.archive.dead_letter_count().await?;
    let workers = backend.active.workers().await?;
    let live = workers.iter().filter(|w| w.active).count();
    let outstanding = counts.outstanding();
    let planned = crate::progress::total_partitions(backend.active.as_ref()).await?;
    let now_ms = work::now_ms();
    // Minutes since anything was last archived, while work is outstanding. Before the
    // first archive, since the oldest live worker started: a fleet stuck from its start
    // is stalled too. 0 when the job is done or no worker runs (then
    // `outstanding_no_worker` tells).
    let last_ms = match stats.global_stats.last_updated {
        last if last > 0.0 => Some((last * 1000.0) as u64),
        _ => workers
            .iter()
            .filter(|w| w.active)
            .map(|w| w.info.started_ms)
            .min(),
    };
    let stalled_min = match last_ms {
        Some(ms) if outstanding > 0 => now_ms.saturating_sub(ms) as f64 / 60_000.0,
        _ => 0.0,
    };
    let lag_s = backend
        .inbox_oldest_ms()
        .await?
        .map_or(0.0, |ms| now_ms.saturating_sub(ms) as f64 / 1000.0);
    let mut rules = vec![
        render::Rule::new(
            "active_partitions",
            (counts.claimed + counts.running) as f64,
            args.max_active as f64,
        ),
        render::Rule::new("archive_queue", inbox as f64, args.max_inbox as f64),
        render::Rule::new(
            "archive_lag_seconds",
            lag_s,
            args.max_archive_lag.as_secs_f64(),
        ),
        render::Rule::new(
            "decode_failure_rate",
            failures as f64 / stats.global_stats.total_completed.max(1) as f64,
            0.01,
        ),
        render::Rule::new(
            "worker_update_p99_ms",
            workers
                .iter()
                .filter(|w| w.active)
                .map(|w| w.info.latency_p99_ms)
                .fold(0.0, f64::max),
            args.max_update_p99_ms,
        ),
        render::Rule::new(
            "failed_partitions",
            counts.failed as f64,
            args.max_failed as f64,
        ),
        render::Rule::new(
            "failed_share",
            counts.failed as f64 / planned.max(1) as f64,
            args.max_failed_share,
        ),
        render::Rule::new(
            "outstanding_no_worker",
            if live == 0 { outstanding as f64 } else { 0.0 },
            0.0,
        ),
        render::Rule::new(
            "stalled_minutes",
            stalled_min,
            args.max_stall.as_secs_f64() / 60.0,
        ),
        render::Rule::new("dead_letters", dead_letters as f64, 0.0),
    ];
    if args.check {
        let (differences, _) = check_stats(backend, false).await?;
        rules.push(render::Rule::new(
            "statistics_consistency",
            differences.len() as f64,
            0.0,
        ));
    }
    Ok(rules)
}

/// Writes `bytes` to `path` through a new temporary file beside it, synced, renamed
/// over it, and the directory synced, so a reader never sees half a file and a crash
/// never loses a finished one. The directory must exist: a mistyped path is an error,
/// not a tree of new directories.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "cannot write {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("tranche"),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .and_then(|()| std::fs::File::open(dir)?.sync_all());
    if let Err(err) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(err).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}
