//! The routing table of the node's configuration, compiled: which
//! NeuronMonitorConfig receives which applications and groups, and how. Every sink asks
//! one question of it, [`Selection::groups`]: which groups a configuration takes of an
//! application in this namespace with this tag.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
};

use api::{
    limits::{MAX_EXTRA_LABELS_PER_SERIES, MAX_NODE_TAG_FILTER_COST},
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route},
    tag_filter::{TagFilter, TagFilterError},
};
use tracing::warn;

/// Routes with their tag filters compiled. Empty means the built-in configuration:
/// everything goes to Prometheus. Replaced as a whole when the configuration changes.
#[derive(Debug, Default)]
pub struct Routing {
    routes: Vec<CompiledRoute>,
    /// Routes left out, in config order: the node's filters would cost too much.
    refused: Vec<RefusedRoute>,
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
    /// Identical filters of the node share one compiled filter.
    entries: Vec<(Option<Arc<TagFilter>>, Vec<RuntimeGroup>)>,
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
        // neuron-monitor matches a filter anywhere in the tag; so does `TagFilter::is_match`.
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
    /// `neuron_runtime_loaded_model_info`: a route taking the runtime's `memory_used`
    /// asked for it.
    pub loaded_model_info: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("route {config}: tag filter {filter:?} does not compile: {reason}")]
pub struct RoutingError {
    config: String,
    filter: String,
    reason: String,
}

/// A route left out of the routing table, and why: the others keep working.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedRoute {
    pub config: String,
    /// `tag_filter_cost` (one filter over the per-filter limit) or `tag_filter_budget`
    /// (the node's distinct filters over [`MAX_NODE_TAG_FILTER_COST`]).
    pub reason: &'static str,
    pub detail: String,
}

/// The node's compiled filters, one per distinct text, and what they cost together.
#[derive(Default)]
struct FilterCache {
    compiled: HashMap<String, Arc<TagFilter>>,
    cost: usize,
}

impl FilterCache {
    /// The compiled filters of a route's entries, sharing those compiled before; `None`
    /// for an entry without a filter. Nothing is kept when the route is refused.
    fn route_filters(&mut self, route: &Route) -> Result<Vec<Option<Arc<TagFilter>>>, RouteProblem> {
        let mut new: Vec<(&str, Arc<TagFilter>)> = Vec::new();
        let mut cost = self.cost;
        let mut filters = Vec::with_capacity(route.runtimes.len());
        for text in route.runtimes.iter().map(|e| e.tag_filter.as_deref()) {
            let Some(text) = text else {
                filters.push(None);
                continue;
            };
            let known = self.compiled.get(text).or_else(|| new.iter().find(|(t, _)| *t == text).map(|(_, f)| f));
            if let Some(filter) = known {
                filters.push(Some(filter.clone()));
                continue;
            }
            let filter = Arc::new(TagFilter::new(text).map_err(|e| RouteProblem::Filter(text.to_owned(), e))?);
            cost = cost.saturating_add(filter.cost());
            if cost > MAX_NODE_TAG_FILTER_COST {
                return Err(RouteProblem::OverBudget(cost));
            }
            new.push((text, filter.clone()));
            filters.push(Some(filter));
        }
        self.cost = cost;
        self.compiled.extend(new.into_iter().map(|(t, f)| (t.to_owned(), f)));
        Ok(filters)
    }
}

enum RouteProblem {
    Filter(String, TagFilterError),
    OverBudget(usize),
}

/// A route's problem as a refusal, or the error of a filter that does not compile.
fn refusal(route: &Route, problem: RouteProblem) -> Result<RefusedRoute, RoutingError> {
    let config = route.config.clone();
    match problem {
        RouteProblem::Filter(filter, e) if e.too_costly() => {
            Ok(RefusedRoute { config, reason: "tag_filter_cost", detail: format!("tag filter {filter:?} {e}") })
        }
        RouteProblem::Filter(filter, e) => Err(RoutingError { config, filter, reason: e.to_string() }),
        RouteProblem::OverBudget(cost) => Ok(RefusedRoute {
            config,
            reason: "tag_filter_budget",
            detail: format!(
                "the node's distinct tag filters would take {} KiB compiled; at most {} KiB",
                cost.div_ceil(1024),
                MAX_NODE_TAG_FILTER_COST / 1024
            ),
        }),
    }
}

impl Routing {
    /// Compiles the routes in config order. A filter that does not compile is an error
    /// (the configuration was never valid); a route whose filters would take the node's
    /// over [`MAX_NODE_TAG_FILTER_COST`], or one of whose filters alone costs too much
    /// (rendered by another version), is left out and listed in [`Routing::refused`].
    pub fn compile(config: &NodeConfig) -> Result<Self, RoutingError> {
        let mut routes = Vec::with_capacity(config.routes.len());
        let mut refused = Vec::new();
        let mut cache = FilterCache::default();
        for route in &config.routes {
            let filters = match cache.route_filters(route) {
                Ok(filters) => filters,
                Err(problem) => {
                    refused.push(refusal(route, problem)?);
                    continue;
                }
            };
            let groups = route.runtimes.iter().map(|e| e.groups.clone());
            let selection =
                Selection { namespace: route.namespace.clone(), entries: filters.into_iter().zip(groups).collect() };
            routes.push(CompiledRoute { route: route.clone(), selection });
        }
        Ok(Routing { routes, refused, labels_dropped_logged: AtomicBool::new(false) })
    }

    /// Routes left out of this table because of what their filters cost.
    pub fn refused(&self) -> &[RefusedRoute] {
        &self.refused
    }

    pub fn is_builtin(&self) -> bool {
        self.routes.is_empty() && self.refused.is_empty()
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
            v.loaded_model_info |= prometheus.loaded_model_info && groups.contains(&RuntimeGroup::MemoryUsed);
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
                loaded_model_info: false,
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
        assert!(!routing.prometheus_view(None, "x").unwrap().loaded_model_info, "every group, not every family");
    }

    /// A route asks for the loaded models' info series of what it takes `memory_used` of.
    #[test]
    fn loaded_model_info_where_a_route_taking_memory_used_asks_for_it() {
        let mut models = route("a/models", Some("a"), Some("^serve"), &[RuntimeGroup::MemoryUsed]);
        models.prometheus.as_mut().unwrap().loaded_model_info = true;
        let mut counters = route("ops/counters", None, None, &[RuntimeGroup::NeuroncoreCounters]);
        counters.prometheus.as_mut().unwrap().loaded_model_info = true;
        let plain = route("ops/memory", None, None, &[RuntimeGroup::MemoryUsed]);
        let config =
            NodeConfig { monitor: Default::default(), routes: vec![models, counters, plain], health: None, gpu: None };
        let routing = Routing::compile(&config).unwrap();
        let info = |namespace, tag| routing.prometheus_view(namespace, tag).unwrap().loaded_model_info;
        assert!(info(Some("a"), "serve-1"));
        assert!(!info(Some("a"), "train-1"), "the route asking does not take it");
        assert!(!info(Some("b"), "serve-1"), "nor another namespace's");
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
            gpu: None,
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
        let teams =
            NodeConfig { monitor: Default::default(), routes: vec![team, cloudwatch_only], health: None, gpu: None };
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
            Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![r], health: None, gpu: None })
                .unwrap();
        assert_eq!(routing.prometheus_view(Some("a"), "x"), None);
    }

    #[test]
    fn extra_labels_of_many_matching_routes_are_capped_per_series() {
        // 60 configurations matching the same runtime, 16 labels each, distinct names.
        let routes = (0..60)
            .map(|c| {
                let mut r = route(&format!("team/c{c:02}"), None, None, &[RuntimeGroup::MemoryUsed]);
                let labels = (0..16).map(|l| (format!("c{c:02}_l{l:02}"), "v".to_owned())).collect();
                r.prometheus = Some(PrometheusRoute { extra_labels: labels, loaded_model_info: false });
                r
            })
            .collect();
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes, health: None, gpu: None }).unwrap();
        let view = routing.prometheus_view(None, "x").unwrap();
        assert_eq!(view.extra_labels.len(), MAX_EXTRA_LABELS_PER_SERIES);
        assert_eq!(view.dropped_labels, 60 * 16 - MAX_EXTRA_LABELS_PER_SERIES);
        // The first configurations, in order, keep theirs.
        assert!(view.extra_labels.contains_key("c00_l00") && view.extra_labels.contains_key("c01_l15"));
        assert!(!view.extra_labels.contains_key("c02_l00"));
    }

    fn route_with_filters(config: &str, filters: &[String]) -> Route {
        let mut r = route(config, Some("a"), None, &[RuntimeGroup::MemoryUsed]);
        r.runtimes = filters
            .iter()
            .map(|f| RouteRuntimes { tag_filter: Some(f.clone()), groups: vec![RuntimeGroup::MemoryUsed] })
            .collect();
        r
    }

    fn filters_of(routing: &Routing) -> Vec<&Arc<TagFilter>> {
        routing.routes.iter().flat_map(|r| r.selection.entries.iter().filter_map(|(f, _)| f.as_ref())).collect()
    }

    #[test]
    fn identical_filters_compile_once() {
        // Issue 24's tenant: 3 configs x 16 entries of the same filter.
        let heavy = vec![r"[\w]{200}r0".to_owned(); 16];
        let routes = (0..3).map(|c| route_with_filters(&format!("a/c{c}"), &heavy)).collect();
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes, health: None, gpu: None }).unwrap();
        let filters = filters_of(&routing);
        assert_eq!(filters.len(), 48);
        assert!(filters.iter().all(|f| Arc::ptr_eq(f, filters[0])), "one compiled filter shared by every entry");
        assert!(routing.refused().is_empty());
        let tag = format!("{}r0", "x".repeat(200));
        assert_eq!(routing.prometheus_view(Some("a"), &tag).map(|v| v.groups), Some(vec![RuntimeGroup::MemoryUsed]));
    }

    /// Distinct costly filters: the routes past the node's budget are left out, whole and
    /// in config order; the earlier ones keep working.
    #[test]
    fn routes_past_the_node_filter_budget_are_refused_and_the_others_kept() {
        let costly = |c: usize, e: usize| format!(r"\pL{{6}}{c:03}x{e:02}");
        let one = TagFilter::new(&costly(0, 0)).unwrap().cost();
        let per_route = 4;
        let count = MAX_NODE_TAG_FILTER_COST / (one * per_route) + 2;
        let routes = (0..count)
            .map(|c| {
                let filters: Vec<String> = (0..per_route).map(|e| costly(c, e)).collect();
                route_with_filters(&format!("a/c{c:03}"), &filters)
            })
            .collect();
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes, health: None, gpu: None }).unwrap();
        let refused: Vec<&str> = routing.refused().iter().map(|r| r.config.as_str()).collect();
        assert!(!refused.is_empty() && refused.len() <= 3, "{refused:?}");
        assert_eq!(refused.last().copied(), Some(format!("a/c{:03}", count - 1).as_str()));
        assert!(routing.refused().iter().all(|r| r.reason == "tag_filter_budget"));
        let total: usize = filters_of(&routing).iter().map(|f| f.cost()).sum();
        assert!(total <= MAX_NODE_TAG_FILTER_COST, "{total}");
        // The first route still selects its applications.
        assert!(routing.prometheus_view(Some("a"), "éé\u{101}\u{103}\u{105}ë000x00").is_some());
        assert!(!routing.is_builtin());
    }

    #[test]
    fn a_filter_over_the_cost_limit_refuses_its_route_only() {
        let routes = vec![
            route_with_filters("a/costly", &[r"\pL{1000}".to_owned()]),
            route("a/fine", Some("a"), Some("^serve"), &[RuntimeGroup::MemoryUsed]),
        ];
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes, health: None, gpu: None }).unwrap();
        let refused: Vec<(&str, &str)> = routing.refused().iter().map(|r| (r.config.as_str(), r.reason)).collect();
        assert_eq!(refused, vec![("a/costly", "tag_filter_cost")]);
        assert!(routing.prometheus_view(Some("a"), "serve-1").is_some());
    }

    #[test]
    fn a_bad_filter_is_an_error() {
        let config = NodeConfig {
            monitor: Default::default(),
            routes: vec![route("a/one", None, Some("("), &[])],
            health: None,
            gpu: None,
        };
        assert!(Routing::compile(&config).is_err());
    }
}
