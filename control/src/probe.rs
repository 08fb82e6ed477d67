//! Throttle probes: a command, an HTTP health endpoint, or a closure.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncReadExt;

/// What one check of a probe found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// Go on.
    Go,
    /// Throttle: start no new chunk.
    Throttle {
        /// Why, shown by `status` as "throttled since T: REASON".
        reason: String,
    },
    /// A metric (e.g. replication lag in ms) for `--keep-below`; without a target it
    /// means go.
    Value(f64),
    /// The probe failed: this throttles too, and is reported.
    Error(String),
}

/// A check of whether the database can take more work.
#[async_trait]
pub trait Probe: Send + Sync + std::fmt::Debug {
    /// Runs the check once.
    async fn check(&self) -> ProbeOutcome;
}

/// `--throttle-exec CMD`: runs `sh -c CMD`. Exit 0 is go, or a value when the first
/// line of stdout is a number; exit 1 throttles with the first line of stdout as the
/// reason; any other exit, a signal, the timeout, or more than
/// [`ExecProbe::MAX_OUTPUT`] bytes of stdout is an error (which throttles).
#[derive(Debug, Clone)]
pub struct ExecProbe {
    command: String,
    timeout: Duration,
    /// The whole environment of the command when set (the chunks' scrubbed one); the
    /// worker's own otherwise.
    env: Option<Vec<(String, String)>>,
}

impl ExecProbe {
    /// The most stdout a probe may print; more is an error and the probe is killed.
    pub const MAX_OUTPUT: usize = 64 * 1024;

    /// A probe running `command` through `sh -c`, killed after `timeout`.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: command.into(),
            timeout,
            env: None,
        }
    }

    /// Runs the command with exactly `env` as its environment (nothing inherited), so a
    /// probe sees no more of the worker's secrets than a chunk does.
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = Some(env);
        self
    }
}

#[async_trait]
impl Probe for ExecProbe {
    async fn check(&self) -> ProbeOutcome {
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            // Its own process group, so a timeout kills what the shell started too.
            .process_group(0);
        if let Some(env) = &self.env {
            command.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => return ProbeOutcome::Error(format!("cannot run sh: {err}")),
        };
        let group = child.id();
        let Some(mut stdout) = child.stdout.take() else {
            return ProbeOutcome::Error("the probe has no stdout".to_owned());
        };
        let run = async {
            // One byte over the bound tells "too much" from "exactly the bound".
            let mut out = Vec::new();
            let limit = Self::MAX_OUTPUT as u64 + 1;
            (&mut stdout)
                .take(limit)
                .read_to_end(&mut out)
                .await
                .map_err(|e| format!("cannot read the probe's output: {e}"))?;
            if out.len() > Self::MAX_OUTPUT {
                return Err(format!("the probe printed over {} bytes", Self::MAX_OUTPUT));
            }
            let status = child
                .wait()
                .await
                .map_err(|e| format!("probe failed: {e}"))?;
            Ok((status, out))
        };
        let (status, out) = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(done)) => done,
            Ok(Err(msg)) => {
                if let Some(pgid) = group {
                    kill_group(pgid).await;
                }
                return ProbeOutcome::Error(msg);
            }
            Err(_) => {
                if let Some(pgid) = group {
                    kill_group(pgid).await;
                }
                return ProbeOutcome::Error(format!("probe timed out after {:?}", self.timeout));
            }
        };
        let output = std::process::Output {
            status,
            stdout: out,
            stderr: Vec::new(),
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let first = stdout.lines().next().unwrap_or("").trim().to_owned();
        match output.status.code() {
            Some(0) => match first.parse::<f64>() {
                Ok(v) if v.is_finite() => ProbeOutcome::Value(v),
                _ => ProbeOutcome::Go,
            },
            Some(1) => ProbeOutcome::Throttle {
                reason: if first.is_empty() {
                    "probe said throttle".to_owned()
                } else {
                    first
                },
            },
            Some(code) => ProbeOutcome::Error(format!("probe exited {code}: {first}")),
            None => ProbeOutcome::Error("probe killed by a signal".to_owned()),
        }
    }
}

/// Kills the process group `pgid` (the shell and whatever it started): dropping the
/// child kills only the shell, and `sleep` under `sh -c` would outlive it.
async fn kill_group(pgid: u32) {
    let killed = tokio::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    if let Err(err) = killed {
        tracing::warn!(%err, pgid, "cannot kill a timed-out probe");
    }
}

/// `--throttle-http URL`: a GET of an `http://` or `https://` URL (the server's
/// certificate checked against the system's CAs). 2xx is go, 429 and 503 throttle (the
/// status line is the reason), anything else, a failed TLS handshake or no answer
/// within the timeout is an error.
#[derive(Clone)]
pub struct HttpProbe {
    url: crate::http::HttpUrl,
    timeout: Duration,
    /// The TLS client of an `https://` URL.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for HttpProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProbe")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpProbe {
    /// A probe of `url` (`http[s]://host[:port][/path]`), giving up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> crate::Result<Self> {
        Self::build(url, timeout, None)
    }

    /// [`HttpProbe::new`] for an `https://` URL whose server's certificate is signed by
    /// the private CA `ca_pem` (PEM) rather than (or besides) a system one.
    pub fn with_ca(url: &str, timeout: Duration, ca_pem: &[u8]) -> crate::Result<Self> {
        Self::build(url, timeout, Some(ca_pem))
    }

    fn build(url: &str, timeout: Duration, ca_pem: Option<&[u8]>) -> crate::Result<Self> {
        let url = crate::http::HttpUrl::parse(url)?;
        let tls = if url.tls {
            Some(crate::http::tls_config(ca_pem)?)
        } else {
            None
        };
        Ok(Self { url, timeout, tls })
    }
}

#[async_trait]
impl Probe for HttpProbe {
    async fn check(&self) -> ProbeOutcome {
        match tokio::time::timeout(
            self.timeout,
            crate::http::get_status(&self.url, self.tls.as_ref()),
        )
        .await
        {
            Err(_) => ProbeOutcome::Error(format!("no answer within {:?}", self.timeout)),
            Ok(Err(err)) => ProbeOutcome::Error(err),
            Ok(Ok((code, line))) => match code {
                200..=299 => ProbeOutcome::Go,
                429 | 503 => ProbeOutcome::Throttle { reason: line },
                _ => ProbeOutcome::Error(line),
            },
        }
    }
}

/// A probe from an async closure, for library users: `FnProbe::new(|| async { … })`.
pub struct FnProbe<F> {
    f: F,
}

impl<F> FnProbe<F> {
    /// A probe that calls `f` for every check.
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> std::fmt::Debug for FnProbe<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnProbe")
    }
}

#[async_trait]
impl<F, Fut> Probe for FnProbe<F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = ProbeOutcome> + Send,
{
    async fn check(&self) -> ProbeOutcome {
        (self.f)().await
    }
}
