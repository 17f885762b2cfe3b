//! What a CloudWatch sink publishes, metric by metric: names, units, the level each
//! value belongs to, the split dimension of each metric, and the dimension sets, for each
//! naming: the classic one here, Container Insights' in [`insights`]. The node agent
//! builds its datums from this catalogue; the cost estimate counts from it. NVIDIA GPUs:
//! the classic names in [`gpu`], the Container Insights ones in [`insights`].

pub mod gpu;
pub mod insights;

use std::collections::BTreeSet;

use crate::{
    crd::{
        CloudWatchMetric, CloudWatchNaming, CloudWatchSinkSpec, Dimension, NeuronMonitorConfigSpec, CLOUDWATCH_METRICS,
    },
    monitor_config::{RuntimeGroup, SystemGroup},
};

/// What a datum's value measures, as CloudWatch names the unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Percent,
    Bytes,
    Seconds,
    Count,
    /// No unit: what the CloudWatch agent sends for its GPU metrics, and Container
    /// Insights for GPU temperature and power (CloudWatch's unit `None`).
    NoUnit,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Percent => "Percent",
            Unit::Bytes => "Bytes",
            Unit::Seconds => "Seconds",
            Unit::Count => "Count",
            Unit::NoUnit => "None",
        }
    }
}

/// The entity one series of a metric belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// One series per core an application holds (NeuronCore, NeuronDevice apply).
    Core,
    /// One series per application and device it uses (NeuronDevice applies).
    RuntimeDevice,
    /// One series per application (neither NeuronCore nor NeuronDevice applies).
    Runtime,
    /// One series per device of the node, no application (node-level configs only).
    NodeDevice,
    /// One series per node (node-level configs only).
    Node,
    /// One series per pod (each config, of the pods it sees; no application).
    Pod,
    /// One series per NVIDIA GPU (and pod holding it, where the set names the pod).
    Gpu,
}

/// How one CloudWatch metric is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricShape {
    pub metric: CloudWatchMetric,
    /// The name CloudWatch users of Neuron already see (Container Insights).
    pub name: &'static str,
    pub unit: Unit,
    pub level: Level,
    /// A dimension of the metric itself and the values it takes, e.g. `ErrorType`.
    pub split: Option<(&'static str, &'static [&'static str])>,
    /// The metric group it is read from; `None`: the system group below.
    pub runtime_group: Option<RuntimeGroup>,
    /// `None` with no runtime group either: no neuron-monitor group (the agent's own
    /// account of the node), for configs that see the node-level series.
    pub system_group: Option<SystemGroup>,
    /// Sent only where the config's `metrics` lists it, not by default.
    pub opt_in: bool,
}

pub const ERROR_TYPES: [&str; 6] = ["generic", "numerical", "transient", "model", "runtime", "hardware"];
pub const STATUS_TYPES: [&str; 6] =
    ["completed", "completed_with_err", "completed_with_num_err", "timed_out", "incorrect_input", "failed_to_queue"];
/// The latency percentiles published (of the 7 neuron-monitor reports): the median and the
/// tail. Each one is a metric of its own, so each costs as much as any other metric.
pub const LATENCY_PERCENTILES: [&str; 2] = ["p50", "p99"];
pub const ECC_EVENT_TYPES: [&str; 4] =
    ["mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected"];
/// The allocation states of the node's cores: the values of `state` on `/metrics`
/// (`neuron_node_neuroncores`, `neuron_device_neuroncores`) and of the classic `State`.
pub const ALLOCATION_STATES: [&str; 3] = ["allocatable", "allocated", "allocated_idle"];
/// The states a pod's cores are counted in (a pod holds no allocatable core).
pub const POD_ALLOCATION_STATES: [&str; 2] = [ALLOCATION_STATES[1], ALLOCATION_STATES[2]];

const fn shape(
    metric: CloudWatchMetric,
    name: &'static str,
    unit: Unit,
    level: Level,
    split: Option<(&'static str, &'static [&'static str])>,
    runtime_group: Option<RuntimeGroup>,
) -> MetricShape {
    let system_group = if runtime_group.is_none() { Some(SystemGroup::NeuronHwCounters) } else { None };
    MetricShape { metric, name, unit, level, split, runtime_group, system_group, opt_in: false }
}

/// Every metric a sink can publish, in a fixed order.
pub const CATALOGUE: [MetricShape; CLOUDWATCH_METRICS] = {
    use CloudWatchMetric as M;
    use Level::*;
    use Unit::*;
    let counters = Some(RuntimeGroup::NeuroncoreCounters);
    let memory = Some(RuntimeGroup::MemoryUsed);
    let stats = Some(RuntimeGroup::ExecutionStats);
    [
        shape(M::NeuroncoreUtilization, "neuroncore_utilization", Percent, Core, None, counters),
        shape(M::NeuroncoreMemoryUsageConstants, "neuroncore_memory_usage_constants", Bytes, Core, None, memory),
        shape(M::NeuroncoreMemoryUsageModelCode, "neuroncore_memory_usage_model_code", Bytes, Core, None, memory),
        shape(
            M::NeuroncoreMemoryUsageModelSharedScratchpad,
            "neuroncore_memory_usage_model_shared_scratchpad",
            Bytes,
            Core,
            None,
            memory,
        ),
        shape(
            M::NeuroncoreMemoryUsageRuntimeMemory,
            "neuroncore_memory_usage_runtime_memory",
            Bytes,
            Core,
            None,
            memory,
        ),
        shape(M::NeuroncoreMemoryUsageTensors, "neuroncore_memory_usage_tensors", Bytes, Core, None, memory),
        shape(
            M::NeurondeviceRuntimeMemoryUsedBytes,
            "neurondevice_runtime_memory_used_bytes",
            Bytes,
            RuntimeDevice,
            None,
            memory,
        ),
        shape(
            M::NeuronExecutionErrors,
            "neuron_execution_errors",
            Count,
            Runtime,
            Some(("ErrorType", &ERROR_TYPES)),
            stats,
        ),
        shape(
            M::NeuronExecutionStatus,
            "neuron_execution_status",
            Count,
            Runtime,
            Some(("StatusType", &STATUS_TYPES)),
            stats,
        ),
        shape(
            M::NeuronExecutionLatency,
            "neuron_execution_latency",
            Seconds,
            Runtime,
            Some(("Percentile", &LATENCY_PERCENTILES)),
            stats,
        ),
        shape(
            M::NeurondeviceHwEccEvents,
            "neurondevice_hw_ecc_events",
            Count,
            NodeDevice,
            Some(("EventType", &ECC_EVENT_TYPES)),
            None,
        ),
        shape(M::NeurondeviceUnhealthy, "neurondevice_unhealthy", Count, NodeDevice, None, None),
        MetricShape {
            metric: M::NeuronNodeNeuroncores,
            name: "neuron_node_neuroncores",
            unit: Count,
            level: Node,
            split: Some(("State", &ALLOCATION_STATES)),
            runtime_group: None,
            system_group: None,
            opt_in: false,
        },
        MetricShape {
            metric: M::NeuronPodNeuroncores,
            name: "neuron_pod_neuroncores",
            unit: Count,
            level: Pod,
            split: Some(("State", &POD_ALLOCATION_STATES)),
            runtime_group: None,
            system_group: None,
            opt_in: true,
        },
    ]
};

/// The shape of one metric.
pub fn shape_of(metric: CloudWatchMetric) -> &'static MetricShape {
    // Every variant is in the catalogue (a unit test checks it); the fallback is never used.
    CATALOGUE.iter().find(|s| s.metric == metric).unwrap_or(&CATALOGUE[0])
}

/// The dimensions when the spec names none (the doc of `CloudWatchSinkSpec::dimensions`).
pub const DEFAULT_DIMENSIONS: [Dimension; 7] = [
    Dimension::ClusterName,
    Dimension::NodeName,
    Dimension::NeuronCore,
    Dimension::NeuronDevice,
    Dimension::Namespace,
    Dimension::PodName,
    Dimension::ContainerName,
];

/// CloudWatch's dimension name of a [`Dimension`].
pub fn dimension_name(d: Dimension) -> &'static str {
    match d {
        Dimension::ClusterName => "ClusterName",
        Dimension::NodeName => "NodeName",
        Dimension::InstanceId => "InstanceId",
        Dimension::InstanceType => "InstanceType",
        Dimension::AmiId => "AmiId",
        Dimension::AvailabilityZone => "AvailabilityZone",
        Dimension::NeuronCore => "NeuronCore",
        Dimension::NeuronDevice => "NeuronDevice",
        Dimension::RuntimeTag => "RuntimeTag",
        Dimension::Namespace => "Namespace",
        Dimension::PodName => "PodName",
        Dimension::ContainerName => "ContainerName",
        Dimension::TaskArn => "TaskArn",
        Dimension::TaskDefinitionFamily => "TaskDefinitionFamily",
    }
}

/// Whether a dimension applies to a metric of `level` (one that does not is left out of
/// that metric's datums, as a dimension without a value cannot be sent).
pub fn applies(d: Dimension, level: Level) -> bool {
    match d {
        Dimension::NeuronCore => level == Level::Core,
        Dimension::NeuronDevice => !matches!(level, Level::Runtime | Level::Gpu | Level::Node | Level::Pod),
        // A GPU is held by a pod, never by a Neuron application or an ECS task.
        Dimension::RuntimeTag | Dimension::TaskArn | Dimension::TaskDefinitionFamily => {
            !matches!(level, Level::NodeDevice | Level::Gpu | Level::Node | Level::Pod)
        }
        Dimension::Namespace | Dimension::PodName => !matches!(level, Level::NodeDevice | Level::Node),
        // A pod's cores are counted for the pod, not one of its containers.
        Dimension::ContainerName => !matches!(level, Level::NodeDevice | Level::Node | Level::Pod),
        _ => true,
    }
}

/// The naming of a sink's spec (`Classic` when unset).
pub fn naming_of(spec: &CloudWatchSinkSpec) -> CloudWatchNaming {
    spec.naming.unwrap_or_default()
}

/// The groups a config collects: (runtime groups, system groups).
pub(crate) fn collected_groups(
    spec: &NeuronMonitorConfigSpec,
    sees_node_level: bool,
) -> (BTreeSet<RuntimeGroup>, BTreeSet<SystemGroup>) {
    let runtime_groups: BTreeSet<RuntimeGroup> = match &spec.runtimes {
        // No `runtimes`: every application, every runtime group.
        None => RuntimeGroup::ALL.into_iter().collect(),
        Some(entries) => entries.iter().flat_map(|e| e.metrics.iter().map(|g| g.kind)).collect(),
    };
    // As the operator's validation decides: a config that sees the node-level groups
    // collects all of them unless it lists its own.
    let system_groups: BTreeSet<SystemGroup> = match &spec.system_metrics {
        _ if !sees_node_level => BTreeSet::new(),
        Some(system) => system.metrics.iter().map(|g| g.kind).collect(),
        None => SystemGroup::ALL.into_iter().collect(),
    };
    (runtime_groups, system_groups)
}

/// Whether a sink's allow-list `metrics` takes a metric: it lists it, or there is no list
/// and the metric is not opt-in.
pub fn allows(metrics: Option<&[CloudWatchMetric]>, shape: &MetricShape) -> bool {
    metrics.map_or(!shape.opt_in, |listed| listed.contains(&shape.metric))
}

/// The metrics a config publishes with the classic naming: its allow-list (default: all
/// but the opt-in ones) restricted to the groups it collects. ECC counters need the
/// node-level group, which only configs that see the node-level groups (those in the
/// operator's namespace) get; the allocation counts need no group: the node's only that
/// view, the pods' none (a team's config sends its own pods').
pub fn published_metrics(spec: &NeuronMonitorConfigSpec, sees_node_level: bool) -> Vec<&'static MetricShape> {
    let Some(cloudwatch) = spec.sinks.as_ref().and_then(|s| s.cloudwatch.as_ref()) else {
        return Vec::new();
    };
    let (runtime_groups, system_groups) = collected_groups(spec, sees_node_level);
    CATALOGUE
        .iter()
        .filter(|s| allows(cloudwatch.metrics.as_deref(), s))
        .filter(|s| match (s.runtime_group, s.system_group) {
            (Some(g), _) => runtime_groups.contains(&g),
            (None, Some(g)) => system_groups.contains(&g),
            (None, None) => sees_node_level || s.level == Level::Pod,
        })
        .collect()
}

/// The metrics a config publishes with the Container Insights naming: those of the groups
/// it collects, and the GPU metrics (on nodes with GPUs); the `node_` family only for a
/// config that sees the node (one in the operator's namespace), as a team's config sends
/// only its pods' series.
pub fn published_insights(spec: &NeuronMonitorConfigSpec, sees_node_level: bool) -> Vec<&'static insights::Metric> {
    if spec.sinks.as_ref().and_then(|s| s.cloudwatch.as_ref()).is_none() {
        return Vec::new();
    }
    let (runtime_groups, system_groups) = collected_groups(spec, sees_node_level);
    insights::METRICS
        .iter()
        .chain(&insights::GPU_METRICS)
        .filter(|m| sees_node_level || m.family != insights::Family::Node)
        .filter(|m| match (m.source, m.source.runtime_group(), m.source.system_group()) {
            (insights::Source::Gpu(_) | insights::Source::Capacity(_) | insights::Source::PodCapacity(_), _, _) => true,
            (_, Some(g), _) => runtime_groups.contains(&g),
            (_, None, Some(g)) => system_groups.contains(&g),
            (_, None, None) => false,
        })
        .collect()
}

/// The dimension sets a sink publishes under: the spec's set (or the default), then each
/// roll-up, each set once.
pub fn dimension_sets(dimensions: Option<&[Dimension]>, rollups: Option<&[Vec<Dimension>]>) -> Vec<Vec<Dimension>> {
    let mut sets: Vec<Vec<Dimension>> = Vec::new();
    let main: Vec<Dimension> = dimensions.map(<[Dimension]>::to_vec).unwrap_or_else(|| DEFAULT_DIMENSIONS.to_vec());
    for set in std::iter::once(main).chain(rollups.into_iter().flatten().cloned()) {
        let mut set = set;
        set.sort();
        set.dedup();
        if !sets.contains(&set) {
            sets.push(set);
        }
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_covers_every_metric_once() {
        let mut names: Vec<&str> = CATALOGUE.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOGUE.len());
        for s in &CATALOGUE {
            assert_eq!(shape_of(s.metric), s);
        }
    }

    /// The pods' counts: sent only where the allow-list names them, and then to a team's
    /// config too (of its own pods), which sees no node-level series.
    #[test]
    fn an_opt_in_metric_is_published_only_where_listed() {
        use crate::crd::SinksSpec;
        let spec = |metrics: Option<Vec<CloudWatchMetric>>| NeuronMonitorConfigSpec {
            sinks: Some(SinksSpec {
                cloudwatch: Some(CloudWatchSinkSpec { namespace: "Team/Neuron".into(), metrics, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let names = |spec: &NeuronMonitorConfigSpec, sees_node_level| -> Vec<&str> {
            published_metrics(spec, sees_node_level).iter().map(|s| s.name).collect()
        };
        for sees_node_level in [false, true] {
            assert!(!names(&spec(None), sees_node_level).contains(&"neuron_pod_neuroncores"));
        }
        let listed = spec(Some(vec![CloudWatchMetric::NeuronPodNeuroncores, CloudWatchMetric::NeuronNodeNeuroncores]));
        assert_eq!(names(&listed, false), ["neuron_pod_neuroncores"], "a team sees no node");
        assert_eq!(names(&listed, true), ["neuron_node_neuroncores", "neuron_pod_neuroncores"]);
    }
}
