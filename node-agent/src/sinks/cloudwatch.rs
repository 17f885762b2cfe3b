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
//! NVIDIA GPUs are sampled at each GPU collection (a change of [`GpuSource::snapshot`]),
//! reports at each report: a node with GPUs and no Neuron device, which gets no report,
//! sends its GPUs all the same, and a node with both samples each once.
//!
//! Sinks follow the routing table: a route that appears starts a sink, one that changes
//! or goes away is flushed and stopped. On shutdown every sink flushes what it collected
//! and sends its queue within `--cloudwatch-shutdown-timeout`.

pub mod datum;
pub mod publish;
pub mod select;
pub mod telemetry;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use api::{
    cloudwatch::sink::SinkSettings,
    crd::CloudWatchNaming,
    node_config::Route,
    region::{same_partition, valid_region},
};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    datum::Accumulator,
    publish::{Queue, Target},
    select::{AgentDimensions, GpuSample, View},
    telemetry::{CloudWatchMetrics, SinkLabel},
};
use crate::{
    delivery::backoff::Backoff,
    gpu::{GpuSnapshot, GpuSource},
    health::{model::State, SharedHealth},
    routing::{Routing, Selection, SharedRouting},
    sinks::common::stop_unwanted,
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
    /// The devices' health, for `neurondevice_unhealthy`.
    pub health: SharedHealth,
    /// With NVIDIA GPUs: their collections.
    pub gpus: Option<GpuSource>,
}

/// What woke the sinks.
enum Wake {
    Report,
    GpuCollection,
    /// The GPU collector ended: no more collections.
    GpusGone,
}

/// The next GPU collection; never, without GPUs.
async fn next_collection(
    collections: &mut Option<watch::Receiver<Arc<GpuSnapshot>>>,
) -> Result<(), watch::error::RecvError> {
    match collections {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// The region of the agent's environment (`AWS_REGION`, else `AWS_DEFAULT_REGION`), for
/// a node without Neuron devices: no report tells its instance's region.
fn environment_region() -> Option<String> {
    ["AWS_REGION", "AWS_DEFAULT_REGION"].iter().find_map(|k| std::env::var(k).ok().filter(|r| valid_region(r)))
}

/// Records the region the sink's data belongs to (the sender starts once it is known).
fn note_region(shared: &Shared, region: &str) {
    let mut known = shared.region.lock().unwrap_or_else(|p| p.into_inner());
    if known.as_deref() != Some(region) {
        *known = Some(region.to_owned());
    }
}

/// (device, unhealthy) of every device whose health is known.
fn device_health(health: &SharedHealth) -> Vec<(u32, bool)> {
    let model = health.lock().unwrap_or_else(|p| p.into_inner());
    model
        .devices
        .iter()
        .filter_map(|(index, device)| match device.state() {
            State::Healthy => Some((*index, false)),
            State::Unhealthy => Some((*index, true)),
            State::Unknown => None,
        })
        .collect()
}

impl Sinks {
    /// Runs until `shutdown`, then flushes every sink (bounded by the shutdown timeout).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut running: Vec<Running> = Vec::new();
        let mut in_force: Option<Arc<Routing>> = None;
        let mut collections = self.gpus.as_ref().map(|g| g.snapshot.clone());
        let environment_region = environment_region();
        loop {
            let wake = tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = self.reports.changed() => if changed.is_err() { break } else { Wake::Report },
                changed = next_collection(&mut collections) => match changed {
                    Ok(()) => Wake::GpuCollection,
                    Err(_) => Wake::GpusGone,
                },
            };
            if matches!(wake, Wake::GpusGone) {
                collections = None;
                continue;
            }
            let routing = self.routing.current();
            if !in_force.as_ref().is_some_and(|r| Arc::ptr_eq(r, &routing)) {
                // At the agent's first report every event counted so far is new to the sinks.
                let fresh = in_force.is_none();
                self.reconcile(&routing, &mut running, fresh);
                in_force = Some(routing);
            }
            if running.is_empty() {
                continue;
            }
            match wake {
                Wake::Report => self.sample_report(&running),
                _ => self.sample_gpus(&running, environment_region.as_deref()),
            }
        }
        info!(sinks = running.len(), "flushing the CloudWatch sinks");
        futures::future::join_all(running.into_iter().map(stop)).await;
    }

    /// Samples the node state after a report into every sink.
    fn sample_report(&self, running: &[Running]) {
        let devices = device_health(&self.health);
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for sink in running {
            let mut collect = sink.shared.collect.lock().unwrap_or_else(|p| p.into_inner());
            let (view, acc) = &mut *collect;
            view.sample(&state, acc);
            view.sample_health(&state.instance, &devices, acc);
            if !state.instance.region.is_empty() {
                note_region(&sink.shared, &state.instance.region);
            }
        }
    }

    /// Samples the latest GPU collection into every sink. The region is the instance's
    /// once a report told it, else the environment's, else the sink's own (no report comes
    /// on a node without Neuron devices).
    fn sample_gpus(&self, running: &[Running], environment_region: Option<&str>) {
        let Some(source) = &self.gpus else { return };
        let instance = self.state.lock().unwrap_or_else(|p| p.into_inner()).instance.clone();
        let holders = source.holders.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let snapshot = source.snapshot.borrow().clone();
        let sample =
            GpuSample { snapshot: &snapshot, holders: &holders, hostname: &source.hostname, instance: &instance };
        let region = Some(instance.region.as_str()).filter(|r| !r.is_empty()).or(environment_region);
        for sink in running {
            let mut collect = sink.shared.collect.lock().unwrap_or_else(|p| p.into_inner());
            let (view, acc) = &mut *collect;
            view.sample_gpus(&sample, acc);
            let own = sink.route.cloudwatch.as_ref().and_then(|c| c.region.as_deref());
            if let Some(region) = region.or(own) {
                note_region(&sink.shared, region);
            }
        }
    }

    /// Starts the sinks of new or changed routes, stops those of routes that went away.
    fn reconcile(&self, routing: &Routing, running: &mut Vec<Running>, fresh: bool) {
        let wanted: Vec<(&Route, &Selection)> = routing.cloudwatch_routes().collect();
        stop_unwanted(running, &wanted, |r| &r.route, stop);
        self.metrics.common.invalid.clear();
        for (route, selection) in wanted {
            if running.iter().any(|r| r.route == *route) {
                continue;
            }
            let Some(spec) = &route.cloudwatch else { continue };
            let settings = match SinkSettings::check(spec) {
                Ok(s) => s,
                Err(e) => {
                    self.metrics.common.set_invalid(&route.config, e.field, true);
                    warn!(sink = %route.config, error = %e, "CloudWatch sink left out: invalid settings");
                    continue;
                }
            };
            // Every Container Insights dimension set has ClusterName: without it, nothing.
            if settings.naming == CloudWatchNaming::ContainerInsights
                && self.options.agent.cluster_name.as_deref().is_none_or(str::is_empty)
            {
                self.metrics.common.set_invalid(&route.config, "cluster_name", true);
                warn!(sink = %route.config, "CloudWatch sink left out: Container Insights naming needs --cluster-name");
                continue;
            }
            running.push(self.start(route, selection, settings, fresh));
        }
    }

    fn start(&self, route: &Route, selection: &Selection, settings: SinkSettings, fresh: bool) -> Running {
        let name = route.config.clone();
        let view = View::new(route, selection, &self.options.agent, settings.dimension_sets.clone(), fresh);
        let queue_metrics = self.metrics.common.queue_metrics(&name);
        let queue = Arc::new(Queue::new(self.options.queue_datums, queue_metrics));
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
fn flush(shared: &Shared, settings: &SinkSettings, metrics: &CloudWatchMetrics) {
    let datums = {
        let mut collect = shared.collect.lock().unwrap_or_else(|p| p.into_inner());
        if collect.1.is_empty() {
            return;
        }
        collect.1.drain(SystemTime::now(), settings.storage_resolution)
    };
    metrics.common.flushes.get_or_create(&SinkLabel { sink: shared.name.clone() }).inc();
    shared.queue.push(datums);
}

/// When a sink first flushes: a random point of its first interval (then every interval),
/// so that sinks started together across a fleet (a rollout, one config change reaching
/// every node) do not all send in the same second ever after.
fn first_flush(interval: Duration, rng: &mut fastrand::Rng) -> Duration {
    interval.mul_f64(1.0 - rng.f64())
}

/// Flushes every interval; sends from a task of its own once the region is known.
async fn run_sink(
    shared: Arc<Shared>,
    settings: SinkSettings,
    options: Options,
    metrics: CloudWatchMetrics,
    stop: CancellationToken,
) {
    let first = first_flush(settings.flush_interval, &mut fastrand::Rng::new());
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, settings.flush_interval);
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

/// The sending task, once the instance's region is known; `None` until then (the data
/// waits). A sink whose region is in another partition than the instance's is left out
/// (the operator refuses such a config; a node configuration may come from elsewhere):
/// the node's AWS identity belongs to its own partition, and so does its data.
async fn start_sender(
    shared: &Arc<Shared>,
    settings: &SinkSettings,
    options: &Options,
    metrics: &CloudWatchMetrics,
    stop: &CancellationToken,
    unusable: &mut bool,
) -> Option<JoinHandle<()>> {
    let instance = shared.region.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
    let region = settings.region.clone().unwrap_or_else(|| instance.clone());
    let refused = if !valid_region(&region) {
        Some(("region", "the instance's region is not a region name"))
    } else if !same_partition(&instance, &region) {
        Some(("partition", "its region is in another AWS partition than the instance's"))
    } else {
        None
    };
    if let Some((reason, why)) = refused {
        metrics.common.set_invalid(&shared.name, reason, true);
        warn!(sink = %shared.name, %region, %instance, "CloudWatch sink left out: {why}");
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
