//! CloudWatch: one sink per route that has a `cloudwatch` spec (one per
//! NeuronMonitorConfig), so each team gets its own CloudWatch namespace, dimensions and
//! bill.
//!
//! Data flows [`select`] (after each report, what the route sees of the node state →
//! samples) → [`datum`] (samples between two flushes → one datum per metric, cut into
//! requests) → [`publish`] (bounded queue → PutMetricData with retries). The report path
//! only bumps a `watch`; sampling runs on this module's task, which holds the state's lock
//! for the few microseconds a sample takes, and sending runs on a task per sink, so a
//! slow or failing CloudWatch never slows the reports, `/metrics` or the other sinks.
//!
//! Sinks follow the routing table: a route that appears starts a sink, one that changes
//! or goes away is flushed and stopped. On shutdown every sink flushes what it collected
//! and sends its queue within `--cloudwatch-shutdown-timeout`.

pub mod datum;
pub mod metrics;
pub mod publish;
pub mod select;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use api::{cloudwatch_cost::dimension_sets, crd::CloudWatchSinkSpec, duration::Period, node_config::Route};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    datum::{Accumulator, MAX_DIMENSIONS},
    metrics::{CloudWatchMetrics, SinkLabel, SinkReasonLabels},
    publish::{Backoff, Queue, Target},
    select::{AgentDimensions, View},
};
use crate::{
    routing::{Routing, RuntimeEntry},
    sinks::prometheus::SharedRouting,
    state::NodeState,
};

/// The agent-wide settings of every sink.
#[derive(Clone, Debug)]
pub struct Options {
    pub agent: AgentDimensions,
    /// Datums a sink keeps waiting at most.
    pub queue_datums: usize,
    pub backoff: Backoff,
    /// Time limit of one PutMetricData attempt.
    pub request_timeout: Duration,
    /// Time the final flush gets on shutdown.
    pub shutdown_timeout: Duration,
}

/// A sink's settings, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub namespace: String,
    /// `None`: the instance's region, from the reports.
    pub region: Option<String>,
    pub dimension_sets: Vec<Vec<api::crd::Dimension>>,
    pub storage_resolution: i32,
    pub flush_interval: Duration,
}

/// Why a sink is left out; the `reason` label.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Invalid {
    #[error("namespace {0:?} is not a CloudWatch namespace (1-255 of A-Z a-z 0-9 . _ / # : - and space, not AWS/…)")]
    Namespace(String),
    #[error("region {0:?} is not a region name such as us-west-2")]
    Region(String),
    #[error("storage resolution {0} is neither 1 nor 60")]
    Resolution(i32),
    #[error("flush interval {0:?}: {1}")]
    FlushInterval(String, String),
    #[error("a dimension set has {0} dimensions, more than 29 (one is kept for the metric's own split)")]
    Dimensions(usize),
}

impl Invalid {
    pub fn reason(&self) -> &'static str {
        match self {
            Invalid::Namespace(_) => "namespace",
            Invalid::Region(_) => "region",
            Invalid::Resolution(_) => "resolution",
            Invalid::FlushInterval(..) => "flush_interval",
            Invalid::Dimensions(_) => "dimensions",
        }
    }
}

impl Settings {
    pub const DEFAULT_FLUSH: Duration = Duration::from_secs(60);

    pub fn from_spec(spec: &CloudWatchSinkSpec) -> Result<Settings, Invalid> {
        if !valid_namespace(&spec.namespace) {
            return Err(Invalid::Namespace(spec.namespace.clone()));
        }
        if let Some(region) = spec.region.as_deref().filter(|r| !valid_region(r)) {
            return Err(Invalid::Region(region.to_owned()));
        }
        let storage_resolution = spec.storage_resolution.unwrap_or(60);
        if storage_resolution != 1 && storage_resolution != 60 {
            return Err(Invalid::Resolution(storage_resolution));
        }
        let flush_interval = match &spec.flush_interval {
            None => Self::DEFAULT_FLUSH,
            Some(text) => {
                let period: Period = text
                    .parse()
                    .map_err(|e: api::duration::PeriodError| Invalid::FlushInterval(text.clone(), e.to_string()))?;
                let d = period.as_duration();
                if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
                    return Err(Invalid::FlushInterval(text.clone(), "must be from 1s to 1h".to_owned()));
                }
                d
            }
        };
        let sets = dimension_sets(spec.dimensions.as_deref(), spec.rollups.as_deref());
        if let Some(big) = sets.iter().map(Vec::len).find(|n| *n >= MAX_DIMENSIONS) {
            return Err(Invalid::Dimensions(big));
        }
        Ok(Settings {
            namespace: spec.namespace.clone(),
            region: spec.region.clone(),
            dimension_sets: sets,
            storage_resolution,
            flush_interval,
        })
    }
}

/// CloudWatch's namespace rule (and the CRD's): 1-255 characters of `A-Za-z0-9._/#:-`
/// and space, not starting with `AWS/`.
pub fn valid_namespace(ns: &str) -> bool {
    (1..=255).contains(&ns.len())
        && !ns.starts_with("AWS/")
        && ns.chars().all(|c| c.is_ascii_alphanumeric() || "._/#: -".contains(c))
}

/// A region name as the CRD accepts it: `^[a-z]{2}(-[a-z]+)+-[0-9]+$`.
pub fn valid_region(region: &str) -> bool {
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 3
        && region.len() <= 32
        && parts[0].len() == 2
        && parts[..parts.len() - 1].iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts.last().is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// What the sampling side and the sending side of one sink share.
struct Shared {
    name: String,
    collect: Mutex<(View, Accumulator)>,
    queue: Arc<Queue>,
    /// The instance's region, from the reports (used when the spec names none).
    region: Mutex<Option<String>>,
}

struct Running {
    route: Route,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Every CloudWatch sink of the node.
pub struct Sinks {
    pub state: Arc<Mutex<NodeState>>,
    pub routing: SharedRouting,
    /// Bumped by the pipeline after each report.
    pub reports: watch::Receiver<u64>,
    pub options: Options,
    pub metrics: CloudWatchMetrics,
}

impl Sinks {
    /// Runs until `shutdown`, then flushes every sink (bounded by the shutdown timeout).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut running: Vec<Running> = Vec::new();
        let mut in_force: Option<Arc<Routing>> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = self.reports.changed() => if changed.is_err() { break },
            }
            let routing = self.routing.read().unwrap_or_else(|p| p.into_inner()).clone();
            if !in_force.as_ref().is_some_and(|r| Arc::ptr_eq(r, &routing)) {
                // At the agent's first report every event counted so far is new to the sinks.
                let fresh = in_force.is_none();
                self.reconcile(&routing, &mut running, fresh);
                in_force = Some(routing);
            }
            if running.is_empty() {
                continue;
            }
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            for sink in &running {
                let mut collect = sink.shared.collect.lock().unwrap_or_else(|p| p.into_inner());
                let (view, acc) = &mut *collect;
                view.sample(&state, acc);
                if !state.instance.region.is_empty() {
                    let mut region = sink.shared.region.lock().unwrap_or_else(|p| p.into_inner());
                    if region.as_deref() != Some(state.instance.region.as_str()) {
                        *region = Some(state.instance.region.clone());
                    }
                }
            }
        }
        info!(sinks = running.len(), "flushing the CloudWatch sinks");
        futures::future::join_all(running.into_iter().map(stop)).await;
    }

    /// Starts the sinks of new or changed routes, stops those of routes that went away.
    fn reconcile(&self, routing: &Routing, running: &mut Vec<Running>, fresh: bool) {
        let wanted: Vec<(&Route, &[RuntimeEntry])> = routing.cloudwatch_routes().collect();
        let (keep, gone): (Vec<Running>, Vec<Running>) =
            std::mem::take(running).into_iter().partition(|r| wanted.iter().any(|(route, _)| **route == r.route));
        *running = keep;
        // Their final flush runs on its own: a CloudWatch that does not answer must not
        // hold up the sampling of the other sinks for the shutdown time limit.
        for sink in gone {
            tokio::spawn(stop(sink));
        }
        self.metrics.invalid.clear();
        for (route, runtimes) in wanted {
            if running.iter().any(|r| r.route == *route) {
                continue;
            }
            let Some(spec) = &route.cloudwatch else { continue };
            let settings = match Settings::from_spec(spec) {
                Ok(s) => s,
                Err(e) => {
                    let labels = SinkReasonLabels { sink: route.config.clone(), reason: e.reason() };
                    self.metrics.invalid.get_or_create(&labels).set(1);
                    warn!(sink = %route.config, error = %e, "CloudWatch sink left out: invalid settings");
                    continue;
                }
            };
            running.push(self.start(route, runtimes, settings, fresh));
        }
    }

    fn start(&self, route: &Route, runtimes: &[RuntimeEntry], settings: Settings, fresh: bool) -> Running {
        let name = route.config.clone();
        let view = View::new(route, runtimes, &self.options.agent, settings.dimension_sets.clone(), fresh);
        let queue = Arc::new(Queue::new(name.clone(), self.options.queue_datums, self.metrics.clone()));
        let shared = Arc::new(Shared {
            name: name.clone(),
            collect: Mutex::new((view, Accumulator::default())),
            queue,
            region: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        info!(sink = %name, namespace = %settings.namespace, region = ?settings.region,
              flush_interval = ?settings.flush_interval, "starting CloudWatch sink");
        let task =
            tokio::spawn(run_sink(shared.clone(), settings, self.options.clone(), self.metrics.clone(), stop.clone()));
        Running { route: route.clone(), shared, stop, task }
    }
}

async fn stop(sink: Running) {
    sink.stop.cancel();
    if let Err(e) = sink.task.await {
        warn!(sink = %sink.shared.name, error = %e, "CloudWatch sink task failed");
    }
}

/// Moves what was collected into the queue.
fn flush(shared: &Shared, settings: &Settings, metrics: &CloudWatchMetrics) {
    let datums = {
        let mut collect = shared.collect.lock().unwrap_or_else(|p| p.into_inner());
        if collect.1.is_empty() {
            return;
        }
        collect.1.drain(SystemTime::now(), settings.storage_resolution)
    };
    metrics.flushes.get_or_create(&SinkLabel { sink: shared.name.clone() }).inc();
    shared.queue.push(datums);
}

/// Flushes every interval; sends from a task of its own once the region is known.
async fn run_sink(
    shared: Arc<Shared>,
    settings: Settings,
    options: Options,
    metrics: CloudWatchMetrics,
    stop: CancellationToken,
) {
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + settings.flush_interval, settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop_sender = CancellationToken::new();
    let mut sender: Option<JoinHandle<()>> = None;
    let mut unusable = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        flush(&shared, &settings, &metrics);
        if sender.is_none() && !unusable {
            sender = start_sender(&shared, &settings, &options, &metrics, &stop_sender, &mut unusable).await;
        }
        if unusable {
            shared.queue.abandon("invalid");
        }
    }
    flush(&shared, &settings, &metrics);
    if sender.is_none() && !unusable {
        sender = start_sender(&shared, &settings, &options, &metrics, &stop_sender, &mut unusable).await;
    }
    if sender.is_some() && tokio::time::timeout(options.shutdown_timeout, shared.queue.wait_drained()).await.is_err() {
        warn!(sink = %shared.name, datums = shared.queue.len(), "CloudWatch queue not sent within the shutdown time limit");
    }
    stop_sender.cancel();
    if let Some(task) = sender {
        let _ = task.await;
    }
    shared.queue.abandon("shutdown");
}

/// The sending task, once the region is known; `None` until then (the data waits).
async fn start_sender(
    shared: &Arc<Shared>,
    settings: &Settings,
    options: &Options,
    metrics: &CloudWatchMetrics,
    stop: &CancellationToken,
    unusable: &mut bool,
) -> Option<JoinHandle<()>> {
    let region = match &settings.region {
        Some(r) => r.clone(),
        None => shared.region.lock().unwrap_or_else(|p| p.into_inner()).clone()?,
    };
    if !valid_region(&region) {
        let labels = SinkReasonLabels { sink: shared.name.clone(), reason: "region" };
        metrics.invalid.get_or_create(&labels).set(1);
        warn!(sink = %shared.name, %region, "CloudWatch sink left out: the instance's region is not a region name");
        *unusable = true;
        shared.queue.abandon("invalid");
        return None;
    }
    let client = publish::client(&region, options.request_timeout).await;
    let target = Target {
        sink: shared.name.clone(),
        namespace: settings.namespace.clone(),
        client,
        backoff: options.backoff,
        metrics: metrics.clone(),
    };
    Some(tokio::spawn(publish::run_sender(shared.queue.clone(), target, stop.clone())))
}

#[cfg(test)]
mod tests;
