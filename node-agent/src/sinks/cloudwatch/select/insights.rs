//! The Container Insights naming: what a route sees of the node state, as the `node_`,
//! `pod_` and `container_` metrics under Container Insights' dimension sets (the catalogue:
//! `api::cloudwatch::catalogue::insights`).
//!
//! Scoping is the classic naming's: a team's route sees its pods' runtimes and cores and
//! publishes only the `pod_` and `container_` families; the operator namespace's route
//! also publishes the `node_` family (every core, idle ones at 0 %) and the ECC counters.
//! A value goes under every set of its metric whose dimensions all have a value; a set
//! with an unknown value (a node without `cores_per_device`) is left out for that value,
//! as CloudWatch refuses empty values; a pod whose container is not known has no
//! `container_` series.
//!
//! Where the CloudWatch agent is wrong, this is right: each core is credited to the pod
//! that holds it, and node totals (device memory, execution errors) are sums over every
//! runtime; the node's latency is each runtime's p50, so its statistics are over runtimes.

use std::collections::BTreeMap;

use api::{
    cloudwatch::catalogue::insights::{
        core_value, device_value, metric_of, Capacity, Dimension, Family, PodCapacity, Source,
    },
    monitor_config::RuntimeGroup,
};

use super::{increase, increases, truncate, View};
use crate::{
    sinks::cloudwatch::datum::{Accumulator, MetricKey, MAX_DIMENSIONS},
    state::{InstanceLabels, NodeState, PodCores, PodRef},
};

/// What a value is credited to.
#[derive(Clone, Copy)]
pub(super) struct Place<'a> {
    pub(super) instance: &'a InstanceLabels,
    pub(super) pod: Option<&'a PodRef>,
    pub(super) core: Option<u32>,
    pub(super) device: Option<u32>,
    /// An NVIDIA GPU's device node name (`GpuDevice`).
    pub(super) gpu_device: Option<&'a str>,
}

#[derive(Clone, Copy)]
pub(super) enum Value {
    Gauge(f64),
    /// Events since the previous sample.
    Count(f64),
}

impl View {
    /// Takes one sample of everything this route sees into `acc`, Container Insights' way.
    pub(super) fn sample_insights(&mut self, state: &NodeState, acc: &mut Accumulator) {
        let cores_per_device = state.hardware.as_ref().and_then(|h| h.cores_per_device).filter(|c| *c > 0);
        let device_of = |core: u32| cores_per_device.map(|n| core / n);
        let emit_counts = !std::mem::take(&mut self.baseline_first);
        let instance = &*state.instance;
        let node = Place { instance, pod: None, core: None, device: None, gpu_device: None };
        let mut seen_tags: Vec<&str> = Vec::with_capacity(state.runtimes.len());
        // Node totals over every runtime this route sees.
        let mut errors: Option<f64> = None;
        let mut device_memory: Option<f64> = None;
        let mut latencies: Vec<f64> = Vec::new();

        for rt in &state.runtimes {
            let groups = self.groups_of(rt);
            if groups.is_empty() {
                continue;
            }
            let tag = rt.labels.runtime_tag.as_str();
            seen_tags.push(tag);
            let pod = rt.labels.pod.as_deref();
            for core in &rt.cores {
                let place =
                    Place { instance, pod, core: Some(core.index), device: device_of(core.index), gpu_device: None };
                if let (true, Some(u)) = (groups.contains(&RuntimeGroup::NeuroncoreCounters), core.utilization) {
                    self.per_core(acc, Source::Utilization, place, u);
                }
                if let (true, Some(memory)) = (groups.contains(&RuntimeGroup::MemoryUsed), core.memory) {
                    let values = memory.values();
                    for (i, v) in values.iter().enumerate() {
                        if let Some(v) = v {
                            self.per_core(acc, Source::CoreMemory(i), place, *v);
                        }
                    }
                    self.per_core(acc, Source::CoreMemoryTotal, place, values.iter().flatten().sum());
                }
            }
            if groups.contains(&RuntimeGroup::MemoryUsed) {
                if let Some(bytes) = rt.memory_used.and_then(|m| m[1]) {
                    *device_memory.get_or_insert(0.0) += bytes;
                }
            }
            if groups.contains(&RuntimeGroup::ExecutionStats) {
                if let Some(totals) = &rt.errors_total {
                    // Every error type the reports carried, a newer release's too.
                    let delta: f64 =
                        increases(&mut self.errors_seen, tag, totals, emit_counts).iter().map(|d| d.1).sum();
                    *errors.get_or_insert(0.0) += delta;
                }
                latencies.extend(rt.latency.as_ref().and_then(|l| l.get("p50")));
            }
        }
        self.errors_seen.retain(|tag, _| seen_tags.contains(&tag.as_str()));

        // Cores no runtime uses: 0 % for the pod that holds them, or for the node.
        for core in &state.idle_cores {
            let pod = core.pod.as_deref();
            if self.selection.takes_untagged(pod.map(|p| p.namespace.as_str()), RuntimeGroup::NeuroncoreCounters) {
                let place =
                    Place { instance, pod, core: Some(core.index), device: device_of(core.index), gpu_device: None };
                self.per_core(acc, Source::Utilization, place, 0.0);
            }
        }

        if self.sees_node {
            let mut node_value = |source: Source, value: Value| self.emit(acc, Family::Node, source, node, value);
            if let Some(e) = errors {
                node_value(Source::ExecutionErrors, Value::Count(e));
            }
            if let Some(bytes) = device_memory {
                node_value(Source::DeviceMemory, Value::Gauge(bytes));
            }
            for p50 in latencies {
                node_value(Source::LatencyP50, Value::Gauge(p50));
            }
            if let Some(cores) = state.allocation.as_ref().map(|a| a.cores) {
                for capacity in Capacity::ALL {
                    if let Some(value) = capacity.value(cores.allocatable, cores.allocated) {
                        node_value(Source::Capacity(capacity), Value::Gauge(value));
                    }
                }
            }
        }
        if self.node_level {
            self.sample_ecc(state, acc, emit_counts, &device_of);
        }
        self.sample_pod_capacity(state, acc);
    }

    /// The cores allocated to each pod this route sees.
    fn sample_pod_capacity(&self, state: &NodeState, acc: &mut Accumulator) {
        let Some(allocation) = &state.allocation else { return };
        let instance = &*state.instance;
        for PodCores { pod, allocated, .. } in &allocation.pods {
            if self.route.namespace.as_ref().is_some_and(|ns| *ns != pod.namespace) {
                continue;
            }
            let place = Place { instance, pod: Some(pod), core: None, device: None, gpu_device: None };
            for capacity in PodCapacity::ALL {
                if let Some(value) = capacity.value(*allocated, allocation.cores.allocatable) {
                    self.emit(acc, Family::Pod, Source::PodCapacity(capacity), place, Value::Gauge(value));
                }
            }
        }
    }

    /// ECC events per device (summed over the four types), for the node and for each pod
    /// and container holding a core of the device.
    fn sample_ecc(
        &mut self,
        state: &NodeState,
        acc: &mut Accumulator,
        emit_counts: bool,
        device_of: &dyn Fn(u32) -> Option<u32>,
    ) {
        // Who holds each device: the pods of the runtimes and of the idle cores on it.
        let mut holders: BTreeMap<u32, Vec<&PodRef>> = BTreeMap::new();
        let held = state.runtimes.iter().flat_map(|rt| rt.cores.iter().map(|c| (c.index, rt.labels.pod.as_deref())));
        let idle = state.idle_cores.iter().map(|c| (c.index, c.pod.as_deref()));
        for (core, pod) in held.chain(idle) {
            if let (Some(device), Some(pod)) = (device_of(core), pod) {
                let pods = holders.entry(device).or_default();
                if !pods.contains(&pod) {
                    pods.push(pod);
                }
            }
        }
        let instance = &*state.instance;
        for (device, totals) in &state.system.ecc_totals {
            let previous = self.ecc_seen.insert(*device, *totals);
            let delta: f64 =
                totals.iter().enumerate().map(|(i, t)| increase(previous.map(|p| p[i]), *t, emit_counts)).sum();
            let place = Place { instance, pod: None, core: None, device: Some(*device), gpu_device: None };
            self.emit(acc, Family::Node, Source::EccEvents, place, Value::Count(delta));
            let pods = holders.get(device).map(Vec::as_slice).unwrap_or_default();
            for (i, pod) in pods.iter().enumerate() {
                let place = Place { pod: Some(pod), ..place };
                // One pod series per pod, however many of its containers hold the device.
                if !pods[..i].iter().any(|p| p.namespace == pod.namespace && p.pod == pod.pod) {
                    self.emit(acc, Family::Pod, Source::EccEvents, place, Value::Count(delta));
                }
                if !pod.container.is_empty() {
                    self.emit(acc, Family::Container, Source::EccEvents, place, Value::Count(delta));
                }
            }
        }
    }

    /// A per-core gauge: for the node (a route that sees it), the pod and the container.
    fn per_core(&self, acc: &mut Accumulator, source: Source, place: Place<'_>, value: f64) {
        if self.sees_node {
            self.emit(acc, Family::Node, source, place, Value::Gauge(value));
        }
        if let Some(pod) = place.pod {
            self.emit(acc, Family::Pod, source, place, Value::Gauge(value));
            // A process known to be in the pod but not in which container: no container series.
            if !pod.container.is_empty() {
                self.emit(acc, Family::Container, source, place, Value::Gauge(value));
            }
        }
    }

    /// One value under every set of the family's metric whose dimensions all have a value.
    pub(super) fn emit(&self, acc: &mut Accumulator, family: Family, source: Source, place: Place<'_>, value: Value) {
        let Some(metric) = metric_of(family, source) else { return };
        for set in metric.dimension_sets() {
            let dimensions: Option<Vec<(&'static str, String)>> =
                set.iter().map(|d| self.insights_value(*d, &place).map(|v| (d.name(), truncate(v, 1024)))).collect();
            let Some(mut dimensions) = dimensions else { continue };
            dimensions.truncate(MAX_DIMENSIONS);
            let key = MetricKey { name: metric.name, dimensions };
            match value {
                Value::Gauge(v) => acc.gauge(key, metric.unit, v),
                Value::Count(v) => acc.count(key, v),
            }
        }
    }

    /// A dimension's value for a place; `None`: unknown (CloudWatch refuses empty values).
    fn insights_value(&self, d: Dimension, p: &Place<'_>) -> Option<String> {
        let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        match d {
            Dimension::ClusterName => self.cluster_name.clone(),
            Dimension::NodeName => self.node_name.clone(),
            Dimension::InstanceId => text(&p.instance.instance_id),
            Dimension::InstanceType => text(&p.instance.instance_type),
            Dimension::Namespace => p.pod.and_then(|x| text(&x.namespace)),
            Dimension::PodName => p.pod.and_then(|x| text(&x.owner).or_else(|| text(&x.pod))),
            Dimension::FullPodName => p.pod.and_then(|x| text(&x.pod)),
            Dimension::ContainerName => p.pod.and_then(|x| text(&x.container)),
            Dimension::NeuronDevice => p.device.map(device_value),
            Dimension::NeuronCore => p.core.map(core_value),
            Dimension::GpuDevice => p.gpu_device.and_then(text),
        }
    }
}
