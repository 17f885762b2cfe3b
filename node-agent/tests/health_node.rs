//! Neuron hardware health on the Node, on the real control plane: the condition
//! `NeuronHealth` and an Event per new fault naming the device, core, serial number,
//! action and the pod that held the device (from the kubelet's pod-resources API).

mod support;

use std::{ffi::OsStr, time::Duration};

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    api::{ListParams, PostParams},
    Api,
};
use neuron_e2e::{random_u32, wait_for, ControlPlane};
use neuron_node_agent::attribution::podresources::NEURONDEVICE;
use support::{
    driver::FakeDriver,
    kubelet::{holding, PodResourcesServer},
    sim, Agent, TempDir,
};

const WAIT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// The node's `NeuronHealth` condition as (status, reason).
async fn condition(nodes: &Api<Node>, node: &str) -> Option<(String, String)> {
    let node = nodes.get_status(node).await.ok()?;
    let c = node.status?.conditions?.into_iter().find(|c| c.type_ == "NeuronHealth")?;
    Some((c.status, c.reason.unwrap_or_default()))
}

#[test]
fn a_fault_sets_the_node_condition_and_publishes_an_event_naming_the_pod() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let node = format!("neuron-node-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");

    let driver = FakeDriver::start("trn1.32xlarge");
    let dir = TempDir::new("kubelet");
    let socket = dir.0.join("kubelet.sock");
    let kubelet = PodResourcesServer::start(&socket);
    kubelet.set(vec![holding("team-a", "train-0", "main", NEURONDEVICE, &[2, 3])]);
    let mut args = driver.agent_args();
    args.extend(
        [
            "--node-name",
            &node,
            "--pod-resources-socket",
            socket.to_str().expect("utf-8"),
            "--pod-resources-interval",
            "300ms",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.32xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );

    let healthy = rt
        .block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(status, _)| status == "False") }));
    assert_eq!(healthy, Some(("False".to_owned(), "NeuronHasNoError".to_owned())));

    driver.inject(&["nc-ue:2:1"]);
    let faulty =
        rt.block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(status, _)| status == "True") }));
    assert_eq!(faulty, Some(("True".to_owned(), "NeuronHasError_NC_UNCORRECTABLE_ERROR".to_owned())));

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let note = rt.block_on(wait_for(WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
            .filter(|e| e.reason.as_deref() == Some("NeuronHasError_NC_UNCORRECTABLE_ERROR"))
            .find_map(|e| e.note)
    }));
    let note = note.expect("an Event for the fault");
    for part in ["Neuron device 2", "core 1", "serial 19fcda00f5ff6e02", "TERMINATE_INSTANCE", "team-a/train-0"] {
        assert!(note.contains(part), "{part:?} in {note:?}");
    }
    // The device's health series name the pod too, so that an alert can.
    let m = agent.metrics();
    let unhealthy = m.find("neuron_device_health_state", &[("neuron_device_index", "2"), ("state", "unhealthy")]);
    assert_eq!(unhealthy.len(), 1);
    assert_eq!((unhealthy[0].value, unhealthy[0].labels["pods"].as_str()), (1.0, "team-a/train-0"));
    let idle = m.find("neuron_device_health_state", &[("neuron_device_index", "0"), ("state", "healthy")]);
    assert_eq!(idle[0].labels["pods"], "", "a device no pod holds");
}
