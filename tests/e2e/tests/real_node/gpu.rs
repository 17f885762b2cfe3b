//! The chart's GPU side as deployed: `gpu.enabled=true` on a GPU-only real node (a
//! g5.12xlarge of the fake NVML library: no Neuron device), the agent loading NVML through
//! the chart's read-only mount of the node's driver directory. GPUs held by pods through
//! the kubelet's device-plugin allocations (NVIDIA's ids: UUIDs, `::<n>` replicas of a
//! shared GPU) are attributed on /metrics, a GPU process to its pod, and an Xid in the
//! node's kernel log reaches the GPU's health, the Node's condition and an Event.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    api::{ListParams, PostParams},
    Api, Client,
};
use neuron_e2e::{real_node::RealNode, wait_for};
use neuron_node_agent::attribution::podresources;
use serde_json::json;

use super::{
    component_of, container_processes, containers_hold_the_charts_security_context, down_leaving_nothing_behind,
    every_pod_ready, helm_install, labels_of, metrics_answer_only_a_token_with_the_reader_role, Scraper, AGENT_PORT,
};

const TEAM: &str = "team-gpu";
/// Where the chart mounts the node's driver directory in the agent's container.
const LIBRARY: &str = "/host/nvidia-lib/libnvidia-ml.so.1";

/// One GPU of the fake library, as `nvidia-ml-fake-gpus` printed it.
#[derive(Debug, Clone, serde::Deserialize)]
struct Gpu {
    index: u32,
    uuid: String,
    pci_bus_id: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_gpu_side_runs_on_a_real_gpu_node_and_stopping_it_restores_the_machine() {
    let mut node = RealNode::up_as("g5.12xlarge").expect("a real GPU node");
    let t = &node.info.timings;
    // From the start of `up`, not of the wait for another test's node.
    let up = Duration::try_from_secs_f64(t.total_s).unwrap_or_default();
    let started = Instant::now().checked_sub(up).unwrap_or_else(Instant::now);
    eprintln!(
        "GPU node up in {:.1}s (images {:.1}s, kubelet to Ready node {:.1}s)",
        t.total_s, t.images_s, t.node_ready_s
    );
    assert_eq!(node.info.kind, "gpu", "{:?}", node.info);
    let text = std::fs::read_to_string(&node.info.gpus).expect("the fake library's GPUs");
    let gpus: Vec<Gpu> =
        serde_json::from_value(serde_json::from_str::<serde_json::Value>(&text).expect("JSON")["gpus"].clone())
            .expect("the GPU list");
    assert_eq!(gpus.len(), 4, "a g5.12xlarge has 4 A10G: {text}");
    let client = node.client().await;

    let install = Instant::now();
    helm_install(&node);
    let pods = every_pod_ready(&client).await;
    eprintln!("helm install and every pod Ready: {:.1}s", install.elapsed().as_secs_f64());
    containers_hold_the_charts_security_context(&client, &pods).await;
    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod").clone();
    the_agent_loads_nvml_through_the_read_only_driver_mount(&agent);
    let scraper = metrics_answer_only_a_token_with_the_reader_role(&client, &pods).await;
    let page = || scraper.metrics(&agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;

    // The device plugin advertises the fake's GPUs, and NVML in the agent sees the same.
    let allocatable = Api::<Node>::all(client.clone())
        .get(&node.info.node)
        .await
        .expect("the Node")
        .status
        .and_then(|s| s.allocatable)
        .unwrap_or_default();
    let count = |r: &str| allocatable.get(r).map(|q| q.0.clone()).unwrap_or_default();
    assert_eq!((count("nvidia.com/gpu"), count("nvidia.com/gpu.shared")), ("3".into(), "2".into()));
    let listed: BTreeSet<String> = gpu_series(&page(), "DCGM_FI_DEV_GPU_UTIL").into_iter().map(|s| s.uuid).collect();
    assert_eq!(listed, gpus.iter().map(|g| g.uuid.clone()).collect(), "the GPUs on /metrics");

    let held = a_pod_holding_a_gpu_is_attributed_through_the_kubelet(&client, &node, &scraper, &agent, &gpus).await;
    two_pods_sharing_a_gpu_are_each_attributed_with_their_replica(&client, &node, &scraper, &agent, &gpus).await;
    a_gpu_process_is_attributed_to_its_pod(&node, &scraper, &agent, &held).await;
    an_xid_in_the_kernel_log_reaches_the_gpu_the_node_condition_and_an_event(&client, &node, &scraper, &agent, &held)
        .await;

    down_leaving_nothing_behind(&mut node);
    eprintln!("the whole GPU test {:.1}s", started.elapsed().as_secs_f64());
}

/// The agent's process has the node's driver library mapped from the chart's mount, and
/// that mount is read-only.
fn the_agent_loads_nvml_through_the_read_only_driver_mount(agent: &Pod) {
    let pid = container_processes(agent, "agent").into_iter().next().expect("the agent's process");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(maps.contains(LIBRARY), "the agent has not loaded {LIBRARY}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let options = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/host/nvidia-lib"))
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .expect("the driver directory mounted at /host/nvidia-lib");
    assert!(options.split(',').any(|o| o == "ro"), "/host/nvidia-lib mounted {options}");
}

/// A pod holding `nvidia.com/gpu: 1`: the GPU the kubelet's pod-resources answer gives it
/// (by UUID) carries its namespace, pod and container on /metrics, and no other GPU does.
/// Returns the GPU.
async fn a_pod_holding_a_gpu_is_attributed_through_the_kubelet(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    agent: &Pod,
    gpus: &[Gpu],
) -> (Gpu, Pod) {
    let created = Instant::now();
    let pod = gpu_pod(client, node, "infer", "nvidia.com/gpu").await;
    let ids = allocated(node, "infer").await;
    assert_eq!(ids.len(), 1, "the kubelet's allocation of one GPU: {ids:?}");
    let gpu = gpus.iter().find(|g| g.uuid == ids[0]).expect("the allocated id is a GPU UUID of the fake").clone();
    container_sees(&pod, &gpu);
    let expected = BTreeSet::from([(gpu.uuid.clone(), "infer".to_owned(), String::new())]);
    let page = || scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    let seen = wait_for(Duration::from_secs(60), || {
        std::future::ready((held_by(&page(), "DCGM_FI_DEV_GPU_UTIL") == expected).then_some(()))
    })
    .await;
    let last = held_by(&page(), "DCGM_FI_DEV_GPU_UTIL");
    assert!(seen.is_some(), "the GPUs of {TEAM}/infer on /metrics {last:?}, the kubelet's {expected:?}");
    eprintln!("a pod's GPU attributed on /metrics {:.1}s after the pod was created", created.elapsed().as_secs_f64());
    (gpu, pod)
}

/// Two pods holding `nvidia.com/gpu.shared: 1` (the last GPU, time-sliced into two
/// replicas `<uuid>::0`, `::1`): that GPU's series once per pod, each with its replica.
async fn two_pods_sharing_a_gpu_are_each_attributed_with_their_replica(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    agent: &Pod,
    gpus: &[Gpu],
) {
    let created = Instant::now();
    let mut expected = BTreeSet::new();
    for name in ["share-a", "share-b"] {
        let pod = gpu_pod(client, node, name, "nvidia.com/gpu.shared").await;
        let ids = allocated(node, name).await;
        let (uuid, replica) = ids.first().and_then(|id| id.split_once("::")).expect("a replica id");
        container_sees(&pod, gpus.iter().find(|g| g.uuid == uuid).expect("a replica of a GPU of the fake"));
        expected.insert((uuid.to_owned(), name.to_owned(), replica.to_owned()));
    }
    let last = gpus.last().expect("GPUs");
    assert!(expected.iter().all(|(uuid, ..)| *uuid == last.uuid), "shared replicas not of the last GPU: {expected:?}");
    let replicas: BTreeSet<&str> = expected.iter().map(|(_, _, r)| r.as_str()).collect();
    assert_eq!(replicas, BTreeSet::from(["0", "1"]), "{expected:?}");
    let page = || scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    let shared = |page: &str| -> BTreeSet<(String, String, String)> {
        held_by(page, "DCGM_FI_DEV_GPU_UTIL").into_iter().filter(|(_, pod, _)| pod.starts_with("share-")).collect()
    };
    let seen =
        wait_for(Duration::from_secs(60), || std::future::ready((shared(&page()) == expected).then_some(()))).await;
    assert!(seen.is_some(), "the shared GPU on /metrics {:?}, the kubelet's {expected:?}", shared(&page()));
    eprintln!("two pods sharing a GPU attributed {:.1}s after they were created", created.elapsed().as_secs_f64());
}

/// The host PID of the pod's container written into the fake library's `processes` (as
/// the driver would list a CUDA process): `gpu_process_memory_used_bytes` names the pod.
async fn a_gpu_process_is_attributed_to_its_pod(node: &RealNode, scraper: &Scraper, agent: &Pod, held: &(Gpu, Pod)) {
    let (gpu, pod) = held;
    let pid = container_processes(pod, "cuda").into_iter().next().expect("the workload's process");
    let config = format!(
        "instance_type: g5.12xlarge\ngpus:\n- {{index: {0}, utilization_gpu: 64}}\nprocesses:\n- {{gpu: {0}, pid: {pid}, \
         used_memory_mib: 1234}}\n",
        gpu.index
    );
    // Replaced whole (the library re-reads the file when its size or time changes).
    let path = &node.info.nvml_config;
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, config).expect("the new fake NVML configuration");
    let written = Instant::now();
    std::fs::rename(&tmp, path).expect("replacing the fake NVML configuration");
    let page = || scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    let want = (gpu.uuid.clone(), pid.to_string(), 1234.0 * 1048576.0);
    let seen = wait_for(Duration::from_secs(30), || {
        let found = process_series(&page()).contains(&want);
        std::future::ready(found.then_some(()))
    })
    .await;
    assert!(seen.is_some(), "no process {pid} of {TEAM}/infer on /metrics: {:?}", process_series(&page()));
    eprintln!("a GPU process attributed to its pod {:.1}s after the driver listed it", written.elapsed().as_secs_f64());
}

/// `xid:79:<bus id>` on the simulated driver's control file: an NVIDIA Xid record in the
/// kernel log the agent reads; the held GPU `unhealthy` on /metrics, the Node's `GpuHealth`
/// True with XID_79, an Event naming the pod.
async fn an_xid_in_the_kernel_log_reaches_the_gpu_the_node_condition_and_an_event(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    agent: &Pod,
    held: &(Gpu, Pod),
) {
    let gpu = &held.0;
    let page = || scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    let state = |page: &str| {
        gpu_series(page, "gpu_health_state")
            .into_iter()
            .filter(|s| s.uuid == gpu.uuid && s.value == 1.0)
            .map(|s| s.state)
            .collect::<Vec<_>>()
    };
    assert_eq!(state(&page()), ["healthy"], "GPU {} before the Xid", gpu.uuid);
    // The Xid can come only through the kernel log: the fake's NVML event set has none.
    let kmsg = page().lines().any(|l| l == "neuron_agent_health_source_up{source=\"kmsg\"} 1");
    assert!(kmsg, "the agent does not read the node's kernel log (--kmsg-path /host/sys/kmsg)");
    let injected = Instant::now();
    let mut control =
        std::fs::OpenOptions::new().append(true).open(&node.info.health_control).expect("the control file");
    std::io::Write::write_all(&mut control, format!("xid:79:{}\n", gpu.pci_bus_id).as_bytes()).expect("an Xid");
    let unhealthy =
        wait_for(Duration::from_secs(30), || std::future::ready((state(&page()) == ["unhealthy"]).then_some(()))).await;
    assert!(unhealthy.is_some(), "GPU {} after the Xid: {:?}", gpu.uuid, state(&page()));
    eprintln!("an Xid in the kernel log: the GPU unhealthy on /metrics {:.1}s later", injected.elapsed().as_secs_f64());

    let nodes: Api<Node> = Api::all(client.clone());
    let condition = wait_for(Duration::from_secs(30), || {
        let (nodes, name) = (nodes.clone(), node.info.node.clone());
        async move {
            let status = nodes.get_status(&name).await.ok()?.status?;
            status.conditions?.into_iter().find(|c| c.type_ == "GpuHealth" && c.status == "True")
        }
    })
    .await
    .expect("the Node's GpuHealth condition True");
    assert_eq!(condition.reason.as_deref(), Some("XID_79"), "{condition:?}");
    assert!(condition.message.as_deref().unwrap_or("").contains(&gpu.uuid), "{condition:?}");

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let event = wait_for(Duration::from_secs(30), || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            list.into_iter().find(|e| e.reason.as_deref().is_some_and(|r| r.contains("XID_79")))
        }
    })
    .await
    .expect("an Event of the Xid");
    let note = event.note.clone().unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{event:?}");
    assert!(note.contains(&format!("{TEAM}/infer")), "the Event names no pod holding the GPU: {note}");
    eprintln!("the Node condition and the Event {:.1}s after the Xid", injected.elapsed().as_secs_f64());
}

/// Creates pod TEAM/name holding one `resource`, running the pause image as non-root;
/// waits until it runs.
async fn gpu_pod(client: &Client, node: &RealNode, name: &str, resource: &str) -> Pod {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({ "metadata": { "name": TEAM } })).expect("a Namespace");
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda",
                "image": node.info.images.pause,
                "imagePullPolicy": "Never",
                "resources": { "limits": { resource: "1" } },
                "securityContext": { "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                     "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] } },
            }],
        },
    }))
    .expect("a Pod");
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    api.create(&PostParams::default(), &pod).await.expect("creating the GPU pod");
    let running = wait_for(Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let pod = api.get(name).await.ok()?;
            (pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(pod)
        }
    })
    .await;
    let last = api.get(name).await.ok().and_then(|p| p.status);
    running.unwrap_or_else(|| panic!("GPU pod {TEAM}/{name} never ran: {last:?}"))
}

/// What the device plugin's Allocate gave the pod's container, seen from the host: the
/// GPU's UUID alone in NVIDIA_VISIBLE_DEVICES (a replica is its GPU), its device node.
fn container_sees(pod: &Pod, gpu: &Gpu) {
    let pid = container_processes(pod, "cuda").into_iter().next().expect("the pod's process");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let visible = environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"NVIDIA_VISIBLE_DEVICES="))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    assert_eq!(visible.as_deref(), Some(gpu.uuid.as_str()), "NVIDIA_VISIBLE_DEVICES of process {pid}");
    let node = format!("/proc/{pid}/root/dev/nvidia{}", gpu.index);
    assert!(std::path::Path::new(&node).exists(), "{node} missing in the container");
}

/// The NVIDIA device ids the kubelet's pod-resources answer gives pod TEAM/name.
async fn allocated(node: &RealNode, name: &str) -> Vec<String> {
    let socket = node.info.kubelet_root.join("pod-resources/kubelet.sock");
    let answer = podresources::list(&socket).await.expect("the kubelet's pod-resources answer");
    answer
        .pod_resources
        .iter()
        .filter(|p| p.namespace == TEAM && p.name == name)
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.devices)
        .filter(|d| d.resource_name.starts_with("nvidia.com/"))
        .flat_map(|d| d.device_ids.clone())
        .collect()
}

/// A GPU series of a /metrics page.
#[derive(Debug)]
struct Series {
    uuid: String,
    state: String,
    namespace: String,
    pod: String,
    container: String,
    vgpu: String,
    value: f64,
}

fn gpu_series(page: &str, family: &str) -> Vec<Series> {
    let prefix = format!("{family}{{");
    page.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_once("} "))
        .map(|(labels, value)| {
            let l = labels_of(labels);
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            Series {
                uuid: get("UUID"),
                state: get("state"),
                namespace: get("namespace"),
                pod: get("pod"),
                container: get("container"),
                vgpu: get("vgpu"),
                value: value.trim().parse().unwrap_or(f64::NAN),
            }
        })
        .collect()
}

/// The series of `family` held by a pod of TEAM (container `cuda`), as (UUID, pod, vgpu).
fn held_by(page: &str, family: &str) -> BTreeSet<(String, String, String)> {
    gpu_series(page, family)
        .into_iter()
        .filter(|s| s.namespace == TEAM && s.container == "cuda")
        .map(|s| (s.uuid, s.pod, s.vgpu))
        .collect()
}

/// `gpu_process_memory_used_bytes` of TEAM/infer's container, as (UUID, pid, bytes).
fn process_series(page: &str) -> Vec<(String, String, f64)> {
    page.lines()
        .filter_map(|line| line.strip_prefix("gpu_process_memory_used_bytes{"))
        .filter_map(|rest| rest.split_once("} "))
        .map(|(labels, value)| (labels_of(labels), value.trim().parse().unwrap_or(f64::NAN)))
        .filter(|(l, _)| {
            let get = |k: &str| l.get(k).map(String::as_str);
            (get("namespace"), get("pod"), get("container")) == (Some(TEAM), Some("infer"), Some("cuda"))
        })
        .map(|(l, v)| (l.get("UUID").cloned().unwrap_or_default(), l.get("pid").cloned().unwrap_or_default(), v))
        .collect()
}
