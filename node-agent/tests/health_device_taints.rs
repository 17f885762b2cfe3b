//! DeviceTaintRules of unhealthy DRA-managed devices (`spec.health.deviceTaints`), on a
//! real API server that serves the alpha `resource.k8s.io/v1alpha3` API
//! (`ControlPlane::with_device_taints`): a device fault produces a rule for that device
//! alone, with the configured effect; a driver reload removes it.

mod support;

use std::{ffi::OsStr, time::Duration};

use api::device_taints::{node_label, rule_name, NODE_LABEL, TAINT_KEY};
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams},
    Api, Client,
};
use neuron_e2e::{random_u32, wait_for, ControlPlane};
use support::{driver::FakeDriver, node_config::write_node_config, sim, Agent};

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
    let slice: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-neuron")},
        "spec": {"driver": "neuron.aws.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": (0..devices).map(device).collect::<Vec<_>>()}
    }))
    .expect("a ResourceSlice");
    api(client, "v1", "ResourceSlice", "resourceslices")
        .create(&PostParams::default(), &slice)
        .await
        .expect("create the ResourceSlice");
}

/// The rules of `node`: (name, pool, device, taint key, value, effect).
async fn rules_of(rules: &Api<DynamicObject>, node: &str) -> Option<Vec<[String; 6]>> {
    let listed = rules.list(&ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label(node)))).await.ok()?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let mut out: Vec<[String; 6]> = listed
        .items
        .iter()
        .map(|r| {
            let (selector, taint) = (&r.data["spec"]["deviceSelector"], &r.data["spec"]["taint"]);
            [
                r.metadata.name.clone().unwrap_or_default(),
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
    let namespace = rt.block_on(cp.namespace("nm-devtaint"));
    let node = format!("neuron-dt-{:08x}", random_u32());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    rt.block_on(Api::<Node>::all(client.clone()).create(&PostParams::default(), &object)).expect("create the Node");
    rt.block_on(publish_slice(&client, &node, 16));
    let health = serde_json::json!({ "deviceTaints": { "enabled": true, "effect": "NoExecute" } });
    rt.block_on(write_node_config(&client, &namespace, &node, health));
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
    let want =
        [name.clone(), node.clone(), "neurondevice3".into(), TAINT_KEY.into(), "DMA_ERROR".into(), "NoExecute".into()];
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
    driver.inject(&["reload:3"]);
    let gone = rt.block_on(wait_for(WAIT, || async { rules_of(&rules, &node).await.filter(Vec::is_empty) }));
    assert_eq!(gone, Some(vec![]), "the rule is deleted once the device is healthy");
    let deleted = agent
        .metrics()
        .sum("neuron_agent_health_device_taint_writes_total", &[("action", "delete"), ("result", "written")]);
    assert_eq!(deleted, 1.0);
}
