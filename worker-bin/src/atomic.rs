//! The one atomic file write: what the embedded state file and `export -o` go through.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `parts`, one after the other, to `path` so that a reader sees the old file or
/// the new one, never half of either, and a crash never loses a finished write: a new
/// temporary file `<name>.tmp` beside it (created with `mode`, `O_EXCL | O_NOFOLLOW`),
/// synced, renamed over `path`, and the directory synced so the rename itself lasts.
///
/// A file already at the temporary name is a crashed write's, or planted: the name is
/// removed first (a symlink goes, never its target). On failure the temporary file is
/// removed. The directory must exist: a mistyped path is an error, not a tree of new
/// directories. Returns the bytes written.
pub(crate) fn write(path: &Path, parts: &[&[u8]], mode: u32) -> io::Result<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = temporary(path);
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = parts
        .iter()
        .try_for_each(|p| file.write_all(p))
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            drop(file);
            fs::rename(&tmp, path)
        })
        .and_then(|()| File::open(dir)?.sync_all());
    if let Err(err) = written {
        let _ = fs::remove_file(&tmp);
        return Err(err);
    }
    Ok(parts.iter().map(|p| p.len() as u64).sum())
}

/// The temporary name [`write()`] uses for `path`: `<name>.tmp` beside it.
pub(crate) fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tranche-atomic-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_the_parts_privately_and_leaves_no_temporary_file() {
        let d = dir("parts");
        let path = d.join("out");
        fs::write(&path, "old").unwrap();
        assert_eq!(write(&path, &[b"ab", b"cd"], 0o600).unwrap(), 4);
        assert_eq!(fs::read(&path).unwrap(), b"abcd");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!temporary(&path).exists());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_error_and_creates_nothing() {
        let d = dir("missing");
        let path = d.join("no/such/out");
        assert!(write(&path, &[b"x"], 0o644).is_err());
        assert!(!d.join("no").exists());
        fs::remove_dir_all(d).unwrap();
    }
}
