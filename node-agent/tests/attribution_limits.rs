//! Hostile inputs of pod attribution against the real agent binary (issue 41): a
//! pod-resources answer whose lists have no end, from the test kubelet server; decoy
//! ResourceSlices in the real test API server. Pods are Pod objects of that API server
//! (`neuron-e2e`'s control plane), as in `attribution.rs`.

mod support;

use std::{collections::BTreeMap, ffi::OsStr, path::Path, time::Duration};

use kube::api::{DeleteParams, ListParams};
use neuron_e2e::{random_u32, ControlPlane};
use neuron_node_agent::attribution::podresources::{proto::ContainerDevices, EFA, NEURON, NEURONCORE, NEURONDEVICE};
use support::{
    kubelet::{claiming, container_id, create_slice, holding, running_pod, FakeProc, PodResourcesServer},
    Agent, Metrics, TempDir,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// The namespace of each idle core's series (empty: no pod).
fn idle_cores(m: &Metrics) -> BTreeMap<u32, String> {
    let idle =
        m.samples.iter().filter(|s| s.name == "neuroncore_utilization_ratio" && !s.labels.contains_key("runtime_tag"));
    idle.map(|s| {
        (s.labels["neuroncore"].parse().expect("core index"), s.labels.get("namespace").cloned().unwrap_or_default())
    })
    .collect()
}

fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// The agent's flags on a node of these tests: fast reports, its Node, the fake `/proc`
/// and the test kubelet polled every 300 ms.
fn node_args(node: &str, proc: &FakeProc, socket: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["--period", "500ms", "--node-name", node].map(str::to_owned).to_vec();
    args.extend(["--proc-root".to_owned(), path(proc.root()), "--pod-resources-socket".to_owned(), path(socket)]);
    args.extend(["--pod-resources-interval", "300ms"].map(str::to_owned));
    args
}

/// The lines the agent wrote to `log` past `from` bytes.
fn log_since(log: &Path, from: usize) -> String {
    let text = std::fs::read(log).expect("the agent's log");
    String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned()
}

/// Issue 41, item 5: after a pod holding Neuron device 0, a container lists 200,000 Neuron
/// core ids, 50,000 Neuron ids that are no index and 5,000 EFA ids that are no device name,
/// the bad ones different at every poll. The agent keeps 1,024 ids of each kind (the pod's
/// and 1,023 core ids of Neuron's; 1,024 bad ones of EFA's) and counts the rest, still
/// credits device 0's cores to its pod, and its log says how many bad ids there are and
/// names a few, in a few short lines (before: every bad id at every poll, megabytes a
/// poll).
#[test]
fn a_hostile_pod_resources_answer_is_cut_counted_and_logged_in_a_few_short_lines() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let node = format!("neuron-limits-{:08x}", random_u32());
    let ns = rt.block_on(cp.namespace("attr-limits"));
    let client = rt.block_on(cp.client());
    rt.block_on(running_pod(&client, &ns, "train", &node, "main", &container_id(0xe1)));
    let proc = FakeProc::new();
    let dir = TempDir::new("kubelet-limits");
    let kubelet = PodResourcesServer::start(&dir.path().join("kubelet.sock"));
    let train = {
        let ns = ns.clone();
        move || holding(&ns, "train", "main", NEURONDEVICE, &[0])
    };
    kubelet.set(vec![train()]);
    let log = dir.path().join("agent.log");
    let args = node_args(&node, &proc, &kubelet.socket);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let apps = ["--instance-type=trn1.32xlarge", "--app=tag=other,cores=8,util=10,pid=4999"];
    let agent = Agent::start_configured(support::sim(), &apps, &args, |command, _| {
        command.env("KUBECONFIG", OsStr::new(&cp.kubeconfig)).env("NO_COLOR", "1");
        command.stderr(std::fs::File::create(&log).expect("the agent's log file"));
    });
    agent.wait_for("device 0's idle cores credited to train", Duration::from_secs(30), |m| {
        let idle = idle_cores(m);
        (idle.get(&0) == Some(&ns) && idle.get(&1) == Some(&ns)).then_some(())
    });

    let answer_ns = ns.clone();
    kubelet.set_per_call(move |call| {
        let ids = |n: usize, id: &dyn Fn(usize) -> String| (0..n).map(id).collect::<Vec<String>>();
        let mut flood = holding(&answer_ns, "flood", "main", NEURONCORE, &[]);
        flood.containers[0].devices = vec![
            ContainerDevices { resource_name: NEURONCORE.into(), device_ids: ids(200_000, &|i| (i % 512).to_string()) },
            ContainerDevices {
                resource_name: NEURON.into(),
                device_ids: ids(50_000, &|i| format!("not-an-index-{call}-{i}")),
            },
            ContainerDevices { resource_name: EFA.into(), device_ids: ids(5_000, &|i| format!("../bad/{call}/{i}")) },
        ];
        vec![holding(&answer_ns, "train", "main", NEURONDEVICE, &[0]), flood]
    });
    let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
    let ok = |m: &Metrics| m.value("neuron_agent_kubelet_requests_total", &[("result", "ok")]).unwrap_or(0.0);
    let answers_before = ok(&agent.metrics());
    let m = agent.wait_for("8 hostile answers read", Duration::from_secs(60), |m| {
        (ok(m) >= answers_before + 8.0).then(|| m.clone())
    });

    // The pod's devices still count; the flood's ids past 1,024 of each kind are counted.
    let idle = idle_cores(&m);
    assert_eq!((idle.get(&0), idle.get(&1)), (Some(&ns), Some(&ns)), "{idle:?}");
    let cut = m.value("neuron_agent_kubelet_entries_cut_total", &[("list", "device_ids")]).unwrap_or(0.0);
    assert!(cut >= (255_000 - 2 * 1024) as f64, "cut: {cut}\n{}", m.text);
    assert_eq!(m.value("neuron_agent_kubelet_requests_total", &[("result", "timeout")]), None, "no poll timed out");
    // Eight answers with thousands of bad ids each, every one new: a few short lines,
    // each saying how many.
    let logged = log_since(&log, logged_before);
    let longest = logged.lines().map(str::len).max().unwrap_or(0);
    assert!(logged.len() < 16 * 1024 && longest < 2048, "{} bytes, longest line {longest}", logged.len());
    let bad_ids = logged.lines().filter(|l| l.contains("not Neuron indices")).collect::<Vec<_>>();
    assert!(!bad_ids.is_empty() && bad_ids.iter().all(|l| l.contains("count=1024")), "{logged}");
}

/// Issue 41, item 6: 64 decoy ResourceSlices of NVIDIA's driver for the node (more than
/// the agent kept of every driver together before), present when the agent lists the
/// slices: 40 of pools of their own, 16 of the node's pool at an older generation (stale),
/// 8 of the node's pool at the real slice's generation, naming devices no claim does. The
/// real slice's name sorts after all of theirs (a listing gives it last); its pool is the
/// one the claim names, so none of them pushes it out: the claimed GPU keeps its pod.
#[test]
fn decoy_resource_slices_do_not_push_out_the_pool_a_claim_names() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let node = format!("gpu-decoys-{:08x}", random_u32());
    let ns = rt.block_on(cp.namespace("attr-decoys"));
    let client = rt.block_on(cp.client());
    rt.block_on(running_pod(&client, &ns, "dra-train", &node, "main", &container_id(0xe2)));
    let proc = FakeProc::new();
    let dir = TempDir::new("kubelet-decoys");
    let config = dir.path().join("nvml.yaml");
    std::fs::write(&config, "instance_type: g5.12xlarge\n").expect("write the fake NVML configuration");
    let kubelet = PodResourcesServer::start(&dir.path().join("kubelet.sock"));
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let mut args = node_args(&node, &proc, &kubelet.socket);
    args.extend(["--nvml-library".to_owned(), path(&library)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("KUBECONFIG", OsStr::new(&cp.kubeconfig)), ("FAKE_NVML_CONFIG", config.as_os_str())];
    // A GPU-only node: no neuron-monitor is started, so none is needed.
    let agent = Agent::start_with_env("/nonexistent/neuron-monitor", &[], &args, &env);

    const FIELD: &str = "DCGM_FI_DEV_GPU_TEMP";
    let uuids: Vec<String> = agent.wait_for("the GPUs collected", Duration::from_secs(30), |m| {
        let uuid = |gpu: u32| m.find(FIELD, &[("gpu", &gpu.to_string())]).first()?.labels.get("UUID").cloned();
        (0..4).map(uuid).collect()
    });
    let gpu = |name: &str, uuid: &str| serde_json::json!({"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}});
    let decoy = |n: usize, pool: &str, generation: i64, device: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-decoy-{n:02}")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                     "devices": [device]}
        })
    };
    let decoys = (0..64).map(|n| match n {
        // Pools of their own: the same device name, another GPU.
        0..40 => decoy(n, &format!("decoy-pool-{n:02}"), 1, gpu("gpu-0", &uuids[3])),
        // The node's pool at an older generation: stale.
        40..56 => decoy(n, &node, 0, gpu("gpu-0", &uuids[3])),
        // The node's pool at the real generation, devices no claim names.
        _ => decoy(n, &node, 1, gpu(&format!("decoy-{n}"), &uuids[2])),
    });
    let (slices, _) = rt.block_on(async {
        for slice in decoys {
            let slice: kube::api::DynamicObject = serde_json::from_value(slice).expect("a ResourceSlice");
            let api = support::kubelet::resource_slices(&client);
            api.create(&Default::default(), &slice).await.expect("create a decoy slice");
        }
        let real = (0..4).map(|i| gpu(&format!("gpu-{i}"), &uuids[i])).collect();
        create_slice(&client, &node, "gpu.nvidia.com", real).await
    });
    // The kubelet lists the claim of gpu-0 of the node's pool: the slices are listed now.
    kubelet.set(vec![claiming(&ns, "dra-train", "main", "whole", ("gpu.nvidia.com", &node), &["gpu-0"])]);
    let polls = kubelet.calls.load(std::sync::atomic::Ordering::Relaxed);
    let m = agent.wait_for("the claimed GPU attributed", Duration::from_secs(30), |m| {
        let held = m.find(FIELD, &[("gpu", "0"), ("pod", "dra-train")]).len() == 1;
        let settled = kubelet.calls.load(std::sync::atomic::Ordering::Relaxed) >= polls + 4;
        (held && settled).then(|| m.clone())
    });
    assert_eq!(m.find(FIELD, &[("gpu", "3"), ("pod", "dra-train")]).len(), 0, "no decoy's device");
    assert_eq!(m.value("neuron_agent_dra_devices_unresolved_total", &[("reason", "unknown_device")]), None);
    assert!(m.value("neuron_agent_resourceslices_left_out_total", &[]).is_some_and(|n| n > 0.0), "{}", m.text);
    let selector = ListParams::default().fields(&format!("spec.nodeName={node}"));
    rt.block_on(slices.delete_collection(&DeleteParams::default(), &selector)).expect("delete the slices");
}
