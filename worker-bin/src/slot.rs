//! Stable default names for this process: `host-N`, where N is the lowest slot number
//! on this host that no live tranche process of the same user holds.
//!
//! A worker id names the worker's entry in the registry, its per-worker statistics and
//! its code in the worker dictionary, and an archiver's name is a stream consumer; all of
//! them outlive the process. Named after the pid, every restart added one more of each,
//! for ever. Named after a slot, a restarted process takes its predecessor's name back,
//! so they grow with the number of processes a host runs at once, not with restarts.
//!
//! A slot is held by an exclusive `flock` on `<tmp>/tranche-<uid>/<kind>-<N>.slot` for the
//! life of the process; the kernel frees it however the process ends. Two live
//! processes never share a slot; a dead one's slot is free at once. (Its leases are not
//! taken over by name: they expire or are reaped as ever.)

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

/// Slots tried before giving up and falling back to the pid.
const MAX_SLOTS: u32 = 4096;

/// A slot number held by this process until it is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    number: u32,
    // Held open for the slot's lifetime; closing it frees the slot.
    _file: File,
}

impl Slot {
    /// Takes the lowest free slot of `kind` ("worker", "archiver") on this host, or
    /// `None` when none can be taken (no writable temporary directory), in which case the
    /// caller names the process after its pid.
    pub(crate) fn take(kind: &str) -> Option<Slot> {
        Self::take_in(&default_dir(), kind)
    }

    fn take_in(dir: &std::path::Path, kind: &str) -> Option<Slot> {
        if let Err(err) = DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            tracing::debug!(dir = %dir.display(), %err, "no slot directory");
            return None;
        }
        for number in 0..MAX_SLOTS {
            let path = dir.join(format!("{kind}-{number}.slot"));
            let file = open_lock_file(&path).ok()?;
            if file.try_lock().is_ok() {
                return Some(Slot {
                    number,
                    _file: file,
                });
            }
        }
        None
    }

    /// The slot number.
    pub(crate) fn number(&self) -> u32 {
        self.number
    }
}

/// Opens (creating, private, never through a symlink) a file to hold an `flock` on: a
/// slot, or the embedded state's lock.
pub(crate) fn open_lock_file(path: &std::path::Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// `<tmp>/tranche-<uid>`: per user, so another user can neither hold nor plant a slot.
fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("tranche-{}", nix::unistd::getuid()))
}

/// `host-N` from a slot of `kind` (kept alive in `holder` for the process's lifetime),
/// or `host-PID` when no slot can be had.
pub(crate) fn default_name(kind: &str, holder: &mut Option<Slot>) -> String {
    let host = crate::work::hostname();
    match Slot::take(kind) {
        Some(slot) => {
            let name = format!("{host}-{}", slot.number());
            *holder = Some(slot);
            name
        }
        None => format!("{host}-{}", std::process::id()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_holders_get_distinct_slots_and_a_freed_slot_is_reused() {
        let dir = std::env::temp_dir().join(format!("tranche-slot-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = Slot::take_in(&dir, "worker").unwrap();
        let b = Slot::take_in(&dir, "worker").unwrap();
        let other = Slot::take_in(&dir, "archiver").unwrap();
        assert_eq!((a.number(), b.number(), other.number()), (0, 1, 0));
        drop(a);
        assert_eq!(Slot::take_in(&dir, "worker").unwrap().number(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
