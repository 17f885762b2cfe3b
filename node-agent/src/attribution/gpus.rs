//! Which pod holds each NVIDIA GPU, and which pod each GPU process runs in.
//!
//! The holders come from the same pod-resources answers as the Neuron devices (no call of
//! their own): after each answer, the ids of the NVIDIA device plugin's resources
//! (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`) are resolved
//! to GPUs of the latest GPU collection, and their containers to the pod watch's. The
//! device plugin writes an id in one of these forms (its `--device-id-strategy` and MIG
//! strategy):
//! - `GPU-<uuid>`: a whole GPU (the default strategy);
//! - `<index>`: a whole GPU by its NVML index (the `index` strategy);
//! - `MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`: a MIG instance, credited to
//!   the GPU it is a slice of;
//! - `<gpu index>:<mig index>`: a MIG instance under the `index` strategy, likewise;
//! - any of these followed by `::<n>`: replica `n` of a GPU shared by time-slicing or
//!   MPS: one GPU, several pods, each a holder with its replica.
//!
//! GPUs claimed through DRA (NVIDIA's driver, `gpu.nvidia.com`) come from the same answers:
//! each claimed device is resolved through this node's ResourceSlices ([`super::dra`]) to
//! the GPU it stands for, and held by its container with the claim's labels.
//!
//! The processes: each compute process NVML lists takes the pod of its
//! `/proc/<pid>/cgroup`, as Neuron applications do, read once per PID.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
    time::Instant,
};

use api::hardware::{NVIDIA_GPU_RESOURCE, NVIDIA_GPU_SHARED_RESOURCE, NVIDIA_MIG_RESOURCE_PREFIX};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{
    bad_items::BadItemLog,
    cgroup::Placement,
    dra::{
        self,
        nvidia::{GpuDevice, Nvidia},
        ClaimedDevice, DeviceTable, Driver, Unresolvable, UnresolvedLog,
    },
    podresources::proto::ListPodResourcesResponse,
    pods::{PodIndex, SharedPods},
    read_placement, resolve, AttributionMetrics, UNREADABLE_RETRY,
};
use crate::{
    gpu::{
        GpuHolder, GpuHolders, GpuIdentity, GpuProcessPods, GpuSnapshot, SharedGpuHolders, SharedGpuProcessPods,
        MAX_GPUS,
    },
    telemetry::ReasonLabel,
};

/// Bytes of a device id of a form the device plugin writes (its longest, the older MIG
/// form, has 50); longer ones are malformed. (How many ids an answer gives, and how long
/// a string of it is, the answer's reading bounds: [`super::podresources::answer`].)
pub const MAX_DEVICE_ID_BYTES: usize = 96;
/// Pods credited with one GPU (time-slicing replicas); more are counted `too_many`.
pub const MAX_HOLDERS_PER_GPU: usize = 64;

/// The GPU a device id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuRef<'a> {
    /// `GPU-…`, as NVML writes it.
    Uuid(&'a str),
    /// A MIG instance's `MIG-…`: its parent is found among the collection's MIG instances.
    Mig(&'a str),
    /// NVML's index of the GPU.
    Index(u32),
}

/// One device id of an NVIDIA resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceId<'a> {
    pub gpu: GpuRef<'a>,
    /// `::<n>`: the replica of a shared GPU.
    pub replica: Option<u32>,
}

/// Reads one device id; `None`: no form the device plugin writes.
pub fn parse_device_id(id: &str) -> Option<DeviceId<'_>> {
    if id.is_empty() || id.len() > MAX_DEVICE_ID_BYTES {
        return None;
    }
    let (base, replica) = match id.split_once("::") {
        Some((base, n)) => (base, Some(number(n)?)),
        None => (id, None),
    };
    Some(DeviceId { gpu: gpu_ref(base)?, replica })
}

fn gpu_ref(base: &str) -> Option<GpuRef<'_>> {
    if let Some(rest) = strip_prefix_ignore_case(base, "MIG-") {
        // The older form names its parent GPU: `MIG-GPU-<uuid>/<gi>/<ci>`.
        if let Some((parent, instance)) = rest.split_once('/') {
            let (gi, ci) = instance.split_once('/')?;
            number(gi)?;
            number(ci)?;
            return strip_prefix_ignore_case(parent, "GPU-").filter(|u| uuid_body(u)).map(|_| GpuRef::Uuid(parent));
        }
        return uuid_body(rest).then_some(GpuRef::Mig(base));
    }
    if let Some(rest) = strip_prefix_ignore_case(base, "GPU-") {
        return uuid_body(rest).then_some(GpuRef::Uuid(base));
    }
    // `<gpu>`, or a MIG instance `<gpu>:<mig>`.
    let (gpu, mig) = match base.split_once(':') {
        Some((gpu, mig)) => (gpu, Some(mig)),
        None => (base, None),
    };
    if let Some(mig) = mig {
        number(mig)?;
    }
    number(gpu).filter(|i| *i < MAX_GPUS).map(GpuRef::Index)
}

/// Decimal digits only (`str::parse` would take a sign).
fn number(text: &str) -> Option<u32> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok()).flatten()
}

/// What follows `GPU-` or `MIG-`: hex digits and dashes.
fn uuid_body(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &text[prefix.len()..])
}

/// Whether the kubelet's resource is one of the NVIDIA device plugin's GPUs.
pub fn is_gpu_resource(name: &str) -> bool {
    let mig_profile = |p: &str| {
        !p.is_empty()
            && p.len() <= 32
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'))
    };
    name == NVIDIA_GPU_RESOURCE
        || name == NVIDIA_GPU_SHARED_RESOURCE
        || name.strip_prefix(NVIDIA_MIG_RESOURCE_PREFIX).is_some_and(mig_profile)
}

/// One NVIDIA device id held by one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuAllocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    /// As the kubelet gave it.
    pub id: String,
}

impl GpuAllocation {
    /// How the log names it.
    fn describe(&self) -> String {
        format!("{}/{}/{} {}={}", self.namespace, self.pod, self.container, self.resource, self.id)
    }
}

/// The NVIDIA allocations of a `List` answer (as many as the answer's reading kept).
pub fn gpu_allocations(response: &ListPodResourcesResponse) -> Vec<GpuAllocation> {
    let mut out = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in container.devices.iter().filter(|d| is_gpu_resource(&d.resource_name)) {
                for id in &devices.device_ids {
                    out.push(GpuAllocation {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        resource: devices.resource_name.clone(),
                        id: id.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Why an NVIDIA id is credited to no GPU; the values of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// No form the device plugin writes.
    Malformed,
    /// Names no GPU (or MIG instance) of the latest collection.
    UnknownGpu,
    /// Beyond [`MAX_HOLDERS_PER_GPU`] pods of one GPU.
    TooMany,
}

impl Unresolved {
    pub fn as_str(self) -> &'static str {
        match self {
            Unresolved::Malformed => "malformed",
            Unresolved::UnknownGpu => "unknown_gpu",
            Unresolved::TooMany => "too_many",
        }
    }
}

/// What a device id resolves to.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// The GPU's UUID, upper case (the key of [`GpuHolders`]).
    Gpu(String),
    /// Not known before the first collection (an index or a MIG instance).
    Pending,
    Unresolved(Unresolved),
}

/// The GPU `gpu` names in `snapshot`. Before a first collection, a GPU UUID is taken as
/// it is (the device plugin read it from NVML), the other forms wait.
fn target(gpu: GpuRef<'_>, snapshot: &GpuSnapshot) -> Target {
    if snapshot.collections == 0 {
        return match gpu {
            GpuRef::Uuid(uuid) => Target::Gpu(uuid.to_ascii_uppercase()),
            GpuRef::Mig(_) | GpuRef::Index(_) => Target::Pending,
        };
    }
    let found = match gpu {
        GpuRef::Uuid(uuid) => snapshot.by_uuid(uuid),
        GpuRef::Index(index) => snapshot.gpus.iter().find(|g| g.identity.index == index),
        GpuRef::Mig(mig) => snapshot.gpus.iter().find(|g| g.mig.iter().any(|m| m.uuid.eq_ignore_ascii_case(mig))),
    };
    found.map_or(Target::Unresolved(Unresolved::UnknownGpu), |g| Target::Gpu(g.identity.uuid.to_ascii_uppercase()))
}

/// The holders of each GPU by `allocations`, and the allocations credited to none. A
/// container the pod watch does not list (yet) holds nothing, as for Neuron devices.
pub fn resolve_holders<'a>(
    allocations: &'a [GpuAllocation],
    snapshot: &GpuSnapshot,
    pods: &PodIndex,
) -> (GpuHolders, Vec<(&'a GpuAllocation, Unresolved)>) {
    let mut holders = GpuHolders::new();
    let mut unresolved = Vec::new();
    for a in allocations {
        let Some(id) = parse_device_id(&a.id) else {
            unresolved.push((a, Unresolved::Malformed));
            continue;
        };
        let uuid = match target(id.gpu, snapshot) {
            Target::Gpu(uuid) => uuid,
            Target::Pending => continue,
            Target::Unresolved(reason) => {
                unresolved.push((a, reason));
                continue;
            }
        };
        let Some(pod) = pods.container(&a.namespace, &a.pod, &a.container) else {
            continue;
        };
        let holder = GpuHolder { pod: pod.clone(), replica: id.replica };
        if !hold(&mut holders, uuid, holder) {
            unresolved.push((a, Unresolved::TooMany));
        }
    }
    sort(&mut holders);
    (holders, unresolved)
}

/// Adds `holder` to the GPU `uuid`; `false` where the GPU has as many holders as it may.
/// A holder already there is kept once (a container holding two MIG instances of one GPU
/// holds it once).
fn hold(holders: &mut GpuHolders, uuid: String, holder: GpuHolder) -> bool {
    let held = holders.entry(uuid).or_default();
    if held.contains(&holder) {
        return true;
    }
    if held.len() == MAX_HOLDERS_PER_GPU {
        return false;
    }
    held.push(holder);
    true
}

/// In the same order whatever the kubelet's.
fn sort(holders: &mut GpuHolders) {
    for held in holders.values_mut() {
        held.sort_by(|a, b| order(a).cmp(&order(b)));
    }
}

/// Replica, namespace, pod, container, then labels (a container's claims).
type Order<'a> = (Option<u32>, &'a str, &'a str, &'a str, &'a [(String, String)]);

fn order(h: &GpuHolder) -> Order<'_> {
    (h.replica, &h.pod.namespace, &h.pod.pod, &h.pod.container, &h.pod.labels)
}

/// Adds the holders of the GPUs claimed through DRA (`claimed`, NVIDIA's driver) to
/// `holders`: each claimed device resolved through `table` to its GPU in `snapshot`,
/// held by its container with the claim's labels. Returns the devices credited to none.
pub fn resolve_claimed(
    claimed: &[ClaimedDevice],
    table: &DeviceTable<GpuDevice>,
    snapshot: &GpuSnapshot,
    pods: &PodIndex,
    holders: &mut GpuHolders,
) -> Vec<Unresolvable> {
    let mut unresolvable = Vec::new();
    for c in claimed {
        let uuid = match table.claimed(c).map(|d| target(d.gpu(), snapshot)) {
            Ok(Target::Gpu(uuid)) => uuid,
            Ok(Target::Pending) => continue,
            Ok(Target::Unresolved(_)) => {
                unresolvable.push(Unresolvable::of(c, dra::Unresolved::UnknownGpu));
                continue;
            }
            Err(reason) => {
                unresolvable.push(Unresolvable::of(c, reason));
                continue;
            }
        };
        let Some(pod) = pods.container(&c.namespace, &c.pod, &c.container) else {
            continue; // not listed (yet): credited with nothing, as for the device plugin's
        };
        let holder = GpuHolder { pod: Arc::new(dra::claim_holder(pod, &c.claim)), replica: None };
        if !hold(holders, uuid, holder) {
            unresolvable.push(Unresolvable::of(c, dra::Unresolved::TooMany));
        }
    }
    sort(holders);
    unresolvable
}

/// The GPUs of this node's ResourceSlices, and the claimed ones told unresolvable.
#[derive(Debug, Default)]
struct ClaimedGpus {
    /// `None` until the slices are listed: until then no claimed GPU is resolved, and
    /// none is said to be unresolvable.
    table: Option<DeviceTable<GpuDevice>>,
    unresolved: UnresolvedLog,
}

/// Which pods hold each GPU, refreshed after each pod-resources answer; cloning shares it.
#[derive(Clone)]
pub struct GpuHolding {
    pods: SharedPods,
    /// The GPU collection, once the agent has a GPU collector: until then no NVIDIA id is
    /// read.
    snapshot: Arc<OnceLock<watch::Receiver<Arc<GpuSnapshot>>>>,
    holders: SharedGpuHolders,
    claimed: Arc<Mutex<ClaimedGpus>>,
    metrics: AttributionMetrics,
    /// The logs of the ids credited to no GPU, and of the claimed GPUs unresolvable.
    ids_log: BadItemLog,
    claims_log: BadItemLog,
}

impl GpuHolding {
    pub fn new(pods: SharedPods, metrics: AttributionMetrics) -> Self {
        GpuHolding {
            pods,
            snapshot: Arc::default(),
            holders: SharedGpuHolders::default(),
            claimed: Arc::default(),
            metrics,
            ids_log: BadItemLog::default(),
            claims_log: BadItemLog::default(),
        }
    }

    /// The GPUs this node's ResourceSlices publish (NVIDIA's driver), read at the next
    /// answer.
    pub fn set_dra_devices(&self, table: DeviceTable<GpuDevice>) {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner()).table = Some(table);
    }

    /// The (pool, device name) of each device of NVIDIA's driver that stands for the GPU
    /// `identity` (the GPU, or each of its MIG devices) in this node's ResourceSlices;
    /// none before they are listed.
    pub fn dra_names(&self, identity: &GpuIdentity) -> Vec<(String, String)> {
        let claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let Some(table) = &claimed.table else { return Vec::new() };
        let is_it = |d: &GpuDevice| match d {
            GpuDevice::Uuid(u) => *u == identity.uuid,
            GpuDevice::Index(i) => *i == identity.index,
            // A MIG device that names no parent: not one the GPU's UUID finds.
            GpuDevice::Mig(_) => false,
        };
        table.names_of(is_it).into_iter().map(|(pool, name)| (pool.to_owned(), name.to_owned())).collect()
    }

    /// Starts resolving the NVIDIA ids of the answers against the GPUs of `snapshot`;
    /// returns the holders it keeps.
    pub fn follow(&self, snapshot: watch::Receiver<Arc<GpuSnapshot>>) -> SharedGpuHolders {
        if self.snapshot.set(snapshot).is_err() {
            warn!("a second GPU collection was given to the GPU attribution; the first is kept");
        }
        self.holders.clone()
    }

    /// The holders by the kubelet's `response`: the device plugin's and the DRA claims'.
    /// `reported`: the device plugin's ids credited to no GPU in the previous answer; one
    /// is counted and logged when it first appears (the claimed GPUs', likewise). Returns
    /// whether the answer lists DRA claims of GPUs (then the slices are wanted).
    pub fn refresh(&self, response: &ListPodResourcesResponse, reported: &mut BTreeSet<String>) -> bool {
        let Some(snapshot) = self.snapshot.get() else {
            return false;
        };
        let snapshot = snapshot.borrow().clone();
        let allocations = gpu_allocations(response);
        let claimed = dra::claimed_devices(response, Nvidia::NAME);
        let pods = self.pods.read().unwrap_or_else(|p| p.into_inner());
        let (mut holders, unresolved) = resolve_holders(&allocations, &snapshot, &pods);
        let fresh = self.add_claimed(&claimed, &snapshot, &pods, &mut holders);
        drop(pods);
        dra::report_unresolved(&fresh, Nvidia::NAME, &self.metrics, &self.claims_log);
        let now: Vec<(String, Unresolved)> = unresolved.into_iter().map(|(a, r)| (a.describe(), r)).collect();
        self.report(now, reported);
        *self.holders.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(holders);
        !claimed.is_empty()
    }

    /// Adds the holders of the claimed GPUs once the slices are listed; returns the claimed
    /// devices newly found unresolvable.
    fn add_claimed(
        &self,
        claimed: &[ClaimedDevice],
        snapshot: &GpuSnapshot,
        pods: &PodIndex,
        holders: &mut GpuHolders,
    ) -> Vec<Unresolvable> {
        let mut dra = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let ClaimedGpus { table, unresolved } = &mut *dra;
        match table {
            Some(table) => unresolved.fresh(resolve_claimed(claimed, table, snapshot, pods, holders)),
            None => Vec::new(),
        }
    }

    /// Counts and logs the ids of `now` not in `reported`, then keeps `now` as reported.
    fn report(&self, now: Vec<(String, Unresolved)>, reported: &mut BTreeSet<String>) {
        let new: Vec<&(String, Unresolved)> = now.iter().filter(|(d, _)| !reported.contains(d)).collect();
        for (_, reason) in &new {
            self.metrics.gpu_ids_unresolved.get_or_create(&ReasonLabel { reason: reason.as_str() }).inc();
        }
        let named = new.iter().map(|(d, r)| format!("{d} ({})", r.as_str()));
        self.ids_log.warn("NVIDIA device ids credited to no GPU of this node", new.len(), named);
        *reported = now.into_iter().map(|(d, _)| d).collect();
    }

    /// The kubelet's last answer is too old to be used: no GPU is held by its account.
    pub fn forget(&self) {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner()).unresolved.clear();
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        if !holders.is_empty() {
            *holders = Arc::default();
        }
    }
}

/// Which pod each GPU process runs in, by its cgroup: read once per PID (an unreadable
/// file again after a while), resolved against the pod watch after each collection.
pub struct GpuProcessAttribution {
    proc_root: PathBuf,
    pods: SharedPods,
    metrics: AttributionMetrics,
    /// By PID: where it sits (`None`: not readable) and when that was read.
    placements: HashMap<u32, (Option<Placement>, Instant)>,
    /// Cgroup files of an unknown layout.
    unknown_layouts: BadItemLog,
}

impl GpuProcessAttribution {
    pub fn new(proc_root: PathBuf, pods: SharedPods, metrics: AttributionMetrics) -> Self {
        GpuProcessAttribution {
            proc_root,
            pods,
            metrics,
            placements: HashMap::new(),
            unknown_layouts: BadItemLog::default(),
        }
    }

    /// The pod of each process of `snapshot` that runs in one (bounded by the processes
    /// a collection keeps); PIDs no longer listed are forgotten.
    pub fn refresh(&mut self, snapshot: &GpuSnapshot) -> GpuProcessPods {
        let pids: BTreeSet<u32> = snapshot.gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)).collect();
        self.placements.retain(|pid, _| pids.contains(pid));
        for pid in &pids {
            let stale = self.placements.get(pid).is_none_or(|(p, at)| p.is_none() && at.elapsed() >= UNREADABLE_RETRY);
            if stale {
                let placement = read_placement(&self.proc_root, *pid, &self.metrics, &self.unknown_layouts);
                self.placements.insert(*pid, (placement, Instant::now()));
            }
        }
        let pods = self.pods.read().unwrap_or_else(|p| p.into_inner());
        let found = self
            .placements
            .iter()
            .filter_map(|(pid, (placement, _))| resolve(placement.as_ref(), &pods).ok().map(|pod| (*pid, pod)));
        found.collect::<BTreeMap<_, _>>()
    }

    /// After each GPU collection, until `shutdown` or the collection's end, publishes the
    /// processes' pods in `out`.
    pub async fn follow(
        mut self,
        mut snapshot: watch::Receiver<Arc<GpuSnapshot>>,
        out: SharedGpuProcessPods,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = snapshot.changed() => if changed.is_err() { return },
            }
            let latest = snapshot.borrow_and_update().clone();
            // New PIDs' cgroup files are file I/O: off the runtime's threads.
            let done = tokio::task::spawn_blocking(move || {
                let pods = self.refresh(&latest);
                (self, pods)
            });
            let Ok((back, pods)) = done.await else {
                warn!("the attribution of GPU processes panicked");
                return;
            };
            self = back;
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(pods);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::RwLock;

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::{
        attribution::{
            podresources::proto::{ContainerDevices, ContainerResources, PodResources},
            pods::PodLabelKeys,
        },
        gpu::{Gpu, GpuIdentity, GpuProcess, MigInstance},
        testdata::TempDir,
    };

    const UUID0: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
    const UUID1: &str = "GPU-1a1b2c3d-0000-1111-2222-333344445555";
    const MIG1: &str = "MIG-9f8e7d6c-0000-1111-2222-333344445555";

    #[test]
    fn device_ids_in_every_form_the_device_plugin_writes() {
        let id = |gpu, replica| Some(DeviceId { gpu, replica });
        assert_eq!(parse_device_id(UUID0), id(GpuRef::Uuid(UUID0), None));
        assert_eq!(parse_device_id("3"), id(GpuRef::Index(3), None));
        assert_eq!(parse_device_id(MIG1), id(GpuRef::Mig(MIG1), None));
        // MIG with the index strategy: the parent GPU's index.
        assert_eq!(parse_device_id("1:2"), id(GpuRef::Index(1), None));
        // The older MIG form names its parent.
        let old = "MIG-GPU-1a1b2c3d-0000-1111-2222-333344445555/7/0";
        assert_eq!(parse_device_id(old), id(GpuRef::Uuid(UUID1), None));
        // Shared replicas, whatever the base form (EKS reports `MIG-…::7`).
        assert_eq!(parse_device_id(&format!("{UUID0}::0")), id(GpuRef::Uuid(UUID0), Some(0)));
        assert_eq!(parse_device_id(&format!("{MIG1}::7")), id(GpuRef::Mig(MIG1), Some(7)));
        assert_eq!(parse_device_id("2::13"), id(GpuRef::Index(2), Some(13)));
        // Case as NVML or the plugin writes it.
        assert_eq!(parse_device_id("gpu-abc"), id(GpuRef::Uuid("gpu-abc"), None));
    }

    #[test]
    fn ids_of_no_known_form_are_refused() {
        let long = format!("GPU-{}", "a".repeat(MAX_DEVICE_ID_BYTES));
        for bad in [
            "",
            "GPU-",
            "GPU-xyz",
            "MIG-",
            "MIG-GPU-abc/1",
            "MIG-GPU-abc/x/0",
            "MIG-GPU-zz/1/0",
            "64",
            "4294967296",
            "-1",
            "+1",
            " 1",
            "1::",
            "1::x",
            "1::-1",
            "GPU-ab::1::2",
            "0:1:2",
            "0:",
            ":1",
            "é",
            "nvidia0",
            &long,
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_nvidia_resources_whatever_the_mig_strategy() {
        for name in
            ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb.shared"]
        {
            assert!(is_gpu_resource(name), "{name}");
        }
        for name in ["nvidia.com/mig-", "nvidia.com/gpus", "aws.amazon.com/neuron", "vpc.amazonaws.com/efa", ""] {
            assert!(!is_gpu_resource(name), "{name}");
        }
        assert!(!is_gpu_resource(&format!("nvidia.com/mig-{}", "1".repeat(33))));
    }

    fn uid(n: u8) -> String {
        format!("{n:08x}-0000-4000-8000-000000000000")
    }

    fn cid(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn running(n: u8, ns: &str, name: &str, container: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"uid": uid(n), "namespace": ns, "name": name},
            "spec": {"containers": [{"name": container}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": container, "containerID": format!("containerd://{}", cid(n)), "image": "", "imageID": "",
                "ready": true, "restartCount": 0}]}
        }))
        .unwrap()
    }

    fn pods(pods: &[Pod]) -> SharedPods {
        let mut index = PodIndex::new(PodLabelKeys::new::<&str>(&[]));
        index.replace(pods);
        Arc::new(RwLock::new(index))
    }

    fn gpu(index: u32, uuid: &str, mig: &[&str]) -> Gpu {
        Gpu {
            identity: GpuIdentity { index, uuid: uuid.into(), ..GpuIdentity::default() },
            mig: mig.iter().map(|m| MigInstance { uuid: m.to_string(), ..MigInstance::default() }).collect(),
            ..Gpu::default()
        }
    }

    /// GPU 0 whole, GPU 1 in MIG mode with one instance, collected once.
    fn collected() -> GpuSnapshot {
        GpuSnapshot { gpus: vec![gpu(0, UUID0, &[]), gpu(1, UUID1, &[MIG1])], collections: 1, ..Default::default() }
    }

    fn holding(ns: &str, pod: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: pod.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                dynamic_resources: Vec::new(),
                name: container.into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|i| i.to_string()).collect(),
                }],
            }],
        }
    }

    fn answer(pods: Vec<PodResources>) -> ListPodResourcesResponse {
        ListPodResourcesResponse { pod_resources: pods }
    }

    /// (UUID, pod, replica) of every holder.
    fn summary(holders: &GpuHolders) -> Vec<(String, String, Option<u32>)> {
        let each =
            holders.iter().flat_map(|(u, held)| held.iter().map(move |h| (u.clone(), h.pod.pod.clone(), h.replica)));
        each.collect()
    }

    fn resolve_answer(
        answer: &ListPodResourcesResponse,
        snapshot: &GpuSnapshot,
        pods: &SharedPods,
    ) -> (GpuHolders, Vec<(String, Unresolved)>) {
        let allocations = gpu_allocations(answer);
        let index = pods.read().unwrap();
        let (holders, unresolved) = resolve_holders(&allocations, snapshot, &index);
        (holders, unresolved.into_iter().map(|(a, r)| (a.id.clone(), r)).collect())
    }

    #[test]
    fn ids_resolve_to_gpus_by_uuid_index_and_mig_instance() {
        let index =
            pods(&[running(1, "a", "train", "main"), running(2, "b", "infer", "srv"), running(3, "c", "slice", "c")]);
        let answer = answer(vec![
            holding("a", "train", "main", "nvidia.com/gpu", &[&UUID0.to_ascii_lowercase()]),
            holding("b", "infer", "srv", "nvidia.com/gpu", &["1"]),
            holding("c", "slice", "c", "nvidia.com/mig-1g.10gb", &[MIG1, "1:0"]),
            // A pod the pod watch does not list: no holder, nothing unresolved.
            holding("d", "gone", "x", "nvidia.com/gpu", &["0"]),
            holding("a", "train", "main", "aws.amazon.com/neuron", &["0"]),
        ]);
        let (holders, unresolved) = resolve_answer(&answer, &collected(), &index);
        let (u0, u1) = (UUID0.to_ascii_uppercase(), UUID1.to_ascii_uppercase());
        assert_eq!(
            summary(&holders),
            vec![(u0, "train".into(), None), (u1.clone(), "infer".into(), None), (u1, "slice".into(), None)],
            "the slice's MIG instance by UUID and by index is held once"
        );
        assert!(unresolved.is_empty(), "{unresolved:?}");
    }

    #[test]
    fn replicas_of_a_shared_gpu_are_one_holder_each() {
        let index = pods(&[running(1, "a", "p1", "c"), running(2, "a", "p2", "c")]);
        let answer = answer(vec![
            holding("a", "p2", "c", "nvidia.com/gpu.shared", &[&format!("{UUID0}::1")]),
            holding("a", "p1", "c", "nvidia.com/gpu", &[&format!("{UUID0}::0")]),
        ]);
        let (holders, _) = resolve_answer(&answer, &collected(), &index);
        let u0 = UUID0.to_ascii_uppercase();
        assert_eq!(summary(&holders), vec![(u0.clone(), "p1".into(), Some(0)), (u0, "p2".into(), Some(1))]);
    }

    #[test]
    fn ids_naming_no_gpu_of_the_node_are_unresolved_with_their_reason() {
        let index = pods(&[running(1, "a", "p", "c")]);
        let other = "GPU-ffffffff-0000-1111-2222-333344445555";
        let answer = answer(vec![holding("a", "p", "c", "nvidia.com/gpu", &[other, "5", "MIG-abcd", "bogus", UUID0])]);
        let (holders, unresolved) = resolve_answer(&answer, &collected(), &index);
        assert_eq!(summary(&holders).len(), 1);
        let reasons: Vec<(&str, Unresolved)> = unresolved.iter().map(|(id, r)| (id.as_str(), *r)).collect();
        assert_eq!(
            reasons,
            vec![
                (other, Unresolved::UnknownGpu),
                ("5", Unresolved::UnknownGpu),
                ("MIG-abcd", Unresolved::UnknownGpu),
                ("bogus", Unresolved::Malformed)
            ]
        );
    }

    #[test]
    fn before_a_first_collection_uuids_are_taken_and_other_forms_wait() {
        let index = pods(&[running(1, "a", "p", "c")]);
        let answer = answer(vec![holding("a", "p", "c", "nvidia.com/gpu", &[UUID1, "0", MIG1])]);
        let (holders, unresolved) = resolve_answer(&answer, &GpuSnapshot::default(), &index);
        assert_eq!(summary(&holders), vec![(UUID1.to_ascii_uppercase(), "p".into(), None)]);
        assert!(unresolved.is_empty(), "{unresolved:?}");
    }

    #[test]
    fn holders_of_one_gpu_and_the_length_of_an_id_are_bounded() {
        let index = pods(&[running(1, "a", "p", "c")]);
        // More replicas of one GPU than pods may hold it.
        let ids: Vec<String> = (0..MAX_HOLDERS_PER_GPU + 3).map(|n| format!("{UUID0}::{n}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (holders, unresolved) =
            resolve_answer(&answer(vec![holding("a", "p", "c", "nvidia.com/gpu", &ids)]), &collected(), &index);
        assert_eq!(holders[&UUID0.to_ascii_uppercase()].len(), MAX_HOLDERS_PER_GPU);
        assert_eq!(unresolved.len(), 3);
        assert!(unresolved.iter().all(|(_, r)| *r == Unresolved::TooMany));
        // An id longer than any form the device plugin writes is refused.
        let long = "9".repeat(MAX_DEVICE_ID_BYTES + 1);
        let (_, unresolved) =
            resolve_answer(&answer(vec![holding("a", "p", "c", "nvidia.com/gpu", &[&long])]), &collected(), &index);
        assert_eq!(unresolved, vec![(long, Unresolved::Malformed)]);
    }

    fn unresolved_count(metrics: &AttributionMetrics, reason: &'static str) -> u64 {
        metrics.gpu_ids_unresolved.get_or_create(&ReasonLabel { reason }).get()
    }

    #[test]
    fn holders_follow_each_answer_and_unresolved_ids_are_counted_once_while_listed() {
        let metrics = AttributionMetrics::default();
        let holding_gpus = GpuHolding::new(pods(&[running(1, "a", "p", "c")]), metrics.clone());
        let first = answer(vec![holding("a", "p", "c", "nvidia.com/gpu", &[UUID0, "7"])]);
        let mut reported = BTreeSet::new();
        // Without a GPU collector, the NVIDIA ids are not read.
        holding_gpus.refresh(&first, &mut reported);
        assert_eq!(unresolved_count(&metrics, "unknown_gpu"), 0);
        let (tx, rx) = watch::channel(Arc::new(collected()));
        let holders = holding_gpus.follow(rx);
        assert!(holders.lock().unwrap().is_empty());
        for _ in 0..3 {
            holding_gpus.refresh(&first, &mut reported);
        }
        assert_eq!(holders.lock().unwrap().len(), 1);
        assert_eq!(unresolved_count(&metrics, "unknown_gpu"), 1, "counted once while listed");
        // Gone from an answer, then back: counted again.
        holding_gpus.refresh(&answer(vec![]), &mut reported);
        assert!(holders.lock().unwrap().is_empty());
        holding_gpus.refresh(&first, &mut reported);
        assert_eq!(unresolved_count(&metrics, "unknown_gpu"), 2);
        // A GPU 7 appears: resolved.
        let mut eight = collected();
        eight.gpus.push(gpu(7, "GPU-7", &[]));
        tx.send_replace(Arc::new(eight));
        holding_gpus.refresh(&first, &mut reported);
        assert_eq!(holders.lock().unwrap().len(), 2);
        assert!(reported.is_empty());
        holding_gpus.forget();
        assert!(holders.lock().unwrap().is_empty());
    }

    const POOL: &str = "gpu-node";
    const UUID2: &str = "GPU-2a1b2c3d-0000-1111-2222-333344445555";

    /// NVIDIA's slice of this node: GPU 0 and 2 whole, two MIG devices of GPU 1 (one
    /// naming its parent, one only itself), a GPU this node does not have, and a
    /// passthrough device.
    fn gpu_table() -> DeviceTable<GpuDevice> {
        let attributes: [(&str, Vec<dra::Attribute<'_>>); 6] = [
            ("gpu-0", vec![("type", None, Some("gpu")), ("uuid", None, Some(UUID0))]),
            ("gpu-2", vec![("type", None, Some("gpu")), ("uuid", None, Some(UUID2))]),
            ("gpu-1-mig-a", vec![("type", None, Some("mig")), ("parentUUID", None, Some(UUID1))]),
            ("gpu-1-mig-b", vec![("type", None, Some("mig")), ("uuid", None, Some(MIG1))]),
            ("gpu-7", vec![("type", None, Some("gpu")), ("uuid", None, Some("GPU-7777"))]),
            ("gpu-vfio-0", vec![("type", None, Some("vfio")), ("uuid", None, Some(UUID0))]),
        ];
        let devices = attributes.iter().map(|(name, a)| (name.to_string(), Nvidia::device(a))).collect();
        DeviceTable::from_slices([&dra::Slice { pool: POOL.into(), generation: 1, devices }])
    }

    /// A container's claims: (claim, [(driver, device)]).
    fn claiming(ns: &str, pod: &str, container: &str, claims: &[(&str, &[(&str, &str)])]) -> PodResources {
        use crate::attribution::podresources::proto::{ClaimResource, DynamicResource};
        let claim = |(name, devices): &(&str, &[(&str, &str)])| DynamicResource {
            claim_name: name.to_string(),
            claim_namespace: ns.into(),
            claim_resources: devices
                .iter()
                .map(|(driver, device)| ClaimResource {
                    driver_name: driver.to_string(),
                    pool_name: POOL.into(),
                    device_name: device.to_string(),
                })
                .collect(),
        };
        PodResources {
            name: pod.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices: Vec::new(),
                dynamic_resources: claims.iter().map(claim).collect(),
            }],
        }
    }

    /// (UUID, pod, claim name) of every holder.
    fn claim_summary(holders: &GpuHolders) -> Vec<(String, String, String)> {
        let claim = |h: &GpuHolder| {
            let name = h.pod.labels.iter().find(|(k, _)| k == dra::CLAIM_NAME_LABEL);
            name.map(|(_, v)| v.clone()).unwrap_or_default()
        };
        let each =
            holders.iter().flat_map(|(u, held)| held.iter().map(move |h| (u.clone(), h.pod.pod.clone(), claim(h))));
        each.collect()
    }

    /// GPUs 0 to 3; GPU 1 in MIG mode.
    fn four_gpus() -> GpuSnapshot {
        let mut snapshot = collected();
        snapshot.gpus.push(gpu(2, UUID2, &[]));
        snapshot.gpus.push(gpu(3, "GPU-3a1b2c3d-0000-1111-2222-333344445555", &[]));
        snapshot
    }

    #[test]
    fn gpus_claimed_through_dra_are_held_with_their_claim_beside_the_device_plugins() {
        let index = pods(&[
            running(1, "a", "train", "main"),
            running(2, "a", "p1", "c"),
            running(3, "a", "p2", "c"),
            running(4, "b", "plugin", "c"),
        ]);
        let nv = Nvidia::NAME;
        let answer = answer(vec![
            // Several claims per container; two MIG devices of GPU 1 in one claim; a claim
            // of another driver naming a device like the GPUs'.
            claiming(
                "a",
                "train",
                "main",
                &[
                    ("whole", &[(nv, "gpu-0")]),
                    ("slices", &[(nv, "gpu-1-mig-a"), (nv, "gpu-1-mig-b")]),
                    ("fpga", &[("fpga.example.com", "gpu-2")]),
                ],
            ),
            // One claim shared by two pods.
            claiming("a", "p1", "c", &[("shared", &[(nv, "gpu-0")])]),
            claiming("a", "p2", "c", &[("shared", &[(nv, "gpu-0")])]),
            // The device plugin's, on the same node.
            holding("b", "plugin", "c", "nvidia.com/gpu", &[UUID2]),
        ]);
        let metrics = AttributionMetrics::default();
        let holding_gpus = GpuHolding::new(index, metrics.clone());
        let (_tx, rx) = watch::channel(Arc::new(four_gpus()));
        let holders = holding_gpus.follow(rx);
        let mut reported = BTreeSet::new();
        // Before the slices are listed: the device plugin's alone, the claims wanted.
        assert!(holding_gpus.refresh(&answer, &mut reported));
        assert_eq!(
            claim_summary(&holders.lock().unwrap()),
            vec![(UUID2.to_ascii_uppercase(), "plugin".into(), "".into())]
        );
        holding_gpus.set_dra_devices(gpu_table());
        assert!(holding_gpus.refresh(&answer, &mut reported));
        let held = holders.lock().unwrap().clone();
        let (u0, u1, u2) = (UUID0.to_ascii_uppercase(), UUID1.to_ascii_uppercase(), UUID2.to_ascii_uppercase());
        assert_eq!(
            claim_summary(&held),
            vec![
                (u0.clone(), "p1".into(), "shared".into()),
                (u0.clone(), "p2".into(), "shared".into()),
                (u0.clone(), "train".into(), "whole".into()),
                (u1, "train".into(), "slices".into()),
                (u2, "plugin".into(), "".into()),
            ]
        );
        let train = &held[&u0][2].pod;
        assert!(train.labels.contains(&(dra::CLAIM_NAMESPACE_LABEL.to_owned(), "a".to_owned())), "{train:?}");
        // The GPU nobody holds keeps its series, without a pod.
        let routing = crate::routing::Routing::default();
        let snapshot = four_gpus();
        let seen = crate::gpu::holdings(&snapshot, &held, crate::series::Scope::Exposition(&routing));
        let free: Vec<u32> = seen.iter().filter(|h| h.pod.is_none()).map(|h| h.gpu.identity.index).collect();
        assert_eq!(free, vec![3]);
        assert_eq!(seen.len(), 6);
        // Answers without GPU claims do not want the slices.
        assert!(!holding_gpus.refresh(&self::answer(vec![]), &mut reported));
    }

    fn dra_unresolved(metrics: &AttributionMetrics, reason: &'static str) -> u64 {
        metrics.dra_unresolved.get_or_create(&ReasonLabel { reason }).get()
    }

    #[test]
    fn claimed_gpus_that_name_none_of_this_node_keep_the_gpus_and_are_told_once_while_listed() {
        let metrics = AttributionMetrics::default();
        let holding_gpus = GpuHolding::new(pods(&[running(1, "a", "p", "c")]), metrics.clone());
        let (_tx, rx) = watch::channel(Arc::new(four_gpus()));
        let holders = holding_gpus.follow(rx);
        holding_gpus.set_dra_devices(gpu_table());
        let nv = Nvidia::NAME;
        let long = "g".repeat(300);
        let odd: [(&str, &str); 6] =
            [(nv, "gpu-9"), (nv, "gpu-7"), (nv, "gpu-vfio-0"), (nv, ""), (nv, &long), (nv, "gpu-0")];
        let answer = answer(vec![claiming("a", "p", "c", &[("odd", &odd)])]);
        let mut reported = BTreeSet::new();
        for _ in 0..3 {
            holding_gpus.refresh(&answer, &mut reported);
        }
        assert_eq!(
            claim_summary(&holders.lock().unwrap()),
            vec![(UUID0.to_ascii_uppercase(), "p".into(), "odd".into())]
        );
        let counts: Vec<u64> = ["unknown_device", "unknown_gpu", "no_device_id", "malformed"]
            .into_iter()
            .map(|r| dra_unresolved(&metrics, r))
            .collect();
        assert_eq!(counts, vec![1, 1, 1, 2], "each counted once while listed");
        assert_eq!(unresolved_count(&metrics, "unknown_gpu"), 0, "not the device plugin's counter");
        // Gone, then listed again after the kubelet's answer expired: told again.
        holding_gpus.forget();
        holding_gpus.refresh(&answer, &mut reported);
        assert_eq!(dra_unresolved(&metrics, "unknown_gpu"), 2);
    }

    #[test]
    fn gpu_processes_take_the_pod_of_their_cgroup() {
        let proc = TempDir::new("gpu-proc");
        let cgroup = |n: u8| {
            let uid = uid(n).replace('-', "_");
            format!("0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{}.scope\n", cid(n))
        };
        proc.write("100/cgroup", cgroup(1));
        proc.write("200/cgroup", "0::/system.slice/sshd.service\n");
        let index = pods(&[running(1, "a", "train", "main")]);
        let mut attribution = GpuProcessAttribution::new(proc.0.clone(), index, AttributionMetrics::default());
        let process = |pid| GpuProcess { pid, used_memory_bytes: Some(1), ..GpuProcess::default() };
        let mut snapshot = collected();
        snapshot.gpus[0].processes = vec![process(100), process(200), process(300)];
        let found = attribution.refresh(&snapshot);
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![100]);
        assert_eq!((found[&100].namespace.as_str(), found[&100].container.as_str()), ("a", "main"));
        // Read once per PID: a process still listed keeps its pod without a new read.
        std::fs::remove_file(proc.0.join("100/cgroup")).unwrap();
        assert_eq!(attribution.refresh(&snapshot).len(), 1);
        // A PID no longer listed is forgotten.
        snapshot.gpus[0].processes.clear();
        assert!(attribution.refresh(&snapshot).is_empty());
        assert!(attribution.placements.is_empty());
    }
}
