//! NVIDIA GPU health end to end, on the fake NVML library (`cargo build -p
//! nvidia-ml-fake`, or `--workspace`): an Xid 79 record in the kernel log makes its GPU
//! unhealthy with reason `XID_79` on `/metrics`, with the `GpuHealth` condition and an
//! Event on the real control plane and a fault event in CloudWatch Logs (LocalStack);
//! records not as the driver writes them are refused; an Xid delivered through NVML's
//! event set counts too.

mod support;

use std::{ffi::OsStr, path::Path, time::Duration};

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    api::{ListParams, PostParams},
    Api,
};
use neuron_e2e::{localstack::LocalStack, random_u32, wait_for, ControlPlane};
use support::{
    api_outage::ApiRelay,
    cloudwatch::{logs_client, start_agent_without_file},
    driver::append_kmsg_record,
    sim, Agent, Metrics, TempDir,
};

const WAIT: Duration = Duration::from_secs(30);
const XID_79: &str = "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus.";

/// The fake library, found beside the test's binaries as the simulator is.
fn fake_nvml() -> String {
    neuron_e2e::workspace_bin("libnvidia_ml_fake.so").display().to_string()
}

/// A p5.48xlarge (8 GPUs; GPU 0 at PCI 0000:53:00) whose GPU 2 raises `nvml_xid`
/// through the event set; an empty kernel log.
fn gpu_node(dir: &Path, nvml_xid: u32) -> (std::path::PathBuf, std::path::PathBuf) {
    let config = dir.join("nvml.yaml");
    std::fs::write(&config, format!("instance_type: p5.48xlarge\ngpus:\n- index: 2\n  xid: [{nvml_xid}]\n"))
        .expect("fake NVML config");
    let kmsg = dir.join("kmsg");
    std::fs::write(&kmsg, "").expect("kmsg file");
    (config, kmsg)
}

fn start(config: &Path, kmsg: &Path, extra: &[&str], env: &[(&str, &OsStr)]) -> Agent {
    let library = fake_nvml();
    let mut args = vec!["--nvml-library", &library, "--kmsg-path", kmsg.to_str().expect("utf-8"), "--period", "500ms"];
    args.extend_from_slice(extra);
    let mut env = env.to_vec();
    env.push(("FAKE_NVML_CONFIG", config.as_os_str()));
    Agent::start_with_env(sim(), &[], &args, &env)
}

fn state(m: &Metrics, gpu: &str, state: &str) -> Option<f64> {
    m.value("gpu_health_state", &[("gpu", gpu), ("state", state)])
}

#[test]
fn an_xid_79_record_makes_its_gpu_unhealthy_on_metrics_and_hostile_records_are_refused() {
    let dir = TempDir::new("gpu-health");
    let (config, kmsg) = gpu_node(&dir.0, 13);
    let agent = start(&config, &kmsg, &[], &[]);
    agent.wait_for("GPU 0 healthy", WAIT, |m| (state(m, "0", "healthy")? == 1.0).then_some(()));

    // A user's write to /dev/kmsg (facility user), an address no GPU has, a malformed code.
    append_kmsg_record(&kmsg, 12, 10, &XID_79.replace("53:00", "64:00"));
    append_kmsg_record(&kmsg, 3, 11, "NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=a, b");
    append_kmsg_record(&kmsg, 3, 12, "NVRM: Xid (PCI:0000:64:00): 99999999999, pid=1, name=a, b");
    append_kmsg_record(&kmsg, 3, 13, XID_79);
    let m = agent.wait_for("GPU 0 unhealthy", WAIT, |m| (state(m, "0", "unhealthy")? == 1.0).then(|| m.clone()));
    assert_eq!(state(&m, "0", "healthy"), Some(0.0));
    // No Neuron device on this node: no Neuron health (it could only say `unknown`).
    for family in ["neuron_device_health_state", "neuron_node_health_state", "neuron_device_health_unknown"] {
        assert!(m.find(family, &[]).is_empty() && !m.text.contains(&format!("# TYPE {family} ")), "{family}");
    }
    let uuid = &m.find("gpu_health_state", &[("gpu", "0"), ("state", "unhealthy")])[0].labels["UUID"];
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    assert_eq!(m.value("DCGM_FI_DEV_XID_ERRORS", &[("gpu", "0")]), Some(79.0));
    assert_eq!(m.value("gpu_xid_errors_total", &[("gpu", "0"), ("xid", "79")]), Some(1.0));
    assert_eq!(state(&m, "1", "healthy"), Some(1.0), "the user's record for GPU 1 was not taken");
    for reason in ["facility", "unknown_device", "xid_format"] {
        let refused = m.value("neuron_agent_health_kmsg_refused_total", &[("reason", reason)]);
        assert_eq!(refused, Some(1.0), "{reason}");
    }
    // The informational Xid 13 of GPU 2 came through NVML's event set: counted, healthy.
    let m = agent.wait_for("the event set's Xid", WAIT, |m| {
        m.value("gpu_xid_errors_total", &[("gpu", "2"), ("xid", "13")]).map(|_| m.clone())
    });
    assert_eq!(state(&m, "2", "healthy"), Some(1.0));
    assert_eq!(m.value("DCGM_FI_DEV_XID_ERRORS", &[("gpu", "2")]), Some(13.0));
}

#[test]
fn an_xid_79_record_sets_the_gpu_condition_and_an_event_and_nvml_xids_count_as_faults() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let node = format!("gpu-node-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");
    let condition = |type_: &'static str| {
        let (nodes, node) = (nodes.clone(), node.clone());
        async move {
            let n = nodes.get_status(&node).await.ok()?;
            let c = n.status?.conditions?.into_iter().find(|c| c.type_ == type_)?;
            Some((c.status, c.reason.unwrap_or_default()))
        }
    };

    let dir = TempDir::new("gpu-health-node");
    let (config, kmsg) = gpu_node(&dir.0, 48);
    let _agent = start(&config, &kmsg, &["--node-name", &node], &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))]);
    // GPU 2's Xid 48 (a double-bit ECC error) came through NVML's event set.
    let first = rt.block_on(wait_for(WAIT, || async { condition("GpuHealth").await.filter(|(s, _)| s == "True") }));
    assert_eq!(first, Some(("True".to_owned(), "XID_48".to_owned())));

    append_kmsg_record(&kmsg, 3, 20, XID_79);
    let latest = rt.block_on(wait_for(WAIT, || async { condition("GpuHealth").await.filter(|(_, r)| r == "XID_79") }));
    assert_eq!(latest, Some(("True".to_owned(), "XID_79".to_owned())), "the latest fault names it");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let note = rt.block_on(wait_for(WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
            .filter(|e| e.reason.as_deref() == Some("GpuHasError_XID_79"))
            .find_map(|e| e.note)
    }));
    let note = note.expect("an Event for the Xid");
    for part in ["NVIDIA GPU 0", "GPU-", "00000000:53:00.0", "GPU has fallen off the bus", "REBOOT_NODE"] {
        assert!(note.contains(part), "{part:?} in {note:?}");
    }
    // A GPU-only node: no Neuron condition.
    assert_eq!(rt.block_on(condition("NeuronHealth")), None);
}

/// Issue 41, item 2: a user's Xid record (facility user, refused alone) followed by a
/// kernel continuation record (flag `c`, facility 0, even an empty one) is not joined to
/// it: refused for its facility, its GPU healthy. A kernel Xid after them is taken.
#[test]
fn a_users_xid_record_followed_by_a_kernel_continuation_is_refused() {
    let dir = TempDir::new("gpu-health-join");
    let (config, kmsg) = gpu_node(&dir.0, 13);
    let agent = start(&config, &kmsg, &[], &[]);
    agent.wait_for("GPU 0 healthy", WAIT, |m| (state(m, "0", "healthy")? == 1.0).then_some(()));
    // Each followed by a kernel fragment: an empty emergency one, an error one with text.
    append_kmsg_record(&kmsg, 12, 10, XID_79);
    append_continuation(&kmsg, 0, 11, "");
    append_kmsg_record(&kmsg, 12, 12, &XID_79.replace("53:00", "75:00"));
    append_continuation(&kmsg, 3, 13, " GPU has fallen off the bus.");
    // Seen after them: GPU 1's Xid 48 as the driver writes it.
    append_kmsg_record(&kmsg, 3, 14, "NVRM: Xid (PCI:0000:64:00): 48, pid=1, name=a, DBE");
    let m = agent.wait_for("GPU 1 unhealthy", WAIT, |m| (state(m, "1", "unhealthy")? == 1.0).then(|| m.clone()));
    assert_eq!(state(&m, "0", "healthy"), Some(1.0), "the user's record made GPU 0 unhealthy");
    assert_eq!(state(&m, "2", "healthy"), Some(1.0), "the user's record made GPU 2 unhealthy");
    assert_eq!(m.value("neuron_agent_health_kmsg_refused_total", &[("reason", "facility")]), Some(2.0));
    assert_eq!(m.value("gpu_xid_errors_total", &[("gpu", "0"), ("xid", "79")]), None);
}

/// Appends a continuation record (flag `c`) `<prefix>,<seq>,<now>,c;<text>`.
fn append_continuation(kmsg: &Path, prefix: u32, seq: u64, text: &str) {
    use std::io::Write;
    let uptime = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let secs: f64 = uptime.split_whitespace().next().and_then(|s| s.parse().ok()).expect("uptime");
    let mut file = std::fs::OpenOptions::new().append(true).open(kmsg).expect("kmsg");
    file.write_all(format!("{prefix},{seq},{},c;{text}\n", (secs * 1e6) as u64).as_bytes()).expect("append");
}

/// The Node Events of `node` with `reason`.
async fn events_of(events: &Api<Event>, node: &str, reason: &str) -> Option<Vec<Event>> {
    let list = events.list(&ListParams::default()).await.ok()?;
    let of_node = |e: &Event| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node);
    Some(list.items.into_iter().filter(|e| of_node(e) && e.reason.as_deref() == Some(reason)).collect())
}

/// Issue 41, item 4: an Xid 79 while the API server is down, and the agent restarted
/// during the outage: once the API server is back, the Node condition says `XID_79` and
/// one Event names the GPU. An Event written before a restart is not written again after
/// it (a new fault's Event, written after the earlier one would be, shows the agent got
/// that far).
#[test]
fn a_faults_event_survives_an_agent_restart_during_an_api_server_outage() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let node = format!("gpu-outage-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");
    let condition = || {
        let (nodes, node) = (nodes.clone(), node.clone());
        async move {
            let n = nodes.get_status(&node).await.ok()?;
            let c = n.status?.conditions?.into_iter().find(|c| c.type_ == "GpuHealth")?;
            Some((c.status, c.reason.unwrap_or_default()))
        }
    };
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    let dir = TempDir::new("gpu-outage");
    let (config, kmsg) = gpu_node(&dir.0, 13);
    let relay = ApiRelay::start(cp, &dir.0);
    let env = [("KUBECONFIG", relay.kubeconfig.as_os_str())];
    // Each agent on the state directory its predecessor left (an emptyDir outlives a
    // container restart).
    let start_on = |state: Option<&[u8]>| {
        let library = fake_nvml();
        let args = ["--nvml-library", &library, "--kmsg-path", kmsg.to_str().expect("utf-8"), "--period", "500ms"];
        let mut args = args.to_vec();
        args.extend(["--node-name", node.as_str()]);
        let mut env = env.to_vec();
        env.push(("FAKE_NVML_CONFIG", config.as_os_str()));
        Agent::start_configured(sim(), &[], &args, |command, state_dir| {
            command.envs(env.iter().copied());
            if let Some(state) = state {
                std::fs::write(state_dir.join("neuron-health.json"), state).expect("persisted state");
            }
        })
    };
    let state_file = |agent: &Agent| agent.state_dir.0.join("neuron-health.json");

    let first = start_on(None);
    let healthy = rt.block_on(wait_for(WAIT, || async { condition().await.filter(|(s, _)| s == "False") }));
    assert_eq!(healthy, Some(("False".to_owned(), "GpuHasNoError".to_owned())));
    relay.cut();
    append_kmsg_record(&kmsg, 3, 20, XID_79);
    first.wait_for("GPU 0 unhealthy", WAIT, |m| (state(m, "0", "unhealthy")? == 1.0).then_some(()));
    first.wait_until("the fault persisted", WAIT, |a| {
        std::fs::read_to_string(state_file(a)).is_ok_and(|t| t.contains("XID_79"))
    });
    let saved = std::fs::read(state_file(&first)).expect("the persisted state");
    drop(first);

    // Restarted during the outage; then the API server is back.
    let second = start_on(Some(&saved));
    second.wait_for("GPU 0 unhealthy, restored", WAIT, |m| (state(m, "0", "unhealthy")? == 1.0).then_some(()));
    relay.restore();
    let faulty = rt.block_on(wait_for(WAIT, || async { condition().await.filter(|(_, r)| r == "XID_79") }));
    assert_eq!(faulty, Some(("True".to_owned(), "XID_79".to_owned())));
    let written = rt.block_on(wait_for(WAIT, || async {
        events_of(&events, &node, "GpuHasError_XID_79").await.filter(|e| !e.is_empty())
    }));
    let written = written.expect("the Event of the Xid 79, after the outage");
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(written[0].note.as_deref().is_some_and(|n| n.contains("NVIDIA GPU 0")), "{written:?}");
    second.wait_until("the Event persisted as written", WAIT, |a| {
        std::fs::read_to_string(state_file(a)).is_ok_and(|t| t.contains("\"announced\":[\"XID_79\"]"))
    });
    let saved = std::fs::read(state_file(&second)).expect("the persisted state");
    drop(second);

    // Restarted after the Event: a new fault gets its Event, the written one no second.
    let third = start_on(Some(&saved));
    third.wait_for("GPU 0 unhealthy, restored", WAIT, |m| (state(m, "0", "unhealthy")? == 1.0).then_some(()));
    append_kmsg_record(&kmsg, 3, 21, "NVRM: Xid (PCI:0000:64:00): 48, pid=1, name=a, DBE");
    let later = rt.block_on(wait_for(WAIT, || async {
        events_of(&events, &node, "GpuHasError_XID_48").await.filter(|e| !e.is_empty())
    }));
    assert!(later.is_some(), "the new fault's Event");
    let again = rt.block_on(events_of(&events, &node, "GpuHasError_XID_79")).expect("list the Events");
    assert_eq!(again.len(), 1, "written once: {again:?}");
    drop(third);
}

/// Every event of every stream of `group` (empty while the group does not exist).
fn stored_events(addr: std::net::SocketAddr, group: &str) -> Vec<(String, serde_json::Value)> {
    let client = logs_client(addr, "us-west-2");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut out = Vec::new();
        let Ok(streams) = client.describe_log_streams().log_group_name(group).send().await else { return out };
        for stream in streams.log_streams() {
            let name = stream.log_stream_name().unwrap_or_default().to_owned();
            let Ok(page) =
                client.get_log_events().log_group_name(group).log_stream_name(&name).start_from_head(true).send().await
            else {
                continue;
            };
            for e in page.events() {
                let json = serde_json::from_str(e.message().unwrap_or_default()).expect("a JSON event");
                out.push((name.clone(), json));
            }
        }
        out
    })
}

#[test]
fn an_xid_79_record_reaches_the_cloudwatch_logs_stream_naming_the_gpu() {
    let ls = LocalStack::shared();
    let dir = TempDir::new("gpu-health-logs");
    let (config, kmsg) = gpu_node(&dir.0, 13);
    let group = format!("/test/{:08x}/hardware-events", random_u32());
    let library = fake_nvml();
    let args = [
        "--nvml-library",
        &library,
        "--kmsg-path",
        kmsg.to_str().expect("utf-8"),
        "--period",
        "500ms",
        "--health-log-group",
        &group,
        "--health-log-region",
        "us-west-2",
        "--health-log-flush-interval",
        "200ms",
    ];
    let agent = start_agent_without_file(&[], ls.addr, &args, &[("FAKE_NVML_CONFIG", config.as_os_str())]);
    agent.wait_for("GPU 0 healthy", WAIT, |m| (state(m, "0", "healthy")? == 1.0).then_some(()));
    append_kmsg_record(&kmsg, 3, 30, XID_79);
    agent.wait_for("GPU 0 unhealthy", WAIT, |m| (state(m, "0", "unhealthy")? == 1.0).then_some(()));
    // No neuron-monitor gives an instance id: the stream is named after the host, 30 s on.
    let start = std::time::Instant::now();
    let fault = loop {
        let events = stored_events(ls.addr, &group);
        if let Some(found) = events.into_iter().find(|(_, e)| e["event"] == "fault" && e["xid"] == 79) {
            break found;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "no Xid fault event in {group}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let (stream, e) = fault;
    assert!(!stream.is_empty());
    assert_eq!((e["accelerator"].as_str(), e["gpu"].as_u64()), (Some("nvidia_gpu"), Some(0)));
    assert_eq!((e["error"].as_str(), e["action"].as_str()), (Some("XID_79"), Some("REBOOT_NODE")));
    assert_eq!(e["pci_bus_id"], "00000000:53:00.0");
    assert!(e["gpu_uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{e}");
    assert_eq!((e["state_before"].as_str(), e["state_after"].as_str()), (Some("healthy"), Some("unhealthy")));
    assert!(e["device"].is_null(), "no Neuron device: {e}");
}
