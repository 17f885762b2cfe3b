//! Which container holds which Neuron devices and cores, from the kubelet's
//! pod-resources API (gRPC `v1.PodResourcesLister/List` on a unix socket).
//!
//! The call is made with tonic over the unix socket. The messages are a subset of the
//! upstream `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` written as prost structs
//! (only the fields read here): generating them would need `protoc` at build time, which
//! the build machines do not have, for a few small messages. The answers are read with
//! their bounds ([`answer`]): every list and string of them is bounded there, once.
//!
//! The mapping is refreshed in the background; a kubelet that stops answering leaves
//! the last known mapping in place for a bounded time, and says so in the metrics.

use std::{
    collections::BTreeSet,
    ops::Range,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use self::answer::{Bounded, BoundedCodec, Cuts, List};
use super::{
    bad_items::BadItemLog,
    dra::slices::{claimed_names, ClaimedNames},
    dra::{
        self,
        efa::{Efa, NetDevice},
        Claim, ClaimedDevice, DeviceTable, Driver, Neuron, Unresolvable, UnresolvedLog,
    },
    gpus::GpuHolding,
    AttributionMetrics, DeviceSource, ListLabel,
};
use crate::state::K8sOwners;
use api::limits::MAX_NEURONCORES;

pub mod answer;

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` the agent uses.
pub mod proto {
    /// The gRPC method's path.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
    pub const ALLOCATABLE_PATH: &str = "/v1.PodResourcesLister/GetAllocatableResources";

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        /// The DRA claims' devices (kubelets with `KubeletPodResourcesDynamicResource`:
        /// beta and on from 1.34).
        #[prost(message, repeated, tag = "5")]
        pub dynamic_resources: Vec<DynamicResource>,
    }

    /// One ResourceClaim of a container (tag 1, the claim's class, was removed in 1.31).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DynamicResource {
        #[prost(string, tag = "2")]
        pub claim_name: String,
        #[prost(string, tag = "3")]
        pub claim_namespace: String,
        #[prost(message, repeated, tag = "4")]
        pub claim_resources: Vec<ClaimResource>,
    }

    /// One device allocated to a claim: the DRA device's name in its driver's pool, not
    /// a hardware index (its CDI devices, tag 1, and share id, tag 5, are not read).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClaimResource {
        #[prost(string, tag = "2")]
        pub driver_name: String,
        #[prost(string, tag = "3")]
        pub pool_name: String,
        #[prost(string, tag = "4")]
        pub device_name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AllocatableResourcesRequest {}

    /// What the device plugins can allocate on the node (its CPU ids, tag 2, and memory,
    /// tag 3, are not read). DRA devices are not listed: their ResourceSlices say them.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AllocatableResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub devices: Vec<ContainerDevices>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }
}

/// Extended resources of the Neuron device plugin, and of the EFA device plugin.
pub use api::hardware::{
    EFA_RESOURCE as EFA, NEURONCORE_RESOURCE as NEURONCORE, NEURONDEVICE_RESOURCE as NEURONDEVICE,
    NEURON_RESOURCE as NEURON,
};

/// A response larger than this is refused (a node with hundreds of pods and CPU sets
/// stays far below).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("connecting to {socket}: {source}")]
    Connect { socket: String, source: tonic::transport::Error },
    #[error("gRPC: {0}")]
    Grpc(#[from] tonic::Status),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

type Client = tonic::client::Grpc<tonic::transport::Channel>;

/// A client of the kubelet's socket.
async fn connect(socket: &Path) -> Result<Client, PodResourcesError> {
    let path = socket.to_owned();
    let connector = tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
    });
    // The URI is required but unused: the connector dials the socket.
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .map_err(|source| PodResourcesError::Connect { socket: socket.display().to_string(), source })?;
    Ok(tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// One unary call; its answer read with its bounds.
async fn call<Req, Resp>(client: &mut Client, path: &'static str, request: Req) -> Result<Bounded<Resp>, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: answer::Decode + Send + Sync + 'static,
{
    client.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let response = client
        .unary(tonic::Request::new(request), http::uri::PathAndQuery::from_static(path), BoundedCodec::default())
        .await?;
    Ok(response.into_inner())
}

/// Calls `List` on the kubelet's socket.
pub async fn list(socket: &Path) -> Result<proto::ListPodResourcesResponse, PodResourcesError> {
    let mut client = connect(socket).await?;
    Ok(call(&mut client, proto::LIST_PATH, proto::ListPodResourcesRequest {}).await?.answer)
}

/// What one poll of the kubelet reads: `List`'s answer, `GetAllocatableResources`' (which
/// may fail alone: a kubelet that does not serve it), and what their bounds cut.
pub struct Polled {
    pub listed: proto::ListPodResourcesResponse,
    pub allocatable: Result<proto::AllocatableResourcesResponse, tonic::Status>,
    pub cuts: Cuts,
}

/// Calls `List`, then `GetAllocatableResources` on the same connection.
pub async fn poll(socket: &Path) -> Result<Polled, PodResourcesError> {
    let mut client = connect(socket).await?;
    let listed = call(&mut client, proto::LIST_PATH, proto::ListPodResourcesRequest {}).await?;
    let allocatable = call(&mut client, proto::ALLOCATABLE_PATH, proto::AllocatableResourcesRequest {}).await;
    let mut cuts = listed.cuts;
    let allocatable = allocatable.map(|a| {
        cuts.add(&a.cuts);
        a.answer
    });
    Ok(Polled { listed: listed.answer, allocatable, cuts })
}

/// [`poll`]'s answers alone.
pub async fn list_and_allocatable(
    socket: &Path,
) -> Result<
    (proto::ListPodResourcesResponse, Result<proto::AllocatableResourcesResponse, tonic::Status>),
    PodResourcesError,
> {
    let polled = poll(socket).await?;
    Ok((polled.listed, polled.allocatable))
}

/// What one device id of an allocation stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// `aws.amazon.com/neuroncore`: the id is a host core index.
    Core,
    /// `aws.amazon.com/neurondevice`, `aws.amazon.com/neuron`: the id is a device index,
    /// covering all its cores.
    Device,
}

/// One Neuron device id held by one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub unit: Unit,
    pub id: u32,
    /// The DRA claim it was allocated to; `None`: the device plugin's (or neuron-monitor's
    /// account).
    pub claim: Option<Arc<Claim>>,
}

impl Unit {
    /// What the ids of the Neuron device plugin's `resource` stand for; `None`: not a
    /// Neuron resource.
    fn of_resource(resource: &str) -> Option<Unit> {
        match resource {
            NEURONCORE => Some(Unit::Core),
            NEURONDEVICE | NEURON => Some(Unit::Device),
            _ => None,
        }
    }

    /// The host cores id `id` covers; none for a device while the cores per device are
    /// unknown.
    pub fn cores(self, id: u32, cores_per_device: Option<u32>) -> Range<u32> {
        match (self, cores_per_device) {
            (Unit::Core, _) => id..id.saturating_add(1),
            (Unit::Device, Some(n)) => {
                let first = id.saturating_mul(n);
                first..first.saturating_add(n)
            }
            (Unit::Device, None) => 0..0,
        }
    }
}

/// The Neuron devices and cores of a `GetAllocatableResources` answer (ids that are not
/// indices are left out: `List` already names them; as many as the answer's reading kept).
pub fn allocatable(response: &proto::AllocatableResourcesResponse) -> Vec<(Unit, u32)> {
    let mut out: Vec<(Unit, u32)> = response
        .devices
        .iter()
        .filter_map(|d| Some((Unit::of_resource(&d.resource_name)?, &d.device_ids)))
        .flat_map(|(unit, ids)| ids.iter().filter_map(move |id| Some((unit, id.trim().parse::<u32>().ok()?))))
        .collect();
    out.sort_by_key(|(unit, id)| (*unit == Unit::Device, *id));
    out.dedup();
    out
}

impl Allocation {
    /// The host cores it covers; none for a device while the cores per device are unknown.
    pub fn cores(&self, cores_per_device: Option<u32>) -> Range<u32> {
        self.unit.cores(self.id, cores_per_device)
    }
}

/// The device plugin's Neuron allocations of a `List` answer, and the device ids that are
/// not indices (the DRA claims' are [`dra::claimed_devices`]).
pub fn allocations(response: &proto::ListPodResourcesResponse) -> (Vec<Allocation>, Vec<String>) {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                let Some(unit) = Unit::of_resource(&devices.resource_name) else { continue };
                for id in &devices.device_ids {
                    match id.trim().parse::<u32>() {
                        Ok(id) => out.push(Allocation {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: container.name.clone(),
                            unit,
                            id,
                            claim: None,
                        }),
                        Err(_) => unreadable.push(format!("{}={id}", devices.resource_name)),
                    }
                }
            }
        }
    }
    out.sort_by_key(|a| (a.unit == Unit::Device, a.id));
    (out, unreadable)
}

/// One EFA device held by one container: the EFA device plugin's device id is the
/// device's name under `/sys/class/infiniband`, as is a claimed one's RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EfaAllocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub device: String,
    /// The DRA claim it was allocated to; `None`: the device plugin's.
    pub claim: Option<Arc<Claim>>,
}

/// The EFA allocations of a `List` answer, in answer order, and the device ids that
/// cannot be device names (as many as the answer's reading kept).
pub fn efa_allocations(response: &proto::ListPodResourcesResponse) -> (Vec<EfaAllocation>, Vec<String>) {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in container.devices.iter().filter(|d| d.resource_name == EFA) {
                for id in &devices.device_ids {
                    if !api::hardware::valid_efa_device_name(id) {
                        unreadable.push(format!("{EFA}={id}"));
                        continue;
                    }
                    out.push(EfaAllocation {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        device: id.clone(),
                        claim: None,
                    });
                }
            }
        }
    }
    (out, unreadable)
}

/// The allocations neuron-monitor's `neuron_k8s_info` reports: one per core or device
/// and container (the pod alone where it names no container), in the order of
/// [`allocations`].
pub fn monitor_allocations(owners: &K8sOwners) -> Vec<Allocation> {
    let mut out = Vec::new();
    for (unit, entries) in [(Unit::Core, &owners.cores), (Unit::Device, &owners.devices)] {
        for (id, owner) in entries {
            let containers = owner.containers.iter().map(String::as_str);
            let containers: Vec<&str> = if owner.containers.is_empty() { vec![""] } else { containers.collect() };
            for container in containers {
                out.push(Allocation {
                    namespace: owner.namespace.clone(),
                    pod: owner.pod.clone(),
                    container: container.to_owned(),
                    unit,
                    id: *id,
                    claim: None,
                });
            }
        }
    }
    out
}

/// Who holds which device, as the report path reads it: the kubelet's allocations
/// (the device plugin's, and the DRA claims' devices resolved through this node's
/// ResourceSlices) whenever it has answered (and its answer has not expired), else those
/// of neuron-monitor's `neuron_k8s_info`.
#[derive(Debug, Default)]
pub struct DeviceOwnership {
    /// `None`: the kubelet never answered, or its last answer is too old.
    kubelet: Option<KubeletAnswer>,
    /// The Neuron devices of this node's ResourceSlices; `None` until they are listed.
    dra_devices: Option<DeviceTable<u32>>,
    /// The claimed devices that name none of them.
    unresolved: UnresolvedLog,
    /// `None`: no `neuron_k8s_info` (not asked for, or in error).
    monitor: Option<Vec<Allocation>>,
    /// Who holds each EFA device, by the kubelet's account.
    efa: EfaOwnership,
    /// What the device plugin can allocate; `None`: the kubelet did not say.
    plugin_allocatable: Option<Vec<(Unit, u32)>>,
    /// The node's Neuron devices and cores per device, as its reports say.
    node_devices: Option<(u32, u32)>,
    generation: u64,
}

/// What the kubelet's last answer says.
#[derive(Debug, Default)]
struct KubeletAnswer {
    /// The device plugin's allocations.
    plugin: Vec<Allocation>,
    /// The DRA claims' Neuron devices, by name.
    claimed: Vec<ClaimedDevice>,
    /// Both: the device plugin's and the resolved claimed devices.
    merged: Vec<Allocation>,
}

/// The EFA devices held: the device plugin's and the DRA claims', as for Neuron devices.
#[derive(Debug, Default)]
struct EfaOwnership {
    plugin: Vec<EfaAllocation>,
    /// The claims' devices of AWS's EFA DRA driver, by name.
    claimed: Vec<ClaimedDevice>,
    /// Its devices in this node's ResourceSlices; `None` until they are listed.
    dra_devices: Option<DeviceTable<NetDevice>>,
    unresolved: UnresolvedLog,
    /// Both, sorted by device.
    merged: Vec<EfaAllocation>,
}

impl EfaOwnership {
    /// Rebuilds the merged allocations; returns the claimed devices newly found
    /// unresolvable (none before the slices are listed).
    fn merge(&mut self) -> Vec<Unresolvable> {
        let mut merged = self.plugin.clone();
        let mut fresh = Vec::new();
        if let Some(table) = &self.dra_devices {
            let (resolved, unresolvable) = dra::efa::resolve(&self.claimed, table);
            merged.extend(resolved);
            fresh = self.unresolved.fresh(unresolvable);
        }
        // Stable: of a device listed twice, the first listed stays first.
        merged.sort_by(|a, b| a.device.cmp(&b.device));
        self.merged = merged;
        fresh
    }
}

pub type SharedDevices = Arc<RwLock<DeviceOwnership>>;

impl DeviceOwnership {
    pub fn allocations(&self) -> &[Allocation] {
        self.kubelet.as_ref().map(|k| &k.merged[..]).or(self.monitor.as_deref()).unwrap_or_default()
    }

    /// Whose allocations [`DeviceOwnership::allocations`] are, if anyone's.
    pub fn source(&self) -> Option<DeviceSource> {
        match (&self.kubelet, &self.monitor) {
            (Some(_), _) => Some(DeviceSource::Kubelet),
            (None, Some(_)) => Some(DeviceSource::NeuronMonitor),
            (None, None) => None,
        }
    }

    /// Changes whenever the allocations may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The kubelet's answer, without DRA claims.
    pub fn set(&mut self, allocations: Vec<Allocation>) {
        self.set_kubelet(allocations, Vec::new());
    }

    /// The kubelet's answer: the device plugin's allocations and the claimed devices.
    /// Returns the claimed devices newly found unresolvable.
    pub fn set_kubelet(&mut self, plugin: Vec<Allocation>, claimed: Vec<ClaimedDevice>) -> Vec<Unresolvable> {
        if self.kubelet.as_ref().is_some_and(|k| k.plugin == plugin && k.claimed == claimed) {
            return Vec::new();
        }
        self.kubelet = Some(KubeletAnswer { plugin, claimed, merged: Vec::new() });
        self.merge()
    }

    /// The (pool, DRA device name) of the Neuron device `index` in this node's
    /// ResourceSlices; `None` before they are listed or when none names it.
    pub fn dra_name(&self, index: u32) -> Option<(String, String)> {
        let (pool, name) = self.dra_devices.as_ref()?.name_of(&index)?;
        Some((pool.to_owned(), name.to_owned()))
    }

    /// The Neuron devices of this node's ResourceSlices. Returns the claimed devices newly
    /// found unresolvable.
    pub fn set_dra_devices(&mut self, table: DeviceTable<u32>) -> Vec<Unresolvable> {
        if self.dra_devices.as_ref() == Some(&table) {
            return Vec::new();
        }
        self.dra_devices = Some(table);
        self.merge()
    }

    /// Rebuilds the kubelet's allocations; returns the claimed devices newly found
    /// unresolvable. Until the ResourceSlices are listed no claimed device is resolved,
    /// and none is said to be unresolvable.
    fn merge(&mut self) -> Vec<Unresolvable> {
        self.generation += 1;
        let Some(kubelet) = &mut self.kubelet else { return Vec::new() };
        let mut merged = kubelet.plugin.clone();
        let mut fresh = Vec::new();
        if let Some(table) = &self.dra_devices {
            let (resolved, unresolvable) = dra::resolve(&kubelet.claimed, table);
            merged.extend(resolved);
            fresh = self.unresolved.fresh(unresolvable);
        }
        merged.sort_by_key(|a| (a.unit == Unit::Device, a.id));
        kubelet.merged = merged;
        fresh
    }

    /// The kubelet's last answer is too old to be used.
    pub fn forget_kubelet(&mut self) {
        if self.kubelet.take().is_some() {
            self.unresolved.clear();
            self.generation += 1;
        }
    }

    /// neuron-monitor's account (`None`: it gives none).
    pub fn set_from_monitor(&mut self, allocations: Option<Vec<Allocation>>) {
        if self.monitor != allocations {
            self.monitor = allocations;
            self.generation += 1;
        }
    }

    /// What the device plugin can allocate (`None`: the kubelet did not say).
    pub fn set_plugin_allocatable(&mut self, allocatable: Option<Vec<(Unit, u32)>>) {
        if self.plugin_allocatable != allocatable {
            self.plugin_allocatable = allocatable;
            self.generation += 1;
        }
    }

    /// The node's Neuron devices and cores per device, from its reports.
    pub fn set_node_devices(&mut self, devices: Option<(u32, u32)>) {
        self.node_devices = devices;
    }

    /// Whether some Neuron devices of the node are none of the device plugin's: all (a
    /// node whose devices DRA manages, or without a device plugin) or some (a node
    /// migrating to DRA, whose driver publishes the others). Where the reports have not
    /// said the node's devices yet, only "all" is known.
    pub fn plugin_leaves_devices(&self) -> bool {
        let Some(units) = &self.plugin_allocatable else { return false };
        if units.is_empty() {
            return true;
        }
        let Some((devices, cores_per_device)) = self.node_devices else { return false };
        let device_of = |(unit, id): &(Unit, u32)| match unit {
            Unit::Device => Some(*id),
            Unit::Core => id.checked_div(cores_per_device),
        };
        let covered: BTreeSet<u32> = units.iter().filter_map(device_of).filter(|d| *d < devices).collect();
        covered.len() < devices as usize
    }

    /// The host cores the device plugin and the DRA driver can allocate, sorted; `None`
    /// while neither is known (the kubelet did not say, and the ResourceSlices are not
    /// listed, or the cores per device are not).
    pub fn allocatable_cores(&self, cores_per_device: Option<u32>) -> Option<Vec<u32>> {
        if self.plugin_allocatable.is_none() && self.dra_devices.is_none() {
            return None;
        }
        let plugin = self.plugin_allocatable.iter().flatten().copied();
        let dra = self.dra_devices.iter().flat_map(DeviceTable::resolved).map(|id| (Unit::Device, *id));
        let units: Vec<(Unit, u32)> = plugin.chain(dra).collect();
        if cores_per_device.is_none() && units.iter().any(|(unit, _)| *unit == Unit::Device) {
            return None;
        }
        let cores = units.into_iter().flat_map(|(unit, id)| unit.cores(id, cores_per_device));
        let mut cores: Vec<u32> = cores.filter(|c| *c < MAX_NEURONCORES).collect();
        cores.sort_unstable();
        cores.dedup();
        Some(cores)
    }

    /// The EFA devices held, the device plugin's and the claims', sorted by device name.
    pub fn efa(&self) -> &[EfaAllocation] {
        &self.efa.merged
    }

    /// The kubelet's EFA allocations: the device plugin's and the claimed devices. Returns
    /// the claimed devices newly found unresolvable.
    pub fn set_efa(&mut self, plugin: Vec<EfaAllocation>, claimed: Vec<ClaimedDevice>) -> Vec<Unresolvable> {
        if self.efa.plugin == plugin && self.efa.claimed == claimed {
            return Vec::new();
        }
        self.efa.plugin = plugin;
        self.efa.claimed = claimed;
        self.generation += 1;
        self.efa.merge()
    }

    /// The EFA driver's devices of this node's ResourceSlices. Returns the claimed devices
    /// newly found unresolvable.
    pub fn set_efa_dra_devices(&mut self, table: DeviceTable<NetDevice>) -> Vec<Unresolvable> {
        if self.efa.dra_devices.as_ref() == Some(&table) {
            return Vec::new();
        }
        self.efa.dra_devices = Some(table);
        self.generation += 1;
        self.efa.merge()
    }
}

/// Polls the kubelet into a [`DeviceOwnership`].
pub struct KubeletPoller {
    pub socket: PathBuf,
    pub interval: Duration,
    pub timeout: Duration,
    /// How long the last known mapping outlives a kubelet that stopped answering.
    pub keep_for: Duration,
    pub devices: SharedDevices,
    /// Who holds each NVIDIA GPU, by the same answers.
    pub gpus: GpuHolding,
    /// Set once an answer lists DRA claims of Neuron or EFA devices or GPUs: this node's
    /// ResourceSlices are then watched ([`dra::slices`]), and only then.
    pub dra_wanted: tokio::sync::watch::Sender<bool>,
    /// The devices the claims of the latest answer name (sent before `dra_wanted` is set):
    /// the slices that publish them are kept first.
    pub claimed: tokio::sync::watch::Sender<Arc<ClaimedNames>>,
    pub metrics: AttributionMetrics,
}

/// What the poller remembers from one answer to the next, to tell things once.
#[derive(Default)]
struct Told {
    unreadable: Vec<String>,
    gpu_ids: BTreeSet<String>,
    allocatable_failing: bool,
    /// The logs of the answers' bad ids and unresolvable claimed devices.
    unreadable_log: BadItemLog,
    unresolved_log: BadItemLog,
}

impl KubeletPoller {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        info!(socket = %self.socket.display(), interval = ?self.interval, "polling the kubelet's pod-resources API");
        let mut last_success: Option<Instant> = None;
        let mut failing = false;
        let mut told = Told::default();
        loop {
            let result = match tokio::time::timeout(self.timeout, poll(&self.socket)).await {
                Ok(result) => result,
                Err(_) => Err(PodResourcesError::Timeout(self.timeout)),
            };
            match result {
                Ok(polled) => {
                    if std::mem::take(&mut failing) {
                        info!("the kubelet's pod-resources API answers again");
                    }
                    last_success = Some(Instant::now());
                    self.take(polled, &mut told);
                }
                Err(e) => {
                    let result = if matches!(e, PodResourcesError::Timeout(_)) { "timeout" } else { "error" };
                    self.metrics.kubelet_requests.get_or_create(&super::ResultLabel { result }).inc();
                    self.metrics.kubelet_up.set(0);
                    if !std::mem::replace(&mut failing, true) {
                        warn!(error = %e, socket = %self.socket.display(), keep_for = ?self.keep_for,
                              "the kubelet's pod-resources API does not answer; keeping the last known devices");
                    }
                    if last_success.is_none_or(|t| t.elapsed() >= self.keep_for) {
                        self.forget();
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    /// Puts an answer in force, and tells what is wrong in it.
    fn take(&self, polled: Polled, told: &mut Told) {
        let Polled { listed: response, allocatable: plugin_allocatable, cuts } = polled;
        for list in List::ALL {
            self.metrics.kubelet_entries_cut.get_or_create(&ListLabel { list: list.as_str() }).inc_by(cuts.get(list));
        }
        let plugin_allocatable = match plugin_allocatable {
            Ok(answer) => Some(allocatable(&answer)),
            Err(status) => {
                if !std::mem::replace(&mut told.allocatable_failing, true) {
                    warn!(error = %status, "the kubelet does not say what the device plugin can allocate; \
                          the allocation metrics count the DRA driver's devices only");
                }
                None
            }
        };
        let (allocations, mut unreadable) = allocations(&response);
        let claimed = dra::claimed_devices(&response, Neuron::NAME);
        let (efa, efa_unreadable) = efa_allocations(&response);
        let efa_claimed = dra::claimed_devices(&response, Efa::NAME);
        unreadable.extend(efa_unreadable);
        self.metrics.kubelet_ids_unreadable.set(unreadable.len() as i64);
        // Said when the set changes, not on every poll (and at most as often as the log allows).
        if unreadable != told.unreadable {
            told.unreadable_log.warn(
                "device ids that are not Neuron indices or EFA device names are ignored",
                unreadable.len(),
                &unreadable,
            );
        }
        told.unreadable = unreadable;
        let count = allocations.len() + claimed.len();
        let claims = !claimed.is_empty() || !efa_claimed.is_empty();
        let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
        let unresolvable = devices.set_kubelet(allocations, claimed);
        let efa_unresolvable = devices.set_efa(efa, efa_claimed);
        devices.set_plugin_allocatable(plugin_allocatable);
        // The node's devices that are none of the device plugin's may be DRA's: its
        // ResourceSlices say what can be allocated.
        let dra_node = devices.plugin_leaves_devices();
        drop(devices);
        dra::report_unresolved(&unresolvable, Neuron::NAME, &self.metrics, &told.unresolved_log);
        dra::report_unresolved(&efa_unresolvable, Efa::NAME, &self.metrics, &told.unresolved_log);
        let gpu_claims = self.gpus.refresh(&response, &mut told.gpu_ids);
        let names = Arc::new(claimed_names(&response));
        self.claimed.send_if_modified(|known| std::mem::replace(known, names.clone()) != names);
        if claims || gpu_claims || dra_node {
            self.dra_wanted.send_if_modified(|wanted| !std::mem::replace(wanted, true));
        }
        self.metrics.kubelet_requests.get_or_create(&super::ResultLabel { result: "ok" }).inc();
        self.metrics.kubelet_up.set(1);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.metrics.kubelet_last_success.set(now.as_secs_f64());
        debug!(allocations = count, "pod-resources listed");
    }

    /// The kubelet's last answer is too old to be used: nothing is credited by its account.
    fn forget(&self) {
        let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
        if devices.kubelet.is_some() || !devices.efa().is_empty() {
            warn!(
                "the kubelet's last known device allocations are too old; cores and EFA devices are no longer \
                 credited by its account"
            );
        }
        // Each forgets only what is still known.
        devices.forget_kubelet();
        devices.set_efa(Vec::new(), Vec::new());
        devices.set_plugin_allocatable(None);
        self.gpus.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::*;

    fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
        ContainerDevices { resource_name: resource.to_owned(), device_ids: ids.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn neuron_resources_become_core_and_device_allocations() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "a".into(),
                    containers: vec![ContainerResources {
                        dynamic_resources: Vec::new(),
                        name: "main".into(),
                        devices: vec![
                            devices(NEURONDEVICE, &["1"]),
                            devices("nvidia.com/gpu", &["GPU-1"]),
                            devices(NEURON, &["x3"]),
                        ],
                    }],
                },
                PodResources {
                    name: "serve".into(),
                    namespace: "b".into(),
                    containers: vec![ContainerResources {
                        dynamic_resources: Vec::new(),
                        name: "srv".into(),
                        devices: vec![devices(NEURONCORE, &["5", "4"])],
                    }],
                },
            ],
        };
        let decoded = ListPodResourcesResponse::decode(&*response.encode_to_vec()).unwrap();
        let (allocations, unreadable) = allocations(&decoded);
        assert_eq!(unreadable, vec!["aws.amazon.com/neuron=x3".to_owned()]);
        let summary: Vec<(&str, Unit, u32)> = allocations.iter().map(|a| (a.pod.as_str(), a.unit, a.id)).collect();
        assert_eq!(summary, vec![("serve", Unit::Core, 4), ("serve", Unit::Core, 5), ("train", Unit::Device, 1)]);
        // Device 1 with 2 cores per device holds cores 2 and 3.
        assert_eq!(allocations[2].cores(Some(2)), 2..4);
        assert_eq!(allocations[2].cores(None), 0..0);
        assert_eq!(allocations[0].cores(None), 4..5);
    }

    #[test]
    fn efa_device_ids_are_device_names() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "a".into(),
                    containers: vec![ContainerResources {
                        dynamic_resources: Vec::new(),
                        name: "main".into(),
                        devices: vec![devices(NEURONDEVICE, &["0"]), devices(EFA, &["rdmap32s27", "rdmap16s27"])],
                    }],
                },
                PodResources {
                    name: "x".into(),
                    namespace: "b".into(),
                    containers: vec![ContainerResources {
                        dynamic_resources: Vec::new(),
                        name: "c".into(),
                        devices: vec![devices(EFA, &["../etc", &"é".repeat(100)])],
                    }],
                },
            ],
        };
        let (efa, unreadable) = efa_allocations(&response);
        let summary: Vec<(&str, &str, &str)> =
            efa.iter().map(|a| (a.pod.as_str(), a.container.as_str(), a.device.as_str())).collect();
        assert_eq!(summary, vec![("train", "main", "rdmap32s27"), ("train", "main", "rdmap16s27")], "answer order");
        assert_eq!(unreadable.len(), 2);
        assert_eq!(unreadable[0], "vpc.amazonaws.com/efa=../etc");
        // The Neuron allocations are not affected.
        assert_eq!(allocations(&response).0.len(), 1);
    }

    #[test]
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        // ContainerResources.cpu_ids (3, packed int64) and a topology (3) in ContainerDevices.
        let mut bytes = ContainerResources {
            dynamic_resources: Vec::new(),
            name: "c".into(),
            devices: vec![devices(NEURONCORE, &["0"])],
        }
        .encode_to_vec();
        bytes.extend_from_slice(&[0x1a, 0x02, 0x01, 0x02]);
        let decoded = ContainerResources::decode(&*bytes).unwrap();
        assert_eq!(decoded.devices[0].device_ids, vec!["0".to_owned()]);
    }

    #[test]
    fn devices_none_of_the_device_plugins_call_for_the_resourceslices() {
        let mut ownership = DeviceOwnership::default();
        assert!(!ownership.plugin_leaves_devices(), "the kubelet has not said");
        ownership.set_plugin_allocatable(Some(Vec::new()));
        assert!(ownership.plugin_leaves_devices(), "no device plugin: a DRA node");
        // The plugin's devices 0-1 and cores 4-5 (device 2) of a node of 4 devices × 2 cores.
        let half = vec![(Unit::Device, 0), (Unit::Device, 1), (Unit::Core, 4), (Unit::Core, 5)];
        ownership.set_plugin_allocatable(Some(half.clone()));
        assert!(!ownership.plugin_leaves_devices(), "the node's devices are not known yet");
        ownership.set_node_devices(Some((4, 2)));
        assert!(ownership.plugin_leaves_devices(), "device 3 is none of the plugin's: a mixed node");
        let mut all = half;
        all.push((Unit::Core, 7));
        ownership.set_plugin_allocatable(Some(all.clone()));
        assert!(!ownership.plugin_leaves_devices(), "every device is the plugin's");
        // Ids beyond the node's devices cover none of them.
        all.retain(|(unit, id)| (*unit, *id) != (Unit::Device, 1));
        all.push((Unit::Device, 9));
        ownership.set_plugin_allocatable(Some(all));
        assert!(ownership.plugin_leaves_devices(), "device 1 is none of the plugin's");
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error() {
        let err = list(Path::new("/nonexistent/kubelet.sock")).await.unwrap_err();
        assert!(matches!(err, PodResourcesError::Connect { .. }), "{err}");
    }
}
