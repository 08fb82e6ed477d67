//! The JSON API (`/api/v1/...`) and the dashboard page. Shapes are the CLI's `--json`
//! shapes, built by the same functions.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use tranche_router::PartitionView;

use super::App;
use crate::cli::admin::Admin;
use crate::cli::list::{self, ListState};
use crate::cli::render;

/// The dashboard: one self-contained page (no CDN) that polls the API.
const DASHBOARD: &str = include_str!("dashboard.html");

/// A failed request: a status code and `{"error": {"kind", "message"}}`.
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(err: anyhow::Error) -> Self {
        // One line, as the CLI prints it; the URL in it is already redacted.
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "error",
            crate::cli::common::one_line(&err),
        )
    }
}

impl From<tranche_active_store::Error> for ApiError {
    fn from(err: tranche_active_store::Error) -> Self {
        anyhow::Error::from(err).into()
    }
}

impl From<crate::Error> for ApiError {
    fn from(err: crate::Error) -> Self {
        anyhow::Error::from(err).into()
    }
}

impl From<tranche_router::Error> for ApiError {
    fn from(err: tranche_router::Error) -> Self {
        anyhow::Error::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"kind": self.kind, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// A JSON body the render functions already wrote (one line).
fn json_text(text: String) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        text.trim_end().to_owned(),
    )
        .into_response()
}

fn json_value(v: Value) -> Response {
    axum::Json(v).into_response()
}

/// Checks `Authorization: Bearer <token>` for an action: 403 when this server takes
/// no actions (no token configured), 401 without a matching token.
fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(want) = &app.token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only",
            "this server is read-only: start it with --admin-token to allow actions",
        ));
    };
    if bearer_is(headers, want) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "an action needs the header Authorization: Bearer <admin token>",
        ))
    }
}

/// 401 for a read without the read token.
pub(crate) fn unauthorized_read() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this server needs the header Authorization: Bearer <read token> (or the admin token)",
    )
    .into_response()
}

/// Whether the request's `Authorization: Bearer` token is `want`, compared in a time
/// that depends on neither where they differ nor `want`'s length: both are hashed with
/// this process's random keys and the digests compared whole.
pub(crate) fn bearer_is(headers: &HeaderMap, want: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    same_token(given.as_bytes(), want.as_bytes())
}

/// `given == want` in constant time over the full length of each (see [`bearer_is`]).
fn same_token(given: &[u8], want: &[u8]) -> bool {
    use std::hash::{BuildHasher, RandomState};
    static KEYS: std::sync::LazyLock<[RandomState; 2]> =
        std::sync::LazyLock::new(|| [RandomState::new(), RandomState::new()]);
    let digest = |bytes: &[u8]| KEYS.each_ref().map(|k| k.hash_one(bytes));
    let (a, b) = (digest(given), digest(want));
    let differ = a.iter().zip(&b).fold(0u64, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(differ) == 0
}

fn parse_u64(what: &str, text: &str) -> Result<u64, ApiError> {
    text.parse()
        .map_err(|_| ApiError::bad_request(format!("{what} must be a whole number, not `{text}`")))
}

pub(crate) async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

pub(crate) async fn config(State(app): State<Arc<App>>) -> Response {
    json_value(json!({
        "namespace": app.global.namespace,
        "actions": app.token.is_some(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

pub(crate) async fn status(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let mut status = crate::cli::inspect::status_of(&backend).await?;
    // The CLI's shape, but no address of the store leaves the server.
    status.location = if backend.is_embedded() {
        "embedded".to_owned()
    } else {
        "redis".to_owned()
    };
    Ok(json_text(render::status(&status, true)))
}

pub(crate) async fn workers(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let workers = backend.active.workers().await?;
    Ok(json_text(render::workers(
        &workers,
        crate::duration::now_ms(),
        true,
    )))
}

pub(crate) async fn stats(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let merged = backend.router.stats().await?;
    Ok(json_text(render::stats(&merged, true)?))
}

/// Every alert rule with its reading: 200 when none fires, 503 when one does (the
/// body is the same list either way), so a plain HTTP check alerts on it.
pub(crate) async fn health(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let rules =
        crate::cli::health::health_rules(&backend, &crate::cli::args::HealthArgs::defaults())
            .await?;
    let code = if rules.iter().any(|r| r.firing()) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    Ok((code, json_text(render::health(&rules, true))).into_response())
}

/// `/readyz` (see `probes`): an embedded namespace whose state file cannot be opened
/// is a store that does not answer.
pub(crate) async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.backend().await {
        Ok(backend) => {
            super::probes::Readiness::new(&backend, app.draining.clone())
                .answer()
                .await
        }
        Err(err) => {
            let body = json!({
                "ready": false,
                "store": format!("unreachable: {}", crate::cli::common::one_line(&err)),
                "draining": app.draining.load(std::sync::atomic::Ordering::Relaxed),
                "paused": false,
                "throttled": null,
                "why": ["store unreachable"],
            });
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

/// How many entries of the control log the dashboard shows.
const CONTROL_LOG: usize = 10;

/// The control record as `status --json` shows it (`null` when nothing was ever set,
/// and embedded) and its last [`CONTROL_LOG`] changes, newest first.
pub(crate) async fn control(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    if backend.is_embedded() {
        return Ok(json_value(json!({"record": null, "log": []})));
    }
    let (store, _) = crate::control::stores(&backend);
    let record = store.read().await.map_err(anyhow::Error::from)?;
    let log = store.log(CONTROL_LOG).await.map_err(anyhow::Error::from)?;
    let record = (record != tranche_control::ControlRecord::default())
        .then(|| crate::cli::render::record_json(&record, crate::duration::now_ms()));
    Ok(json_value(json!({"record": record, "log": log})))
}

/// What the archive costs, as far as O(1) reads can tell: on Redis the server's memory
/// (all namespaces, every master) per archived partition of this namespace, an upper
/// bound that is exact for a server given to one job; embedded, nothing (the state
/// file's size is on disk, beside the lock).
pub(crate) async fn memory(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let archived = backend
        .stats
        .summary()
        .await
        .map_err(anyhow::Error::from)?
        .global_stats
        .total_completed;
    let bytes = backend.used_memory().await;
    let per = bytes
        .filter(|_| archived > 0)
        .map(|b| b as f64 / archived as f64);
    Ok(json_value(json!({
        "redis_memory_bytes": bytes,
        "archived": archived,
        "redis_bytes_per_archived_partition": per,
    })))
}

/// Every namespace beside this one, with its progress: the dashboard's overview.
pub(crate) async fn namespaces(State(app): State<Arc<App>>) -> ApiResult {
    let rows = crate::cli::namespace::overview(&app.global, &app.connections).await?;
    Ok(json_value(Value::Array(rows)))
}

pub(crate) async fn plans(State(app): State<Arc<App>>) -> ApiResult {
    let backend = app.backend().await?;
    let plans = backend.active.plans().await?;
    Ok(json_value(crate::cli::namespace::plans_json(&plans)))
}

pub(crate) async fn get_pid(State(app): State<Arc<App>>, Path(pid): Path<String>) -> ApiResult {
    let pid = parse_u64("pid", &pid)?;
    let backend = app.backend().await?;
    let started = std::time::Instant::now();
    let view = backend.router.get(pid).await?;
    let layer = match &view {
        // An unknown pid is answered by the plans, in the active layer.
        PartitionView::Active(_) | PartitionView::Unknown => "active",
        PartitionView::Archived { .. } => "archive",
        PartitionView::Archiving { .. } => "inbox",
        PartitionView::Summarised { .. } => "stats",
    };
    app.query_latency.observe(layer, started);
    let pieces = crate::cli::inspect::pieces_of(backend.active.as_ref(), &view).await?;
    Ok(json_text(render::view(pid, &view, &pieces, true)))
}

pub(crate) async fn locate(State(app): State<Arc<App>>, Path(row): Path<String>) -> ApiResult {
    let row = parse_u64("row id", &row)?;
    let backend = app.backend().await?;
    match backend.router.locate(row).await? {
        Some(located) => Ok(json_text(render::located(&located, true))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no plan covers row id {row}"),
        )),
    }
}

/// `?state=&worker=&after=&limit=`, all optional.
#[derive(Debug, Deserialize)]
pub(crate) struct PartitionsQuery {
    state: Option<String>,
    worker: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

pub(crate) async fn partitions(
    State(app): State<Arc<App>>,
    Query(q): Query<PartitionsQuery>,
) -> ApiResult {
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            <ListState as clap::ValueEnum>::from_str(s, false).map_err(|_| {
                ApiError::bad_request(format!(
                    "state must be pending, claimed, running, failed, discarded or archived, not `{s}`"
                ))
            })?,
        ),
    };
    let after = q
        .after
        .as_deref()
        .map(|a| parse_u64("after", a))
        .transpose()?
        .unwrap_or(0);
    let limit = q
        .limit
        .as_deref()
        .map(|l| parse_u64("limit", l))
        .transpose()?
        .unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    if let Some(w) = &q.worker
        && (w.len() > 256 || w.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(
            "worker must be at most 256 characters, none of them control characters",
        ));
    }
    let backend = app.backend().await?;
    let page = list::page(&backend, state, q.worker.as_deref(), after, limit as usize).await?;
    Ok(json_text(list::render(&page, true)))
}

/// `?pid=` to retry one partition; every failed one otherwise.
#[derive(Debug, Deserialize)]
pub(crate) struct RetryQuery {
    pid: Option<String>,
}

pub(crate) async fn retry_failed(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<RetryQuery>,
) -> ApiResult {
    authorize(&app, &headers)?;
    let pid = q.pid.as_deref().map(|p| parse_u64("pid", p)).transpose()?;
    let backend = app.backend().await?;
    let pids = crate::query::retry_failed(&backend, pid).await?;
    Ok(json_value(json!({"retried": pids})))
}

pub(crate) async fn discard(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(pid): Path<String>,
) -> ApiResult {
    authorize(&app, &headers)?;
    let pid = parse_u64("pid", &pid)?;
    let backend = app.backend().await?;
    if !crate::query::discard(&backend, pid).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "partition {pid} is not pending or failed (it is {}): nothing discarded",
                crate::cli::inspect::state_of(&backend, pid).await
            ),
        ));
    }
    Ok(json_value(json!({"discarded": pid})))
}

pub(crate) async fn pause(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult {
    set_paused(&app, &headers, true).await
}

pub(crate) async fn resume(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult {
    set_paused(&app, &headers, false).await
}

async fn set_paused(app: &App, headers: &HeaderMap, paused: bool) -> ApiResult {
    authorize(app, headers)?;
    let backend = app.backend().await?;
    match crate::query::set_paused(&backend, paused).await {
        Err(crate::Error::Config(why)) => return Err(ApiError::bad_request(why)),
        other => other?,
    }
    Ok(json_value(json!({"paused": paused})))
}

#[cfg(test)]
mod token_tests {
    use super::same_token;

    #[test]
    fn tokens_match_whole_or_not_at_all() {
        assert!(same_token(b"t0ken", b"t0ken"));
        for given in [&b""[..], b"t0ke", b"t0ken!", b"T0ken", b"t0ken\0"] {
            assert!(!same_token(given, b"t0ken"), "{given:?}");
        }
    }
}
