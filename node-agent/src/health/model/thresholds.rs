//! Fault thresholds (`spec.health.thresholds`): how many occurrences of an error within
//! a window turn a device unhealthy. A kernel-log record is one occurrence; a counter's
//! increase by N (the driver's ECC or per-core error counters, neuron-monitor's hardware
//! errors) is N occurrences at the time it is read. An error without a threshold turns
//! the device unhealthy at its first occurrence, as it always did.
//!
//! The occurrences of a fault that has not reached its threshold are kept ([`Pending`]),
//! persisted per boot with the reasons (an agent restart neither forgets nor counts them
//! twice), and forgotten with the reasons at a driver reload.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use api::limits::MAX_THRESHOLD_COUNT;
use serde::{Deserialize, Serialize};

/// `count` occurrences within `window_secs` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    pub count: u32,
    pub window_secs: u64,
}

/// The thresholds in force, by error name.
pub type Thresholds = Arc<BTreeMap<String, Threshold>>;

/// Faults below their threshold kept at once; beyond it a new fault is taken at its
/// first occurrence (as without a threshold: a fault is never lost to the bound). A node
/// has at most 64 devices and a config at most 16 thresholds.
pub const MAX_PENDING_FAULTS: usize = 256;

/// The occurrences of one fault that has not reached its threshold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// (seconds since the epoch, occurrences then), oldest first; together at most the
    /// threshold's count.
    pub times: VecDeque<(u64, u32)>,
    /// The counter's value last read, for a counted fault: its increase is what occurred.
    pub counter: u64,
}

/// How much of a fault a reading or a record shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// One occurrence (a kernel-log record).
    Once,
    /// A counter's value: its increase since the last reading occurred.
    Counter(u64),
}

impl Pending {
    /// Takes what `seen` shows at `now`; whether `threshold` is reached: `count`
    /// occurrences within the `window_secs` that end now.
    pub fn reached(&mut self, seen: Seen, now: u64, threshold: Threshold) -> bool {
        let occurred = match seen {
            Seen::Once => 1,
            Seen::Counter(value) => {
                // A counter that went down was reset: all of its value is new.
                let increase = value.checked_sub(self.counter).unwrap_or(value);
                self.counter = value;
                increase
            }
        };
        self.times.retain(|(at, _)| now.saturating_sub(*at) < threshold.window_secs);
        let count = threshold.count.clamp(1, MAX_THRESHOLD_COUNT);
        if occurred > 0 {
            self.times.push_back((now, occurred.min(u64::from(count)) as u32));
        }
        // Only the latest `count` occurrences can matter.
        while self.total() > u64::from(count) {
            let excess = self.total() - u64::from(count);
            match self.times.front_mut() {
                Some((_, n)) if u64::from(*n) > excess => *n -= excess as u32,
                Some(_) => {
                    self.times.pop_front();
                }
                None => break,
            }
        }
        self.total() >= u64::from(count)
    }

    fn total(&self) -> u64 {
        self.times.iter().map(|(_, n)| u64::from(*n)).sum()
    }
}

/// What decides whether a fault's occurrences make it a reason: the thresholds in force
/// and the faults below them, by (device, error, component, counter).
#[derive(Debug, Default)]
pub struct FaultGate {
    pub thresholds: Thresholds,
    pub pending: BTreeMap<(u32, String, String, String), Pending>,
}

impl FaultGate {
    /// Whether the fault `key` of `device` (not a reason yet), as `seen` at `now`, is one:
    /// at once without a threshold for its error, else once it reaches it (its pending
    /// occurrences are then forgotten). `false` means its occurrences wait.
    pub fn admits(&mut self, device: u32, key: &(String, String, String), seen: Seen, now: u64) -> bool {
        let Some(threshold) = self.thresholds.get(&key.0).copied() else { return true };
        let id = (device, key.0.clone(), key.1.clone(), key.2.clone());
        if !self.pending.contains_key(&id) && self.pending.len() >= MAX_PENDING_FAULTS {
            return true;
        }
        let reached = self.pending.entry(id.clone()).or_default().reached(seen, now, threshold);
        if reached {
            self.pending.remove(&id);
        }
        reached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_IN_A_MINUTE: Threshold = Threshold { count: 3, window_secs: 60 };

    #[test]
    fn occurrences_inside_the_window_reach_it_and_those_outside_do_not() {
        let mut p = Pending::default();
        assert!(!p.reached(Seen::Once, 100, THREE_IN_A_MINUTE));
        assert!(!p.reached(Seen::Once, 130, THREE_IN_A_MINUTE));
        assert!(p.reached(Seen::Once, 159, THREE_IN_A_MINUTE), "three within 59 s");

        let mut p = Pending::default();
        assert!(!p.reached(Seen::Once, 100, THREE_IN_A_MINUTE));
        assert!(!p.reached(Seen::Once, 130, THREE_IN_A_MINUTE));
        assert!(!p.reached(Seen::Once, 160, THREE_IN_A_MINUTE), "the first is 60 s old: outside");
    }

    #[test]
    fn the_window_slides_with_each_occurrence() {
        let mut p = Pending::default();
        for at in [0, 50, 100, 150, 200] {
            assert!(!p.reached(Seen::Once, at, THREE_IN_A_MINUTE), "never three within a minute ({at})");
        }
        assert_eq!(p.times.len(), 2, "what the window passed is forgotten: {:?}", p.times);
        assert!(p.reached(Seen::Once, 201, THREE_IN_A_MINUTE), "150, 200 and 201");
    }

    #[test]
    fn a_counter_occurs_by_its_increase_and_a_reset_starts_it_again() {
        let mut p = Pending::default();
        assert!(!p.reached(Seen::Counter(2), 0, THREE_IN_A_MINUTE));
        assert!(!p.reached(Seen::Counter(2), 10, THREE_IN_A_MINUTE), "unchanged: nothing occurred");
        assert!(p.reached(Seen::Counter(3), 20, THREE_IN_A_MINUTE));
        let mut p = Pending::default();
        assert!(p.reached(Seen::Counter(1_000_000), 0, THREE_IN_A_MINUTE), "many at once");
        assert_eq!(p.times, [(0, 3)], "kept within the count");
        let mut p = Pending { counter: 10, ..Pending::default() };
        assert!(!p.reached(Seen::Counter(2), 0, THREE_IN_A_MINUTE), "reset: 2 occurrences, not -8");
        assert_eq!(p.counter, 2);
    }

    #[test]
    fn without_a_threshold_the_first_occurrence_is_a_fault() {
        let mut gate = FaultGate::default();
        let key = ("DMA_ERROR".to_owned(), String::new(), String::new());
        assert!(gate.admits(0, &key, Seen::Once, 0));
        gate.thresholds = Arc::new([("DMA_ERROR".to_owned(), THREE_IN_A_MINUTE)].into());
        assert!(!gate.admits(0, &key, Seen::Once, 0));
        assert!(!gate.admits(1, &key, Seen::Once, 1), "each device counts its own");
        assert!(!gate.admits(0, &key, Seen::Once, 2));
        assert!(gate.admits(0, &key, Seen::Once, 3));
        assert_eq!(gate.pending.len(), 1, "device 0's occurrences forgotten once a fault: {:?}", gate.pending);
    }

    #[test]
    fn beyond_the_bound_a_fault_is_taken_at_once() {
        let mut gate = FaultGate {
            thresholds: Arc::new([("DMA_ERROR".to_owned(), THREE_IN_A_MINUTE)].into()),
            ..FaultGate::default()
        };
        for i in 0..MAX_PENDING_FAULTS {
            let key = ("DMA_ERROR".to_owned(), String::new(), format!("c{i}"));
            assert!(!gate.admits(0, &key, Seen::Once, 0));
        }
        let key = ("DMA_ERROR".to_owned(), String::new(), "one more".to_owned());
        assert!(gate.admits(0, &key, Seen::Once, 0));
        assert_eq!(gate.pending.len(), MAX_PENDING_FAULTS);
    }
}
