//! What one sink sees of the node state and the samples it takes of it after a report.
//!
//! A route sees the applications of pods in its namespace (every application when its
//! namespace is `None`) whose tag one of its runtime entries matches, with the groups of
//! those entries; node-level metrics (ECC) and cores held by no pod only when its
//! namespace is `None`. Of what it sees it publishes the metrics of its allow-list.
//!
//! Dimensions whose value is unknown (no pod attributed, no `--cluster-name`) are left
//! out of the datum, as CloudWatch refuses empty values; the series of several
//! applications then share one metric, which is what a coarser dimension set means.
//! Counters (`neuron_execution_errors`, `neuron_execution_status`,
//! `neurondevice_hw_ecc_events`) are sent as the number of events since the previous
//! sample, split by type (`ErrorType`, `StatusType`, `EventType`): the error types and
//! statuses the reports carried, a newer release's under their own names; latency as the
//! p50 and p99 that neuron-monitor reports, and any percentile a newer release adds
//! (`Percentile`).
//!
//! NVIDIA GPUs ([`gpu`]) are sampled from each GPU collection, not from reports: a node
//! with GPUs and no Neuron device gets no report, and a node with both samples each once.

mod gpu;
mod insights;

pub use gpu::{value_of, GpuSample};

use std::collections::HashMap;

use api::{
    cloudwatch::catalogue::{
        allows, applies, dimension_name, gpu::ClassicGpuMetric, shape_of, MetricShape, LATENCY_PERCENTILES,
    },
    crd::{CloudWatchMetric, CloudWatchNaming, Dimension},
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::Route,
    report::{DocumentedNames, PercentileNames},
};

use super::datum::{Accumulator, MetricKey, MAX_DIMENSIONS};
use crate::{
    routing::Selection,
    state::{EcsContainer, InstanceLabels, NamedValues, NodeState, PodRef, RuntimeState},
};

/// The sink's selection, and the counter values it last saw.
#[derive(Debug)]
pub struct View {
    naming: CloudWatchNaming,
    /// Whose GPUs it sees ([`crate::series::Scope::Route`]).
    route: Route,
    /// The classic GPU metrics it publishes.
    gpu_metrics: &'static [ClassicGpuMetric],
    /// The route sees the node itself (it is the operator namespace's): node-level series.
    sees_node: bool,
    selection: Selection,
    metrics: Vec<&'static MetricShape>,
    node_level: bool,
    dimension_sets: Vec<Vec<Dimension>>,
    cluster_name: Option<String>,
    node_name: Option<String>,
    /// Running sums last seen, per runtime tag and per device.
    errors_seen: HashMap<String, NamedValues>,
    status_seen: HashMap<String, NamedValues>,
    ecc_seen: HashMap<u32, [f64; 4]>,
    /// The first sample only records where the running sums stand (the sink started
    /// after the agent had counted events that are not this sink's to send).
    baseline_first: bool,
}

/// The fixed dimension values of the agent.
#[derive(Clone, Debug, Default)]
pub struct AgentDimensions {
    pub cluster_name: Option<String>,
    pub node_name: Option<String>,
}

/// Where one sample comes from: what its dimensions are filled from.
#[derive(Clone, Copy)]
struct Origin<'a> {
    instance: &'a InstanceLabels,
    runtime_tag: Option<&'a str>,
    pod: Option<&'a PodRef>,
    ecs: Option<&'a EcsContainer>,
    core: Option<u32>,
    device: Option<u32>,
}

impl View {
    /// `fresh`: no report was applied before the sink started, so every counted event is
    /// the sink's to send.
    pub fn new(
        route: &Route,
        selection: &Selection,
        agent: &AgentDimensions,
        dimension_sets: Vec<Vec<Dimension>>,
        fresh: bool,
    ) -> Self {
        let allowed = route.cloudwatch.as_ref().and_then(|c| c.metrics.as_deref());
        let metrics = api::cloudwatch::catalogue::CATALOGUE.iter().filter(|s| allows(allowed, s)).collect();
        View {
            naming: route.cloudwatch.as_ref().and_then(|c| c.naming).unwrap_or_default(),
            route: route.clone(),
            gpu_metrics: route.cloudwatch.as_ref().map_or(&[], api::cloudwatch::catalogue::gpu::published_classic),
            sees_node: route.namespace.is_none(),
            selection: selection.clone(),
            metrics,
            node_level: route.namespace.is_none() && route.system_groups.contains(&SystemGroup::NeuronHwCounters),
            dimension_sets,
            cluster_name: agent.cluster_name.clone().filter(|s| !s.is_empty()),
            node_name: agent.node_name.clone().filter(|s| !s.is_empty()),
            errors_seen: HashMap::new(),
            status_seen: HashMap::new(),
            ecc_seen: HashMap::new(),
            baseline_first: !fresh,
        }
    }

    fn publishes(&self, metric: CloudWatchMetric) -> bool {
        self.metrics.iter().any(|m| m.metric == metric)
    }

    /// Groups this sink takes of a runtime; empty: the runtime is not its.
    fn groups_of(&self, rt: &RuntimeState) -> Vec<RuntimeGroup> {
        let namespace = rt.labels.pod.as_ref().map(|p| p.namespace.as_str());
        self.selection.groups(namespace, &rt.labels.runtime_tag).unwrap_or_default()
    }

    /// Takes one sample of everything this sink sees into `acc`.
    pub fn sample(&mut self, state: &NodeState, acc: &mut Accumulator) {
        if self.naming == CloudWatchNaming::ContainerInsights {
            return self.sample_insights(state, acc);
        }
        let cores_per_device = state.hardware.as_ref().and_then(|h| h.cores_per_device).filter(|c| *c > 0);
        let device_of = |core: u32| cores_per_device.map(|n| core / n);
        let emit_counts = !std::mem::take(&mut self.baseline_first);
        let instance = &*state.instance;
        let mut seen_tags: Vec<&str> = Vec::with_capacity(state.runtimes.len());

        for rt in &state.runtimes {
            let groups = self.groups_of(rt);
            if groups.is_empty() {
                continue;
            }
            seen_tags.push(&rt.labels.runtime_tag);
            let base = Origin {
                instance,
                runtime_tag: Some(&rt.labels.runtime_tag),
                pod: rt.labels.pod.as_deref(),
                ecs: rt.labels.ecs.as_deref(),
                core: None,
                device: None,
            };
            if groups.contains(&RuntimeGroup::NeuroncoreCounters)
                && self.publishes(CloudWatchMetric::NeuroncoreUtilization)
            {
                for core in &rt.cores {
                    if let Some(u) = core.utilization {
                        let origin = Origin { core: Some(core.index), device: device_of(core.index), ..base };
                        self.gauge(acc, CloudWatchMetric::NeuroncoreUtilization, origin, None, u);
                    }
                }
            }
            if groups.contains(&RuntimeGroup::MemoryUsed) {
                self.sample_memory(acc, rt, base, &device_of);
            }
            if groups.contains(&RuntimeGroup::ExecutionStats) {
                self.sample_execution(acc, rt, base, emit_counts);
            }
        }
        // Forget the counters of applications that left, so a return starts from zero
        // (as the node state's running sums do).
        self.errors_seen.retain(|tag, _| seen_tags.contains(&tag.as_str()));
        self.status_seen.retain(|tag, _| seen_tags.contains(&tag.as_str()));

        self.sample_idle_cores(acc, state, &device_of);
        if self.node_level && self.publishes(CloudWatchMetric::NeurondeviceHwEccEvents) {
            for (device, totals) in &state.system.ecc_totals {
                let origin =
                    Origin { instance, runtime_tag: None, pod: None, ecs: None, core: None, device: Some(*device) };
                let previous = self.ecc_seen.insert(*device, *totals);
                let shape = shape_of(CloudWatchMetric::NeurondeviceHwEccEvents);
                for (i, total) in totals.iter().enumerate() {
                    let delta = increase(previous.map(|p| p[i]), *total, emit_counts);
                    let split = shape.split.map(|(name, values)| (name, values[i]));
                    self.count(acc, shape, origin, split, delta);
                }
            }
        }
        self.sample_allocation(acc, state);
        self.sample_pod_allocation(acc, state);
    }

    /// The node's cores by allocation state, for a config that sees the node; nothing
    /// before the kubelet says (off Kubernetes, never).
    fn sample_allocation(&self, acc: &mut Accumulator, state: &NodeState) {
        let metric = CloudWatchMetric::NeuronNodeNeuroncores;
        let (Some(allocation), true) = (&state.allocation, self.sees_node && self.publishes(metric)) else { return };
        let origin =
            Origin { instance: &state.instance, runtime_tag: None, pod: None, ecs: None, core: None, device: None };
        let split = shape_of(metric).split.map(|(dimension, _)| dimension);
        for (name, cores) in allocation.cores.by_state() {
            self.gauge(acc, metric, origin, split.map(|d| (d, name)), f64::from(cores));
        }
    }

    /// The cores of each pod the route sees, by allocation state (opt-in).
    fn sample_pod_allocation(&self, acc: &mut Accumulator, state: &NodeState) {
        let metric = CloudWatchMetric::NeuronPodNeuroncores;
        let (Some(allocation), true) = (&state.allocation, self.publishes(metric)) else { return };
        let split = shape_of(metric).split.map(|(dimension, _)| dimension);
        for pod in allocation.pods.iter().filter(|p| self.selection.sees(Some(p.pod.namespace.as_str()))) {
            let origin = Origin {
                instance: &state.instance,
                runtime_tag: None,
                pod: Some(&*pod.pod),
                ecs: None,
                core: None,
                device: None,
            };
            for (name, cores) in pod.by_state() {
                self.gauge(acc, metric, origin, split.map(|d| (d, name)), f64::from(cores));
            }
        }
    }

    fn sample_memory(
        &self,
        acc: &mut Accumulator,
        rt: &RuntimeState,
        base: Origin<'_>,
        device_of: &dyn Fn(u32) -> Option<u32>,
    ) {
        const SLOTS: [CloudWatchMetric; 5] = [
            CloudWatchMetric::NeuroncoreMemoryUsageConstants,
            CloudWatchMetric::NeuroncoreMemoryUsageModelCode,
            CloudWatchMetric::NeuroncoreMemoryUsageModelSharedScratchpad,
            CloudWatchMetric::NeuroncoreMemoryUsageRuntimeMemory,
            CloudWatchMetric::NeuroncoreMemoryUsageTensors,
        ];
        // Device memory of the runtime: the sum of its cores' memory, per device.
        let mut per_device: Vec<(Option<u32>, f64)> = Vec::new();
        for core in &rt.cores {
            let Some(memory) = core.memory else { continue };
            let origin = Origin { core: Some(core.index), device: device_of(core.index), ..base };
            let values = memory.values();
            for (metric, value) in SLOTS.iter().zip(values) {
                if let Some(v) = value.filter(|_| self.publishes(*metric)) {
                    self.gauge(acc, *metric, origin, None, v);
                }
            }
            let total: f64 = values.iter().flatten().sum();
            match per_device.iter_mut().find(|(d, _)| *d == origin.device) {
                Some((_, sum)) => *sum += total,
                None => per_device.push((origin.device, total)),
            }
        }
        if self.publishes(CloudWatchMetric::NeurondeviceRuntimeMemoryUsedBytes) {
            for (device, bytes) in per_device {
                let origin = Origin { device, ..base };
                self.gauge(acc, CloudWatchMetric::NeurondeviceRuntimeMemoryUsedBytes, origin, None, bytes);
            }
        }
    }

    fn sample_execution(&mut self, acc: &mut Accumulator, rt: &RuntimeState, base: Origin<'_>, emit_counts: bool) {
        let tag = &rt.labels.runtime_tag;
        for (metric, totals) in [
            (CloudWatchMetric::NeuronExecutionErrors, &rt.errors_total),
            (CloudWatchMetric::NeuronExecutionStatus, &rt.status_total),
        ] {
            let Some(totals) = totals else { continue };
            let seen = match metric {
                CloudWatchMetric::NeuronExecutionErrors => &mut self.errors_seen,
                _ => &mut self.status_seen,
            };
            let deltas = increases(seen, tag, totals, emit_counts);
            let shape = shape_of(metric);
            if !self.publishes(metric) {
                continue;
            }
            for (name, value) in deltas {
                let split = shape.split.map(|(dimension, _)| (dimension, name));
                self.count(acc, shape, base, split, value);
            }
        }
        if let (Some(latency), true) = (&rt.latency, self.publishes(CloudWatchMetric::NeuronExecutionLatency)) {
            for (p, v) in latency.iter().filter(|(p, _)| published_percentile(p)) {
                self.gauge(acc, CloudWatchMetric::NeuronExecutionLatency, base, Some(("Percentile", p)), v);
            }
        }
    }

    /// Cores no application uses: 0 % for the pod that holds them, or for the node.
    fn sample_idle_cores(&self, acc: &mut Accumulator, state: &NodeState, device_of: &dyn Fn(u32) -> Option<u32>) {
        if !self.publishes(CloudWatchMetric::NeuroncoreUtilization) {
            return;
        }
        for core in &state.idle_cores {
            let pod = core.pod.as_deref();
            let namespace = pod.map(|p| p.namespace.as_str());
            if !self.selection.takes_untagged(namespace, RuntimeGroup::NeuroncoreCounters) {
                continue;
            }
            let origin = Origin {
                instance: &state.instance,
                runtime_tag: None,
                pod,
                ecs: None,
                core: Some(core.index),
                device: device_of(core.index),
            };
            self.gauge(acc, CloudWatchMetric::NeuroncoreUtilization, origin, None, 0.0);
        }
    }

    /// Samples the devices' health (device, unhealthy): 1 while unhealthy, 0 while
    /// healthy; a device whose health is unknown is left out.
    pub fn sample_health(&mut self, instance: &InstanceLabels, devices: &[(u32, bool)], acc: &mut Accumulator) {
        // Not a Container Insights metric.
        if !self.node_level
            || self.naming != CloudWatchNaming::Classic
            || !self.publishes(CloudWatchMetric::NeurondeviceUnhealthy)
        {
            return;
        }
        for (device, unhealthy) in devices {
            let origin =
                Origin { instance, runtime_tag: None, pod: None, ecs: None, core: None, device: Some(*device) };
            self.gauge(acc, CloudWatchMetric::NeurondeviceUnhealthy, origin, None, f64::from(u8::from(*unhealthy)));
        }
    }

    fn gauge(
        &self,
        acc: &mut Accumulator,
        metric: CloudWatchMetric,
        origin: Origin<'_>,
        split: Option<(&'static str, &str)>,
        value: f64,
    ) {
        let shape = shape_of(metric);
        for set in &self.dimension_sets {
            acc.gauge(self.key(shape, set, origin, split), shape.unit, value);
        }
    }

    fn count(
        &self,
        acc: &mut Accumulator,
        shape: &'static MetricShape,
        origin: Origin<'_>,
        split: Option<(&'static str, &str)>,
        value: f64,
    ) {
        for set in &self.dimension_sets {
            acc.count(self.key(shape, set, origin, split), value);
        }
    }

    fn key(
        &self,
        shape: &'static MetricShape,
        set: &[Dimension],
        o: Origin<'_>,
        split: Option<(&'static str, &str)>,
    ) -> MetricKey {
        let mut dimensions = Vec::with_capacity(set.len() + 1);
        for d in set.iter().copied().filter(|d| applies(*d, shape.level)) {
            if let Some(v) = self.dimension_value(d, o) {
                dimensions.push((dimension_name(d), v));
            }
        }
        if let Some((name, value)) = split {
            dimensions.push((name, value.to_owned()));
        }
        dimensions.truncate(MAX_DIMENSIONS);
        MetricKey { name: shape.name, dimensions }
    }

    /// A dimension's value for a sample; `None`: unknown or empty (CloudWatch refuses
    /// empty values).
    fn dimension_value(&self, d: Dimension, o: Origin<'_>) -> Option<String> {
        let value = match d {
            Dimension::ClusterName => self.cluster_name.clone(),
            Dimension::NodeName => self.node_name.clone(),
            Dimension::InstanceId => Some(o.instance.instance_id.clone()),
            Dimension::InstanceType => Some(o.instance.instance_type.clone()),
            Dimension::AmiId => Some(o.instance.ami_id.clone()),
            Dimension::AvailabilityZone => Some(o.instance.availability_zone.clone()),
            Dimension::NeuronCore => o.core.map(|c| c.to_string()),
            Dimension::NeuronDevice => o.device.map(|d| d.to_string()),
            Dimension::RuntimeTag => o.runtime_tag.map(str::to_owned),
            Dimension::Namespace => o.pod.map(|p| p.namespace.clone()),
            Dimension::PodName => o.pod.map(|p| p.pod.clone()),
            Dimension::ContainerName => {
                o.pod.map(|p| p.container.clone()).or_else(|| o.ecs.map(|e| e.container.clone()))
            }
            Dimension::TaskArn => o.ecs.map(|e| e.task_arn.clone()),
            Dimension::TaskDefinitionFamily => o.ecs.map(|e| e.family.clone()),
        };
        // CloudWatch takes 1..=1024 characters.
        value.filter(|v| !v.is_empty()).map(|v| truncate(v, 1024))
    }
}

/// Events since the previous running sum; a sum that went down restarted from zero.
fn increase(previous: Option<f64>, total: f64, emit: bool) -> f64 {
    match previous {
        None if !emit => 0.0,
        None => total,
        Some(p) if total >= p => total - p,
        Some(_) => total,
    }
}

/// The events of each name of `totals` since the sample before, remembered under `tag`
/// in `seen`. A runtime first seen after the first sample is new: all its events count;
/// so does a name first seen in a runtime already known.
fn increases<'t>(
    seen: &mut HashMap<String, NamedValues>,
    tag: &str,
    totals: &'t NamedValues,
    emit_counts: bool,
) -> Vec<(&'t str, f64)> {
    match seen.get_mut(tag) {
        Some(previous) => {
            let deltas = totals
                .iter()
                .map(|(n, t)| (n, increase(Some(previous.get(n).unwrap_or(0.0)), t, emit_counts)))
                .collect();
            previous.clone_from(totals);
            deltas
        }
        None => {
            seen.insert(tag.to_owned(), totals.clone());
            let previous = emit_counts.then_some(0.0);
            totals.iter().map(|(n, t)| (n, increase(previous, t, emit_counts))).collect()
        }
    }
}

/// The percentiles sent: the median and the tail of neuron-monitor's documented seven
/// (each is a metric of its own, so each costs as much as any other), and any a newer
/// release adds.
fn published_percentile(name: &str) -> bool {
    LATENCY_PERCENTILES.contains(&name) || !PercentileNames::NAMES.contains(&name)
}

fn truncate(mut s: String, max_chars: usize) -> String {
    if let Some((i, _)) = s.char_indices().nth(max_chars) {
        s.truncate(i);
    }
    s
}
