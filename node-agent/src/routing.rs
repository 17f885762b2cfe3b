//! The routing table of the node's configuration, compiled: which
//! NeuronMonitorConfig receives which applications and groups, and how. Every sink asks
//! one question of it, [`Selection::groups`]: which groups a configuration takes of an
//! application in this namespace with this tag.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
};

use api::{
    limits::MAX_EXTRA_LABELS_PER_SERIES,
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route},
};
use regex::Regex;
use tracing::warn;

/// Routes with their tag filters compiled. Empty means the built-in configuration:
/// everything goes to Prometheus. Replaced as a whole when the configuration changes.
#[derive(Debug, Default)]
pub struct Routing {
    routes: Vec<CompiledRoute>,
    /// Set once extra labels were left off a series under this routing: logged once.
    labels_dropped_logged: AtomicBool,
}

/// The routing table in force, shared by the sinks and the configuration's activation.
/// Readers take the whole table ([`SharedRouting::current`]) and keep it for one pass;
/// a new configuration replaces it as a whole.
#[derive(Clone, Debug, Default)]
pub struct SharedRouting(Arc<RwLock<Arc<Routing>>>);

impl SharedRouting {
    pub fn current(&self) -> Arc<Routing> {
        // A poisoned lock only means a writer panicked half-way through a pointer swap:
        // the table in it is whole either way.
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn replace(&self, routing: Routing) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(routing);
    }
}

/// Which applications one configuration takes, and which of their groups: its namespace
/// (`None`: every application's) and its runtime entries with their tag filters compiled.
#[derive(Clone, Debug)]
pub struct Selection {
    namespace: Option<String>,
    /// (filter, groups) per runtime entry; a `None` filter takes every application.
    entries: Vec<(Option<Regex>, Vec<RuntimeGroup>)>,
}

impl Selection {
    /// The groups this configuration takes of an application of `namespace` (`None`: not
    /// in a pod) whose tag is `tag`, merged over its matching entries in their order;
    /// `None` when no entry takes the application.
    pub fn groups(&self, namespace: Option<&str>, tag: &str) -> Option<Vec<RuntimeGroup>> {
        if !self.sees(namespace) {
            return None;
        }
        let mut groups: Option<Vec<RuntimeGroup>> = None;
        // neuron-monitor matches a filter anywhere in the tag; so does `Regex::is_match`.
        for (_, entry_groups) in self.entries.iter().filter(|(f, _)| f.as_ref().is_none_or(|f| f.is_match(tag))) {
            let groups = groups.get_or_insert_with(Vec::new);
            for g in entry_groups {
                if !groups.contains(g) {
                    groups.push(*g);
                }
            }
        }
        groups
    }

    /// Whether this configuration takes `group` of what has no tag (a core no
    /// application uses) in `namespace`: only an entry without a tag filter does.
    pub fn takes_untagged(&self, namespace: Option<&str>, group: RuntimeGroup) -> bool {
        self.sees(namespace) && self.entries.iter().any(|(f, groups)| f.is_none() && groups.contains(&group))
    }

    /// Whether it sees what belongs to `namespace` (`None`: to no pod).
    pub fn sees(&self, namespace: Option<&str>) -> bool {
        self.namespace.as_deref().is_none_or(|ns| namespace == Some(ns))
    }
}

#[derive(Debug)]
struct CompiledRoute {
    route: Route,
    selection: Selection,
}

/// What Prometheus exports of one runtime.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrometheusView {
    pub groups: Vec<RuntimeGroup>,
    /// At most [`MAX_EXTRA_LABELS_PER_SERIES`].
    pub extra_labels: BTreeMap<String, String>,
    /// Label names matching routes wanted beyond the cap, left off.
    pub dropped_labels: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("route {config}: tag filter {filter:?} does not compile: {source}")]
pub struct RoutingError {
    config: String,
    filter: String,
    source: regex::Error,
}

impl Routing {
    pub fn compile(config: &NodeConfig) -> Result<Self, RoutingError> {
        let mut routes = Vec::with_capacity(config.routes.len());
        for route in &config.routes {
            let mut entries = Vec::with_capacity(route.runtimes.len());
            for entry in &route.runtimes {
                let filter = match &entry.tag_filter {
                    None => None,
                    Some(f) => Some(Regex::new(f).map_err(|source| RoutingError {
                        config: route.config.clone(),
                        filter: f.clone(),
                        source,
                    })?),
                };
                entries.push((filter, entry.groups.clone()));
            }
            let selection = Selection { namespace: route.namespace.clone(), entries };
            routes.push(CompiledRoute { route: route.clone(), selection });
        }
        Ok(Routing { routes, labels_dropped_logged: AtomicBool::new(false) })
    }

    pub fn is_builtin(&self) -> bool {
        self.routes.is_empty()
    }

    /// The Prometheus view of a runtime: groups any Prometheus route gives it, and
    /// extra labels (the first route, in config order, wins a key; at most
    /// [`MAX_EXTRA_LABELS_PER_SERIES`], the first in config order, however many
    /// configurations match). `None`: not exported.
    pub fn prometheus_view(&self, namespace: Option<&str>, tag: &str) -> Option<PrometheusView> {
        if self.is_builtin() {
            return Some(PrometheusView { groups: RuntimeGroup::ALL.to_vec(), ..PrometheusView::default() });
        }
        let mut view: Option<PrometheusView> = None;
        let mut dropped: BTreeSet<&str> = BTreeSet::new();
        for compiled in &self.routes {
            let Some(prometheus) = &compiled.route.prometheus else { continue };
            let Some(groups) = compiled.selection.groups(namespace, tag) else { continue };
            let v = view.get_or_insert_with(PrometheusView::default);
            for g in groups {
                if !v.groups.contains(&g) {
                    v.groups.push(g);
                }
            }
            for (k, val) in &prometheus.extra_labels {
                if v.extra_labels.contains_key(k) {
                    continue;
                }
                if v.extra_labels.len() < MAX_EXTRA_LABELS_PER_SERIES {
                    v.extra_labels.insert(k.clone(), val.clone());
                } else {
                    dropped.insert(k);
                }
            }
        }
        if let Some(v) = view.as_mut().filter(|_| !dropped.is_empty()) {
            v.dropped_labels = dropped.len();
            if !self.labels_dropped_logged.swap(true, Ordering::Relaxed) {
                warn!(
                    runtime = tag,
                    namespace = namespace.unwrap_or(""),
                    kept = MAX_EXTRA_LABELS_PER_SERIES,
                    dropped = dropped.len(),
                    "the configurations matching a runtime add more extra labels than a series may carry; \
                     the labels of later configurations are left off (logged once per configuration change)"
                );
            }
        }
        view
    }

    /// Routes with a CloudWatch sink, each with its selection.
    pub fn cloudwatch_routes(&self) -> impl Iterator<Item = (&Route, &Selection)> {
        self.routes.iter().filter(|c| c.route.cloudwatch.is_some()).map(|c| (&c.route, &c.selection))
    }

    /// Whether a Prometheus route sees what belongs to a pod of `namespace` (`None`: to no
    /// pod, the node's): a route of the operator's namespace (no namespace) sees all, a
    /// team's route its own namespace's.
    pub fn prometheus_sees(&self, namespace: Option<&str>) -> bool {
        self.is_builtin() || self.routes.iter().any(|r| r.route.prometheus.is_some() && r.selection.sees(namespace))
    }

    /// Routes with an OTLP sink, each with its selection.
    pub fn otlp_routes(&self) -> impl Iterator<Item = (&Route, &Selection)> {
        self.routes.iter().filter(|c| c.route.otlp.is_some()).map(|c| (&c.route, &c.selection))
    }

    /// Whether an OTLP sink in force takes its headers from a Secret.
    pub fn names_otlp_headers(&self) -> bool {
        self.otlp_routes().any(|(route, _)| route.otlp.as_ref().is_some_and(|o| o.headers_secret.is_some()))
    }

    /// Whether Prometheus exports a system group.
    pub fn prometheus_system(&self, group: SystemGroup) -> bool {
        self.is_builtin()
            || self.routes.iter().any(|r| r.route.prometheus.is_some() && r.route.system_groups.contains(&group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::node_config::{PrometheusRoute, RouteRuntimes};

    fn route(config: &str, namespace: Option<&str>, filter: Option<&str>, groups: &[RuntimeGroup]) -> Route {
        Route {
            config: config.to_owned(),
            namespace: namespace.map(str::to_owned),
            runtimes: vec![RouteRuntimes { tag_filter: filter.map(str::to_owned), groups: groups.to_vec() }],
            system_groups: vec![],
            prometheus: Some(PrometheusRoute {
                extra_labels: BTreeMap::from([("team".to_owned(), config.to_owned())]),
            }),
            cloudwatch: None,
            otlp: None,
        }
    }

    #[test]
    fn builtin_exports_everything() {
        let routing = Routing::default();
        assert_eq!(routing.prometheus_view(None, "x").unwrap().groups, RuntimeGroup::ALL.to_vec());
        assert!(routing.prometheus_system(SystemGroup::MemoryInfo));
    }

    #[test]
    fn routes_select_by_namespace_and_tag_and_merge_groups() {
        let config = NodeConfig {
            monitor: Default::default(),
            routes: vec![
                route("a/one", Some("a"), Some("^serve"), &[RuntimeGroup::MemoryUsed]),
                route("ops/all", None, None, &[RuntimeGroup::NeuroncoreCounters]),
            ],
            health: None,
        };
        let routing = Routing::compile(&config).unwrap();
        let view = routing.prometheus_view(Some("a"), "serve-1").unwrap();
        assert_eq!(view.groups, vec![RuntimeGroup::MemoryUsed, RuntimeGroup::NeuroncoreCounters]);
        assert_eq!(view.extra_labels["team"], "a/one");
        let other = routing.prometheus_view(Some("b"), "serve-1").unwrap();
        assert_eq!(other.groups, vec![RuntimeGroup::NeuroncoreCounters]);
        assert!(!routing.prometheus_system(SystemGroup::VcpuUsage));
    }

    #[test]
    fn what_a_namespace_holds_is_seen_by_its_routes_and_the_cluster_wide_ones() {
        let team = route("a/one", Some("a"), Some("^serve"), &[RuntimeGroup::MemoryUsed]);
        let mut cloudwatch_only = route("b/one", Some("b"), None, &[RuntimeGroup::MemoryUsed]);
        cloudwatch_only.prometheus = None;
        let teams = NodeConfig { monitor: Default::default(), routes: vec![team, cloudwatch_only], health: None };
        let routing = Routing::compile(&teams).unwrap();
        assert!(routing.prometheus_sees(Some("a")));
        assert!(!routing.prometheus_sees(Some("b")) && !routing.prometheus_sees(None));
        let mut all = teams.clone();
        all.routes.push(route("ops/all", None, None, &[]));
        let routing = Routing::compile(&all).unwrap();
        assert!(routing.prometheus_sees(Some("b")) && routing.prometheus_sees(None));
        assert!(Routing::default().prometheus_sees(None));
    }

    #[test]
    fn nothing_exported_without_a_prometheus_route() {
        let mut r = route("a/one", Some("a"), None, &[RuntimeGroup::MemoryUsed]);
        r.prometheus = None;
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![r], health: None }).unwrap();
        assert_eq!(routing.prometheus_view(Some("a"), "x"), None);
    }

    #[test]
    fn extra_labels_of_many_matching_routes_are_capped_per_series() {
        // 60 configurations matching the same runtime, 16 labels each, distinct names.
        let routes = (0..60)
            .map(|c| {
                let mut r = route(&format!("team/c{c:02}"), None, None, &[RuntimeGroup::MemoryUsed]);
                let labels = (0..16).map(|l| (format!("c{c:02}_l{l:02}"), "v".to_owned())).collect();
                r.prometheus = Some(PrometheusRoute { extra_labels: labels });
                r
            })
            .collect();
        let routing = Routing::compile(&NodeConfig { monitor: Default::default(), routes, health: None }).unwrap();
        let view = routing.prometheus_view(None, "x").unwrap();
        assert_eq!(view.extra_labels.len(), MAX_EXTRA_LABELS_PER_SERIES);
        assert_eq!(view.dropped_labels, 60 * 16 - MAX_EXTRA_LABELS_PER_SERIES);
        // The first configurations, in order, keep theirs.
        assert!(view.extra_labels.contains_key("c00_l00") && view.extra_labels.contains_key("c01_l15"));
        assert!(!view.extra_labels.contains_key("c02_l00"));
    }

    #[test]
    fn a_bad_filter_is_an_error() {
        let config = NodeConfig {
            monitor: Default::default(),
            routes: vec![route("a/one", None, Some("("), &[])],
            health: None,
        };
        assert!(Routing::compile(&config).is_err());
    }
}
