//! The HTTP server of both binaries: their axum routers served over HTTP/1.1 (plain, or
//! HTTPS with [`crate::tls`]) with the limits `axum::serve` lacks.
//!
//! - **Two ports, when asked.** The main port serves `/metrics` and the probes; with a
//!   probe port ([`Settings::probe_listen`]) that one serves `/healthz` and `/readyz`
//!   alone, in plain HTTP, for the kubelet, and `/metrics` stays behind HTTPS and the
//!   token checks ([`crate::auth`]) of the main port.
//! - **A token-free port, when asked** ([`Settings::tokenless`]): `/metrics` alone, over
//!   HTTPS with a certificate of its own and no token checks, for a scraper that sends no
//!   token (the CloudWatch Observability add-on); who reaches it is the network's to
//!   decide (the chart's NetworkPolicy).
//! - **TLS handshakes** run on the connection's own task, within the header timeout, and
//!   count against the connection cap like any connection; failures and timeouts are
//!   counted by reason.
//!
//! - **Header timeout.** A connection must deliver a complete request head within
//!   [`Limits::header_timeout`] of opening, and again of each response sent: hyper arms
//!   its header timer whenever a connection waits for a request, so the same limit closes
//!   half-sent requests and idle keep-alive connections.
//! - **Connection cap.** Each connection holds one of [`Limits::max_connections`] permits;
//!   at the cap a new connection gets a best-effort 503 and is closed at once (counted),
//!   so that memory and file descriptors stay bounded whatever clients do.
//! - **Per-peer cap.** One source address holds at most
//!   [`Limits::max_connections_per_peer`] of them ([`peers`]): a client that opens
//!   connections and never finishes them fills its own share, not the port. The probe
//!   port has its own permits and a small per-peer cap ([`Limits::for_probes`]), so
//!   neither the metrics port's clients nor one client of the probe port starve the
//!   kubelet. Refusals are counted by port and reason.
//! - **Request heads** are read into a buffer of at most [`MAX_HEAD_BYTES`]; a longer head
//!   is answered 431 (the endpoints need a few hundred bytes).
//!
//! Each binary registers the [`ConnectionMetrics`] under its own prefix.

pub mod peers;

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::Context;
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
use tokio::{net::TcpListener, sync::Semaphore, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::peers::Peers;

use crate::{
    auth::{self, AuthMetrics, MetricsAuth},
    labels::{ReasonLabel, ResultLabel},
    ratelimit::{Decision, RateLimit},
    tls::{CertificateFiles, Tls},
};

/// Largest request head read (hyper's smallest read buffer is 8 KiB).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// At most one log line per this interval for each kind of repeated event (refusals,
/// timeouts, accept errors), carrying how many it stands for.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Time connections get to finish their request on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Sent to a connection refused at the cap, without reading its request.
const REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n";

/// Connections one peer may hold on the probe port: the kubelet opens one per probe
/// (liveness, readiness, startup) and closes it.
pub const PROBE_MAX_CONNECTIONS_PER_PEER: u32 = 4;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a complete request head, from the connection's start or the end of
    /// its previous response.
    pub header_timeout: Duration,
    /// Connections served at once; more are refused.
    pub max_connections: u32,
    /// Connections served at once from one peer ([`peers::peer_key`]); more are refused.
    pub max_connections_per_peer: u32,
}

impl Limits {
    /// The probe port's: its own permits (as many), and at most
    /// [`PROBE_MAX_CONNECTIONS_PER_PEER`] per peer.
    pub fn for_probes(self) -> Limits {
        Limits { max_connections_per_peer: self.max_connections_per_peer.min(PROBE_MAX_CONNECTIONS_PER_PEER), ..self }
    }
}

/// A refused connection: `port` (`main`: /metrics and the probes unless they have a port
/// of their own; `probes`; `tokenless`: the token-free /metrics), `reason` (`connection_cap`: the port's cap; `peer_cap`: the
/// peer's share).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub port: &'static str,
    pub reason: &'static str,
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
    pub refused: Family<RefusalLabels, Counter>,
    pub timed_out: Family<PhaseLabel, Counter>,
    pub tls_handshake_failures: Family<ReasonLabel, Counter>,
    pub tls_reloads: Family<ResultLabel, Counter>,
    pub auth: AuthMetrics,
}

impl ConnectionMetrics {
    /// Registers the metrics as `<prefix>_connections`, `<prefix>_connections_accepted`,
    /// `_refused` and `_timed_out`, `<prefix>_tls_handshake_failures`,
    /// `<prefix>_tls_certificate_reloads` and the token checks' `<prefix>_auth_*`
    /// (counters get `_total`).
    pub fn register(registry: &mut Registry, prefix: &str) -> Self {
        let mut metrics = ConnectionMetrics::default();
        let registry = registry.sub_registry_with_prefix(prefix);
        registry.register("connections", "HTTP connections open", metrics.open.clone());
        registry.register("connections_accepted", "HTTP connections accepted", metrics.accepted.clone());
        registry.register(
            "connections_refused",
            "HTTP connections refused, by port (main, probes) and reason (connection_cap: the port's cap was reached; \
             peer_cap: the source address held its share)",
            metrics.refused.clone(),
        );
        registry.register(
            "connections_timed_out",
            "HTTP connections closed for want of a complete request head in time, by phase (header: no request \
             arrived; idle: no next request on a kept-alive connection)",
            metrics.timed_out.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed, by reason (timeout: not complete within the header timeout; error: any other)",
            metrics.tls_handshake_failures.clone(),
        );
        registry.register(
            "tls_certificate_reloads",
            "Changes of the TLS certificate files, by result (loaded; invalid: not a matching certificate and key, the \
             last good pair kept)",
            metrics.tls_reloads.clone(),
        );
        metrics.auth = AuthMetrics::register(registry);
        metrics
    }
}

/// Where and how a binary serves, from its flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The main port: `/metrics` and the probes.
    pub listen: SocketAddr,
    /// The probe port (`/healthz`, `/readyz` only, plain HTTP), if any.
    pub probe_listen: Option<SocketAddr>,
    /// HTTPS on the main port with this certificate.
    pub tls: Option<CertificateFiles>,
    /// The token-free port: `/metrics` over HTTPS with this certificate, no token checks.
    pub tokenless: Option<(SocketAddr, CertificateFiles)>,
    pub limits: Limits,
}

/// The routes of a binary: `metrics` (checked by `auth` when given) and `probes`.
pub struct Routes {
    pub metrics: axum::Router,
    pub probes: axum::Router,
}

/// Binds the ports of `settings` and serves `routes` on them until `shutdown`; with TLS,
/// keeps the certificate current. The handle ends when every server has stopped.
pub async fn start(
    settings: Settings,
    routes: Routes,
    auth: Option<MetricsAuth>,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let tls = match &settings.tls {
        Some(files) => Some(load_tls(files, "the metrics port", &metrics, &shutdown).await?),
        None => None,
    };
    let tokenless = match &settings.tokenless {
        Some((addr, files)) => {
            let tls = load_tls(files, "the token-free metrics port", &metrics, &shutdown).await?;
            info!(listen = %addr, "serving /metrics without token checks over HTTPS: the network decides who reaches it");
            let server =
                Server { port: "tokenless", limits: settings.limits, tls: Some(tls), metrics: metrics.clone() };
            Some(tokio::spawn(server.serve(bind(*addr).await?, routes.metrics.clone(), shutdown.clone())))
        }
        None => None,
    };
    let mut main = routes.metrics;
    if let Some(auth) = auth {
        main = main.route_layer(axum::middleware::from_fn_with_state(Arc::new(auth), auth::require));
    }
    let main = main.merge(routes.probes.clone());
    let listener = bind(settings.listen).await?;
    let probe_listener = match settings.probe_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    info!(
        listen = %listener.local_addr()?,
        scheme = if tls.is_some() { "https" } else { "http" },
        probes = %probe_listener.as_ref().and_then(|l| l.local_addr().ok()).map_or("the same port".to_owned(), |a| a.to_string()),
        "serving /metrics, /healthz and /readyz"
    );
    let limits = settings.limits;
    let main = tokio::spawn(Server { port: "main", limits, tls, metrics: metrics.clone() }.serve(
        listener,
        main,
        shutdown.clone(),
    ));
    let probes = probe_listener.map(|l| {
        let server = Server { port: "probes", limits: limits.for_probes(), tls: None, metrics };
        tokio::spawn(server.serve(l, routes.probes, shutdown))
    });
    Ok(tokio::spawn(async move {
        for server in std::iter::once(main).chain(probes).chain(tokenless) {
            if let Err(e) = server.await {
                warn!(error = %e, "an HTTP server task failed");
            }
        }
    }))
}

/// The certificate of `what`, kept current until `shutdown`.
async fn load_tls(
    files: &CertificateFiles,
    what: &str,
    metrics: &ConnectionMetrics,
    shutdown: &CancellationToken,
) -> anyhow::Result<Tls> {
    let tls = Tls::load(files.clone()).await.with_context(|| format!("loading the TLS certificate of {what}"))?;
    tokio::spawn(tls.clone().keep_current(metrics.tls_reloads.clone(), shutdown.clone()));
    Ok(tls)
}

async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))
}

/// One port's server: its name in the refusal counts, limits, TLS and metrics.
struct Server {
    port: &'static str,
    limits: Limits,
    tls: Option<Tls>,
    metrics: ConnectionMetrics,
}

impl Server {
    /// Serves `router` on `listener` until `shutdown` is cancelled, then gives the open
    /// connections up to [`SHUTDOWN_GRACE`] to finish their request.
    async fn serve(self, listener: TcpListener, router: axum::Router, shutdown: CancellationToken) {
        let limits = self.limits;
        let permits = Arc::new(Semaphore::new(limits.max_connections as usize));
        let peers = Peers::new(limits.max_connections_per_peer);
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEAD_BYTES);
        let logs = Arc::new(Logs { timeouts: Mutex::new(log_limit()), handshakes: Mutex::new(log_limit()) });
        let mut refusals = log_limit();
        let mut accept_errors = log_limit();
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        if let Some(count) = logged(&mut accept_errors) {
                            warn!(error = %e, count, "accepting HTTP connections fails");
                        }
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                },
            };
            // The peer's share first: a peer at its limit must not take the port's last permits.
            let slots = match peers.try_take(peer.ip()) {
                Some(slot) => {
                    permits.clone().try_acquire_owned().map(|permit| (slot, permit)).map_err(|_| "connection_cap")
                }
                None => Err("peer_cap"),
            };
            let (slot, permit) = match slots {
                Ok(slots) => slots,
                Err(reason) => {
                    self.refuse(stream, peer.ip(), reason, &mut refusals);
                    continue;
                }
            };
            self.metrics.accepted.inc();
            self.metrics.open.inc();
            let served = Arc::new(AtomicBool::new(false));
            let service = {
                let served = served.clone();
                let router = TowerToHyperService::new(router.clone());
                hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                    served.store(true, Ordering::Relaxed);
                    // Who asks, for the token checks' per-peer budget (axum's ConnectInfo).
                    request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                    hyper::service::Service::call(&router, request)
                })
            };
            let (http, acceptor) = (http.clone(), self.tls.as_ref().map(Tls::acceptor));
            let (metrics, shutdown, logs) = (self.metrics.clone(), shutdown.clone(), logs.clone());
            tokio::spawn(async move {
                let result = match acceptor {
                    None => Some(drive(http.serve_connection(TokioIo::new(stream), service), &shutdown).await),
                    Some(acceptor) => {
                        let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
                        let stream = tokio::select! {
                            done = handshake => handshake_result(done, &metrics, &logs),
                            _ = shutdown.cancelled() => None,
                        };
                        match stream {
                            Some(stream) => {
                                Some(drive(http.serve_connection(TokioIo::new(stream), service), &shutdown).await)
                            }
                            None => None,
                        }
                    }
                };
                if let Some(result) = result {
                    record_end(result, served.load(Ordering::Relaxed), &metrics, &logs.timeouts);
                }
                metrics.open.dec();
                drop((permit, slot));
            });
        }
        drop(listener);
        // Every permit back means every connection has ended.
        if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(limits.max_connections)).await.is_err() {
            warn!(port = self.port, "HTTP connections still open after the shutdown grace period");
        }
    }

    /// Answers a refused connection a best-effort 503 and closes it; counted, logged
    /// (throttled).
    fn refuse(&self, stream: tokio::net::TcpStream, peer: IpAddr, reason: &'static str, log: &mut RateLimit) {
        self.metrics.refused.get_or_create(&RefusalLabels { port: self.port, reason }).inc();
        // A fresh socket's send buffer is empty: this never blocks (on a TLS port the
        // client reads it as a failed handshake, which is a refusal too).
        let _ = stream.try_write(REFUSAL);
        drop(stream);
        if let Some(count) = logged(log) {
            let limits = self.limits;
            warn!(
                port = self.port,
                reason,
                %peer,
                max_connections = limits.max_connections,
                max_connections_per_peer = limits.max_connections_per_peer,
                count,
                "HTTP connections refused (the peer is the latest one)"
            );
        }
    }
}

/// The log limits shared by a server's connections.
struct Logs {
    timeouts: Mutex<RateLimit>,
    handshakes: Mutex<RateLimit>,
}

/// Serves one connection until it ends, or finishes its request on shutdown.
async fn drive<I, S, B>(connection: http1::Connection<I, S>, shutdown: &CancellationToken) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    }
}

/// The TLS stream of a finished handshake; a failed one is counted (and logged, throttled).
fn handshake_result<S>(
    done: Result<std::io::Result<S>, tokio::time::error::Elapsed>,
    metrics: &ConnectionMetrics,
    logs: &Logs,
) -> Option<S> {
    let (reason, error) = match done {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(e)) => ("error", e.to_string()),
        Err(_) => ("timeout", "no complete handshake within the header timeout".to_owned()),
    };
    metrics.tls_handshake_failures.get_or_create(&ReasonLabel { reason }).inc();
    if let Some(count) = logs.handshakes.lock().ok().and_then(|mut l| logged(&mut l)) {
        info!(reason, error, count, "TLS handshakes failed");
    } else {
        debug!(reason, error, "TLS handshake failed");
    }
    None
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
