//! A test's scratch directory and the long-running processes it starts, whose output
//! goes to files in it. Apart from `common` (which needs the `tranche` binary, built
//! only with the `cli` feature) so that `examples`, built without it, can use it too.

// Without `cli`, only `examples` uses this, and not all of it.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A fresh directory under the target dir, removed by nobody: tests leave their
/// files for a human to read when they fail.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A process a test starts and lets run (a worker, a `run`, an example), with its
/// stdout in `dir/{name}.stdout` and its stderr in `dir/{name}.stderr`, killed and
/// reaped when dropped, so that a test that fails takes its processes with it.
///
/// Files, not pipes: a pipe read only after the process exits blocks the process on
/// its next write once it holds 64 KiB (a worker's log lines, a chunk command's
/// stdout), and the process then never exits. The files stay for a human to read.
pub(crate) struct LoggedChild {
    /// The process, to signal or poll.
    pub(crate) child: Child,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// How many lines of its stderr a process that did not exit in time shows.
const TAIL: usize = 40;

impl LoggedChild {
    /// Starts `cmd` as `name` (which names its files and it in messages); its stdout
    /// and stderr go to files in `dir`, whatever `cmd` had them set to.
    pub(crate) fn spawn(cmd: &mut Command, dir: &Path, name: &str) -> Self {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let create = |path: &Path| File::create(path).expect("output file");
        let child = cmd
            .stdout(create(&stdout))
            .stderr(create(&stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Self {
            child,
            name: name.to_owned(),
            stdout,
            stderr,
        }
    }

    /// Waits for it to exit, at most `limit`; if it is still running then, kills it and
    /// panics with its name and the last lines of its stderr.
    pub(crate) fn wait(&mut self, limit: Duration) -> ExitStatus {
        if let Some(status) = exit_within(&mut self.child, limit) {
            return status;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let stderr = self.stderr();
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = match &lines[lines.len().saturating_sub(TAIL)..] {
            [] => "(nothing)".to_owned(),
            tail => tail.join("\n"),
        };
        panic!(
            "{} (pid {}) did not exit within {limit:?}; the end of {}:\n{tail}",
            self.name,
            self.child.id(),
            self.stderr.display()
        );
    }

    /// Its name, as given to [`LoggedChild::spawn`].
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// All it has written to stdout so far.
    pub(crate) fn stdout(&self) -> String {
        text(&self.stdout)
    }

    /// All it has written to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        text(&self.stderr)
    }
}

/// How `child` exited, if it does within `limit`.
pub(crate) fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `path` holds, bytes that are not UTF-8 replaced.
fn text(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

impl Drop for LoggedChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
