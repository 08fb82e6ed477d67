//! What a chunk leaves behind when its command ends: processes it started in the
//! background that left its process group (`setsid`, a shell's `set -m`, a daemon's
//! double fork). The guard's `kill -KILL 0` reaches the group only; these are found and
//! killed here.
//!
//! Two things make them findable. On Linux the worker is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`, [`become_subreaper`]): a process whose parent dies is
//! handed to the worker rather than to init, so whatever a chunk left running is, once
//! its own parents are gone, a child of the worker. And every chunk's environment
//! carries a tag of its own ([`TAG`], unique per worker process and chunk), which its
//! descendants inherit: [`sweep`] kills each child of the worker that carries the
//! chunk's tag or sits in the chunk's group, and reaps it (the worker being its parent
//! now, nobody else would), until a round finds none.
//!
//! A process that both leaves the group and clears its environment (`env -i`) is not
//! told apart from another chunk's; it is left running. Elsewhere than Linux there is no
//! subreaper and no `/proc`: a chunk's group is killed, what left it is not.

use std::time::Duration;

use tokio::time::Instant;

/// The variable that tags every process of one chunk: `WORKER_PID.SEQUENCE`.
pub(super) const TAG: &str = "TRANCHE_CHUNK_TAG";

/// A tag no other chunk of any live worker carries: this process's pid and a
/// sequence number.
pub(super) fn new_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Children of this process that their own `Child` waits for, though they lead no
/// process group (a warm process in its guard's group, `persistent.rs`): a sweep leaves
/// them alone, zombies included, however they look.
static WAITED_ELSEWHERE: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Marks child `pid` as waited for by its own `Child` (`on`), or no longer.
pub(super) fn waited_elsewhere(pid: u32, on: bool) {
    let mut pids = WAITED_ELSEWHERE.lock().expect("not poisoned");
    pids.retain(|&p| p != pid);
    if on {
        pids.push(pid);
    }
}

/// Makes this process the child subreaper of its descendants (Linux), once; says so
/// when the kernel refuses. False where there is none: a chunk's escaped processes
/// then go to init and are not found.
pub(super) fn become_subreaper() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            match nix::sys::prctl::set_child_subreaper(true) {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(
                        %err,
                        "cannot become a child subreaper: a process a chunk starts outside \
                         its process group (setsid) may outlive it"
                    );
                    false
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

/// Kills and reaps what the chunk whose group leader was `leader` (its own process,
/// already waited for) and whose tag is `tag` left behind: its group, and every child
/// of this process in that group or carrying the tag, round after round (a killed
/// process's own children come to this process next), until a round finds nothing and
/// the group is empty, or `within` has passed (then it says so).
pub(super) async fn sweep(leader: u32, tag: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while left_behind(leader, tag) {
        if Instant::now() >= deadline {
            return too_long(leader, within);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// [`sweep`] on this thread, for a `Drop` that has no task to await it in.
pub(super) fn sweep_now(leader: u32, tag: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while left_behind(leader, tag) {
        if std::time::Instant::now() >= deadline {
            return too_long(leader, within);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One round of [`sweep`]: whether anything of the chunk was still there (and is
/// killed now).
fn left_behind(leader: u32, tag: &str) -> bool {
    let group_left = signal_group(leader);
    let found = kill_tagged_children(leader, tag);
    found || group_left
}

fn too_long(leader: u32, within: Duration) {
    tracing::warn!(
        pgid = leader,
        "processes a chunk left behind were still there {within:?} after it ended"
    );
}

/// SIGKILLs process group `pgid`; whether any process of it (a zombie included) was
/// there.
fn signal_group(pgid: u32) -> bool {
    let pgid = nix::unistd::Pid::from_raw(pgid as i32);
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn kill_tagged_children(_leader: u32, _tag: &str) -> bool {
    false
}

/// One round of [`sweep`]: SIGKILLs each child of this process that is in `leader`'s
/// group or carries `tag` (a zombie's environment is gone: a zombie is matched by its
/// group or session), and reaps those already dead. Whether it found any.
#[cfg(target_os = "linux")]
fn kill_tagged_children(leader: u32, tag: &str) -> bool {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    use nix::unistd::Pid;
    let me = std::process::id();
    let Some(mine) = stat(me) else {
        return false;
    };
    let needle = format!("{TAG}={tag}");
    let mut found = false;
    for child in children(me) {
        // The leader is a process tokio waits for itself, and so are warm processes.
        if child == leader
            || WAITED_ELSEWHERE
                .lock()
                .expect("not poisoned")
                .contains(&child)
        {
            continue;
        }
        let Some(st) = stat(child) else { continue };
        if st.ppid != me {
            continue;
        }
        let ours = if st.zombie {
            // No environment any more. Tokio's own children (chunks, probes) are in
            // this process's session, each its group's leader or in this process's
            // group: a zombie that is neither left a chunk's group or session.
            st.pgid == leader || st.sid != mine.sid || (st.pgid != child && st.pgid != mine.pgid)
        } else {
            st.pgid == leader || tagged(child, &needle)
        };
        if !ours {
            continue;
        }
        found = true;
        let pid = Pid::from_raw(child as i32);
        if !st.zombie {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
    }
    found
}

/// What [`sweep`] reads of a process's `/proc/PID/stat`.
#[cfg(target_os = "linux")]
struct Stat {
    zombie: bool,
    ppid: u32,
    pgid: u32,
    sid: u32,
}

#[cfg(target_os = "linux")]
fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, in parentheses (which may hold anything): state, ppid,
    // pgrp, session.
    let mut rest = text[text.rfind(')')? + 2..].split_whitespace();
    let zombie = rest.next()? == "Z";
    let mut num = || rest.next()?.parse().ok();
    Some(Stat {
        zombie,
        ppid: num()?,
        pgid: num()?,
        sid: num()?,
    })
}

/// Whether process `pid`'s environment holds `needle` (`NAME=VALUE`).
#[cfg(target_os = "linux")]
fn tagged(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
}

/// The children of process `me`: each of its threads' `children` file (a child
/// belongs to the thread that forked it, an orphan to whichever thread took it), or,
/// on a kernel built without them, every process whose parent it is.
#[cfg(target_os = "linux")]
fn children(me: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut any = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{me}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                any = true;
                out.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    if !any {
        out = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| stat(pid).is_some_and(|s| s.ppid == me))
            .collect();
    }
    out
}
