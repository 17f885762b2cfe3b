//! The HTTP server of both binaries: their axum routers served over HTTP/1.1 with the
//! limits `axum::serve` lacks.
//!
//! - **Header timeout.** A connection must deliver a complete request head within
//!   [`Limits::header_timeout`] of opening, and again of each response sent: hyper arms
//!   its header timer whenever a connection waits for a request, so the same limit closes
//!   half-sent requests and idle keep-alive connections.
//! - **Connection cap.** Each connection holds one of [`Limits::max_connections`] permits;
//!   at the cap a new connection gets a best-effort 503 and is closed at once (counted),
//!   so that memory and file descriptors stay bounded whatever clients do.
//! - **Request heads** are read into a buffer of at most [`MAX_HEAD_BYTES`]; a longer head
//!   is answered 431 (the endpoints need a few hundred bytes).
//!
//! Each binary registers the [`ConnectionMetrics`] under its own prefix.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ratelimit::{Decision, RateLimit};

/// Largest request head read (hyper's smallest read buffer is 8 KiB).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// At most one log line per this interval for each kind of repeated event (refusals,
/// timeouts, accept errors), carrying how many it stands for.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Time connections get to finish their request on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Sent to a connection refused at the cap, without reading its request.
const REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n";

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a complete request head, from the connection's start or the end of
    /// its previous response.
    pub header_timeout: Duration,
    /// Connections served at once; more are refused.
    pub max_connections: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `header`: no complete request ever arrived (slow, half-sent or silent clients);
    /// `idle`: a kept-alive connection sent no next request.
    pub phase: &'static str,
}

/// The server's metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub accepted: Counter,
    pub refused: Counter,
    pub timed_out: Family<PhaseLabel, Counter>,
}

impl ConnectionMetrics {
    /// Registers the metrics as `<prefix>_connections`, `<prefix>_connections_accepted`,
    /// `_refused` and `_timed_out` (counters get `_total`).
    pub fn register(registry: &mut Registry, prefix: &str) -> Self {
        let metrics = ConnectionMetrics::default();
        let registry = registry.sub_registry_with_prefix(prefix);
        registry.register("connections", "HTTP connections open", metrics.open.clone());
        registry.register("connections_accepted", "HTTP connections accepted", metrics.accepted.clone());
        registry.register(
            "connections_refused",
            "HTTP connections refused because the connection cap was reached",
            metrics.refused.clone(),
        );
        registry.register(
            "connections_timed_out",
            "HTTP connections closed for want of a complete request head in time, by phase (header: no request \
             arrived; idle: no next request on a kept-alive connection)",
            metrics.timed_out.clone(),
        );
        metrics
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then gives the open
/// connections up to [`SHUTDOWN_GRACE`] to finish their request.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections as usize));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEAD_BYTES);
    let timeouts = Arc::new(Mutex::new(log_limit()));
    let mut refusals = log_limit();
    let mut accept_errors = log_limit();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if let Some(count) = logged(&mut accept_errors) {
                        warn!(error = %e, count, "accepting HTTP connections fails");
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.refused.inc();
            // A fresh socket's send buffer is empty: this never blocks.
            let _ = stream.try_write(REFUSAL);
            drop(stream);
            if let Some(count) = logged(&mut refusals) {
                warn!(
                    max_connections = limits.max_connections,
                    count, "HTTP connection cap reached: connections refused"
                );
            }
            continue;
        };
        metrics.accepted.inc();
        metrics.open.inc();
        let served = Arc::new(AtomicBool::new(false));
        let service = {
            let served = served.clone();
            let router = TowerToHyperService::new(router.clone());
            hyper::service::service_fn(move |request| {
                served.store(true, Ordering::Relaxed);
                hyper::service::Service::call(&router, request)
            })
        };
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let (metrics, shutdown, timeouts) = (metrics.clone(), shutdown.clone(), timeouts.clone());
        tokio::spawn(async move {
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            record_end(result, served.load(Ordering::Relaxed), &metrics, &timeouts);
            metrics.open.dec();
            drop(permit);
        });
    }
    drop(listener);
    // Every permit back means every connection has ended.
    if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(limits.max_connections)).await.is_err() {
        warn!("HTTP connections still open after the shutdown grace period");
    }
}

/// Counts (and logs, throttled) how a connection ended; `served`: whether it delivered
/// at least one request.
fn record_end(
    result: Result<(), hyper::Error>,
    served: bool,
    metrics: &ConnectionMetrics,
    timeouts: &Mutex<RateLimit>,
) {
    match result {
        Err(e) if e.is_timeout() => {
            let phase = if served { "idle" } else { "header" };
            metrics.timed_out.get_or_create(&PhaseLabel { phase }).inc();
            // Kept-alive connections end this way routinely; the others are worth a line.
            if phase == "header" {
                if let Some(count) = timeouts.lock().ok().and_then(|mut t| logged(&mut t)) {
                    info!(count, "closed HTTP connections that sent no complete request in time");
                }
            }
        }
        Err(e) => debug!(error = %e, "HTTP connection ended with an error"),
        Ok(()) => {}
    }
}

/// One log line per [`LOG_EVERY`] for each kind of repeated event.
fn log_limit() -> RateLimit {
    RateLimit::new(1, LOG_EVERY)
}

/// Records an event; `Some(events it stands for)` when a line is due.
fn logged(limit: &mut RateLimit) -> Option<u64> {
    match limit.check() {
        Decision::Allow { suppressed_before } => Some(suppressed_before + 1),
        Decision::Suppress => None,
    }
}
