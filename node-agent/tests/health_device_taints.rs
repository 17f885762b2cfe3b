//! DeviceTaintRules of unhealthy DRA-managed devices (`spec.health.deviceTaints`), on a
//! real API server that serves the alpha `resource.k8s.io/v1alpha3` API
//! (`ControlPlane::with_device_taints`): a device fault produces a rule for that device
//! alone, with the configured effect; a driver reload removes it. On a GPU node, an Xid 79
//! of one GPU produces a rule for that GPU's device of NVIDIA's driver alone.

mod support;

use std::{ffi::OsStr, time::Duration};

use api::device_taints::{node_label, rule_name, NODE_LABEL, TAINT_KEY};
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams},
    Api, Client,
};
use neuron_e2e::{random_u32, wait_for, ControlPlane};
use support::{
    driver::{wait_for_core_counter, FakeDriver},
    node_config::write_node_config,
    sim, Agent,
};

const WAIT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

fn api(client: &Client, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", version, kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, plural))
}

/// The node's ResourceSlice as the Neuron DRA driver publishes it: the pool is the node,
/// `neurondevice<i>` stands for device `i`.
async fn publish_slice(client: &Client, node: &str, devices: u32) {
    let device = |i: u32| {
        serde_json::json!({"name": format!("neurondevice{i}"), "attributes": {
            "deviceId": {"int": i}, "resourceType": {"string": "neuron_device"}}})
    };
    support::kubelet::create_slice(client, node, "neuron.aws.com", (0..devices).map(device).collect()).await;
}

/// A Node named `<prefix>-<random>` in the API server, and the node configuration of a
/// namespace of its own asking for DeviceTaintRules with `effect`: (namespace, node).
async fn tainting_node(cp: &ControlPlane, client: &Client, prefix: &str, effect: &str) -> (String, String) {
    let namespace = cp.namespace(&format!("nm-{prefix}")).await;
    let node = format!("{prefix}-{:08x}", random_u32());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &object).await.expect("create the Node");
    let health = serde_json::json!({ "deviceTaints": { "enabled": true, "effect": effect } });
    write_node_config(client, &namespace, &node, health).await;
    (namespace, node)
}

/// The rules of `node`: (name, driver, pool, device, taint key, value, effect).
async fn rules_of(rules: &Api<DynamicObject>, node: &str) -> Option<Vec<[String; 7]>> {
    let listed = rules.list(&ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label(node)))).await.ok()?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let mut out: Vec<[String; 7]> = listed
        .items
        .iter()
        .map(|r| {
            let (selector, taint) = (&r.data["spec"]["deviceSelector"], &r.data["spec"]["taint"]);
            [
                r.metadata.name.clone().unwrap_or_default(),
                text(&selector["driver"]),
                text(&selector["pool"]),
                text(&selector["device"]),
                text(&taint["key"]),
                text(&taint["value"]),
                text(&taint["effect"]),
            ]
        })
        .collect();
    out.sort();
    Some(out)
}

#[test]
fn a_device_fault_gets_a_device_taint_rule_for_that_device_alone_until_a_driver_reload() {
    let rt = runtime();
    let cp = ControlPlane::with_device_taints();
    let client = rt.block_on(cp.client());
    let (namespace, node) = rt.block_on(tainting_node(cp, &client, "neuron-dt", "NoExecute"));
    rt.block_on(publish_slice(&client, &node, 16));
    let rules = api(&client, "v1alpha3", "DeviceTaintRule", "devicetaintrules");

    let driver = FakeDriver::start("trn1.32xlarge");
    let mut args = driver.agent_args();
    args.extend(["--node-name", &node, "--config-namespace", &namespace].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.32xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    agent.wait_for("the devices read", WAIT, |m| {
        let healthy = m.find("neuron_device_health_state", &[("state", "healthy")]);
        (healthy.iter().filter(|s| s.value == 1.0).count() == 16).then_some(())
    });
    assert_eq!(rt.block_on(rules_of(&rules, &node)), Some(vec![]), "healthy: no rule");

    driver.inject(&["dma:3"]);
    let name = rule_name(&node, "neurondevice3");
    let want = [
        name.clone(),
        "neuron.aws.com".into(),
        node.clone(),
        "neurondevice3".into(),
        TAINT_KEY.into(),
        "DMA_ERROR".into(),
        "NoExecute".into(),
    ];
    let got = rt.block_on(wait_for(WAIT, || async { rules_of(&rules, &node).await.filter(|r| !r.is_empty()) }));
    assert_eq!(got, Some(vec![want]), "one rule, for device 3 alone");
    let m = agent.metrics();
    assert_eq!(m.find("neuron_agent_health_device_taint_rules", &[])[0].value, 1.0);
    let created =
        m.sum("neuron_agent_health_device_taint_writes_total", &[("action", "create"), ("result", "written")]);
    assert_eq!(created, 1.0);
    // The Node condition stays as it is.
    let nodes: Api<Node> = Api::all(client.clone());
    let condition = rt.block_on(wait_for(WAIT, || async {
        let n = nodes.get_status(&node).await.ok()?;
        n.status?.conditions?.into_iter().find(|c| c.type_ == "NeuronHealth" && c.status == "True")
    }));
    assert!(condition.is_some(), "the condition still says the device is faulty");

    // A driver reload clears the fault (its counters back to zero): the rule goes.
    wait_for_core_counter(&agent, "3", "0", "hw_dma_abort_error");
    driver.inject(&["reload:3"]);
    let gone = rt.block_on(wait_for(WAIT, || async { rules_of(&rules, &node).await.filter(Vec::is_empty) }));
    assert_eq!(gone, Some(vec![]), "the rule is deleted once the device is healthy");
    let deleted = agent
        .metrics()
        .sum("neuron_agent_health_device_taint_writes_total", &[("action", "delete"), ("result", "written")]);
    assert_eq!(deleted, 1.0);
}

/// A p5.48xlarge on the fake NVML library whose GPUs NVIDIA's DRA driver publishes
/// (`gpu-<i>`, by UUID): an Xid 79 record of GPU 0 gives one rule, for `gpu-0`.
#[test]
fn an_xid_79_gets_a_device_taint_rule_for_that_gpus_device_of_nvidias_driver() {
    let rt = runtime();
    let cp = ControlPlane::with_device_taints();
    let client = rt.block_on(cp.client());
    let (namespace, node) = rt.block_on(tainting_node(cp, &client, "gpu-dt", "NoSchedule"));
    let rules = api(&client, "v1alpha3", "DeviceTaintRule", "devicetaintrules");

    let dir = support::TempDir::new("gpu-devtaint");
    let config = dir.0.join("nvml.yaml");
    std::fs::write(&config, "instance_type: p5.48xlarge\n").expect("fake NVML config");
    let kmsg = dir.0.join("kmsg");
    std::fs::write(&kmsg, "").expect("kmsg file");
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so").display().to_string();
    let args = [
        "--nvml-library",
        &library,
        "--kmsg-path",
        kmsg.to_str().expect("utf-8 path"),
        "--period",
        "500ms",
        "--node-name",
        &node,
        "--config-namespace",
        &namespace,
    ];
    let env = [("KUBECONFIG", OsStr::new(&cp.kubeconfig)), ("FAKE_NVML_CONFIG", config.as_os_str())];
    let agent = Agent::start_with_env(sim(), &[], &args, &env);
    let uuids = agent.wait_for("the GPUs read", WAIT, |m| {
        let healthy = m.find("gpu_health_state", &[("state", "healthy")]);
        let uuids: Vec<(String, String)> = healthy
            .iter()
            .filter(|s| s.value == 1.0)
            .filter_map(|s| Some((s.labels.get("gpu")?.clone(), s.labels.get("UUID")?.clone())))
            .collect();
        (uuids.len() == 8).then_some(uuids)
    });
    let devices = uuids.iter().map(|(gpu, uuid)| {
        serde_json::json!({"name": format!("gpu-{gpu}"), "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": uuid}}})
    });
    rt.block_on(support::kubelet::create_slice(&client, &node, "gpu.nvidia.com", devices.collect()));
    assert_eq!(rt.block_on(rules_of(&rules, &node)), Some(vec![]), "healthy: no rule");

    // GPU 0 (PCI 0000:53:00) falls off the bus, as the kernel log says.
    let record = "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=python, GPU has fallen off the bus.";
    support::driver::append_kmsg_record(&kmsg, 3, 1, record);
    let want = [
        rule_name(&node, "gpu-0"),
        "gpu.nvidia.com".into(),
        node.clone(),
        "gpu-0".into(),
        TAINT_KEY.into(),
        "XID_79".into(),
        "NoSchedule".into(),
    ];
    let got = rt.block_on(wait_for(WAIT, || async { rules_of(&rules, &node).await.filter(|r| !r.is_empty()) }));
    assert_eq!(got, Some(vec![want]), "one rule, for GPU 0's device alone");
    assert_eq!(agent.metrics().value("neuron_agent_health_device_taint_unnamed_devices", &[]), Some(0.0));
}
