//! Which container holds which Neuron devices and cores, from the kubelet's
//! pod-resources API (gRPC `v1.PodResourcesLister/List` on a unix socket).
//!
//! The messages are written by hand with prost (only the fields read here; prost skips
//! the others) and the call is made with hyper's HTTP/2 client: a gRPC unary call is one
//! POST whose body is a 5-byte prefix (compressed flag, big-endian length) and the
//! message, answered the same way with `grpc-status` in the trailers.
//!
//! The mapping is refreshed in the background; a kubelet that stops answering leaves
//! the last known mapping in place for a bounded time, and says so in the metrics.

use std::{
    ops::Range,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::AttributionMetrics;

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` the agent uses.
pub mod proto {
    /// The gRPC method's path.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

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
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }
}

/// Extended resources of the Neuron device plugin.
pub use api::hardware::{
    NEURONCORE_RESOURCE as NEURONCORE, NEURONDEVICE_RESOURCE as NEURONDEVICE, NEURON_RESOURCE as NEURON,
};

/// A response larger than this is refused (a node with hundreds of pods and CPU sets
/// stays far below).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("connecting to {socket}: {source}")]
    Connect { socket: String, source: std::io::Error },
    #[error("HTTP/2: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the request: {0}")]
    Request(#[from] http::Error),
    #[error("HTTP status {0}")]
    Status(http::StatusCode),
    #[error("gRPC status {code}: {message}")]
    Grpc { code: String, message: String },
    #[error("reading the response: {0}")]
    Body(String),
    #[error("gRPC framing: {0}")]
    Frame(&'static str),
    #[error("decoding the response: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// A gRPC message on the wire: uncompressed flag, length, bytes.
pub fn frame(message: &[u8]) -> Result<Vec<u8>, PodResourcesError> {
    let len = u32::try_from(message.len()).map_err(|_| PodResourcesError::Frame("message over 4 GiB"))?;
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Ok(out)
}

/// The one message of a unary response body.
pub fn unframe(body: &[u8]) -> Result<&[u8], PodResourcesError> {
    let (head, rest) = body.split_at_checked(5).ok_or(PodResourcesError::Frame("body shorter than the prefix"))?;
    if head[0] != 0 {
        return Err(PodResourcesError::Frame("compressed message (none was accepted)"));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() != len {
        return Err(PodResourcesError::Frame("length prefix does not match the body"));
    }
    Ok(rest)
}

/// Calls `List` on the kubelet's socket.
pub async fn list(socket: &Path) -> Result<proto::ListPodResourcesResponse, PodResourcesError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| PodResourcesError::Connect { socket: socket.display().to_string(), source })?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    let _connection = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "pod-resources connection ended");
        }
    }));
    let body = frame(&proto::ListPodResourcesRequest {}.encode_to_vec())?;
    let request = http::Request::post(format!("http://localhost{}", proto::LIST_PATH))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    if response.status() != http::StatusCode::OK {
        return Err(PodResourcesError::Status(response.status()));
    }
    // A "trailers-only" answer carries the status in the headers.
    grpc_status(response.headers())?;
    let collected = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| PodResourcesError::Body(e.to_string()))?;
    match collected.trailers() {
        Some(trailers) if trailers.contains_key("grpc-status") => grpc_status(trailers)?,
        _ => return Err(PodResourcesError::Body("no grpc-status trailer".to_owned())),
    }
    let body = collected.to_bytes();
    Ok(proto::ListPodResourcesResponse::decode(unframe(&body)?)?)
}

fn grpc_status(headers: &http::HeaderMap) -> Result<(), PodResourcesError> {
    let text = |name: &str| headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match text("grpc-status") {
        None => Ok(()),
        Some(code) if code == "0" => Ok(()),
        Some(code) => Err(PodResourcesError::Grpc { code, message: text("grpc-message").unwrap_or_default() }),
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
}

impl Allocation {
    /// The host cores it covers; none for a device while the cores per device are unknown.
    pub fn cores(&self, cores_per_device: Option<u32>) -> Range<u32> {
        match (self.unit, cores_per_device) {
            (Unit::Core, _) => self.id..self.id.saturating_add(1),
            (Unit::Device, Some(n)) => {
                let first = self.id.saturating_mul(n);
                first..first.saturating_add(n)
            }
            (Unit::Device, None) => 0..0,
        }
    }
}

/// The Neuron allocations of a `List` answer, and the device ids that are not indices.
pub fn allocations(response: &proto::ListPodResourcesResponse) -> (Vec<Allocation>, Vec<String>) {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                let unit = match devices.resource_name.as_str() {
                    NEURONCORE => Unit::Core,
                    NEURONDEVICE | NEURON => Unit::Device,
                    _ => continue,
                };
                for id in &devices.device_ids {
                    match id.trim().parse::<u32>() {
                        Ok(id) => out.push(Allocation {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: container.name.clone(),
                            unit,
                            id,
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

/// The device allocations the kubelet last reported, shared with the report path.
#[derive(Debug, Default)]
pub struct DeviceOwnership {
    allocations: Vec<Allocation>,
    generation: u64,
}

pub type SharedDevices = Arc<RwLock<DeviceOwnership>>;

impl DeviceOwnership {
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocations
    }

    /// Changes whenever the allocations change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn set(&mut self, allocations: Vec<Allocation>) {
        if self.allocations != allocations {
            self.allocations = allocations;
            self.generation += 1;
        }
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
    pub metrics: AttributionMetrics,
}

impl KubeletPoller {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        info!(socket = %self.socket.display(), interval = ?self.interval, "polling the kubelet's pod-resources API");
        let mut last_success: Option<Instant> = None;
        let mut failing = false;
        let mut reported_unreadable: Vec<String> = Vec::new();
        loop {
            let result = match tokio::time::timeout(self.timeout, list(&self.socket)).await {
                Ok(result) => result,
                Err(_) => Err(PodResourcesError::Timeout(self.timeout)),
            };
            match result {
                Ok(response) => {
                    let (allocations, unreadable) = allocations(&response);
                    // Said once per distinct set, not on every poll.
                    if !unreadable.is_empty() && unreadable != reported_unreadable {
                        warn!(ids = ?unreadable, "Neuron device ids that are not indices are ignored");
                    }
                    reported_unreadable = unreadable;
                    if failing {
                        info!("the kubelet's pod-resources API answers again");
                    }
                    failing = false;
                    last_success = Some(Instant::now());
                    let count = allocations.len();
                    self.devices.write().unwrap_or_else(|p| p.into_inner()).set(allocations);
                    self.metrics.kubelet_requests.get_or_create(&super::ResultLabel { result: "ok" }).inc();
                    self.metrics.kubelet_up.set(1);
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                    self.metrics.kubelet_last_success.set(now.as_secs_f64());
                    debug!(allocations = count, "pod-resources listed");
                }
                Err(e) => {
                    let result = if matches!(e, PodResourcesError::Timeout(_)) { "timeout" } else { "error" };
                    self.metrics.kubelet_requests.get_or_create(&super::ResultLabel { result }).inc();
                    self.metrics.kubelet_up.set(0);
                    if !failing {
                        warn!(error = %e, socket = %self.socket.display(), keep_for = ?self.keep_for,
                              "the kubelet's pod-resources API does not answer; keeping the last known devices");
                    }
                    failing = true;
                    let expired = last_success.is_none_or(|t| t.elapsed() >= self.keep_for);
                    let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
                    if expired && !devices.allocations.is_empty() {
                        warn!("the last known device allocations are too old; cores are no longer credited by device");
                        devices.set(Vec::new());
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::*;

    fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
        ContainerDevices { resource_name: resource.to_owned(), device_ids: ids.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn framing_round_trips_and_rejects_bad_prefixes() {
        let message = ListPodResourcesResponse {
            pod_resources: vec![PodResources { name: "p".into(), namespace: "n".into(), containers: vec![] }],
        }
        .encode_to_vec();
        let framed = frame(&message).unwrap();
        assert_eq!(&framed[..5], &[0, 0, 0, 0, message.len() as u8]);
        assert_eq!(unframe(&framed).unwrap(), &message[..]);
        assert!(unframe(&framed[..3]).is_err());
        assert!(unframe(&framed[..framed.len() - 1]).is_err());
        let mut compressed = framed.clone();
        compressed[0] = 1;
        assert!(unframe(&compressed).is_err());
        assert_eq!(unframe(&frame(&[]).unwrap()).unwrap(), &[] as &[u8]);
    }

    #[test]
    fn neuron_resources_become_core_and_device_allocations() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "a".into(),
                    containers: vec![ContainerResources {
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
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        // ContainerResources.cpu_ids (3, packed int64) and a topology (3) in ContainerDevices.
        let mut bytes =
            ContainerResources { name: "c".into(), devices: vec![devices(NEURONCORE, &["0"])] }.encode_to_vec();
        bytes.extend_from_slice(&[0x1a, 0x02, 0x01, 0x02]);
        let decoded = ContainerResources::decode(&*bytes).unwrap();
        assert_eq!(decoded.devices[0].device_ids, vec!["0".to_owned()]);
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error() {
        let err = list(Path::new("/nonexistent/kubelet.sock")).await.unwrap_err();
        assert!(matches!(err, PodResourcesError::Connect { .. }), "{err}");
    }
}
