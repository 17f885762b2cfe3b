//! OTLP: one sink per route that has an `otlp` spec (one per NeuronMonitorConfig),
//! sending OpenTelemetry metrics over OTLP/HTTP (protobuf, gzip) to CloudWatch's OTLP
//! endpoint (SigV4) or to any OTLP receiver (with the headers of the config's Secret).
//!
//! What a sink sends is what `/metrics` would show of its scope, with the same names and
//! labels ([`Scope::Route`]: a team's config its namespace's applications, the operator
//! namespace's config everything, node-level and health series included), so PromQL
//! written for the scraped series works on what the receiver stores.
//!
//! Data flows: every `flushInterval` (the first at a random point of the first interval,
//! so that sinks started together across a fleet stay spread) a snapshot of the scope is
//! encoded ([`encode`]: families → resources), cut into requests within the receiver's
//! limits and compressed ([`request`]) on the blocking pool, and queued; a task per sink
//! sends the queue ([`send`]) with retries. The queue is bounded in data points, the
//! oldest requests making room for the newest (counted). Sinks follow the routing table:
//! a route that appears starts a sink, one that changes or goes away is flushed and
//! stopped. On shutdown every sink takes a last snapshot and sends its queue within
//! `--otlp-shutdown-timeout`.

pub mod encode;
pub mod headers;
pub mod request;
pub mod send;
pub mod telemetry;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use api::{
    node_config::Route,
    otlp::{cloudwatch_endpoint, headers_key, Destination, Endpoint, OtlpSettings},
    region::{same_partition, valid_region},
};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    encode::{node_resource, Identity, OtlpEncoder, StartTimes},
    headers::MirroredHeaders,
    request::{split, Request, MAX_POINTS_PER_REQUEST, MAX_REQUEST_BYTES},
    send::{Auth, CredentialCache, HttpClient, Target},
    telemetry::{OtlpMetrics, SinkLabel},
};
use crate::{
    delivery::{aws::sdk_config, backoff::Backoff, queue},
    efa::EfaSource,
    gpu::GpuSource,
    health::metrics::HealthCollector,
    processes::SharedProcesses,
    routing::{Routing, Selection, SharedRouting},
    series::{FamilyEncoder, Scope},
    sinks::{
        common::{stop_unwanted, SinkQueueMetrics},
        prometheus::encode_node,
    },
    state::NodeState,
};

/// The agent-wide settings of every sink.
#[derive(Clone, Debug)]
pub struct Options {
    pub identity: Identity,
    /// Data points a sink keeps waiting at most.
    pub queue_points: usize,
    pub backoff: Backoff,
    /// Time limit of one request (sending it and reading the answer).
    pub request_timeout: Duration,
    /// Time the last snapshot and the queue get on shutdown.
    pub shutdown_timeout: Duration,
    /// Where the sinks without `endpoint` send instead of CloudWatch's OTLP endpoint of
    /// their region (a FIPS or private endpoint; tests). Still signed for the region.
    pub cloudwatch_endpoint: Option<Endpoint>,
    /// When the agent started: the start time of the counters it counted before a sink's
    /// first snapshot.
    pub agent_started: SystemTime,
}

/// The requests of one sink waiting to be sent, weighed in data points.
pub type Queue = queue::Queue<Request, SinkQueueMetrics>;

/// What a sink's snapshots read: the node's telemetry, shared by every sink.
#[derive(Clone)]
pub struct Sources {
    pub state: Arc<Mutex<NodeState>>,
    pub processes: SharedProcesses,
    /// The EFA devices' counters.
    pub efa: EfaSource,
    /// The GPUs, on a node with an NVIDIA driver.
    pub gpu: Option<GpuSource>,
    /// The health families, sent by the sinks of the operator's namespace.
    pub health: Option<Arc<HealthCollector>>,
}

/// One sink: its scope, the start times of its counters, its queue.
struct Sink {
    name: String,
    route: Route,
    selection: Selection,
    settings: OtlpSettings,
    sources: Sources,
    identity: Identity,
    starts: Mutex<StartTimes>,
    queue: Arc<Queue>,
    metrics: OtlpMetrics,
    /// The instance's region, from the reports (for CloudWatch's endpoint without `region`).
    region: Mutex<Option<String>>,
    /// Why it cannot send, once found (kept in `invalid_sinks` across route changes).
    unusable: Mutex<Option<&'static str>>,
}

impl Sink {
    /// A snapshot of the sink's scope as compressed requests (on the blocking pool: it
    /// holds the state's lock as a scrape does, and compresses).
    fn snapshot(&self) -> Vec<Request> {
        let now = SystemTime::now();
        let scope = Scope::Route(&self.route, &self.selection);
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        let (resources, dropped) = {
            let state = self.sources.state.lock().unwrap_or_else(|p| p.into_inner());
            // Before the first report the node is not known (no instance, no series): the
            // resource could not name it. A node with GPUs and no Neuron device has no
            // report: its first GPU collection is what there is to send.
            if state.reports == 0 && !self.sources.gpu.as_ref().is_some_and(GpuSource::collected) {
                return Vec::new();
            }
            // Taken after the state's lock, never the other way (as the exposition does).
            let processes = self.sources.processes.lock().unwrap_or_else(|p| p.into_inner());
            if !state.instance.region.is_empty() {
                *self.region.lock().unwrap_or_else(|p| p.into_inner()) = Some(state.instance.region.clone());
            }
            let node = node_resource(&self.identity, &state.instance);
            let instance = state.instance.clone();
            let mut encoder = OtlpEncoder::new(now, node.len(), &mut starts);
            // Writing into vectors cannot fail.
            let _ = encode_node(&state, &processes, scope, &mut encoder);
            drop(processes);
            drop(state);
            let _ = self.sources.efa.encode(&instance, scope, &mut encoder);
            if let Some(gpu) = &self.sources.gpu {
                let _ = gpu.encode(&instance, scope, &mut encoder);
            }
            // The health collector takes the state's lock itself.
            if let Some(health) = self.sources.health.as_ref().filter(|_| scope.node_level()) {
                let _ = health.encode_into(&mut encoder as &mut dyn FamilyEncoder);
            }
            let dropped = encoder.attributes_dropped;
            (encoder.finish(node), dropped)
        };
        drop(starts);
        if dropped > 0 {
            self.metrics.attributes_dropped.get_or_create(&SinkLabel { sink: self.name.clone() }).inc_by(dropped);
        }
        split(resources, MAX_POINTS_PER_REQUEST, MAX_REQUEST_BYTES)
            .iter()
            .filter_map(|r| match Request::encode(r) {
                Ok(request) => Some(request),
                Err(e) => {
                    warn!(sink = %self.name, error = %e, "an OTLP request could not be compressed; left out");
                    None
                }
            })
            .collect()
    }
}

struct Running {
    route: Route,
    sink: Arc<Sink>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Every OTLP sink of the node.
pub struct Sinks {
    pub sources: Sources,
    pub routing: SharedRouting,
    /// Bumped after each report and each GPU collection: the sinks follow the routing
    /// then.
    pub reports: watch::Receiver<u64>,
    /// The mirrored headers; `None` without Kubernetes (a sink that needs headers cannot send).
    pub headers: Option<watch::Receiver<MirroredHeaders>>,
    pub options: Options,
    pub metrics: OtlpMetrics,
}

/// What every sink's sender shares.
#[derive(Clone)]
struct Senders {
    client: Option<HttpClient>,
    /// CA certificates were found (https can be verified).
    tls: bool,
    headers: Option<watch::Receiver<MirroredHeaders>>,
    options: Options,
    metrics: OtlpMetrics,
}

impl Sinks {
    /// Runs until `shutdown`, then flushes every sink (bounded by the shutdown timeout).
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Made when the first sink starts: a node without one never loads the CA
        // certificates nor the TLS code.
        let mut senders: Option<Senders> = None;
        let mut running: Vec<Running> = Vec::new();
        let mut in_force: Option<Arc<Routing>> = None;
        loop {
            let routing = self.routing.current();
            if !in_force.as_ref().is_some_and(|r| Arc::ptr_eq(r, &routing)) {
                self.reconcile(&routing, &mut running, &mut senders);
                in_force = Some(routing);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = self.reports.changed() => if changed.is_err() { break },
            }
        }
        info!(sinks = running.len(), "flushing the OTLP sinks");
        futures::future::join_all(running.into_iter().map(stop)).await;
    }

    /// What every sender shares: the HTTP client (the system's CA certificates loaded),
    /// the mirrored headers, the options.
    fn senders(&self) -> Senders {
        let (client, tls) = match send::http_client() {
            Ok((client, tls)) => (Some(client), tls),
            Err(e) => {
                warn!(error = %e, "no TLS configuration: OTLP sinks cannot send");
                (None, false)
            }
        };
        Senders {
            client,
            tls,
            headers: self.headers.clone(),
            options: self.options.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Starts the sinks of new or changed routes (with `senders`, made for the first),
    /// stops those of routes that went away.
    fn reconcile(&self, routing: &Routing, running: &mut Vec<Running>, senders: &mut Option<Senders>) {
        let wanted: Vec<(&Route, &Selection)> = routing.otlp_routes().collect();
        stop_unwanted(running, &wanted, |r| &r.route, stop);
        self.metrics.common.invalid.clear();
        for sink in running.iter() {
            if let Some(reason) = *sink.sink.unusable.lock().unwrap_or_else(|p| p.into_inner()) {
                self.metrics.common.set_invalid(&sink.sink.name, reason, true);
            }
        }
        for (route, selection) in wanted {
            if running.iter().any(|r| r.route == *route) {
                continue;
            }
            let Some(spec) = &route.otlp else { continue };
            let settings = match OtlpSettings::check(spec) {
                Ok(s) => s,
                Err(e) => {
                    self.metrics.common.set_invalid(&route.config, e.field, true);
                    warn!(sink = %route.config, error = %e, "OTLP sink left out: invalid settings");
                    continue;
                }
            };
            let senders = senders.get_or_insert_with(|| self.senders());
            running.push(self.start(route, selection, settings, senders));
        }
    }

    fn start(&self, route: &Route, selection: &Selection, settings: OtlpSettings, senders: &Senders) -> Running {
        let name = route.config.clone();
        let queue_metrics = self.metrics.common.queue_metrics(&name);
        let queue = Arc::new(Queue::weighted(self.options.queue_points, queue_metrics, |r: &Request| r.points));
        let sink = Arc::new(Sink {
            name: name.clone(),
            route: route.clone(),
            selection: selection.clone(),
            settings,
            sources: self.sources.clone(),
            identity: self.options.identity.clone(),
            starts: Mutex::new(StartTimes::new(self.options.agent_started)),
            queue,
            metrics: self.metrics.clone(),
            region: Mutex::new(None),
            unusable: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        info!(sink = %name, destination = ?sink.settings.destination, flush_interval = ?sink.settings.flush_interval,
              "starting OTLP sink");
        let task = tokio::spawn(run_sink(sink.clone(), senders.clone(), stop.clone()));
        Running { route: route.clone(), sink, stop, task }
    }
}

async fn stop(sink: Running) {
    sink.stop.cancel();
    if let Err(e) = sink.task.await {
        warn!(sink = %sink.sink.name, error = %e, "OTLP sink task failed");
    }
}

/// Takes a snapshot into the queue.
async fn flush(sink: &Arc<Sink>) {
    let taken = sink.clone();
    match tokio::task::spawn_blocking(move || taken.snapshot()).await {
        Ok(requests) => {
            sink.metrics.common.flushes.get_or_create(&SinkLabel { sink: sink.name.clone() }).inc();
            sink.queue.push(requests);
        }
        Err(e) => warn!(sink = %sink.name, error = %e, "OTLP snapshot failed"),
    }
}

/// When a sink first flushes: a random point of its first interval (then every interval).
fn first_flush(interval: Duration, rng: &mut fastrand::Rng) -> Duration {
    interval.mul_f64(1.0 - rng.f64())
}

/// Whether a sink sends.
enum Sending {
    /// Not yet: CloudWatch's endpoint of a region the reports have not named yet.
    Waiting,
    Started(JoinHandle<()>),
    /// Never (counted in `invalid_sinks`, logged once): it takes no more snapshots.
    Unusable,
}

/// Flushes every interval; sends from a task of its own once the destination is known.
async fn run_sink(sink: Arc<Sink>, senders: Senders, stop: CancellationToken) {
    let interval = sink.settings.flush_interval;
    let first = first_flush(interval, &mut fastrand::Rng::new());
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop_sender = CancellationToken::new();
    let mut sending = Sending::Waiting;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if matches!(sending, Sending::Unusable) {
            continue;
        }
        flush(&sink).await;
        if matches!(sending, Sending::Waiting) {
            sending = start_sender(&sink, &senders, &stop_sender).await;
        }
    }
    if !matches!(sending, Sending::Unusable) {
        flush(&sink).await;
        if matches!(sending, Sending::Waiting) {
            sending = start_sender(&sink, &senders, &stop_sender).await;
        }
    }
    let limit = senders.options.shutdown_timeout;
    if matches!(sending, Sending::Started(_)) && tokio::time::timeout(limit, sink.queue.wait_drained()).await.is_err() {
        warn!(sink = %sink.name, points = sink.queue.len(), "OTLP queue not sent within the shutdown time limit");
    }
    stop_sender.cancel();
    if let Sending::Started(task) = sending {
        let _ = task.await;
    }
    sink.queue.abandon("shutdown");
}

/// Starts the sending task if the destination is known; an unusable sink is counted and
/// logged once, and its queue given up.
async fn start_sender(sink: &Arc<Sink>, senders: &Senders, stop: &CancellationToken) -> Sending {
    let unusable = |reason: &'static str, why: &str| {
        *sink.unusable.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        sink.metrics.common.set_invalid(&sink.name, reason, true);
        warn!(sink = %sink.name, reason, "OTLP sink cannot send: {why}");
        sink.queue.abandon("invalid");
        Sending::Unusable
    };
    let Some(client) = senders.client.clone() else {
        return unusable("tls", "the agent has no TLS configuration");
    };
    let (url, auth) = match &sink.settings.destination {
        Destination::Endpoint { endpoint, headers_secret } => {
            let auth = match (headers_secret, &senders.headers) {
                (None, _) => Auth::None,
                (Some(_), Some(mirror)) => Auth::Headers { key: headers_key(&sink.name), mirror: mirror.clone() },
                (Some(_), None) => {
                    return unusable("headers", "its headersSecret needs Kubernetes (the operator mirrors the Secret)")
                }
            };
            (endpoint.clone(), auth)
        }
        Destination::CloudWatch { region } => {
            // The instance's region even when the sink names its own: the node's AWS
            // identity and data stay in its partition (the operator's tenancy policy
            // refuses such a config; a node configuration may come from elsewhere).
            let Some(instance) = sink.region.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
                return Sending::Waiting;
            };
            let region = region.clone().unwrap_or_else(|| instance.clone());
            if !valid_region(&region) {
                return unusable("region", &format!("the instance's region {region:?} is not a region name"));
            }
            if !same_partition(&instance, &region) {
                let why = format!("its region {region:?} is in another AWS partition than the instance's ({instance})");
                return unusable("partition", &why);
            }
            let config = sdk_config(&region, senders.options.request_timeout).await;
            let Some(provider) = config.credentials_provider() else {
                return unusable("credentials", "no AWS credential provider");
            };
            let endpoint = senders.options.cloudwatch_endpoint.clone().unwrap_or_else(|| cloudwatch_endpoint(&region));
            (endpoint, Auth::SigV4 { region, credentials: CredentialCache::new(provider) })
        }
    };
    if url.https && !senders.tls {
        return unusable("tls", "https, and no CA certificates to verify the receiver");
    }
    let target = Target {
        sink: sink.name.clone(),
        url: url.url(),
        auth,
        client,
        backoff: senders.options.backoff,
        request_timeout: senders.options.request_timeout,
        metrics: senders.metrics.clone(),
    };
    Sending::Started(tokio::spawn(send::run_sender(sink.queue.clone(), target, stop.clone())))
}

#[cfg(test)]
mod tests;
