//! Attribution set up on a host: the caches the report path reads, and the tasks that
//! keep them current (on Kubernetes the pod watch and the kubelet poller, on ECS the ECS
//! agent poller). neuron-monitor's `neuron_k8s_info` comes with the reports: the report
//! path itself keeps it in the device cache.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use prometheus_client::registry::Registry;
use service::tasks::CriticalTasks;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    allocation::IdlePolicy,
    dra::slices::{ClaimedNames, SliceWatcher},
    ecs::{self, EcsPoller, SharedEcs},
    gpus::{GpuHolding, GpuProcessAttribution},
    podresources::{DeviceOwnership, KubeletPoller, SharedDevices},
    pods::{PodIndex, PodLabelKeys, PodWatcher, SharedPods},
    Attribution, AttributionMetrics, EfaHolders,
};
use crate::gpu::{GpuSnapshot, SharedGpuHolders, SharedGpuProcessPods};

/// Where attribution reads from.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Root of the proc filesystem with `<pid>/cgroup` of neuron-monitor's applications.
    pub proc_root: PathBuf,
    /// Pod labels exported as `label_<key>` metric labels.
    pub pod_labels: Vec<String>,
    /// The kubelet's pod-resources socket, and how it is polled.
    pub kubelet_socket: PathBuf,
    pub kubelet_interval: Duration,
    pub kubelet_timeout: Duration,
    /// How long the last known device allocations outlive a kubelet that stopped answering.
    pub kubelet_keep: Duration,
    /// The ECS agent's introspection API, on ECS.
    pub ecs_agent: Option<http::Uri>,
    /// When allocated cores count as idle.
    pub idle: IdlePolicy,
}

/// The caches of pod attribution and what feeds them.
pub struct Sources {
    settings: Settings,
    pods: SharedPods,
    devices: SharedDevices,
    ecs: SharedEcs,
    gpus: GpuHolding,
    /// Set once the kubelet lists DRA claims: the ResourceSlice watch starts then.
    dra_wanted: watch::Sender<bool>,
    /// The devices the kubelet's claims name: their ResourceSlices are kept first.
    claimed: watch::Sender<Arc<ClaimedNames>>,
    metrics: AttributionMetrics,
}

impl Sources {
    /// Empty caches; the attribution's metrics go into `registry`.
    pub fn new(settings: Settings, registry: &mut Registry) -> Self {
        let pods: SharedPods = Arc::new(RwLock::new(PodIndex::new(PodLabelKeys::new(&settings.pod_labels))));
        let metrics = AttributionMetrics::register(registry);
        Sources {
            gpus: GpuHolding::new(pods.clone(), metrics.clone()),
            pods,
            devices: Arc::new(RwLock::new(DeviceOwnership::default())),
            ecs: SharedEcs::default(),
            dra_wanted: watch::Sender::new(false),
            claimed: watch::Sender::new(Arc::default()),
            metrics,
            settings,
        }
    }

    /// The report path's side: lookups in these caches.
    pub fn attribution(&self) -> Attribution {
        Attribution::new(
            self.settings.proc_root.clone(),
            self.pods.clone(),
            self.devices.clone(),
            self.ecs.clone(),
            self.metrics.clone(),
        )
        .with_idle_policy(self.settings.idle)
    }

    /// Who holds which devices, by the kubelet's account (for the health series' pods).
    pub fn devices(&self) -> SharedDevices {
        self.devices.clone()
    }

    /// What starts the ResourceSlice watch (with [`Sources::spawn_feeds`]): the kubelet
    /// listing DRA claims, or the health's DeviceTaintRules, which name devices by them.
    pub fn dra_wanted(&self) -> watch::Sender<bool> {
        self.dra_wanted.clone()
    }

    /// Who holds each GPU, and the GPUs' DRA names (for their DeviceTaintRules).
    pub fn gpu_holding(&self) -> GpuHolding {
        self.gpus.clone()
    }

    /// Which pod holds each EFA device (for the EFA series' pods).
    pub fn efa_holders(&self) -> EfaHolders {
        EfaHolders::new(self.pods.clone(), self.devices.clone())
    }

    /// The GPUs of `snapshot`: who holds each (resolved after each pod-resources answer)
    /// and which pod each GPU process runs in (after each collection, by a task among
    /// `tasks` until `shutdown`).
    pub fn gpus(
        &self,
        snapshot: watch::Receiver<Arc<GpuSnapshot>>,
        tasks: &mut CriticalTasks,
        shutdown: &CancellationToken,
    ) -> (SharedGpuHolders, SharedGpuProcessPods) {
        let holders = self.gpus.follow(snapshot.clone());
        let process_pods = SharedGpuProcessPods::default();
        let processes =
            GpuProcessAttribution::new(self.settings.proc_root.clone(), self.pods.clone(), self.metrics.clone());
        tasks.spawn("GPU process attribution", processes.follow(snapshot, process_pods.clone(), shutdown.clone()));
        (holders, process_pods)
    }

    /// Starts the pod watch of `node`, the kubelet poller and (once the kubelet lists DRA
    /// claims) the ResourceSlice watch among `tasks`, until `shutdown`.
    pub fn spawn_feeds(
        &self,
        tasks: &mut CriticalTasks,
        client: kube::Client,
        node: &str,
        watch_timeout: Duration,
        shutdown: &CancellationToken,
    ) {
        let slices = SliceWatcher {
            client: client.clone(),
            node: node.to_owned(),
            devices: self.devices.clone(),
            gpus: self.gpus.clone(),
            metrics: self.metrics.clone(),
            watch_timeout,
            wanted: self.dra_wanted.subscribe(),
            claimed: self.claimed.subscribe(),
        };
        tasks.spawn("ResourceSlice watch", slices.run(shutdown.clone()));
        let watcher = PodWatcher {
            client,
            node: node.to_owned(),
            index: self.pods.clone(),
            metrics: self.metrics.clone(),
            watch_timeout,
        };
        tasks.spawn("pod watch", watcher.run(shutdown.clone()));
        let poller = KubeletPoller {
            socket: self.settings.kubelet_socket.clone(),
            interval: self.settings.kubelet_interval,
            timeout: self.settings.kubelet_timeout,
            keep_for: self.settings.kubelet_keep,
            devices: self.devices.clone(),
            gpus: self.gpus.clone(),
            dra_wanted: self.dra_wanted.clone(),
            claimed: self.claimed.clone(),
            metrics: self.metrics.clone(),
        };
        tasks.spawn("kubelet pod-resources poller", poller.run(shutdown.clone()));
    }

    /// With an ECS agent to ask, starts its poller among `tasks`, until `shutdown`.
    pub fn spawn_ecs_feed(&self, tasks: &mut CriticalTasks, shutdown: &CancellationToken) {
        let Some(agent) = self.settings.ecs_agent.clone() else {
            return;
        };
        let poller = EcsPoller {
            agent,
            interval: ecs::POLL_INTERVAL,
            timeout: ecs::POLL_TIMEOUT,
            index: self.ecs.clone(),
            metrics: self.metrics.clone(),
        };
        tasks.spawn("ECS task feed", poller.run(shutdown.clone()));
    }
}
