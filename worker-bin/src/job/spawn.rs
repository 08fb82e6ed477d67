//! What every process a chunk runs in starts with, `--exec`'s and
//! `--exec-persistent`'s alike: tranche's environment minus the variables it reads
//! secrets from ([`SECRETS`]), the tag its leftovers are found by (`reap.rs`), and a
//! process group of its own, so that the terminal's Ctrl-C reaches tranche alone and
//! the whole group can be stopped at once ([`signal_group`]).

use tokio::process::Command;

use super::reap;

/// Variables tranche reads a secret from, never passed to a chunk: the Redis URL may
/// carry a password, the admin token is one, and the others name the files that hold
/// one or a private key.
const SECRETS: &[&str] = &[
    "TRANCHE_REDIS_URL",
    "TRANCHE_REDIS_FILE",
    "TRANCHE_TLS_CERT",
    "TRANCHE_TLS_KEY",
    "TRANCHE_ADMIN_TOKEN",
    "TRANCHE_ADMIN_TOKEN_FILE",
    "TRANCHE_READ_TOKEN",
];

#[cfg(feature = "cli")]
/// This process's environment without the variables in [`SECRETS`]: what a chunk
/// inherits, and what a throttle probe command runs with (a variable that is not
/// UTF-8 is left out).
pub(crate) fn scrubbed_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| !SECRETS.contains(&k.as_str()))
        .collect()
}

/// W3C trace context variables: a chunk's are its own chunk span's (set after
/// [`prepare`] when the run is traced), never what tranche itself inherited, which would
/// put every chunk of an untraced run into the trace of whatever started tranche.
const TRACE_CONTEXT: &[&str] = &["TRACEPARENT", "TRACESTATE"];

/// Readies `command` to run a chunk's process: no secret and no inherited trace context
/// in its environment, `tag` in it ([`reap::TAG`]), in process group `pgid` (0: a new
/// group it leads), killed should its `Child` be dropped unwaited.
pub(super) fn prepare(command: &mut Command, tag: &str, pgid: u32) {
    for key in SECRETS.iter().chain(TRACE_CONTEXT) {
        command.env_remove(key);
    }
    command
        .env(reap::TAG, tag)
        .process_group(pgid as i32)
        .kill_on_drop(true);
}

/// Sends `signal` to process group `pgid`; a group already gone is fine.
pub(super) fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let pgid = nix::unistd::Pid::from_raw(pgid as i32);
    if let Err(err) = nix::sys::signal::killpg(pgid, signal)
        && err != nix::errno::Errno::ESRCH
    {
        tracing::warn!(%err, ?signal, %pgid, "could not signal a chunk's process group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets and an inherited trace context are taken out of what a chunk inherits.
    #[test]
    fn a_chunk_inherits_no_secret_and_no_trace_context() {
        let mut command = Command::new("true");
        command
            .env(
                "TRACEPARENT",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .env("TRACESTATE", "vendor=1")
            .env("TRANCHE_ADMIN_TOKEN", "secret")
            .env("KEPT", "yes");
        prepare(&mut command, "tag", 0);
        let envs: std::collections::BTreeMap<_, _> = command
            .as_std()
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.map(|v| v.to_owned())))
            .collect();
        for removed in ["TRACEPARENT", "TRACESTATE", "TRANCHE_ADMIN_TOKEN"] {
            assert_eq!(envs.get(removed), Some(&None), "{removed} is removed");
        }
        assert_eq!(envs.get("KEPT"), Some(&Some("yes".into())));
        assert_eq!(envs.get(reap::TAG), Some(&Some("tag".into())));
    }
}
