//! Throttle probes: a command, an HTTP health endpoint, or a closure.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

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
/// reason; any other exit, a signal, or the timeout is an error.
#[derive(Debug, Clone)]
pub struct ExecProbe {
    command: String,
    timeout: Duration,
}

impl ExecProbe {
    /// A probe running `command` through `sh -c`, killed after `timeout`.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: command.into(),
            timeout,
        }
    }
}

#[async_trait]
impl Probe for ExecProbe {
    async fn check(&self) -> ProbeOutcome {
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            // Its own process group, so a timeout kills what the shell started too.
            .process_group(0)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(err) => return ProbeOutcome::Error(format!("cannot run sh: {err}")),
        };
        let group = child.id();
        let output = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(err)) => return ProbeOutcome::Error(format!("probe failed: {err}")),
            Err(_) => {
                if let Some(pgid) = group {
                    kill_group(pgid).await;
                }
                return ProbeOutcome::Error(format!("probe timed out after {:?}", self.timeout));
            }
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

/// `--throttle-http URL`: a GET of an `http://` URL. 2xx is go, 429 and 503 throttle
/// (the status line is the reason), anything else or no answer within the timeout is an
/// error.
#[derive(Debug, Clone)]
pub struct HttpProbe {
    url: crate::http::HttpUrl,
    timeout: Duration,
}

impl HttpProbe {
    /// A probe of `url` (`http://host[:port][/path]`), giving up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> crate::Result<Self> {
        Ok(Self {
            url: crate::http::HttpUrl::parse(url)?,
            timeout,
        })
    }
}

#[async_trait]
impl Probe for HttpProbe {
    async fn check(&self) -> ProbeOutcome {
        match tokio::time::timeout(self.timeout, crate::http::get_status(&self.url)).await {
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
