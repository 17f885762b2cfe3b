//! What a CloudWatch sink publishes, metric by metric, and what that costs: the catalogue
//! the node agent builds its datums from, and the estimate the operator writes to
//! `status.estimatedCloudWatchMetrics` / `status.estimatedMonthlyCostUsd`. Pure: no I/O.
//!
//! # The estimate
//! CloudWatch bills a custom metric (one name + one set of dimension values in one
//! namespace) per month, prorated by the hour, whether it gets one datum or thousands.
//! So the estimate counts the distinct (name, dimension values) combinations a config
//! creates across its matched nodes:
//!
//! ```text
//! metrics = Σ over dimension sets S (the spec's set, then each distinct roll-up)
//!           Σ over published metrics m
//!             split(m) × entities(m, S)
//! cost    = tiered(metrics)          (see PRICE_TIERS)
//! ```
//! - `split(m)`: the values of the metric's own split dimension (6 `ErrorType`s, 6
//!   `StatusType`s, 2 `Percentile`s, 4 ECC `EventType`s), 1 otherwise.
//! - `entities(m, S)`: on one node with `C` cores and `D` devices, assuming every core is
//!   held by its own application (its own pod, container and runtime tag, so `R = C`
//!   runtimes): a per-core metric yields `C` combinations when `S` names the core or the
//!   application (NeuronCore, RuntimeTag, PodName, ContainerName), `D` when it names only
//!   NeuronDevice, else 1; a per-runtime metric yields `R` when `S` names the
//!   application, else 1 (NeuronCore/NeuronDevice do not apply to it); a per-device
//!   runtime metric yields `R` with the application, `D` with NeuronDevice alone, else 1;
//!   the node's ECC counters yield `D` with NeuronDevice, else 1.
//! - Across nodes: when `S` names the node (NodeName, InstanceId), every node's
//!   combinations are its own and add up. Otherwise nodes that agree on the node-level
//!   dimensions in `S` (InstanceType, AvailabilityZone, AmiId — unknown values count as
//!   distinct) share core and device combinations (core 3 of two nodes is one metric:
//!   the larger node's count is taken), while application combinations still add up
//!   (pods have distinct names on distinct nodes).
//!
//! Assumptions, all making the figure an upper bound for a steady state: every core is
//! busy with a single-core application (fewer, larger applications mean fewer runtime
//! combinations); every application the config sees publishes every metric of its
//! groups; a namespaced config may see every core of its matched nodes. Pod churn (a
//! replaced pod has a new name) adds metrics for the hours both exist; prorating keeps
//! that small unless pods are replaced many times an hour. The price tiers apply to an
//! account's total, so a config priced alone from the first tier is priced at the
//! highest rate — again an upper bound.

use std::collections::BTreeSet;

use crate::{
    crd::{CloudWatchMetric, Dimension, NeuronMonitorConfigSpec},
    hardware::InstanceType,
    monitor_config::{RuntimeGroup, SystemGroup},
};

/// What a datum's value measures, as CloudWatch names the unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Percent,
    Bytes,
    Seconds,
    Count,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Percent => "Percent",
            Unit::Bytes => "Bytes",
            Unit::Seconds => "Seconds",
            Unit::Count => "Count",
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
    pub system_group: Option<SystemGroup>,
}

pub const ERROR_TYPES: [&str; 6] = ["generic", "numerical", "transient", "model", "runtime", "hardware"];
pub const STATUS_TYPES: [&str; 6] =
    ["completed", "completed_with_err", "completed_with_num_err", "timed_out", "incorrect_input", "failed_to_queue"];
/// The latency percentiles published (of the 7 neuron-monitor reports): the median and the
/// tail. Each one is a metric of its own, so each costs as much as any other metric.
pub const LATENCY_PERCENTILES: [&str; 2] = ["p50", "p99"];
pub const ECC_EVENT_TYPES: [&str; 4] =
    ["mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected"];

const fn shape(
    metric: CloudWatchMetric,
    name: &'static str,
    unit: Unit,
    level: Level,
    split: Option<(&'static str, &'static [&'static str])>,
    runtime_group: Option<RuntimeGroup>,
) -> MetricShape {
    let system_group = if runtime_group.is_none() { Some(SystemGroup::NeuronHwCounters) } else { None };
    MetricShape { metric, name, unit, level, split, runtime_group, system_group }
}

/// Every metric a sink can publish, in a fixed order.
pub const CATALOGUE: [MetricShape; 11] = {
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
    }
}

/// Whether a dimension applies to a metric of `level` (one that does not is left out of
/// that metric's datums, as a dimension without a value cannot be sent).
pub fn applies(d: Dimension, level: Level) -> bool {
    match d {
        Dimension::NeuronCore => level == Level::Core,
        Dimension::NeuronDevice => level != Level::Runtime,
        Dimension::RuntimeTag | Dimension::Namespace | Dimension::PodName | Dimension::ContainerName => {
            level != Level::NodeDevice
        }
        _ => true,
    }
}

/// The metrics a config publishes: its allow-list (default: all) restricted to the groups
/// it collects. ECC counters need the node-level group, which only configs that see the
/// node-level groups (those in the operator's namespace) get.
pub fn published_metrics(spec: &NeuronMonitorConfigSpec, sees_node_level: bool) -> Vec<&'static MetricShape> {
    let Some(cloudwatch) = spec.sinks.as_ref().and_then(|s| s.cloudwatch.as_ref()) else {
        return Vec::new();
    };
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
    CATALOGUE
        .iter()
        .filter(|s| cloudwatch.metrics.as_ref().is_none_or(|allowed| allowed.contains(&s.metric)))
        .filter(|s| match (s.runtime_group, s.system_group) {
            (Some(g), _) => runtime_groups.contains(&g),
            (None, Some(g)) => system_groups.contains(&g),
            (None, None) => false,
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

/// What the operator knows of one matched node, without I/O.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// NeuronCores: the node's `aws.amazon.com/neuroncore` capacity, or
    /// [`instance_type_cores`] of its `node.kubernetes.io/instance-type` label.
    pub cores: u32,
    /// Neuron devices: `aws.amazon.com/neurondevice` capacity, or the table. 0: unknown
    /// (then one device per core is assumed, the larger count).
    pub devices: u32,
    /// Values of the node-level dimensions that nodes may share; `None`: unknown.
    pub instance_type: Option<String>,
    pub availability_zone: Option<String>,
}

impl NodeFacts {
    /// Facts from the instance-type table alone.
    pub fn from_instance_type(instance_type: &str) -> Option<NodeFacts> {
        let (devices, cores_per_device) = instance_type_layout(instance_type)?;
        Some(NodeFacts {
            cores: devices * cores_per_device,
            devices,
            instance_type: Some(instance_type.to_owned()),
            availability_zone: None,
        })
    }

    fn devices(&self) -> u64 {
        if self.devices == 0 {
            u64::from(self.cores)
        } else {
            u64::from(self.devices.min(self.cores.max(1)))
        }
    }
}

/// (devices, cores per device as neuron-monitor counts them) of a Neuron instance type.
pub fn instance_type_layout(instance_type: &str) -> Option<(u32, u32)> {
    InstanceType::lookup(instance_type).map(|t| (t.devices, t.cores_per_device))
}

/// NeuronCores of an instance type, from the table.
pub fn instance_type_cores(instance_type: &str) -> Option<u32> {
    instance_type_layout(instance_type).map(|(d, c)| d * c)
}

/// One tier of the public CloudWatch custom-metric price (us-east-1; most regions charge
/// the same): metrics up to `up_to` (cumulative) cost `usd_per_metric_month` each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriceTier {
    pub up_to: u64,
    pub usd_per_metric_month: f64,
}

/// First 10,000 metrics $0.30, next 240,000 $0.10, next 750,000 $0.05, beyond
/// 1,000,000 $0.02 per metric-month.
pub const PRICE_TIERS: [PriceTier; 4] = [
    PriceTier { up_to: 10_000, usd_per_metric_month: 0.30 },
    PriceTier { up_to: 250_000, usd_per_metric_month: 0.10 },
    PriceTier { up_to: 1_000_000, usd_per_metric_month: 0.05 },
    PriceTier { up_to: u64::MAX, usd_per_metric_month: 0.02 },
];

/// PutMetricData: $0.01 per 1,000 requests.
pub const USD_PER_1000_REQUESTS: f64 = 0.01;

/// Monthly price of `metrics` custom metrics, tiers counted from zero.
pub fn monthly_metric_cost_usd(metrics: u64) -> f64 {
    let mut remaining = metrics;
    let mut floor = 0u64;
    let mut usd = 0.0;
    for tier in PRICE_TIERS {
        let in_tier = remaining.min(tier.up_to - floor);
        usd += in_tier as f64 * tier.usd_per_metric_month;
        remaining -= in_tier;
        floor = tier.up_to;
        if remaining == 0 {
            break;
        }
    }
    usd
}

/// The estimate for one config.
#[derive(Clone, Debug, PartialEq)]
pub struct CostEstimate {
    /// Distinct metric name + dimension values combinations.
    pub metrics: u64,
    /// Their price per month ([`monthly_metric_cost_usd`]).
    pub monthly_usd: f64,
}

impl CostEstimate {
    /// The status field's text: dollars with cents, e.g. `"1234.50"`.
    pub fn monthly_usd_text(&self) -> String {
        format!("{:.2}", self.monthly_usd)
    }
}

/// Estimates the CloudWatch metrics one config creates on `nodes` (its matched nodes) and
/// their monthly price. `sees_node_level`: the config is in the operator's namespace.
/// `None` when the config has no CloudWatch sink.
pub fn estimate(spec: &NeuronMonitorConfigSpec, sees_node_level: bool, nodes: &[NodeFacts]) -> Option<CostEstimate> {
    let cloudwatch = spec.sinks.as_ref()?.cloudwatch.as_ref()?;
    let metrics = published_metrics(spec, sees_node_level);
    let sets = dimension_sets(cloudwatch.dimensions.as_deref(), cloudwatch.rollups.as_deref());
    let mut total: u64 = 0;
    for set in &sets {
        for m in &metrics {
            let split = m.split.map_or(1, |(_, values)| values.len() as u64);
            total = total.saturating_add(split.saturating_mul(combinations(m.level, set, nodes)));
        }
    }
    Some(CostEstimate { metrics: total, monthly_usd: monthly_metric_cost_usd(total) })
}

/// Distinct dimension-value combinations of one metric level under one dimension set.
fn combinations(level: Level, set: &[Dimension], nodes: &[NodeFacts]) -> u64 {
    let has = |d: Dimension| set.contains(&d) && applies(d, level);
    let per_app = [Dimension::RuntimeTag, Dimension::PodName, Dimension::ContainerName].into_iter().any(has);
    let per_node = has(Dimension::NodeName) || has(Dimension::InstanceId);
    // (combinations on one node, whether they are the node's own even when the node is not named)
    let on_node = |n: &NodeFacts| -> (u64, bool) {
        let cores = u64::from(n.cores);
        match level {
            Level::Core if per_app => (cores, true),
            Level::Core if has(Dimension::NeuronCore) => (cores, false),
            Level::Core | Level::RuntimeDevice | Level::NodeDevice if has(Dimension::NeuronDevice) && !per_app => {
                (n.devices(), false)
            }
            Level::RuntimeDevice | Level::Runtime if per_app => (cores, true),
            _ => (1, false),
        }
    };
    if per_node {
        return nodes.iter().map(|n| on_node(n).0).fold(0u64, u64::saturating_add);
    }
    // Nodes grouped by the node-level dimension values they share.
    let key = |n: &NodeFacts, i: usize| {
        let value = |d: Dimension, v: &Option<String>| match (has(d), v) {
            (false, _) => String::new(),
            (true, Some(v)) => v.clone(),
            (true, None) => format!("\u{0}node-{i}"),
        };
        (
            value(Dimension::InstanceType, &n.instance_type),
            value(Dimension::AvailabilityZone, &n.availability_zone),
            // AMI ids are not node facts: assume one per instance type.
            value(Dimension::AmiId, &n.instance_type),
        )
    };
    let mut groups: std::collections::BTreeMap<(String, String, String), (u64, u64)> = Default::default();
    for (i, n) in nodes.iter().enumerate() {
        let (count, own) = on_node(n);
        let entry = groups.entry(key(n, i)).or_default();
        if own {
            entry.0 = entry.0.saturating_add(count);
        } else {
            entry.1 = entry.1.max(count);
        }
    }
    groups.values().map(|(own, shared)| own + shared).fold(0u64, u64::saturating_add)
}

/// PutMetricData requests per month for `requests_per_flush` requests every
/// `flush_seconds`, and their price.
pub fn monthly_requests(nodes: u64, requests_per_flush: u64, flush_seconds: u64) -> (u64, f64) {
    const SECONDS_PER_MONTH: u64 = 30 * 24 * 3600;
    let requests = nodes.saturating_mul(requests_per_flush).saturating_mul(SECONDS_PER_MONTH / flush_seconds.max(1));
    (requests, requests as f64 / 1000.0 * USD_PER_1000_REQUESTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        CloudWatchSinkSpec, RuntimeMetricGroup, RuntimeSelectorSpec, SinksSpec, SystemMetricGroup, SystemMetricsSpec,
    };

    fn spec(cloudwatch: CloudWatchSinkSpec) -> NeuronMonitorConfigSpec {
        NeuronMonitorConfigSpec {
            sinks: Some(SinksSpec { prometheus: None, cloudwatch: Some(cloudwatch) }),
            ..Default::default()
        }
    }

    fn sink(dimensions: Option<Vec<Dimension>>) -> CloudWatchSinkSpec {
        CloudWatchSinkSpec { namespace: "Team/Neuron".into(), dimensions, ..Default::default() }
    }

    fn trn1_32() -> NodeFacts {
        NodeFacts::from_instance_type("trn1.32xlarge").unwrap()
    }

    #[test]
    fn catalogue_covers_every_metric_once() {
        let mut names: Vec<&str> = CATALOGUE.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 11);
        for s in &CATALOGUE {
            assert_eq!(shape_of(s.metric), s);
        }
    }

    #[test]
    fn tiers_are_cumulative() {
        assert_eq!(monthly_metric_cost_usd(0), 0.0);
        assert!((monthly_metric_cost_usd(1) - 0.30).abs() < 1e-9);
        assert!((monthly_metric_cost_usd(10_000) - 3_000.0).abs() < 1e-6);
        assert!((monthly_metric_cost_usd(10_001) - 3_000.10).abs() < 1e-6);
        // 3,000 + 24,000 + 37,500 + 0.02 × 1,000,000
        assert!((monthly_metric_cost_usd(2_000_000) - 84_500.0).abs() < 1e-3);
    }

    #[test]
    fn default_set_on_one_trn1_32xlarge() {
        // Default dimensions include NeuronCore and the pod: every core is its own series.
        // Per core: utilization + 5 memory = 6 × 32; device memory: 32 apps; errors 6 ×
        // 32, status 6 × 32, latency 2 × 32; no ECC (a namespaced config).
        let e = estimate(&spec(sink(None)), false, &[trn1_32()]).unwrap();
        assert_eq!(e.metrics, 6 * 32 + 32 + 6 * 32 + 6 * 32 + 2 * 32);
        assert_eq!(e.monthly_usd_text(), format!("{:.2}", e.metrics as f64 * 0.30));
    }

    #[test]
    fn node_level_config_adds_ecc_per_device() {
        let mut s = spec(sink(None));
        s.system_metrics = Some(SystemMetricsSpec {
            period: None,
            metrics: vec![SystemMetricGroup { kind: SystemGroup::NeuronHwCounters, period: None }],
        });
        let namespaced = estimate(&s, false, &[trn1_32()]).unwrap().metrics;
        let ops = estimate(&s, true, &[trn1_32()]).unwrap().metrics;
        assert_eq!(ops - namespaced, 4 * 16);
        // Without `systemMetrics`, a config in the operator's namespace collects every
        // node-level group (as validation decides), ECC included.
        let default_ops = estimate(&spec(sink(None)), true, &[trn1_32()]).unwrap().metrics;
        assert_eq!(default_ops, ops);
    }

    #[test]
    fn coarse_sets_share_series_across_nodes() {
        let nodes = [trn1_32(), trn1_32(), NodeFacts::from_instance_type("trn1.2xlarge").unwrap()];
        // Cluster-wide only: one series per metric and split value.
        let cluster = estimate(&spec(sink(Some(vec![Dimension::ClusterName]))), false, &nodes).unwrap();
        assert_eq!(cluster.metrics, 6 + 1 + 6 + 6 + 2);
        // Per core without the node: core indices are shared, the largest node counts.
        let core =
            estimate(&spec(sink(Some(vec![Dimension::ClusterName, Dimension::NeuronCore]))), false, &nodes).unwrap();
        assert_eq!(core.metrics, 6 * 32 + 1 + 6 + 6 + 2);
        // Per node: everything adds up.
        let node =
            estimate(&spec(sink(Some(vec![Dimension::NodeName, Dimension::NeuronCore]))), false, &nodes).unwrap();
        assert_eq!(node.metrics, 6 * (32 + 32 + 2) + 3 * (1 + 6 + 6 + 2));
        // Per pod without the node: pods differ across nodes.
        let pod = estimate(&spec(sink(Some(vec![Dimension::PodName]))), false, &nodes).unwrap();
        assert_eq!(pod.metrics, (6 + 1 + 6 + 6 + 2) * 66);
    }

    #[test]
    fn rollups_add_their_own_series_once() {
        let mut cw = sink(Some(vec![Dimension::NodeName, Dimension::NeuronCore]));
        cw.rollups = Some(vec![
            vec![Dimension::ClusterName],
            vec![Dimension::ClusterName],
            vec![Dimension::NeuronCore, Dimension::NodeName],
        ]);
        let with = estimate(&spec(cw), false, &[trn1_32()]).unwrap().metrics;
        let without =
            estimate(&spec(sink(Some(vec![Dimension::NodeName, Dimension::NeuronCore]))), false, &[trn1_32()])
                .unwrap()
                .metrics;
        assert_eq!(with - without, 6 + 1 + 6 + 6 + 2);
    }

    #[test]
    fn allow_list_and_groups_restrict_metrics() {
        let mut cw = sink(Some(vec![Dimension::ClusterName]));
        cw.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization, CloudWatchMetric::NeuronExecutionErrors]);
        let mut s = spec(cw);
        assert_eq!(estimate(&s, false, &[trn1_32()]).unwrap().metrics, 1 + 6);
        s.runtimes = Some(vec![RuntimeSelectorSpec {
            tag_filter: None,
            period: None,
            metrics: vec![RuntimeMetricGroup { kind: RuntimeGroup::NeuroncoreCounters, period: None }],
        }]);
        assert_eq!(estimate(&s, false, &[trn1_32()]).unwrap().metrics, 1);
        assert_eq!(estimate(&NeuronMonitorConfigSpec::default(), false, &[trn1_32()]), None);
    }

    #[test]
    fn unknown_shared_values_count_per_node() {
        let mut a = trn1_32();
        a.availability_zone = None;
        let nodes = [a.clone(), a];
        let set = vec![Dimension::AvailabilityZone, Dimension::NeuronCore];
        let e = estimate(&spec(sink(Some(set))), false, &nodes).unwrap();
        assert_eq!(e.metrics, 2 * (6 * 32 + 1 + 6 + 6 + 2));
    }

    #[test]
    fn requests_per_month() {
        let (requests, usd) = monthly_requests(1, 1, 60);
        assert_eq!(requests, 43_200);
        assert!((usd - 0.432).abs() < 1e-9);
    }
}
