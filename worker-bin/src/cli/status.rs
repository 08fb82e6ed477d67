//! `status`: the namespace at a glance.

use std::time::Duration;

use anyhow::Result;

use crate::backend::Backend;
use crate::cli::args::StatusArgs;
use crate::cli::common::{Outcome, signals};
use crate::cli::inspect::status_of;
use crate::cli::render;
use crate::sync::until;
use crate::work::Stop;

pub(super) async fn status(backend: &Backend, args: &StatusArgs, json: bool) -> Result<Outcome> {
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
