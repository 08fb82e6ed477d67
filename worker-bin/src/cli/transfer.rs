//! Moving a namespace's archive out and in: `export` (a binary v2 dump or JSON lines,
//! written atomically) and `import` of either into an empty namespace.

use std::path::Path;

use anyhow::{Context, Result, bail};
use tranche_active_store::PlanEntry;
use tranche_archive_store::{Dump, Tier};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::args::ExportArgs;

use crate::cli::common::Outcome;

pub(crate) async fn export(backend: &Backend, args: &ExportArgs, json: bool) -> Result<Outcome> {
    let output = args
        .output
        .as_deref()
        .context("give -o FILE or --to-hash KEY")?;
    let dump = crate::query::export(backend).await?;
    let bytes = if args.jsonl {
        crate::cli::jsonl::write(&dump).into_bytes()
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

pub(crate) async fn import(g: &crate::cli::common::Global, file: &Path) -> Result<Outcome> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut dump = if crate::cli::jsonl::looks_like_jsonl(&bytes) {
        let text = std::str::from_utf8(&bytes)
            .with_context(|| format!("{} is not UTF-8 JSON lines", file.display()))?;
        crate::cli::jsonl::read(text, crate::duration::now_ms(), Tier::Simple).with_context(
            || {
                format!(
                    "{} is not JSON lines of `tranche export --jsonl`",
                    file.display()
                )
            },
        )?
    } else {
        let dump = Dump::from_bytes(&bytes)
            .with_context(|| format!("{} is not a tranche dump", file.display()))?;
        // A binary dump is bounded as JSON lines are, before anything is written.
        for record in dump.batches.iter().flat_map(|b| &b.records) {
            crate::cli::jsonl::check_record(record)
                .with_context(|| format!("{} holds a record out of bounds", file.display()))?;
        }
        dump
    };
    if let Some(shards) = g.shards
        && shards != dump.num_shards
    {
        bail!("the dump has {} shards, not {shards}", dump.num_shards);
    }
    let mut global = g.clone();
    global.shards = Some(dump.num_shards);
    let backend = Backend::open(&global.location(), Open::Create, Tuning::default()).await?;
    if !backend.is_empty().await? {
        bail!(
            "namespace `{}` on {} is not empty; import only restores into an empty one",
            backend.namespace,
            backend.location()
        );
    }
    backend.ensure_writable()?;
    if crate::cli::jsonl::looks_like_jsonl(&bytes) {
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
    let entries: Vec<PlanEntry> = dump.plans.clone();
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

/// Writes `bytes` to `path` through [`crate::atomic::write`] (0644): a reader never sees
/// half a file and a crash never loses a finished one. The directory must exist.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
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
    crate::atomic::write(path, &[bytes], 0o644)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
