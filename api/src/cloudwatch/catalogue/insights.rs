//! The Container Insights naming (`naming: ContainerInsights`): the Neuron metrics
//! CloudWatch's Container Insights publishes, with its names, units and dimension sets, so
//! a user's existing dashboards and alarms work on this agent's data. The facts come from
//! the CloudWatch agent's source (its Container Insights translator and Neuron processors),
//! which is what users' data looks like where the CloudWatch documentation differs.
//!
//! Three families with the same suffixes: `node_…` (the node's cores, devices and totals),
//! `pod_…` and `container_…` (copies of the per-core and per-device values for the pod and
//! container that hold the core or device). Every value is sent under every set of its
//! family and level whose dimensions all have a value: coarse sets are not pre-aggregated,
//! so `{ClusterName}`'s statistics are over per-core values, as Container Insights does.
//!
//! The node's NeuronCore capacity metrics (`node_neuroncore_limit`, `…_usage_total`,
//! `…_reserved_capacity`, `…_unreserved_capacity`, `…_available_capacity`) come from what
//! the kubelet says can be and is allocated (`neuron_node_neuroncores`), device plugin and
//! DRA alike, once it has said so. Left out, as the agent cannot know them: the sets with
//! `UltraServer` (neuron-monitor's `ultraserver_id` is not in the reports this agent reads)
//! and with `Service` (no watch of Services). The pods' capacity metrics
//! (`pod_neuroncore_request`, `…_limit`, `…_usage_total`, `…_reserved_capacity`) count the
//! cores allocated to each pod: an extended resource's request, limit and allocation are
//! one number, and a claim's devices have no request but their cores.
//!
//! Where the CloudWatch agent is wrong, the names stay and the values are right: each
//! core is credited to the pod that holds it (the agent copies one pod onto every core),
//! and node totals are the sums over every runtime (the agent keeps the first runtime's).
//!
//! NVIDIA GPUs ([`GPU_METRICS`]): the `node_gpu_*`, `pod_gpu_*` and `container_gpu_*`
//! metrics Container Insights makes of dcgm-exporter's fields, with its units and sets
//! (`GpuDevice` is the device node's name, `nvidia0`). A pod's and a container's series
//! exist for the GPUs they hold; a GPU time-sliced between pods gives each of them the
//! whole GPU's values, as dcgm-exporter does. Left out: `gpu_tensor_core_utilization`
//! (DCGM's profiling field `PIPE_TENSOR_ACTIVE`, which NVML does not give), the
//! `Service` sets (as above), and the resource counts (`node_gpu_limit`,
//! `pod_gpu_request`, `pod_gpu_limit`, `pod_gpu_usage_total`,
//! `pod_gpu_reserved_capacity`), which come from Kubernetes' resource accounting (pod
//! specs and node capacity) that the agent does not read.

use crate::monitor_config::{RuntimeGroup, SystemGroup};

use super::{gpu::GpuValue, Unit};

/// A family of names: what a value is credited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Node,
    Pod,
    Container,
}

/// What one series of a metric is per.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// One value per NeuronCore.
    Core,
    /// One value per Neuron device.
    Device,
    /// One value per node (node family only).
    Node,
    /// One value per pod (pod family only).
    Pod,
    /// One value per NVIDIA GPU (and pod or container holding it).
    Gpu,
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `neuroncore_utilization_ratio` × 100.
    Utilization,
    /// One of the five memory categories, in the order of [`crate::report::CoreMemory::values`].
    CoreMemory(usize),
    /// The sum of the five categories.
    CoreMemoryTotal,
    /// `hardware_ecc_events_total` summed over the four event types; a delta.
    EccEvents,
    /// `execution_errors_total` summed over error types and runtimes; a delta.
    ExecutionErrors,
    /// `neuron_runtime_memory_used_bytes{memory_location="neuron_device"}`, summed over runtimes.
    DeviceMemory,
    /// `execution_latency_seconds{percentile="p50"}`.
    LatencyP50,
    /// A value of an NVIDIA GPU.
    Gpu(GpuValue),
    /// A count of the node's NeuronCores by allocation (`neuron_node_neuroncores`).
    Capacity(Capacity),
    /// The NeuronCores allocated to one pod.
    PodCapacity(PodCapacity),
}

/// What Container Insights' pod NeuronCore capacity metrics say of the cores allocated to
/// a pod: an extended resource's request is its limit, and what is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodCapacity {
    Request,
    Limit,
    UsageTotal,
    /// The pod's cores over the node's allocatable ones, percent.
    ReservedCapacity,
}

impl PodCapacity {
    pub const ALL: [PodCapacity; 4] =
        [PodCapacity::Request, PodCapacity::Limit, PodCapacity::UsageTotal, PodCapacity::ReservedCapacity];

    /// The value from the pod's `held` cores and the node's `allocatable` ones; `None`: a
    /// share of no allocatable core.
    pub fn value(self, held: u32, allocatable: u32) -> Option<f64> {
        match self {
            PodCapacity::Request | PodCapacity::Limit | PodCapacity::UsageTotal => Some(f64::from(held)),
            PodCapacity::ReservedCapacity => {
                (allocatable > 0).then(|| (f64::from(held) / f64::from(allocatable) * 100.0).min(100.0))
            }
        }
    }
}

/// What Container Insights' NeuronCore capacity metrics say of the node's allocatable and
/// allocated cores (what its resource accounting of `aws.amazon.com/neuroncore` gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// Allocatable cores.
    Limit,
    /// Allocated cores.
    UsageTotal,
    /// Allocated over allocatable, percent.
    ReservedCapacity,
    /// The rest, percent.
    UnreservedCapacity,
    /// Allocatable and not allocated cores.
    AvailableCapacity,
}

impl Capacity {
    pub const ALL: [Capacity; 5] = [
        Capacity::Limit,
        Capacity::UsageTotal,
        Capacity::ReservedCapacity,
        Capacity::UnreservedCapacity,
        Capacity::AvailableCapacity,
    ];

    /// The value from the node's `allocatable` and `allocated` cores; `None`: a share of
    /// no allocatable core.
    pub fn value(self, allocatable: u32, allocated: u32) -> Option<f64> {
        let (allocatable, allocated) = (f64::from(allocatable), f64::from(allocated));
        let share = (allocatable > 0.0).then(|| (allocated / allocatable * 100.0).min(100.0));
        match self {
            Capacity::Limit => Some(allocatable),
            Capacity::UsageTotal => Some(allocated),
            Capacity::ReservedCapacity => share,
            Capacity::UnreservedCapacity => share.map(|s| 100.0 - s),
            Capacity::AvailableCapacity => Some((allocatable - allocated).max(0.0)),
        }
    }
}

impl Source {
    /// Sent as the number of events since the previous sample (a Count), not a gauge.
    pub fn is_delta(self) -> bool {
        matches!(self, Source::EccEvents | Source::ExecutionErrors)
    }

    /// The runtime group the value is read from; `None`: the node-level ECC counters.
    pub fn runtime_group(self) -> Option<RuntimeGroup> {
        match self {
            Source::Utilization => Some(RuntimeGroup::NeuroncoreCounters),
            Source::CoreMemory(_) | Source::CoreMemoryTotal | Source::DeviceMemory => Some(RuntimeGroup::MemoryUsed),
            Source::ExecutionErrors | Source::LatencyP50 => Some(RuntimeGroup::ExecutionStats),
            Source::EccEvents | Source::Gpu(_) | Source::Capacity(_) | Source::PodCapacity(_) => None,
        }
    }

    pub fn system_group(self) -> Option<SystemGroup> {
        match self {
            Source::EccEvents => Some(SystemGroup::NeuronHwCounters),
            _ => None,
        }
    }
}

/// A Container Insights dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    ClusterName,
    InstanceId,
    InstanceType,
    NodeName,
    Namespace,
    /// The pod's owner: the Deployment, DaemonSet, CronJob (else the Job name's first
    /// word); StatefulSet and ownerless pods their own name.
    PodName,
    /// The pod's own name.
    FullPodName,
    ContainerName,
    /// `device<M>`.
    NeuronDevice,
    /// `core<N>`.
    NeuronCore,
    /// An NVIDIA GPU's device node name, `nvidia<minor>` (dcgm-exporter's `device`).
    GpuDevice,
}

impl Dimension {
    pub fn name(self) -> &'static str {
        match self {
            Dimension::ClusterName => "ClusterName",
            Dimension::InstanceId => "InstanceId",
            Dimension::InstanceType => "InstanceType",
            Dimension::NodeName => "NodeName",
            Dimension::Namespace => "Namespace",
            Dimension::PodName => "PodName",
            Dimension::FullPodName => "FullPodName",
            Dimension::ContainerName => "ContainerName",
            Dimension::NeuronDevice => "NeuronDevice",
            Dimension::NeuronCore => "NeuronCore",
            Dimension::GpuDevice => "GpuDevice",
        }
    }
}

/// `NeuronCore`'s value: `core0`, not `0`.
pub fn core_value(core: u32) -> String {
    format!("core{core}")
}

/// `NeuronDevice`'s value: `device0`.
pub fn device_value(device: u32) -> String {
    format!("device{device}")
}

/// One Container Insights metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub family: Family,
    pub unit: Unit,
    pub level: Level,
    pub source: Source,
}

impl Metric {
    /// The dimension sets every value of this metric is sent under (those whose
    /// dimensions all have a value).
    pub fn dimension_sets(&self) -> &'static [&'static [Dimension]] {
        dimension_sets(self.family, self.level)
    }
}

/// The dimension sets of a family and level, in Container Insights' order, without the
/// `UltraServer` and `Service` sets (see the module doc).
pub fn dimension_sets(family: Family, level: Level) -> &'static [&'static [Dimension]] {
    use Dimension::*;
    match (family, level) {
        (Family::Node, Level::Core) => &[
            &[ClusterName],
            &[ClusterName, InstanceId, NodeName],
            &[ClusterName, InstanceType, InstanceId, NodeName, NeuronDevice, NeuronCore],
        ],
        (Family::Node, Level::Device) => {
            &[&[ClusterName], &[ClusterName, InstanceId, NodeName], &[ClusterName, InstanceId, NodeName, NeuronDevice]]
        }
        (Family::Node, Level::Node) => &[&[ClusterName], &[ClusterName, InstanceId, NodeName]],
        (Family::Pod, Level::Core) => &[
            &[ClusterName],
            &[ClusterName, Namespace],
            &[ClusterName, Namespace, PodName],
            &[ClusterName, Namespace, PodName, FullPodName],
            &[ClusterName, Namespace, PodName, FullPodName, NeuronDevice, NeuronCore],
        ],
        (Family::Pod, Level::Device) => &[
            &[ClusterName],
            &[ClusterName, Namespace],
            &[ClusterName, Namespace, PodName],
            &[ClusterName, Namespace, PodName, FullPodName],
            &[ClusterName, Namespace, PodName, FullPodName, NeuronDevice],
        ],
        (Family::Container, Level::Core) => &[
            &[ClusterName],
            &[ClusterName, Namespace, PodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName, NeuronDevice, NeuronCore],
        ],
        (Family::Container, Level::Device) => &[
            &[ClusterName],
            &[ClusterName, Namespace, PodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName, NeuronDevice],
        ],
        (Family::Node, Level::Gpu) => &[
            &[ClusterName],
            &[ClusterName, NodeName, InstanceId],
            &[ClusterName, NodeName, InstanceId, InstanceType, GpuDevice],
        ],
        (Family::Pod, Level::Gpu) => &[
            &[ClusterName],
            &[ClusterName, Namespace],
            &[ClusterName, Namespace, PodName],
            &[ClusterName, Namespace, PodName, FullPodName],
            &[ClusterName, Namespace, PodName, FullPodName, GpuDevice],
        ],
        (Family::Container, Level::Gpu) => &[
            &[ClusterName],
            &[ClusterName, Namespace, PodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName],
            &[ClusterName, Namespace, PodName, FullPodName, ContainerName, GpuDevice],
        ],
        // Container Insights' pod sets without `Service` and the devices.
        (Family::Pod, Level::Pod) => &[
            &[ClusterName],
            &[ClusterName, Namespace],
            &[ClusterName, Namespace, PodName],
            &[ClusterName, Namespace, PodName, FullPodName],
        ],
        // Pods and containers have no node-level values, nodes and containers no pod-level ones.
        (Family::Pod | Family::Container, Level::Node) | (Family::Node | Family::Container, Level::Pod) => &[],
    }
}

const fn metric(name: &'static str, family: Family, unit: Unit, level: Level, source: Source) -> Metric {
    Metric { name, family, unit, level, source }
}

/// The per-core and per-device metrics, once per family.
macro_rules! per_core_and_device {
    ($family:expr, $prefix:literal) => {
        [
            metric(
                concat!($prefix, "neuroncore_utilization"),
                $family,
                Unit::Percent,
                Level::Core,
                Source::Utilization,
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_constants"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemory(0),
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_model_code"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemory(1),
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_model_shared_scratchpad"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemory(2),
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_runtime_memory"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemory(3),
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_tensors"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemory(4),
            ),
            metric(
                concat!($prefix, "neuroncore_memory_usage_total"),
                $family,
                Unit::Bytes,
                Level::Core,
                Source::CoreMemoryTotal,
            ),
            metric(
                concat!($prefix, "neurondevice_hw_ecc_events_total"),
                $family,
                Unit::Count,
                Level::Device,
                Source::EccEvents,
            ),
        ]
    };
}

const NODE: [Metric; 8] = per_core_and_device!(Family::Node, "node_");
const POD: [Metric; 8] = per_core_and_device!(Family::Pod, "pod_");
const CONTAINER: [Metric; 8] = per_core_and_device!(Family::Container, "container_");
/// A node capacity metric.
const fn capacity(name: &'static str, unit: Unit, value: Capacity) -> Metric {
    metric(name, Family::Node, unit, Level::Node, Source::Capacity(value))
}

const NODE_ONLY: [Metric; 8] = {
    use Capacity::*;
    [
        metric("node_neuron_execution_errors_total", Family::Node, Unit::Count, Level::Node, Source::ExecutionErrors),
        metric(
            "node_neurondevice_runtime_memory_used_bytes",
            Family::Node,
            Unit::Bytes,
            Level::Node,
            Source::DeviceMemory,
        ),
        metric("node_neuron_execution_latency", Family::Node, Unit::Seconds, Level::Node, Source::LatencyP50),
        capacity("node_neuroncore_limit", Unit::Count, Limit),
        capacity("node_neuroncore_usage_total", Unit::Count, UsageTotal),
        capacity("node_neuroncore_reserved_capacity", Unit::Percent, ReservedCapacity),
        capacity("node_neuroncore_unreserved_capacity", Unit::Percent, UnreservedCapacity),
        capacity("node_neuroncore_available_capacity", Unit::Count, AvailableCapacity),
    ]
};

/// A pod capacity metric.
const fn pod_capacity(name: &'static str, unit: Unit, value: PodCapacity) -> Metric {
    metric(name, Family::Pod, unit, Level::Pod, Source::PodCapacity(value))
}

const POD_ONLY: [Metric; 4] = [
    pod_capacity("pod_neuroncore_request", Unit::Count, PodCapacity::Request),
    pod_capacity("pod_neuroncore_limit", Unit::Count, PodCapacity::Limit),
    pod_capacity("pod_neuroncore_usage_total", Unit::Count, PodCapacity::UsageTotal),
    pod_capacity("pod_neuroncore_reserved_capacity", Unit::Percent, PodCapacity::ReservedCapacity),
];

/// Every Container Insights metric, in a fixed order: node, pod, container.
pub const METRICS: [Metric; 36] = {
    let mut out = [NODE[0]; 36];
    let mut i = 0;
    while i < 8 {
        out[i] = NODE[i];
        out[8 + i] = NODE_ONLY[i];
        out[16 + i] = POD[i];
        out[28 + i] = CONTAINER[i];
        i += 1;
    }
    let mut j = 0;
    while j < 4 {
        out[24 + j] = POD_ONLY[j];
        j += 1;
    }
    out
};

/// The GPU metrics, once per family.
macro_rules! per_gpu {
    ($family:expr, $prefix:literal) => {
        [
            metric(
                concat!($prefix, "gpu_utilization"),
                $family,
                Unit::Percent,
                Level::Gpu,
                Source::Gpu(GpuValue::Utilization),
            ),
            metric(
                concat!($prefix, "gpu_memory_utilization"),
                $family,
                Unit::Percent,
                Level::Gpu,
                Source::Gpu(GpuValue::MemoryUsedPercent),
            ),
            metric(
                concat!($prefix, "gpu_memory_used"),
                $family,
                Unit::Bytes,
                Level::Gpu,
                Source::Gpu(GpuValue::MemoryUsedBytes),
            ),
            metric(
                concat!($prefix, "gpu_memory_total"),
                $family,
                Unit::Bytes,
                Level::Gpu,
                Source::Gpu(GpuValue::MemoryTotalBytes),
            ),
            metric(
                concat!($prefix, "gpu_temperature"),
                $family,
                Unit::NoUnit,
                Level::Gpu,
                Source::Gpu(GpuValue::Temperature),
            ),
            metric(
                concat!($prefix, "gpu_power_draw"),
                $family,
                Unit::NoUnit,
                Level::Gpu,
                Source::Gpu(GpuValue::PowerDraw),
            ),
        ]
    };
}

const GPU_NODE: [Metric; 6] = per_gpu!(Family::Node, "node_");
const GPU_POD: [Metric; 6] = per_gpu!(Family::Pod, "pod_");
const GPU_CONTAINER: [Metric; 6] = per_gpu!(Family::Container, "container_");

/// Every Container Insights GPU metric, in a fixed order: node, pod, container.
pub const GPU_METRICS: [Metric; 18] = {
    let mut out = [GPU_NODE[0]; 18];
    let mut i = 0;
    while i < 6 {
        out[i] = GPU_NODE[i];
        out[6 + i] = GPU_POD[i];
        out[12 + i] = GPU_CONTAINER[i];
        i += 1;
    }
    out
};

/// The metric of a family with this source (Neuron or GPU).
pub fn metric_of(family: Family, source: Source) -> Option<&'static Metric> {
    METRICS.iter().chain(&GPU_METRICS).find(|m| m.family == family && m.source == source)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn capacity_values_follow_the_allocatable_and_allocated_cores() {
        let values = |allocatable, allocated| Capacity::ALL.map(|c| c.value(allocatable, allocated));
        assert_eq!(values(32, 8), [Some(32.0), Some(8.0), Some(25.0), Some(75.0), Some(24.0)]);
        // No allocatable core: no share; more allocated than allocatable (a device gone
        // unhealthy under its pod): at most 100 %, nothing negative.
        assert_eq!(values(0, 0), [Some(0.0), Some(0.0), None, None, Some(0.0)]);
        assert_eq!(values(2, 4), [Some(2.0), Some(4.0), Some(100.0), Some(0.0), Some(0.0)]);
        let pod = |held, allocatable| PodCapacity::ALL.map(|c| c.value(held, allocatable));
        assert_eq!(pod(8, 32), [Some(8.0), Some(8.0), Some(8.0), Some(25.0)]);
        assert_eq!(pod(2, 0), [Some(2.0), Some(2.0), Some(2.0), None]);
    }

    /// The reference's list, written out: (name, unit, the dimension names of each set).
    #[test]
    fn names_units_and_sets_are_container_insights_own() {
        let names: BTreeSet<&str> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), 36, "each name once");
        for suffix in [
            "neuroncore_utilization",
            "neuroncore_memory_usage_constants",
            "neuroncore_memory_usage_model_code",
            "neuroncore_memory_usage_model_shared_scratchpad",
            "neuroncore_memory_usage_runtime_memory",
            "neuroncore_memory_usage_tensors",
            "neuroncore_memory_usage_total",
            "neurondevice_hw_ecc_events_total",
        ] {
            for prefix in ["node_", "pod_", "container_"] {
                assert!(names.contains(format!("{prefix}{suffix}").as_str()), "{prefix}{suffix}");
            }
        }
        for name in [
            "node_neuron_execution_errors_total",
            "node_neurondevice_runtime_memory_used_bytes",
            "node_neuron_execution_latency",
            "node_neuroncore_limit",
            "node_neuroncore_usage_total",
            "node_neuroncore_reserved_capacity",
            "node_neuroncore_unreserved_capacity",
            "node_neuroncore_available_capacity",
            "pod_neuroncore_request",
            "pod_neuroncore_limit",
            "pod_neuroncore_usage_total",
            "pod_neuroncore_reserved_capacity",
        ] {
            assert!(names.contains(name), "{name}");
        }

        let unit = |name: &str| METRICS.iter().find(|m| m.name == name).map(|m| m.unit);
        assert_eq!(unit("pod_neuroncore_utilization"), Some(Unit::Percent));
        assert_eq!(unit("container_neuroncore_memory_usage_total"), Some(Unit::Bytes));
        assert_eq!(unit("node_neurondevice_hw_ecc_events_total"), Some(Unit::Count));
        assert_eq!(unit("node_neuron_execution_errors_total"), Some(Unit::Count));
        assert_eq!(unit("node_neurondevice_runtime_memory_used_bytes"), Some(Unit::Bytes));
        assert_eq!(unit("node_neuron_execution_latency"), Some(Unit::Seconds));
        assert_eq!(unit("node_neuroncore_reserved_capacity"), Some(Unit::Percent));
        assert_eq!(unit("node_neuroncore_available_capacity"), Some(Unit::Count));

        let sets = |name: &str| -> Vec<Vec<&str>> {
            let m = METRICS.iter().find(|m| m.name == name).unwrap();
            m.dimension_sets().iter().map(|s| s.iter().map(|d| d.name()).collect()).collect()
        };
        assert_eq!(
            sets("node_neuroncore_utilization"),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "InstanceId", "NodeName"],
                vec!["ClusterName", "InstanceType", "InstanceId", "NodeName", "NeuronDevice", "NeuronCore"],
            ]
        );
        assert_eq!(
            sets("node_neurondevice_hw_ecc_events_total").last().unwrap(),
            &vec!["ClusterName", "InstanceId", "NodeName", "NeuronDevice"]
        );
        assert_eq!(sets("node_neuron_execution_latency").len(), 2);
        assert_eq!(
            sets("pod_neuroncore_memory_usage_tensors"),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "Namespace"],
                vec!["ClusterName", "Namespace", "PodName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "NeuronDevice", "NeuronCore"],
            ]
        );
        assert_eq!(
            sets("container_neurondevice_hw_ecc_events_total"),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "Namespace", "PodName", "ContainerName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "ContainerName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "ContainerName", "NeuronDevice"],
            ]
        );
        // Only the two summed counters are deltas.
        let deltas: BTreeSet<&str> = METRICS.iter().filter(|m| m.source.is_delta()).map(|m| m.name).collect();
        assert_eq!(deltas.len(), 4);
        assert!(deltas.iter().all(|n| n.ends_with("_total") && !n.contains("memory")));
        assert_eq!((core_value(0), device_value(15)), ("core0".to_owned(), "device15".to_owned()));
    }

    /// The reference's tables (Container Insights' DCGM field mapping and the dimension
    /// sets of its EMF exporter), written out, less the `Service` set and
    /// `gpu_tensor_core_utilization` (see the module doc).
    #[test]
    fn gpu_names_units_and_sets_are_container_insights_own() {
        let units = [
            ("gpu_utilization", Unit::Percent),
            ("gpu_memory_utilization", Unit::Percent),
            ("gpu_memory_used", Unit::Bytes),
            ("gpu_memory_total", Unit::Bytes),
            ("gpu_temperature", Unit::NoUnit),
            ("gpu_power_draw", Unit::NoUnit),
        ];
        let names: BTreeSet<&str> = GPU_METRICS.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), 18, "each name once");
        for (prefix, family) in [("node_", Family::Node), ("pod_", Family::Pod), ("container_", Family::Container)] {
            for (suffix, unit) in units {
                let name = format!("{prefix}{suffix}");
                let m = GPU_METRICS.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("{name}"));
                assert_eq!((m.unit, m.family, m.level), (unit, family, Level::Gpu), "{name}");
                assert_eq!(metric_of(family, m.source), Some(m), "{name}");
            }
        }
        assert!(!names.iter().any(|n| n.contains("tensor_core")));
        let source = |name: &str| GPU_METRICS.iter().find(|m| m.name == name).map(|m| m.source);
        // DCGM's FB_USED_PERCENT, not NVML's memory-bandwidth utilization.
        assert_eq!(source("node_gpu_memory_utilization"), Some(Source::Gpu(GpuValue::MemoryUsedPercent)));
        assert_eq!(source("pod_gpu_memory_used"), Some(Source::Gpu(GpuValue::MemoryUsedBytes)));

        let sets = |family: Family| -> Vec<Vec<&str>> {
            dimension_sets(family, Level::Gpu).iter().map(|s| s.iter().map(|d| d.name()).collect()).collect()
        };
        assert_eq!(
            sets(Family::Node),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "NodeName", "InstanceId"],
                vec!["ClusterName", "NodeName", "InstanceId", "InstanceType", "GpuDevice"],
            ]
        );
        assert_eq!(
            sets(Family::Pod),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "Namespace"],
                vec!["ClusterName", "Namespace", "PodName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "GpuDevice"],
            ]
        );
        assert_eq!(
            sets(Family::Container),
            vec![
                vec!["ClusterName"],
                vec!["ClusterName", "Namespace", "PodName", "ContainerName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "ContainerName"],
                vec!["ClusterName", "Namespace", "PodName", "FullPodName", "ContainerName", "GpuDevice"],
            ]
        );
        // GPU values are gauges, read by no Neuron group.
        assert!(GPU_METRICS.iter().all(|m| !m.source.is_delta() && m.source.runtime_group().is_none()));
        assert!(GPU_METRICS.iter().all(|m| m.source.system_group().is_none()));
    }
}
