//! Which faults have their Event on the Node (written by [`crate::health::node`]). Kept
//! in the model, and persisted with its faults, so that an Event the API server could
//! not take before an agent restart is written after it, and one it took is not
//! written again.
//!
//! The Events waiting are the faults not announced yet. At most
//! [`MAX_PENDING_HEALTH_EVENTS`] wait at once (the earliest faults): beyond, a fault is
//! counted as announced without its Event, and counted as dropped
//! (`neuron_agent_health_events_dropped_total`); the Node condition still names every
//! fault.

use std::collections::BTreeSet;

use api::limits::MAX_PENDING_HEALTH_EVENTS;
use prometheus_client::metrics::counter::Counter;

use super::Reason;

/// A Neuron fault as announced once: (device, None: the node; error, component, counter).
pub type FaultKey = (Option<u32>, String, String, String);
/// A GPU fault as announced once: (GPU index, reason name).
pub type GpuFaultKey = (u32, String);

/// The faults of one kind whose Event is written.
#[derive(Clone, Debug)]
pub struct Announced<K> {
    keys: BTreeSet<K>,
}

impl<K> Default for Announced<K> {
    fn default() -> Self {
        Announced { keys: BTreeSet::new() }
    }
}

impl<K: Ord + Clone> Announced<K> {
    pub fn contains(&self, key: &K) -> bool {
        self.keys.contains(key)
    }

    pub fn insert(&mut self, key: K) -> bool {
        self.keys.insert(key)
    }

    /// After a driver reload cleared every fault: one that comes back is news again.
    pub fn clear(&mut self) {
        self.keys.clear();
    }

    pub fn retain(&mut self, keep: impl FnMut(&K) -> bool) {
        self.keys.retain(keep);
    }

    /// The announced keys among the faults `present` (what is persisted: a key without
    /// its fault says nothing).
    pub fn of(&self, present: impl IntoIterator<Item = K>) -> Vec<K> {
        present.into_iter().filter(|k| self.keys.contains(k)).collect()
    }

    /// The faults among `faults` whose Event is not written yet, earliest first, at most
    /// [`MAX_PENDING_HEALTH_EVENTS`]; the others are marked announced and counted in
    /// `dropped`. Returns them and the count dropped.
    pub fn pending<'a>(
        &mut self,
        faults: impl IntoIterator<Item = (K, &'a Reason)>,
        dropped: &Counter,
    ) -> (Vec<(K, Reason)>, u64) {
        let mut pending: Vec<(K, &Reason)> = faults.into_iter().filter(|(k, _)| !self.keys.contains(k)).collect();
        pending.sort_by_key(|(_, r)| r.first_seen);
        let over = pending.len().saturating_sub(MAX_PENDING_HEALTH_EVENTS);
        for (key, _) in pending.drain(MAX_PENDING_HEALTH_EVENTS.min(pending.len())..) {
            self.keys.insert(key);
        }
        dropped.inc_by(over as u64);
        (pending.into_iter().map(|(k, r)| (k, r.clone())).collect(), over as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::model::Source;

    fn reason(first_seen: u64) -> Reason {
        Reason {
            error: format!("E{first_seen}"),
            component: String::new(),
            counter: String::new(),
            source: Source::KernelLog,
            action: String::new(),
            core: None,
            serial: None,
            first_seen,
            last_seen: first_seen,
            count: 1,
        }
    }

    #[test]
    fn pending_events_are_the_unannounced_faults_earliest_first_and_bounded() {
        let reasons: Vec<Reason> = (0..MAX_PENDING_HEALTH_EVENTS as u64 + 5).rev().map(reason).collect();
        let mut announced = Announced::<u64>::default();
        announced.insert(3);
        let dropped = Counter::default();
        let (pending, over) = announced.pending(reasons.iter().map(|r| (r.first_seen, r)), &dropped);
        // One already announced; of the others, the latest four are given up.
        assert_eq!((pending.len(), over, dropped.get()), (MAX_PENDING_HEALTH_EVENTS, 4, 4));
        assert_eq!(pending.first().map(|(k, _)| *k), Some(0), "earliest first");
        assert!(pending.iter().all(|(k, _)| *k != 3));
        assert!(announced.contains(&(MAX_PENDING_HEALTH_EVENTS as u64 + 4)), "dropped: never written");
        // Written: no longer pending; the dropped are not either.
        for (key, _) in &pending {
            announced.insert(*key);
        }
        let (pending, over) = announced.pending(reasons.iter().map(|r| (r.first_seen, r)), &dropped);
        assert_eq!((pending.len(), over), (0, 0));
        assert_eq!(announced.of([1, 3, 1000]), [1, 3], "only the keys of present faults");
    }
}
