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
//! NVIDIA GPUs (`catalogue::gpu`): each classic GPU metric is one series per GPU of every
//! node under each dimension set (its `host` dimension names the node), so `G` GPUs add
//! `12 × G` metrics per set; a node without GPUs adds none.
//!
//! With the Container Insights naming (`catalogue::insights`) the sets are fixed and
//! every value goes under each set of its metric, so the count is, per published metric,
//! the sum over its sets of the combinations of the set's finest dimension: NeuronCore
//! `C` per node; NeuronDevice `D` per node for the node family, and one per pod and device
//! it holds (`C`, under the assumption below) for the pod and container families; the pod
//! (PodName, FullPodName, ContainerName) `C` per node; Namespace 1 for a namespaced config
//! and up to the pod count for the operator's; the node (NodeName, InstanceId) 1 per node;
//! ClusterName alone 1. Pod and container names differ across nodes, so they add up. The
//! GPU metrics count the same way with `G` GPUs in place of cores (GpuDevice and the pod
//! `G` per node, one pod per GPU), over the nodes that have GPUs only.
//!
//! Assumptions, all making the figure an upper bound for a steady state (but for GPUs
//! time-sliced between pods, which add a series per extra pod where a set names the pod):
//! every core is busy with a single-core application (fewer, larger applications mean fewer runtime
//! combinations); every application the config sees publishes every metric of its
//! groups; a namespaced config may see every core of its matched nodes. Pod churn (a
//! replaced pod has a new name) adds metrics for the hours both exist; prorating keeps
//! that small unless pods are replaced many times an hour. The price tiers apply to an
//! account's total, so a config priced alone from the first tier is priced at the
//! highest rate — again an upper bound.
//!
//! # Requests
//! PutMetricData costs $0.01 per 1,000 requests: a node sends each flush in requests of
//! at most 1,000 datums (one datum per metric and flush), so per node and flush
//! `⌈metrics on that node / 1,000⌉` requests, every `flushInterval` (default 60 s). A
//! flush interval of 1 s on 100 nodes is 259 million requests, $2,592 a month.
//!
//! # Modes
//! [`costs`] prices what one config collects in each way CloudWatch can take it: the
//! classic naming and the Container Insights naming (per metric-month and request, as
//! above), and OpenTelemetry metrics over OTLP (per GB ingested, [`otlp`]); and names
//! the cheapest. The config's own cost is that of its sinks as configured: its
//! CloudWatch sink in its naming, plus its OTLP sink when that goes to CloudWatch (no
//! `endpoint`; another receiver is not billed by CloudWatch).

use std::{borrow::Borrow, collections::HashMap, time::Duration};

use super::{
    catalogue::{applies, dimension_sets, gpu, insights, naming_of, published_insights, published_metrics, Level},
    sink::DEFAULT_FLUSH_INTERVAL,
};
use crate::{
    crd::{CloudWatchNaming, CloudWatchSinkSpec, Dimension, NeuronMonitorConfigSpec},
    duration::Period,
    hardware::InstanceType,
};

pub mod otlp;

/// What the operator knows of one matched node, without I/O.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeFacts {
    /// NeuronCores: the node's `aws.amazon.com/neuroncore` capacity, or
    /// [`instance_type_cores`] of its `node.kubernetes.io/instance-type` label.
    pub cores: u32,
    /// Neuron devices: `aws.amazon.com/neurondevice` capacity, or the table. 0: unknown
    /// (then one device per core is assumed, the larger count).
    pub devices: u32,
    /// Physical NVIDIA GPUs (one per node-level GPU series); 0: none (or unknown).
    pub gpus: u32,
    /// GPU allocations the node can hand out (time-sliced replicas, MIG devices): the
    /// most pods that hold a share of its GPUs, one pod-level series each. 0: one per GPU.
    pub gpu_shares: u32,
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
            gpus: 0,
            gpu_shares: 0,
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

/// The largest Neuron node: the most NeuronCores of the instance-type table, trn2 with
/// one physical core per logical one (128 cores, 16 devices).
pub fn largest_node() -> NodeFacts {
    crate::hardware::INSTANCE_TYPES
        .iter()
        .rev()
        .map(|t| t.with_lnc(1).unwrap_or(*t))
        .max_by_key(InstanceType::cores)
        .map(|t| NodeFacts {
            cores: t.cores(),
            devices: t.devices,
            gpus: 0,
            gpu_shares: 0,
            instance_type: Some(t.name.to_owned()),
            availability_zone: None,
        })
        .unwrap_or_default()
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

/// The estimate for one config's CloudWatch sink.
#[derive(Clone, Debug, PartialEq)]
pub struct CostEstimate {
    /// Distinct metric name + dimension values combinations.
    pub metrics: u64,
    /// PutMetricData requests per month, from every matched node.
    pub requests: u64,
    /// The metrics' price per month ([`monthly_metric_cost_usd`]) plus the requests'.
    pub monthly_usd: f64,
}

impl CostEstimate {
    /// The status field's text: dollars with cents, e.g. `"1234.50"`.
    pub fn monthly_usd_text(&self) -> String {
        usd_text(self.monthly_usd)
    }
}

/// Dollars with cents, e.g. `"1234.50"`.
pub fn usd_text(usd: f64) -> String {
    format!("{usd:.2}")
}

/// Estimates the CloudWatch metrics one config creates on `nodes` (its matched nodes),
/// the requests that carry them, and their monthly price. `sees_node_level`: the config
/// is in the operator's namespace. `None` when the config has no CloudWatch sink.
pub fn estimate<N: Borrow<NodeFacts>>(
    spec: &NeuronMonitorConfigSpec,
    sees_node_level: bool,
    nodes: &[N],
) -> Option<CostEstimate> {
    estimate_kinds(spec, sees_node_level, &kinds(nodes))
}

/// Nodes of the same facts, once each with their number: the estimate's cost follows the
/// kinds of nodes (instance types × zones), not the nodes.
pub type Kinds<'a> = Vec<(&'a NodeFacts, u64)>;

/// `nodes` grouped into [`Kinds`].
pub fn kinds<N: Borrow<NodeFacts>>(nodes: &[N]) -> Kinds<'_> {
    let mut counts: HashMap<&NodeFacts, u64> = HashMap::new();
    for n in nodes {
        *counts.entry(n.borrow()).or_default() += 1;
    }
    counts.into_iter().collect()
}

fn estimate_kinds(spec: &NeuronMonitorConfigSpec, sees_node_level: bool, kinds: &Kinds) -> Option<CostEstimate> {
    let cloudwatch = spec.sinks.as_ref()?.cloudwatch.as_ref()?;
    let metrics = metrics_on(spec, cloudwatch, sees_node_level, kinds);
    // Requests: per kind of node, the datums one node sends per flush.
    let flush = flush_seconds(cloudwatch.flush_interval.as_deref());
    let requests = kinds
        .iter()
        .map(|&(node, count)| {
            let per_flush =
                metrics_on(spec, cloudwatch, sees_node_level, &vec![(node, 1)]).div_ceil(DATUMS_PER_REQUEST);
            monthly_requests(count, per_flush, flush).0
        })
        .fold(0u64, u64::saturating_add);
    let monthly_usd = monthly_metric_cost_usd(metrics) + requests as f64 / 1000.0 * USD_PER_1000_REQUESTS;
    Some(CostEstimate { metrics, requests, monthly_usd })
}

/// Datums one PutMetricData request carries at most.
const DATUMS_PER_REQUEST: u64 = 1000;

/// Seconds of a flush interval as the sinks read it (default 60 s; an unreadable one,
/// which validation refuses, counts as the default).
pub fn flush_seconds(flush_interval: Option<&str>) -> u64 {
    flush_interval
        .and_then(|text| text.parse::<Period>().ok())
        .map_or(DEFAULT_FLUSH_INTERVAL, Period::as_duration)
        .max(Duration::from_secs(1))
        .as_secs()
}

/// Distinct metrics of a CloudWatch sink on `nodes`.
fn metrics_on(
    spec: &NeuronMonitorConfigSpec,
    cloudwatch: &CloudWatchSinkSpec,
    sees_node_level: bool,
    nodes: &Kinds,
) -> u64 {
    if naming_of(cloudwatch) == CloudWatchNaming::ContainerInsights {
        return published_insights(spec, sees_node_level)
            .iter()
            .flat_map(|m| {
                m.dimension_sets().iter().map(move |set| match m.level {
                    insights::Level::Gpu => insights_gpu_combinations(set, nodes, sees_node_level),
                    _ => insights_combinations(m.family, set, nodes, sees_node_level),
                })
            })
            .fold(0u64, u64::saturating_add);
    }
    let metrics = published_metrics(spec, sees_node_level);
    let sets = dimension_sets(cloudwatch.dimensions.as_deref(), cloudwatch.rollups.as_deref());
    // Every classic GPU series names its node (`host`): one per GPU under each set.
    let gpu_series = (gpu::published_classic(cloudwatch).len() as u64).saturating_mul(gpus(nodes));
    let mut total: u64 = 0;
    for set in &sets {
        for m in &metrics {
            let split = m.split.map_or(1, |(_, values)| values.len() as u64);
            total = total.saturating_add(split.saturating_mul(combinations(m.level, set, nodes)));
        }
        total = total.saturating_add(gpu_series);
    }
    total
}

/// GPUs of all the nodes.
fn gpus(nodes: &Kinds) -> u64 {
    nodes.iter().map(|&(n, count)| u64::from(n.gpus).saturating_mul(count)).fold(0u64, u64::saturating_add)
}

/// The most (GPU, pod) pairs of all the nodes: a shared or MIG GPU has one per share.
fn gpu_shares(nodes: &Kinds) -> u64 {
    let shares = |n: &NodeFacts| u64::from(n.gpu_shares.max(n.gpus));
    nodes.iter().map(|&(n, count)| shares(n).saturating_mul(count)).fold(0u64, u64::saturating_add)
}

/// The ways CloudWatch can take a config's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Custom metrics with this project's names (`naming: Classic`).
    Classic,
    /// Custom metrics with Container Insights' names and sets.
    ContainerInsights,
    /// OpenTelemetry metrics through CloudWatch's OTLP endpoint.
    Otlp,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Classic, Mode::ContainerInsights, Mode::Otlp];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Classic => "Classic",
            Mode::ContainerInsights => "ContainerInsights",
            Mode::Otlp => "Otlp",
        }
    }
}

/// What a config's metrics cost in one mode.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeCost {
    pub mode: Mode,
    /// Distinct series: CloudWatch metrics (name + dimension values), or OTLP series
    /// (name + labels).
    pub series: u64,
    /// PutMetricData requests a month (billed in the classic modes; OTLP requests are not).
    pub requests: u64,
    /// Bytes billed a month (OTLP only: [`otlp`]).
    pub bytes: u64,
    pub monthly_usd: f64,
}

/// The prices the operator is told (the chart sets them; the defaults are the public
/// ones of us-east-1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prices {
    /// CloudWatch OTel metrics: USD per GB (2^30 bytes) ingested.
    pub otlp_usd_per_gb: f64,
}

impl Default for Prices {
    fn default() -> Self {
        Prices { otlp_usd_per_gb: otlp::DEFAULT_USD_PER_GB }
    }
}

/// A config's costs: its own sinks', and each mode's for what it collects.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Its CloudWatch sink as configured.
    pub cloudwatch: Option<CostEstimate>,
    /// Its OTLP sink, when that goes to CloudWatch (no endpoint).
    pub otlp: Option<ModeCost>,
    /// Each mode, in [`Mode::ALL`] order.
    pub modes: Vec<ModeCost>,
    /// The cheapest mode (the first of equals).
    pub cheapest: Mode,
}

impl Costs {
    /// What the config's sinks cost CloudWatch a month as configured.
    pub fn own_usd(&self) -> f64 {
        self.cloudwatch.as_ref().map_or(0.0, |e| e.monthly_usd) + self.otlp.as_ref().map_or(0.0, |o| o.monthly_usd)
    }
}

/// What one config costs on `nodes` (its matched nodes, by [`kinds`]), as configured and in every
/// mode. `None` for a config with neither a CloudWatch nor an OTLP sink. Each mode keeps
/// the config's groups and flush interval (its CloudWatch sink's, else its OTLP sink's,
/// else 60 s — the OTLP mode prefers its OTLP sink's); the classic mode its dimensions
/// when its CloudWatch sink is classic, else the default ones.
pub fn costs(spec: &NeuronMonitorConfigSpec, sees_node_level: bool, nodes: &Kinds, prices: &Prices) -> Option<Costs> {
    let sinks = spec.sinks.as_ref()?;
    if sinks.cloudwatch.is_none() && sinks.otlp.is_none() {
        return None;
    }
    let cloudwatch_flush = sinks.cloudwatch.as_ref().and_then(|c| c.flush_interval.clone());
    let otlp_flush = sinks.otlp.as_ref().and_then(|o| o.flush_interval.clone());
    let otlp_mode =
        otlp::estimate(spec, sees_node_level, nodes, otlp_flush.as_deref().or(cloudwatch_flush.as_deref()), prices);
    let cloudwatch_mode = |naming: CloudWatchNaming| {
        let sink = match &sinks.cloudwatch {
            Some(own) if naming_of(own) == naming => own.clone(),
            _ => CloudWatchSinkSpec {
                naming: Some(naming),
                flush_interval: cloudwatch_flush.clone().or(otlp_flush.clone()),
                ..Default::default()
            },
        };
        let mut as_mode = spec.clone();
        as_mode.sinks = Some(crate::crd::SinksSpec { cloudwatch: Some(sink), ..Default::default() });
        estimate_kinds(&as_mode, sees_node_level, nodes).unwrap_or(CostEstimate {
            metrics: 0,
            requests: 0,
            monthly_usd: 0.0,
        })
    };
    // The config's own sinks are priced as their mode is: each mode is estimated once.
    let mut own_cloudwatch = None;
    let mut modes = Vec::with_capacity(Mode::ALL.len());
    for mode in Mode::ALL {
        modes.push(match mode {
            Mode::Classic | Mode::ContainerInsights => {
                let naming =
                    if mode == Mode::Classic { CloudWatchNaming::Classic } else { CloudWatchNaming::ContainerInsights };
                let e = cloudwatch_mode(naming);
                let cost =
                    ModeCost { mode, series: e.metrics, requests: e.requests, bytes: 0, monthly_usd: e.monthly_usd };
                if sinks.cloudwatch.as_ref().is_some_and(|own| naming_of(own) == naming) {
                    own_cloudwatch = Some(e);
                }
                cost
            }
            Mode::Otlp => otlp_mode.clone(),
        });
    }
    let cheapest =
        modes.iter().min_by(|a, b| a.monthly_usd.total_cmp(&b.monthly_usd)).map_or(Mode::Classic, |m| m.mode);
    // Its OTLP sink's flush interval is the OTLP mode's when it has one.
    let otlp = sinks.otlp.as_ref().filter(|o| o.endpoint.is_none()).map(|_| otlp_mode);
    Some(Costs { cloudwatch: own_cloudwatch, otlp, modes, cheapest })
}

/// Distinct dimension-value combinations of one metric level under one dimension set.
fn combinations(level: Level, set: &[Dimension], nodes: &Kinds) -> u64 {
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
            // A pod holds at least one core.
            Level::RuntimeDevice | Level::Runtime | Level::Pod if per_app => (cores, true),
            // The allocation counts of a node without NeuronCores (a GPU node): none.
            Level::Node | Level::Pod if cores == 0 => (0, false),
            _ => (1, false),
        }
    };
    if per_node {
        return nodes.iter().map(|&(n, count)| on_node(n).0.saturating_mul(count)).fold(0u64, u64::saturating_add);
    }
    // Nodes grouped by the node-level dimension values they share; a node with an
    // unknown value is a group of its own.
    let mut alone = 0u64;
    let mut groups: HashMap<[Option<&str>; 3], (u64, u64)> = HashMap::new();
    for &(n, nodes) in nodes {
        let (count, own) = on_node(n);
        match shared_values(n, &has) {
            None => alone = alone.saturating_add(count.saturating_mul(nodes)),
            Some(key) => {
                let entry = groups.entry(key).or_default();
                if own {
                    entry.0 = entry.0.saturating_add(count.saturating_mul(nodes));
                } else {
                    entry.1 = entry.1.max(count);
                }
            }
        }
    }
    groups.values().map(|(own, shared)| own + shared).fold(alone, u64::saturating_add)
}

/// The values of a node's dimensions that nodes may share (those `has` says the set
/// names; AMI ids are not node facts: one per instance type is assumed); `None` when
/// one of them is unknown.
fn shared_values<'n>(n: &'n NodeFacts, has: &dyn Fn(Dimension) -> bool) -> Option<[Option<&'n str>; 3]> {
    let value = |d: Dimension, v: &'n Option<String>| match (has(d), v) {
        (false, _) => Some(None),
        (true, Some(v)) => Some(Some(v.as_str())),
        (true, None) => None,
    };
    Some([
        value(Dimension::InstanceType, &n.instance_type)?,
        value(Dimension::AvailabilityZone, &n.availability_zone)?,
        value(Dimension::AmiId, &n.instance_type)?,
    ])
}

/// Distinct dimension-value combinations of one Container Insights set (the module doc).
fn insights_combinations(
    family: insights::Family,
    set: &[insights::Dimension],
    nodes: &Kinds,
    sees_node_level: bool,
) -> u64 {
    use insights::Dimension as D;
    let sum = |f: &dyn Fn(&NodeFacts) -> u64| {
        nodes.iter().map(|&(n, count)| f(n).saturating_mul(count)).fold(0u64, u64::saturating_add)
    };
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
        sum(&|_| 1)
    } else {
        1
    }
}

/// Distinct dimension-value combinations of one Container Insights set of a GPU metric
/// (the module doc): as [`insights_combinations`] with GPUs for cores, on nodes with GPUs.
fn insights_gpu_combinations(set: &[insights::Dimension], nodes: &Kinds, sees_node_level: bool) -> u64 {
    use insights::Dimension as D;
    let gpus = gpus(nodes);
    let shares = gpu_shares(nodes);
    let has = |d: D| set.contains(&d);
    if has(D::PodName) || has(D::FullPodName) || has(D::ContainerName) {
        shares
    } else if has(D::GpuDevice) {
        gpus
    } else if has(D::Namespace) {
        // The operator's config sees every pod, at most one per share of a GPU.
        if sees_node_level {
            shares
        } else {
            shares.min(1)
        }
    } else if has(D::NodeName) || has(D::InstanceId) {
        nodes.iter().filter(|(n, _)| n.gpus > 0).map(|&(_, count)| count).fold(0u64, u64::saturating_add)
    } else {
        gpus.min(1)
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
        CloudWatchMetric, RuntimeMetricGroup, RuntimeSelectorSpec, SinksSpec, SystemMetricGroup, SystemMetricsSpec,
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
        // 672 datums a flush: one request a minute, 43,200 a month ($0.43).
        assert_eq!(e.requests, 43_200);
        assert_eq!(e.monthly_usd_text(), format!("{:.2}", e.metrics as f64 * 0.30 + 0.432));
        assert_eq!(e.monthly_usd_text(), "202.03");
    }

    #[test]
    fn requests_follow_the_flush_interval_and_the_datums_of_each_node() {
        // The module doc's figure: a 1 s flush on 100 nodes.
        let mut every_second = sink(None);
        every_second.flush_interval = Some("1s".into());
        let nodes = vec![trn1_32(); 100];
        let e = estimate(&spec(every_second), false, &nodes).unwrap();
        assert_eq!(e.requests, 100 * 30 * 24 * 3600);
        let requests_usd = e.monthly_usd - monthly_metric_cost_usd(e.metrics);
        assert!((requests_usd - 2_592.0).abs() < 1e-6, "{requests_usd}");
        // More than 1,000 datums on a node: more requests a flush. The default set and two
        // more per pod and core: 3 × 672 on a trn1.32xlarge.
        let mut wide = sink(None);
        wide.rollups = Some(vec![
            vec![Dimension::NodeName, Dimension::NeuronCore, Dimension::PodName],
            vec![Dimension::ClusterName, Dimension::NeuronCore, Dimension::PodName],
        ]);
        let e =
            estimate(&spec(wide), false, &[trn1_32(), NodeFacts::from_instance_type("inf2.xlarge").unwrap()]).unwrap();
        // trn1.32xlarge: 2,016 datums, 3 requests; inf2.xlarge (2 cores): 1 request.
        assert_eq!(e.requests, (3 + 1) * 43_200);
    }

    #[test]
    fn each_mode_is_priced_and_the_cheapest_named() {
        let prices = Prices::default();
        // Per core and pod on one trn1.32xlarge: OTLP's bytes cost less than 672 metrics.
        let per_core = costs(&spec(sink(None)), false, &kinds(&[trn1_32()]), &prices).unwrap();
        assert_eq!(per_core.modes.iter().map(|m| m.mode).collect::<Vec<_>>(), Mode::ALL.to_vec());
        let classic = &per_core.modes[0];
        assert_eq!((classic.series, classic.requests), (672, 43_200));
        assert_eq!(per_core.cheapest, Mode::Otlp);
        let otlp = &per_core.modes[2];
        assert_eq!((otlp.series, otlp.requests), (1472, 0));
        assert!(otlp.monthly_usd < classic.monthly_usd / 5.0, "{per_core:?}");
        // Its own cost is its CloudWatch sink's; it has no OTLP sink.
        assert_eq!((per_core.own_usd(), per_core.otlp.is_none()), (classic.monthly_usd, true));
        // Cluster-wide series only: 21 metrics beat 1,472 OTLP series.
        let coarse =
            costs(&spec(sink(Some(vec![Dimension::ClusterName]))), false, &kinds(&[trn1_32()]), &prices).unwrap();
        assert_eq!((coarse.modes[0].series, coarse.cheapest), (21, Mode::Classic));
        // A config with only an OTLP sink to CloudWatch: its own cost is the OTLP mode's;
        // to another receiver, nothing for CloudWatch.
        let otlp_only = |endpoint: Option<&str>| NeuronMonitorConfigSpec {
            sinks: Some(SinksSpec {
                otlp: Some(crate::crd::OtlpSinkSpec { endpoint: endpoint.map(str::to_owned), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cloudwatch = costs(&otlp_only(None), false, &kinds(&[trn1_32()]), &prices).unwrap();
        assert_eq!(cloudwatch.own_usd(), cloudwatch.modes[2].monthly_usd);
        assert!(cloudwatch.cloudwatch.is_none());
        let elsewhere =
            costs(&otlp_only(Some("http://collector:4318/v1/metrics")), false, &kinds(&[trn1_32()]), &prices).unwrap();
        assert_eq!(elsewhere.own_usd(), 0.0);
        assert_eq!(elsewhere.modes, cloudwatch.modes, "the modes price what it collects, wherever it goes");
        // Twice the price per GB, twice the OTLP cost.
        let dear = costs(&otlp_only(None), false, &kinds(&[trn1_32()]), &Prices { otlp_usd_per_gb: 1.0 }).unwrap();
        assert!((dear.own_usd() - 2.0 * cloudwatch.own_usd()).abs() < 1e-9);
        assert_eq!(costs(&NeuronMonitorConfigSpec::default(), false, &kinds(&[trn1_32()]), &prices), None);
    }

    #[test]
    fn the_largest_node_has_128_cores() {
        let node = largest_node();
        assert_eq!((node.cores, node.devices, node.instance_type.as_deref()), (128, 16, Some("trn2.48xlarge")));
        // The figures of limits::MAX_SERIES_PER_CONFIG_PER_NODE's doc.
        assert_eq!(estimate(&spec(sink(None)), false, &[&node]).unwrap().metrics, 2_688);
        let mut rollups = sink(None);
        rollups.rollups = Some(
            (0..10)
                .map(|i| {
                    let extra =
                        [Dimension::InstanceType, Dimension::AvailabilityZone, Dimension::AmiId, Dimension::RuntimeTag];
                    let mut set = vec![Dimension::NodeName, Dimension::NeuronCore, Dimension::PodName];
                    set.extend(extra.iter().take(i % 5).copied());
                    if i >= 5 {
                        set.push(Dimension::ClusterName);
                    }
                    set
                })
                .collect(),
        );
        let wide = estimate(&spec(rollups), false, &[&node]).unwrap().metrics;
        assert!((29_000..=31_000).contains(&wide), "{wide}");
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
        // ECC events of 4 kinds and the health of each of the 16 devices, and the node's
        // cores in 3 allocation states.
        assert_eq!(ops - namespaced, (4 + 1) * 16 + 3);
        // Without `systemMetrics`, a config in the operator's namespace collects every
        // node-level group (as validation decides), ECC included.
        let default_ops = estimate(&spec(sink(None)), true, &[trn1_32()]).unwrap().metrics;
        assert_eq!(default_ops, ops);
    }

    /// The pods' counts are sent only where listed: a team's default estimate does not
    /// change, and listing them adds two states per pod (at most one pod per core).
    #[test]
    fn the_pods_allocation_counts_only_where_listed() {
        let set = Some(vec![Dimension::NodeName, Dimension::Namespace, Dimension::PodName]);
        let default = estimate(&spec(sink(set.clone())), false, &[trn1_32()]).unwrap().metrics;
        let mut listed = sink(set);
        listed.metrics = Some(super::super::catalogue::CATALOGUE.iter().map(|s| s.metric).collect());
        let with = estimate(&spec(listed), false, &[trn1_32()]).unwrap().metrics;
        assert_eq!(with - default, 2 * 32);
        let mut only = sink(Some(vec![Dimension::ClusterName]));
        only.metrics = Some(vec![CloudWatchMetric::NeuronPodNeuroncores]);
        assert_eq!(estimate(&spec(only), false, &[trn1_32()]).unwrap().metrics, 2, "the pods summed up");
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
        // And 4 pod capacity metrics: {C} 1, {C,Ns} 1, {C,Ns,Pod} 64, {…,FullPod} 64.
        let team = estimate(&spec(cw.clone()), false, &nodes).unwrap().metrics;
        assert_eq!(team, 7 * (2 + 3 * 64) + 7 * (1 + 3 * 64) + 4 * (2 + 2 * 64));
        // The operator's config adds the node family and ECC, and may see every namespace.
        let ops = estimate(&spec(cw), true, &nodes).unwrap().metrics;
        // Node-level: 3 totals and 5 capacity metrics, each under {C} and {C,Id,Node}.
        let node = 7 * (1 + 2 + 64) + (1 + 2 + 32) + 8 * (1 + 2);
        let pod = 7 * (1 + 64 + 3 * 64) + (1 + 64 + 3 * 64) + 4 * (1 + 64 + 2 * 64);
        let container = 8 * (1 + 3 * 64);
        assert_eq!(ops, node + pod + container);
        // One node, as docs/tenancy.md quotes it.
        let mut one = sink(None);
        one.naming = Some(CloudWatchNaming::ContainerInsights);
        let one = estimate(&spec(one), true, &[trn1_32()]).unwrap().metrics;
        assert_eq!(one, (7 * 34 + 18 + 16) + (8 * (1 + 4 * 32) + 4 * (1 + 3 * 32)) + 8 * (1 + 3 * 32));
        assert_eq!(one, 2468);
    }

    fn g5_12xlarge(gpus: u32) -> NodeFacts {
        NodeFacts { gpus, instance_type: Some("g5.12xlarge".into()), ..NodeFacts::default() }
    }

    #[test]
    fn a_node_with_gpus_costs_the_gpu_series_it_sends() {
        // Classic: the 12 nvidia_smi_* metrics per GPU and dimension set; a node without
        // GPUs sends none.
        let mut cw = sink(None);
        cw.rollups = Some(vec![vec![Dimension::ClusterName]]);
        let classic = |node: NodeFacts| estimate(&spec(cw.clone()), true, &[node]).unwrap().metrics;
        assert_eq!(classic(g5_12xlarge(4)) - classic(g5_12xlarge(0)), 2 * 12 * 4);
        let two = estimate(&spec(cw.clone()), true, &[g5_12xlarge(4), g5_12xlarge(4)]).unwrap().metrics;
        assert_eq!(two - classic(g5_12xlarge(0)), 2 * 2 * 12 * 4, "each node's GPUs are its own (host)");
        // An allow-list names Neuron metrics only: no GPU series.
        let mut listed = sink(None);
        listed.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization]);
        let listed = |node: NodeFacts| estimate(&spec(listed.clone()), true, &[node]).unwrap().metrics;
        assert_eq!(listed(g5_12xlarge(4)), listed(g5_12xlarge(0)));

        // Container Insights: 6 metrics per family; two nodes of 4 GPUs.
        let mut insights = sink(None);
        insights.naming = Some(CloudWatchNaming::ContainerInsights);
        let ci = |sees_node: bool, gpus: u32| {
            estimate(&spec(insights.clone()), sees_node, &[g5_12xlarge(gpus), g5_12xlarge(gpus)]).unwrap().metrics
        };
        // Node sets: {C} 1, {C,Node,Id} 2, {…,GpuDevice} 8. Pod: {C} 1, {C,Ns} 8 (the
        // operator's sees every pod), 3 × 8 by pod. Container: {C} 1, 3 × 8.
        assert_eq!(ci(true, 4) - ci(true, 0), 6 * (1 + 2 + 8) + 6 * (1 + 8 + 3 * 8) + 6 * (1 + 3 * 8));
        // A team's: no node family, its one namespace.
        assert_eq!(ci(false, 4) - ci(false, 0), 6 * (1 + 1 + 3 * 8) + 6 * (1 + 3 * 8));
        // One g5.12xlarge, as docs/sinks.md quotes it.
        let one = |gpus: u32| estimate(&spec(insights.clone()), true, &[g5_12xlarge(gpus)]).unwrap();
        assert_eq!(one(4).metrics - one(0).metrics, 6 * (1 + 1 + 4) + 6 * (1 + 4 + 3 * 4) + 6 * (1 + 3 * 4));
        // Requests follow: 216 GPU metrics and a few Neuron ones, one request a flush.
        assert_eq!(one(4).requests, 43_200);

        // Time-sliced into 4 replicas each: the node sets stay per GPU, the pod and
        // container sets count a pod per replica.
        let shared = NodeFacts { gpu_shares: 16, ..g5_12xlarge(4) };
        let shared = estimate(&spec(insights.clone()), true, &[shared]).unwrap().metrics;
        assert_eq!(shared - one(0).metrics, 6 * (1 + 1 + 4) + 6 * (1 + 16 + 3 * 16) + 6 * (1 + 3 * 16));
        // A classic series names its GPU, never its pod: shares change nothing.
        let classic_shared = classic(NodeFacts { gpu_shares: 16, ..g5_12xlarge(4) });
        assert_eq!(classic_shared, classic(g5_12xlarge(4)));
    }

    #[test]
    fn requests_per_month() {
        let (requests, usd) = monthly_requests(1, 1, 60);
        assert_eq!(requests, 43_200);
        assert!((usd - 0.432).abs() < 1e-9);
    }
}
