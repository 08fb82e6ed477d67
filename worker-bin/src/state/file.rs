//! The state file on disk: its header and checksum, the bounded decode, and its two
//! generations (`.prev`, `.corrupt`), as the module docs of [`super`] describe them.

use std::fs;
use std::path::{Path, PathBuf};

use super::{EmbeddedState, STATE_FILE_VERSION, StateError};

/// The first bytes of every state file.
pub(super) const MAGIC: &[u8; 8] = b"TRSTATE\0";

/// Magic, version, payload length, payload CRC32.
pub(super) const HEADER_LEN: usize = 8 + 4 + 8 + 4;

/// The largest payload a state file may declare (16 GiB): a bound on what a damaged
/// length field can make the loader allocate.
pub(super) const MAX_PAYLOAD: u64 = 1 << 34;

/// Writes `state` to `path` atomically and privately (0600, through
/// [`crate::atomic::write`]), after keeping the file it replaces as the previous
/// generation ([`keep_previous`]); with `both`, the state is written as the previous
/// generation too. The caller holds the state lock. Returns the bytes written to
/// `path`.
pub(crate) fn save(path: &Path, state: &EmbeddedState, both: bool) -> Result<u64, StateError> {
    let payload =
        bincode::serde::encode_to_vec(state, bincode::config::standard()).map_err(|e| {
            StateError::Corrupt {
                path: path.to_owned(),
                detail: format!("cannot encode the state: {e}"),
            }
        })?;
    let header = header(&payload);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| StateError::Io { path, source }
    };
    keep_previous(path, !both).map_err(io(path))?;
    if both {
        let prev = previous(path);
        crate::atomic::write(&prev, &[&header, &payload], 0o600).map_err(io(&prev))?;
    }
    crate::atomic::write(path, &[&header, &payload], 0o600).map_err(io(path))
}

/// `<state file>.prev`: the generation the last save replaced.
pub(crate) fn previous(path: &Path) -> PathBuf {
    with_suffix(path, ".prev")
}

/// `<state file>.corrupt`: a damaged state file a save found and kept aside.
pub(crate) fn quarantined(path: &Path) -> PathBuf {
    with_suffix(path, ".corrupt")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    path.with_file_name(name)
}

/// Before a save replaces `path`: a whole file there (its header and checksum verify)
/// becomes the previous generation when `promote` says so, a hard link renamed over
/// `.prev`; a damaged one is linked as `.corrupt` for whoever wants to look, and
/// `.prev` stays as it was; no file there (a new namespace, or a dropped one planned
/// again) means any `.prev` is another job's, and it goes. Either way `path` itself
/// exists throughout, so a crash at any point leaves a file to load.
fn keep_previous(path: &Path, promote: bool) -> std::io::Result<()> {
    let prev = previous(path);
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return remove(&prev),
        Err(e) => return Err(e),
    };
    let (keep_as, damage) = match verify(path, &bytes) {
        Ok(_) if !promote => return Ok(()),
        Ok(_) => (prev, None),
        Err(err) => (quarantined(path), Some(err)),
    };
    let tmp = crate::atomic::temporary(&keep_as);
    remove(&tmp)?;
    fs::hard_link(path, &tmp)?;
    fs::rename(&tmp, &keep_as)?;
    if let Some(err) = damage {
        tracing::warn!(
            "{err} (damaged since it was saved); kept aside as {}, the previous generation \
             kept, and the state in memory saved over it",
            keep_as.display()
        );
    }
    Ok(())
}

fn remove(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads the state saved at `path`; `None` if there is no such file. A damaged file
/// (not a state file, truncated, a checksum or content that does not decode) falls
/// back to its previous generation if that one is whole, with a warning naming both;
/// if it is not, the error names both.
pub fn load(path: &Path) -> Result<Option<EmbeddedState>, StateError> {
    let Some(bytes) = read(path)? else {
        return Ok(None);
    };
    let err = match decode(path, &bytes) {
        Ok(state) => return Ok(Some(state)),
        Err(err @ (StateError::Corrupt { .. } | StateError::NotAStateFile { .. })) => err,
        Err(err) => return Err(err),
    };
    let prev = previous(path);
    let Some(older) = read(&prev)? else {
        return Err(err);
    };
    match decode(&prev, &older) {
        Ok(state) => {
            let age = fs::metadata(&prev)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or("?".to_owned(), |d| format!("{:.0}", d.as_secs_f64()));
            tracing::warn!(
                "{err}; resuming from its previous generation {}, saved {age} s ago: \
                 partitions finished since then are pending again and done once more",
                prev.display()
            );
            Ok(Some(state))
        }
        Err(older) => Err(StateError::Corrupt {
            path: path.to_owned(),
            detail: match err {
                StateError::Corrupt { detail, .. } => format!("{detail}; and {older}"),
                _ => format!("not a tranche state file; and {older}"),
            },
        }),
    }
}

/// The bytes of `path`; `None` if there is no such file.
fn read(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn decode(path: &Path, bytes: &[u8]) -> Result<EmbeddedState, StateError> {
    let payload = verify(path, bytes)?;
    let corrupt = |detail: String| StateError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let (state, read) = decode_bounded(payload).map_err(|e| corrupt(e.to_string()))?;
    if read != payload.len() {
        return Err(corrupt(format!(
            "{} bytes after the state",
            payload.len() - read
        )));
    }
    Ok(state)
}

/// The payload of a state file whose magic, version, length and checksum verify.
fn verify<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a [u8], StateError> {
    let corrupt = |detail: String| StateError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(StateError::NotAStateFile {
            path: path.to_owned(),
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!("{} bytes is too short", bytes.len())));
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if version != STATE_FILE_VERSION {
        return Err(StateError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER_LEN..];
    if len > MAX_PAYLOAD || len != payload.len() as u64 {
        return Err(corrupt(format!(
            "it declares {len} bytes of state but holds {}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != word(20) {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(payload)
}

/// The file header of `payload`: magic, version, length, CRC32.
pub(super) fn header(payload: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&STATE_FILE_VERSION.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    header.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header
}

/// The state-file loader fed `data`, for the fuzz target (`worker-bin/fuzz`, `cargo
/// xtask fuzz state`). With the first byte odd, the rest is a payload given a valid
/// header (random bytes almost never carry a valid CRC32, and the fuzzer would spend
/// its time on that check instead of on bincode and the stores' checks behind it);
/// with it even, the rest is the whole file. A state that loads is restored as a
/// writer restores it. Whatever the bytes, both answer or err, never panic.
#[cfg(feature = "fuzzing")]
pub fn fuzz_state_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 1 {
        [header(rest).as_slice(), rest].concat()
    } else {
        rest.to_vec()
    };
    let Ok(state) = decode(Path::new("fuzz.state"), &bytes) else {
        return;
    };
    let (ns, shards) = (state.active.namespace.clone(), state.active.num_shards);
    let active = tranche_active_store::Config {
        namespace: ns.clone(),
        num_shards: shards,
        ..Default::default()
    };
    let first_pid = state.active.first_pid().unwrap_or(1);
    let tuning = crate::layers::Tuning::default();
    let archive = crate::layers::archive_config(&ns, shards, first_pid, &tuning);
    let clock = std::sync::Arc::new(tranche_active_store::SystemClock);
    let _ = super::Embedded::restore(
        active,
        archive,
        clock,
        state,
        tranche_active_store::RestoredLeases::Release,
    );
}

/// How many bytes bincode may claim per payload byte. It claims a string's or byte
/// string's length (bytes that must then be in the payload) and each number's size in
/// memory (at most 8 bytes for our widest, a u64, from at least one byte of varint), so
/// a valid state never claims more than 8 per payload byte.
pub(super) const CLAIM_PER_BYTE: u64 = 16;

/// `payload` decoded by bincode with an allocation limit in proportion to its size
/// (the next power of two of [`CLAIM_PER_BYTE`] times it, at most [`MAX_PAYLOAD`]):
/// a length field in a damaged or hostile file is refused before it is allocated,
/// instead of allocating up to the 16 GiB a fixed limit allows (found by fuzzing: a
/// 100-byte payload asked for 4 GB). bincode takes the limit as a const generic,
/// hence the ladder.
pub(super) fn decode_bounded(
    payload: &[u8],
) -> Result<(EmbeddedState, usize), bincode::error::DecodeError> {
    let need = (payload.len() as u64).saturating_mul(CLAIM_PER_BYTE);
    macro_rules! ladder {
        ($($bits:literal)*) => {$(
            if need <= 1u64 << $bits {
                let config = bincode::config::standard().with_limit::<{ 1usize << $bits }>();
                return bincode::serde::decode_from_slice(payload, config);
            }
        )*};
    }
    ladder!(16 18 20 22 24 26 28 30 32);
    let config = bincode::config::standard().with_limit::<{ MAX_PAYLOAD as usize }>();
    bincode::serde::decode_from_slice(payload, config)
}
