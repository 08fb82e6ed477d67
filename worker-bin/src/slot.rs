//! Stable default names for this process: `host-N`, where N is the lowest slot number
//! on this host that no live tranche process of the same user holds.
//!
//! A worker id names the worker's entry in the registry, its per-worker statistics and
//! its code in the worker dictionary, and an archiver's name is a stream consumer; all of
//! them outlive the process. Named after the pid, every restart added one more of each,
//! for ever. Named after a slot, a restarted process takes its predecessor's name back,
//! so they grow with the number of processes a host runs at once, not with restarts.
//!
//! A slot is held by an exclusive `flock` on `<dir>/<kind>-<N>.slot` for the life of the
//! process; the kernel frees it however the process ends. `<dir>` is
//! `$XDG_RUNTIME_DIR/tranche` (private to the user by design), else
//! `<tmp>/tranche-<uid>`; either is used only if it is a real directory (not a
//! symlink) owned by this user and closed to everyone else (mode `0700`), so another
//! user of a shared `/tmp` can neither plant nor hold it: otherwise the process is named
//! after its pid. Two live
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
        if let Err(why) = private_dir(dir) {
            tracing::warn!(dir = %dir.display(), why, "not using the slot directory");
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

/// `$XDG_RUNTIME_DIR/tranche`, else `<tmp>/tranche-<uid>`: per user, so another user
/// can neither hold nor plant a slot (checked by [`private_dir`]).
fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(run) => PathBuf::from(run).join("tranche"),
        None => std::env::temp_dir().join(format!("tranche-{}", nix::unistd::getuid())),
    }
}

/// Whether `dir` is a directory (not a symlink) owned by this user and closed to
/// group and others: a directory someone else made in a shared `/tmp` is refused.
fn private_dir(dir: &std::path::Path) -> Result<(), &'static str> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).map_err(|_| "cannot read it")?;
    if !meta.file_type().is_dir() {
        return Err("not a directory (a symlink?)");
    }
    if meta.uid() != nix::unistd::getuid().as_raw() {
        return Err("owned by another user");
    }
    if meta.mode() & 0o077 != 0 {
        return Err("open to other users (mode is not 0700)");
    }
    Ok(())
}

/// `host-N` from a slot of `kind` (kept alive in `holder` for the process's lifetime),
/// or `host-PID` when no slot can be had.
pub(crate) fn default_name(kind: &str, holder: &mut Option<Slot>) -> String {
    let host = hostname();
    match Slot::take(kind) {
        Some(slot) => {
            let name = format!("{host}-{}", slot.number());
            *holder = Some(slot);
            name
        }
        None => format!("{host}-{}", std::process::id()),
    }
}

/// This machine's name, for the worker registry.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
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

    #[test]
    fn a_slot_directory_open_to_others_or_a_symlink_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tranche-slot-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Slot::take_in(&dir, "worker").is_none(), "mode 0777");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(Slot::take_in(&link, "worker").is_none(), "a symlink");
        assert!(Slot::take_in(&dir, "worker").is_some(), "private: used");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
