//! What a config's CloudWatch sink costs: the estimate the operator writes to
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
//! With the Container Insights naming (`catalogue::insights`) the sets are fixed and
//! every value goes under each set of its metric, so the count is, per published metric,
//! the sum over its sets of the combinations of the set's finest dimension: NeuronCore
//! `C` per node; NeuronDevice `D` per node for the node family, and one per pod and device
//! it holds (`C`, under the assumption below) for the pod and container families; the pod
//! (PodName, FullPodName, ContainerName) `C` per node; Namespace 1 for a namespaced config
//! and up to the pod count for the operator's; the node (NodeName, InstanceId) 1 per node;
//! ClusterName alone 1. Pod and container names differ across nodes, so they add up.
//!
//! Assumptions, all making the figure an upper bound for a steady state: every core is
//! busy with a single-core application (fewer, larger applications mean fewer runtime
//! combinations); every application the config sees publishes every metric of its
//! groups; a namespaced config may see every core of its matched nodes. Pod churn (a
//! replaced pod has a new name) adds metrics for the hours both exist; prorating keeps
//! that small unless pods are replaced many times an hour. The price tiers apply to an
//! account's total, so a config priced alone from the first tier is priced at the
//! highest rate — again an upper bound.

use super::catalogue::{applies, dimension_sets, insights, naming_of, published_insights, published_metrics, Level};
use crate::{
    crd::{CloudWatchNaming, Dimension, NeuronMonitorConfigSpec},
    hardware::InstanceType,
};

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
    if naming_of(cloudwatch) == CloudWatchNaming::ContainerInsights {
        let total = published_insights(spec, sees_node_level)
            .iter()
            .flat_map(|m| {
                m.dimension_sets().iter().map(move |set| insights_combinations(m.family, set, nodes, sees_node_level))
            })
            .fold(0u64, u64::saturating_add);
        return Some(CostEstimate { metrics: total, monthly_usd: monthly_metric_cost_usd(total) });
    }
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
    let per_app = [
        Dimension::RuntimeTag,
        Dimension::PodName,
        Dimension::ContainerName,
        Dimension::TaskArn,
        Dimension::TaskDefinitionFamily,
    ]
    .into_iter()
    .any(has);
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

/// Distinct dimension-value combinations of one Container Insights set (the module doc).
fn insights_combinations(
    family: insights::Family,
    set: &[insights::Dimension],
    nodes: &[NodeFacts],
    sees_node_level: bool,
) -> u64 {
    use insights::Dimension as D;
    let sum = |f: &dyn Fn(&NodeFacts) -> u64| nodes.iter().map(f).fold(0u64, u64::saturating_add);
    let cores = sum(&|n| u64::from(n.cores));
    let has = |d: D| set.contains(&d);
    if has(D::NeuronCore) {
        cores
    } else if has(D::NeuronDevice) {
        match family {
            insights::Family::Node => sum(&|n| n.devices()),
            insights::Family::Pod | insights::Family::Container => cores,
        }
    } else if has(D::PodName) || has(D::FullPodName) || has(D::ContainerName) {
        cores
    } else if has(D::Namespace) {
        if sees_node_level {
            cores.max(1)
        } else {
            1
        }
    } else if has(D::NodeName) || has(D::InstanceId) {
        nodes.len() as u64
    } else {
        1
    }
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
        CloudWatchMetric, CloudWatchSinkSpec, RuntimeMetricGroup, RuntimeSelectorSpec, SinksSpec, SystemMetricGroup,
        SystemMetricsSpec,
    };
    use crate::monitor_config::{RuntimeGroup, SystemGroup};

    fn spec(cloudwatch: CloudWatchSinkSpec) -> NeuronMonitorConfigSpec {
        NeuronMonitorConfigSpec {
            sinks: Some(SinksSpec { cloudwatch: Some(cloudwatch), ..Default::default() }),
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
    fn node_level_config_adds_ecc_and_health_per_device() {
        let mut s = spec(sink(None));
        s.system_metrics = Some(SystemMetricsSpec {
            period: None,
            metrics: vec![SystemMetricGroup { kind: SystemGroup::NeuronHwCounters, period: None }],
        });
        let namespaced = estimate(&s, false, &[trn1_32()]).unwrap().metrics;
        let ops = estimate(&s, true, &[trn1_32()]).unwrap().metrics;
        // ECC events of 4 kinds and the health of each of the 16 devices.
        assert_eq!(ops - namespaced, (4 + 1) * 16);
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
    fn container_insights_naming_counts_its_own_sets() {
        let mut cw = sink(None);
        cw.naming = Some(CloudWatchNaming::ContainerInsights);
        let nodes = [trn1_32(), trn1_32()];
        // A team's config: pod and container families, 7 per-core metrics each, no ECC.
        // Pod sets: {C} 1, {C,Ns} 1, {C,Ns,Pod} 64, {…,FullPod} 64, {…,Device,Core} 64.
        // Container sets: {C} 1, {C,Ns,Pod,Ctr} 64, {…,FullPod,Ctr} 64, {…,Device,Core} 64.
        let team = estimate(&spec(cw.clone()), false, &nodes).unwrap().metrics;
        assert_eq!(team, 7 * (2 + 3 * 64) + 7 * (1 + 3 * 64));
        // The operator's config adds the node family and ECC, and may see every namespace.
        let ops = estimate(&spec(cw), true, &nodes).unwrap().metrics;
        let node = 7 * (1 + 2 + 64) + (1 + 2 + 32) + 3 * (1 + 2);
        let pod = 7 * (1 + 64 + 3 * 64) + (1 + 64 + 3 * 64);
        let container = 8 * (1 + 3 * 64);
        assert_eq!(ops, node + pod + container);
        // One node, as the README quotes it.
        let mut one = sink(None);
        one.naming = Some(CloudWatchNaming::ContainerInsights);
        let one = estimate(&spec(one), true, &[trn1_32()]).unwrap().metrics;
        assert_eq!(one, (7 * 34 + 18 + 6) + (8 * (1 + 4 * 32)) + 8 * (1 + 3 * 32));
        assert_eq!(one, 2070);
    }

    #[test]
    fn requests_per_month() {
        let (requests, usd) = monthly_requests(1, 1, 60);
        assert_eq!(requests, 43_200);
        assert!((usd - 0.432).abs() < 1e-9);
    }
}
