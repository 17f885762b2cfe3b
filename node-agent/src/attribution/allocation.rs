//! What the node can allocate and has allocated, and which allocated cores sit idle.
//!
//! Allocatable: the device plugin's devices and cores (the kubelet's
//! `GetAllocatableResources`) and the DRA driver's devices (this node's ResourceSlices).
//! Allocated: the cores of every allocation, the device plugin's or a claim's. A core is
//! "allocated but idle" once it has stayed below the policy's utilization for its whole
//! window while allocated: its clock starts again whenever it is busy or newly allocated.
//! A core no runtime uses counts as idle (it is held and does nothing, the case users
//! ask about); a runtime's core whose utilization is unknown counts as busy, as nothing
//! says otherwise.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::state::{AllocationState, CoreAllocation, HeldCore, PodCores, PodRef};

/// When an allocated core counts as idle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IdlePolicy {
    /// Utilization, percent, below which a core is idle.
    pub below_percent: f64,
    /// How long it stays so before it counts.
    pub window: Duration,
}

impl Default for IdlePolicy {
    /// Under 5 % busy for 10 minutes: what users asking for the metric call idle.
    fn default() -> Self {
        IdlePolicy { below_percent: 5.0, window: Duration::from_secs(600) }
    }
}

/// Since when each allocated core has been idle.
#[derive(Debug, Default)]
pub struct IdleClock {
    /// By core index; `None`: not allocated, or busy at the last report.
    idle_since: Vec<Option<Instant>>,
}

impl IdleClock {
    /// Takes one report's activity (the cores its runtimes use) of the `allocated` cores
    /// (sorted) at `now`; returns which of them have been idle for the policy's window.
    pub fn tick<'a>(
        &mut self,
        used: impl Iterator<Item = &'a HeldCore>,
        allocated: &[u32],
        policy: IdlePolicy,
        now: Instant,
    ) -> Vec<bool> {
        let busy = busy_cores(used, policy.below_percent);
        let mut since = vec![None; allocated.last().map_or(0, |c| *c as usize + 1)];
        let mut idle = Vec::with_capacity(allocated.len());
        for &core in allocated {
            let index = core as usize;
            let started = if busy.get(index).copied().unwrap_or(false) {
                None
            } else {
                Some(self.idle_since.get(index).copied().flatten().unwrap_or(now))
            };
            since[index] = started;
            idle.push(started.is_some_and(|s| now.saturating_duration_since(s) >= policy.window));
        }
        self.idle_since = since;
        idle
    }
}

/// Whether each core (by index) is busy: a runtime uses it at `below_percent` or more,
/// or with an unknown utilization.
fn busy_cores<'a>(used: impl Iterator<Item = &'a HeldCore>, below_percent: f64) -> Vec<bool> {
    let mut busy = Vec::new();
    for core in used {
        let index = core.index as usize;
        if busy.len() <= index {
            busy.resize(index + 1, false);
        }
        busy[index] |= core.utilization.is_none_or(|u| u >= below_percent);
    }
    busy
}

/// The node's and each device's counts: `allocatable` and `allocated` core indices
/// (sorted, without duplicates), `idle` for each allocated one.
pub fn summarize(allocatable: &[u32], allocated: &[u32], idle: &[bool], cores_per_device: u32) -> AllocationState {
    let mut devices: Vec<(u32, CoreAllocation)> = Vec::new();
    for &core in allocatable {
        device_of(&mut devices, core, cores_per_device).allocatable += 1;
    }
    for (&core, &idle) in allocated.iter().zip(idle) {
        let counts = device_of(&mut devices, core, cores_per_device);
        counts.allocated += 1;
        counts.allocated_idle += u32::from(idle);
    }
    let mut node = CoreAllocation::default();
    for (_, d) in &devices {
        node.allocatable += d.allocatable;
        node.allocated += d.allocated;
        node.allocated_idle += d.allocated_idle;
    }
    AllocationState {
        cores: node,
        devices_allocatable: devices.iter().filter(|(_, d)| d.allocatable > 0).count() as u32,
        devices_allocated: devices.iter().filter(|(_, d)| d.allocated > 0).count() as u32,
        devices,
        pods: Vec::new(),
    }
}

/// The cores of each known pod, by namespace and name, from each allocated core's owner
/// (none: the pod is not known yet) and whether it is idle.
pub fn per_pod<'a>(cores: impl Iterator<Item = (Option<&'a Arc<PodRef>>, bool)>) -> Vec<PodCores> {
    let mut pods: Vec<PodCores> = Vec::new();
    for (owner, idle) in cores {
        let Some(owner) = owner else { continue };
        let wanted = (owner.namespace.as_str(), owner.pod.as_str());
        let at = match pods.binary_search_by(|p| (p.pod.namespace.as_str(), p.pod.pod.as_str()).cmp(&wanted)) {
            Ok(at) => at,
            Err(at) => {
                pods.insert(at, PodCores { pod: owner.clone(), allocated: 0, allocated_idle: 0 });
                at
            }
        };
        pods[at].allocated += 1;
        pods[at].allocated_idle += u32::from(idle);
    }
    pods
}

/// The counts of the device of `core`, added in order where missing.
fn device_of(devices: &mut Vec<(u32, CoreAllocation)>, core: u32, cores_per_device: u32) -> &mut CoreAllocation {
    let index = core / cores_per_device.max(1);
    let at = devices.binary_search_by_key(&index, |(d, _)| *d).unwrap_or_else(|at| {
        devices.insert(at, (index, CoreAllocation::default()));
        at
    });
    &mut devices[at].1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(cores: &[(u32, Option<f64>)]) -> Vec<HeldCore> {
        let core = |(index, utilization)| HeldCore { index, utilization, memory: None, flops: [None; 2] };
        cores.iter().copied().map(core).collect()
    }

    const POLICY: IdlePolicy = IdlePolicy { below_percent: 5.0, window: Duration::from_secs(60) };

    #[test]
    fn an_allocated_core_counts_as_idle_only_after_a_whole_window_below_the_threshold() {
        let mut clock = IdleClock::default();
        let t0 = Instant::now();
        // Core 0 busy, core 1 at 1 % (below 5), core 2 without a runtime.
        let state = node_with(&[(0, Some(80.0)), (1, Some(1.0))]);
        assert_eq!(clock.tick(state.iter(), &[0, 1, 2], POLICY, t0), [false, false, false]);
        assert_eq!(clock.tick(state.iter(), &[0, 1, 2], POLICY, t0 + Duration::from_secs(59)), [false, false, false]);
        assert_eq!(clock.tick(state.iter(), &[0, 1, 2], POLICY, t0 + Duration::from_secs(60)), [false, true, true]);
        // Core 1 busy once: its window starts again.
        let busy = node_with(&[(0, Some(80.0)), (1, Some(5.0))]);
        assert_eq!(clock.tick(busy.iter(), &[0, 1, 2], POLICY, t0 + Duration::from_secs(61)), [false, false, true]);
        assert_eq!(clock.tick(state.iter(), &[0, 1, 2], POLICY, t0 + Duration::from_secs(62)), [false, false, true]);
        assert_eq!(clock.tick(state.iter(), &[0, 1, 2], POLICY, t0 + Duration::from_secs(122)), [false, true, true]);
    }

    #[test]
    fn a_core_freed_and_allocated_again_starts_a_new_window() {
        let mut clock = IdleClock::default();
        let t0 = Instant::now();
        let state: Vec<HeldCore> = Vec::new();
        clock.tick(state.iter(), &[3], POLICY, t0);
        assert_eq!(clock.tick(state.iter(), &[3], POLICY, t0 + Duration::from_secs(60)), [true]);
        assert_eq!(clock.tick(state.iter(), &[], POLICY, t0 + Duration::from_secs(61)), Vec::<bool>::new());
        assert_eq!(clock.tick(state.iter(), &[3], POLICY, t0 + Duration::from_secs(62)), [false]);
        assert_eq!(clock.tick(state.iter(), &[3], POLICY, t0 + Duration::from_secs(122)), [true]);
    }

    #[test]
    fn a_core_of_unknown_utilization_is_not_idle() {
        let mut clock = IdleClock::default();
        let t0 = Instant::now();
        let state = node_with(&[(0, None)]);
        clock.tick(state.iter(), &[0], POLICY, t0);
        assert_eq!(clock.tick(state.iter(), &[0], POLICY, t0 + Duration::from_secs(3600)), [false]);
    }

    #[test]
    fn counts_add_up_per_device_and_per_node() {
        // Two cores per device: devices 0, 1, 2 allocatable; cores 1 and 2 allocated, 2 idle.
        let summary = summarize(&[0, 1, 2, 3, 4, 5], &[1, 2], &[false, true], 2);
        let counts = |allocatable, allocated, allocated_idle| CoreAllocation { allocatable, allocated, allocated_idle };
        assert_eq!(summary.cores, counts(6, 2, 1));
        assert_eq!((summary.devices_allocatable, summary.devices_allocated), (3, 2));
        assert_eq!(summary.devices, vec![(0, counts(2, 1, 0)), (1, counts(2, 1, 1)), (2, counts(2, 0, 0))]);
    }

    #[test]
    fn a_core_allocated_beyond_the_allocatable_ones_is_still_counted() {
        // A device the plugin no longer advertises (unhealthy) while its pod holds it.
        let summary = summarize(&[0, 1], &[2], &[false], 2);
        assert_eq!(summary.cores.allocated, 1);
        assert_eq!(summary.cores.allocatable, 2);
        assert_eq!(summary.devices_allocated, 1);
    }

    /// Each pod's cores and idle ones, pods sorted by namespace and name; a core whose
    /// pod is not known yet is left out (the node's counts still have it).
    #[test]
    fn each_known_pod_counts_its_cores_and_idle_ones() {
        let pod = |namespace: &str, name: &str| {
            Arc::new(PodRef { namespace: namespace.into(), pod: name.into(), ..PodRef::default() })
        };
        let (b, a) = (pod("team-b", "serve-0"), pod("team-a", "train-0"));
        let cores = [(Some(&b), true), (Some(&a), false), (None, true), (Some(&b), false), (Some(&a), true)];
        let pods = per_pod(cores.into_iter());
        let got: Vec<(&str, u32, u32)> =
            pods.iter().map(|p| (p.pod.pod.as_str(), p.allocated, p.allocated_idle)).collect();
        assert_eq!(got, [("train-0", 2, 1), ("serve-0", 2, 1)]);
    }
}
