//! The dispatch: one arm per subcommand, handing it to the command's own module
//! ([`plan`](crate::cli::plan), [`run`](crate::cli::run), [`archive`](crate::cli::archive),
//! [`status`](crate::cli::status), [`partition`](crate::cli::partition) for commands on one
//! partition, [`transfer`](crate::cli::transfer) for those that move an archive,
//! [`health`](crate::cli::health) for `check` and `health`). Each returns an
//! [`Outcome`]; what every command shares is in [`common`](crate::cli::common).

use anyhow::Result;

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::args::{Cli, Command, ExportArgs, ImportArgs};
use crate::cli::common::existing;
use crate::cli::common::{Outcome, say};
use crate::cli::render;
use crate::cli::{archive, partition, plan, run, status};

/// Runs the command the user asked for: opens what it needs and hands it to the
/// command's own function.
pub(crate) async fn dispatch(cli: Cli) -> Result<Outcome> {
    let g = &cli.global;
    let json = g.json;
    match cli.command {
        Command::Plan(args) => {
            crate::cli::doctor::warn_at_start(g).await;
            let backend = Backend::open(&g.location(), Open::Create, Tuning::default()).await?;
            plan::plan(&backend, &args, json).await
        }
        Command::Run(args) => {
            crate::cli::doctor::warn_at_start(g).await;
            // The process's one `run` span: every partition's lease is a child of it. At
            // debug level like `partition`: the log lines do not need it, and an enabled
            // span is entered on every poll of the run; the OTLP layer enables it.
            let span = tracing::debug_span!("run", namespace = %g.namespace);
            tracing::Instrument::instrument(run::run(g, *args), span).await
        }
        Command::Archive(args) => archive::archive(g, args).await,
        Command::Status(args) => status::status(&existing(g).await?, &args, json).await,
        Command::Get { pid } => partition::get(existing(g).await?, pid, json).await,
        Command::Locate { id } => partition::locate(existing(g).await?, id, json).await,
        Command::Stats { ranges } => partition::stats(existing(g).await?, ranges, json).await,
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
        Command::RetryFailed { pid } => {
            partition::retry_failed(&existing(g).await?, pid, json).await
        }
        Command::Discard { pid, force: true } => {
            existing(g).await?.force_discard(pid).await?;
            say(
                json,
                format_args!("partition {pid} discarded (its record replaced)"),
                serde_json::json!({"discarded": pid, "forced": true}),
            );
            Ok(Outcome::Success)
        }
        Command::Discard { pid, force: false } => {
            partition::discard(&existing(g).await?, pid, json).await
        }
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
        Command::Compact => partition::compact(&existing(g).await?, json).await,
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
