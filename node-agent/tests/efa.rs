//! The EFA series of the real agent binary: the simulator writes a fake EFA tree (the
//! kernel's layout, counters following its applications) under the sysfs root the agent
//! reads; Pod objects live in the real test API server and the test kubelet says which
//! pod holds which EFA device.

mod support;

use std::{collections::BTreeMap, ffi::OsStr, path::Path, time::Duration};

use neuron_e2e::{random_u32, ControlPlane};
use neuron_node_agent::attribution::podresources::{NEURONCORE, NEURONDEVICE};
use support::{
    kubelet::{container_id, containerd_cgroup, holding_with_efa, running_pod, FakeProc, PodResourcesServer},
    Agent, Metrics, TempDir,
};

const WAIT: Duration = Duration::from_secs(30);

/// The counter files of one `hw_counters` directory of the fake tree, as metric names.
fn files(dir: &Path) -> BTreeMap<String, f64> {
    let mut counters = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // the simulator's file being replaced
        }
        if let Ok(text) = std::fs::read_to_string(dir.join(&name)) {
            counters.insert(format!("efa_{name}_total"), text.trim().parse().expect("a counter"));
        }
    }
    counters
}

/// The EFA series of one device (and port, or none), by name.
fn series(m: &Metrics, device: &str, port: Option<&str>) -> BTreeMap<String, f64> {
    m.samples
        .iter()
        .filter(|s| {
            s.name.starts_with("efa_")
                && s.labels.get("efa_device").map(String::as_str) == Some(device)
                && s.labels.get("port").map(String::as_str) == port
        })
        .map(|s| (s.name.clone(), s.value))
        .collect()
}

fn pod_of<'m>(m: &'m Metrics, device: &str) -> Option<(&'m str, &'m str, &'m str)> {
    let sample = m.find("efa_tx_bytes_total", &[("efa_device", device)]).into_iter().next()?;
    let label = |k: &str| sample.labels.get(k).map(String::as_str);
    Some((label("namespace")?, label("pod")?, label("container")?))
}

#[test]
fn efa_counters_land_on_the_pods_holding_the_devices_with_the_simulators_values() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let node = format!("neuron-node-{:08x}", random_u32());
    let (a, b) = rt.block_on(async { (cp.namespace("efa-a").await, cp.namespace("efa-b").await) });
    let client = rt.block_on(cp.client());
    let (cid_a, cid_b) = (container_id(0xea1), container_id(0xeb1));
    let uid_a = rt.block_on(running_pod(&client, &a, "train", &node, "main", &cid_a));
    let uid_b = rt.block_on(running_pod(&client, &b, "serve", &node, "srv", &cid_b));
    let proc = FakeProc::new();
    proc.process(5101, &containerd_cgroup(&uid_a, &cid_a));
    proc.process(5102, &containerd_cgroup(&uid_b, &cid_b));
    // trn1.32xlarge: 16 devices of 2 cores, 8 EFA devices, each carrying two devices'
    // traffic: train (devices 0-1) sends over rdmap16s27, serve (device 2) over rdmap24s27.
    let dir = TempDir::new("efa");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    kubelet.set(vec![
        holding_with_efa(&a, "train", "main", (NEURONDEVICE, &[0, 1]), &["rdmap16s27"]),
        holding_with_efa(&b, "serve", "srv", (NEURONCORE, &[4, 5]), &["rdmap24s27"]),
    ]);
    let sys = dir.0.join("sys");
    let sim_sysfs = format!("--sysfs-root={}", sys.display());
    let apps = [
        "--instance-type=trn1.32xlarge",
        "--app=tag=train,cores=0-2,util=80,pid=5101",
        "--app=tag=serve,cores=4,util=50,pid=5102",
        sim_sysfs.as_str(),
    ];
    let args = [
        "--period=500ms",
        "--node-name",
        &node,
        "--proc-root",
        proc.root().to_str().expect("utf-8 path"),
        "--pod-resources-socket",
        kubelet.socket.to_str().expect("utf-8 path"),
        "--pod-resources-interval=300ms",
        "--pod-label=app",
        "--sysfs-root",
        sys.to_str().expect("utf-8 path"),
    ];
    let agent = Agent::start_with_env(support::sim(), &apps, &args, &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))]);

    // The busy devices send in proportion to their load (2.4 : 0.5 busy cores). The agent
    // reads the devices one after the other while the simulator advances them all once a
    // second, so one read may see train's device a second behind serve's: waited for is a
    // read between two advances.
    let tx = |m: &Metrics, device: &str| m.value("efa_tx_bytes_total", &[("efa_device", device)]).unwrap_or(0.0);
    let m = agent.wait_for("both held devices attributed and carrying traffic in proportion", WAIT, |m| {
        let (train, serve) = (tx(m, "rdmap16s27"), tx(m, "rdmap24s27"));
        let done = pod_of(m, "rdmap16s27") == Some((a.as_str(), "train", "main"))
            && pod_of(m, "rdmap24s27") == Some((b.as_str(), "serve", "srv"))
            && serve > 0.0
            && (train / serve - 2.4 / 0.5).abs() < 0.01;
        done.then(|| m.clone())
    });
    // Every device of the tree, each counter once; the devices no pod holds carry no pod.
    let devices: Vec<String> = std::fs::read_dir(sys.join("class/infiniband"))
        .expect("the fake tree")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(devices.len(), 8);
    assert_eq!(m.value("neuron_agent_efa_devices", &[]), Some(8.0));
    for device in &devices {
        let tx = m.find("efa_tx_bytes_total", &[("efa_device", device)]);
        assert_eq!(tx.len(), 1, "{device}");
        let held = matches!(device.as_str(), "rdmap16s27" | "rdmap24s27");
        assert_eq!(tx[0].labels.contains_key("pod"), held, "{device}: {:?}", tx[0].labels);
        assert_eq!(tx[0].labels.get("port").map(String::as_str), Some("1"));
    }
    assert_eq!(m.find("efa_tx_bytes_total", &[("efa_device", "rdmap16s27")])[0].labels["label_app"], "train");
    // The idle devices sent nothing.
    assert_eq!(m.value("efa_tx_bytes_total", &[("efa_device", "rdmap32s27")]), Some(0.0));

    // Every counter the simulator wrote, with its value: port counters with `port`,
    // device counters without (the values of one read of the tree, between two advances).
    let tree = sys.join("class/infiniband/rdmap16s27");
    let m = agent.wait_for("the series equal the simulator's files", WAIT, |m| {
        let port = files(&tree.join("ports/1/hw_counters"));
        let device = files(&tree.join("hw_counters"));
        (port.len() == 13 && series(m, "rdmap16s27", Some("1")) == port && series(m, "rdmap16s27", None) == device)
            .then(|| m.clone())
    });
    // Read again and again through the files held open since the first read: all of them.
    let counters_per_device = 13 + files(&tree.join("hw_counters")).len();
    assert_eq!(m.value("neuron_agent_efa_held_files", &[]), Some((8 * counters_per_device) as f64));
    assert_eq!(m.sum("neuron_agent_efa_read_failures_total", &[]), 0.0, "{}", m.text);
    assert!(m.value("neuron_agent_efa_read_seconds", &[]).is_some());
    let complaints = support::promtool_complaints(&m.text);
    assert!(complaints.iter().all(|c| c == support::ACCEPTED_LINT), "promtool: {complaints:#?}");

    // serve gives its EFA device back: its series go on without a pod.
    kubelet.set(vec![holding_with_efa(&a, "train", "main", (NEURONDEVICE, &[0, 1]), &["rdmap16s27"])]);
    agent.wait_for("serve's device without a pod", WAIT, |m| {
        let tx = m.find("efa_tx_bytes_total", &[("efa_device", "rdmap24s27")]);
        (tx.len() == 1 && !tx[0].labels.contains_key("pod")).then_some(())
    });
}

#[test]
fn a_node_without_efa_exports_none_and_says_so_once() {
    // A node with an RDMA device of another driver, and no EFA device.
    let dir = TempDir::new("no-efa");
    let sys = dir.0.join("sys");
    let function = sys.join("devices/pci0000:00/0000:00:04.0");
    std::fs::create_dir_all(function.join("infiniband/mlx5_0/ports/1/hw_counters")).expect("tree");
    std::fs::write(function.join("infiniband/mlx5_0/ports/1/hw_counters/port_xmit_data"), "42\n").expect("counter");
    std::fs::create_dir_all(sys.join("bus/pci/drivers/mlx5_core")).expect("driver");
    std::fs::create_dir_all(sys.join("class/infiniband")).expect("class");
    std::os::unix::fs::symlink("../../../bus/pci/drivers/mlx5_core", function.join("driver")).expect("link");
    std::os::unix::fs::symlink("../../../0000:00:04.0", function.join("infiniband/mlx5_0/device")).expect("link");
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:04.0/infiniband/mlx5_0",
        sys.join("class/infiniband/mlx5_0"),
    )
    .expect("link");
    let log = dir.0.join("agent.log");
    let log_file = std::fs::File::create(&log).expect("log file");
    let sim_sysfs = format!("--sysfs-root={}", sys.display());
    let agent = Agent::start_configured(
        support::sim(),
        &["--instance-type=trn1.2xlarge", sim_sysfs.as_str()],
        &["--period=300ms", "--sysfs-root", sys.to_str().expect("utf-8 path"), "--efa-interval=200ms"],
        |command, _| {
            command.arg("--log-format=json").stderr(log_file);
        },
    );
    let m = agent
        .wait_for("reports exported", WAIT, |m| (m.sum("neuron_agent_reports_total", &[]) >= 5.0).then(|| m.clone()));
    assert!(m.samples.iter().all(|s| !s.name.starts_with("efa_")), "{}", m.text);
    assert!(m.text.lines().all(|l| !l.starts_with("# TYPE efa_")));
    assert_eq!(m.value("neuron_agent_efa_devices", &[]), Some(0.0));
    assert_eq!(m.sum("neuron_agent_efa_read_failures_total", &[]), 0.0);
    drop(agent);
    let text = std::fs::read_to_string(&log).expect("the agent's log");
    let efa: Vec<&str> = text.lines().filter(|l| l.contains("EFA") || l.contains("infiniband")).collect();
    assert_eq!(efa.len(), 1, "{efa:#?}");
    assert!(efa[0].contains(r#""level":"INFO""#) && efa[0].contains("no EFA device"), "{}", efa[0]);
}

/// A node moving to DRA: `train` holds two EFA devices through a claim of AWS's EFA DRA
/// driver (DRANET, `dra.net`), resolved through the node's ResourceSlice in the real API
/// server, while `serve` still holds one through the EFA device plugin.
#[test]
fn efa_devices_claimed_through_dra_name_their_pods_and_claims_beside_the_device_plugins() {
    use api::hardware::EFA_DRA_DRIVER;
    use kube::ResourceExt;
    use neuron_node_agent::attribution::dra::{CLAIM_NAMESPACE_LABEL, CLAIM_NAME_LABEL};
    use support::kubelet::{claiming, create_slice, holding};

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let node = format!("neuron-efa-dra-{:08x}", random_u32());
    let (a, b) = rt.block_on(async { (cp.namespace("efa-dra-a").await, cp.namespace("efa-dra-b").await) });
    let client = rt.block_on(cp.client());
    let (cid_a, cid_b) = (container_id(0xed1), container_id(0xed2));
    rt.block_on(running_pod(&client, &a, "train", &node, "main", &cid_a));
    rt.block_on(running_pod(&client, &b, "serve", &node, "srv", &cid_b));
    // DRANET names devices after their PCI address; the EFA ones carry their RDMA device,
    // a plain network interface none.
    let efa = |name: &str, rdma: &str| {
        serde_json::json!({"name": name, "attributes": {
            "dra.net/rdmaDevice": {"string": rdma}, "dra.net/rdma": {"bool": true},
            "dra.net/pciDevice": {"string": "Elastic Fabric Adapter (EFA)"}}})
    };
    let ena = serde_json::json!({"name": "ens5", "attributes": {
        "dra.net/ifName": {"string": "ens5"}, "dra.net/rdma": {"bool": false}}});
    let devices = vec![efa("pci-0000-10-1b-0", "rdmap16s27"), efa("pci-0000-20-1b-0", "rdmap32s27"), ena];
    let (slices, slice) = rt.block_on(create_slice(&client, &node, EFA_DRA_DRIVER, devices));

    let dir = TempDir::new("efa-dra");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    let mut train = holding(&a, "train", "main", NEURONDEVICE, &[0, 1]);
    let claimed = ["pci-0000-10-1b-0", "pci-0000-20-1b-0", "ens5", "pci-0000-99-1b-0"];
    train.containers[0].dynamic_resources =
        claiming(&a, "train", "main", "efa-pair", (EFA_DRA_DRIVER, &node), &claimed).containers[0]
            .dynamic_resources
            .clone();
    kubelet.set(vec![train, holding_with_efa(&b, "serve", "srv", (NEURONCORE, &[4, 5]), &["rdmap24s27"])]);
    let sys = dir.0.join("sys");
    let sim_sysfs = format!("--sysfs-root={}", sys.display());
    let apps = ["--instance-type=trn1.32xlarge", sim_sysfs.as_str()];
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    let args = [
        "--period=500ms".to_owned(),
        "--node-name".to_owned(),
        node.clone(),
        "--pod-resources-socket".to_owned(),
        path(&kubelet.socket),
        "--pod-resources-interval=300ms".to_owned(),
        "--sysfs-root".to_owned(),
        path(&sys),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(support::sim(), &apps, &args, &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))]);

    let claim_of = |m: &Metrics, device: &str| -> Option<(String, String)> {
        let sample = m.find("efa_tx_bytes_total", &[("efa_device", device)]).into_iter().next()?;
        let label = |k: &str| sample.labels.get(k).cloned();
        Some((label(CLAIM_NAMESPACE_LABEL)?, label(CLAIM_NAME_LABEL)?))
    };
    let m = agent.wait_for("the claimed EFA devices attributed", WAIT, |m| {
        let done = pod_of(m, "rdmap16s27") == Some((a.as_str(), "train", "main"))
            && pod_of(m, "rdmap32s27") == Some((a.as_str(), "train", "main"))
            && pod_of(m, "rdmap24s27") == Some((b.as_str(), "serve", "srv"));
        done.then(|| m.clone())
    });
    for device in ["rdmap16s27", "rdmap32s27"] {
        assert_eq!(claim_of(&m, device), Some((a.clone(), "efa-pair".to_owned())), "{device}");
    }
    let serve = &m.find("efa_tx_bytes_total", &[("efa_device", "rdmap24s27")])[0];
    assert!(!serve.labels.contains_key(CLAIM_NAME_LABEL), "the device plugin's: {:?}", serve.labels);
    // The devices nobody holds keep reporting, without a pod.
    let unheld = m.find("efa_tx_bytes_total", &[]).into_iter().filter(|s| !s.labels.contains_key("pod")).count();
    assert_eq!(unheld, 8 - 3);
    // The unpublished device is counted; the claimed interface without RDMA is no EFA's.
    assert_eq!(m.value("neuron_agent_dra_devices", &[("driver", EFA_DRA_DRIVER)]), Some(3.0));
    assert_eq!(m.value("neuron_agent_dra_devices_unresolved_total", &[("reason", "unknown_device")]), Some(1.0));
    assert_eq!(m.sum("neuron_agent_dra_devices_unresolved_total", &[]), 1.0);
    let complaints = support::promtool_complaints(&m.text);
    assert!(complaints.iter().all(|c| c == support::ACCEPTED_LINT), "promtool: {complaints:#?}");

    // The claim ends: its devices go on without the pod.
    kubelet.set(vec![holding_with_efa(&b, "serve", "srv", (NEURONCORE, &[4, 5]), &["rdmap24s27"])]);
    agent.wait_for("the claim's devices without a pod", WAIT, |m| {
        (pod_of(m, "rdmap16s27").is_none() && claim_of(m, "rdmap16s27").is_none()).then_some(())
    });
    rt.block_on(slices.delete(&slice.name_any(), &Default::default())).expect("delete the slice");
}
