//! `/metrics`, `/healthz` and `/readyz`: the routes the `service` crate serves (on one
//! port, or the probes on a port of their own; `/metrics` over HTTPS with token checks
//! when the flags say so, and on the token-free port when asked). A scrape gets the
//! agent's own metrics as they are, then the node's families kept from a scrape just
//! before when they are fresh, else rendered in a render slot of its own port.

use std::{sync::Arc, time::Instant};

use axum::{
    body::Body,
    extract::State,
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use bytes::Bytes;
use service::{
    http::{Port, Routes},
    tasks::Health,
};

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

/// The page, in the format the scraper asks for ([`page`]).
async fn metrics(State(state): State<Arc<HttpState>>, port: Option<Extension<Port>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    match page(&state, port.map_or(Port::Main, |Extension(port)| port), format).await {
        Some(page) => ([(header::CONTENT_TYPE, format.content_type())], Body::new(page)).into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "could not encode metrics\n").into_response(),
    }
}

/// The page for a scrape on `port`: the agent's own metrics as they are now, then the
/// node's families ([`families`]). `None`: the page could not be encoded.
async fn page(state: &Arc<HttpState>, port: Port, format: Format) -> Option<Page> {
    let families = families(state, port, format).await?;
    let own = state.exposition.own_metrics(format).ok()?;
    Some(Page { parts: [own, families] })
}

/// The node's families for a scrape on `port`: those kept from a scrape just before
/// ([`Exposition::shared_families`]), or rendered in a render slot of `port`. Renders run
/// on the blocking pool: rendering takes the state lock, which a report being applied
/// holds, and costs CPU in proportion to the state; the async workers must stay free for
/// `/healthz` meanwhile.
async fn families(state: &Arc<HttpState>, port: Port, format: Format) -> Option<Bytes> {
    let asked = Instant::now();
    let reports = *state.pipeline.subscribe().borrow();
    let exposition = &state.exposition;
    if let Some(families) = exposition.shared_families(format, reports, asked) {
        return Some(families);
    }
    let _slot = exposition.render_slot(port).await;
    // The scrapes that waited for the slot take the families rendered meanwhile.
    if let Some(families) = exposition.shared_families(format, reports, asked) {
        return Some(families);
    }
    let state = state.clone();
    tokio::task::spawn_blocking(move || state.exposition.render_families(format, reports)).await.ok()?.ok()
}

/// A page sent as its parts, neither copied: hyper queues each as it is.
struct Page {
    parts: [Bytes; 2],
}

impl hyper::body::Body for Page {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        // hyper wants no empty frame.
        let next = self.parts.iter_mut().find(|part| !part.is_empty()).map(std::mem::take);
        std::task::Poll::Ready(next.map(|part| Ok(hyper::body::Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.iter().all(Bytes::is_empty)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.parts.iter().map(|part| part.len() as u64).sum())
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

#[cfg(test)]
mod tests;
