//! `/metrics`, `/healthz` and `/readyz` on one port.

use std::sync::Arc;

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use http_server::{ConnectionMetrics, Limits};
use tokio_util::sync::CancellationToken;

use crate::{
    pipeline::Pipeline,
    sinks::prometheus::{Exposition, Format},
};

pub struct HttpState {
    pub exposition: Exposition,
    pub pipeline: Arc<Pipeline>,
}

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state)
}

/// Serves until `shutdown` is cancelled, within `limits` (header timeout, connection
/// cap; see the `http_server` crate), counting refusals and timeouts in `metrics`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
    limits: Limits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) {
    http_server::serve(listener, router(state), limits, metrics, shutdown).await
}

async fn metrics(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    match state.exposition.render(format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "could not encode metrics\n").into_response(),
    }
}

async fn ready(State(state): State<Arc<HttpState>>) -> Response {
    if state.pipeline.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first neuron-monitor report\n").into_response()
    }
}
