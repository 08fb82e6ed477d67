//! The HTTP server under `serve` and `run --metrics-listen`: our own accept loop over
//! hyper's HTTP/1 connections, so that no client can hold a process open.
//!
//! - At most [`MAX_CONNECTIONS`] connections at once; one beyond is closed unread, and
//!   the server answers the others on.
//! - A client has [`HEADER_READ`] to send a request's head, an idle keep-alive
//!   connection as long to start the next one; then the connection is closed.
//! - At shutdown, idle connections close at once and requests in flight get
//!   [`DRAIN`] to finish: a half-open socket delays a stop by that much at most.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Connections served at once; the dashboard needs a handful, a scraper one.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a client has to send a request's head (or to start the next request on a
/// kept-alive connection).
pub(crate) const HEADER_READ: Duration = Duration::from_secs(5);

/// How long the connections still open at shutdown get to finish.
pub(crate) const DRAIN: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `stop` resolves, then drains for at most [`DRAIN`].
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    stop: impl Future<Output = ()>,
) {
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (closing, closed) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            () = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of descriptors, most likely: give the open ones time to close.
                    tracing::warn!(%err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::debug!("connection refused: {MAX_CONNECTIONS} already open");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _place = place;
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = closed.wait_for(|closed| *closed) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, connection).await;
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN * 2, drained).await.is_err() {
        connections.abort_all();
    }
}
