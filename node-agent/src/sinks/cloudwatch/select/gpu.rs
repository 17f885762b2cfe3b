//! NVIDIA GPUs in a sink: the GPUs of each collection that the route sees
//! ([`holdings`]: a team's route the GPUs its pods hold, the operator namespace's every
//! GPU), in the sink's naming (the catalogue: `api::cloudwatch::catalogue::{gpu, insights}`).
//!
//! Classic: the CloudWatch agent's `nvidia_smi_*` metrics, one series per GPU (and pod
//! holding it) under `index`, `name` and `host`, plus what of each of the sink's dimension
//! sets applies to a GPU (cluster, node, instance, the pod), without a unit.
//!
//! Container Insights: `node_gpu_*` for every GPU (the route that sees the node),
//! `pod_gpu_*` and `container_gpu_*` for the GPUs pods hold: a pod once per GPU however
//! many of its containers or replicas hold it; a GPU shared by pods gives each the whole
//! GPU's values, as dcgm-exporter does.

use std::sync::Arc;

use api::cloudwatch::catalogue::{
    applies, dimension_name,
    gpu::{GpuValue, CLASSIC_DIMENSIONS, CLASSIC_UNIT},
    insights::{Family, Source, GPU_METRICS},
    Level,
};

use super::{
    insights::{Place, Value},
    truncate, Origin, View,
};
use crate::{
    gpu::{holdings, GpuHolders, GpuSnapshot, GpuValues, Holding},
    series::Scope,
    sinks::cloudwatch::datum::{Accumulator, MetricKey, MAX_DIMENSIONS},
    state::InstanceLabels,
};

/// One GPU collection, as every sink samples it.
pub struct GpuSample<'a> {
    pub snapshot: &'a GpuSnapshot,
    pub holders: &'a GpuHolders,
    /// `host` of the classic naming.
    pub hostname: &'a str,
    pub instance: &'a Arc<InstanceLabels>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// The value a GPU metric carries, in the catalogue's unit; `None`: not read.
pub fn value_of(value: GpuValue, g: &GpuValues) -> Option<f64> {
    let mib = |bytes: Option<u64>| bytes.map(|b| (b as f64 / MIB).floor());
    let num = |v: Option<u32>| v.map(f64::from);
    match value {
        GpuValue::Utilization => num(g.utilization_gpu),
        GpuValue::MemoryBandwidthUtilization => num(g.utilization_memory),
        GpuValue::MemoryUsedPercent => g.memory_used_percent(),
        GpuValue::Temperature => num(g.temperature_gpu_c),
        GpuValue::PowerDraw => g.power_watts,
        GpuValue::MemoryTotalBytes => g.memory_total_bytes.map(|b| b as f64),
        GpuValue::MemoryUsedBytes => g.memory_used_bytes.map(|b| b as f64),
        GpuValue::MemoryTotalMib => mib(g.memory_total_bytes),
        GpuValue::MemoryUsedMib => mib(g.memory_used_bytes),
        GpuValue::MemoryFreeMib => mib(g.memory_free_bytes),
        GpuValue::PcieLinkGen => num(g.pcie_link_gen),
        GpuValue::PcieLinkWidth => num(g.pcie_link_width),
        GpuValue::GraphicsClock => num(g.graphics_clock_mhz),
        GpuValue::SmClock => num(g.sm_clock_mhz),
        GpuValue::MemoryClock => num(g.memory_clock_mhz),
    }
}

impl View {
    /// Takes one sample of the GPUs this route sees into `acc`.
    pub fn sample_gpus(&self, sample: &GpuSample<'_>, acc: &mut Accumulator) {
        let held = holdings(sample.snapshot, sample.holders, Scope::Route(&self.route, &self.selection));
        match self.naming {
            api::crd::CloudWatchNaming::Classic => self.sample_gpus_classic(&held, sample, acc),
            api::crd::CloudWatchNaming::ContainerInsights => self.sample_gpus_insights(&held, sample.instance, acc),
        }
    }

    fn sample_gpus_classic(&self, held: &[Holding<'_>], sample: &GpuSample<'_>, acc: &mut Accumulator) {
        if self.gpu_metrics.is_empty() {
            return;
        }
        for h in held {
            let id = &h.gpu.identity;
            let own = [Some(id.index.to_string()), nonempty(&id.model), nonempty(sample.hostname)];
            let origin = Origin {
                instance: sample.instance,
                runtime_tag: None,
                pod: h.pod,
                ecs: None,
                core: None,
                device: None,
            };
            for set in &self.dimension_sets {
                let mut dimensions: Vec<(&'static str, String)> =
                    CLASSIC_DIMENSIONS.iter().zip(&own).filter_map(|(n, v)| Some((*n, v.clone()?))).collect();
                for d in set.iter().copied().filter(|d| applies(*d, Level::Gpu)) {
                    if let Some(v) = self.dimension_value(d, origin) {
                        dimensions.push((dimension_name(d), v));
                    }
                }
                dimensions.truncate(MAX_DIMENSIONS);
                for m in self.gpu_metrics {
                    if let Some(v) = value_of(m.value, &h.gpu.values) {
                        acc.gauge(MetricKey { name: m.name, dimensions: dimensions.clone() }, CLASSIC_UNIT, v);
                    }
                }
            }
        }
    }

    fn sample_gpus_insights(&self, held: &[Holding<'_>], instance: &InstanceLabels, acc: &mut Accumulator) {
        for (i, h) in held.iter().enumerate() {
            let earlier = &held[..i];
            let same_gpu = |o: &&Holding<'_>| std::ptr::eq(o.gpu, h.gpu);
            let place = Place {
                instance,
                pod: h.pod,
                core: None,
                device: None,
                gpu_device: Some(h.gpu.identity.device.as_str()),
            };
            // The node's series: each GPU once.
            if self.sees_node && !earlier.iter().any(|o| same_gpu(&o)) {
                self.gpu_family(acc, Family::Node, Place { pod: None, ..place }, &h.gpu.values);
            }
            let Some(pod) = h.pod else { continue };
            let same_pod = |o: &Holding<'_>| o.pod.is_some_and(|p| p.namespace == pod.namespace && p.pod == pod.pod);
            if !earlier.iter().filter(same_gpu).any(&same_pod) {
                self.gpu_family(acc, Family::Pod, place, &h.gpu.values);
            }
            let same_container = |o: &Holding<'_>| same_pod(o) && o.pod.is_some_and(|p| p.container == pod.container);
            // A pod whose container is not known has no container series.
            if !pod.container.is_empty() && !earlier.iter().filter(same_gpu).any(same_container) {
                self.gpu_family(acc, Family::Container, place, &h.gpu.values);
            }
        }
    }

    /// Every GPU metric of a family, of one GPU.
    fn gpu_family(&self, acc: &mut Accumulator, family: Family, place: Place<'_>, values: &GpuValues) {
        for m in GPU_METRICS.iter().filter(|m| m.family == family) {
            let Source::Gpu(value) = m.source else { continue };
            if let Some(v) = value_of(value, values) {
                self.emit(acc, family, m.source, place, Value::Gauge(v));
            }
        }
    }
}

/// A dimension value, or `None` when empty (CloudWatch refuses empty values).
fn nonempty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| truncate(text.to_owned(), 1024))
}

#[cfg(test)]
mod tests;
