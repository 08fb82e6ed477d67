//! `tranche serve`: a dashboard, a JSON API under `/api/v1/` and Prometheus metrics on
//! `/metrics`, for one namespace, read through the same stores as the CLI. It runs no
//! worker.
//!
//! Everything it reads costs O(shards) per request, like `status`, except what a
//! request asks for by size (`partitions?limit=`). Actions (retry, discard, pause,
//! resume) are POSTs that need `Authorization: Bearer <token>` (`--admin-token`,
//! `TRANCHE_ADMIN_TOKEN` or `--admin-token-file`); without a token configured the server is read-only and the
//! dashboard shows no action. The token never travels in a URL, and a custom header
//! cannot be sent cross-site without CORS, which this server never grants: no CSRF.
//! Beyond localhost every read needs a token too (`--read-token`, or the admin token):
//! the server refuses to start without one. Tokens are compared in constant time.
//! No response carries the Redis URL's password.
//!
//! Connections are accepted by [`http::serve`] (also `run --metrics-listen`'s): capped,
//! with a header-read timeout and a bounded drain at shutdown, so no client holds the
//! process open. On Redis every namespace of the overview is read through the one
//! connection the server opened (`backend::Connections`).

mod api;
mod http;
mod metrics;
mod probes;

pub(crate) use http::serve as serve_http;
pub(crate) use probes::{Readiness, draining_flag, routes as probe_routes};

pub(crate) use metrics::worker_metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::routing::{get, post};

use crate::backend::{Backend, Connections, Open, Tuning};
use crate::cli::args::ServeArgs;
use crate::cli::common::Global;
use crate::cli::common::Outcome;
use crate::sync::until;
use crate::work::Stop;

/// What every handler shares.
pub(crate) struct App {
    global: Global,
    /// The namespace on Redis, opened once; embedded, each request loads the state file
    /// afresh (a running `run` keeps saving it).
    redis: Option<Backend>,
    /// The Redis connection `redis` was opened with, kept for the namespaces overview:
    /// every namespace is read through it.
    connections: Connections,
    token: Option<String>,
    /// The token a GET must present (`--read-token`, else the admin token when this
    /// server listens beyond localhost); the admin token is accepted too. `None`: GETs
    /// are open (localhost only).
    read_token: Option<String>,
    /// This server's reads of each layer, for `/metrics`.
    query_latency: metrics::QueryLatency,
    /// Set once a signal stops the server: `/readyz` answers 503 while it drains.
    draining: Arc<std::sync::atomic::AtomicBool>,
}

impl App {
    /// The backend to answer from.
    async fn backend(&self) -> Result<BackendRef<'_>> {
        match &self.redis {
            Some(b) => Ok(BackendRef::Shared(b)),
            None => Ok(BackendRef::Fresh(Box::new(
                Backend::open(&self.global.location(), Open::Existing, Tuning::default()).await?,
            ))),
        }
    }
}

/// A backend borrowed from the app or opened for one request.
enum BackendRef<'a> {
    Shared(&'a Backend),
    Fresh(Box<Backend>),
}

impl std::ops::Deref for BackendRef<'_> {
    type Target = Backend;
    fn deref(&self) -> &Backend {
        match self {
            BackendRef::Shared(b) => b,
            BackendRef::Fresh(b) => b,
        }
    }
}

/// The routes.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(api::dashboard))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(api::readyz))
        .route("/api/v1/control", get(api::control))
        .route("/metrics", get(metrics::scrape))
        .route("/api/v1/config", get(api::config))
        .route("/api/v1/status", get(api::status))
        .route("/api/v1/workers", get(api::workers))
        .route("/api/v1/stats", get(api::stats))
        .route("/api/v1/health", get(api::health))
        .route("/api/v1/plans", get(api::plans))
        .route("/api/v1/namespaces", get(api::namespaces))
        .route("/api/v1/memory", get(api::memory))
        .route("/api/v1/get/{pid}", get(api::get_pid))
        .route("/api/v1/locate/{row}", get(api::locate))
        .route("/api/v1/partitions", get(api::partitions))
        .route("/api/v1/retry-failed", post(api::retry_failed))
        .route("/api/v1/discard/{pid}", post(api::discard))
        .route("/api/v1/pause", post(api::pause))
        .route("/api/v1/resume", post(api::resume))
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), read_gate))
        .with_state(app)
}

/// Paths a GET reaches without the read token: the dashboard's page itself (static; it
/// sends the token it is given with each read) and the liveness probes.
const OPEN_PATHS: &[&str] = &["/", "/healthz", "/readyz"];

/// Refuses a GET without the read (or admin) token, when one is required: 401.
async fn read_gate(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(want) = &app.read_token
        && request.method() != axum::http::Method::POST
        && !OPEN_PATHS.contains(&request.uri().path())
    {
        let headers = request.headers();
        let admin = app
            .token
            .as_deref()
            .is_some_and(|t| api::bearer_is(headers, t));
        if !admin && !api::bearer_is(headers, want) {
            return api::unauthorized_read();
        }
    }
    next.run(request).await
}

/// The admin token in `path`: its first line, trimmed. One line of error, never the
/// token.
fn read_token(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read --admin-token-file {}: {e}", path.display()))?;
    match text.lines().next().map(str::trim) {
        Some(token) if !token.is_empty() => Ok(token.to_owned()),
        _ => anyhow::bail!(
            "--admin-token-file {} holds no token on its first line",
            path.display()
        ),
    }
}

/// `tranche serve`: binds `--listen` and answers until SIGINT/SIGTERM.
pub(crate) async fn serve(g: &Global, args: ServeArgs) -> Result<Outcome> {
    let connections = Connections::default();
    let backend = Backend::open_with(
        &g.location(),
        Open::Existing,
        Tuning::default(),
        &connections,
    )
    .await?;
    let token = match &args.admin_token_file {
        Some(path) => Some(read_token(path)?),
        None => args.admin_token.filter(|t| !t.is_empty()),
    };
    let listen: SocketAddr = args.listen;
    let read_token = match args.read_token.filter(|t| !t.is_empty()) {
        Some(t) => Some(t),
        None if listen.ip().is_loopback() => None,
        None => match &token {
            Some(admin) => Some(admin.clone()),
            None => anyhow::bail!(
                "serve --listen {listen} reaches beyond localhost: give --read-token (or --admin-token) so that not anyone who reaches the port reads the job"
            ),
        },
    };
    let app = Arc::new(App {
        global: g.clone(),
        redis: (!backend.is_embedded()).then_some(backend),
        connections,
        token,
        read_token,
        query_latency: metrics::QueryLatency::new(),
        draining: Arc::default(),
    });
    let draining = app.draining.clone();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    println!("serving namespace `{}` on http://{local}/", g.namespace);
    let mut stop = crate::cli::common::signals(std::time::Duration::ZERO)?;
    http::serve(listener, router(app), async move {
        until(&mut stop, |s| *s != Stop::Running).await;
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
    })
    .await;
    Ok(Outcome::Success)
}
