//! Rendering: for each node, merge every config that matches it into one [`NodeConfig`].
//!
//! neuron-monitor reports an application under the FIRST runtime entry whose tag
//! filter matches it, so entries of different configs cannot sit side by side (an
//! application matched by two of them would reach only the first). The merged
//! configuration therefore has ONE runtime entry: its tag filter is the union of every
//! config's filters (`(a)|(b)`, sorted, deduplicated; none when any config takes every
//! application), its groups the union of their groups, each at the shortest period any
//! config asked for. System groups likewise. The node agent then hands each config
//! (a route) only what it asked for. A union longer than [`MAX_UNION_FILTER`] is
//! dropped: neuron-monitor then reports every application, still a superset.
//!
//! A node takes the health settings (`spec.health`) of one config: the first with a
//! `health` section in the order budgets are shared out (the oldest, then by name); the
//! others are reported as overridden there ([`Rendering::health_conflicts`]). Its GPU
//! collector is on when any config's `spec.gpu` says so, at the shortest period of those
//! ([`NodeGpu::merge`]); without any `spec.gpu`, the agent's defaults.
//!
//! Output is deterministic: the same configs and labels, in any order, give
//! byte-identical JSON, so an unchanged input writes nothing.
//!
//! [`render_all`] renders once per distinct set of matching configs (a node's
//! "signature"), not once per node: nodes of one node group share the result.
//!
//! What configs may add to a node is bounded ([`crate::limits`]): bytes per config (checked
//! by validation), configs and bytes per namespace and per node, extra labels per series.
//! [`render_all`] gives configs room in a fixed order (the operator namespace's, then the
//! oldest) and refuses, on every node, a config that does not fit on one of them, so one
//! team can never push a node's ConfigMap over the API server's 1 MiB limit and stall
//! everyone else's configs (see `budget`). [`render`] and [`render_node`] merge what they
//! are given, without limits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::duration::Period;
use crate::monitor_config::{GroupConfig, MonitorConfig, RuntimeSelector};
use crate::node_config::{content_hash, NodeConfig, NodeGpu};
use crate::validate::{Applications, ConfigKey, Invalid, ValidConfig};
use budget::GroupNodes;

mod budget;

/// A node as rendering sees it: a name and labels.
pub trait NodeLabels {
    fn node_name(&self) -> &str;
    fn node_labels(&self) -> &BTreeMap<String, String>;
}

impl NodeLabels for (String, BTreeMap<String, String>) {
    fn node_name(&self) -> &str {
        &self.0
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        &self.1
    }
}

impl NodeLabels for (&str, &BTreeMap<String, String>) {
    fn node_name(&self) -> &str {
        self.0
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        self.1
    }
}

impl NodeLabels for Node {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }
}

impl<T: NodeLabels + ?Sized> NodeLabels for Arc<T> {
    fn node_name(&self) -> &str {
        (**self).node_name()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        (**self).node_labels()
    }
}

/// A rendered node configuration with its serialized form, ready for the ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedNode {
    pub config: NodeConfig,
    /// `serde_json::to_string(&config)`: the value under `NODE_CONFIG_KEY`.
    pub json: String,
    /// `content_hash(json)`: the `CONFIG_HASH_ANNOTATION`.
    pub hash: String,
}

impl RenderedNode {
    pub fn new(config: NodeConfig) -> Result<RenderedNode, serde_json::Error> {
        let json = serde_json::to_string(&config)?;
        let hash = content_hash(json.as_bytes());
        Ok(RenderedNode { config, json, hash })
    }
}

/// Nodes matched by the same configs, and what they run.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// The configs that match these nodes, sorted (the routes' order).
    pub configs: Vec<ConfigKey>,
    /// The nodes, sorted by name.
    pub nodes: Vec<String>,
    pub rendered: RenderedNode,
    /// Configs with a `health` section whose settings are not the ones in force here
    /// (another config's came first), sorted.
    pub health_overridden: Vec<ConfigKey>,
}

/// A config whose health settings give way to another's on some of its nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConflict {
    /// Nodes where another config's health settings are in force.
    pub nodes: usize,
    /// `namespace/name` of that config (on the first such nodes).
    pub in_force: String,
}

/// The result of [`render_all`]: what every matched node runs, shared between nodes
/// with the same matching configs (5,000 copies of a config naming hundreds of
/// routes would not fit in the operator's memory).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendering {
    /// Sorted by their first node's name.
    groups: Vec<NodeGroup>,
    /// Node name → index into `groups`.
    by_node: BTreeMap<String, usize>,
    /// Every config given, with the number of nodes its selector matches (possibly 0),
    /// whether or not it found room there.
    matched: BTreeMap<ConfigKey, usize>,
    /// Configs that did not fit on some node they match, and are on none.
    refused: BTreeMap<ConfigKey, Invalid>,
}

impl Rendering {
    /// Number of nodes that run a configuration (at least one config matches them).
    pub fn len(&self) -> usize {
        self.by_node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// The configuration of a node; `None` when no config matches it.
    pub fn get(&self, node: &str) -> Option<&NodeConfig> {
        self.rendered(node).map(|r| &r.config)
    }

    /// The configuration of a node with its JSON and hash.
    pub fn rendered(&self, node: &str) -> Option<&RenderedNode> {
        let group = *self.by_node.get(node)?;
        self.groups.get(group).map(|g| &g.rendered)
    }

    /// Every matched node with what it runs, by node name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RenderedNode)> {
        self.by_node.iter().filter_map(|(node, &g)| Some((node.as_str(), &self.groups.get(g)?.rendered)))
    }

    /// Nodes grouped by the configs that match them: count per group, not per node.
    pub fn groups(&self) -> &[NodeGroup] {
        &self.groups
    }

    /// Number of nodes a config's selector matches (0 for a config not given), whether
    /// or not it was [`refused`](Self::refusal) there.
    pub fn matched_nodes(&self, config: &ConfigKey) -> usize {
        self.matched.get(config).copied().unwrap_or(0)
    }

    /// Why a config is on none of its nodes: it did not fit on one of them.
    pub fn refusal(&self, config: &ConfigKey) -> Option<&Invalid> {
        self.refused.get(config)
    }

    /// Every refused config, with the reason.
    pub fn refused(&self) -> &BTreeMap<ConfigKey, Invalid> {
        &self.refused
    }

    /// Every config given to [`render_all`] with the number of nodes it matches.
    pub fn matched(&self) -> &BTreeMap<ConfigKey, usize> {
        &self.matched
    }

    /// For every config given to [`render_all`], how many of the nodes it is rendered for
    /// satisfy `pred` (e.g. "its agent runs the current hash", for `status.appliedNodes`).
    /// Costs one call per node plus one addition per (group, config), rather than a
    /// walk over every config's nodes.
    pub fn count_matched_where(&self, mut pred: impl FnMut(&str, &RenderedNode) -> bool) -> BTreeMap<ConfigKey, usize> {
        let mut counts: BTreeMap<ConfigKey, usize> = self.matched.keys().map(|k| (k.clone(), 0)).collect();
        for group in &self.groups {
            let n = group.nodes.iter().filter(|node| pred(node, &group.rendered)).count();
            if n == 0 {
                continue;
            }
            for key in &group.configs {
                if let Some(count) = counts.get_mut(key) {
                    *count += n;
                }
            }
        }
        counts
    }

    /// Configs whose health settings are not in force on some of their nodes, because
    /// another config's come first there ([`ValidConfig::precedes`]).
    pub fn health_conflicts(&self) -> BTreeMap<ConfigKey, HealthConflict> {
        let mut conflicts: BTreeMap<ConfigKey, HealthConflict> = BTreeMap::new();
        for group in &self.groups {
            let in_force = group.rendered.config.health.as_ref().map(|h| h.config.as_str()).unwrap_or_default();
            for key in &group.health_overridden {
                conflicts
                    .entry(key.clone())
                    .or_insert_with(|| HealthConflict { nodes: 0, in_force: in_force.to_owned() })
                    .nodes += group.nodes.len();
            }
        }
        conflicts
    }

    /// The nodes a config is rendered for, sorted by group then name.
    pub fn matched_node_names<'a>(&'a self, config: &'a ConfigKey) -> impl Iterator<Item = &'a str> + 'a {
        self.groups
            .iter()
            .filter(move |g| g.configs.binary_search(config).is_ok())
            .flat_map(|g| g.nodes.iter().map(String::as_str))
    }
}

/// Merges configs that apply to one node (selectors are not consulted). The order of
/// `configs` does not matter; a key given twice counts once.
pub fn render(configs: &[&ValidConfig]) -> NodeConfig {
    let mut configs = configs.to_vec();
    configs.sort_by(|a, b| a.key.cmp(&b.key));
    configs.dedup_by(|a, b| a.key == b.key);
    merge_sorted(&configs)
}

/// The configuration of one node with these labels; `None` when no config matches it.
pub fn render_node(labels: &BTreeMap<String, String>, configs: &[ValidConfig]) -> Option<NodeConfig> {
    let matching: Vec<&ValidConfig> = configs.iter().filter(|c| c.matches(labels)).collect();
    (!matching.is_empty()).then(|| render(&matching))
}

/// `configs` sorted by key, without duplicates.
fn merge_sorted(configs: &[&ValidConfig]) -> NodeConfig {
    let mut runtime = BTreeMap::new();
    let mut system = BTreeMap::new();
    let mut every_application = false;
    let mut filters: Vec<&str> = Vec::new();
    for config in configs {
        shortest(&mut runtime, &config.runtime_groups);
        shortest(&mut system, &config.system_groups);
        match &config.applications {
            Applications::None => {}
            Applications::All => every_application = true,
            Applications::Matching(f) => filters.extend(f.iter().map(String::as_str)),
        }
    }
    let neuron_runtimes = if runtime.is_empty() {
        Vec::new()
    } else {
        vec![RuntimeSelector {
            tag_filter: if every_application { None } else { union(filters) },
            period: None,
            metrics: runtime.into_iter().map(|(kind, p)| GroupConfig { kind, period: Some(p) }).collect(),
        }]
    };
    let system_metrics = system.into_iter().map(|(kind, p)| GroupConfig { kind, period: Some(p) }).collect();
    NodeConfig {
        // Every group carries its period: the root's would never be used.
        monitor: MonitorConfig { period: None, neuron_runtimes, system_metrics },
        routes: configs.iter().map(|c| c.route.clone()).collect(),
        health: health_in_force(configs).and_then(|c| c.health.clone()),
        gpu: NodeGpu::merge(configs.iter().filter_map(|c| c.gpu)),
    }
}

/// Of the configs with a `health` section, the one whose settings a node takes: the
/// first in [`ValidConfig::precedes`] order (the oldest, then by name), so a new config
/// never changes an established one's settings.
fn health_in_force<'a>(configs: &[&'a ValidConfig]) -> Option<&'a ValidConfig> {
    configs.iter().copied().filter(|c| c.health.is_some()).min_by(|a, b| a.precedes(b))
}

fn shortest<G: Ord + Copy>(into: &mut BTreeMap<G, Period>, from: &BTreeMap<G, Period>) {
    for (&group, &p) in from {
        into.entry(group).and_modify(|q| *q = (*q).min(p)).or_insert(p);
    }
}

/// Longest merged tag filter; beyond it neuron-monitor takes every application. A
/// union of hundreds of filters costs more to match than the few extra applications
/// cost to report (the agent drops what no route asked for), and the regex crate
/// (simulator, agent) refuses to compile unions of ~1,000 filters (10 MB limit).
pub const MAX_UNION_FILTER: usize = 8 * 1024;

/// One filter as is; several as `(a)|(b)`, sorted and deduplicated (each filter was
/// checked to keep its meaning inside a group); `None` (every application) when that
/// would exceed [`MAX_UNION_FILTER`].
fn union(mut filters: Vec<&str>) -> Option<String> {
    filters.sort_unstable();
    filters.dedup();
    if filters.iter().map(|f| f.len() + 3).sum::<usize>() > MAX_UNION_FILTER {
        return None;
    }
    match filters.as_slice() {
        [] => None,
        [one] => Some((*one).to_owned()),
        many => {
            let mut out = String::with_capacity(many.iter().map(|f| f.len() + 3).sum());
            for (i, f) in many.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                out.push('(');
                out.push_str(f);
                out.push(')');
            }
            Some(out)
        }
    }
}

/// The nodes grouped by which selective configs match them: (signature, node names) in
/// the order of each group's first node. Bit j of a signature: `selective[j]` matches.
/// A node name given twice keeps its first labels; nodes without a name are skipped.
fn group_by_signature<'a, N>(
    nodes: impl IntoIterator<Item = &'a N>,
    configs: &[&ValidConfig],
    selective: &[usize],
) -> Vec<(Box<[u64]>, Vec<String>)>
where
    N: NodeLabels + ?Sized + 'a,
{
    let words = selective.len().div_ceil(64);

    // Signature (bit j: selective[j] matches) → index into `members`.
    let mut signatures: HashMap<Box<[u64]>, usize> = HashMap::new();
    let mut members: Vec<(Box<[u64]>, Vec<String>)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut bits = vec![0u64; words];
    for node in nodes {
        let name = node.node_name();
        if name.is_empty() || !seen.insert(name) {
            continue;
        }
        let labels = node.node_labels();
        bits.fill(0);
        for (j, &i) in selective.iter().enumerate() {
            if configs[i].selector.matches(labels) {
                bits[j / 64] |= 1 << (j % 64);
            }
        }
        let group = match signatures.get(bits.as_slice()) {
            Some(&g) => g,
            None => {
                let sig: Box<[u64]> = bits.clone().into_boxed_slice();
                members.push((sig.clone(), Vec::new()));
                signatures.insert(sig, members.len() - 1);
                members.len() - 1
            }
        };
        members[group].1.push(name.to_owned());
    }
    members
}

/// Renders every node that some config matches. Nodes with the same matching configs
/// share one rendering, so the cost follows the number of distinct node groups, not
/// the number of nodes. A node name given twice keeps its first labels; nodes without
/// a name are skipped; a config key given twice counts once.
pub fn render_all<'a, N>(
    nodes: impl IntoIterator<Item = &'a N>,
    configs: &[ValidConfig],
) -> Result<Rendering, serde_json::Error>
where
    N: NodeLabels + ?Sized + 'a,
{
    let mut configs: Vec<&ValidConfig> = configs.iter().collect();
    configs.sort_by(|a, b| a.key.cmp(&b.key));
    configs.dedup_by(|a, b| a.key == b.key);

    // Configs without a selector match every node: only the others make signatures.
    let selective: Vec<usize> = (0..configs.len()).filter(|&i| !configs[i].selector.is_everything()).collect();
    let members = group_by_signature(nodes, &configs, &selective);

    let mut matched: BTreeMap<ConfigKey, usize> = configs.iter().map(|c| (c.key.clone(), 0)).collect();
    // (indices into the sorted `configs` that match, in order, so routes come out
    // sorted; the nodes, sorted), in the order of their first node.
    let mut selected: Vec<(Vec<usize>, Vec<String>)> = Vec::with_capacity(members.len());
    for (sig, mut names) in members {
        let chosen: Vec<usize> = (0..configs.len())
            .filter(|&i| match selective.binary_search(&i) {
                Ok(j) => sig[j / 64] & (1 << (j % 64)) != 0,
                Err(_) => true,
            })
            .collect();
        if chosen.is_empty() {
            continue;
        }
        for &i in &chosen {
            if let Some(count) = matched.get_mut(&configs[i].key) {
                *count += names.len();
            }
        }
        names.sort_unstable();
        selected.push((chosen, names));
    }
    selected.sort_by(|a, b| a.1.first().cmp(&b.1.first()));

    // What does not fit on one of its nodes is refused on all of them.
    let shares: Vec<GroupNodes> = selected
        .iter()
        .map(|(chosen, names)| GroupNodes {
            configs: chosen,
            first_node: names.first().map(String::as_str).unwrap_or_default(),
            node_count: names.len(),
        })
        .collect();
    let refused_at = budget::share_out(&configs, &shares);
    drop(shares);

    let mut groups = Vec::with_capacity(selected.len());
    for (chosen, names) in selected {
        let admitted: Vec<&ValidConfig> =
            chosen.into_iter().filter(|i| !refused_at.contains_key(i)).map(|i| configs[i]).collect();
        if admitted.is_empty() {
            continue;
        }
        let in_force = health_in_force(&admitted).map(|c| &c.key);
        let health_overridden =
            admitted.iter().filter(|c| c.health.is_some() && Some(&c.key) != in_force).map(|c| c.key.clone()).collect();
        groups.push(NodeGroup {
            configs: admitted.iter().map(|c| c.key.clone()).collect(),
            nodes: names,
            rendered: RenderedNode::new(merge_sorted(&admitted))?,
            health_overridden,
        });
    }
    let by_node =
        groups.iter().enumerate().flat_map(|(g, group)| group.nodes.iter().map(move |n| (n.clone(), g))).collect();
    let refused = refused_at.into_iter().map(|(i, why)| (configs[i].key.clone(), why)).collect();
    Ok(Rendering { groups, by_node, matched, refused })
}

#[cfg(test)]
mod tests;
