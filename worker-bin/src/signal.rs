//! [`shutdown_signal`]: the stop an operator sends, whichever way they send it. A
//! terminal sends SIGINT (Ctrl-C); Kubernetes, systemd, Docker and Nomad send
//! SIGTERM, then SIGKILL once their stop timeout runs out. A worker that listens
//! only for Ctrl-C is killed by an orchestrator without a drain.

/// Resolves at the first SIGINT or SIGTERM (on Unix; elsewhere at Ctrl-C). Hand it to
/// [`Runner::run_with_shutdown`](crate::Runner::run_with_shutdown), or cancel a
/// [`CancellationToken`](crate::CancellationToken) when it resolves: the run then
/// drains (running chunks get the grace period, the rest is released). Give the
/// orchestrator a stop timeout of at least the grace period plus five seconds (see
/// `deploy/systemd`).
///
/// If a handler cannot be installed it never resolves (the process then stops as it
/// would without one), and logs why.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            (Err(err), _) | (_, Err(err)) => {
                tracing::warn!(%err, "cannot listen for SIGINT and SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
