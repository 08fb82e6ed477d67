//! Probes for an orchestrator, on `serve` and on `run --metrics-listen`:
//!
//! - `/healthz` answers 200 while the process answers at all (liveness: restart it
//!   when this fails).
//! - `/readyz` answers 200 when the store answers within [`STORE_TIMEOUT`], the process
//!   is not draining after a signal, and no operator paused the namespace or turned the
//!   manual throttle on; 503 otherwise. Its body says which, as
//!   `{"ready", "store", "draining", "paused", "throttled", "why"}`.
//!
//! A probe throttle (the replica-lag probe, say) keeps a worker ready: it is the job
//! pacing itself, not an operator taking it out of service.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tranche_active_store::ActiveStore;
use tranche_control::ControlStore;

use crate::backend::Backend;

/// How long `/readyz` waits for the store before calling it unreachable.
pub(crate) const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/readyz` reads: the namespace's pause flag and control record.
#[derive(Clone)]
pub(crate) struct Readiness {
    active: Arc<dyn ActiveStore>,
    /// The control store; `None` embedded, where nothing throttles by hand.
    control: Option<Arc<dyn ControlStore>>,
    /// Set once the process drains after SIGINT or SIGTERM.
    draining: Arc<AtomicBool>,
}

impl Readiness {
    pub(crate) fn new(backend: &Backend, draining: Arc<AtomicBool>) -> Self {
        Self::of(
            backend.active.clone(),
            (!backend.is_embedded()).then(|| crate::control::stores(backend).0),
            draining,
        )
    }

    /// What `/readyz` reads from these stores (`control` is `None` embedded).
    pub(crate) fn of(
        active: Arc<dyn ActiveStore>,
        control: Option<Arc<dyn ControlStore>>,
        draining: Arc<AtomicBool>,
    ) -> Self {
        Self {
            active,
            control,
            draining,
        }
    }

    /// The `/readyz` answer.
    pub(crate) async fn answer(&self) -> Response {
        let draining = self.draining.load(Relaxed);
        let read = async {
            let paused = self.active.is_paused().await.map_err(|e| e.to_string())?;
            let manual = match &self.control {
                Some(store) => store.read().await.map_err(|e| e.to_string())?.manual,
                None => None,
            };
            Ok::<_, String>((paused, manual.map(|m| m.reason)))
        };
        let (store, paused, throttled) = match tokio::time::timeout(STORE_TIMEOUT, read).await {
            Ok(Ok((paused, throttled))) => ("ok".to_owned(), paused, throttled),
            Ok(Err(err)) => (format!("unreachable: {err}"), false, None),
            Err(_) => (
                format!("unreachable: no answer in {STORE_TIMEOUT:?}"),
                false,
                None,
            ),
        };
        let mut why = Vec::new();
        if store != "ok" {
            why.push("store unreachable");
        }
        if draining {
            why.push("draining");
        }
        if paused {
            why.push("paused");
        }
        if throttled.is_some() {
            why.push("throttled by an operator");
        }
        let code = if why.is_empty() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let body = json!({
            "ready": why.is_empty(),
            "store": store,
            "draining": draining,
            "paused": paused,
            "throttled": throttled,
            "why": why,
        });
        (code, axum::Json(body)).into_response()
    }
}

/// `/healthz`: the process answers.
pub(crate) async fn healthz() -> Response {
    (StatusCode::OK, axum::Json(json!({"live": true}))).into_response()
}

/// `/healthz` and `/readyz` as routes of their own, for `run --metrics-listen`.
pub(crate) fn routes(readiness: Readiness) -> axum::Router {
    axum::Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let readiness = readiness.clone();
                async move { readiness.answer().await }
            }),
        )
}

/// A flag that turns true at the first SIGINT or SIGTERM (tokio delivers a signal to
/// every listener, so the run's own handler drains as before), watched by a task on
/// `background` that ends when `done` turns true.
pub(crate) fn draining_flag(
    done: tokio::sync::watch::Receiver<bool>,
    background: &mut tokio::task::JoinSet<()>,
) -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let flag = Arc::new(AtomicBool::new(false));
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let (set, mut done) = (flag.clone(), done);
    background.spawn(async move {
        tokio::select! {
            _ = int.recv() => set.store(true, Relaxed),
            _ = term.recv() => set.store(true, Relaxed),
            _ = done.wait_for(|d| *d) => {}
        }
    });
    Ok(flag)
}
