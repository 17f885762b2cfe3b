//! How fast a namespace's config changes reach the nodes. Every config on a node shares
//! that node's ConfigMap, and a new ConfigMap restarts neuron-monitor for all of them: a
//! tenant editing its configs in a loop would rewrite every node they select and stop the
//! other tenants' reports there. So the changes of one namespace (new configs and new
//! generations) are adopted at [`NAMESPACE_CHANGES`]' pace: a burst, then one adoption
//! per slot, each taking the namespace's newest versions all together. Until its next
//! slot a held namespace's nodes keep the versions adopted before, and nothing is written
//! about its configs (their status keeps the older `observedGeneration`). Other
//! namespaces are not held, a deleted config is never held, and the cluster admins'
//! configs (the operator's own namespace) are not paced.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use api::crd::NeuronMonitorConfig;
use kube::ResourceExt;
use service::ratelimit::{Decision, RateLimit};
use tracing::info;

/// Adoptions of a namespace's changes: 5 at once, then one every 10 s.
pub const NAMESPACE_CHANGES: (u32, Duration) = (5, Duration::from_secs(50));

/// The configs a pass works on, paced.
pub(super) struct Paced {
    /// Each config as adopted: its current version, or the one adopted before while its
    /// namespace is held (a config never adopted is left out).
    pub(super) configs: Vec<Arc<NeuronMonitorConfig>>,
    /// Uids of the configs whose newest version waits: their status is not written.
    pub(super) held: HashSet<String>,
}

#[derive(Default)]
pub(super) struct ChangePace(Mutex<State>);

#[derive(Default)]
struct State {
    /// The version of each config adopted last, by uid.
    adopted: HashMap<String, Arc<NeuronMonitorConfig>>,
    /// The pace of each namespace with configs.
    namespaces: HashMap<String, RateLimit>,
    /// Namespaces whose changes wait for their next slot.
    held: HashSet<String>,
}

impl ChangePace {
    /// Paces the `configs` of a pass; `exempt` is a namespace never held.
    pub(super) fn pace(&self, configs: Vec<Arc<NeuronMonitorConfig>>, exempt: &str) -> Paced {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let State { adopted, namespaces, held } = &mut *state;
        let live: HashSet<String> = configs.iter().filter_map(|c| c.uid()).collect();
        adopted.retain(|uid, _| live.contains(uid));
        // A namespace left without configs keeps its pace until it is full again: deleting
        // and creating a config in a loop is held like editing it.
        let present: HashSet<String> = configs.iter().filter_map(|c| c.namespace()).collect();
        namespaces.retain(|ns, limit| present.contains(ns) || !limit.is_full());

        let changing: HashSet<String> = configs
            .iter()
            .filter(|c| is_change(adopted, c))
            .filter_map(|c| c.namespace())
            .filter(|ns| ns != exempt)
            .collect();
        let mut now_held = HashSet::new();
        for namespace in changing {
            let (burst, per) = NAMESPACE_CHANGES;
            let limit = namespaces.entry(namespace.clone()).or_insert_with(|| RateLimit::new(burst, per));
            if let Decision::Suppress = limit.check() {
                if !held.contains(&namespace) {
                    info!(%namespace, next_in_ms = limit.wait().as_millis() as u64,
                          "config changes come faster than the pace; the newest are adopted at its next slot");
                }
                now_held.insert(namespace);
            }
        }
        *held = now_held;

        let mut paced = Paced { configs: Vec::with_capacity(configs.len()), held: HashSet::new() };
        for config in configs {
            let Some(uid) = config.uid() else { continue };
            let waits = config.namespace().is_some_and(|ns| held.contains(&ns)) && is_change(adopted, &config);
            if waits {
                paced.held.insert(uid.clone());
                paced.configs.extend(adopted.get(&uid).cloned());
            } else {
                adopted.insert(uid, config.clone());
                paced.configs.push(config);
            }
        }
        paced
    }

    /// How long until the next slot of a held namespace; `None` when none is held.
    pub(super) fn next_slot(&self) -> Option<Duration> {
        let state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.held.iter().filter_map(|ns| state.namespaces.get(ns)).map(RateLimit::wait).min()
    }

    /// Namespaces whose changes wait now.
    pub(super) fn held_namespaces(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).held.len()
    }
}

/// Whether `config` is new or has a new generation since it was adopted.
fn is_change(adopted: &HashMap<String, Arc<NeuronMonitorConfig>>, config: &NeuronMonitorConfig) -> bool {
    let Some(uid) = config.uid() else { return false };
    adopted.get(&uid).is_none_or(|a| a.metadata.generation != config.metadata.generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(namespace: &str, name: &str, generation: i64) -> Arc<NeuronMonitorConfig> {
        let mut c = NeuronMonitorConfig::new(name, Default::default());
        c.metadata.namespace = Some(namespace.to_owned());
        c.metadata.uid = Some(format!("{namespace}/{name}"));
        c.metadata.generation = Some(generation);
        Arc::new(c)
    }

    fn generations(paced: &Paced) -> Vec<(String, i64)> {
        paced.configs.iter().map(|c| (c.name_any(), c.metadata.generation.unwrap_or(0))).collect()
    }

    #[test]
    fn a_namespace_changing_without_end_is_held_and_others_are_not() {
        let pace = ChangePace::default();
        let (burst, _) = NAMESPACE_CHANGES;
        // Each pass: the thrashing team's config has a new generation.
        for generation in 1..=i64::from(burst) {
            let paced = pace.pace(vec![config("thrash", "a", generation), config("calm", "b", 1)], "ops");
            assert!(paced.held.is_empty(), "pass {generation}: within the burst");
        }
        let paced = pace.pace(vec![config("thrash", "a", 99), config("calm", "b", 2)], "ops");
        assert_eq!(generations(&paced), vec![("a".to_owned(), i64::from(burst)), ("b".to_owned(), 2)]);
        assert_eq!(paced.held, HashSet::from(["thrash/a".to_owned()]));
        assert_eq!(pace.held_namespaces(), 1);
        let next = pace.next_slot().expect("a held namespace has a next slot");
        assert!(next > Duration::from_secs(8) && next <= Duration::from_secs(10), "{next:?}");
    }

    #[test]
    fn a_held_namespaces_new_config_waits_and_unchanged_ones_keep_their_fresh_objects() {
        let pace = ChangePace::default();
        let (burst, _) = NAMESPACE_CHANGES;
        for generation in 1..=i64::from(burst) {
            pace.pace(vec![config("team", "a", generation)], "ops");
        }
        let paced = pace.pace(vec![config("team", "a", 5), config("team", "new", 1)], "ops");
        assert_eq!(generations(&paced), vec![("a".to_owned(), 5)], "the new config waits for a slot");
        assert_eq!(paced.held, HashSet::from(["team/new".to_owned()]));
        // A deletion is not held: the deleted config is gone at once, the new one still waits.
        let paced = pace.pace(vec![config("team", "new", 1)], "ops");
        assert!(paced.configs.is_empty());
        assert_eq!(paced.held, HashSet::from(["team/new".to_owned()]));
        assert!(pace.pace(vec![], "ops").held.is_empty());
        assert_eq!(pace.next_slot(), None);
    }

    #[test]
    fn deleting_and_creating_a_config_in_a_loop_is_held_too() {
        let pace = ChangePace::default();
        let (burst, _) = NAMESPACE_CHANGES;
        for round in 0..=burst {
            // Each round, a new object (a new uid) after the namespace was left empty.
            let mut created = NeuronMonitorConfig::new("a", Default::default());
            created.metadata.namespace = Some("team".to_owned());
            created.metadata.uid = Some(format!("uid-{round}"));
            created.metadata.generation = Some(1);
            let paced = pace.pace(vec![Arc::new(created)], "ops");
            assert_eq!(paced.held.is_empty(), round < burst, "round {round}");
            pace.pace(vec![], "ops");
        }
    }

    #[test]
    fn the_operators_own_namespace_is_never_held() {
        let pace = ChangePace::default();
        for generation in 1..=50 {
            let paced = pace.pace(vec![config("ops", "cluster", generation)], "ops");
            assert!(paced.held.is_empty());
            assert_eq!(generations(&paced), vec![("cluster".to_owned(), generation)]);
        }
    }
}
