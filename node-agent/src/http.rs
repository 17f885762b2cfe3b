//! `/metrics`, `/healthz` and `/readyz`: the routes the `service` crate serves (on one
//! port, or the probes on a port of their own; `/metrics` over HTTPS with token checks
//! when the flags say so).

use std::sync::Arc;

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use service::{http::Routes, tasks::Health};

use crate::{
    gpu::GpuSource,
    pipeline::Pipeline,
    sinks::prometheus::{Exposition, Format},
};

pub struct HttpState {
    pub exposition: Exposition,
    pub pipeline: Arc<Pipeline>,
    /// On a node with GPUs and no Neuron device (no neuron-monitor): ready on the first
    /// GPU collection instead of the first report.
    pub gpu_only: Option<GpuSource>,
    /// Whether a critical task ended: the probes then answer 503 until the agent exits.
    pub health: Health,
}

pub fn routes(state: Arc<HttpState>) -> Routes {
    Routes {
        metrics: Router::new().route("/metrics", get(metrics)).with_state(state.clone()),
        probes: Router::new()
            // Needs no lock and no worker held by the report path or a scrape.
            .route("/healthz", get(healthz))
            .route("/readyz", get(ready))
            .with_state(state),
    }
}

/// Renders on the blocking pool: rendering takes the state lock, which a report being
/// applied holds, and costs CPU in proportion to the state; the async workers must stay
/// free for `/healthz` meanwhile. At most a few renders run at once (each holds a whole
/// exposition in memory); more scrapes wait for a slot.
async fn metrics(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let rendered = {
        let _slot = state.exposition.render_slot().await;
        let state = state.clone();
        tokio::task::spawn_blocking(move || state.exposition.render(format)).await
    };
    match rendered {
        Ok(Ok(page)) => ([(header::CONTENT_TYPE, format.content_type())], page.into_body()).into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "could not encode metrics\n").into_response(),
    }
}

async fn healthz(State(state): State<Arc<HttpState>>) -> Response {
    match state.health.failed_task() {
        Some(task) => (StatusCode::SERVICE_UNAVAILABLE, format!("critical task {task} ended\n")).into_response(),
        None => (StatusCode::OK, "ok\n").into_response(),
    }
}

async fn ready(State(state): State<Arc<HttpState>>) -> Response {
    let (status, body) = if let Some(task) = state.health.failed_task() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("critical task {task} ended\n"))
    } else if state.pipeline.is_ready() || state.gpu_only.as_ref().is_some_and(GpuSource::collected) {
        (StatusCode::OK, "ok\n".to_owned())
    } else if state.gpu_only.is_some() {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first GPU collection\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first neuron-monitor report\n".to_owned())
    };
    // A state directory that cannot be written: still ready (monitoring works), said here.
    let degraded = crate::state_dir::status().degraded();
    (status, body + &degraded.map(|d| d + "\n").unwrap_or_default()).into_response()
}
