//! Validation of a `NeuronMonitorConfig`, done once per config and reconcile pass.
//!
//! The API server's schema refuses most bad input, but the operator never trusts it:
//! everything rendering relies on is checked here and pre-computed into a
//! [`ValidConfig`], so that rendering thousands of nodes only merges ready-made parts.
//! A refusal names the exact field ([`Invalid`]), for the `Accepted` condition. A config
//! whose route would add more than [`MAX_CONFIG_RENDERED_BYTES`] to every node's ConfigMap
//! is refused here as [`Refusal::TooLarge`], one whose sink would create more than
//! `MAX_SERIES_PER_CONFIG_PER_NODE` series as [`Refusal::TooManySeries`]; the limits that
//! depend on the other configs of a node are applied by rendering, the cluster's tenancy
//! policy by the operator (`crate::tenancy`).
//!
//! Defaults:
//! - `period`: 5 s; a runtime entry inherits the config's period, a group its entry's
//!   (system groups: `systemMetrics.period`, then the config's); the nearest one wins.
//! - `runtimes` absent: one entry for every application (no tag filter) with the four
//!   runtime groups. `runtimes: []` collects no runtime group.
//! - `systemMetrics` absent: in the operator's namespace, the three system groups at the
//!   config's period (one cluster-wide config with nothing but a name gives the full
//!   picture, like neuron-monitor without `-c`); elsewhere, none. Only configs in the
//!   operator's namespace may set it.
//! - `sinks.prometheus` absent or without `enabled`: Prometheus on, no extra labels.
//!   `sinks.cloudwatch` and `sinks.otlp` are copied as given; the agent fills in their
//!   defaults.
//! - `nodeSelector` absent: every Neuron node.
//! - `health` (operator namespace only): absent, the agent's flags, no taint, no
//!   CloudWatch Logs; `taint.errors` absent, the fatal errors; `logs.group` absent,
//!   `/aws/neuron/hardware-events`. Resolved into the rendered [`NodeHealth`].
//! - `gpu` (operator namespace only): absent, the agent's defaults (on, at its
//!   `--period`); `enabled` absent, on; `period` absent, the config's period. Resolved
//!   into the rendered [`NodeGpu`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::crd::{NeuronMonitorConfig, RuntimeSelectorSpec, SystemMetricsSpec};
use crate::duration::Period;
use crate::limits::{MAX_CONFIG_RENDERED_BYTES, MAX_RUNTIME_ENTRIES};
use crate::monitor_config::{RuntimeGroup, SystemGroup, DEFAULT_PERIOD};
use crate::node_config::{NodeGpu, NodeHealth, Route, RouteRuntimes};
use k8s_openapi::jiff::Timestamp;

/// Bounds of every period (the schema's CEL rule says the same).
const MIN_PERIOD: Period = Period::from_secs(1);
const MAX_PERIOD: Period = Period::from_secs(3600);
const PERIOD_RANGE: &str = "must be a duration from 1s to 1h, such as 1s, 30s or 5m";

/// Why a config is refused: the field (a path such as `spec.runtimes[1].tagFilter`), the
/// reason, and its kind (the `Accepted` condition's reason).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    pub field: String,
    pub reason: String,
    pub kind: Refusal,
}

impl Invalid {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid::of(Refusal::InvalidSpec, field, reason)
    }

    /// A refusal of a given kind (a limit rather than an invalid spec).
    pub fn of(kind: Refusal, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid { field: field.into(), reason: reason.into(), kind }
    }
}

/// The kinds of refusal, each the reason of an `Accepted=False` condition and a label of
/// `neuron_operator_refused_configs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// The spec breaks a rule the schema could not check.
    InvalidSpec,
    /// The rendered config alone exceeds [`MAX_CONFIG_RENDERED_BYTES`].
    TooLarge,
    /// Its namespace's configs on a node would exceed their count or bytes.
    NamespaceLimit,
    /// All configs on a node would exceed their count or bytes.
    NodeLimit,
    /// A series would carry more than [`MAX_EXTRA_LABELS_PER_SERIES`] extra labels.
    ///
    /// [`MAX_EXTRA_LABELS_PER_SERIES`]: crate::limits::MAX_EXTRA_LABELS_PER_SERIES
    TooManyLabels,
    /// A sink would create more than [`MAX_SERIES_PER_CONFIG_PER_NODE`] series on a node.
    ///
    /// [`MAX_SERIES_PER_CONFIG_PER_NODE`]: crate::limits::MAX_SERIES_PER_CONFIG_PER_NODE
    TooManySeries,
    /// A CloudWatch namespace, region or OTLP endpoint the cluster's tenancy policy does
    /// not allow the config's namespace, or a region of another partition than its nodes'
    /// (`crate::tenancy`).
    OutsidePolicy,
    /// The namespace's configs would cost more than its monthly ceiling.
    CostCeiling,
    /// The cluster's API server does not serve what the config asks for (the
    /// DeviceTaintRule API of `spec.health.deviceTaints`).
    Unsupported,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::InvalidSpec,
        Refusal::TooLarge,
        Refusal::NamespaceLimit,
        Refusal::NodeLimit,
        Refusal::TooManyLabels,
        Refusal::TooManySeries,
        Refusal::OutsidePolicy,
        Refusal::CostCeiling,
        Refusal::Unsupported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::InvalidSpec => "InvalidSpec",
            Refusal::TooLarge => "TooLarge",
            Refusal::NamespaceLimit => "NamespaceLimit",
            Refusal::NodeLimit => "NodeLimit",
            Refusal::TooManyLabels => "TooManyLabels",
            Refusal::TooManySeries => "TooManySeries",
            Refusal::OutsidePolicy => "OutsidePolicy",
            Refusal::CostCeiling => "CostCeiling",
            Refusal::Unsupported => "Unsupported",
        }
    }
}

/// Identifies a config: its namespace and name. Orders by namespace, then name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigKey {
    pub namespace: String,
    pub name: String,
}

impl ConfigKey {
    /// The key of a config object; an object without namespace or name (never stored
    /// by the API server, but never trusted) is [`Invalid`].
    pub fn of(config: &NeuronMonitorConfig) -> Result<ConfigKey, Invalid> {
        let namespace = match config.metadata.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_owned(),
            _ => return Err(Invalid::new("metadata.namespace", "is not set")),
        };
        let name = match config.metadata.name.as_deref() {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => return Err(Invalid::new("metadata.name", "is not set")),
        };
        Ok(ConfigKey { namespace, name })
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Which applications a config's runtime entries take, for the merged tag filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applications {
    /// No runtime group at all (`runtimes: []`): contributes nothing to the filter.
    None,
    /// Some entry has no tag filter.
    All,
    /// The tag filters of its entries, sorted and deduplicated.
    Matching(Vec<String>),
}

/// Everything rendering needs from one config, checked and pre-computed once.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidConfig {
    pub key: ConfigKey,
    /// In the operator's namespace: sees every application, and comes first when node
    /// budgets are shared out.
    pub cluster_wide: bool,
    /// `metadata.creationTimestamp`: older configs come first when budgets are shared out.
    pub created: Option<Timestamp>,
    /// Bytes of the route's JSON, what the config adds to each node's ConfigMap.
    pub rendered_bytes: usize,
    pub selector: Selector,
    /// The config's own period (`spec.period` or 5 s).
    pub period: Period,
    /// What this config receives on every node it matches.
    pub route: Route,
    /// The applications neuron-monitor must report for this config.
    pub applications: Applications,
    /// Each runtime group the config collects, at the shortest period any of its entries
    /// asks for it (nearest period wins within an entry).
    pub runtime_groups: BTreeMap<RuntimeGroup, Period>,
    /// Each system group the config collects, at its period.
    pub system_groups: BTreeMap<SystemGroup, Period>,
    /// The nodes' health settings (`spec.health`), for a config of the operator's namespace.
    pub health: Option<NodeHealth>,
    /// The GPU collector's settings (`spec.gpu`), for a config of the operator's namespace.
    pub gpu: Option<NodeGpu>,
    /// Each runtime entry's tag filter with its cost, counted against the node's budgets.
    pub filter_costs: Vec<FilterCost>,
}

/// A runtime entry's tag filter and what it costs compiled ([`crate::tag_filter`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterCost {
    /// Index into `spec.runtimes`.
    pub entry: usize,
    pub filter: String,
    pub cost: usize,
}

impl ValidConfig {
    /// The order in which configs are given room on a node: the operator namespace's
    /// first, then the oldest (no creation time: last), then by namespace and name. A
    /// config thus never displaces an established one.
    pub fn precedes(&self, other: &ValidConfig) -> std::cmp::Ordering {
        (!self.cluster_wide, self.created.is_none(), self.created, &self.key).cmp(&(
            !other.cluster_wide,
            other.created.is_none(),
            other.created,
            &other.key,
        ))
    }

    /// Names of the extra labels this config puts on Prometheus series (none when its
    /// Prometheus export is off).
    pub fn extra_label_names(&self) -> impl Iterator<Item = &str> {
        self.route.prometheus.iter().flat_map(|p| p.extra_labels.keys().map(String::as_str))
    }

    /// True when this config applies to a node with these labels.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// True when `config` is the object this was validated from (same namespace and name).
    pub fn key_matches(&self, config: &NeuronMonitorConfig) -> bool {
        config.metadata.namespace.as_deref() == Some(self.key.namespace.as_str())
            && config.metadata.name.as_deref() == Some(self.key.name.as_str())
    }
}

/// Checks a config and pre-computes what rendering needs. `operator_namespace` is the
/// namespace whose configs see every application and may collect system groups.
pub fn validate(config: &NeuronMonitorConfig, operator_namespace: &str) -> Result<ValidConfig, Invalid> {
    let key = ConfigKey::of(config)?;
    let cluster_wide = key.namespace == operator_namespace;
    let spec = &config.spec;

    let period = parse_period(spec.period.as_deref(), "spec.period")?.unwrap_or(DEFAULT_PERIOD);
    let selector = Selector::compile(spec.node_selector.as_ref(), "spec.nodeSelector")?;

    let Runtimes { route_runtimes, groups: runtime_groups, applications, filter_costs } =
        runtimes(spec.runtimes.as_deref(), period)?;
    let system_groups = match &spec.system_metrics {
        Some(_) if !cluster_wide => {
            return Err(Invalid::new(
                "spec.systemMetrics",
                format!(
                    "only configs in the operator's namespace ({operator_namespace}) may collect node-level metrics"
                ),
            ))
        }
        Some(system) => system_groups(system, period)?,
        None if cluster_wide => SystemGroup::ALL.map(|g| (g, period)).into_iter().collect(),
        None => BTreeMap::new(),
    };

    if runtime_groups.is_empty() && system_groups.is_empty() {
        return Err(Invalid::new(
            "spec.runtimes",
            "the config collects no metric group: list at least one runtime entry",
        ));
    }

    let health = node_health(spec.health.as_ref(), &key, cluster_wide, operator_namespace)?;
    let gpu = node_gpu(spec.gpu.as_ref(), period, cluster_wide, operator_namespace)?;
    let sinks = spec.sinks.clone().unwrap_or_default();
    let prometheus = prometheus_route(sinks.prometheus.as_ref())?;
    if let Some(cloudwatch) = &sinks.cloudwatch {
        check_cloudwatch(cloudwatch)?;
    }
    if let Some(otlp) = &sinks.otlp {
        check_otlp(otlp)?;
    }
    check_series(spec, cluster_wide)?;

    let route = Route {
        config: key.to_string(),
        namespace: (!cluster_wide).then(|| key.namespace.clone()),
        runtimes: route_runtimes,
        system_groups: system_groups.keys().copied().collect(),
        prometheus,
        cloudwatch: sinks.cloudwatch,
        otlp: sinks.otlp,
    };
    let rendered_bytes = check_rendered_size(&route)?;
    let created = config.metadata.creation_timestamp.as_ref().map(|t| t.0);
    Ok(ValidConfig {
        key,
        cluster_wide,
        created,
        rendered_bytes,
        selector,
        period,
        route,
        applications,
        runtime_groups,
        system_groups,
        health,
        gpu,
        filter_costs,
    })
}

/// What a config's runtime entries select: the route's entries, each runtime group at its
/// shortest period, and the applications they take.
struct Runtimes {
    route_runtimes: Vec<RouteRuntimes>,
    groups: BTreeMap<RuntimeGroup, Period>,
    applications: Applications,
    filter_costs: Vec<FilterCost>,
}

/// `spec.runtimes`; absent: every application with every runtime group at `period`.
fn runtimes(entries: Option<&[RuntimeSelectorSpec]>, period: Period) -> Result<Runtimes, Invalid> {
    let Some(entries) = entries else {
        return Ok(Runtimes {
            route_runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
            groups: RuntimeGroup::ALL.map(|g| (g, period)).into_iter().collect(),
            applications: Applications::All,
            filter_costs: Vec::new(),
        });
    };
    if entries.len() > MAX_RUNTIME_ENTRIES {
        return Err(Invalid::new(
            "spec.runtimes",
            format!("has {} entries; at most {MAX_RUNTIME_ENTRIES}", entries.len()),
        ));
    }
    let mut route_runtimes = Vec::with_capacity(entries.len());
    let mut runtime_groups: BTreeMap<RuntimeGroup, Period> = BTreeMap::new();
    let mut filters: BTreeSet<String> = BTreeSet::new();
    let mut every_application = false;
    let mut filter_costs = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.runtimes[{i}]");
        if let Some(filter) = &entry.tag_filter {
            let cost = check_tag_filter(filter).map_err(|reason| Invalid::new(format!("{field}.tagFilter"), reason))?;
            filters.insert(filter.clone());
            filter_costs.push(FilterCost { entry: i, filter: filter.clone(), cost });
        } else {
            every_application = true;
        }
        let entry_period = parse_period(entry.period.as_deref(), &format!("{field}.period"))?.unwrap_or(period);
        let groups = collect_groups(
            entry.metrics.iter().map(|m| (m.kind, m.period.as_deref())),
            entry_period,
            &format!("{field}.metrics"),
            RuntimeGroup::as_str,
        )?;
        for (&group, &p) in &groups {
            runtime_groups.entry(group).and_modify(|q| *q = (*q).min(p)).or_insert(p);
        }
        route_runtimes
            .push(RouteRuntimes { tag_filter: entry.tag_filter.clone(), groups: groups.into_keys().collect() });
    }
    let applications = if runtime_groups.is_empty() {
        Applications::None
    } else if every_application {
        Applications::All
    } else {
        Applications::Matching(filters.into_iter().collect())
    };
    Ok(Runtimes { route_runtimes, groups: runtime_groups, applications, filter_costs })
}

/// The bytes a route adds to every node's ConfigMap, at most
/// [`MAX_CONFIG_RENDERED_BYTES`]; beyond, the refusal names the part that takes most.
fn check_rendered_size(route: &Route) -> Result<usize, Invalid> {
    let bytes = json_len(route);
    if bytes <= MAX_CONFIG_RENDERED_BYTES {
        return Ok(bytes);
    }
    let parts = [
        ("spec.runtimes", json_len(&route.runtimes)),
        ("spec.sinks.prometheus.extraLabels", json_len(&route.prometheus)),
        ("spec.sinks.cloudwatch", json_len(&route.cloudwatch)),
        ("spec.sinks.otlp", json_len(&route.otlp)),
    ];
    let (field, part) = parts.iter().max_by_key(|(_, n)| *n).copied().unwrap_or(("spec", bytes));
    Err(Invalid::of(
        Refusal::TooLarge,
        field,
        format!(
            "the config renders to {bytes} bytes on every node ({part} of them here); \
             at most {MAX_CONFIG_RENDERED_BYTES} per config"
        ),
    ))
}

/// Length of a value's JSON, without building it; `usize::MAX` if it cannot be encoded.
fn json_len<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

fn system_groups(system: &SystemMetricsSpec, period: Period) -> Result<BTreeMap<SystemGroup, Period>, Invalid> {
    let period = parse_period(system.period.as_deref(), "spec.systemMetrics.period")?.unwrap_or(period);
    collect_groups(
        system.metrics.iter().map(|m| (m.kind, m.period.as_deref())),
        period,
        "spec.systemMetrics.metrics",
        SystemGroup::as_str,
    )
}

/// A list of metric groups with their periods (the group's own, else `default`); each
/// group at most once, and at least one group.
fn collect_groups<'a, G: Ord + Copy>(
    groups: impl Iterator<Item = (G, Option<&'a str>)>,
    default: Period,
    field: &str,
    name: fn(G) -> &'static str,
) -> Result<BTreeMap<G, Period>, Invalid> {
    let mut out = BTreeMap::new();
    for (j, (group, period)) in groups.enumerate() {
        let period = parse_period(period, &format!("{field}[{j}].period"))?.unwrap_or(default);
        if out.insert(group, period).is_some() {
            return Err(Invalid::new(
                format!("{field}[{j}].type"),
                format!("{} is listed more than once", name(group)),
            ));
        }
    }
    if out.is_empty() {
        return Err(Invalid::new(field, "lists no metric group"));
    }
    Ok(out)
}

fn parse_period(value: Option<&str>, field: &str) -> Result<Option<Period>, Invalid> {
    let Some(value) = value else { return Ok(None) };
    let period: Period = value.parse().map_err(|e| Invalid::new(field, format!("{e}; {PERIOD_RANGE}")))?;
    if !(MIN_PERIOD..=MAX_PERIOD).contains(&period) {
        return Err(Invalid::new(field, format!("{value:?} {PERIOD_RANGE}")));
    }
    Ok(Some(period))
}

mod gpu;
mod health;
mod selector;
mod sinks;
mod tag_filter;

use self::{
    gpu::node_gpu,
    health::node_health,
    sinks::{check_cloudwatch, check_otlp, check_series, prometheus_route},
    tag_filter::check_tag_filter,
};
pub use self::{
    health::{check_condition_type, check_error_name, MAX_THRESHOLD_WINDOW, MIN_THRESHOLD_WINDOW},
    selector::Selector,
};
/// Re-exported: callers check a log group where they check the rest of a config.
pub use crate::cloudwatch::logs::check_log_group;

#[cfg(test)]
mod tests;
