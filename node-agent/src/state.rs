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
//!
//! Nothing of a report is trusted as a size (limits in [`api::limits`]): hardware counts
//! beyond any real node refuse the `neuron_hardware_info` group, core and device indices
//! beyond them are ignored, runtime entries beyond the cap are skipped, and label values
//! are cut to a bounded length without control characters. What was refused is counted
//! in [`NodeState::refusals`]. The cost of a report is linear in its size.

use std::{borrow::Cow, sync::Arc};

use api::{
    limits::{
        MAX_NEURONCORES, MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES, MAX_PHYSICAL_PER_LOGICAL,
        MAX_REPORT_LABEL_VALUE_BYTES, MAX_UNDOCUMENTED_NAMES,
    },
    report::{CoreMemory, Group, HardwareInfo, InstanceInfo, Name, Named, NumberOrText, Report},
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
    fn from_report(info: &InstanceInfo<'_>, refused: &mut u64) -> Self {
        let mut text = |v: &Option<std::borrow::Cow<'_, str>>| label_value(v.as_deref().unwrap_or_default(), refused);
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

    /// These labels, each empty one taken from `fallback`.
    fn or(&self, fallback: &InstanceLabels) -> InstanceLabels {
        let pick = |own: &String, other: &String| if own.is_empty() { other.clone() } else { own.clone() };
        InstanceLabels {
            instance_name: pick(&self.instance_name, &fallback.instance_name),
            instance_id: pick(&self.instance_id, &fallback.instance_id),
            instance_type: pick(&self.instance_type, &fallback.instance_type),
            availability_zone: pick(&self.availability_zone, &fallback.availability_zone),
            region: pick(&self.region, &fallback.region),
            subnet_id: pick(&self.subnet_id, &fallback.subnet_id),
            ami_id: pick(&self.ami_id, &fallback.ami_id),
        }
    }
}

/// The Kubernetes workload a runtime or a core belongs to (set by attribution, shared
/// between the series of one container).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    /// The workload the pod belongs to, as Container Insights names it (its `PodName`):
    /// the Deployment, DaemonSet or CronJob; the pod's own name when it has none.
    pub owner: String,
    /// Empty when the process is known to be in the pod but not in which container.
    pub container: String,
    /// Allow-listed pod labels as (metric label name, value), in allow-list order.
    pub labels: Vec<(String, String)>,
}

/// The ECS task container a runtime runs in (set by attribution from the ECS agent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EcsContainer {
    pub task_arn: String,
    /// The task definition's family.
    pub family: String,
    /// The container's name in the task definition.
    pub container: String,
}

/// Labels of every series of one runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeLabels {
    pub instance: Arc<InstanceLabels>,
    pub runtime_tag: String,
    pub pod: Option<Arc<PodRef>>,
    pub ecs: Option<Arc<EcsContainer>>,
}

/// A core of the host no runtime holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleCore {
    pub index: u32,
    /// The pod the kubelet gave it to, if any (set by attribution).
    pub pod: Option<Arc<PodRef>>,
}

/// NeuronCores by what the kubelet can and did allocate, on the node or one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreAllocation {
    pub allocatable: u32,
    pub allocated: u32,
    /// Allocated, and idle for the whole idle window ([`crate::attribution::allocation`]).
    pub allocated_idle: u32,
}

/// The allocation of the node's Neuron devices and cores (set by attribution).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocationState {
    pub cores: CoreAllocation,
    pub devices_allocatable: u32,
    pub devices_allocated: u32,
    /// By device index: each device with an allocatable or an allocated core.
    pub devices: Vec<(u32, CoreAllocation)>,
    /// The cores allocated to each known pod, by namespace and name.
    pub pods: Vec<PodCores>,
}

/// The cores allocated to one known pod (one of its containers stands for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCores {
    pub pod: Arc<PodRef>,
    pub allocated: u32,
    /// Allocated, and idle for the whole idle window.
    pub allocated_idle: u32,
}

impl CoreAllocation {
    /// The values of the `state` label, with their counts.
    pub fn by_state(&self) -> [(&'static str, u32); 3] {
        let [allocatable, allocated, idle] = api::cloudwatch::catalogue::ALLOCATION_STATES;
        [(allocatable, self.allocatable), (allocated, self.allocated), (idle, self.allocated_idle)]
    }
}

impl PodCores {
    /// The values of the `State` dimension a pod's cores have, with their counts.
    pub fn by_state(&self) -> [(&'static str, u32); 2] {
        let [allocated, idle] = api::cloudwatch::catalogue::POD_ALLOCATION_STATES;
        [(allocated, self.allocated), (idle, self.allocated_idle)]
    }
}

/// One core held by a runtime.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeldCore {
    pub index: u32,
    /// Percent; `None` while the counters group is in error or was never reported.
    pub utilization: Option<f64>,
    /// `None` while the memory group is in error or was never reported.
    pub memory: Option<CoreMemory>,
    /// `flops` and `effective_flops` of the counters group (operations per second over
    /// the period), when the report has them.
    pub flops: [Option<f64>; 2],
}

/// The physical cores of one logical core, by index within it.
pub type PhysicalCores = [Option<f64>; MAX_PHYSICAL_PER_LOGICAL as usize];

/// Values by name, as reports give them (error types, statuses, percentiles): the
/// names of their documented lists and up to [`MAX_UNDOCUMENTED_NAMES`] others, in the
/// order first seen. A name a report did not carry has no value here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamedValues(Vec<(Cow<'static, str>, f64)>);

impl NamedValues {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(n, v)| (n.as_ref(), *v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values of a report's object (percentiles), replacing these.
    fn set<K>(&mut self, named: &Named<'_, K>) {
        self.0.clear();
        self.0.extend(named.iter().filter(|(_, v)| v.is_finite()).map(|(n, v)| (n.to_static(), v)));
    }

    /// Adds a report's per-period counts to these running sums: a name first seen starts
    /// from zero and keeps its sum while later reports leave it out. A negative count is
    /// not a count and is ignored; an undocumented name beyond the bound is counted in
    /// `refused`.
    fn add<K>(&mut self, counts: &Named<'_, K>, refused: &mut u64) {
        for (name, count) in counts.iter() {
            if !(count >= 0.0 && count.is_finite()) {
                continue;
            }
            match self.0.iter().position(|(n, _)| n == name.as_str()) {
                Some(i) => self.0[i].1 += count,
                None if matches!(name, Name::Documented(_)) || self.undocumented() < MAX_UNDOCUMENTED_NAMES => {
                    self.0.push((name.to_static(), count))
                }
                None => *refused += 1,
            }
        }
    }

    fn undocumented(&self) -> usize {
        self.0.iter().filter(|(n, _)| matches!(n, Cow::Owned(_))).count()
    }
}

/// The models one runtime has loaded (`memory_used.loaded_models`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadedModels {
    /// `false` when the list did not have the documented shape: nothing is exported.
    pub readable: bool,
    /// Models by `is_running`: started, loaded but not started, not said.
    pub running: u32,
    pub idle: u32,
    pub unknown: u32,
    /// The first [`api::limits::MAX_MODEL_INFO_PER_RUNTIME`] models, in report order.
    pub info: Vec<ModelInfo>,
    /// The text the list was read from: the next report's is read only if it differs (the
    /// list is most of a report's bytes and rarely changes; comparing costs far less).
    source: String,
    /// What reading it refused: models, label values.
    refused: (u64, u64),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// A bounded [`label_value`]; empty when the report gives none.
    pub name: String,
    pub model_id: Option<u64>,
    pub is_running: Option<bool>,
}

/// What the agent exports of one monitored application.
#[derive(Clone, Debug)]
pub struct RuntimeState {
    pub labels: Arc<RuntimeLabels>,
    pub pid: Option<u32>,
    pub cores: Vec<HeldCore>,
    /// host, neuron_device bytes.
    pub memory_used: Option<[Option<f64>; 2]>,
    /// `None` while the memory group is in error or was never reported.
    pub models: Option<LoadedModels>,
    /// user, system percent.
    pub vcpu: Option<[Option<f64>; 2]>,
    /// Total latency percentiles (seconds); `None` when null or in error.
    pub latency: Option<NamedValues>,
    /// Device latency percentiles (seconds; the time on the device alone); `None` when
    /// null or in error.
    pub device_latency: Option<NamedValues>,
    /// Running sums by error type / by execution status, of the types the reports
    /// carried; `None` until the first execution_stats group was read.
    pub errors_total: Option<NamedValues>,
    pub status_total: Option<NamedValues>,
    /// The physical cores of the held logical ones (trn2): (logical core, physical core
    /// of the host, utilization percent).
    pub physical_cores: Vec<(u32, u32, f64)>,
    // Last good per-core data, kept across reports that did not refresh the group.
    utilization: Option<Vec<(u32, f64)>>,
    /// Cores with `flops` or `effective_flops`.
    flops: Vec<(u32, [Option<f64>; 2])>,
    /// Logical cores with physical ones (trn2): their utilizations by index within it
    /// (inline: every core of the host is listed under every runtime).
    physical: Vec<(u32, PhysicalCores)>,
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
    /// Values beyond any real node (hardware counts): the group is refused.
    OutOfBounds,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Monitor => "monitor",
            ProblemKind::Malformed => "malformed",
            ProblemKind::OutOfBounds => "out_of_bounds",
        }
    }
}

/// What the agent did not take as reported from the latest report, by kind (the values
/// of the `what` label of `neuron_agent_report_values_refused_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Runtime entries after the first [`api::limits::MAX_RUNTIMES_PER_REPORT`], skipped.
    pub runtimes: u64,
    /// Core entries with an index at or above [`MAX_NEURONCORES`], ignored.
    pub core_indices: u64,
    /// Per-core values beyond [`api::limits::MAX_CORE_ENTRIES_PER_REPORT`], ignored.
    pub core_entries: u64,
    /// Device entries with an index at or above [`MAX_NEURON_DEVICES`], ignored.
    pub device_indices: u64,
    /// `neuron_hardware_info` groups whose counts exceed the limits, refused.
    pub hardware_counts: u64,
    /// Label values cut to [`MAX_REPORT_LABEL_VALUE_BYTES`] or with control characters
    /// replaced.
    pub label_values: u64,
    /// Error types, statuses and percentiles not taken: undocumented names beyond
    /// [`MAX_UNDOCUMENTED_NAMES`] (per object, or in a runtime's sums) or not
    /// [`api::report::is_value_name`], names given twice, values that are not numbers.
    pub value_names: u64,
    /// Loaded models beyond [`api::limits::MAX_LOADED_MODELS_PER_RUNTIME`] (not read) or
    /// [`api::limits::MAX_MODEL_INFO_PER_RUNTIME`] (no info series of their own).
    pub loaded_models: u64,
    /// Containers of one `neuron_k8s_info` entry beyond
    /// [`api::limits::MAX_K8S_CONTAINERS_PER_ENTRY`].
    pub k8s_containers: u64,
}

impl Refusals {
    pub const KINDS: [&'static str; 9] = [
        "runtime",
        "neuroncore_index",
        "neuroncore_entry",
        "neuron_device_index",
        "hardware_counts",
        "label_value",
        "value_name",
        "loaded_model",
        "k8s_container",
    ];

    /// Counts in the order of [`Refusals::KINDS`].
    pub fn counts(&self) -> [u64; 9] {
        [
            self.runtimes,
            self.core_indices,
            self.core_entries,
            self.device_indices,
            self.hardware_counts,
            self.label_values,
            self.value_names,
            self.loaded_models,
            self.k8s_containers,
        ]
    }

    pub fn is_empty(&self) -> bool {
        self.counts().iter().all(|c| *c == 0)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct HardwareSummary {
    pub device_count: Option<u32>,
    pub cores_per_device: Option<u32>,
    pub device_type: Option<String>,
    /// Physical cores per logical one, when the report says (trn2, trn3).
    pub logical_neuroncore_config: Option<u32>,
    /// The newer fields the report has, as labels of `neuron_hardware_info`, in a fixed
    /// order: neuron_device_type, neuron_device_version, neuroncore_version,
    /// neuron_device_memory_size, logical_neuroncore_config.
    pub labels: Vec<(&'static str, String)>,
}

/// Who uses each core and device by neuron-monitor's `neuron_k8s_info` (an attribution
/// source where the kubelet's pod-resources socket is not mounted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct K8sOwners {
    /// By host core index, then by device index; sorted, one entry per index.
    pub cores: Vec<(u32, K8sOwner)>,
    pub devices: Vec<(u32, K8sOwner)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct K8sOwner {
    pub namespace: String,
    pub pod: String,
    /// Empty when the report names none.
    pub containers: Vec<String>,
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
    /// The latest report's identity, each field it leaves empty taken from the Node's.
    pub instance: Arc<InstanceLabels>,
    /// The latest report's identity, and the Node object's ([`crate::identity`]).
    report_instance: InstanceLabels,
    node_instance: InstanceLabels,
    pub hardware: Option<HardwareSummary>,
    /// Sorted by runtime tag.
    pub runtimes: Vec<RuntimeState>,
    /// Cores of the host that no runtime holds, by index.
    pub idle_cores: Vec<IdleCore>,
    pub system: SystemState,
    /// The latest `neuron_k8s_info`; `None` until one was read, and while it is in error.
    pub k8s: Option<K8sOwners>,
    /// Changes whenever `k8s` does.
    pub k8s_generation: u64,
    /// `None` while the kubelet has not said what can be allocated (or off Kubernetes).
    pub allocation: Option<AllocationState>,
    pub problems: Vec<GroupProblem>,
    /// What the latest report had beyond the limits.
    pub refusals: Refusals,
    pub reports: u64,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            instance: Arc::new(InstanceLabels::default()),
            report_instance: InstanceLabels::default(),
            node_instance: InstanceLabels::default(),
            hardware: None,
            runtimes: Vec::new(),
            idle_cores: Vec::new(),
            system: SystemState::default(),
            k8s: None,
            k8s_generation: 0,
            allocation: None,
            problems: Vec::new(),
            refusals: Refusals::default(),
            reports: 0,
        }
    }
}

impl NodeState {
    /// Folds one report into the state.
    pub fn apply(&mut self, report: &Report<'_>) {
        self.reports += 1;
        self.problems.clear();
        self.refusals = Refusals::default();
        self.apply_instance(report);
        self.apply_hardware(report);
        self.apply_runtimes(report);
        self.apply_system(report);
        self.apply_k8s(report);
        self.compute_idle_cores();
    }

    fn note<T>(&mut self, group: &'static str, runtime_tag: &str, value: &Group<T>) {
        let (kind, message) = match value {
            Group::Ok(_) => return,
            Group::Error(e) => (ProblemKind::Monitor, e),
            Group::Malformed(e) => (ProblemKind::Malformed, e),
        };
        self.problems.push(GroupProblem {
            group,
            runtime_tag: runtime_tag.to_owned(),
            kind,
            message: truncated(message, MAX_PROBLEM_MESSAGE_BYTES).to_owned(),
        });
    }

    fn apply_instance(&mut self, report: &Report<'_>) {
        let Some(info) = &report.instance_info else {
            return;
        };
        self.note("instance_info", "", info);
        if let Group::Ok(info) = info {
            self.report_instance = InstanceLabels::from_report(info, &mut self.refusals.label_values);
            self.merge_instance();
        }
    }

    /// The identity the Node object gives: the instance labels where no report gives them
    /// (a node with GPUs and no Neuron device has no report).
    pub fn set_node_instance(&mut self, labels: InstanceLabels) {
        self.node_instance = labels;
        self.merge_instance();
    }

    fn merge_instance(&mut self) {
        let labels = self.report_instance.or(&self.node_instance);
        if *self.instance != labels {
            self.instance = Arc::new(labels);
            for rt in &mut self.runtimes {
                Arc::make_mut(&mut rt.labels).instance = self.instance.clone();
            }
        }
    }

    fn apply_hardware(&mut self, report: &Report<'_>) {
        let Some(info) = &report.neuron_hardware_info else {
            return;
        };
        self.note("neuron_hardware_info", "", info);
        if let Group::Ok(info) = info {
            match summarize_hardware(info, &mut self.refusals.label_values) {
                Ok(summary) => self.hardware = Some(summary),
                Err(message) => {
                    // Never an allocation size: no idle cores, no hardware series from it.
                    self.refusals.hardware_counts += 1;
                    self.hardware = None;
                    self.problems.push(GroupProblem {
                        group: "neuron_hardware_info",
                        runtime_tag: String::new(),
                        kind: ProblemKind::OutOfBounds,
                        message,
                    });
                }
            }
        }
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
                if index >= MAX_NEURON_DEVICES {
                    self.refusals.device_indices += 1;
                    continue;
                }
                // Kept sorted by device; at most MAX_NEURON_DEVICES entries.
                let totals = &mut self.system.ecc_totals;
                let slot = match totals.binary_search_by_key(&index, |(i, _)| *i) {
                    Ok(slot) => slot,
                    Err(slot) => {
                        totals.insert(slot, (index, [0.0; 4]));
                        slot
                    }
                };
                add_counts(&mut totals[slot].1, &device.values());
            }
        }
    }

    /// Recomputes the idle cores, with no pod: attribution sets it after each report.
    fn compute_idle_cores(&mut self) {
        self.idle_cores.clear();
        let Some(total) = self.hardware.as_ref().and_then(|h| h.device_count?.checked_mul(h.cores_per_device?)) else {
            return;
        };
        // The hardware summary is bounded already; the `min` keeps this line safe alone.
        let mut held = vec![false; total.min(MAX_NEURONCORES) as usize];
        for core in self.runtimes.iter().flat_map(|rt| &rt.cores) {
            if let Some(slot) = held.get_mut(core.index as usize) {
                *slot = true;
            }
        }
        let idle = held.iter().enumerate().filter(|(_, held)| !**held);
        self.idle_cores = idle.map(|(index, _)| IdleCore { index: index as u32, pod: None }).collect();
    }

    /// Indices of the idle cores.
    pub fn idle_core_indices(&self) -> Vec<u32> {
        self.idle_cores.iter().map(|c| c.index).collect()
    }
}

/// The hardware as reported, or why its counts are refused: beyond any real node, they
/// would size the idle-core list and the exposition.
fn summarize_hardware(info: &HardwareInfo<'_>, refused: &mut u64) -> Result<HardwareSummary, String> {
    let (devices, cores) = (info.neuron_device_count, info.neuroncore_per_device_count);
    let total = u64::from(devices.unwrap_or(0)) * u64::from(cores.unwrap_or(0));
    if devices.unwrap_or(0) > MAX_NEURON_DEVICES
        || cores.unwrap_or(0) > MAX_NEURONCORES_PER_DEVICE
        || total > u64::from(MAX_NEURONCORES)
    {
        return Err(format!(
            "{} devices × {} cores per device is beyond any node (at most {MAX_NEURON_DEVICES} devices, \
             {MAX_NEURONCORES_PER_DEVICE} cores per device, {MAX_NEURONCORES} cores)",
            devices.unwrap_or(0),
            cores.unwrap_or(0)
        ));
    }
    let lnc = match &info.logical_neuroncore_config {
        Some(NumberOrText::Number(n)) => Some(*n),
        Some(NumberOrText::Text(t)) => t.trim().parse().ok(),
        None => None,
    };
    // A whole number of physical cores, at most what one logical core is read with.
    let lnc = lnc.filter(|n| n.fract() == 0.0 && (1.0..=f64::from(MAX_PHYSICAL_PER_LOGICAL)).contains(n));
    let mut text = |v: Option<&str>| v.map(|t| label_value(t, refused));
    // Whole numbers (u64 covers any memory size), written without a fraction.
    let number = |v: Option<f64>| v.filter(|n| n.is_finite() && *n >= 0.0).map(|n| format!("{}", n.round() as u64));
    let fields = [
        ("neuron_device_type", text(info.neuron_device_type.as_deref())),
        ("neuron_device_version", text(info.neuron_device_version.as_deref())),
        ("neuroncore_version", text(info.neuroncore_version.as_deref())),
        ("neuron_device_memory_size", number(info.neuron_device_memory_size)),
        (
            "logical_neuroncore_config",
            match &info.logical_neuroncore_config {
                Some(NumberOrText::Number(n)) => number(Some(*n)),
                Some(NumberOrText::Text(t)) => text(Some(t)),
                None => None,
            },
        ),
    ];
    Ok(HardwareSummary {
        device_count: devices,
        cores_per_device: cores,
        device_type: info.neuron_device_type.as_deref().map(|t| truncated(t, MAX_REPORT_LABEL_VALUE_BYTES).to_owned()),
        logical_neuroncore_config: lnc.map(|n| n as u32),
        labels: fields.into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
    })
}

/// Longest message of a group problem kept (neuron-monitor's own errors are a line).
const MAX_PROBLEM_MESSAGE_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A label value taken from a report: at most [`MAX_REPORT_LABEL_VALUE_BYTES`], control
/// characters replaced by U+FFFD. A value changed is counted in `refused`.
pub fn label_value(text: &str, refused: &mut u64) -> String {
    if text.len() <= MAX_REPORT_LABEL_VALUE_BYTES && !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    *refused += 1;
    let mut out = String::with_capacity(text.len().min(MAX_REPORT_LABEL_VALUE_BYTES));
    for c in text.chars() {
        let c = if c.is_control() { char::REPLACEMENT_CHARACTER } else { c };
        if out.len() + c.len_utf8() > MAX_REPORT_LABEL_VALUE_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// Adds this period's counts to the running sums.
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

mod k8s;
mod runtimes;
#[cfg(test)]
mod tests;
