//! The hardware-health event stream end to end: the real agent binary reads the fake
//! driver tree and kernel log the simulator writes, and sends a JSON event per new fault
//! and per state change to CloudWatch Logs — LocalStack (see `support::cloudwatch`),
//! read back through the SDK as a user would: the right group and stream, in order, with
//! their fields, nothing lost across throttling, failures, a stall or a SIGTERM.
//!
//! Each test writes to a log group of its own.

mod support;

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    net::SocketAddr,
    time::{Duration, Instant},
};

use api::{
    monitor_config::MonitorConfig,
    node_config::{LogDestination, NodeConfig, NodeHealth},
};
use neuron_e2e::{localstack::LocalStack, random_u32, ControlPlane};
use neuron_node_agent::attribution::podresources::NEURONDEVICE;
use serde_json::Value;
use support::{
    cloudwatch::{logs_client, start_agent, start_agent_without_file, Fault, FaultProxy, Service},
    driver::FakeDriver,
    kubelet::{holding, PodResourcesServer},
    Agent, Metrics, TempDir,
};

const WAIT: Duration = Duration::from_secs(40);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn group() -> String {
    format!("/test/{:08x}/hardware-events", random_u32())
}

/// One stored event: its CloudWatch timestamp and its JSON.
type Stored = (i64, Value);

/// Every event of every stream of `group`, by stream, in the order CloudWatch Logs
/// returns them (by timestamp). Empty while the group does not exist.
fn stored(addr: SocketAddr, region: &str, group: &str) -> BTreeMap<String, Vec<Stored>> {
    let client = logs_client(addr, region);
    runtime().block_on(async {
        let mut out = BTreeMap::new();
        let Ok(streams) = client.describe_log_streams().log_group_name(group).send().await else { return out };
        for stream in streams.log_streams() {
            let name = stream.log_stream_name().unwrap_or_default().to_owned();
            let mut events = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let page = client
                    .get_log_events()
                    .log_group_name(group)
                    .log_stream_name(&name)
                    .start_from_head(true)
                    .set_next_token(token.clone())
                    .send()
                    .await
                    .expect("GetLogEvents");
                for e in page.events() {
                    let json = serde_json::from_str(e.message().unwrap_or_default()).expect("a JSON event");
                    events.push((e.timestamp().unwrap_or_default(), json));
                }
                let next = page.next_forward_token().map(str::to_owned);
                if page.events().is_empty() || next == token {
                    break;
                }
                token = next;
            }
            out.insert(name, events);
        }
        out
    })
}

/// Waits until the group holds `n` events (and a little longer, to see that no more
/// come), then returns them by stream.
fn wait_stored(addr: SocketAddr, region: &str, group: &str, n: usize) -> BTreeMap<String, Vec<Stored>> {
    let start = Instant::now();
    loop {
        let now = stored(addr, region, group);
        let count: usize = now.values().map(Vec::len).sum();
        if count >= n {
            std::thread::sleep(Duration::from_millis(1500));
            return stored(addr, region, group);
        }
        assert!(start.elapsed() < WAIT, "{count} of {n} events stored in {group}: {now:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// (event, device) of an event, for comparisons.
fn kind(e: &Value) -> (String, Option<u64>) {
    (e["event"].as_str().unwrap_or_default().to_owned(), e["device"].as_u64())
}

fn log_events(m: &Metrics, result: &str) -> f64 {
    m.sum("neuron_agent_health_log_events_total", &[("result", result)])
}

fn instance_id(agent: &Agent) -> String {
    agent.wait_for("instance_info", WAIT, |m| {
        m.find("instance_info", &[]).first().and_then(|s| s.labels.get("instance_id").cloned())
    })
}

fn wait_state(agent: &Agent, device: &str, state: &str) {
    agent.wait_for(&format!("device {device} {state}"), WAIT, |m| {
        let labels = [("neuron_device_index", device), ("state", state)];
        (m.find("neuron_device_health_state", &labels).first()?.value == 1.0).then_some(())
    });
}

/// Events of the agent's start, of each injected step, in stream order: the steps follow
/// each other, and each holds exactly the (event, device) pairs expected.
fn split_steps<'a>(events: &'a [Stored], steps: &[Vec<(&str, Option<u64>)>]) -> Vec<&'a [Stored]> {
    let mut out = Vec::new();
    let mut at = 0;
    for step in steps {
        let part = &events[at..(at + step.len()).min(events.len())];
        let mut got: Vec<(String, Option<u64>)> = part.iter().map(|(_, e)| kind(e)).collect();
        let mut want: Vec<(String, Option<u64>)> = step.iter().map(|(k, d)| ((*k).to_owned(), *d)).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "events {at}.. of {events:#?}");
        out.push(part);
        at += step.len();
    }
    assert_eq!(at, events.len(), "no more events than expected: {events:#?}");
    out
}

#[test]
fn faults_and_state_changes_reach_the_instance_stream_in_order_with_their_fields() {
    let ls = LocalStack::shared();
    let cp = ControlPlane::shared();
    let driver = FakeDriver::start("trn2.48xlarge");
    let dir = TempDir::new("kubelet");
    let socket = dir.0.join("kubelet.sock");
    let kubelet = PodResourcesServer::start(&socket);
    kubelet.set(vec![holding("team-a", "train-0", "main", NEURONDEVICE, &[2, 3])]);
    let group = group();
    let node = format!("neuron-node-{:08x}", random_u32());
    let mut args = driver.agent_args();
    args.extend(
        [
            "--health-log-group",
            &group,
            "--node-name",
            &node,
            "--pod-resources-socket",
            socket.to_str().expect("utf-8"),
            "--pod-resources-interval",
            "300ms",
            "--health-log-flush-interval",
            "200ms",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // No region named: the instance's, from neuron-monitor's instance_info (us-west-2).
    let agent = start_agent_without_file(
        &["--instance-type=trn2.48xlarge"],
        ls.addr,
        &args,
        &[("KUBECONFIG", OsStr::new(&cp.kubeconfig))],
    );
    let instance = instance_id(&agent);
    agent.wait_for("the pod holding device 2", WAIT, |m| {
        let labels = [("neuron_device_index", "2"), ("state", "healthy"), ("pods", "team-a/train-0")];
        (m.find("neuron_device_health_state", &labels).len() == 1).then_some(())
    });
    let serial = |d: u32| {
        let path = driver.sys().join(format!("devices/virtual/neuron_device/neuron{d}/info/serial_number"));
        std::fs::read_to_string(path).expect("serial number").trim().to_owned()
    };

    // One step at a time, each seen through before the next.
    driver.inject(&["nc-ue:2:1"]);
    wait_state(&agent, "2", "unhealthy");
    driver.inject(&["heartbeat-stall:7"]);
    wait_state(&agent, "7", "unknown");
    driver.inject(&["repairable-hbm:4"]);
    wait_state(&agent, "4", "unhealthy");
    let steps = [
        vec![("state_change", None)],
        vec![("fault", Some(2)), ("fault", Some(2)), ("state_change", Some(2)), ("state_change", None)],
        vec![("state_change", Some(7))],
        vec![("fault", Some(4)), ("fault", Some(4)), ("state_change", Some(4))],
    ];
    let expected: usize = steps.iter().map(Vec::len).sum();
    let streams = wait_stored(ls.addr, "us-west-2", &group, expected);

    // One stream, named after the instance id.
    assert_eq!(streams.keys().collect::<Vec<_>>(), [&instance], "{streams:#?}");
    let events = &streams[&instance];
    assert!(events.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
    let parts = split_steps(events, &steps);
    for (_, e) in events {
        assert_eq!(e["instance_id"], instance.as_str());
        assert_eq!(e["node"], node.as_str());
        assert_eq!(e["driver_version"], "2.30.2.0");
        assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
    }
    let start = &parts[0][0].1;
    assert_eq!((start["state_before"].as_str(), start["state_after"].as_str()), (Some("unknown"), Some("healthy")));

    // The NC error: from the kernel log and from the core's counter, on device 2, core 1,
    // with the pod that held the device.
    let faults: Vec<&Value> = parts[1].iter().map(|(_, e)| e).filter(|e| e["event"] == "fault").collect();
    let mut sources: Vec<&str> = faults.iter().filter_map(|e| e["source"].as_str()).collect();
    sources.sort();
    assert_eq!(sources, ["kernel_log", "sysfs"]);
    for fault in &faults {
        assert_eq!(fault["error"], "NC_UNCORRECTABLE_ERROR");
        assert_eq!((fault["device"].as_u64(), fault["core"].as_u64()), (Some(2), Some(1)));
        assert_eq!(fault["serial_number"], serial(2).as_str());
        assert_eq!(fault["action"], "TERMINATE_INSTANCE");
        assert_eq!(fault["pods"], serde_json::json!(["team-a/train-0"]));
        assert_eq!(fault["state_after"], "unhealthy");
    }
    let befores: Vec<&str> = faults.iter().filter_map(|e| e["state_before"].as_str()).collect();
    assert!(befores.contains(&"healthy"), "the first of the two found the device healthy: {befores:?}");
    let kernel = faults.iter().find(|e| e["source"] == "kernel_log").expect("the kernel record");
    assert_eq!(kernel["counter"], Value::Null);
    let device = parts[1].iter().map(|(_, e)| e).find(|e| kind(e) == ("state_change".to_owned(), Some(2)));
    let device = device.expect("device 2's state change");
    assert_eq!((device["state_before"].as_str(), device["state_after"].as_str()), (Some("healthy"), Some("unhealthy")));
    assert_eq!(device["error"], "NC_UNCORRECTABLE_ERROR");

    // The stalled heartbeat: a state change only, with why.
    let stalled = &parts[2][0].1;
    assert_eq!((stalled["state_before"].as_str(), stalled["state_after"].as_str()), (Some("healthy"), Some("unknown")));
    assert_eq!(stalled["unknown_reason"], "heartbeat_stalled");
    assert_eq!(stalled["pods"], serde_json::json!([]), "no pod holds device 7");

    // The repairable HBM error: its own action, not "replace the instance".
    for (_, e) in parts[3].iter().filter(|(_, e)| e["event"] == "fault") {
        assert_eq!(e["error"], "REPAIRABLE_HBM_UNCORRECTABLE_ERROR");
        assert_eq!(e["action"], "RELOAD_DRIVER_OR_REBOOT");
    }

    let m = agent.metrics();
    assert_eq!(log_events(&m, "sent"), expected as f64);
    assert_eq!(log_events(&m, "dropped") + log_events(&m, "failed"), 0.0);
    assert_eq!(m.value("neuron_agent_health_log_queue_events", &[]), Some(0.0));
}

#[test]
fn nothing_is_lost_across_throttling_failures_and_a_stall() {
    let ls = LocalStack::shared();
    let proxy = FaultProxy::start_for(ls.addr, Service::Logs);
    proxy.plan([
        Fault::Throttle,
        Fault::Throttle,
        Fault::Throttle,
        Fault::ServerError,
        Fault::ServerError,
        // Longer than the agent's attempt time-out: given up, retried, never stored twice.
        Fault::Stall(Duration::from_secs(4)),
    ]);
    let driver = FakeDriver::start("trn1.32xlarge");
    let group = group();
    let mut args = driver.agent_args();
    args.extend(
        [
            "--health-log-group",
            &group,
            "--health-log-region",
            "us-east-1",
            "--health-log-flush-interval",
            "100ms",
            "--cloudwatch-retry-initial",
            "100ms",
            "--cloudwatch-retry-max",
            "400ms",
            "--cloudwatch-request-timeout",
            "2500ms",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = start_agent_without_file(&["--instance-type=trn1.32xlarge"], proxy.addr, &args, &[]);
    let instance = instance_id(&agent);
    // Faults keep coming while CloudWatch Logs throttles, fails and stalls.
    for device in 0..8 {
        driver.inject(&[&format!("hbm-ue:{device}")]);
        // Both readers saw it (the kernel record, the ECC counter) before the next one.
        let device = device.to_string();
        agent.wait_for("the device's two faults", WAIT, |m| {
            let d = ("neuron_device_index", device.as_str());
            let kernel = m.value("neuron_hardware_errors_total", &[d, ("error", "HBM_UNCORRECTABLE_ERROR")]);
            let ecc = m.value("neuron_device_ecc_errors_total", &[d, ("memory", "hbm"), ("kind", "uncorrected")]);
            (kernel == Some(1.0) && ecc == Some(1.0)).then_some(())
        });
    }
    // The start, then per device its two faults (kernel record, ECC counter) and its
    // state; the node turns unhealthy with the first.
    let expected = 1 + 8 * 3 + 1;
    let streams = wait_stored(ls.addr, "us-east-1", &group, expected);
    assert_eq!(proxy.pending(), 0, "every planned fault was served");
    assert_eq!(streams.keys().collect::<Vec<_>>(), [&instance]);
    let events = &streams[&instance];
    assert_eq!(events.len(), expected, "each event exactly once: {events:#?}");
    // No two alike but for their time: nothing was stored twice.
    let mut seen: Vec<String> = events
        .iter()
        .map(|(_, e)| {
            let mut e = e.clone();
            e["time"] = Value::Null;
            e.to_string()
        })
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), expected, "no duplicates");
    // In the order the devices failed.
    let order: Vec<u64> =
        events.iter().filter(|(_, e)| e["event"] == "fault").filter_map(|(_, e)| e["device"].as_u64()).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");

    let m = agent.metrics();
    let failures = |reason| m.sum("neuron_agent_health_log_failures_total", &[("reason", reason)]);
    assert_eq!(failures("throttled"), 3.0);
    assert_eq!(failures("server_error"), 2.0);
    assert!(failures("timeout") >= 1.0, "the stall: {}", m.text);
    assert_eq!(log_events(&m, "sent"), expected as f64);
    assert_eq!(log_events(&m, "dropped") + log_events(&m, "failed"), 0.0);
}

#[test]
fn sigterm_sends_the_queued_events() {
    let ls = LocalStack::shared();
    let driver = FakeDriver::start("trn1.32xlarge");
    let group = group();
    let mut args = driver.agent_args();
    // Events wait up to an hour for company: only the shutdown sends them.
    args.extend(["--health-log-group", &group, "--health-log-flush-interval", "1h"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = start_agent_without_file(&["--instance-type=trn1.32xlarge"], ls.addr, &args, &[]);
    let instance = instance_id(&agent);
    driver.inject(&["sram-ue:1", "dma:3:0"]);
    wait_state(&agent, "1", "unhealthy");
    wait_state(&agent, "3", "unhealthy");
    // The start; SRAM: two faults, the device and the node; DMA: two faults, the device.
    let expected = 1 + 4 + 3;
    agent.wait_for("the events queued", WAIT, |m| {
        (m.value("neuron_agent_health_log_queue_events", &[]) == Some(expected as f64)).then_some(())
    });
    assert_eq!(log_events(&agent.metrics(), "sent"), 0.0);
    assert!(stored(ls.addr, "us-west-2", &group).is_empty(), "nothing sent before the shutdown");

    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let streams = stored(ls.addr, "us-west-2", &group);
    assert_eq!(streams.keys().collect::<Vec<_>>(), [&instance]);
    let events = &streams[&instance];
    assert_eq!(events.len(), expected, "{events:#?}");
    let errors: Vec<&str> = events.iter().filter_map(|(_, e)| e["error"].as_str()).collect();
    assert!(errors.contains(&"SRAM_UNCORRECTABLE_ERROR") && errors.contains(&"DMA_ERROR"), "{errors:?}");
}

/// The agent on `driver`'s trn1.32xlarge with `extra` flags, following a node
/// configuration whose health settings (a NeuronMonitorConfig's `spec.health`, rendered
/// by the operator) send the events to `destination`.
fn start_with_destination(ls: &LocalStack, driver: &FakeDriver, destination: LogDestination, extra: &[&str]) -> Agent {
    let mut args = driver.agent_args();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let health = NodeHealth { config: "ops/health".to_owned(), logs: Some(destination), ..NodeHealth::default() };
    let monitor = MonitorConfig::all_groups("1s".parse().expect("period"));
    let node_config = serde_json::to_value(NodeConfig { monitor, routes: Vec::new(), health: Some(health), gpu: None })
        .expect("a node configuration");
    start_agent(&["--instance-type=trn1.32xlarge"], &node_config, ls.addr, &args)
}

/// The node configuration's `health.logs` (a NeuronMonitorConfig's `spec.health.logs`,
/// rendered by the operator) chooses the group over the agent's flags.
#[test]
fn the_node_configurations_log_group_wins_over_the_flags() {
    let ls = LocalStack::shared();
    let driver = FakeDriver::start("trn1.32xlarge");
    let (configured, flagged) = (group(), group());
    let destination = LogDestination { group: configured.clone(), region: Some("us-west-2".to_owned()) };
    let agent = start_with_destination(ls, &driver, destination, &["--health-log-group", &flagged]);
    let instance = instance_id(&agent);
    driver.inject(&["hbm-ue:5"]);
    wait_state(&agent, "5", "unhealthy");
    let streams = wait_stored(ls.addr, "us-west-2", &configured, 2);
    let events = &streams[&instance];
    assert!(events.iter().any(|(_, e)| e["error"] == "HBM_UNCORRECTABLE_ERROR" && e["device"] == 5), "{events:#?}");
    assert!(stored(ls.addr, "us-west-2", &flagged).is_empty(), "nothing in the flags' group");
}

/// A log destination in another AWS partition than the instance's (`us-gov-west-1` from
/// the simulator's `us-west-2`) is refused by the agent too, behind the operator's
/// tenancy policy: nothing is sent, the destination is reported invalid.
#[test]
fn a_destination_in_another_partition_is_refused() {
    let ls = LocalStack::shared();
    let driver = FakeDriver::start("trn1.32xlarge");
    let configured = group();
    let destination = LogDestination { group: configured.clone(), region: Some("us-gov-west-1".to_owned()) };
    let agent = start_with_destination(ls, &driver, destination, &[]);
    driver.inject(&["hbm-ue:5"]);
    wait_state(&agent, "5", "unhealthy");
    agent.wait_for("the destination reported invalid", WAIT, |m| {
        (m.value("neuron_agent_health_log_invalid_destination", &[])? == 1.0).then_some(())
    });
    assert_eq!(log_events(&agent.metrics(), "sent"), 0.0);
    assert!(stored(ls.addr, "us-gov-west-1", &configured).is_empty(), "nothing in GovCloud's group");
    assert!(stored(ls.addr, "us-west-2", &configured).is_empty(), "nor in the instance's region");
}
