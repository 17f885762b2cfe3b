//! The node's current telemetry, built from neuron-monitor reports: what every sink
//! publishes. Sink-agnostic; the Prometheus sink encodes it on each scrape.
//!
//! Rules that fix the known faults of the existing exporters:
//! - A runtime's per-core series exist only for the cores it holds: non-zero
//!   `neuroncore_memory_usage` or non-zero utilization. neuron-monitor lists every core
//!   under every runtime, with zeros for cores that runtime does not own.
//! - Cores no runtime holds are exported with zero utilization and no runtime tag, so an
//!   idle node differs from a broken one.
//! - A runtime missing from a report is dropped with all its series.
//! - Instance labels follow the latest report.
//! - A group with an error (or unreadable) keeps no gauges; its problem is recorded.
//!   A group missing from a report (not refreshed in that tick) keeps its last values.
//! - Counters are running sums of the per-period counts, since the agent first saw the
//!   runtime (or started, for node-level counters). They restart from zero when the
//!   runtime disappears and comes back, or when the agent restarts; Prometheus'
//!   `rate()`/`increase()` handle such resets.

use std::sync::Arc;

use api::report::{
    CoreMemory, ErrorSummary, ExecutionSummary, Group, HardwareInfo, InstanceInfo, Item, Percentiles, Report,
    RuntimeEntry,
};

/// Labels that identify the host, as in AWS's exporter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceLabels {
    pub instance_name: String,
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub region: String,
    pub subnet_id: String,
    /// Not a Prometheus label (AWS's exporter has none); a CloudWatch dimension.
    pub ami_id: String,
}

impl InstanceLabels {
    fn from_report(info: &InstanceInfo<'_>) -> Self {
        let text = |v: &Option<std::borrow::Cow<'_, str>>| v.as_deref().unwrap_or_default().to_owned();
        InstanceLabels {
            instance_name: text(&info.instance_name),
            instance_id: text(&info.instance_id),
            instance_type: text(&info.instance_type),
            availability_zone: text(&info.instance_availability_zone),
            region: text(&info.instance_region),
            subnet_id: text(&info.subnet_id),
            ami_id: text(&info.ami_id),
        }
    }
}

/// The Kubernetes workload a runtime or a core belongs to (set by attribution, shared
/// between the series of one container).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    /// Empty when the process is known to be in the pod but not in which container.
    pub container: String,
    /// Allow-listed pod labels as (metric label name, value), in allow-list order.
    pub labels: Vec<(String, String)>,
}

/// Labels of every series of one runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeLabels {
    pub instance: Arc<InstanceLabels>,
    pub runtime_tag: String,
    pub pod: Option<Arc<PodRef>>,
}

/// A core of the host no runtime holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleCore {
    pub index: u32,
    /// The pod the kubelet gave it to, if any (set by attribution).
    pub pod: Option<Arc<PodRef>>,
}

/// One core held by a runtime.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeldCore {
    pub index: u32,
    /// Percent; `None` while the counters group is in error or was never reported.
    pub utilization: Option<f64>,
    /// `None` while the memory group is in error or was never reported.
    pub memory: Option<CoreMemory>,
}

/// What the agent exports of one monitored application.
#[derive(Clone, Debug)]
pub struct RuntimeState {
    pub labels: Arc<RuntimeLabels>,
    pub pid: Option<u32>,
    pub cores: Vec<HeldCore>,
    /// host, neuron_device bytes.
    pub memory_used: Option<[Option<f64>; 2]>,
    /// user, system percent.
    pub vcpu: Option<[Option<f64>; 2]>,
    /// Total latency percentiles (seconds); `None` when null or in error.
    pub latency: Option<Percentiles>,
    /// Running sums, in the order of [`ErrorSummary::KINDS`] / [`ExecutionSummary::KINDS`];
    /// `None` until the first execution_stats group was read.
    pub errors_total: Option<[f64; 6]>,
    pub status_total: Option<[f64; 6]>,
    // Last good per-core data, kept across reports that did not refresh the group.
    utilization: Option<Vec<(u32, f64)>>,
    core_memory: Option<Vec<(u32, CoreMemory)>>,
}

/// A group that is in error or unreadable in the latest report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupProblem {
    pub group: &'static str,
    /// Empty for system groups and the always-present objects.
    pub runtime_tag: String,
    pub kind: ProblemKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// neuron-monitor reported an `error` for the group.
    Monitor,
    /// The group's JSON did not have the documented shape.
    Malformed,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Monitor => "monitor",
            ProblemKind::Malformed => "malformed",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct HardwareSummary {
    pub device_count: Option<u32>,
    pub cores_per_device: Option<u32>,
    pub device_type: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemState {
    pub vcpu_count: Option<usize>,
    /// user (user + nice), system (system + io_wait + irq + soft_irq), percent.
    pub vcpu_usage: Option<[Option<f64>; 2]>,
    /// memory total, memory used, swap total, swap used.
    pub memory: Option<[Option<f64>; 4]>,
    /// Running sums of ECC events per device, in the order of `DeviceEccCounters::KINDS`.
    pub ecc_totals: Vec<(u32, [f64; 4])>,
}

/// Everything the agent knows about the node, as of the latest report.
#[derive(Debug)]
pub struct NodeState {
    pub instance: Arc<InstanceLabels>,
    pub hardware: Option<HardwareSummary>,
    /// Sorted by runtime tag.
    pub runtimes: Vec<RuntimeState>,
    /// Cores of the host that no runtime holds, by index.
    pub idle_cores: Vec<IdleCore>,
    pub system: SystemState,
    pub problems: Vec<GroupProblem>,
    pub reports: u64,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            instance: Arc::new(InstanceLabels::default()),
            hardware: None,
            runtimes: Vec::new(),
            idle_cores: Vec::new(),
            system: SystemState::default(),
            problems: Vec::new(),
            reports: 0,
        }
    }
}

impl NodeState {
    /// Folds one report into the state.
    pub fn apply(&mut self, report: &Report<'_>) {
        self.reports += 1;
        self.problems.clear();
        self.apply_instance(report);
        self.apply_hardware(report);
        self.apply_runtimes(report);
        self.apply_system(report);
        self.compute_idle_cores();
    }

    fn note<T>(&mut self, group: &'static str, runtime_tag: &str, value: &Group<T>) {
        let (kind, message) = match value {
            Group::Ok(_) => return,
            Group::Error(e) => (ProblemKind::Monitor, e),
            Group::Malformed(e) => (ProblemKind::Malformed, e),
        };
        self.problems.push(GroupProblem { group, runtime_tag: runtime_tag.to_owned(), kind, message: message.clone() });
    }

    fn apply_instance(&mut self, report: &Report<'_>) {
        let Some(info) = &report.instance_info else {
            return;
        };
        self.note("instance_info", "", info);
        if let Group::Ok(info) = info {
            let labels = InstanceLabels::from_report(info);
            if *self.instance != labels {
                self.instance = Arc::new(labels);
                for rt in &mut self.runtimes {
                    Arc::make_mut(&mut rt.labels).instance = self.instance.clone();
                }
            }
        }
    }

    fn apply_hardware(&mut self, report: &Report<'_>) {
        let Some(info) = &report.neuron_hardware_info else {
            return;
        };
        self.note("neuron_hardware_info", "", info);
        if let Group::Ok(info) = info {
            self.hardware = Some(summarize_hardware(info));
        }
    }

    fn apply_runtimes(&mut self, report: &Report<'_>) {
        let mut previous = std::mem::take(&mut self.runtimes);
        let entries: Vec<&RuntimeEntry<'_>> = report
            .neuron_runtime_data
            .iter()
            .filter_map(|item| match item {
                Item::Ok(rt) => Some(rt),
                Item::Malformed(reason) => {
                    self.problems.push(GroupProblem {
                        group: "neuron_runtime_data",
                        runtime_tag: String::new(),
                        kind: ProblemKind::Malformed,
                        message: reason.clone(),
                    });
                    None
                }
            })
            .collect();
        let tags = runtime_tags(&entries);
        let mut current = Vec::with_capacity(entries.len());
        for (entry, tag) in entries.into_iter().zip(tags) {
            let mut state = match previous.iter().position(|p| p.labels.runtime_tag == tag) {
                Some(i) => previous.swap_remove(i),
                None => RuntimeState::new(Arc::new(RuntimeLabels {
                    instance: self.instance.clone(),
                    runtime_tag: tag,
                    pod: None,
                })),
            };
            state.pid = entry.pid;
            if !entry.error.is_empty() {
                let problem = Group::<()>::Error(entry.error.to_string());
                self.note("neuron_runtime", &state.labels.runtime_tag, &problem);
            }
            if let Some(groups) = &entry.report {
                let tag = state.labels.runtime_tag.clone();
                if let Some(g) = &groups.neuroncore_counters {
                    self.note("neuroncore_counters", &tag, g);
                    state.utilization = g.ok().map(|c| {
                        c.neuroncores_in_use
                            .iter()
                            .flat_map(|m| m.iter())
                            .filter_map(|(i, c)| c.neuroncore_utilization.filter(|u| *u != 0.0).map(|u| (i, u)))
                            .collect()
                    });
                }
                if let Some(g) = &groups.memory_used {
                    self.note("memory_used", &tag, g);
                    let used = g.ok().and_then(|m| m.neuron_runtime_used_bytes.as_ref());
                    state.memory_used = used.map(|u| [u.host, u.neuron_device]);
                    state.core_memory = g.ok().map(|_| {
                        used.and_then(|u| u.usage_breakdown.as_ref())
                            .and_then(|b| b.neuroncore_memory_usage.as_ref())
                            .map(|m| m.iter().filter(|(_, c)| c.is_held()).map(|(i, c)| (i, *c)).collect())
                            .unwrap_or_default()
                    });
                }
                if let Some(g) = &groups.neuron_runtime_vcpu_usage {
                    self.note("neuron_runtime_vcpu_usage", &tag, g);
                    state.vcpu = g.ok().and_then(|v| v.vcpu_usage).map(|v| [v.user, v.system]);
                }
                if let Some(g) = &groups.execution_stats {
                    self.note("execution_stats", &tag, g);
                    match g.ok() {
                        Some(stats) => {
                            let errors = stats.error_summary.unwrap_or_default().values();
                            add_counts(state.errors_total.get_or_insert([0.0; 6]), &errors);
                            let status = stats.execution_summary.unwrap_or_default().values();
                            add_counts(state.status_total.get_or_insert([0.0; 6]), &status);
                            state.latency = stats.latency_stats.and_then(|l| l.total_latency);
                        }
                        None => state.latency = None,
                    }
                }
            }
            state.compute_cores();
            current.push(state);
        }
        current.sort_by(|a, b| a.labels.runtime_tag.cmp(&b.labels.runtime_tag));
        self.runtimes = current;
    }

    fn apply_system(&mut self, report: &Report<'_>) {
        let Some(system) = &report.system_data else {
            return;
        };
        if let Some(g) = &system.vcpu_usage {
            self.note("vcpu_usage", "", g);
            let usage = g.ok();
            self.system.vcpu_count = usage.and_then(|u| u.usage_data.as_ref()).map(|d| d.len());
            self.system.vcpu_usage = usage
                .and_then(|u| u.average_usage)
                .map(|a| [sum(&[a.user, a.nice]), sum(&[a.system, a.io_wait, a.irq, a.soft_irq])]);
        }
        if let Some(g) = &system.memory_info {
            self.note("memory_info", "", g);
            self.system.memory =
                g.ok().map(|m| [m.memory_total_bytes, m.memory_used_bytes, m.swap_total_bytes, m.swap_used_bytes]);
        }
        if let Some(g) = &system.neuron_hw_counters {
            self.note("neuron_hw_counters", "", g);
            for device in g.ok().and_then(|h| h.neuron_devices.as_deref()).unwrap_or_default() {
                let Some(index) = device.neuron_device_index else {
                    continue;
                };
                let totals = &mut self.system.ecc_totals;
                let slot = match totals.iter().position(|(i, _)| *i == index) {
                    Some(slot) => slot,
                    None => {
                        totals.push((index, [0.0; 4]));
                        totals.len() - 1
                    }
                };
                add_counts(&mut totals[slot].1, &device.values());
            }
            self.system.ecc_totals.sort_by_key(|(i, _)| *i);
        }
    }

    /// Recomputes the idle cores, with no pod: attribution sets it after each report.
    fn compute_idle_cores(&mut self) {
        self.idle_cores.clear();
        let Some(total) = self.hardware.as_ref().and_then(|h| h.device_count?.checked_mul(h.cores_per_device?)) else {
            return;
        };
        let held = |core: u32| self.runtimes.iter().any(|rt| rt.cores.iter().any(|c| c.index == core));
        self.idle_cores = (0..total).filter(|c| !held(*c)).map(|index| IdleCore { index, pod: None }).collect();
    }

    /// Indices of the idle cores.
    pub fn idle_core_indices(&self) -> Vec<u32> {
        self.idle_cores.iter().map(|c| c.index).collect()
    }
}

impl RuntimeState {
    fn new(labels: Arc<RuntimeLabels>) -> Self {
        RuntimeState {
            labels,
            pid: None,
            cores: Vec::new(),
            memory_used: None,
            vcpu: None,
            latency: None,
            errors_total: None,
            status_total: None,
            utilization: None,
            core_memory: None,
        }
    }

    /// Held cores: those with memory on them or non-zero utilization.
    fn compute_cores(&mut self) {
        self.cores.clear();
        let busy = self.utilization.iter().flatten().map(|(i, _)| *i);
        let loaded = self.core_memory.iter().flatten().map(|(i, _)| *i);
        let mut indices: Vec<u32> = busy.chain(loaded).collect();
        indices.sort_unstable();
        indices.dedup();
        for index in indices {
            let utilization =
                self.utilization.as_ref().map(|u| u.iter().find(|(i, _)| *i == index).map_or(0.0, |(_, v)| *v));
            let memory = self
                .core_memory
                .as_ref()
                .map(|m| m.iter().find(|(i, _)| *i == index).map_or_else(CoreMemory::default, |(_, v)| *v));
            self.cores.push(HeldCore { index, utilization, memory });
        }
    }
}

fn summarize_hardware(info: &HardwareInfo<'_>) -> HardwareSummary {
    HardwareSummary {
        device_count: info.neuron_device_count,
        cores_per_device: info.neuroncore_per_device_count,
        device_type: info.neuron_device_type.as_deref().map(str::to_owned),
    }
}

/// The exported tag of each runtime: its tag, or its PID when the tag is empty (as
/// neuron-monitor does when `NEURON_PROCESS_TAG` is unset). Tags shared by several
/// processes get `@<pid>` on all but the lowest PID, so that no two runtimes export
/// the same series.
fn runtime_tags(entries: &[&RuntimeEntry<'_>]) -> Vec<String> {
    let base: Vec<String> = entries
        .iter()
        .map(|e| match e.neuron_runtime_tag.as_deref() {
            Some(tag) if !tag.is_empty() => tag.to_owned(),
            _ => e.pid.map(|p| p.to_string()).unwrap_or_default(),
        })
        .collect();
    base.iter()
        .enumerate()
        .map(|(i, tag)| {
            let pid = entries[i].pid.unwrap_or(0);
            let shared_with_lower_pid = base
                .iter()
                .enumerate()
                .any(|(j, other)| j != i && other == tag && (entries[j].pid.unwrap_or(0), j) < (pid, i));
            if shared_with_lower_pid {
                format!("{tag}@{pid}")
            } else {
                tag.clone()
            }
        })
        .collect()
}

fn add_counts<const N: usize>(totals: &mut [f64; N], counts: &[Option<f64>; N]) {
    for (total, count) in totals.iter_mut().zip(counts) {
        // A negative count is not a count: ignore it rather than make a counter go down.
        if let Some(c) = count.filter(|c| *c > 0.0 && c.is_finite()) {
            *total += c;
        }
    }
}

fn sum(parts: &[Option<f64>]) -> Option<f64> {
    let known: Vec<f64> = parts.iter().flatten().copied().collect();
    (!known.is_empty()).then(|| known.iter().sum())
}

// Referenced by docs and the sinks.
pub const ERROR_KINDS: [&str; 6] = ErrorSummary::KINDS;
pub const STATUS_KINDS: [&str; 6] = ExecutionSummary::KINDS;

#[cfg(test)]
mod tests;
