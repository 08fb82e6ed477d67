//! Output commands whose stdout closes early (`tranche list | head -1`): each exits 0
//! and says nothing, instead of panicking with "failed printing to stdout: Broken
//! pipe". The pipe's read end is closed before the command starts, so its first write
//! meets a reader that is gone whatever the timing.

use super::*;
use std::process::{Command, ExitStatus};
use std::time::Instant;

/// Runs `cmd` with stdout a pipe whose reader is already closed; its exit status and
/// stderr. Bounded like [`common::output`].
fn with_stdout_closed(mut cmd: Command) -> (ExitStatus, String) {
    use std::io::Read;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tranche");
    // The parent's copy of the write end goes with `cmd`: only the child holds it.
    drop(cmd);
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + common::OUTPUT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tranche did not exit with its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().expect("stderr reader"))
}

#[test]
fn output_commands_exit_quietly_when_stdout_closes() {
    let dir = scratch("pipe");
    let plan = ["plan", "--min", "1", "--max", "100000", "--size", "100"];
    ok(tranche(&dir, &plan));
    for args in [
        &["status"][..],
        &["list", "--limit", "1000"],
        &["list", "--json"],
        &["plans"],
        &["get", "3"],
        &["stats"],
        &["export", "--output", "-"],
        &["completions", "bash"],
        &["--help"],
    ] {
        let (status, stderr) = with_stdout_closed(tranche(&dir, args));
        assert_eq!(
            status.code(),
            Some(0),
            "{args:?}: {status}, stderr:\n{stderr}"
        );
        assert!(stderr.is_empty(), "{args:?} said:\n{stderr}");
    }
}

/// The same through a shell, as a user types it: `head` closes the pipe after one
/// line while `list` still writes a thousand.
#[test]
fn a_pipe_into_head_ends_the_listing_quietly() {
    let dir = scratch("pipe-head");
    let plan = ["plan", "--min", "1", "--max", "100000", "--size", "100"];
    ok(tranche(&dir, &plan));
    let out = output({
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#""$0" list --limit 1000 | head -1"#)
            .arg(common::BIN)
            .current_dir(&dir)
            .env("TRANCHE_QUIET", "1");
        cmd
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}
