//! Validation of a `NeuronMonitorConfig`, done once per config and reconcile pass.
//!
//! The API server's schema refuses most bad input, but the operator never trusts it:
//! everything rendering relies on is checked here and pre-computed into a
//! [`ValidConfig`], so that rendering thousands of nodes only merges ready-made parts.
//! A refusal names the exact field ([`Invalid`]), for the `Accepted` condition. A config
//! whose route would add more than [`MAX_CONFIG_RENDERED_BYTES`] to every node's ConfigMap
//! is refused here as [`Refusal::TooLarge`]; the limits that depend on the other configs
//! of a node are applied by rendering.
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
//!   `sinks.cloudwatch` is copied as given; the agent fills in its defaults.
//! - `nodeSelector` absent: every Neuron node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Mutex, PoisonError};

use api::cloudwatch::sink::SinkSettings;
use api::crd::{CloudWatchSinkSpec, NeuronMonitorConfig, PrometheusSinkSpec, SystemMetricsSpec};
use api::duration::Period;
use api::limits::MAX_CONFIG_RENDERED_BYTES;
use api::monitor_config::{RuntimeGroup, SystemGroup, DEFAULT_PERIOD};
use api::node_config::{PrometheusRoute, Route, RouteRuntimes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use regex::Regex;

/// Bounds of every period (the schema's CEL rule says the same).
const MIN_PERIOD: Period = Period::from_secs(1);
const MAX_PERIOD: Period = Period::from_secs(3600);
const PERIOD_RANGE: &str = "must be a duration from 1s to 1h, such as 1s, 30s or 5m";
/// Schema bounds, repeated so that rendering stays bounded whatever the API server let in.
const MAX_RUNTIME_ENTRIES: usize = 16;
const MAX_TAG_FILTER: usize = 1024;
const MAX_EXTRA_LABELS: usize = 16;
const MAX_LABEL_VALUE: usize = 128;
const MAX_ROLLUPS: usize = 10;
/// Go's regexp (neuron-monitor) refuses larger repeat counts.
const MAX_GO_REPEAT: u32 = 1000;
/// Label names the node agent already puts on its series (see the CRD's CEL rule): an
/// extra label with one of these names would produce duplicate labels.
const RESERVED_LABELS: [&str; 18] = [
    "instance_name",
    "instance_id",
    "instance_type",
    "availability_zone",
    "region",
    "subnet_id",
    "runtime_tag",
    "namespace",
    "pod",
    "container",
    "neuroncore",
    "memory_location",
    "usage_type",
    "error_type",
    "status_type",
    "percentile",
    "event_type",
    "neuron_device_index",
];

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
    /// [`MAX_EXTRA_LABELS_PER_SERIES`]: api::limits::MAX_EXTRA_LABELS_PER_SERIES
    TooManyLabels,
}

impl Refusal {
    pub const ALL: [Refusal; 5] =
        [Refusal::InvalidSpec, Refusal::TooLarge, Refusal::NamespaceLimit, Refusal::NodeLimit, Refusal::TooManyLabels];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::InvalidSpec => "InvalidSpec",
            Refusal::TooLarge => "TooLarge",
            Refusal::NamespaceLimit => "NamespaceLimit",
            Refusal::NodeLimit => "NodeLimit",
            Refusal::TooManyLabels => "TooManyLabels",
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

/// A compiled label selector. No requirement: every node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// `In`/`NotIn` values are sorted, for binary search.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

impl Selector {
    /// Compiles a label selector with Kubernetes' semantics: every requirement must hold;
    /// an empty selector matches everything. `field` is the selector's path.
    pub fn compile(selector: Option<&LabelSelector>, field: &str) -> Result<Selector, Invalid> {
        let Some(selector) = selector else {
            return Ok(Selector::default());
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            let field = format!("{field}.matchLabels[{key:?}]");
            check_label_key(key).map_err(|reason| Invalid::new(&field, reason))?;
            check_label_value(value).map_err(|reason| Invalid::new(&field, reason))?;
            requirements.push(Requirement { key: key.clone(), op: Op::In(vec![value.clone()]) });
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = format!("{field}.matchExpressions[{i}]");
            check_label_key(&expr.key).map_err(|reason| Invalid::new(format!("{field}.key"), reason))?;
            let values = expr.values.as_deref().unwrap_or_default();
            for (j, value) in values.iter().enumerate() {
                check_label_value(value).map_err(|reason| Invalid::new(format!("{field}.values[{j}]"), reason))?;
            }
            let mut sorted = values.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            let op = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(Invalid::new(
                        format!("{field}.values"),
                        format!("must not be empty for operator {}", expr.operator),
                    ))
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(Invalid::new(
                        format!("{field}.values"),
                        format!("must be empty for operator {}", expr.operator),
                    ))
                }
                "In" => Op::In(sorted),
                "NotIn" => Op::NotIn(sorted),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(Invalid::new(
                        format!("{field}.operator"),
                        format!("unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"),
                    ))
                }
            };
            requirements.push(Requirement { key: expr.key.clone(), op });
        }
        Ok(Selector { requirements })
    }

    /// True when the selector matches every node (no requirement).
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(r.key.as_str());
            match &r.op {
                Op::In(values) => value.is_some_and(|v| values.binary_search(v).is_ok()),
                Op::NotIn(values) => value.is_none_or(|v| values.binary_search(v).is_err()),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
            }
        })
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

    let mut route_runtimes = Vec::new();
    let mut runtime_groups: BTreeMap<RuntimeGroup, Period> = BTreeMap::new();
    let mut filters: BTreeSet<String> = BTreeSet::new();
    let mut every_application = false;
    match &spec.runtimes {
        None => {
            every_application = true;
            runtime_groups.extend(RuntimeGroup::ALL.map(|g| (g, period)));
            route_runtimes.push(RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() });
        }
        Some(entries) => {
            if entries.len() > MAX_RUNTIME_ENTRIES {
                return Err(Invalid::new(
                    "spec.runtimes",
                    format!("has {} entries; at most {MAX_RUNTIME_ENTRIES}", entries.len()),
                ));
            }
            for (i, entry) in entries.iter().enumerate() {
                let field = format!("spec.runtimes[{i}]");
                if let Some(filter) = &entry.tag_filter {
                    check_tag_filter(filter).map_err(|reason| Invalid::new(format!("{field}.tagFilter"), reason))?;
                    filters.insert(filter.clone());
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
        }
    }
    let applications = if runtime_groups.is_empty() {
        Applications::None
    } else if every_application {
        Applications::All
    } else {
        Applications::Matching(filters.into_iter().collect())
    };

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

    let sinks = spec.sinks.clone().unwrap_or_default();
    let prometheus = prometheus_route(sinks.prometheus.as_ref())?;
    if let Some(cloudwatch) = &sinks.cloudwatch {
        check_cloudwatch(cloudwatch)?;
    }

    let route = Route {
        config: key.to_string(),
        namespace: (!cluster_wide).then(|| key.namespace.clone()),
        runtimes: route_runtimes,
        system_groups: system_groups.keys().copied().collect(),
        prometheus,
        cloudwatch: sinks.cloudwatch,
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
    })
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

/// A tag filter must compile, stay within what neuron-monitor's Go regexp accepts, and
/// still mean the same when wrapped in a group for the merged `(a)|(b)` filter.
fn check_tag_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() || filter.len() > MAX_TAG_FILTER {
        return Err(format!("must be 1 to {MAX_TAG_FILTER} bytes long"));
    }
    compiles(filter)?;
    check_go_syntax(filter)
}

/// Verdicts of `Regex::new`, by filter. Compiling is ~90% of validation (up to 0.3 ms
/// for a case-insensitive filter) and the controller validates every config on every
/// pass, with the same few filters across namespaces. Bounded: cleared when full.
static COMPILED: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);
const COMPILED_CAPACITY: usize = 8192;

fn compiles(filter: &str) -> Result<(), String> {
    let cached = |cache: &Option<HashMap<String, Result<(), String>>>| cache.as_ref()?.get(filter).cloned();
    if let Some(verdict) = cached(&COMPILED.lock().unwrap_or_else(PoisonError::into_inner)) {
        return verdict;
    }
    // Compiled outside the lock: validations on other threads need not wait.
    let verdict = Regex::new(filter).map(drop).map_err(|e| one_line(&e.to_string()));
    let mut cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = cache.get_or_insert_with(HashMap::new);
    if cache.len() >= COMPILED_CAPACITY {
        cache.clear();
    }
    cache.insert(filter.to_owned(), verdict.clone());
    verdict
}

/// The regex crate's errors draw a caret under the pattern over several lines; a
/// condition message reads better on one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == '~' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The regex crate accepts a little more than Go's RE2 syntax, which neuron-monitor
/// compiles the merged filter with: a filter Go refuses would stop neuron-monitor on
/// every node the config matches, for every config there. Refuses what compiles here
/// but not in Go: flags other than `i`, `m`, `s`, `U` (notably `x`, whose `#` comments
/// would also swallow the `)` of the merged filter), `\<`, `\>`, `\b{…}`, and repeat
/// counts above 1000.
fn check_go_syntax(filter: &str) -> Result<(), String> {
    let chars: Vec<char> = filter.chars().collect();
    let mut i = 0;
    let mut in_class = false;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                let next = chars.get(i + 1).copied();
                match next {
                    Some('<' | '>') => return Err(go_refuses(&format!("\\{}", next.unwrap_or_default()))),
                    Some('b' | 'B') if chars.get(i + 2) == Some(&'{') => {
                        return Err(go_refuses("\\b{...} word boundaries"))
                    }
                    // `\p{…}`, `\x{…}`: skip the braces, they are not a repeat.
                    Some('p' | 'P' | 'x') if chars.get(i + 2) == Some(&'{') => {
                        i += 2;
                        while i < chars.len() && chars[i] != '}' {
                            i += 1;
                        }
                    }
                    _ => i += 1,
                }
            }
            '[' if !in_class => {
                in_class = true;
                // A `]` right after `[` or `[^` is a literal.
                if chars.get(i + 1) == Some(&'^') {
                    i += 1;
                }
                if chars.get(i + 1) == Some(&']') {
                    i += 1;
                }
            }
            '[' if chars.get(i + 1) == Some(&':') => {
                // `[:alpha:]` inside a class.
                while i + 1 < chars.len() && !(chars[i] == ':' && chars[i + 1] == ']') {
                    i += 1;
                }
                i += 1;
            }
            ']' if in_class => in_class = false,
            '(' if !in_class && chars.get(i + 1) == Some(&'?') => {
                let rest = &chars[i + 2..];
                let named = rest.first() == Some(&'<') || rest.starts_with(&['P', '<']);
                if !named {
                    let flags = rest.iter().take_while(|c| **c != ':' && **c != ')');
                    if let Some(flag) = flags.clone().find(|c| !matches!(c, 'i' | 'm' | 's' | 'U' | '-')) {
                        return Err(go_refuses(&format!("the flag {flag:?} (only i, m, s and U)")));
                    }
                }
            }
            '{' if !in_class => {
                let body: String = chars[i + 1..].iter().take_while(|c| **c != '}').collect();
                let counts: Vec<&str> = body.split(',').collect();
                let is_repeat = counts.len() <= 2
                    && !counts[0].is_empty()
                    && counts.iter().all(|c| c.chars().all(|d| d.is_ascii_digit()));
                if is_repeat
                    && counts.iter().any(|c| c.parse::<u64>().map_or(!c.is_empty(), |n| n > u64::from(MAX_GO_REPEAT)))
                {
                    return Err(go_refuses(&format!("repeat counts above {MAX_GO_REPEAT}")));
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn go_refuses(what: &str) -> String {
    format!("neuron-monitor's regular expressions (Go RE2 syntax) do not support {what}")
}

fn prometheus_route(spec: Option<&PrometheusSinkSpec>) -> Result<Option<PrometheusRoute>, Invalid> {
    let Some(spec) = spec else {
        return Ok(Some(PrometheusRoute::default()));
    };
    if spec.enabled == Some(false) {
        return Ok(None);
    }
    let extra_labels = spec.extra_labels.clone().unwrap_or_default();
    let field = "spec.sinks.prometheus.extraLabels";
    if extra_labels.len() > MAX_EXTRA_LABELS {
        return Err(Invalid::new(field, format!("at most {MAX_EXTRA_LABELS} labels")));
    }
    for (name, value) in &extra_labels {
        let field = format!("{field}[{name:?}]");
        let mut chars = name.chars();
        let valid_name = name.len() <= 63
            && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !valid_name {
            return Err(Invalid::new(
                field,
                "is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, at most 63 characters, not starting with __)",
            ));
        }
        if RESERVED_LABELS.contains(&name.as_str()) {
            return Err(Invalid::new(field, "is a label the metrics already carry"));
        }
        if value.chars().count() > MAX_LABEL_VALUE {
            return Err(Invalid::new(field, format!("values are at most {MAX_LABEL_VALUE} characters")));
        }
    }
    Ok(Some(PrometheusRoute { extra_labels }))
}

fn check_cloudwatch(spec: &CloudWatchSinkSpec) -> Result<(), Invalid> {
    let field = "spec.sinks.cloudwatch";
    // The rules the agent applies too; then what only a list in the spec can get wrong.
    SinkSettings::check(spec).map_err(|e| Invalid::new(format!("{field}.{}", e.field), e.reason))?;
    // A dimension listed twice, or more than CloudWatch takes.
    if let Some(dimensions) = &spec.dimensions {
        check_set(dimensions, 30, &format!("{field}.dimensions"))?;
    }
    let rollups = spec.rollups.as_deref().unwrap_or_default();
    if rollups.len() > MAX_ROLLUPS {
        return Err(Invalid::new(format!("{field}.rollups"), format!("at most {MAX_ROLLUPS} roll-ups")));
    }
    for (i, rollup) in rollups.iter().enumerate() {
        check_set(rollup, 30, &format!("{field}.rollups[{i}]"))?;
    }
    if let Some(metrics) = &spec.metrics {
        check_set(metrics, usize::MAX, &format!("{field}.metrics"))?;
    }
    Ok(())
}

fn check_set<T: Ord + fmt::Debug>(items: &[T], max: usize, field: &str) -> Result<(), Invalid> {
    if items.len() > max {
        return Err(Invalid::new(field, format!("at most {max} entries")));
    }
    let mut seen = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        if !seen.insert(item) {
            return Err(Invalid::new(format!("{field}[{i}]"), format!("{item:?} is listed twice")));
        }
    }
    Ok(())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric).
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let labels_ok = prefix.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
        if prefix.len() > 253 || !labels_ok {
            return Err(format!("{key:?}: the prefix must be a DNS subdomain such as example.com"));
        }
    }
    if name.is_empty() || !is_label_name(name) {
        return Err(format!(
            "{key:?} is not a label key (a name of at most 63 alphanumerics, '-', '_' or '.', \
             starting and ending alphanumeric, with an optional DNS-subdomain prefix and '/')"
        ));
    }
    Ok(())
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a label value (at most 63 alphanumerics, '-', '_' or '.', \
             starting and ending alphanumeric)"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests;
