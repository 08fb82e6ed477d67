//! What a chunk of a partition runs: the team's command (`--exec`) or the labelled load
//! generator (`--simulate`).

use std::process::Stdio;
use std::time::Duration;

use rand::Rng;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The most of a failed command's stderr kept in its failure message.
const STDERR_TAIL: usize = 1024;

/// One chunk: the IDs `from..=to` of partition `pid`, on attempt `attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) pid: u64,
    pub(crate) index: u64,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) attempt: u32,
}

/// How chunks are processed.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// `sh -c CMD` per chunk; exit 0 is success.
    Exec(String),
    /// Sleep uniformly in `latency` ms, fail with probability `fail`.
    Simulate { latency: (u64, u64), fail: f64 },
}

impl Job {
    /// Runs one chunk. `Err` carries a one-line reason, with the tail of the command's
    /// stderr when there is one.
    pub(crate) async fn run(&self, chunk: Chunk) -> Result<(), String> {
        match self {
            // Boxed: a child process's state would make every chunk's future that big.
            Job::Exec(cmd) => Box::pin(exec(cmd, chunk)).await,
            Job::Simulate { latency, fail } => {
                let (ms, failed) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(latency.0..=latency.1),
                        rng.random_bool(*fail),
                    )
                };
                // A zero latency is no sleep: a timer would round it up to the
                // timer wheel's millisecond.
                if ms > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                if failed {
                    Err(format!(
                        "simulated failure of chunk {} ({}..={})",
                        chunk.index, chunk.from, chunk.to
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

async fn exec(cmd: &str, chunk: Chunk) -> Result<(), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("TRANCHE_PID", chunk.pid.to_string())
        .env("TRANCHE_FROM", chunk.from.to_string())
        .env("TRANCHE_TO", chunk.to.to_string())
        .env("TRANCHE_ATTEMPT", chunk.attempt.to_string())
        .env("TRANCHE_CHUNK", chunk.index.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        // A chunk abandoned at shutdown (after the grace period) takes its process along.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `sh -c {cmd}`: {e}"))?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    // Keep only the tail: a chatty command must not grow this process's memory.
    let read_tail = async {
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stderr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * STDERR_TAIL {
                        tail.drain(..tail.len() - STDERR_TAIL);
                    }
                }
            }
        }
        tail
    };
    let (status, tail) = tokio::join!(child.wait(), read_tail);
    let status = status.map_err(|e| format!("waiting for `{cmd}`: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let tail = String::from_utf8_lossy(&tail[tail.len().saturating_sub(STDERR_TAIL)..]);
    let tail = tail.trim();
    let how = match status.code() {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_owned(),
    };
    Err(if tail.is_empty() {
        format!(
            "chunk {} ({}..={}) failed: {how}",
            chunk.index, chunk.from, chunk.to
        )
    } else {
        format!(
            "chunk {} ({}..={}) failed: {how}: {tail}",
            chunk.index, chunk.from, chunk.to
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> Chunk {
        Chunk {
            pid: 7,
            index: 2,
            from: 6201,
            to: 6300,
            attempt: 3,
        }
    }

    #[tokio::test]
    async fn exec_sees_the_chunk_in_its_environment() {
        let job = Job::Exec(
            r#"test "$TRANCHE_PID/$TRANCHE_FROM/$TRANCHE_TO/$TRANCHE_ATTEMPT/$TRANCHE_CHUNK" = 7/6201/6300/3/2"#
                .into(),
        );
        assert_eq!(job.run(chunk()).await, Ok(()));
    }

    #[tokio::test]
    async fn a_failure_carries_the_tail_of_stderr() {
        let job = Job::Exec("echo first >&2; echo 'the real reason' >&2; exit 3".into());
        let err = job.run(chunk()).await.unwrap_err();
        assert!(
            err.starts_with("chunk 2 (6201..=6300) failed: exit status 3"),
            "{err}"
        );
        assert!(err.ends_with("first\nthe real reason"), "{err}");
    }

    #[tokio::test]
    async fn a_long_stderr_is_cut_to_its_tail() {
        let job =
            Job::Exec("head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1".into());
        let err = job.run(chunk()).await.unwrap_err();
        assert!(err.len() < STDERR_TAIL + 100, "{}", err.len());
        assert!(err.ends_with("END"));
    }

    #[tokio::test]
    async fn simulate_fails_at_its_rate() {
        let always = Job::Simulate {
            latency: (0, 0),
            fail: 1.0,
        };
        let never = Job::Simulate {
            latency: (0, 1),
            fail: 0.0,
        };
        assert!(
            always
                .run(chunk())
                .await
                .unwrap_err()
                .contains("simulated failure")
        );
        assert_eq!(never.run(chunk()).await, Ok(()));
    }
}
