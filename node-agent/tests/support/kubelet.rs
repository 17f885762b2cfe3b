//! What stands in for the kubelet on this machine (none can run here): a gRPC server of
//! `v1.PodResourcesLister` (`List`, `GetAllocatableResources`) on a unix socket, answering what the test feeds it, and
//! a fake `/proc` tree whose `<pid>/cgroup` files place simulated applications in pods.
//!
//! The server is plain HTTP/2 (hyper) with the gRPC framing written out here, apart from
//! the agent's client code, so that the two check each other.

use std::{
    convert::Infallible,
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
};

use neuron_node_agent::attribution::podresources::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ClaimResource, ContainerDevices, ContainerResources,
    DynamicResource, ListPodResourcesRequest, ListPodResourcesResponse, PodResources, ALLOCATABLE_PATH, LIST_PATH,
};
use tonic::{body::Body, server::NamedService, transport::Server};
use tonic_prost::ProstCodec;

use super::TempDir;

pub fn holding(namespace: &str, pod: &str, container: &str, resource: &str, ids: &[u32]) -> PodResources {
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    holding_ids(namespace, pod, container, resource, &ids)
}

/// A pod whose container holds the device `ids` of `resource`, as the device plugin
/// names them (`GPU-…`, `GPU-…::1`, …).
pub fn holding_ids(namespace: &str, pod: &str, container: &str, resource: &str, ids: &[String]) -> PodResources {
    PodResources {
        name: pod.to_owned(),
        namespace: namespace.to_owned(),
        containers: vec![ContainerResources {
            dynamic_resources: Vec::new(),
            name: container.to_owned(),
            devices: vec![ContainerDevices { resource_name: resource.to_owned(), device_ids: ids.to_vec() }],
        }],
    }
}

/// A pod whose container holds, through the ResourceClaim `claim` of its namespace, the
/// DRA devices `devices` of `driver`'s `pool`, as a kubelet with DRA answers.
pub fn claiming(
    namespace: &str,
    pod: &str,
    container: &str,
    claim: &str,
    (driver, pool): (&str, &str),
    devices: &[&str],
) -> PodResources {
    let claim_resources = devices
        .iter()
        .map(|d| ClaimResource {
            driver_name: driver.to_owned(),
            pool_name: pool.to_owned(),
            device_name: d.to_string(),
        })
        .collect();
    PodResources {
        name: pod.to_owned(),
        namespace: namespace.to_owned(),
        containers: vec![ContainerResources {
            name: container.to_owned(),
            devices: Vec::new(),
            dynamic_resources: vec![DynamicResource {
                claim_name: claim.to_owned(),
                claim_namespace: namespace.to_owned(),
                claim_resources,
            }],
        }],
    }
}

/// A pod whose container holds Neuron `ids` of `resource` and the EFA devices `efa` (by
/// name, as the EFA device plugin's `vpc.amazonaws.com/efa` ids are).
pub fn holding_with_efa(
    namespace: &str,
    pod: &str,
    container: &str,
    (resource, ids): (&str, &[u32]),
    efa: &[&str],
) -> PodResources {
    let mut pod = holding(namespace, pod, container, resource, ids);
    pod.containers[0].devices.push(ContainerDevices {
        resource_name: api::hardware::EFA_RESOURCE.to_owned(),
        device_ids: efa.iter().map(|d| d.to_string()).collect(),
    });
    pod
}

/// What `List` answers: the same pods at every call (encoded once, so that a large answer
/// costs the server a copy a call), or pods made for each call (given the call's number,
/// from 0: a kubelet whose answer changes at every poll).
#[derive(Clone)]
enum Listing {
    Fixed(bytes::Bytes),
    PerCall(Arc<dyn Fn(u64) -> Vec<PodResources> + Send + Sync>),
}

fn encoded(pods: Vec<PodResources>) -> bytes::Bytes {
    use prost::Message;
    ListPodResourcesResponse { pod_resources: pods }.encode_to_vec().into()
}

type SharedListing = Arc<Mutex<Listing>>;

/// A test pod-resources server. Stops (and removes its socket) on drop.
pub struct PodResourcesServer {
    pub socket: PathBuf,
    pods: SharedListing,
    allocatable: Allocatable,
    pub calls: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PodResourcesServer {
    /// Listens on `socket` (created; an old file there is removed).
    pub fn start(socket: &Path) -> PodResourcesServer {
        let _ = std::fs::remove_file(socket);
        let pods: SharedListing = Arc::new(Mutex::new(Listing::Fixed(encoded(Vec::new()))));
        let allocatable = Allocatable::default();
        let calls = Arc::new(AtomicU64::new(0));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (path, shared, counter, advertised) = (socket.to_owned(), pods.clone(), calls.clone(), allocatable.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).expect("bind the pod-resources socket");
                ready_tx.send(()).expect("ready");
                let incoming = futures::stream::unfold(listener, |listener| async move {
                    Some((listener.accept().await.map(|(stream, _)| stream), listener))
                });
                let service = PodResourcesLister { pods: shared, allocatable: advertised, calls: counter };
                let _ = Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stop_rx.await;
                    })
                    .await;
                let _ = std::fs::remove_file(&path);
            });
        });
        ready_rx.recv().expect("the pod-resources server started");
        PodResourcesServer {
            socket: socket.to_owned(),
            pods,
            allocatable,
            calls,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// What `GetAllocatableResources` answers from now on: the device plugins' devices
    /// (`None`, the start: unimplemented, as on a kubelet without it).
    pub fn set_allocatable(&self, devices: Option<Vec<ContainerDevices>>) {
        *self.allocatable.lock().expect("lock") = devices;
    }

    /// What `List` answers from now on.
    pub fn set(&self, pods: Vec<PodResources>) {
        *self.pods.lock().expect("lock") = Listing::Fixed(encoded(pods));
    }

    /// What `List` answers from now on: `answer(n)` at the `n`th call (counted from the
    /// server's start, as [`PodResourcesServer::calls`]).
    pub fn set_per_call(&self, answer: impl Fn(u64) -> Vec<PodResources> + Send + Sync + 'static) {
        *self.pods.lock().expect("lock") = Listing::PerCall(Arc::new(answer));
    }

    /// Stops listening and removes the socket: the kubelet is gone.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.stop();
    }
}

type Allocatable = Arc<Mutex<Option<Vec<ContainerDevices>>>>;

/// `v1.PodResourcesLister`, serving `List` with the pods the test set, and
/// `GetAllocatableResources` with the devices it set.
#[derive(Clone)]
struct PodResourcesLister {
    pods: SharedListing,
    allocatable: Allocatable,
    calls: Arc<AtomicU64>,
}

impl NamedService for PodResourcesLister {
    const NAME: &'static str = "v1.PodResourcesLister";
}

impl tonic::server::UnaryService<ListPodResourcesRequest> for PodResourcesLister {
    /// The encoded `ListPodResourcesResponse`.
    type Response = bytes::Bytes;
    type Future = std::future::Ready<Result<tonic::Response<bytes::Bytes>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let listing = self.pods.lock().expect("lock").clone();
        let answer = match listing {
            Listing::Fixed(answer) => answer,
            Listing::PerCall(answer) => encoded(answer(call)),
        };
        std::future::ready(Ok(tonic::Response::new(answer)))
    }
}

/// `List`'s codec: the request decoded by prost, the answer already encoded.
struct EncodedCodec;

impl tonic::codec::Codec for EncodedCodec {
    type Encode = bytes::Bytes;
    type Decode = ListPodResourcesRequest;
    type Encoder = EncodedEncoder;
    type Decoder = tonic_prost::ProstDecoder<ListPodResourcesRequest>;

    fn encoder(&mut self) -> EncodedEncoder {
        EncodedEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

struct EncodedEncoder;

impl tonic::codec::Encoder for EncodedEncoder {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: bytes::Bytes, buf: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put(buf, item);
        Ok(())
    }
}

impl tonic::server::UnaryService<AllocatableResourcesRequest> for PodResourcesLister {
    type Response = AllocatableResourcesResponse;
    type Future = std::future::Ready<Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<AllocatableResourcesRequest>) -> Self::Future {
        let answer = match self.allocatable.lock().expect("lock").clone() {
            Some(devices) => Ok(tonic::Response::new(AllocatableResourcesResponse { devices })),
            None => Err(tonic::Status::unimplemented("GetAllocatableResources is not served")),
        };
        std::future::ready(answer)
    }
}

impl tower::Service<http::Request<Body>> for PodResourcesLister {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let lister = self.clone();
        Box::pin(async move {
            match request.uri().path() {
                LIST_PATH => Ok(tonic::server::Grpc::new(EncodedCodec).unary(lister, request).await),
                ALLOCATABLE_PATH => {
                    let codec = ProstCodec::<AllocatableResourcesResponse, AllocatableResourcesRequest>::default();
                    Ok(tonic::server::Grpc::new(codec).unary(lister, request).await)
                }
                _ => {
                    Ok(tonic::Status::unimplemented("only List and GetAllocatableResources are served here")
                        .into_http())
                }
            }
        })
    }
}

pub struct FakeProc {
    dir: TempDir,
}

impl FakeProc {
    pub fn new() -> FakeProc {
        FakeProc { dir: TempDir::new("proc") }
    }

    pub fn root(&self) -> &Path {
        &self.dir.0
    }

    /// Places process `pid` with the given cgroup file content.
    pub fn process(&self, pid: u32, cgroup: &str) {
        let dir = self.dir.0.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("create the fake /proc/<pid>");
        std::fs::write(dir.join("cgroup"), cgroup).expect("write the fake cgroup file");
    }

    /// Writes the file `name` of process `pid` (`stat`, `io`, …).
    pub fn file(&self, pid: u32, name: &str, content: &str) {
        let dir = self.dir.0.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("create the fake /proc/<pid>");
        std::fs::write(dir.join(name), content).expect("write a fake /proc/<pid> file");
    }

    /// Gives process `pid` `count` open descriptors (`fd/0` …).
    pub fn fds(&self, pid: u32, count: u32) {
        let dir = self.dir.0.join(pid.to_string()).join("fd");
        std::fs::create_dir_all(&dir).expect("create the fake /proc/<pid>/fd");
        for fd in 0..count {
            std::fs::write(dir.join(fd.to_string()), "").expect("write a fake descriptor");
        }
    }

    /// Process `pid` is gone.
    pub fn remove(&self, pid: u32) {
        let _ = std::fs::remove_dir_all(self.dir.0.join(pid.to_string()));
    }
}

impl Default for FakeProc {
    fn default() -> Self {
        Self::new()
    }
}

/// A `/proc/<pid>/stat` line as the kernel writes it, with the given command name, CPU
/// ticks (user, system), threads and resident pages.
pub fn stat_line(pid: u32, comm: &str, (utime, stime): (u64, u64), threads: u64, rss_pages: u64) -> String {
    format!(
        "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 1273 0 8 0 {utime} {stime} 0 0 20 0 {threads} 0 3581226 \
         19771981824 {rss_pages} 18446744073709551615 1 1 0 0 0 0 0 16781312 1073745102 0 0 0 17 11 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
    )
}

/// The cgroup v2 file of a containerd container under the systemd driver.
pub fn containerd_cgroup(pod_uid: &str, container_id: &str) -> String {
    let uid = pod_uid.replace('-', "_");
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{container_id}.scope\n"
    )
}

/// A container ID (64 hex digits) derived from `seed`.
pub fn container_id(seed: u32) -> String {
    format!("{seed:016x}").repeat(4)
}

/// Creates a pod bound to `node` and marks it running with `container` as `cid`
/// (what the kubelet would write). Returns its UID.
pub async fn running_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    container: &str,
    cid: &str,
) -> String {
    running_pod_with(client, namespace, name, node, container, cid, serde_json::json!({"app": name}), None).await
}

/// [`running_pod`] with its labels and the controller that owns it (an `ownerReferences`
/// entry; the owner must exist, or the garbage collector deletes the pod).
#[allow(clippy::too_many_arguments)]
pub async fn running_pod_with(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    container: &str,
    cid: &str,
    labels: serde_json::Value,
    owner: Option<serde_json::Value>,
) -> String {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), namespace);
    let owners: Vec<serde_json::Value> = owner.into_iter().collect();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": container, "image": "registry.invalid/neuron-app:1"}]
        }
    }))
    .expect("pod");
    // The namespace's default ServiceAccount, which admission wants, appears a moment
    // after the namespace.
    let created = neuron_e2e::wait_for(std::time::Duration::from_secs(30), || async {
        api.create(&kube::api::PostParams::default(), &pod).await.ok()
    })
    .await
    .unwrap_or_else(|| panic!("could not create pod {namespace}/{name}"));
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "containerStatuses": [{
            "name": container, "containerID": format!("containerd://{cid}"),
            "image": "registry.invalid/neuron-app:1", "imageID": "", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        }]
    }});
    api.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("set the pod's status");
    created.metadata.uid.expect("pod uid")
}

/// A node with two teams' applications, attributed through the real API server, a test
/// kubelet and a fake /proc: team `a`'s pod `train` (container `main`, application tag
/// `train`) holds devices 0 and 1 and uses cores 0-2 at 80 %; team `b`'s pod `serve`
/// (container `srv`, tag `serve`) holds cores 4 and 5 and uses core 4 at 50 %.
pub struct TwoTeams {
    pub node: String,
    pub a: String,
    pub b: String,
    pub proc: FakeProc,
    pub kubelet: PodResourcesServer,
    _dir: TempDir,
    /// The simulated applications' PIDs are `pid_base + 1` (train) and `+ 2` (serve).
    pid_base: u32,
}

impl TwoTeams {
    /// Namespaces `<prefix>-a-…` and `<prefix>-b-…`; `pid_base` keeps tests' fake PIDs apart.
    pub fn start(rt: &tokio::runtime::Runtime, prefix: &str, pid_base: u32) -> TwoTeams {
        use neuron_node_agent::attribution::podresources::{NEURONCORE, NEURONDEVICE};
        let cp = neuron_e2e::ControlPlane::shared();
        let node = format!("neuron-node-{:08x}", neuron_e2e::random_u32());
        let (a, b) = rt.block_on(async {
            (cp.namespace(&format!("{prefix}-a")).await, cp.namespace(&format!("{prefix}-b")).await)
        });
        let client = rt.block_on(cp.client());
        let (cid_a, cid_b) = (container_id(pid_base + 0xa), container_id(pid_base + 0xb));
        let uid_a = rt.block_on(running_pod(&client, &a, "train", &node, "main", &cid_a));
        let uid_b = rt.block_on(running_pod(&client, &b, "serve", &node, "srv", &cid_b));
        let proc = FakeProc::new();
        proc.process(pid_base + 1, &containerd_cgroup(&uid_a, &cid_a));
        proc.process(pid_base + 2, &containerd_cgroup(&uid_b, &cid_b));
        let dir = TempDir::new("kubelet");
        let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
        kubelet.set(vec![
            holding(&a, "train", "main", NEURONDEVICE, &[0, 1]),
            holding(&b, "serve", "srv", NEURONCORE, &[4, 5]),
        ]);
        TwoTeams { node, a, b, proc, kubelet, _dir: dir, pid_base }
    }

    /// The simulator's arguments: a trn1.32xlarge, the two applications, ECC events.
    pub fn sim_args(&self) -> Vec<String> {
        vec![
            "--instance-type=trn1.32xlarge".to_owned(),
            format!("--app=tag=train,cores=0-2,util=80,rps=20,pid={}", self.pid_base + 1),
            format!("--app=tag=serve,cores=4,util=50,rps=40,pid={}", self.pid_base + 2),
            "--ecc-every=1".to_owned(),
        ]
    }

    /// The agent's arguments: this node, its fake /proc and kubelet.
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--node-name".to_owned(),
            self.node.clone(),
            "--proc-root".to_owned(),
            self.proc.root().display().to_string(),
            "--pod-resources-socket".to_owned(),
            self.kubelet.socket.display().to_string(),
            "--pod-resources-interval".to_owned(),
            "300ms".to_owned(),
        ]
    }
}

/// Creates in the API server the ResourceSlice `driver` publishes for `node` (one pool,
/// named after the node, generation 1) with `devices` (the API's JSON); returns the slices'
/// API and the slice.
pub async fn create_slice(
    client: &kube::Client,
    node: &str,
    driver: &str,
    devices: Vec<serde_json::Value>,
) -> (kube::Api<kube::api::DynamicObject>, kube::api::DynamicObject) {
    use kube::api::{DynamicObject, PostParams};
    let slices = resource_slices(client);
    let slice: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}")},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .expect("a ResourceSlice");
    let created =
        slices.create(&PostParams::default(), &slice).await.expect("the API server serves resource.k8s.io/v1");
    (slices, created)
}

/// The API of `resource.k8s.io/v1` ResourceSlices (dynamic objects: the `k8s-openapi`
/// feature the workspace builds has no such type).
pub fn resource_slices(client: &kube::Client) -> kube::Api<kube::api::DynamicObject> {
    use kube::api::{ApiResource, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    kube::Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "resourceslices"))
}
