//! Pod attribution of the real agent binary, with the simulator as neuron-monitor, Pod
//! objects in the real test API server (`neuron-e2e`'s control plane; no kubelet runs, so
//! container statuses are written through the status subresource), a test kubelet
//! pod-resources server on a unix socket, and a fake `/proc` placing the simulated
//! applications' PIDs in the pods' cgroups.

mod support;

use std::{collections::BTreeMap, ffi::OsStr, path::Path, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{api::DeleteParams, Api};
use neuron_e2e::{random_u32, ControlPlane};
use neuron_node_agent::attribution::podresources::{self, proto::ContainerDevices, NEURON, NEURONCORE, NEURONDEVICE};
use support::{
    kubelet::{
        claiming, container_id, containerd_cgroup, create_slice, holding, holding_ids, running_pod, stat_line,
        FakeProc, PodResourcesServer,
    },
    Agent, Metrics, Prometheus, TempDir,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Core series of `tag` (or of idle cores when `None`) as (core, namespace).
fn cores(m: &Metrics, tag: Option<&str>) -> BTreeMap<u32, String> {
    m.samples
        .iter()
        .filter(|s| s.name == "neuroncore_utilization_ratio" && s.labels.get("runtime_tag").map(String::as_str) == tag)
        .map(|s| {
            let core = s.labels["neuroncore"].parse().expect("core index");
            (core, s.labels.get("namespace").cloned().unwrap_or_default())
        })
        .collect()
}

fn label<'m>(m: &'m Metrics, name: &str, tag: &str, key: &str) -> Option<&'m str> {
    let sample = m.find(name, &[("runtime_tag", tag)]).into_iter().next()?;
    sample.labels.get(key).map(String::as_str)
}

/// `promtool check metrics` finds nothing but the one accepted compatibility name.
fn promtool_accepts(exposition: &str) {
    let complaints = support::promtool_complaints(exposition);
    assert!(complaints.iter().all(|c| c == support::ACCEPTED_LINT), "promtool: {complaints:#?}");
}

struct Scene {
    node: String,
    a: String,
    b: String,
    kubelet: PodResourcesServer,
    proc: FakeProc,
    _dir: TempDir,
}

/// Two pods in two namespaces on one node: `train` (process 4101) in namespace `a` holds
/// Neuron devices 0 and 1 (cores 0-3) and runs on cores 0-2; `serve` (process 4102) in
/// namespace `b` holds cores 4 and 5 and runs on core 4.
fn scene(rt: &tokio::runtime::Runtime, cp: &ControlPlane) -> Scene {
    let node = format!("neuron-node-{:08x}", random_u32());
    let (a, b) = rt.block_on(async { (cp.namespace("attr-a").await, cp.namespace("attr-b").await) });
    let client = rt.block_on(cp.client());
    let (cid_a, cid_b) = (container_id(0xa1), container_id(0xb1));
    let uid_a = rt.block_on(running_pod(&client, &a, "train", &node, "main", &cid_a));
    let uid_b = rt.block_on(running_pod(&client, &b, "serve", &node, "srv", &cid_b));
    let proc = FakeProc::new();
    proc.process(4101, &containerd_cgroup(&uid_a, &cid_a));
    proc.process(4102, &containerd_cgroup(&uid_b, &cid_b));
    proc.file(4101, "stat", &stat_line(4101, "train", (100, 10), 8, 100));
    proc.file(4102, "stat", &stat_line(4102, "serve", (100, 10), 4, 100));
    let dir = TempDir::new("kubelet");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    kubelet.set(vec![
        holding(&a, "train", "main", NEURONDEVICE, &[0, 1]),
        holding(&b, "serve", "srv", NEURONCORE, &[4, 5]),
    ]);
    Scene { node, a, b, kubelet, proc, _dir: dir }
}

const APPS: &[&str] = &[
    "--instance-type=trn1.32xlarge",
    "--app=tag=train,cores=0-2,util=80,pid=4101",
    "--app=tag=serve,cores=4,util=50,pid=4102",
];

fn start_agent(cp: &ControlPlane, scene: &Scene, socket: &Path) -> Agent {
    start_agent_with(cp, scene, socket, APPS)
}

fn start_agent_with(cp: &ControlPlane, scene: &Scene, socket: &Path, apps: &[&str]) -> Agent {
    let mut args = node_args(&scene.node, &scene.proc, socket);
    args.extend(["--pod-label".to_owned(), "app".to_owned()]);
    Agent::start_with_env(support::sim(), apps, &strs(&args), &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))])
}

/// The agent's flags on a node of these tests: fast reports, its Node, the fake `/proc`
/// and the test kubelet polled every 300 ms.
fn node_args(node: &str, proc: &FakeProc, socket: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    let mut args: Vec<String> = ["--period", "500ms", "--node-name", node].map(str::to_owned).to_vec();
    args.extend(["--proc-root".to_owned(), path(proc.root()), "--pod-resources-socket".to_owned(), path(socket)]);
    args.extend(["--pod-resources-interval", "300ms"].map(str::to_owned));
    args
}

/// The agent of a GPU-only node on the fake NVML library configured by `config`: no
/// neuron-monitor is started there, so none is needed.
fn start_gpu_agent(cp: &ControlPlane, node: &str, proc: &FakeProc, socket: &Path, config: &Path) -> Agent {
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let mut args = node_args(node, proc, socket);
    args.extend(["--nvml-library".to_owned(), library.to_str().expect("utf-8 path").to_owned()]);
    let env = [("KUBECONFIG", OsStr::new(&cp.kubeconfig)), ("FAKE_NVML_CONFIG", config.as_os_str())];
    Agent::start_with_env("/nonexistent/neuron-monitor", &[], &strs(&args), &env)
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn every_application_and_core_carries_its_pod_and_prometheus_sums_by_namespace() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let scene = scene(&rt, cp);
    let agent = start_agent(cp, &scene, &scene.kubelet.socket);

    let m = agent.wait_for("both runtimes and their idle cores attributed", Duration::from_secs(30), |m| {
        let idle = cores(m, None);
        let done = label(m, "neuroncore_utilization_ratio", "train", "namespace") == Some(scene.a.as_str())
            && label(m, "neuroncore_utilization_ratio", "serve", "namespace") == Some(scene.b.as_str())
            && idle.get(&3) == Some(&scene.a)
            && idle.get(&5) == Some(&scene.b)
            && label(m, "neuron_process_threads", "train", "namespace") == Some(scene.a.as_str())
            && label(m, "neuron_process_threads", "serve", "namespace") == Some(scene.b.as_str());
        done.then(|| m.clone())
    });
    // Every series of a runtime carries its pod, container and allow-listed labels.
    for name in [
        "neuroncore_utilization_ratio",
        "neuron_runtime_memory_used_bytes",
        "execution_status_total",
        "neuron_process_threads",
    ] {
        assert_eq!(label(&m, name, "train", "pod"), Some("train"), "{name}");
        assert_eq!(label(&m, name, "train", "container"), Some("main"), "{name}");
        assert_eq!(label(&m, name, "train", "label_app"), Some("train"), "{name}");
        assert_eq!(label(&m, name, "serve", "namespace"), Some(scene.b.as_str()), "{name}");
        assert_eq!(label(&m, name, "serve", "container"), Some("srv"), "{name}");
    }
    assert_eq!(cores(&m, Some("train")).into_keys().collect::<Vec<_>>(), vec![0, 1, 2]);
    // Idle cores: 3 held by train, 5 by serve, the other 26 by nobody.
    let idle = cores(&m, None);
    assert_eq!(idle.len(), 32 - 4);
    assert_eq!(idle.values().filter(|ns| ns.is_empty()).count(), 26, "{idle:?}");
    assert_eq!(m.value("neuron_agent_runtimes_attributed", &[("source", "process")]), Some(2.0));
    assert_eq!(m.value("neuron_agent_kubelet_up", &[]), Some(1.0));
    assert_eq!(m.value("neuron_agent_attribution_disagreements_total", &[]), Some(0.0));
    assert_eq!(m.value("neuron_agent_pods", &[]), Some(2.0));
    // This kubelet does not say what can be allocated: no allocation counts are made up.
    assert_eq!(m.value("neuron_node_neuroncores", &[("state", "allocatable")]), None);

    promtool_accepts(&m.text);

    // A real Prometheus: each namespace gets exactly its load.
    let prometheus = Prometheus::start(&[agent.addr]);
    let by_namespace =
        prometheus.wait_for("sum by (namespace) (neuroncore_utilization_ratio)", Duration::from_secs(30), |r| {
            (r.len() == 3).then(|| r.to_vec())
        });
    let load = |ns: &str| {
        by_namespace
            .iter()
            .find(|(l, _)| l.get("namespace").map(String::as_str).unwrap_or("") == ns)
            .map(|(_, v)| *v)
            .unwrap_or(f64::NAN)
    };
    assert!((load(&scene.a) - 3.0 * 0.8).abs() < 1e-9, "{by_namespace:?}");
    assert!((load(&scene.b) - 0.5).abs() < 1e-9, "{by_namespace:?}");
    assert_eq!(load(""), 0.0, "{by_namespace:?}");

    // serve's pod is deleted; the kubelet still lists its devices: nothing is credited to it.
    let client = rt.block_on(cp.client());
    let api: Api<Pod> = Api::namespaced(client, &scene.b);
    rt.block_on(api.delete("serve", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }))
        .expect("delete the pod");
    let m = agent.wait_for("serve's labels gone", Duration::from_secs(20), |m| {
        (label(m, "neuroncore_utilization_ratio", "serve", "namespace").is_none()).then(|| m.clone())
    });
    assert!(cores(&m, None).values().all(|ns| *ns != scene.b), "no idle core credited to a deleted pod");
    assert_eq!(label(&m, "neuroncore_utilization_ratio", "train", "namespace"), Some(scene.a.as_str()));
    assert_eq!(m.value("neuron_agent_runtimes_unattributed", &[("reason", "pod_unknown")]), Some(1.0));
}

/// The device plugin advertises every device and core of the trn1.32xlarge (16 devices,
/// 2 cores each, under all three resource names, as AWS's plugin does); `train` holds
/// devices 0 and 1 and uses cores 0-2 at 80 %, `serve` holds cores 4 and 5 and uses 4 at
/// 50 %: cores 3 and 5 are allocated but idle once the (1 s) window has passed, and stop
/// counting when their pods give them back.
#[test]
fn allocatable_allocated_and_idle_cores_per_node_and_device() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let scene = scene(&rt, cp);
    let advertised = |resource: &str, count: u32| ContainerDevices {
        resource_name: resource.to_owned(),
        device_ids: (0..count).map(|i| i.to_string()).collect(),
    };
    scene.kubelet.set_allocatable(Some(vec![
        advertised(NEURONDEVICE, 16),
        advertised(NEURON, 16),
        advertised(NEURONCORE, 32),
        ContainerDevices { resource_name: "vpc.amazonaws.com/efa".into(), device_ids: vec!["rdmap16s27".into()] },
    ]));
    let mut args = node_args(&scene.node, &scene.proc, &scene.kubelet.socket);
    args.extend(["--idle-core-window", "1s", "--idle-core-utilization", "5"].map(str::to_owned));
    let env = [("KUBECONFIG", OsStr::new(&cp.kubeconfig))];
    let agent = Agent::start_with_env(support::sim(), APPS, &strs(&args), &env);

    let cores_in = |m: &Metrics, state: &str| m.value("neuron_node_neuroncores", &[("state", state)]);
    let m = agent.wait_for("two allocated cores idle", Duration::from_secs(30), |m| {
        (cores_in(m, "allocated_idle") == Some(2.0)).then(|| m.clone())
    });
    assert_eq!(cores_in(&m, "allocatable"), Some(32.0));
    assert_eq!(cores_in(&m, "allocated"), Some(6.0));
    let devices_in = |state: &str| m.value("neuron_node_neuron_devices", &[("state", state)]);
    assert_eq!((devices_in("allocatable"), devices_in("allocated")), (Some(16.0), Some(3.0)));
    let device = |index: &str, state: &str| {
        m.value("neuron_device_neuroncores", &[("neuron_device_index", index), ("state", state)])
    };
    // Device 1 (cores 2, 3): train uses 2, not 3; device 2 (cores 4, 5): serve uses 4.
    assert_eq!((device("0", "allocated"), device("0", "allocated_idle")), (Some(2.0), Some(0.0)));
    assert_eq!((device("1", "allocated"), device("1", "allocated_idle")), (Some(2.0), Some(1.0)));
    assert_eq!((device("2", "allocated"), device("2", "allocated_idle")), (Some(2.0), Some(1.0)));
    assert_eq!((device("15", "allocatable"), device("15", "allocated")), (Some(2.0), Some(0.0)));
    promtool_accepts(&m.text);

    // The dashboard's allocation queries (which the chart test's agents, without a
    // kubelet, cannot answer) answer from a real Prometheus.
    let prometheus = Prometheus::start(&[agent.addr]);
    let dashboard = neuron_e2e::dashboard::load();
    let queries: Vec<(String, String)> = neuron_e2e::dashboard::queries(&dashboard)
        .into_iter()
        .filter(|(_, expr)| neuron_e2e::dashboard::needs_kubelet(expr))
        .collect();
    assert!(queries.len() >= 3, "{queries:?}");
    for (title, expr) in queries {
        let promql = neuron_e2e::dashboard::expand(&expr);
        let answer = prometheus.wait_for(&promql, Duration::from_secs(30), |r| (!r.is_empty()).then(|| r.to_vec()));
        eprintln!("{title}: {promql} → {answer:?}");
    }

    // train finishes: the kubelet lists only serve; its core 5 stays idle.
    scene.kubelet.set(vec![holding(&scene.b, "serve", "srv", NEURONCORE, &[4, 5])]);
    let m = agent.wait_for("train's cores given back", Duration::from_secs(30), |m| {
        (cores_in(m, "allocated") == Some(2.0)).then(|| m.clone())
    });
    assert_eq!(cores_in(&m, "allocated_idle"), Some(1.0));
    assert_eq!(cores_in(&m, "allocatable"), Some(32.0));
    assert_eq!(m.value("neuron_node_neuron_devices", &[("state", "allocated")]), Some(1.0));
}

/// The scene with its kubelet stopped, and the path where its socket is missing.
fn scene_without_kubelet(rt: &tokio::runtime::Runtime, cp: &ControlPlane) -> (Scene, std::path::PathBuf) {
    let mut scene = scene(rt, cp);
    scene.kubelet.stop();
    let missing = scene._dir.0.join("kubelet.sock");
    assert!(!missing.exists());
    (scene, missing)
}

#[test]
fn without_the_kubelet_the_agent_keeps_running_and_says_so() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let (scene, missing) = scene_without_kubelet(&rt, cp);
    let agent = start_agent(cp, &scene, &missing);

    // Processes are still attributed; cores no runtime uses are not.
    let m = agent.wait_for("attribution by process without the kubelet", Duration::from_secs(60), |m| {
        let reports = m.sum("neuron_agent_reports_total", &[]);
        let done =
            reports >= 3.0 && label(m, "neuroncore_utilization_ratio", "train", "namespace") == Some(scene.a.as_str());
        done.then(|| m.clone())
    });
    assert_eq!(m.value("neuron_agent_kubelet_up", &[]), Some(0.0));
    assert!(m.sum("neuron_agent_kubelet_requests_total", &[("result", "error")]) >= 1.0);
    assert_eq!(m.value("neuron_agent_kubelet_last_success_timestamp_seconds", &[]), Some(0.0));
    assert!(cores(&m, None).values().all(String::is_empty));
    assert_eq!(agent.get("/readyz").map(|r| r.0), Some(200));

    // The kubelet comes up: idle cores get their pods; it goes away again: the last
    // known mapping stays, and the metrics say the kubelet is down.
    let kubelet = PodResourcesServer::start(&missing);
    kubelet.set(vec![holding(&scene.a, "train", "main", NEURONDEVICE, &[0, 1])]);
    agent.wait_for("the kubelet seen", Duration::from_secs(20), |m| {
        (m.value("neuron_agent_kubelet_up", &[]) == Some(1.0) && cores(m, None).get(&3) == Some(&scene.a)).then_some(())
    });
    drop(kubelet);
    let m = agent.wait_for("the kubelet gone", Duration::from_secs(20), |m| {
        (m.value("neuron_agent_kubelet_up", &[]) == Some(0.0)).then(|| m.clone())
    });
    assert!(m.value("neuron_agent_kubelet_last_success_timestamp_seconds", &[]).unwrap_or(0.0) > 0.0);
    let reports = m.sum("neuron_agent_reports_total", &[]);
    let m = agent.wait_for("more reports", Duration::from_secs(10), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= reports + 2.0).then(|| m.clone())
    });
    assert_eq!(cores(&m, None).get(&3), Some(&scene.a), "the last known mapping stays");
    assert_eq!(agent.get("/healthz").map(|r| r.0), Some(200));
}

/// Where the kubelet's socket is not mounted, the agent asks neuron-monitor for its
/// `neuron_k8s_info` and credits devices by it, with the same rules: `train`'s process is
/// not readable (PID 4109 has no `/proc` entry), so its cores say whose it is; `serve`'s
/// process is in pod `serve`, while neuron-monitor lists its core under `train`: the
/// process wins, and the disagreement is counted.
#[test]
fn without_the_kubelet_socket_neuron_monitor_says_who_holds_the_devices() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let (scene, missing) = scene_without_kubelet(&rt, cp);
    let listed_as_train = format!("pod={}/train/main", scene.a);
    let apps = [
        "--instance-type=trn1.32xlarge".to_owned(),
        format!("--app=tag=train,cores=0-2,util=80,pid=4109,{listed_as_train}"),
        format!("--app=tag=serve,cores=4,util=50,pid=4102,{listed_as_train}"),
    ];
    let apps: Vec<&str> = apps.iter().map(String::as_str).collect();
    let agent = start_agent_with(cp, &scene, &missing, &apps);

    let m = agent.wait_for("both runtimes attributed", Duration::from_secs(60), |m| {
        let done = label(m, "neuroncore_utilization_ratio", "train", "namespace") == Some(scene.a.as_str())
            && label(m, "neuroncore_utilization_ratio", "serve", "namespace") == Some(scene.b.as_str())
            && m.value("neuron_agent_attribution_disagreements_total", &[]) == Some(1.0);
        done.then(|| m.clone())
    });
    for name in ["neuroncore_utilization_ratio", "neuron_runtime_memory_used_bytes", "execution_status_total"] {
        assert_eq!(label(&m, name, "train", "pod"), Some("train"), "{name}");
        assert_eq!(label(&m, name, "train", "container"), Some("main"), "{name}");
        assert_eq!(label(&m, name, "serve", "pod"), Some("serve"), "{name}: the process wins");
    }
    assert_eq!(m.value("neuron_agent_runtimes_attributed", &[("source", "devices")]), Some(1.0));
    assert_eq!(m.value("neuron_agent_runtimes_attributed", &[("source", "process")]), Some(1.0));
    assert_eq!(m.value("neuron_agent_device_source", &[("source", "neuron_monitor")]), Some(1.0));
    assert_eq!(m.value("neuron_agent_device_source", &[("source", "kubelet")]), Some(0.0));
    assert_eq!(m.value("neuron_agent_kubelet_up", &[]), Some(0.0));
    assert!(cores(&m, None).values().all(String::is_empty), "no idle core is listed by neuron-monitor");
    promtool_accepts(&m.text);
}

#[test]
fn the_client_reads_the_test_kubelet() {
    let dir = TempDir::new("kubelet-client");
    let server = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    server.set(vec![holding("a", "train", "main", NEURONDEVICE, &[3]), holding("b", "serve", "srv", NEURONCORE, &[7])]);
    let response = runtime().block_on(podresources::list(&server.socket)).expect("List");
    let (allocations, unreadable) = podresources::allocations(&response);
    assert!(unreadable.is_empty());
    let cores: Vec<(String, Vec<u32>)> =
        allocations.iter().map(|a| (a.pod.clone(), a.cores(Some(2)).collect())).collect();
    assert_eq!(cores, vec![("serve".to_owned(), vec![7]), ("train".to_owned(), vec![6, 7])]);
    assert_eq!(server.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn the_last_known_mapping_outlives_the_kubelet_for_a_bounded_time() {
    use neuron_node_agent::{
        attribution::{
            gpus::GpuHolding,
            podresources::{DeviceOwnership, KubeletPoller},
            pods::{PodIndex, PodLabelKeys},
            AttributionMetrics,
        },
        gpu::GpuSnapshot,
    };
    use std::sync::{Arc, RwLock};

    let dir = TempDir::new("kubelet-keep");
    let mut server = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    const GPU: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
    server.set(vec![
        holding("a", "train", "main", NEURONCORE, &[0, 1]),
        holding_ids("a", "train", "main", "nvidia.com/gpu", &[GPU.to_owned()]),
    ]);
    // The pod, and a GPU collector that has not collected yet (a GPU- id is taken as it is).
    let mut pods = PodIndex::new(PodLabelKeys::new::<&str>(&[]));
    let train: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "0a0a0a0a-0000-4000-8000-000000000000", "namespace": "a", "name": "train"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"}
    }))
    .expect("a pod");
    pods.replace(&[train]);
    let devices = Arc::new(RwLock::new(DeviceOwnership::default()));
    let metrics = AttributionMetrics::default();
    let poller = KubeletPoller {
        socket: server.socket.clone(),
        interval: Duration::from_millis(50),
        timeout: Duration::from_secs(1),
        keep_for: Duration::from_millis(1500),
        devices: devices.clone(),
        gpus: GpuHolding::new(Arc::new(RwLock::new(pods)), metrics.clone()),
        dra_wanted: tokio::sync::watch::Sender::new(false),
        claimed: tokio::sync::watch::Sender::new(Arc::default()),
        metrics: metrics.clone(),
    };
    let (_collections, snapshot) = tokio::sync::watch::channel(Arc::new(GpuSnapshot::default()));
    let gpu_holders = poller.gpus.follow(snapshot);
    let rt = runtime();
    let shutdown = tokio_util::sync::CancellationToken::new();
    rt.spawn(poller.run(shutdown.clone()));
    let count = || devices.read().expect("lock").allocations().len();
    let gpus_held = || gpu_holders.lock().expect("lock").values().map(Vec::len).sum::<usize>();
    let wait = |what: &str, limit: Duration, check: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !check() {
            assert!(start.elapsed() < limit, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    };
    wait("the allocations are read", Duration::from_secs(10), &|| {
        count() == 2 && gpus_held() == 1 && metrics.kubelet_up.get() == 1
    });
    server.stop();
    wait("the kubelet is seen down", Duration::from_secs(10), &|| metrics.kubelet_up.get() == 0);
    assert_eq!(count(), 2, "the last known mapping stays while the kubelet is down");
    assert_eq!(gpus_held(), 1, "the GPUs' holders too");
    let gone_after = wait("the mapping expires", Duration::from_secs(10), &|| count() == 0);
    assert!(gone_after >= Duration::from_millis(800), "expired too early: {gone_after:?}");
    assert_eq!(gpus_held(), 0, "the GPUs' holders expire with it");
    shutdown.cancel();
}

/// An NVIDIA GPU node (the project's fake NVML library, 4 × A10G): `train` holds GPU 0 by
/// its UUID and runs process 4201 on it; `share-0` and `share-1` hold replicas `::0` and
/// `::1` of GPU 1, time-sliced, and `share-1` runs process 4202 on it; `train` also lists
/// a GPU this node does not have. Each GPU's series carry the pods holding it, one series
/// per pod on the shared GPU, and each process's series its own pod.
#[test]
fn the_pods_holding_each_gpu_and_running_each_gpu_process() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let node = format!("gpu-node-{:08x}", random_u32());
    let ns = rt.block_on(cp.namespace("attr-gpu"));
    let client = rt.block_on(cp.client());
    let mut uids = BTreeMap::new();
    for (n, pod) in ["train", "share-0", "share-1"].into_iter().enumerate() {
        let cid = container_id(0x6a0 + n as u32);
        let uid = rt.block_on(running_pod(&client, &ns, pod, &node, "main", &cid));
        uids.insert(pod, (uid, cid));
    }
    let proc = FakeProc::new();
    proc.process(4201, &containerd_cgroup(&uids["train"].0, &uids["train"].1));
    proc.process(4202, &containerd_cgroup(&uids["share-1"].0, &uids["share-1"].1));
    let dir = TempDir::new("gpu-attr");
    let config = dir.0.join("nvml.yaml");
    std::fs::write(
        &config,
        "instance_type: g5.12xlarge\n\
         gpus: [{index: 0, utilization_gpu: 70}, {index: 1, utilization_gpu: 30}]\n\
         processes:\n\
         - {gpu: 0, pid: 4201, used_memory_mib: 2000}\n\
         - {gpu: 1, pid: 4202, used_memory_mib: 500}\n\
         - {gpu: 1, pid: 4203, used_memory_mib: 100}\n",
    )
    .expect("write the fake NVML configuration");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    let agent = start_gpu_agent(cp, &node, &proc, &kubelet.socket, &config);

    // The device plugin names GPUs by the UUIDs NVML gives.
    let uuids = agent.wait_for("the GPUs collected", Duration::from_secs(30), |m| {
        let uuid = |gpu: &str| {
            let sample = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", gpu)]).into_iter().next()?;
            sample.labels.get("UUID").cloned()
        };
        Some((uuid("0")?, uuid("1")?))
    });
    let unknown = "GPU-ffffffff-0000-4000-8000-000000000000".to_owned();
    kubelet.set(vec![
        holding_ids(&ns, "train", "main", "nvidia.com/gpu", &[uuids.0.clone(), unknown]),
        holding_ids(&ns, "share-0", "main", "nvidia.com/gpu", &[format!("{}::0", uuids.1)]),
        holding_ids(&ns, "share-1", "main", "nvidia.com/gpu", &[format!("{}::1", uuids.1)]),
    ]);
    let util = |m: &Metrics, gpu: &str| -> Vec<(String, String, String)> {
        let series = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", gpu)]).into_iter().map(|s| {
            let get = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            (get("pod"), get("container"), get("vgpu"))
        });
        series.collect()
    };
    let m = agent.wait_for("the GPUs and processes attributed", Duration::from_secs(30), |m| {
        let done = util(m, "0").first().is_some_and(|(pod, _, _)| pod == "train")
            && util(m, "1").len() == 2
            && m.value("gpu_process_memory_used_bytes", &[("pid", "4202"), ("pod", "share-1")]).is_some();
        done.then(|| m.clone())
    });
    assert_eq!(util(&m, "0"), vec![("train".into(), "main".into(), String::new())]);
    assert_eq!(m.value("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0"), ("namespace", &ns)]), Some(70.0));
    let mut shared = util(&m, "1");
    shared.sort();
    assert_eq!(
        shared,
        vec![("share-0".into(), "main".into(), "0".into()), ("share-1".into(), "main".into(), "1".into())]
    );
    // Both pods see the shared GPU's one value.
    assert_eq!(m.sum("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "1"), ("namespace", &ns)]), 60.0);
    // The GPUs no pod holds have one series without a pod.
    for gpu in ["2", "3"] {
        assert_eq!(util(&m, gpu), vec![(String::new(), String::new(), String::new())], "GPU {gpu}");
    }
    // Each process's series carries its own pod; one in no pod carries none.
    let train = m.find("gpu_process_memory_used_bytes", &[("pid", "4201")]);
    assert_eq!(train.len(), 1, "{train:?}");
    assert_eq!(train[0].labels.get("UUID"), Some(&uuids.0));
    assert_eq!(train[0].labels.get("namespace"), Some(&ns));
    assert_eq!(train[0].labels.get("container").map(String::as_str), Some("main"));
    assert_eq!(train[0].value, 2000.0 * 1024.0 * 1024.0);
    assert_eq!(m.value("gpu_process_memory_used_bytes", &[("pid", "4202"), ("gpu", "1")]), Some(500.0 * 1048576.0));
    let host = m.find("gpu_process_memory_used_bytes", &[("pid", "4203")]);
    assert!(host.len() == 1 && !host[0].labels.contains_key("pod"), "{host:?}");
    // The GPU this node does not have is counted once, however many answers list it.
    let polls = kubelet.calls.load(std::sync::atomic::Ordering::Relaxed);
    let m = agent.wait_for("more kubelet answers", Duration::from_secs(10), |m| {
        (kubelet.calls.load(std::sync::atomic::Ordering::Relaxed) >= polls + 3).then(|| m.clone())
    });
    assert_eq!(m.value("neuron_agent_gpu_device_ids_unresolved_total", &[("reason", "unknown_gpu")]), Some(1.0));

    // share-0 releases its replica: GPU 1 is share-1's alone.
    kubelet.set(vec![
        holding_ids(&ns, "train", "main", "nvidia.com/gpu", std::slice::from_ref(&uuids.0)),
        holding_ids(&ns, "share-1", "main", "nvidia.com/gpu", &[format!("{}::1", uuids.1)]),
    ]);
    agent.wait_for("share-0's replica released", Duration::from_secs(20), |m| {
        (util(m, "1") == vec![("share-1".into(), "main".into(), "1".into())]).then_some(())
    });
}

/// A node whose Neuron devices are allocated through DRA (and one pod still through the
/// device plugin, as during a migration): the kubelet lists `dra-train`'s claim
/// `neurons` of devices `neurondevice1` and `neurondevice6`, which a ResourceSlice of the
/// node on the real API server publishes with `deviceId` 1 and 6, and `neurondevice9`,
/// which no slice publishes. `dra-train`'s process (PID 4109) cannot be placed from
/// `/proc`, so its runtime on cores 2-3 (device 1) is attributed through the claim; the
/// claim's idle cores (device 6: 12, 13) carry the pod and the claim; `serve` keeps its
/// device-plugin cores; the devices nobody claims keep reporting, without a pod.
#[test]
fn dra_claims_resolved_through_the_nodes_resource_slices_attribute_runtimes_and_cores() {
    use kube::{api::PostParams, ResourceExt};
    use neuron_node_agent::attribution::dra::{CLAIM_NAMESPACE_LABEL, CLAIM_NAME_LABEL};

    let rt = runtime();
    let cp = ControlPlane::shared();
    let node = format!("neuron-dra-{:08x}", random_u32());
    let (ns, other) = rt.block_on(async { (cp.namespace("attr-dra").await, cp.namespace("attr-plugin").await) });
    let client = rt.block_on(cp.client());
    let (cid, cid_serve) = (container_id(0xd1), container_id(0xd2));
    rt.block_on(running_pod(&client, &ns, "dra-train", &node, "main", &cid));
    let uid_serve = rt.block_on(running_pod(&client, &other, "serve", &node, "srv", &cid_serve));
    let proc = FakeProc::new();
    proc.process(4102, &containerd_cgroup(&uid_serve, &cid_serve));

    // The node's ResourceSlice, as the Neuron DRA driver publishes it (pool: the node).
    let device = |i: u32| {
        serde_json::json!({"name": format!("neurondevice{i}"), "attributes": {
            "deviceId": {"int": i}, "instanceType": {"string": "trn1.32xlarge"},
            "resourceType": {"string": "neuron_device"}}})
    };
    let devices = (0..16).filter(|i| *i != 9).map(device).collect();
    let (slices, created) = rt.block_on(create_slice(&client, &node, "neuron.aws.com", devices));

    let dir = TempDir::new("kubelet-dra");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    // At first the device plugin's pod alone (the claim is allocated once the agent runs).
    let serve = || holding(&other, "serve", "srv", NEURONCORE, &[4, 5]);
    kubelet.set(vec![serve()]);
    let args = node_args(&node, &proc, &kubelet.socket);
    let args = strs(&args);
    let apps = [
        "--instance-type=trn1.32xlarge",
        "--app=tag=dra,cores=2-3,util=60,pid=4109",
        "--app=tag=serve,cores=4,util=50,pid=4102",
    ];
    let agent = Agent::start_with_env(support::sim(), &apps, &args, &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))]);

    let idle_claim = |m: &Metrics, core: &str, key: &str| -> Option<String> {
        let sample = m
            .find("neuroncore_utilization_ratio", &[("neuroncore", core)])
            .into_iter()
            .find(|s| !s.labels.contains_key("runtime_tag"))?;
        sample.labels.get(key).cloned()
    };
    agent.wait_for("the device plugin's pod attributed", Duration::from_secs(30), |m| {
        (label(m, "neuroncore_utilization_ratio", "serve", "namespace") == Some(other.as_str())).then_some(())
    });
    // The kubelet lists the claim: the agent starts watching the slices, and resolves it.
    let claimed = std::time::Instant::now();
    kubelet.set(vec![
        claiming(
            &ns,
            "dra-train",
            "main",
            "neurons",
            ("neuron.aws.com", &node),
            &["neurondevice1", "neurondevice6", "neurondevice9"],
        ),
        serve(),
    ]);
    let m = agent.wait_for("the DRA claim's runtime and cores attributed", Duration::from_secs(30), |m| {
        let done = label(m, "neuroncore_utilization_ratio", "dra", "namespace") == Some(ns.as_str())
            && idle_claim(m, "12", CLAIM_NAME_LABEL).as_deref() == Some("neurons")
            && label(m, "neuroncore_utilization_ratio", "serve", "namespace") == Some(other.as_str());
        done.then(|| m.clone())
    });
    // From the kubelet's first answer with the claim to labelled series on /metrics (the
    // slice watch starts then): at most a pod-resources interval (300 ms here), the
    // listing, a report period (500 ms) and a scrape (`wait_for` polls every 50 ms).
    println!("DRA claim listed -> labelled series: {:?}", claimed.elapsed());
    for name in ["neuroncore_utilization_ratio", "neuron_runtime_memory_used_bytes", "execution_status_total"] {
        assert_eq!(label(&m, name, "dra", "pod"), Some("dra-train"), "{name}");
        assert_eq!(label(&m, name, "dra", "container"), Some("main"), "{name}");
    }
    assert_eq!(cores(&m, Some("dra")).into_keys().collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(m.value("neuron_agent_runtimes_attributed", &[("source", "devices")]), Some(1.0));
    // The claim's idle cores name the pod and the claim; the device plugin's do not.
    for core in ["12", "13"] {
        assert_eq!(idle_claim(&m, core, "pod").as_deref(), Some("dra-train"), "core {core}");
        assert_eq!(idle_claim(&m, core, CLAIM_NAMESPACE_LABEL).as_deref(), Some(ns.as_str()), "core {core}");
    }
    assert_eq!(idle_claim(&m, "5", "pod").as_deref(), Some("serve"));
    assert_eq!(idle_claim(&m, "5", CLAIM_NAME_LABEL), None);
    // The claimed device's health series names the claim; the device plugin's, none.
    let health = |device: &str, key: &str| -> Option<String> {
        let state = m.find("neuron_device_health_state", &[("neuron_device_index", device)]);
        state.first().and_then(|s| s.labels.get(key).cloned())
    };
    assert_eq!(health("6", "dra_claims"), Some(format!("{ns}/neurons")));
    assert_eq!(health("6", "pods"), Some(format!("{ns}/dra-train")));
    assert_eq!(health("2", "pods"), Some(format!("{other}/serve")));
    assert_eq!(health("2", "dra_claims"), None);
    // Devices nobody claims keep reporting, without a pod (device 9, claimed but
    // unpublished, among them).
    let idle = cores(&m, None);
    assert_eq!(idle.len(), 32 - 3);
    assert_eq!(idle.values().filter(|ns| ns.is_empty()).count(), 32 - 3 - 3, "{idle:?}");
    assert_eq!(idle.get(&18).map(String::as_str), Some(""), "device 9 keeps its series, without the pod");
    assert_eq!(m.value("neuron_agent_dra_devices_unresolved_total", &[("reason", "unknown_device")]), Some(1.0));
    assert_eq!(m.value("neuron_agent_dra_devices", &[("driver", "neuron.aws.com")]), Some(15.0));
    promtool_accepts(&m.text);

    // The claimed device 9 is published later: it resolves, and is told no more.
    let mut slice = created;
    slice.data["spec"]["devices"] = serde_json::Value::Array((0..16).map(device).collect());
    rt.block_on(slices.replace(&slice.name_any(), &PostParams::default(), &slice)).expect("replace the slice");
    let m = agent.wait_for("device 9 resolved", Duration::from_secs(20), |m| {
        (idle_claim(m, "18", CLAIM_NAME_LABEL).as_deref() == Some("neurons")).then(|| m.clone())
    });
    assert_eq!(idle_claim(&m, "19", "container").as_deref(), Some("main"));
    assert_eq!(m.value("neuron_agent_dra_devices_unresolved_total", &[("reason", "unknown_device")]), Some(1.0));
    rt.block_on(slices.delete(&slice.name_any(), &DeleteParams::default())).expect("delete the slice");
}

/// The ResourceSlice NVIDIA's DRA driver publishes for `node` (pool: the node), created in
/// the real API server: each of `gpus` (name, UUID) a whole GPU, and each of `migs`
/// (name, parent UUID) a MIG device.
fn create_gpu_slice(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    node: &str,
    gpus: &[(String, String)],
    migs: &[(String, String)],
) -> kube::Api<kube::api::DynamicObject> {
    let whole = gpus.iter().map(|(name, uuid)| {
        serde_json::json!({"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                           "productName": {"string": "NVIDIA A100-SXM4-40GB"}, "driverVersion": {"version": "550.54.15"}}})
    });
    let mig = migs.iter().map(|(name, parent)| {
        serde_json::json!({"name": name, "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": parent},
                           "profile": {"string": "1g.5gb"}}})
    });
    rt.block_on(create_slice(client, node, "gpu.nvidia.com", whole.chain(mig).collect())).0
}

/// A p4d.24xlarge (8 × A100 on the fake NVML library, GPU 1 in MIG mode) whose GPUs are
/// claimed through NVIDIA's DRA driver, beside one the device plugin allocates: `dra-train`
/// holds GPU 0 through claim `whole` (and runs process 4301 on it) and a MIG device of
/// GPU 1 through claim `slices`; `share-a` and `share-b` share claim `shared` of GPU 2;
/// `plugin` holds GPU 3 through `nvidia.com/gpu`; `odd` claims `gpu-9`, which no slice
/// publishes. The slice is NVIDIA's, created in the real API server.
#[test]
fn gpus_claimed_through_dra_carry_their_pods_and_claims_beside_the_device_plugins() {
    use neuron_node_agent::attribution::dra::{CLAIM_NAMESPACE_LABEL, CLAIM_NAME_LABEL};

    let rt = runtime();
    let cp = ControlPlane::shared();
    let node = format!("gpu-dra-{:08x}", random_u32());
    let ns = rt.block_on(cp.namespace("attr-gpu-dra"));
    let client = rt.block_on(cp.client());
    let pods = ["dra-train", "share-a", "share-b", "plugin", "odd"];
    let mut uids = BTreeMap::new();
    for (n, pod) in pods.into_iter().enumerate() {
        let cid = container_id(0x7a0 + n as u32);
        let uid = rt.block_on(running_pod(&client, &ns, pod, &node, "main", &cid));
        uids.insert(pod, (uid, cid));
    }
    let proc = FakeProc::new();
    proc.process(4301, &containerd_cgroup(&uids["dra-train"].0, &uids["dra-train"].1));
    let dir = TempDir::new("gpu-dra");
    let config = dir.0.join("nvml.yaml");
    std::fs::write(
        &config,
        "instance_type: p4d.24xlarge\n\
         gpus:\n\
         - index: 1\n  mig: {enabled: true, instances: [{profile: 1g.5gb, gpu_instance_id: 7}]}\n\
         processes:\n\
         - {gpu: 0, pid: 4301, used_memory_mib: 1000}\n",
    )
    .expect("write the fake NVML configuration");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    let agent = start_gpu_agent(cp, &node, &proc, &kubelet.socket, &config);

    const FIELD: &str = "DCGM_FI_DEV_GPU_TEMP";
    let uuids: Vec<String> = agent.wait_for("the GPUs collected", Duration::from_secs(30), |m| {
        let uuid = |gpu: u32| m.find(FIELD, &[("gpu", &gpu.to_string())]).first()?.labels.get("UUID").cloned();
        (0..8).map(uuid).collect()
    });
    let whole: Vec<(String, String)> = uuids.iter().enumerate().map(|(i, u)| (format!("gpu-{i}"), u.clone())).collect();
    let mig_device = "gpu-1-mig-19-0-1";
    let slices = create_gpu_slice(&rt, &client, &node, &whole, &[(mig_device.to_owned(), uuids[1].clone())]);
    let pool = ("gpu.nvidia.com", node.as_str());
    let listed = std::time::Instant::now();
    let mut train = claiming(&ns, "dra-train", "main", "whole", pool, &["gpu-0"]);
    let slices_claim = claiming(&ns, "dra-train", "main", "slices", pool, &[mig_device]);
    train.containers[0].dynamic_resources.extend(slices_claim.containers[0].dynamic_resources.clone());
    kubelet.set(vec![
        train,
        claiming(&ns, "share-a", "main", "shared", pool, &["gpu-2"]),
        claiming(&ns, "share-b", "main", "shared", pool, &["gpu-2"]),
        holding_ids(&ns, "plugin", "main", "nvidia.com/gpu", std::slice::from_ref(&uuids[3])),
        claiming(&ns, "odd", "main", "odd", pool, &["gpu-9"]),
    ]);
    // (pod, claim namespace, claim name) of each series of GPU `gpu`.
    let held = |m: &Metrics, gpu: u32| -> Vec<(String, String, String)> {
        let mut series: Vec<_> = m
            .find(FIELD, &[("gpu", &gpu.to_string())])
            .into_iter()
            .map(|s| {
                let get = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
                (get("pod"), get(CLAIM_NAMESPACE_LABEL), get(CLAIM_NAME_LABEL))
            })
            .collect();
        series.sort();
        series
    };
    let m = agent.wait_for("the claimed GPUs attributed", Duration::from_secs(30), |m| {
        let done = held(m, 0).first().is_some_and(|(pod, _, _)| pod == "dra-train")
            && held(m, 2).len() == 2
            && m.value("gpu_process_memory_used_bytes", &[("pid", "4301"), (CLAIM_NAME_LABEL, "whole")]).is_some();
        done.then(|| m.clone())
    });
    // At most two pod-resources intervals (the first answer starts the slice watch, the
    // next resolves through it), the listing and a scrape.
    println!("GPU DRA claims listed -> labelled series: {:?}", listed.elapsed());
    let claimed = |pod: &str, claim: &str| (pod.to_owned(), ns.clone(), claim.to_owned());
    assert_eq!(held(&m, 0), vec![claimed("dra-train", "whole")]);
    assert_eq!(held(&m, 1), vec![claimed("dra-train", "slices")], "the MIG device's GPU");
    assert_eq!(held(&m, 2), vec![claimed("share-a", "shared"), claimed("share-b", "shared")]);
    assert_eq!(held(&m, 3), vec![("plugin".to_owned(), String::new(), String::new())], "the device plugin's");
    for gpu in 4..8 {
        assert_eq!(held(&m, gpu), vec![Default::default()], "GPU {gpu}: unclaimed, still reported");
    }
    let process = m.find("gpu_process_memory_used_bytes", &[("pid", "4301")]);
    assert_eq!(process.len(), 1, "{process:?}");
    assert_eq!(process[0].labels.get("pod").map(String::as_str), Some("dra-train"));
    assert_eq!(process[0].labels.get(CLAIM_NAMESPACE_LABEL), Some(&ns));
    assert_eq!(m.value("neuron_agent_dra_devices", &[("driver", "gpu.nvidia.com")]), Some(9.0));
    // The claimed device no slice publishes is counted once, however many answers list it.
    let polls = kubelet.calls.load(std::sync::atomic::Ordering::Relaxed);
    let m = agent.wait_for("more kubelet answers", Duration::from_secs(10), |m| {
        (kubelet.calls.load(std::sync::atomic::Ordering::Relaxed) >= polls + 3).then(|| m.clone())
    });
    assert_eq!(m.value("neuron_agent_dra_devices_unresolved_total", &[("reason", "unknown_device")]), Some(1.0));
    assert_eq!(m.sum("neuron_agent_gpu_device_ids_unresolved_total", &[]), 0.0, "not the device plugin's counter");
    rt.block_on(slices.delete(&format!("{node}-gpu.nvidia.com"), &DeleteParams::default())).expect("delete the slice");
}
