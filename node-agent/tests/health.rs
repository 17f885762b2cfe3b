//! Neuron hardware health end to end: the real agent binary reads the fake driver tree
//! and kernel log that the simulator writes, and shows each fault on /metrics.

mod support;

use std::time::Duration;

use support::{driver::FakeDriver, sim, Agent, Metrics, TempDir};

const WAIT: Duration = Duration::from_secs(20);

fn start_agent(driver: &FakeDriver, instance_type: &str, state: Option<&[u8]>) -> Agent {
    let args = driver.agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let instance = format!("--instance-type={instance_type}");
    Agent::start_configured(sim(), &[instance.as_str()], &args, |_, state_dir| {
        // The same state directory as the previous agent's (an emptyDir survives a
        // container restart): its persisted health.
        if let Some(state) = state {
            std::fs::write(state_dir.join("neuron-health.json"), state).expect("persisted state");
        }
    })
}

fn state_of(m: &Metrics, device: &str) -> Option<String> {
    let samples = m.find("neuron_device_health_state", &[("neuron_device_index", device)]);
    if samples.len() != 3 {
        return None;
    }
    let current: Vec<_> = samples.iter().filter(|s| s.value == 1.0).collect();
    assert_eq!(current.len(), 1, "one state per device: {samples:?}");
    current[0].labels.get("state").cloned()
}

fn wait_state(agent: &Agent, device: &str, state: &str) {
    agent.wait_for(&format!("device {device} {state}"), WAIT, |m| (state_of(m, device)? == state).then_some(()));
}

#[test]
fn each_fault_kind_gives_its_device_state_and_counters() {
    let driver = FakeDriver::start("trn2.48xlarge");
    let agent = start_agent(&driver, "trn2.48xlarge", None);
    // Every device healthy, with all three series, before any fault.
    agent.wait_for("16 healthy devices", WAIT, |m| {
        (0..16).all(|d| state_of(m, &d.to_string()).as_deref() == Some("healthy")).then_some(())
    });
    driver.inject(&[
        "hbm-ue:0",
        "sram-ue:1",
        "nc-ue:2:1",
        "dma:3:0",
        "repairable-hbm:4",
        "component:5:link_efa",
        "reset:6:2",
        "heartbeat-stall:7",
        "power:8:invalid",
    ]);
    for device in ["0", "1", "2", "3", "4", "5", "6"] {
        wait_state(&agent, device, "unhealthy");
    }
    wait_state(&agent, "7", "unknown");
    let m = agent.metrics();
    assert_eq!(state_of(&m, "8").as_deref(), Some("healthy"), "a power status is not a fault");
    assert_eq!(state_of(&m, "15").as_deref(), Some("healthy"));
    assert_eq!(m.value("neuron_node_health_state", &[("state", "unhealthy")]), Some(1.0));
    let errors = |device: &str, error: &str| {
        m.value("neuron_hardware_errors_total", &[("neuron_device_index", device), ("error", error)])
    };
    assert_eq!(errors("0", "HBM_UNCORRECTABLE_ERROR"), Some(1.0));
    assert_eq!(errors("1", "SRAM_UNCORRECTABLE_ERROR"), Some(1.0));
    assert_eq!(errors("2", "NC_UNCORRECTABLE_ERROR"), Some(1.0));
    assert_eq!(errors("3", "DMA_ERROR"), Some(1.0));
    assert_eq!(m.find("neuron_hardware_errors_total", &[]).len(), 4, "the sysfs-only faults have no kernel record");
    let ecc = |device: &str, memory: &str, kind: &str| {
        m.value(
            "neuron_device_ecc_errors_total",
            &[("neuron_device_index", device), ("memory", memory), ("kind", kind)],
        )
    };
    assert_eq!(ecc("0", "hbm", "uncorrected"), Some(1.0));
    assert_eq!(ecc("1", "sram", "uncorrected"), Some(1.0));
    assert_eq!(ecc("4", "hbm", "repairable_uncorrected"), Some(1.0));
    assert_eq!(ecc("5", "hbm", "uncorrected"), Some(0.0));
    let core = |device: &str, core: &str, error: &str| {
        m.value(
            "neuroncore_hardware_errors_total",
            &[("neuron_device_index", device), ("neuroncore", core), ("error", error)],
        )
    };
    assert_eq!(core("2", "1", "hw_nc_ue_error"), Some(1.0));
    assert_eq!(core("3", "0", "hw_dma_abort_error"), Some(1.0));
    assert_eq!(core("4", "0", "hw_repairable_hbm_ue_error"), Some(1.0));
    assert_eq!(
        m.value("neuron_device_unhealthy_component", &[("neuron_device_index", "5"), ("component", "link_efa")]),
        Some(1.0)
    );
    assert_eq!(
        m.value("neuron_device_power_status", &[("neuron_device_index", "8"), ("status", "invalid")]),
        Some(1.0)
    );
    assert_eq!(m.value("neuron_device_power_status", &[("neuron_device_index", "8"), ("status", "valid")]), Some(0.0));
    assert!(m.find("neuron_device_power_utilization_ratio", &[("neuron_device_index", "8")]).is_empty());
    assert_eq!(
        m.value("neuron_device_power_utilization_ratio", &[("neuron_device_index", "9"), ("stat", "max")]),
        Some(0.6175)
    );
    assert_eq!(m.value("neuron_device_health_unknown", &[("neuron_device_index", "7")]), Some(1.0));
    assert_eq!(
        m.find("neuron_device_health_unknown", &[("neuron_device_index", "7")])[0].labels["reason"],
        "heartbeat_stalled"
    );
    // Repairable HBM: its own reason and action, not "replace the instance".
    let seen = m.find("neuron_device_fault_first_seen_timestamp_seconds", &[("neuron_device_index", "4")]);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].labels["error"], "REPAIRABLE_HBM_UNCORRECTABLE_ERROR");
    assert_eq!(seen[0].labels["action"], "RELOAD_DRIVER_OR_REBOOT");
    let invalid = m.find("neuron_device_fault_first_seen_timestamp_seconds", &[("neuron_device_index", "6")]);
    assert_eq!(invalid[0].labels["error"], "DEVICE_STATE_INVALID");
    let component = m.find("neuron_device_fault_first_seen_timestamp_seconds", &[("neuron_device_index", "5")]);
    assert_eq!(component[0].labels["error"], "UNHEALTHY_COMPONENT");
    assert_eq!(m.value("neuron_driver_errors_total", &[("function", "ndma_memcpy_wait_for_completion")]), Some(1.0));
    assert_eq!(m.value("neuron_driver_info", &[("version", "2.30.2.0")]), Some(1.0));
    // The instance labels of the other node-level series.
    let health = m.find("neuron_device_health_state", &[("neuron_device_index", "0"), ("state", "unhealthy")]);
    assert_eq!(health[0].labels.get("instance_type").map(String::as_str), Some("trn2.48xlarge"));
}

#[test]
fn promtool_accepts_the_health_series() {
    let driver = FakeDriver::start("trn2.48xlarge");
    driver.inject(&["hbm-ue:0", "component:1:hbm", "power:2:invalid", "heartbeat-stall:3"]);
    let agent = start_agent(&driver, "trn2.48xlarge", None);
    wait_state(&agent, "1", "unhealthy");
    let (_, body) = agent.get("/metrics").expect("GET /metrics");
    assert!(body.contains("neuron_hardware_errors_total{"), "the test needs every health family");
    let complaints = support::promtool_complaints(&body);
    assert!(complaints.iter().all(|c| c == support::ACCEPTED_LINT), "{complaints:?}");
}

#[test]
fn an_agent_restart_does_not_clear_an_unhealthy_device() {
    let driver = FakeDriver::start("trn1.32xlarge");
    let uptime = |back: Duration| {
        let text = std::fs::read_to_string("/proc/uptime").expect("uptime");
        let secs: f64 = text.split_whitespace().next().and_then(|s| s.parse().ok()).expect("uptime value");
        ((secs - back.as_secs_f64()).max(0.0) * 1e6) as u64
    };
    // A fault 30 s before the agent starts: within the 5-minute look-back.
    driver.record(&format!(
        "3,100,{},-;NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=2 nc-id=1 serial-num= action=TERMINATE_INSTANCE",
        uptime(Duration::from_secs(30))
    ));
    let agent = start_agent(&driver, "trn1.32xlarge", None);
    wait_state(&agent, "2", "unhealthy");
    wait_state(&agent, "0", "healthy");
    // A record written while it runs, stamped at boot: older than any look-back, so
    // only the persisted state can keep it over a restart.
    driver.record("3,101,1,-;[ 1.000000] nrt: NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=5 nc-id=0");
    wait_state(&agent, "5", "unhealthy");
    let errors = |m: &Metrics, d: &str| m.sum("neuron_hardware_errors_total", &[("neuron_device_index", d)]);
    let state_file = agent.state_dir.0.join("neuron-health.json");
    agent.wait_until("the health state is persisted", WAIT, |_| {
        std::fs::read_to_string(&state_file).is_ok_and(|t| t.contains("\"kmsg_seq\":101"))
    });
    let saved = std::fs::read(&state_file).expect("persisted state");
    drop(agent);

    let agent = start_agent(&driver, "trn1.32xlarge", Some(&saved));
    agent.wait_for("a reading", WAIT, |m| (state_of(m, "0")? == "healthy").then_some(()));
    let m = agent.metrics();
    assert_eq!(state_of(&m, "5").as_deref(), Some("unhealthy"), "kept over the restart");
    assert_eq!(state_of(&m, "2").as_deref(), Some("unhealthy"));
    assert_eq!(errors(&m, "2"), 1.0, "the look-back does not count a record twice");
    assert_eq!(errors(&m, "5"), 1.0);
    // A fault after the restart is counted on top.
    driver.inject(&["nc-ue:2:1"]);
    agent.wait_for("the new record", WAIT, |m| (errors(m, "2") == 2.0).then_some(()));
}

#[test]
fn a_node_without_a_driver_tree_is_unknown() {
    let dir = TempDir::new("no-driver");
    let kmsg = dir.0.join("kmsg");
    std::fs::write(&kmsg, "").expect("kmsg file");
    let args = ["--sysfs-root", dir.0.to_str().unwrap(), "--kmsg-path", kmsg.to_str().unwrap(), "--period", "500ms"];
    let agent = Agent::start(&["--instance-type=trn1.2xlarge"], &args);
    // neuron-monitor reports one device; nothing tells its health.
    wait_state(&agent, "0", "unknown");
    let m = agent.metrics();
    assert_eq!(m.value("neuron_node_health_state", &[("state", "unknown")]), Some(1.0));
    assert_eq!(m.value("neuron_node_health_state", &[("state", "healthy")]), Some(0.0));
    assert_eq!(m.value("neuron_agent_health_source_up", &[("source", "sysfs")]), Some(0.0));
}
