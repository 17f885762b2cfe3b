//! Which pod each Neuron application and each NeuronCore belongs to.
//!
//! Two sources, kept current off the report path:
//! - the process: `/proc/<pid>/cgroup` ([`cgroup`]) gives pod UID and container ID, the
//!   pod watch ([`pods`]) gives their names; read once per PID and cached;
//! - the devices: the kubelet's pod-resources API ([`podresources`]) says which
//!   container holds which cores, through the device plugin or through DRA claims
//!   ([`dra`], resolved by this node's ResourceSlices); while the kubelet has not answered (its socket not
//!   mounted, some managed set-ups), neuron-monitor's own `neuron_k8s_info` group says
//!   it, with the same rules and counters;
//! - without Kubernetes, on ECS: a process in a Docker container takes the ECS task and
//!   container the ECS agent lists for it ([`ecs`]).
//!
//! On the report path, [`Attribution::attribute`] only looks up caches: a runtime takes
//! the pod of its process; a runtime whose process cannot be placed takes the pod holding
//! all its cores; when both are known and differ, the process wins and the disagreement
//! is counted. Cores no runtime uses take the pod that holds them. Pods that finished
//! or were deleted are in neither index, so they are credited with nothing.
//!
//! [`sources`] sets it up on a node: the caches, and the tasks that feed them.

pub mod allocation;
pub mod bad_items;
pub mod cgroup;
pub mod dra;
pub mod ecs;
pub mod gpus;
pub mod podresources;
pub mod pods;
pub mod sources;

pub use sources::{Settings, Sources};

use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tracing::{debug, warn};

use self::{
    allocation::{IdleClock, IdlePolicy},
    bad_items::BadItemLog,
    cgroup::Placement,
    ecs::SharedEcs,
    podresources::{DeviceOwnership, SharedDevices},
    pods::{PodIndex, SharedPods},
};
use crate::{
    state::{AllocationState, EcsContainer, NodeState, PodRef},
    telemetry::{ReasonLabel, ResultLabel, SourceLabel},
};

/// Why a runtime has no pod; the values of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unattributed {
    /// The report gives no PID.
    NoPid,
    /// `/proc/<pid>/cgroup` is not readable (no host PID namespace, or the process left).
    ProcUnreadable,
    /// A cgroup layout the parser does not know.
    UnknownLayout,
    /// A host process, or a container outside Kubernetes.
    NotInPod,
    /// In a pod the pod watch does not know (not listed yet, or not on this node).
    PodUnknown,
}

impl Unattributed {
    pub const ALL: [Unattributed; 5] = [
        Unattributed::NoPid,
        Unattributed::ProcUnreadable,
        Unattributed::UnknownLayout,
        Unattributed::NotInPod,
        Unattributed::PodUnknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unattributed::NoPid => "no_pid",
            Unattributed::ProcUnreadable => "proc_unreadable",
            Unattributed::UnknownLayout => "unknown_layout",
            Unattributed::NotInPod => "not_in_pod",
            Unattributed::PodUnknown => "pod_unknown",
        }
    }
}

/// Who says which pod holds which Neuron device and core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSource {
    /// The kubelet's pod-resources API, polled: in force whenever it has answered (within
    /// `--pod-resources-keep` of its last answer).
    Kubelet,
    /// neuron-monitor's `neuron_k8s_info` group, where the kubelet has not answered.
    NeuronMonitor,
}

impl DeviceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceSource::Kubelet => "kubelet",
            DeviceSource::NeuronMonitor => "neuron_monitor",
        }
    }
}

/// The DRA driver of a series (`neuron_agent_dra_devices`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DriverLabel {
    pub driver: &'static str,
}

/// The list of the kubelet's answers entries were cut from (`neuron_agent_kubelet_entries_cut_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ListLabel {
    pub list: &'static str,
}

/// The attribution's own metrics; cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct AttributionMetrics {
    pub unknown_layouts: Counter,
    pub disagreements: Counter,
    pub attributed: Family<SourceLabel, Gauge>,
    pub unattributed: Family<ReasonLabel, Gauge>,
    pub device_source: Family<SourceLabel, Gauge>,
    pub kubelet_up: Gauge,
    pub kubelet_last_success: Gauge<f64, AtomicU64>,
    pub kubelet_requests: Family<ResultLabel, Counter>,
    pub kubelet_entries_cut: Family<ListLabel, Counter>,
    pub kubelet_ids_unreadable: Gauge,
    pub pods: Gauge,
    pub pod_watch_errors: Counter,
    pub ecs_requests: Family<ResultLabel, Counter>,
    pub ecs_containers: Gauge,
    pub ecs_label_values_changed: Gauge,
    pub gpu_ids_unresolved: Family<ReasonLabel, Counter>,
    pub dra_unresolved: Family<ReasonLabel, Counter>,
    pub dra_devices: Family<DriverLabel, Gauge>,
    pub slice_watch_errors: Counter,
    pub slices_left_out: Counter,
}

impl AttributionMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = AttributionMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent");
        r.register(
            "cgroup_unknown_layouts",
            "Processes whose /proc/<pid>/cgroup has a layout the agent does not know (left without pod labels)",
            m.unknown_layouts.clone(),
        );
        r.register(
            "attribution_disagreements",
            "Runtimes whose process is in another pod than the one the kubelet says holds its cores (the process wins)",
            m.disagreements.clone(),
        );
        r.register(
            "runtimes_attributed",
            "Runtimes of the latest report with a pod or an ECS task, by source (process, devices, ecs)",
            m.attributed.clone(),
        );
        r.register(
            "runtimes_unattributed",
            "Runtimes of the latest report without a pod, by reason \
             (no_pid, proc_unreadable, unknown_layout, not_in_pod, pod_unknown)",
            m.unattributed.clone(),
        );
        r.register(
            "device_source",
            "1 for who says which pod holds which device: kubelet (pod-resources API) or neuron_monitor \
             (its neuron_k8s_info, while the kubelet has not answered); 0 for both while neither has",
            m.device_source.clone(),
        );
        r.register(
            "kubelet_up",
            "1 when the last call to the kubelet's pod-resources API succeeded",
            m.kubelet_up.clone(),
        );
        r.register(
            "kubelet_last_success_timestamp_seconds",
            "Unix time of the last successful call to the kubelet's pod-resources API",
            m.kubelet_last_success.clone(),
        );
        r.register(
            "kubelet_requests",
            "Calls to the kubelet's pod-resources API, by result (ok, error, timeout)",
            m.kubelet_requests.clone(),
        );
        for list in podresources::answer::List::ALL {
            drop(m.kubelet_entries_cut.get_or_create(&ListLabel { list: list.as_str() }));
        }
        r.register(
            "kubelet_entries_cut",
            "Entries of the kubelet's pod-resources answers left out past their bounds, by list: device_ids (a device \
             plugin's, past 1,024 of one kind: Neuron, EFA, NVIDIA), claimed_devices (the DRA claims' of one driver, \
             past 1,024), strings (cut to 256 bytes, kept)",
            m.kubelet_entries_cut.clone(),
        );
        r.register(
            "kubelet_device_ids_unreadable",
            "Neuron and EFA device ids of the kubelet's latest answer that are no Neuron index or EFA device name \
             (ignored)",
            m.kubelet_ids_unreadable.clone(),
        );
        r.register("pods", "Running pods of this node known to the pod watch", m.pods.clone());
        r.register("pod_watch_errors", "Errors of the watch of this node's pods", m.pod_watch_errors.clone());
        r.register(
            "ecs_agent_requests",
            "Calls to the ECS agent's introspection API, by result (ok, error, timeout)",
            m.ecs_requests.clone(),
        );
        r.register("ecs_containers", "Containers of running ECS tasks the ECS agent lists", m.ecs_containers.clone());
        r.register(
            "ecs_label_values_changed",
            "Label values (task ARN, family, container name) of the latest ECS task listing cut to 256 bytes or with \
             control characters replaced, as a report's label values are",
            m.ecs_label_values_changed.clone(),
        );
        r.register(
            "gpu_device_ids_unresolved",
            "NVIDIA device ids of the kubelet's allocations that name no GPU of this node, each counted once while \
             the kubelet lists it, by reason (malformed, unknown_gpu, too_many)",
            m.gpu_ids_unresolved.clone(),
        );
        r.register(
            "dra_devices_unresolved",
            "Neuron devices and GPUs of the kubelet's DRA claims that name no device of this node's \
             ResourceSlices (or no GPU of this node), each counted once while the kubelet lists it, by reason \
             (malformed, unknown_device, no_device_id, unknown_gpu, too_many); their series keep the device, \
             without the pod",
            m.dra_unresolved.clone(),
        );
        r.register(
            "dra_devices",
            "Devices this node's ResourceSlices publish, by driver (neuron.aws.com, gpu.nvidia.com; watched once \
             the kubelet lists a DRA claim, or where the device plugin leaves Neuron devices out)",
            m.dra_devices.clone(),
        );
        r.register(
            "resourceslice_watch_errors",
            "Errors of the watch of this node's ResourceSlices",
            m.slice_watch_errors.clone(),
        );
        r.register(
            "resourceslices_left_out",
            "ResourceSlices of the read drivers left out past the bounds of one pool (8) or one driver (32), or \
             pushed out by a slice of a pool or device the kubelet's claims name",
            m.slices_left_out.clone(),
        );
        m
    }
}

/// A process whose cgroup file could not be read is tried again after this long.
const UNREADABLE_RETRY: Duration = Duration::from_secs(10);
/// Core indices at or above this from the kubelet are ignored (no host has that many).
const MAX_CORES: u32 = 4096;
/// A cgroup file is a few lines; more than this is not one.
const MAX_CGROUP_FILE: u64 = 64 * 1024;

/// Attribution for the report path: cheap lookups in caches fed by the pod watch and the
/// kubelet poller.
pub struct Attribution {
    proc_root: PathBuf,
    pods: SharedPods,
    devices: SharedDevices,
    ecs: SharedEcs,
    metrics: AttributionMetrics,
    idle_policy: IdlePolicy,
    cache: Mutex<Cache>,
    /// Cgroup files of an unknown layout: a few of their lines, rate-limited.
    unknown_layouts: BadItemLog,
}

#[derive(Default)]
struct Cache {
    pids: HashMap<u32, PidEntry>,
    owners: CoreOwners,
    allocation: AllocatedCores,
    idle: IdleClock,
    /// Reports attributed so far; a PID not seen in the latest one is dropped.
    round: u64,
    /// The node state's `k8s_generation` last copied into the devices.
    k8s_generation: Option<u64>,
    /// The node's devices and cores per device last copied into the devices.
    node_devices: Option<(u32, u32)>,
}

struct PidEntry {
    /// `None`: the cgroup file was not readable.
    placement: Option<Placement>,
    read_at: Instant,
    /// The process's pod, and its ECS task container when it has no pod, resolved against
    /// the pod and ECS indexes of generations `resolved_at`.
    resolved: Result<Arc<PodRef>, Unattributed>,
    ecs: Option<Arc<EcsContainer>>,
    resolved_at: Option<(u64, u64)>,
    disagreement_counted: bool,
    round: u64,
}

/// Who holds each core by the kubelet's account, for one (pods, devices, cores per
/// device) state.
#[derive(Default)]
struct CoreOwners {
    key: Option<(u64, u64, Option<u32>)>,
    by_core: Vec<Option<Arc<PodRef>>>,
    /// Each core's holder as the series of the core name it: its owner, with the claim
    /// through which it holds the core where that is a DRA claim.
    held: Vec<Option<Arc<PodRef>>>,
}

/// The cores the node can allocate and has allocated, rebuilt when the devices or the
/// cores per device change.
#[derive(Default)]
struct AllocatedCores {
    key: Option<(u64, Option<u32>)>,
    /// `None`: unknown (see [`DeviceOwnership::allocatable_cores`]).
    allocatable: Option<Vec<u32>>,
    allocated: Vec<u32>,
}

impl AllocatedCores {
    fn refresh(&mut self, devices: &DeviceOwnership, cores_per_device: Option<u32>) {
        let key = Some((devices.generation(), cores_per_device));
        if self.key == key {
            return;
        }
        self.key = key;
        self.allocatable = devices.allocatable_cores(cores_per_device);
        let cores = devices.allocations().iter().flat_map(|a| a.cores(cores_per_device));
        self.allocated = cores.filter(|c| *c < MAX_CORES).collect();
        self.allocated.sort_unstable();
        self.allocated.dedup();
    }

    /// This report's counts, the pods' by `owners`; `None` while what can be allocated
    /// is unknown.
    fn summary(
        &self,
        idle: &mut IdleClock,
        state: &NodeState,
        owners: &CoreOwners,
        policy: IdlePolicy,
        now: Instant,
    ) -> Option<AllocationState> {
        let (allocatable, cores_per_device) = (self.allocatable.as_deref()?, self.key?.1?);
        let used = state.runtimes.iter().flat_map(|rt| &rt.cores);
        let idle = idle.tick(used, &self.allocated, policy, now);
        let mut summary = allocation::summarize(allocatable, &self.allocated, &idle, cores_per_device);
        summary.pods = allocation::per_pod(self.allocated.iter().map(|c| owners.get(*c)).zip(idle));
        Some(summary)
    }
}

impl CoreOwners {
    fn get(&self, core: u32) -> Option<&Arc<PodRef>> {
        self.by_core.get(core as usize).and_then(Option::as_ref)
    }

    fn holder(&self, core: u32) -> Option<&Arc<PodRef>> {
        self.held.get(core as usize).and_then(Option::as_ref)
    }

    /// Rebuilds the owners when the pods, the device allocations or the cores per device
    /// changed since the last build.
    fn refresh(&mut self, pods: &PodIndex, devices: &DeviceOwnership, cores_per_device: Option<u32>) {
        let key = Some((pods.generation(), devices.generation(), cores_per_device));
        if self.key == key {
            return;
        }
        let mut by_core: Vec<Option<Arc<PodRef>>> = Vec::new();
        let mut held: Vec<Option<Arc<PodRef>>> = Vec::new();
        // One holder per (container, claim), shared by the claim's cores.
        let mut claim_holders: HashMap<(*const PodRef, Arc<dra::Claim>), Arc<PodRef>> = HashMap::new();
        for allocation in devices.allocations() {
            let Some(owner) = pods.container(&allocation.namespace, &allocation.pod, &allocation.container) else {
                continue; // finished, deleted, or not listed yet: not credited
            };
            let holder = match &allocation.claim {
                None => owner.clone(),
                Some(claim) => claim_holders
                    .entry((Arc::as_ptr(owner), claim.clone()))
                    .or_insert_with(|| Arc::new(dra::claim_holder(owner, claim)))
                    .clone(),
            };
            for core in allocation.cores(cores_per_device).take_while(|c| *c < MAX_CORES) {
                let core = core as usize;
                if by_core.len() <= core {
                    by_core.resize(core + 1, None);
                    held.resize(core + 1, None);
                }
                if by_core[core].is_none() {
                    by_core[core] = Some(owner.clone());
                    held[core] = Some(holder.clone());
                }
            }
        }
        *self = CoreOwners { key, by_core, held };
    }
}

/// (EFA device name, the container holding it), sorted by device.
pub type EfaHeld = Arc<[(String, Arc<PodRef>)]>;

/// Which pod holds each EFA device, by the kubelet's account (the EFA series' pods, and
/// the claim where DRA allocated it); cloning shares it.
#[derive(Clone)]
pub struct EfaHolders {
    pods: SharedPods,
    devices: SharedDevices,
    cache: Arc<Mutex<HeldCache>>,
}

/// The holders for one (pods, devices) generation.
struct HeldCache {
    key: Option<(u64, u64)>,
    held: EfaHeld,
}

impl EfaHolders {
    pub fn new(pods: SharedPods, devices: SharedDevices) -> Self {
        EfaHolders { pods, devices, cache: Arc::new(Mutex::new(HeldCache { key: None, held: Arc::from([]) })) }
    }

    /// The holders now. A device held by a pod that finished, was deleted or is not
    /// listed yet has none; a device the kubelet lists twice (never, the devices are
    /// exclusive) goes to the first listed.
    pub fn current(&self) -> EfaHeld {
        let pods = self.pods.read().unwrap_or_else(|p| p.into_inner());
        let devices = self.devices.read().unwrap_or_else(|p| p.into_inner());
        let key = Some((pods.generation(), devices.generation()));
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.key != key {
            let mut holders: Vec<(String, Arc<PodRef>)> = Vec::new();
            for a in devices.efa() {
                if holders.last().is_some_and(|(device, _)| *device == a.device) {
                    continue;
                }
                if let Some(owner) = pods.container(&a.namespace, &a.pod, &a.container) {
                    let holder = match &a.claim {
                        None => owner.clone(),
                        Some(claim) => Arc::new(dra::claim_holder(owner, claim)),
                    };
                    holders.push((a.device.clone(), holder));
                }
            }
            *cache = HeldCache { key, held: holders.into() };
        }
        cache.held.clone()
    }
}

impl Attribution {
    pub fn new(
        proc_root: PathBuf,
        pods: SharedPods,
        devices: SharedDevices,
        ecs: SharedEcs,
        metrics: AttributionMetrics,
    ) -> Self {
        Attribution {
            proc_root,
            pods,
            devices,
            ecs,
            metrics,
            idle_policy: IdlePolicy::default(),
            cache: Mutex::default(),
            unknown_layouts: BadItemLog::default(),
        }
    }

    /// When allocated cores count as idle (default: [`IdlePolicy::default`]).
    pub fn with_idle_policy(mut self, policy: IdlePolicy) -> Self {
        self.idle_policy = policy;
        self
    }

    /// Sets the pod of every runtime and idle core of `state` (after [`NodeState::apply`]).
    pub fn attribute(&self, state: &mut NodeState) {
        let pods = self.pods.read().unwrap_or_else(|p| p.into_inner());
        let ecs = self.ecs.read().unwrap_or_else(|p| p.into_inner());
        let generations = (pods.generation(), ecs.generation());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let cache = &mut *cache;
        cache.round += 1;
        let round = cache.round;

        if cache.k8s_generation != Some(state.k8s_generation) {
            cache.k8s_generation = Some(state.k8s_generation);
            let allocations = state.k8s.as_ref().map(podresources::monitor_allocations);
            self.devices.write().unwrap_or_else(|p| p.into_inner()).set_from_monitor(allocations);
        }
        let cores_per_device = state.hardware.as_ref().and_then(|h| h.cores_per_device);
        let node_devices = state.hardware.as_ref().and_then(|h| Some((h.device_count?, cores_per_device?)));
        if cache.node_devices != node_devices {
            cache.node_devices = node_devices;
            self.devices.write().unwrap_or_else(|p| p.into_inner()).set_node_devices(node_devices);
        }
        let devices = self.devices.read().unwrap_or_else(|p| p.into_inner());
        let source = devices.source();
        for s in [DeviceSource::Kubelet, DeviceSource::NeuronMonitor] {
            self.metrics
                .device_source
                .get_or_create(&SourceLabel { source: s.as_str() })
                .set(i64::from(source == Some(s)));
        }
        cache.owners.refresh(&pods, &devices, cores_per_device);
        cache.allocation.refresh(&devices, cores_per_device);
        drop(devices);
        state.allocation =
            cache.allocation.summary(&mut cache.idle, state, &cache.owners, self.idle_policy, Instant::now());

        let mut tally = Tally::default();
        for rt in &mut state.runtimes {
            let process = match rt.pid {
                None => Err(Unattributed::NoPid),
                Some(pid) => Ok(self.process_entry(&mut cache.pids, pid, round, generations, &pods, &ecs)),
            };
            let device_pod = holder_of_all(rt.cores.iter().map(|c| cache.owners.get(c.index)));
            let (resolved, counted, ecs_container) = match process {
                Err(reason) => (Err(reason), None, None),
                Ok(entry) => {
                    (entry.resolved.as_ref().map_err(|r| *r), Some(&mut entry.disagreement_counted), entry.ecs.clone())
                }
            };
            if let (Ok(p), Some(counted)) = (resolved, counted) {
                let other = rt.cores.iter().filter_map(|c| cache.owners.get(c.index)).find(|o| disagree(p, o));
                if let Some(o) = other.filter(|_| !*counted) {
                    *counted = true;
                    self.metrics.disagreements.inc();
                    warn!(runtime = %rt.labels.runtime_tag, pid = ?rt.pid,
                          process_pod = %format!("{}/{}/{}", p.namespace, p.pod, p.container),
                          device_pod = %format!("{}/{}/{}", o.namespace, o.pod, o.container),
                          "the process and the kubelet disagree on the pod of a runtime; using the process's");
                }
            }
            let choice = choose(resolved, device_pod, ecs_container);
            tally.count(&choice);
            let (chosen, chosen_ecs) = choice.labels();
            if rt.labels.pod != chosen || rt.labels.ecs != chosen_ecs {
                let labels = Arc::make_mut(&mut rt.labels);
                labels.pod = chosen;
                labels.ecs = chosen_ecs;
            }
        }
        for idle in &mut state.idle_cores {
            let owner = cache.owners.holder(idle.index);
            if idle.pod.as_ref() != owner {
                idle.pod = owner.cloned();
            }
        }
        cache.pids.retain(|_, e| e.round == round);
        tally.publish(&self.metrics);
    }

    /// The cached entry of `pid`, read again where it was unreadable a while ago and
    /// resolved again where the pods or the ECS tasks changed (`generations`).
    fn process_entry<'c>(
        &self,
        pids: &'c mut HashMap<u32, PidEntry>,
        pid: u32,
        round: u64,
        generations: (u64, u64),
        pods: &pods::PodIndex,
        ecs: &ecs::EcsIndex,
    ) -> &'c mut PidEntry {
        let entry = pids.entry(pid).or_insert_with(|| self.read_process(pid));
        if entry.placement.is_none() && entry.read_at.elapsed() >= UNREADABLE_RETRY {
            *entry = self.read_process(pid);
        }
        entry.round = round;
        if entry.resolved_at != Some(generations) {
            entry.resolved = resolve(entry.placement.as_ref(), pods);
            entry.ecs = match &entry.placement {
                Some(Placement::Container { container_id }) => ecs.container(container_id).cloned(),
                _ => None,
            };
            entry.resolved_at = Some(generations);
        }
        entry
    }

    fn read_process(&self, pid: u32) -> PidEntry {
        PidEntry {
            placement: read_placement(&self.proc_root, pid, &self.metrics, &self.unknown_layouts),
            read_at: Instant::now(),
            resolved: Err(Unattributed::ProcUnreadable),
            ecs: None,
            resolved_at: None,
            disagreement_counted: false,
            round: 0,
        }
    }
}

/// Where `pid` runs, from `<proc root>/<pid>/cgroup` (a few hundred bytes of procfs);
/// `None` when it cannot be read. A file of a layout not known is counted and a few of its
/// lines logged (`log`): anyone may place a process in a cgroup of any name, so the lines
/// are outside input.
fn read_placement(proc_root: &Path, pid: u32, metrics: &AttributionMetrics, log: &BadItemLog) -> Option<Placement> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let mut text = String::new();
    let read = std::fs::File::open(&path).and_then(|f| f.take(MAX_CGROUP_FILE).read_to_string(&mut text));
    match read {
        Ok(_) => {
            let placement = cgroup::parse(&text);
            if placement == Placement::Unknown {
                metrics.unknown_layouts.inc();
                let message = format!("unknown cgroup layout of pid {pid}, no pod labels; lines of its cgroup file");
                log.warn(&message, text.lines().count(), text.lines());
            }
            Some(placement)
        }
        Err(e) => {
            debug!(pid, path = %path.display(), error = %e, "cgroup file not readable");
            None
        }
    }
}

fn resolve(placement: Option<&Placement>, pods: &pods::PodIndex) -> Result<Arc<PodRef>, Unattributed> {
    match placement {
        None => Err(Unattributed::ProcUnreadable),
        Some(Placement::Unknown) => Err(Unattributed::UnknownLayout),
        Some(Placement::Host | Placement::Container { .. }) => Err(Unattributed::NotInPod),
        Some(Placement::Pod { pod_uid, container_id }) => {
            pods.for_process(pod_uid, container_id.as_deref()).cloned().ok_or(Unattributed::PodUnknown)
        }
    }
}

fn same_pod(a: &PodRef, b: &PodRef) -> bool {
    a.namespace == b.namespace && a.pod == b.pod
}

/// The process's pod and a core's owner are different workloads.
fn disagree(process: &PodRef, owner: &PodRef) -> bool {
    !same_pod(process, owner) || (!process.container.is_empty() && process.container != owner.container)
}

/// The pod that holds every one of a runtime's cores (`owners`: each core's), if one does.
fn holder_of_all<'a>(mut owners: impl Iterator<Item = Option<&'a Arc<PodRef>>>) -> Option<&'a Arc<PodRef>> {
    let first = owners.next().flatten();
    first.filter(|f| owners.all(|o| o.is_some_and(|o| Arc::ptr_eq(o, f))))
}

/// What a runtime is attributed to.
#[derive(Debug, PartialEq)]
enum Choice {
    /// Its process's pod.
    Process(Arc<PodRef>),
    /// The pod the kubelet says holds all its cores.
    Devices(Arc<PodRef>),
    /// The ECS task container of its process.
    Ecs(Arc<EcsContainer>),
    /// Nothing, for this reason.
    Unattributed(Unattributed),
}

impl Choice {
    /// The runtime's `pod` and `ecs` labels.
    fn labels(self) -> (Option<Arc<PodRef>>, Option<Arc<EcsContainer>>) {
        match self {
            Choice::Process(pod) | Choice::Devices(pod) => (Some(pod), None),
            Choice::Ecs(container) => (None, Some(container)),
            Choice::Unattributed(_) => (None, None),
        }
    }
}

/// Which pod holds a runtime: its process's (which wins a disagreement with the kubelet;
/// where its container is not listed yet, the kubelet's entry for the same pod names it),
/// else the pod holding all its cores, else its process's ECS container.
fn choose(
    process: Result<&Arc<PodRef>, Unattributed>,
    device_pod: Option<&Arc<PodRef>>,
    ecs: Option<Arc<EcsContainer>>,
) -> Choice {
    match (process, device_pod, ecs) {
        (Ok(p), Some(d), _) if p.container.is_empty() && same_pod(p, d) => Choice::Process(d.clone()),
        (Ok(p), _, _) => Choice::Process(p.clone()),
        (Err(_), Some(d), _) => Choice::Devices(d.clone()),
        (Err(_), None, Some(container)) => Choice::Ecs(container),
        (Err(reason), None, None) => Choice::Unattributed(reason),
    }
}

/// The runtimes of a report by what they were attributed to.
#[derive(Default)]
struct Tally {
    process: i64,
    devices: i64,
    ecs: i64,
    unattributed: [i64; Unattributed::ALL.len()],
}

impl Tally {
    fn count(&mut self, choice: &Choice) {
        match choice {
            Choice::Process(_) => self.process += 1,
            Choice::Devices(_) => self.devices += 1,
            Choice::Ecs(_) => self.ecs += 1,
            Choice::Unattributed(reason) => self.unattributed[*reason as usize] += 1,
        }
    }

    fn publish(&self, metrics: &AttributionMetrics) {
        metrics.attributed.get_or_create(&SourceLabel { source: "process" }).set(self.process);
        metrics.attributed.get_or_create(&SourceLabel { source: "devices" }).set(self.devices);
        metrics.attributed.get_or_create(&SourceLabel { source: "ecs" }).set(self.ecs);
        for (reason, count) in Unattributed::ALL.iter().zip(self.unattributed) {
            metrics.unattributed.get_or_create(&ReasonLabel { reason: reason.as_str() }).set(count);
        }
    }
}

#[cfg(test)]
mod tests;
