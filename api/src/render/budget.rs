//! Room on a node: what configs may add to one node's ConfigMap and to one series (the
//! limits and their reasons are in [`crate::limits`]).
//!
//! Configs are given room in a fixed order ([`ValidConfig::precedes`]): the operator
//! namespace's first, then the oldest. A config that does not fit on one of its nodes is
//! refused on every node (never half-applied) and takes no room anywhere, so what it
//! would have taken stays free for the configs after it. The result depends only on the
//! configs and the nodes, never on the order they are given in, and a new config can
//! never displace an established one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::limits::{
    MAX_CONFIGS_PER_NAMESPACE_PER_NODE, MAX_CONFIGS_PER_NODE, MAX_EXTRA_LABELS_PER_SERIES,
    MAX_NAMESPACE_RENDERED_BYTES_PER_NODE, MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE, MAX_NODE_RENDERED_BYTES,
    MAX_NODE_TAG_FILTER_COST,
};

use crate::validate::{Invalid, Refusal, ValidConfig};

/// Nodes that share their configs: a representative name and how many there are.
pub struct GroupNodes<'a> {
    /// Indices into the configs given to [`share_out`] of those matching these nodes.
    pub configs: &'a [usize],
    /// The first node, named in a refusal.
    pub first_node: &'a str,
    pub node_count: usize,
}

/// Shares out the room on every group of nodes among `configs`; returns the refused ones
/// (by index into `configs`) with the reason, the field, and where they did not fit.
pub fn share_out(configs: &[&ValidConfig], groups: &[GroupNodes<'_>]) -> BTreeMap<usize, Invalid> {
    let mut groups_of: Vec<Vec<usize>> = vec![Vec::new(); configs.len()];
    for (g, group) in groups.iter().enumerate() {
        for &c in group.configs {
            if let Some(of) = groups_of.get_mut(c) {
                of.push(g);
            }
        }
    }
    let mut order: Vec<usize> = (0..configs.len()).collect();
    order.sort_by(|&a, &b| configs[a].precedes(configs[b]));

    let mut budgets: Vec<NodeBudget> = groups.iter().map(|_| NodeBudget::default()).collect();
    let mut refused = BTreeMap::new();
    for c in order {
        let config = configs[c];
        let mut first: Option<(usize, Misfit)> = None;
        let mut misfit_nodes = 0;
        for &g in &groups_of[c] {
            if let Err(misfit) = budgets[g].check(config) {
                misfit_nodes += groups[g].node_count;
                first.get_or_insert((g, misfit));
            }
        }
        match first {
            None => {
                for &g in &groups_of[c] {
                    budgets[g].admit(config);
                }
            }
            Some((g, misfit)) => {
                let matched: usize = groups_of[c].iter().map(|&g| groups[g].node_count).sum();
                let reason = format!(
                    "does not fit on {misfit_nodes} of {matched} matched node(s), such as {}: {}; \
                     the operator namespace's configs, then the oldest, are given room first",
                    groups[g].first_node, misfit.reason
                );
                refused.insert(c, Invalid::of(misfit.kind, misfit.field, reason));
            }
        }
    }
    refused
}

/// What the configs admitted so far take on one group of nodes.
#[derive(Default)]
struct NodeBudget<'a> {
    configs: usize,
    bytes: usize,
    /// Extra-label names of the admitted configs of the operator's namespace: they land
    /// on every series of the node.
    cluster_labels: BTreeSet<&'a str>,
    namespaces: HashMap<&'a str, NamespaceUse<'a>>,
    /// Distinct tag filters of the admitted configs (the agent compiles each once).
    filters: FilterUse<'a>,
}

/// Distinct tag filters and their summed cost ([`crate::tag_filter::TagFilter::cost`]).
#[derive(Default)]
struct FilterUse<'a> {
    filters: BTreeSet<&'a str>,
    cost: usize,
}

impl<'a> FilterUse<'a> {
    /// The first filter of `config` that would take the cost above `limit`, with the
    /// cost then; a filter already counted (here or earlier in the config) adds nothing.
    fn first_over(&self, config: &ValidConfig, limit: usize) -> Option<(usize, usize)> {
        let mut cost = self.cost;
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for f in &config.filter_costs {
            if self.filters.contains(f.filter.as_str()) || !seen.insert(f.filter.as_str()) {
                continue;
            }
            cost = cost.saturating_add(f.cost);
            if cost > limit {
                return Some((f.entry, cost));
            }
        }
        None
    }

    fn admit(&mut self, config: &'a ValidConfig) {
        for f in &config.filter_costs {
            if self.filters.insert(f.filter.as_str()) {
                self.cost = self.cost.saturating_add(f.cost);
            }
        }
    }
}

#[derive(Default)]
struct NamespaceUse<'a> {
    configs: usize,
    bytes: usize,
    /// Extra-label names of the namespace's configs: on its own applications' series.
    labels: BTreeSet<&'a str>,
    filters: FilterUse<'a>,
}

/// Why a config does not fit on a node.
struct Misfit {
    kind: Refusal,
    field: String,
    reason: String,
}

const SELECTOR: &str = "spec.nodeSelector";
const LABELS: &str = "spec.sinks.prometheus.extraLabels";

impl<'a> NodeBudget<'a> {
    fn check(&self, config: &ValidConfig) -> Result<(), Misfit> {
        let namespace = config.key.namespace.as_str();
        let ns = self.namespaces.get(namespace);
        let (ns_configs, ns_bytes) = ns.map_or((0, 0), |u| (u.configs, u.bytes));
        if ns_configs + 1 > MAX_CONFIGS_PER_NAMESPACE_PER_NODE {
            return Err(misfit(
                Refusal::NamespaceLimit,
                SELECTOR,
                format!(
                    "namespace {namespace} already has {ns_configs} configs there; \
                     at most {MAX_CONFIGS_PER_NAMESPACE_PER_NODE} per namespace per node"
                ),
            ));
        }
        let bytes = ns_bytes.saturating_add(config.rendered_bytes);
        if bytes > MAX_NAMESPACE_RENDERED_BYTES_PER_NODE {
            return Err(misfit(
                Refusal::NamespaceLimit,
                SELECTOR,
                format!(
                    "namespace {namespace}'s configs would take {bytes} bytes of the node's configuration; \
                     at most {MAX_NAMESPACE_RENDERED_BYTES_PER_NODE} per namespace per node"
                ),
            ));
        }
        if self.configs + 1 > MAX_CONFIGS_PER_NODE {
            return Err(misfit(
                Refusal::NodeLimit,
                SELECTOR,
                format!("the node already carries {} configs; at most {MAX_CONFIGS_PER_NODE}", self.configs),
            ));
        }
        let bytes = self.bytes.saturating_add(config.rendered_bytes);
        if bytes > MAX_NODE_RENDERED_BYTES {
            return Err(misfit(
                Refusal::NodeLimit,
                SELECTOR,
                format!("the node's configs would take {bytes} bytes; at most {MAX_NODE_RENDERED_BYTES}"),
            ));
        }
        self.check_filters(config, ns.map(|u| &u.filters))?;
        let labels = self.labels_with(config);
        if labels > MAX_EXTRA_LABELS_PER_SERIES {
            return Err(misfit(
                Refusal::TooManyLabels,
                LABELS,
                format!(
                    "with the configs given room before it, a series would carry {labels} extra labels; \
                     at most {MAX_EXTRA_LABELS_PER_SERIES} per series"
                ),
            ));
        }
        Ok(())
    }

    /// The distinct tag filters of the namespace, and of the node, within their cost.
    fn check_filters(&self, config: &ValidConfig, ns: Option<&FilterUse<'_>>) -> Result<(), Misfit> {
        let namespace = config.key.namespace.as_str();
        let kib = |bytes: usize| bytes.div_ceil(1024);
        let empty = FilterUse::default();
        if let Some((entry, cost)) = ns.unwrap_or(&empty).first_over(config, MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE) {
            return Err(misfit(
                Refusal::NamespaceLimit,
                filter_field(entry),
                format!(
                    "namespace {namespace}'s distinct tag filters would take {} KiB compiled; at most {} KiB per \
                     namespace per node",
                    kib(cost),
                    kib(MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE)
                ),
            ));
        }
        if let Some((entry, cost)) = self.filters.first_over(config, MAX_NODE_TAG_FILTER_COST) {
            return Err(misfit(
                Refusal::NodeLimit,
                filter_field(entry),
                format!(
                    "the node's distinct tag filters would take {} KiB compiled; at most {} KiB",
                    kib(cost),
                    kib(MAX_NODE_TAG_FILTER_COST)
                ),
            ));
        }
        Ok(())
    }

    /// The most distinct extra labels a series of the node would carry with `config`: a
    /// team's application gets the operator namespace's labels and its namespace's; an
    /// application of no team only the operator namespace's. Counted without building
    /// sets: this runs for every config on every group of nodes.
    fn labels_with(&self, config: &ValidConfig) -> usize {
        let Some(new) = config.route.prometheus.as_ref().map(|p| &p.extra_labels).filter(|l| !l.is_empty()) else {
            return 0;
        };
        let cluster = &self.cluster_labels;
        if config.cluster_wide {
            // On every series: the operator namespace's labels with the new ones, plus the
            // most any namespace adds to them.
            let on_every = cluster.len() + new.keys().filter(|l| !cluster.contains(l.as_str())).count();
            let most_added = self
                .namespaces
                .values()
                .map(|u| u.labels.iter().filter(|l| !cluster.contains(*l) && !new.contains_key(**l)).count())
                .max()
                .unwrap_or(0);
            on_every + most_added
        } else {
            let empty = BTreeSet::new();
            let team = self.namespaces.get(config.key.namespace.as_str()).map_or(&empty, |u| &u.labels);
            cluster.len()
                + team.iter().filter(|l| !cluster.contains(*l)).count()
                + new.keys().filter(|l| !cluster.contains(l.as_str()) && !team.contains(l.as_str())).count()
        }
    }

    fn admit(&mut self, config: &'a ValidConfig) {
        self.configs += 1;
        self.bytes = self.bytes.saturating_add(config.rendered_bytes);
        let ns = self.namespaces.entry(config.key.namespace.as_str()).or_default();
        ns.configs += 1;
        ns.bytes = ns.bytes.saturating_add(config.rendered_bytes);
        ns.filters.admit(config);
        self.filters.admit(config);
        let labels = if config.cluster_wide { &mut self.cluster_labels } else { &mut ns.labels };
        labels.extend(config.extra_label_names());
    }
}

fn misfit(kind: Refusal, field: impl Into<String>, reason: String) -> Misfit {
    Misfit { kind, field: field.into(), reason }
}

fn filter_field(entry: usize) -> String {
    format!("spec.runtimes[{entry}].tagFilter")
}
