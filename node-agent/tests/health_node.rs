//! Neuron hardware health on the Node, on the real control plane: the condition
//! `NeuronHealth` and an Event per new fault naming the device, core, serial number,
//! action and the pod that held the device (from the kubelet's pod-resources API); the
//! health settings of the node configuration (condition type, NoSchedule taint) followed
//! at runtime.

mod support;

use std::{ffi::OsStr, time::Duration};

use k8s_openapi::api::{
    core::v1::{Node, Taint},
    events::v1::Event,
};
use kube::{
    api::{DeleteParams, ListParams, PostParams},
    Api, Client,
};
use neuron_e2e::{random_u32, wait_for, ControlPlane};
use neuron_node_agent::attribution::podresources::NEURONDEVICE;
use neuron_node_agent::health::taint::TAINT_KEY;
use support::{
    api_outage::ApiRelay,
    driver::{wait_for_core_counter, wait_kmsg_live, FakeDriver},
    kubelet::{holding, PodResourcesServer},
    node_config::write_node_config,
    sim, Agent, TempDir,
};

const WAIT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// A Node of a fresh name, created on the control plane, and the Nodes' API.
async fn new_node(client: &Client) -> (Api<Node>, String) {
    let node = format!("neuron-node-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    nodes.create(&PostParams::default(), &object).await.expect("create the Node");
    (nodes, node)
}

/// The node's `NeuronHealth` condition as (status, reason).
async fn condition(nodes: &Api<Node>, node: &str) -> Option<(String, String)> {
    condition_of(nodes, node, "NeuronHealth").await
}

/// The node's condition `type_` as (status, reason).
async fn condition_of(nodes: &Api<Node>, node: &str, type_: &str) -> Option<(String, String)> {
    let node = nodes.get_status(node).await.ok()?;
    let c = node.status?.conditions?.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason.unwrap_or_default()))
}

#[test]
fn a_fault_sets_the_node_condition_and_publishes_an_event_naming_the_pod() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let (nodes, node) = rt.block_on(new_node(&client));

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

/// The node's taints.
async fn taints(nodes: &Api<Node>, node: &str) -> Option<Vec<Taint>> {
    Some(nodes.get(node).await.ok()?.spec?.taints.unwrap_or_default())
}

/// Tainting is off by default and follows the node configuration at runtime: on, a fatal
/// fault taints the Node NoSchedule (another writer's taint kept) and a driver reload
/// takes the taint away; a fault outside the taint list does not taint; turned off, the
/// taint goes though the fault stays. The condition's type follows the configuration too.
#[test]
fn the_agent_taints_its_node_on_a_fatal_fault_as_its_configuration_says() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let namespace = rt.block_on(cp.namespace("nm-taint"));
    let node = format!("neuron-node-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let other = serde_json::json!({ "key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule" });
    let object: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": node }, "spec": { "taints": [other] }
    }))
    .expect("node");
    // The API server adds its own (node.kubernetes.io/not-ready): other writers' taints.
    let created = rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");
    let others = created.spec.and_then(|s| s.taints).unwrap_or_default();
    let other: Taint = serde_json::from_value(other).expect("taint");
    assert!(others.contains(&other), "{others:?}");
    let with = |taint: Option<Taint>| others.iter().cloned().chain(taint).collect::<Vec<Taint>>();
    rt.block_on(write_node_config(&client, &namespace, &node, serde_json::json!({ "taint": { "enabled": true } })));

    let driver = FakeDriver::start("trn1.2xlarge");
    let mut args = driver.agent_args();
    args.extend(["--node-name", &node, "--config-namespace", &namespace].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.2xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    let ours = |error: &str| Taint {
        key: TAINT_KEY.to_owned(),
        value: Some(error.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    };
    let taints_are = |wanted: Vec<Taint>| {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            let got = wait_for(WAIT, || async { taints(&nodes, &node).await.filter(|t| *t == wanted) }).await;
            if got.is_none() {
                assert_eq!(taints(&nodes, &node).await, Some(wanted), "the Node's taints after {WAIT:?}");
            }
        }
    };

    let healthy = rt
        .block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(status, _)| status == "False") }));
    assert_eq!(healthy.map(|c| c.1).as_deref(), Some("NeuronHasNoError"));
    assert_eq!(rt.block_on(taints(&nodes, &node)), Some(with(None)), "healthy: no taint of ours");

    // A fatal fault: tainted, the other taint kept.
    driver.inject(&["nc-ue:0:0"]);
    rt.block_on(taints_are(with(Some(ours("NC_UNCORRECTABLE_ERROR")))));
    let m = agent.metrics();
    assert_eq!(m.find("neuron_agent_health_taint_active", &[])[0].value, 1.0);
    let writes = m.find("neuron_agent_health_taint_writes_total", &[("action", "add"), ("result", "written")]);
    assert_eq!(writes[0].value, 1.0);
    // A driver reload clears the fault, and the taint.
    wait_for_core_counter(&agent, "0", "0", "hw_nc_ue_error");
    driver.inject(&["reload"]);
    let cleared = rt
        .block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(status, _)| status == "False") }));
    assert!(cleared.is_some(), "the reload clears the fault");
    rt.block_on(taints_are(with(None)));

    // At runtime: another condition type, and only DMA errors taint.
    let health =
        serde_json::json!({ "conditionType": "NeuronHardware", "taint": { "enabled": true, "errors": ["DMA_ERROR"] } });
    rt.block_on(write_node_config(&client, &namespace, &node, health));
    let renamed = rt.block_on(wait_for(WAIT, || async {
        let new = condition_of(&nodes, &node, "NeuronHardware").await?;
        condition(&nodes, &node).await.is_none().then_some(new)
    }));
    assert_eq!(renamed.map(|c| c.1).as_deref(), Some("NeuronHasNoError"), "the old type's condition removed");
    driver.inject(&["nc-ue:0:0"]);
    let faulty = rt.block_on(wait_for(WAIT, || async {
        condition_of(&nodes, &node, "NeuronHardware").await.filter(|(status, _)| status == "True")
    }));
    assert!(faulty.is_some(), "the fault reaches the renamed condition");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(rt.block_on(taints(&nodes, &node)), Some(with(None)), "not in the taint list");
    driver.inject(&["dma:0"]);
    rt.block_on(taints_are(with(Some(ours("DMA_ERROR")))));

    // Tainting turned off: the taint goes, the fault stays.
    rt.block_on(write_node_config(
        &client,
        &namespace,
        &node,
        serde_json::json!({ "conditionType": "NeuronHardware" }),
    ));
    rt.block_on(taints_are(with(None)));
    let still = rt.block_on(condition_of(&nodes, &node, "NeuronHardware"));
    assert_eq!(still.map(|c| c.0).as_deref(), Some("True"));
    drop(agent);
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the Node");
}

/// The look-back of the node configuration (`spec.health.kmsgLookBack`) is in force when
/// the kernel-log reader starts: the agent reads its configuration first.
#[test]
fn the_configured_look_back_applies_from_the_agents_start() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let namespace = rt.block_on(cp.namespace("nm-lookback"));
    let node = format!("neuron-node-{:08x}", random_u32());
    rt.block_on(write_node_config(&client, &namespace, &node, serde_json::json!({ "kmsgLookBack": "10m" })));
    let driver = FakeDriver::start("trn1.2xlarge");
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .expect("uptime");
    assert!(uptime > 300.0, "the test needs a host up for 5 minutes");
    // Three minutes old: beyond the flag's look-back (1m), within the configuration's (10m).
    let stamp = ((uptime - 180.0) * 1e6) as u64;
    driver.record(&format!("3,7,{stamp},-;NEURON_HW_ERR=DMA_ERROR nd-id=0 nc-id=0 action=TERMINATE_INSTANCE"));
    let mut args = driver.agent_args();
    args.extend(["--kmsg-lookback", "1m", "--node-name", &node, "--config-namespace", &namespace].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.2xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    agent.wait_for("the old record counted", WAIT, |m| {
        let n = m.sum("neuron_hardware_errors_total", &[("neuron_device_index", "0"), ("error", "DMA_ERROR")]);
        (n == 1.0).then_some(())
    });
}

/// Issue 24, fault 9: a fault that comes back after a driver reload is announced again
/// (a second Event, or the first one's series counting two).
#[test]
fn a_fault_recurring_after_a_driver_reload_gets_a_new_event() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let (nodes, node) = rt.block_on(new_node(&client));
    let driver = FakeDriver::start("trn1.2xlarge");
    let mut args = driver.agent_args();
    args.extend(["--node-name", &node].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.2xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    let status_is = |wanted: &'static str| {
        let (nodes, node) = (nodes.clone(), node.clone());
        async move { wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(s, _)| s == wanted) }).await }
    };
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    // Occurrences of the fault's Event on this Node: Events, or their series' counts.
    let occurrences = |at_least: i32| {
        let (events, node) = (events.clone(), node.clone());
        async move {
            wait_for(WAIT, || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                let n: i32 = list
                    .items
                    .iter()
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
                    .filter(|e| e.reason.as_deref() == Some("NeuronHasError_NC_UNCORRECTABLE_ERROR"))
                    .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                    .sum();
                (n >= at_least).then_some(n)
            })
            .await
        }
    };
    assert!(rt.block_on(status_is("False")).is_some());
    driver.inject(&["nc-ue:0:1"]);
    assert!(rt.block_on(status_is("True")).is_some());
    // Two faults: the kernel record's and the core counter's.
    assert_eq!(rt.block_on(occurrences(2)), Some(2));
    driver.inject(&["reload"]);
    assert!(rt.block_on(status_is("False")).is_some(), "the reload clears the fault");
    driver.inject(&["nc-ue:0:1"]);
    assert!(rt.block_on(status_is("True")).is_some());
    assert_eq!(rt.block_on(occurrences(4)), Some(4), "the recurrence is announced");
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the Node");
}

/// Occurrences of the Events of `node` with `reason`: Events, or their series' counts.
async fn occurrences(events: &Api<Event>, node: &str, reason: &str) -> Option<i32> {
    let list = events.list(&ListParams::default()).await.ok()?;
    let n = list
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    Some(n)
}

/// Issue 41, item 4, for Neuron devices: a fault while the API server is down, and the
/// agent restarted during the outage: once the API server is back, the Node condition
/// names the fault and its Events are written. An Event written before a restart is not
/// written again after it (a new fault's Event, written after the earlier ones would be,
/// shows the agent got that far).
#[test]
fn a_neuron_faults_events_survive_an_agent_restart_during_an_api_server_outage() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let (nodes, node) = rt.block_on(new_node(&client));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let driver = FakeDriver::start("trn1.32xlarge");
    let dir = TempDir::new("outage");
    let relay = ApiRelay::start(cp, &dir.0);
    let mut args = driver.agent_args();
    args.extend(["--node-name", &node].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Each agent on the state directory its predecessor left.
    let start_on = |state: Option<&[u8]>| {
        Agent::start_configured(sim(), &["--instance-type=trn1.32xlarge"], &args, |command, state_dir| {
            command.env("KUBECONFIG", &relay.kubeconfig);
            if let Some(state) = state {
                std::fs::write(state_dir.join("neuron-health.json"), state).expect("persisted state");
            }
        })
    };
    let state_of = |agent: &Agent| -> serde_json::Value {
        let text = std::fs::read(agent.state_dir.0.join("neuron-health.json")).unwrap_or_default();
        serde_json::from_slice(&text).unwrap_or_default()
    };
    let reasons_of_device_2 = |state: &serde_json::Value| {
        let devices = state["devices"].as_array().cloned().unwrap_or_default();
        let device = devices.into_iter().find(|d| d["index"] == 2).unwrap_or_default();
        device["reasons"].as_array().map_or(0, Vec::len)
    };
    let nc = "NeuronHasError_NC_UNCORRECTABLE_ERROR";

    let first = start_on(None);
    let healthy =
        rt.block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(s, _)| s == "False") }));
    assert!(healthy.is_some());
    wait_kmsg_live(&first);
    relay.cut();
    // Two faults: the kernel record's and the core counter's, both persisted.
    driver.inject(&["nc-ue:2:1"]);
    wait_for_core_counter(&first, "2", "1", "hw_nc_ue_error");
    first.wait_until("both faults persisted", WAIT, |a| reasons_of_device_2(&state_of(a)) == 2);
    let saved = serde_json::to_vec(&state_of(&first)).expect("the persisted state");
    drop(first);

    // Restarted during the outage; then the API server is back.
    let second = start_on(Some(&saved));
    second.wait_for("device 2 unhealthy, restored", WAIT, |m| {
        let unhealthy = m.value("neuron_device_health_state", &[("neuron_device_index", "2"), ("state", "unhealthy")]);
        (unhealthy? == 1.0).then_some(())
    });
    relay.restore();
    let faulty = rt.block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(s, _)| s == "True") }));
    assert_eq!(faulty, Some(("True".to_owned(), nc.to_owned())));
    let written = rt.block_on(wait_for(WAIT, || async { occurrences(&events, &node, nc).await.filter(|n| *n >= 2) }));
    assert_eq!(written, Some(2), "both faults' Events, after the outage");
    second.wait_until("the Events persisted as written", WAIT, |a| {
        state_of(a)["announced"].as_array().is_some_and(|a| a.len() == 2)
    });
    let saved = serde_json::to_vec(&state_of(&second)).expect("the persisted state");
    drop(second);

    // Restarted after the Events: a new fault gets its Event, the written ones no second.
    let third = start_on(Some(&saved));
    wait_kmsg_live(&third);
    driver.inject(&["hbm-ue:5"]);
    let hbm = "NeuronHasError_HBM_UNCORRECTABLE_ERROR";
    let later = rt.block_on(wait_for(WAIT, || async { occurrences(&events, &node, hbm).await.filter(|n| *n >= 1) }));
    assert!(later.is_some(), "the new fault's Event");
    assert_eq!(rt.block_on(occurrences(&events, &node, nc)), Some(2), "written once");
    drop(third);
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the Node");
}

/// Issue 24, fault 2: 40 error names outside the documented set, then a real HBM fault:
/// the fault keeps its name (the documented names have their own slots in the name
/// table), so the Node is tainted with it and its condition names it.
#[test]
fn undocumented_error_names_do_not_take_the_slot_of_a_real_fault() {
    let rt = runtime();
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let namespace = rt.block_on(cp.namespace("nm-names"));
    let (nodes, node) = rt.block_on(new_node(&client));
    rt.block_on(write_node_config(&client, &namespace, &node, serde_json::json!({ "taint": { "enabled": true } })));
    let driver = FakeDriver::start("trn1.2xlarge");
    let mut args = driver.agent_args();
    args.extend(["--node-name", &node, "--config-namespace", &namespace].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_env(
        sim(),
        &["--instance-type=trn1.2xlarge"],
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    let healthy = rt
        .block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(status, _)| status == "False") }));
    assert!(healthy.is_some());
    // Stamped at boot: read as history, the look-back would skip them.
    wait_kmsg_live(&agent);
    let names = ('A'..='Z').chain('0'..='9').map(String::from).chain(["AA", "AB", "AC", "AD"].map(str::to_owned));
    for (i, name) in names.enumerate() {
        driver.record(&format!("3,{},1,-;NEURON_HW_ERR={name} nd-id=0 nc-id=0", 1000 + i));
    }
    agent.wait_for("the 40 records", WAIT, |m| {
        (m.sum("neuron_hardware_errors_total", &[("neuron_device_index", "0")]) == 40.0).then_some(())
    });
    // A second later: the latest fault names the condition.
    std::thread::sleep(Duration::from_millis(1100));
    driver.inject(&["hbm-ue:0"]);
    let ours = |taint: &Taint| taint.key == TAINT_KEY;
    let tainted = rt.block_on(wait_for(WAIT, || async { taints(&nodes, &node).await?.into_iter().find(ours) }));
    assert_eq!(tainted.and_then(|t| t.value).as_deref(), Some("HBM_UNCORRECTABLE_ERROR"));
    let named = "NeuronHasError_HBM_UNCORRECTABLE_ERROR";
    let shown = rt.block_on(wait_for(WAIT, || async { condition(&nodes, &node).await.filter(|(_, r)| r == named) }));
    assert_eq!(shown.map(|c| c.0).as_deref(), Some("True"), "the latest fault names the condition");
    let m = agent.metrics();
    let errors =
        |error: &str| m.value("neuron_hardware_errors_total", &[("neuron_device_index", "0"), ("error", error)]);
    assert_eq!(errors("HBM_UNCORRECTABLE_ERROR"), Some(1.0));
    drop(agent);
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the Node");
}
