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
//! - **Write timeout.** A response must be written whole within [`Limits::write_timeout`]
//!   of its first byte ([`io`]): a client that asks and never reads is closed, and its
//!   response freed. Together with the header timeout (which also closes a kept-alive
//!   connection that sends no next request: the idle timeout) no phase of a connection
//!   waits on its client without a bound.
//! - **Unsent bytes.** The responses produced and not yet written, over every connection
//!   of every port, stay within [`Limits::max_unsent_bytes`], each peer's within
//!   [`Limits::max_unsent_bytes_per_peer`] ([`unsent`]): when one does not fit, the
//!   connections whose responses wait unread the longest, of the peer holding the most,
//!   are closed to make room, and a new connection at a cap takes the seat of one such.
//!   A client that does not read exhausts its share for itself, not for the scrapers,
//!   even one behind the same address. hyper takes a connection's next request only once
//!   its last response is written, so pipelining does not multiply what is held.
//! - **Send buffers.** The kernel's send buffer of each connection is capped at
//!   [`Limits::send_buffer_bytes`]: left to itself, Linux grows the buffer of a client
//!   that does not read to 4 MiB, memory charged to the process's cgroup.
//!
//! Each request carries its [`Port`] (an extension), so that a route can keep its work
//! apart per port (the agent's render slots). Each binary registers the
//! [`ConnectionMetrics`] under its own prefix.

pub mod connection;
mod io;
pub mod peers;
pub mod unsent;

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use hyper::{body::Body as _, server::conn::http1};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::{
    connection::{Connection, Seat},
    io::Watched,
    peers::{peer_key, Peers},
    unsent::{Unsent, UnsentLimits},
};

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

/// The ports a binary serves; each request carries its own as an extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Port {
    /// `/metrics`, and the probes unless they have a port of their own.
    Main,
    /// `/healthz` and `/readyz` alone.
    Probes,
    /// The token-free `/metrics`.
    Tokenless,
}

impl Port {
    /// Its `port` label.
    pub fn name(self) -> &'static str {
        match self {
            Port::Main => "main",
            Port::Probes => "probes",
            Port::Tokenless => "tokenless",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a complete request head, from the connection's start or the end of
    /// its previous response.
    pub header_timeout: Duration,
    /// Time to write a response whole, from its first byte.
    pub write_timeout: Duration,
    /// Connections served at once; more are refused.
    pub max_connections: u32,
    /// Connections served at once from one peer ([`peers::peer_key`]); more are refused.
    pub max_connections_per_peer: u32,
    /// Bytes of responses produced and not yet written, over every connection of every
    /// port ([`unsent`]).
    pub max_unsent_bytes: u64,
    /// The same, over the connections of one peer.
    pub max_unsent_bytes_per_peer: u64,
    /// The kernel's send buffer of each connection (`SO_SNDBUF`): what it holds of a
    /// response its client does not read.
    pub send_buffer_bytes: usize,
}

impl Limits {
    /// The probe port's: its own permits (as many), and at most
    /// [`PROBE_MAX_CONNECTIONS_PER_PEER`] per peer.
    pub fn for_probes(self) -> Limits {
        Limits { max_connections_per_peer: self.max_connections_per_peer.min(PROBE_MAX_CONNECTIONS_PER_PEER), ..self }
    }

    fn unsent(self) -> UnsentLimits {
        UnsentLimits { max_bytes: self.max_unsent_bytes, max_bytes_per_peer: self.max_unsent_bytes_per_peer }
    }
}

/// A refused connection or response, or one closed to make room for another: `port`
/// ([`Port::name`]) and `reason` (`connection_cap`: the port's cap; `peer_cap`: the peer's
/// share; `unsent_bytes`, `peer_unsent_bytes`: the budget of unsent bytes, or the peer's
/// share of it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub port: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `header`: no complete request ever arrived (slow, half-sent or silent clients);
    /// `idle`: a kept-alive connection sent no next request; `write`: the client did not
    /// read a response within the write timeout.
    pub phase: &'static str,
}

/// The server's metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub accepted: Counter,
    pub refused: Family<RefusalLabels, Counter>,
    pub timed_out: Family<PhaseLabel, Counter>,
    pub evicted: Family<RefusalLabels, Counter>,
    pub unsent_bytes: Gauge,
    pub responses_refused: Family<RefusalLabels, Counter>,
    pub tls_handshake_failures: Family<ReasonLabel, Counter>,
    pub tls_reloads: Family<ResultLabel, Counter>,
    pub auth: AuthMetrics,
}

impl ConnectionMetrics {
    /// Registers the metrics as `<prefix>_connections`, `<prefix>_connections_accepted`,
    /// `_refused`, `_timed_out` and `_evicted`, `<prefix>_unsent_bytes`,
    /// `<prefix>_responses_refused`, `<prefix>_tls_handshake_failures`,
    /// `<prefix>_tls_certificate_reloads` and the token checks' `<prefix>_auth_*`
    /// (counters get `_total`).
    pub fn register(registry: &mut Registry, prefix: &str) -> Self {
        let mut metrics = ConnectionMetrics::default();
        let registry = registry.sub_registry_with_prefix(prefix);
        registry.register("connections", "HTTP connections open", metrics.open.clone());
        registry.register("connections_accepted", "HTTP connections accepted", metrics.accepted.clone());
        registry.register(
            "connections_refused",
            "HTTP connections refused, by port (main, probes, tokenless) and reason (connection_cap: the port's cap \
             was reached; peer_cap: the source address held its share)",
            metrics.refused.clone(),
        );
        registry.register(
            "connections_timed_out",
            "HTTP connections closed for want of a complete request head in time, by phase (header: no request \
             arrived; idle: no next request on a kept-alive connection), or of a response read in time (write)",
            metrics.timed_out.clone(),
        );
        registry.register(
            "connections_evicted",
            "HTTP connections closed while a response of theirs waited unread, to make room for another, by port and \
             reason (unsent_bytes, peer_unsent_bytes: a response did not fit in the unsent bytes' budget or its \
             peer's share; connection_cap, peer_cap: a new connection found every seat taken)",
            metrics.evicted.clone(),
        );
        registry.register(
            "unsent_bytes",
            "Bytes of HTTP responses produced and not yet written, over every connection (a shared page counted for \
             each)",
            metrics.unsent_bytes.clone(),
        );
        registry.register(
            "responses_refused",
            "HTTP responses replaced by a 503 because they alone were over the unsent bytes' budget, by port and \
             reason (unsent_bytes)",
            metrics.responses_refused.clone(),
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
    let limits = settings.limits;
    // One budget of unsent bytes for every port: it bounds the process's memory.
    let unsent = Unsent::new(limits.unsent(), metrics.clone());
    let server =
        |port, limits, tls| Arc::new(Server { port, limits, tls, metrics: metrics.clone(), unsent: unsent.clone() });
    let tls = match &settings.tls {
        Some(files) => Some(load_tls(files, "the metrics port", &metrics, &shutdown).await?),
        None => None,
    };
    let tokenless = match &settings.tokenless {
        Some((addr, files)) => {
            let tls = load_tls(files, "the token-free metrics port", &metrics, &shutdown).await?;
            info!(listen = %addr, "serving /metrics without token checks over HTTPS: the network decides who reaches it");
            let server = server(Port::Tokenless, limits, Some(tls));
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
    let main = tokio::spawn(server(Port::Main, limits, tls).serve(listener, main, shutdown.clone()));
    let probes = probe_listener
        .map(|l| tokio::spawn(server(Port::Probes, limits.for_probes(), None).serve(l, routes.probes, shutdown)));
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

/// One port's server: its name in the refusal counts, limits, TLS, metrics, and the
/// budget of unsent bytes it shares with the other ports.
struct Server {
    port: Port,
    limits: Limits,
    tls: Option<Tls>,
    metrics: ConnectionMetrics,
    unsent: Arc<Unsent>,
}

/// What a server's connections share.
struct Shared {
    router: axum::Router,
    http: http1::Builder,
    logs: Logs,
    shutdown: CancellationToken,
}

impl Server {
    /// Serves `router` on `listener` until `shutdown` is cancelled, then gives the open
    /// connections up to [`SHUTDOWN_GRACE`] to finish their request.
    async fn serve(self: Arc<Self>, listener: TcpListener, router: axum::Router, shutdown: CancellationToken) {
        let limits = self.limits;
        let permits = Arc::new(Semaphore::new(limits.max_connections as usize));
        let peers = Peers::new(limits.max_connections_per_peer);
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEAD_BYTES);
        let logs = Logs { timeouts: Mutex::new(log_limit()), handshakes: Mutex::new(log_limit()) };
        let shared = Arc::new(Shared { router, http, logs, shutdown: shutdown.clone() });
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
            let seat = match self.seat(&peers, &permits, peer.ip()) {
                Ok(seat) => seat,
                Err(reason) => {
                    self.refuse(stream, peer.ip(), reason, &mut refusals);
                    continue;
                }
            };
            self.metrics.accepted.inc();
            self.metrics.open.inc();
            self.bound_send_buffer(&stream);
            let connection = Connection::new(self.port, peer.ip(), seat);
            tokio::spawn(self.clone().serve_connection(stream, peer, connection, shared.clone()));
        }
        drop(listener);
        // Every permit back means every connection has ended.
        if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(limits.max_connections)).await.is_err() {
            warn!(port = self.port.name(), "HTTP connections still open after the shutdown grace period");
        }
    }

    /// A seat for a connection from `ip`: a slot of its peer's share and a permit of the
    /// port, or, where either is taken to the last, that of a connection whose response
    /// waits unread ([`Unsent::displace`]). Else the refusal's reason.
    fn seat(&self, peers: &Arc<Peers>, permits: &Arc<Semaphore>, ip: IpAddr) -> Result<Seat, &'static str> {
        // The peer's share first: a peer at its limit must not take the port's last permits.
        let Some(slot) = peers.try_take(ip) else {
            return self.unsent.displace(self.port, Some(peer_key(ip))).ok_or("peer_cap");
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(Seat { permit, slot }),
            Err(_) => match self.unsent.displace(self.port, None) {
                // The displaced connection's peer slot goes back; this peer's is taken.
                Some(displaced) => Ok(Seat { permit: displaced.permit, slot }),
                None => Err("connection_cap"),
            },
        }
    }

    /// Caps the kernel's send buffer of `stream` at [`Limits::send_buffer_bytes`]: left
    /// to itself, Linux grows the buffer of a client that does not read up to
    /// `net.ipv4.tcp_wmem`'s maximum (4 MiB by default), memory charged to the process's
    /// cgroup and beyond the budget of unsent bytes.
    fn bound_send_buffer(&self, stream: &TcpStream) {
        if let Err(e) = socket2::SockRef::from(stream).set_send_buffer_size(self.limits.send_buffer_bytes) {
            debug!(error = %e, "could not set a connection's send buffer");
        }
    }

    /// Answers a refused connection a best-effort 503 and closes it; counted, logged
    /// (throttled).
    fn refuse(&self, stream: TcpStream, peer: IpAddr, reason: &'static str, log: &mut RateLimit) {
        let port = self.port.name();
        self.metrics.refused.get_or_create(&RefusalLabels { port, reason }).inc();
        // A fresh socket's send buffer is empty: this never blocks (on a TLS port the
        // client reads it as a failed handshake, which is a refusal too).
        let _ = stream.try_write(REFUSAL);
        drop(stream);
        if let Some(count) = logged(log) {
            let limits = self.limits;
            warn!(
                port,
                reason,
                %peer,
                max_connections = limits.max_connections,
                max_connections_per_peer = limits.max_connections_per_peer,
                count,
                "HTTP connections refused (the peer is the latest one)"
            );
        }
    }

    /// Serves one connection (after its TLS handshake, on a TLS port) until it ends, then
    /// counts how and gives its seat back.
    async fn serve_connection(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        connection: Arc<Connection>,
        shared: Arc<Shared>,
    ) {
        let ended = match self.tls.as_ref().map(Tls::acceptor) {
            None => Some(self.drive(stream, peer, &connection, &shared).await),
            Some(acceptor) => {
                let handshake = tokio::time::timeout(self.limits.header_timeout, acceptor.accept(stream));
                let stream = tokio::select! {
                    done = handshake => handshake_result(done, &self.metrics, &shared.logs),
                    _ = shared.shutdown.cancelled() => None,
                    _ = connection.closing() => None,
                };
                match stream {
                    Some(stream) => Some(self.drive(stream, peer, &connection, &shared).await),
                    None => None,
                }
            }
        };
        if let Some(ended) = ended {
            record_end(ended, &connection, &self.metrics, &shared.logs.timeouts);
        }
        self.unsent.release(connection.id());
        self.metrics.open.dec();
        drop(connection.take_seat());
    }

    /// Serves HTTP/1.1 on `stream` until the connection ends, is closed for room, or
    /// finishes its request on shutdown. Each request carries its peer (the token checks'
    /// per-peer budget, as axum's `ConnectInfo`) and its [`Port`]; each response is
    /// counted as unsent until written ([`Unsent::charge`]).
    async fn drive<S>(&self, stream: S, peer: SocketAddr, connection: &Arc<Connection>, shared: &Shared) -> Ended
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let stream = Watched::new(stream, connection.clone(), self.unsent.clone(), self.limits.write_timeout);
        let service = {
            let (connection, unsent, port) = (connection.clone(), self.unsent.clone(), self.port);
            let router = TowerToHyperService::new(shared.router.clone());
            hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                connection.mark_served();
                request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                request.extensions_mut().insert(port);
                let response = hyper::service::Service::call(&router, request);
                let (connection, unsent) = (connection.clone(), unsent.clone());
                async move {
                    let response = response.await?;
                    Ok::<_, Infallible>(counted_as_unsent(response, &connection, &unsent))
                }
            })
        };
        let served = shared.http.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(served);
        tokio::select! {
            result = served.as_mut() => return Ended::Done(result),
            _ = connection.closing() => return Ended::Evicted,
            _ = shared.shutdown.cancelled() => served.as_mut().graceful_shutdown(),
        }
        tokio::select! {
            result = served => Ended::Done(result),
            _ = connection.closing() => Ended::Evicted,
        }
    }
}

/// `response` once counted in the budget of unsent bytes, or a 503 in its place when it
/// alone is over the budget (the connection closes after it).
fn counted_as_unsent(
    response: hyper::Response<axum::body::Body>,
    connection: &Arc<Connection>,
    unsent: &Unsent,
) -> hyper::Response<axum::body::Body> {
    let size = response.body().size_hint();
    if unsent.charge(connection, size.exact().unwrap_or(size.lower())) {
        return response;
    }
    let mut refusal = hyper::Response::new(axum::body::Body::from("response too large for --http-max-unsent-bytes\n"));
    *refusal.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
    refusal.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    refusal
}

/// How a connection's HTTP ended.
enum Ended {
    /// hyper's end of it.
    Done(Result<(), hyper::Error>),
    /// Closed to make room for another ([`Unsent`]; counted there).
    Evicted,
}

/// The log limits shared by a server's connections.
struct Logs {
    timeouts: Mutex<RateLimit>,
    handshakes: Mutex<RateLimit>,
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

/// Counts (and logs, throttled) how a connection ended.
fn record_end(ended: Ended, connection: &Connection, metrics: &ConnectionMetrics, timeouts: &Mutex<RateLimit>) {
    let phase = match ended {
        Ended::Evicted | Ended::Done(Ok(())) => return,
        Ended::Done(Err(_)) if connection.write_timed_out() => "write",
        Ended::Done(Err(e)) if e.is_timeout() => {
            if connection.served() {
                "idle"
            } else {
                "header"
            }
        }
        Ended::Done(Err(e)) => {
            debug!(error = %e, "HTTP connection ended with an error");
            return;
        }
    };
    metrics.timed_out.get_or_create(&PhaseLabel { phase }).inc();
    // Kept-alive connections end this way routinely; the others are worth a line.
    if phase != "idle" {
        if let Some(count) = timeouts.lock().ok().and_then(|mut t| logged(&mut t)) {
            info!(
                phase,
                port = connection.port().name(),
                count,
                "closed HTTP connections that sent no complete request, or read no response, in time"
            );
        }
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
