//! Which version of each config is rendered, and what users are told: each config is
//! validated (`api::validate`), held to its namespace's tenancy rules on its matched
//! nodes (`api::tenancy::check_targets`), held to what the API server serves
//! ([`super::cluster_apis`]), priced in every mode (`api::cloudwatch::cost`),
//! and a namespace's configs are held to its monthly cost ceiling
//! (`api::tenancy::share_ceiling`, oldest first).
//!
//! A refused config keeps its last accepted version on its nodes — as long as that
//! version is itself within the policy in force and fits the ceiling: a policy that
//! tightens takes effect on established configs too. Only a version that passes every
//! check here becomes the last accepted one, and is recorded on the config
//! ([`super::accepted`]) for the operator that renders after a restart or a leader change.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use api::{
    cloudwatch::cost::{self, Costs, Kinds, NodeFacts},
    crd::NeuronMonitorConfig,
    region::REGION_LABELS,
    tenancy::{self, Fit, NodeRegions, Priced, Rules, TenancyPolicy},
    validate::{self, ConfigKey, Invalid, Selector, ValidConfig},
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::{
    accepted,
    cluster_apis::{check_device_taints, DeviceTaintApi},
    Controller, Verdict,
};
use crate::nodes;

/// What a pass renders and tells.
pub(super) struct Admission {
    pub(super) verdicts: Vec<Verdict>,
    /// The versions rendered: the current one of accepted configs, the last accepted
    /// one of refused configs that have one within the policy.
    pub(super) usable: Vec<ValidConfig>,
    /// The costs of each accepted config's current version on its matched nodes.
    pub(super) costs: HashMap<ConfigKey, Costs>,
    /// Accepted configs whose current version is not recorded on them yet.
    pub(super) to_record: Vec<Arc<NeuronMonitorConfig>>,
}

/// One version of a config that passed validation and the policy.
#[derive(Clone)]
pub(super) struct Accepted {
    valid: ValidConfig,
    object: Arc<NeuronMonitorConfig>,
    costs: Option<Costs>,
}

impl Accepted {
    fn usd(&self) -> f64 {
        self.costs.as_ref().map_or(0.0, Costs::own_usd)
    }
}

/// A config: its current version (or why it is refused) and its last accepted one.
struct Candidate {
    config: Arc<NeuronMonitorConfig>,
    current: Result<Accepted, Invalid>,
    last: Option<Accepted>,
}

impl Candidate {
    /// The version that takes the config's place on its nodes, for ordering.
    fn version(&self) -> Option<&Accepted> {
        self.current.as_ref().ok().or(self.last.as_ref())
    }

    /// What the config costs within its namespace's ceiling: its current version (and its
    /// last accepted one, if another); refused already, its last accepted version takes
    /// its room.
    fn priced(&self) -> Priced {
        match self {
            Candidate { current: Ok(now), last, .. } => Priced {
                usd: now.usd(),
                last_accepted_usd: last.as_ref().filter(|l| !is_current(&l.object, &now.object)).map(Accepted::usd),
            },
            Candidate { current: Err(_), last, .. } => {
                Priced { usd: last.as_ref().map_or(0.0, Accepted::usd), last_accepted_usd: None }
            }
        }
    }
}

/// The Neuron nodes with what the checks need of them.
struct Fleet<'a> {
    labels: Vec<&'a BTreeMap<String, String>>,
    names: Vec<String>,
    regions: Vec<Option<&'a str>>,
    /// The distinct facts of the nodes (few: instance types × zones), and each node's.
    kinds: Vec<NodeFacts>,
    kind_of: Vec<usize>,
}

impl<'a> Fleet<'a> {
    fn new(nodes: &'a [Arc<Node>]) -> Fleet<'a> {
        let labels: Vec<&BTreeMap<String, String>> = nodes.iter().map(|n| nodes::labels(n)).collect();
        let regions = labels.iter().map(|l| REGION_LABELS.iter().find_map(|k| l.get(*k)).map(String::as_str)).collect();
        let mut index: HashMap<NodeFacts, usize> = HashMap::new();
        let kind_of = nodes
            .iter()
            .map(|n| {
                let facts = nodes::facts(n);
                let next = index.len();
                *index.entry(facts).or_insert(next)
            })
            .collect();
        let mut kinds: Vec<(NodeFacts, usize)> = index.into_iter().collect();
        kinds.sort_by_key(|(_, i)| *i);
        Fleet {
            labels,
            names: nodes.iter().map(|n| n.name_any()).collect(),
            regions,
            kinds: kinds.into_iter().map(|(facts, _)| facts).collect(),
            kind_of,
        }
    }

    /// The kinds of the `matched` nodes, with their numbers.
    fn kinds(&self, matched: &[usize]) -> Kinds<'_> {
        let mut counts = vec![0u64; self.kinds.len()];
        for &i in matched {
            counts[self.kind_of[i]] += 1;
        }
        self.kinds.iter().zip(counts).filter(|(_, n)| *n > 0).collect()
    }

    /// The nodes a selector matches.
    fn matching(&self, selector: &Selector) -> Vec<usize> {
        (0..self.labels.len()).filter(|&i| selector.is_everything() || selector.matches(self.labels[i])).collect()
    }
}

/// Whether the policy or the cost estimate have anything to look at in a config.
fn has_targets(config: &NeuronMonitorConfig) -> bool {
    let sinks = config.spec.sinks.as_ref();
    sinks.is_some_and(|s| s.cloudwatch.is_some() || s.otlp.is_some())
        || config.spec.health.as_ref().is_some_and(|h| h.logs.is_some())
}

/// What becomes of one config (`A`: one of its versions) in a pass.
#[derive(Debug, PartialEq)]
struct Decision<A> {
    verdict: Result<(), Invalid>,
    /// The version rendered on its nodes, if any.
    rendered: Option<A>,
    /// The version remembered as its last accepted one, if any.
    remember: Option<A>,
    /// Its current version was admitted in this pass.
    admitted: bool,
}

/// Which version of a config is admitted: its current one where it is valid, within the
/// policy and fits its namespace's ceiling; else its last accepted one, unless the ceiling
/// has no room for that either. A refused config's last accepted version is remembered
/// (it may have been read from the config's record).
fn decide<A: Clone>(current: Result<A, Invalid>, last: Option<A>, fit: Fit) -> Decision<A> {
    match (current, fit) {
        (Ok(now), Fit::Admitted) => {
            Decision { verdict: Ok(()), rendered: Some(now.clone()), remember: Some(now), admitted: true }
        }
        (Ok(_), Fit::LastAccepted(why)) => {
            Decision { verdict: Err(why), rendered: last, remember: None, admitted: false }
        }
        (Ok(_), Fit::Refused(why)) => Decision { verdict: Err(why), rendered: None, remember: None, admitted: false },
        (Err(why), fit) => {
            let room = !matches!(fit, Fit::Refused(_));
            Decision { verdict: Err(why), rendered: last.clone().filter(|_| room), remember: last, admitted: false }
        }
    }
}

/// Whether a config's last accepted version is its current one (not checked twice).
fn is_current(last: &NeuronMonitorConfig, current: &NeuronMonitorConfig) -> bool {
    last.metadata.generation == current.metadata.generation
}

impl Fleet<'_> {
    /// One node of each region among the `matched` nodes, by region.
    fn regions_of(&self, matched: &[usize]) -> NodeRegions {
        let mut regions = NodeRegions::new();
        for &i in matched {
            match self.regions[i] {
                Some(region) if !regions.contains_key(region) => {
                    regions.insert(region.to_owned(), self.names[i].clone());
                }
                _ => {}
            }
        }
        regions
    }
}

impl Controller {
    /// Validates every config, holds it to the policy on its nodes and its namespace's
    /// ceiling, and picks the version of each to render.
    pub(super) fn admit(
        &self,
        configs: &[Arc<NeuronMonitorConfig>],
        nodes: &[Arc<Node>],
        policy: &TenancyPolicy,
        device_taints: DeviceTaintApi,
    ) -> Admission {
        let fleet = Fleet::new(nodes);
        let mut last_good = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        let live: HashSet<String> = configs.iter().filter_map(|c| c.uid()).collect();
        last_good.retain(|uid, _| live.contains(uid));
        // A deleted config's announcement is forgotten with it.
        self.announced.lock().unwrap_or_else(|p| p.into_inner()).retain(|uid, _| live.contains(uid));

        let check = |object: &Arc<NeuronMonitorConfig>, valid: ValidConfig| {
            check_device_taints(&valid, device_taints)?;
            self.check(&fleet, policy, object, valid)
        };
        // Each config's current version, and its last accepted one where that is within
        // the policy (re-checked only when it differs from the current one). The last
        // accepted version comes from memory, else from the config's record of it.
        let mut candidates: Vec<Candidate> = Vec::with_capacity(configs.len());
        for config in configs {
            let current = validate::validate(config, &self.namespace).and_then(|v| check(config, v));
            let previous = match config.uid().and_then(|uid| last_good.get(&uid).cloned()) {
                Some(p) => Some((p.object, p.valid)),
                None => accepted::recorded(config, &self.namespace).map(|(object, valid)| (Arc::new(object), valid)),
            };
            let last = match (&current, previous) {
                (Ok(now), Some((object, _))) if is_current(&object, &now.object) => Some(now.clone()),
                (_, Some((object, valid))) => check(&object, valid).ok(),
                (_, None) => None,
            };
            candidates.push(Candidate { config: config.clone(), current, last });
        }
        let mut fits = self.ceiling_fits(policy, &candidates);

        let mut verdicts = Vec::with_capacity(candidates.len());
        let mut usable = Vec::with_capacity(candidates.len());
        let mut costs = HashMap::new();
        let mut to_record = Vec::new();
        for (i, Candidate { config, current, last }) in candidates.into_iter().enumerate() {
            let decision = decide(current, last, fits.remove(&i).unwrap_or(Fit::Admitted));
            if let (Some(remember), Some(uid)) = (decision.remember, config.uid()) {
                last_good.insert(uid, remember);
            }
            if let Some(rendered) = decision.rendered {
                if decision.admitted {
                    if !accepted::is_recorded(&config) {
                        to_record.push(config.clone());
                    }
                    if let Some(c) = rendered.costs {
                        costs.insert(rendered.valid.key.clone(), c);
                    }
                }
                usable.push(rendered.valid);
            }
            verdicts.push((config, decision.verdict));
        }
        Admission { verdicts, usable, costs, to_record }
    }

    /// Holds one valid version of a config to its namespace's policy on its matched nodes,
    /// and prices it there.
    fn check(
        &self,
        fleet: &Fleet<'_>,
        policy: &TenancyPolicy,
        object: &Arc<NeuronMonitorConfig>,
        valid: ValidConfig,
    ) -> Result<Accepted, Invalid> {
        if !has_targets(object) {
            return Ok(Accepted { valid, object: object.clone(), costs: None });
        }
        let namespace = valid.key.namespace.as_str();
        let labels = self.tenancy.namespace_labels(namespace);
        let rules: &Rules = policy.rules_for(namespace, &labels);
        let matched = fleet.matching(&valid.selector);
        tenancy::check_targets(&object.spec, namespace, valid.cluster_wide, rules, &fleet.regions_of(&matched))?;
        let costs = cost::costs(&object.spec, valid.cluster_wide, &fleet.kinds(&matched), &self.prices);
        Ok(Accepted { valid, object: object.clone(), costs })
    }

    /// Ceilings: per namespace with one, the configs in the order they are given room and
    /// where each stands (by index in `candidates`; the others are admitted).
    fn ceiling_fits(&self, policy: &TenancyPolicy, candidates: &[Candidate]) -> HashMap<usize, Fit> {
        let mut fits: HashMap<usize, Fit> = HashMap::new();
        let mut by_namespace: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, candidate) in candidates.iter().enumerate() {
            let Some(v) = candidate.version() else { continue };
            if !v.valid.cluster_wide {
                by_namespace.entry(v.valid.key.namespace.as_str()).or_default().push(i);
            }
        }
        for (namespace, mut members) in by_namespace {
            let labels = self.tenancy.namespace_labels(namespace);
            let Some(ceiling) = policy.rules_for(namespace, &labels).monthly_cost_ceiling_usd else { continue };
            members.sort_by(|&a, &b| match (candidates[a].version(), candidates[b].version()) {
                (Some(a), Some(b)) => a.valid.precedes(&b.valid),
                _ => std::cmp::Ordering::Equal,
            });
            let priced: Vec<Priced> = members.iter().map(|&i| candidates[i].priced()).collect();
            for (&i, fit) in members.iter().zip(tenancy::share_ceiling(namespace, ceiling, &priced)) {
                fits.insert(i, fit);
            }
        }
        fits
    }
}

#[cfg(test)]
mod tests;
