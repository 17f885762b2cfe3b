//! Neuron hardware health end to end: the real agent binary reads the fake driver tree
//! and kernel log that the simulator writes, and shows each fault on /metrics.

mod support;

use std::time::Duration;

use support::{
    driver::{wait_kmsg_live, FakeDriver},
    sim, Agent, Metrics, TempDir,
};

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
    // The tree's files are held open: the faults below are seen through them (the
    // simulator renames each file it changes over the old one).
    assert!(agent.metrics().value("neuron_agent_health_sysfs_held_files", &[]) > Some(16.0 * 20.0));
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
    wait_kmsg_live(&agent);
    // A record written while it runs, stamped at boot: older than any look-back, so
    // only the persisted state can keep it over a restart.
    driver.record("3,101,1,-;[    1.000000] NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=5 nc-id=0");
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
    // A fault after the restart is counted on top (the simulator numbers its record 1: read
    // as history, it would count as seen before the restart).
    wait_kmsg_live(&agent);
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

/// Microseconds since boot now, as a kernel record carries them.
fn now_usec() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").expect("uptime");
    let secs: f64 = text.split_whitespace().next().and_then(|s| s.parse().ok()).expect("uptime value");
    (secs * 1e6) as u64
}

/// Issue 24, fault 2: records anyone on the node can make the kernel log carry are not
/// hardware faults. A userspace write (another facility), the kernel's warning quoting a
/// program's path, interface names, a device the driver's tree does not list, a serial
/// number other than the tree's, a line without a record header: each refused and
/// counted by reason. Names outside the documented set fill no slot a documented name
/// needs: after 40 of them, a real HBM fault is still named and still makes its device
/// unhealthy.
#[test]
fn forged_kernel_records_are_refused_and_a_real_fault_keeps_its_name() {
    let driver = FakeDriver::start("trn1.32xlarge");
    let agent = start_agent(&driver, "trn1.32xlarge", None);
    agent.wait_for("16 healthy devices", WAIT, |m| {
        (0..16).all(|d| state_of(m, &d.to_string()).as_deref() == Some("healthy")).then_some(())
    });
    wait_kmsg_live(&agent);
    let t = now_usec();
    let hbm = "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR";
    let forged = [
        // A userspace write to /dev/kmsg: user.err.
        format!("11,1001,{t},-;{hbm} nd-id=1 nc-id=0 serial-num=19fcda00f5ff6e01 action=TERMINATE_INSTANCE"),
        // The kernel's warning about a program with an executable stack, quoting its path.
        format!("4,1002,{t},-;process '/tmp/{hbm} nd-id=2 serial-num=deadbeef x/a.out' started with executable stack"),
        // The token inside an error-level kernel record.
        format!("3,1003,{t},-;audit: path=/tmp/{hbm} nd-id=2 nc-id=0"),
        // Network devices named NEURON_HW_ERR=A.
        format!("6,1004,{t},-;IPv6: ADDRCONF(NETDEV_CHANGE): NEURON_HW_ERR=A: link becomes ready"),
        format!("3,1005,{t},-;NEURON_HW_ERR=A: renamed from eth0"),
        format!("3,1006,{t},-;br0: port 1(NEURON_HW_ERR=B) entered disabled state"),
        // Devices the tree does not list, or beyond any index.
        format!("3,1007,{t},-;{hbm} nd-id=20 nc-id=0"),
        format!("3,1008,{t},-;{hbm} nd-id=640 nc-id=0"),
        // Not device 3's serial number.
        format!("3,1009,{t},-;{hbm} nd-id=3 nc-id=0 serial-num=deadbeefdeadbeef"),
        // No record header: who wrote it cannot be told.
        format!("{hbm} nd-id=4 nc-id=0"),
    ];
    for line in &forged {
        driver.record(line);
    }
    // 40 names outside the documented set, as the driver would print them.
    let names: Vec<String> =
        ('A'..='Z').chain('0'..='9').map(String::from).chain(["AA", "AB", "AC", "AD"].map(str::to_owned)).collect();
    assert_eq!(names.len(), 40);
    for (i, name) in names.iter().enumerate() {
        driver.record(&format!("3,{},{t},-;NEURON_HW_ERR={name} nd-id=5 nc-id=0", 1100 + i));
    }
    driver.inject(&["hbm-ue:0"]);
    let errors = |m: &Metrics, device: &str, error: &str| {
        m.value("neuron_hardware_errors_total", &[("neuron_device_index", device), ("error", error)])
    };
    let m = agent.wait_for("the real fault", WAIT, |m| {
        (errors(m, "0", "HBM_UNCORRECTABLE_ERROR") == Some(1.0)).then(|| m.clone())
    });
    assert_eq!(state_of(&m, "0").as_deref(), Some("unhealthy"));
    let seen = m.find("neuron_device_fault_first_seen_timestamp_seconds", &[("neuron_device_index", "0")]);
    assert!(seen.iter().any(|s| s.labels["error"] == "HBM_UNCORRECTABLE_ERROR"), "{seen:?}");
    for device in ["1", "2", "3", "4"] {
        assert_eq!(state_of(&m, device).as_deref(), Some("healthy"), "device {device}");
        assert_eq!(m.sum("neuron_hardware_errors_total", &[("neuron_device_index", device)]), 0.0);
    }
    assert!(m.find("neuron_device_health_state", &[("neuron_device_index", "20")]).is_empty());
    let refused = |reason: &str| m.value("neuron_agent_health_kmsg_refused_total", &[("reason", reason)]);
    for (reason, n) in [
        ("facility", 1.0),
        ("level", 2.0),
        ("position", 2.0),
        ("name", 1.0),
        ("unknown_device", 1.0),
        ("device", 1.0),
        ("serial_mismatch", 1.0),
        ("no_header", 1.0),
    ] {
        assert_eq!(refused(reason), Some(n), "{reason}");
    }
    // The 40 names: counted, those beyond the table's free slots under OTHER.
    assert_eq!(m.sum("neuron_hardware_errors_total", &[("neuron_device_index", "5")]), 40.0);
    let other = errors(&m, "5", "OTHER").unwrap_or(0.0);
    assert!(other > 0.0 && other < 40.0, "OTHER: {other}");
    assert_eq!(m.value("neuron_agent_health_refused_total", &[("what", "error_name")]), Some(other));
}

/// Issue 41, item 2: a user's record (facility user, refused alone) followed by a kernel
/// continuation record (flag `c`, facility 0, even an empty one) is not joined to it:
/// refused for its facility, its device healthy. The runtime's time stamp and the
/// driver's prefix, in either order, start a real fault's record.
#[test]
fn a_users_record_is_not_joined_to_a_kernel_continuation_and_either_stamp_order_is_a_fault() {
    let driver = FakeDriver::start("trn1.32xlarge");
    let agent = start_agent(&driver, "trn1.32xlarge", None);
    agent.wait_for("16 healthy devices", WAIT, |m| {
        (0..16).all(|d| state_of(m, &d.to_string()).as_deref() == Some("healthy")).then_some(())
    });
    wait_kmsg_live(&agent);
    let t = now_usec();
    let hbm = "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR";
    for line in [
        format!("11,3001,{t},-;{hbm}"),
        format!("3,3002,{t},c; nd-id=1 nc-id=0 action=TERMINATE_INSTANCE"),
        format!("11,3003,{t},-;{hbm} nd-id=2 nc-id=0"),
        format!("0,3004,{t},c;"),
        format!(
            "3,3005,{t},-;neuron:ncdev_printk: 2025-06-01T12:00:00.123456Z NEURON_HW_ERR=DMA_ERROR nd-id=3 nc-id=0"
        ),
        format!(
            "3,3006,{t},-;2025-06-01T12:00:00.123456Z neuron:ncdev_printk: NEURON_HW_ERR=DMA_ERROR nd-id=4 nc-id=0"
        ),
    ] {
        driver.record(&line);
    }
    let errors = |m: &Metrics, device: &str| m.sum("neuron_hardware_errors_total", &[("neuron_device_index", device)]);
    let m = agent
        .wait_for("both stamped faults", WAIT, |m| (errors(m, "3") == 1.0 && errors(m, "4") == 1.0).then(|| m.clone()));
    for device in ["1", "2"] {
        assert_eq!(state_of(&m, device).as_deref(), Some("healthy"), "device {device}");
        assert_eq!(errors(&m, device), 0.0, "device {device}");
    }
    assert_eq!(state_of(&m, "3").as_deref(), Some("unhealthy"));
    assert_eq!(m.value("neuron_agent_health_kmsg_refused_total", &[("reason", "facility")]), Some(2.0));
    assert_eq!(m.value("neuron_agent_health_kmsg_refused_total", &[("reason", "position")]), Some(0.0));
}

/// Issue 24 (smaller): a zero-padded twin of a device directory (`neuron00` beside
/// `neuron0`) is not a second device 0: refused and counted, and device 0 keeps its own
/// health and one set of series.
#[test]
fn a_zero_padded_device_directory_is_refused() {
    let driver = FakeDriver::start("trn1.2xlarge");
    let twin = driver.sys().join("devices/virtual/neuron_device/neuron00");
    for (file, value) in [("reset", "2\n"), ("stats/hardware/mem_ecc_uncorrected", "7\n")] {
        let path = twin.join(file);
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("twin directory");
        std::fs::write(path, value).expect("twin file");
    }
    let agent = start_agent(&driver, "trn1.2xlarge", None);
    agent.wait_for("refused twin", WAIT, |m| {
        (m.value("neuron_agent_health_refused_total", &[("what", "sysfs_device")])? >= 2.0).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(state_of(&m, "0").as_deref(), Some("healthy"));
    assert!(m.find("neuron_device_fault_first_seen_timestamp_seconds", &[]).is_empty());
    let hbm = [("neuron_device_index", "0"), ("memory", "hbm"), ("kind", "uncorrected")];
    assert_eq!(m.find("neuron_device_ecc_errors_total", &hbm).len(), 1, "one series");
    assert_eq!(m.value("neuron_device_ecc_errors_total", &hbm), Some(0.0), "device 0's own counter");
}

/// CPU time (user + system) of a process so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("stat format").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Issue 24 (smaller): `/dev/zero` as the kernel log is neither `/dev/kmsg` nor a
/// regular file: refused (source down, retried now and then), not read forever.
#[test]
fn a_character_device_other_than_the_kernel_log_is_refused() {
    let driver = FakeDriver::start("trn1.2xlarge");
    let mut args = driver.agent_args();
    let at = args.iter().position(|a| a == "--kmsg-path").expect("--kmsg-path") + 1;
    args[at] = "/dev/zero".to_owned();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&["--instance-type=trn1.2xlarge"], &args);
    wait_state(&agent, "0", "healthy");
    agent.wait_for("the kernel log source down", WAIT, |m| {
        (m.value("neuron_agent_health_source_up", &[("source", "kmsg")])? == 0.0).then_some(())
    });
    let before = cpu_time(agent.child.id());
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu_time(agent.child.id()) - before;
    assert!(spent < Duration::from_millis(600), "{spent:?} of CPU in 3 s");
    assert_eq!(agent.metrics().value("neuron_agent_health_kmsg_records_total", &[]), Some(0.0));
}

/// Issue 24 (smaller): a followed kernel-log file that is rotated (renamed, a new file
/// at the path) is followed at its new file.
#[test]
fn a_rotated_kernel_log_file_is_followed() {
    let driver = FakeDriver::start("trn1.2xlarge");
    let agent = start_agent(&driver, "trn1.2xlarge", None);
    wait_state(&agent, "0", "healthy");
    driver.record(&format!("6,1,{},-;hello", now_usec()));
    agent.wait_for("the first record", WAIT, |m| {
        (m.value("neuron_agent_health_kmsg_records_total", &[])? >= 1.0).then_some(())
    });
    let rotated = driver.kmsg().with_extension("1");
    std::fs::rename(driver.kmsg(), &rotated).expect("rotate the kernel log");
    // The simulator appends to the file at the path: a new one.
    driver.inject(&["sram-ue:0"]);
    agent.wait_for("the record of the new file", WAIT, |m| {
        let n = m.value(
            "neuron_hardware_errors_total",
            &[("neuron_device_index", "0"), ("error", "SRAM_UNCORRECTABLE_ERROR")],
        );
        (n? == 1.0).then_some(())
    });
}

/// Threads of a process now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).expect("task directory").count()
}

/// Issue 24, fault 5: a file whose read blocks (a FIFO here; a driver attribute hung on
/// a wedged device on a real node) does not freeze the devices' health. Its device is
/// unknown, the source down and the timeout counted; a new fault on another device is
/// still seen; and the stuck file holds one thread, not one more per interval.
#[test]
fn a_blocking_sysfs_file_does_not_freeze_the_other_devices() {
    let driver = FakeDriver::start("trn2.48xlarge");
    let fifo = driver.sys().join("devices/virtual/neuron_device/neuron1/stats/hardware/sram_ecc_corrected");
    std::fs::remove_file(&fifo).expect("the simulator's file");
    let path = std::ffi::CString::new(fifo.to_str().expect("a UTF-8 path")).expect("no NUL");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    let agent = start_agent(&driver, "trn2.48xlarge", None);
    wait_state(&agent, "1", "unknown");
    wait_state(&agent, "2", "healthy");
    let m = agent.metrics();
    assert_eq!(m.value("neuron_agent_health_source_up", &[("source", "sysfs")]), Some(0.0));
    assert_eq!(m.value("neuron_agent_health_sysfs_stuck_reads", &[]), Some(1.0));
    assert!(m.value("neuron_agent_health_sysfs_read_timeouts_total", &[]) >= Some(1.0));
    driver.inject(&["hbm-ue:2"]);
    wait_state(&agent, "2", "unhealthy");
    assert_eq!(agent.metrics().value("neuron_node_health_state", &[("state", "unhealthy")]), Some(1.0));
    // Re-reads every 200 ms go on around the stuck file: no thread more for it.
    let reads = |m: &Metrics| m.find("neuron_agent_health_sysfs_reads_total", &[]).iter().map(|s| s.value).sum::<f64>();
    let (before, reads_before) = (threads(agent.child.id()), reads(&agent.metrics()));
    std::thread::sleep(Duration::from_secs(3));
    let m = agent.metrics();
    assert!(reads(&m) >= reads_before + 5.0, "re-reads go on: {} then {}", reads_before, reads(&m));
    // (+2: the runtime's blocking pool may start a thread for other work meanwhile.)
    assert!(threads(agent.child.id()) <= before + 2, "threads grew: {before} then {}", threads(agent.child.id()));
    assert_eq!(m.value("neuron_agent_health_sysfs_stuck_reads", &[]), Some(1.0));
    assert_eq!(state_of(&m, "1").as_deref(), Some("unknown"));
}

/// Fault thresholds (`spec.health.thresholds`, here from a configuration file) through the
/// fake kernel log: with two DMA errors in ten minutes needed, the first record is counted
/// and leaves its device healthy, the second makes it unhealthy; another device and an
/// error without a threshold are as before (unhealthy at the first record).
#[test]
fn a_threshold_needs_its_count_of_kernel_records_before_the_device_is_unhealthy() {
    let driver = FakeDriver::start("trn1.32xlarge");
    let dir = TempDir::new("thresholds");
    let config = dir.write(
        "config.yaml",
        "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata:\n  name: fleet\nspec:\n  health:\n    \
         thresholds:\n    - {error: DMA_ERROR, count: 2, window: 10m}\n",
    );
    let mut args = driver.agent_args();
    args.extend(["--config".to_owned(), config.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&["--instance-type=trn1.32xlarge"], &args);
    agent.wait_for("16 healthy devices", WAIT, |m| {
        (0..16).all(|d| state_of(m, &d.to_string()).as_deref() == Some("healthy")).then_some(())
    });
    let record = |seq: u32, text: &str| driver.record(&format!("3,{seq},{},-;{text}", now_usec()));
    record(2001, "NEURON_HW_ERR=DMA_ERROR nd-id=5 nc-id=0 action=TERMINATE_INSTANCE");
    agent.wait_for("the first record counted", WAIT, |m| {
        let n = m.sum("neuron_hardware_errors_total", &[("neuron_device_index", "5"), ("error", "DMA_ERROR")]);
        (n == 1.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(state_of(&agent.metrics(), "5").as_deref(), Some("healthy"), "one of two");
    record(2002, "NEURON_HW_ERR=DMA_ERROR nd-id=5 nc-id=0 action=TERMINATE_INSTANCE");
    wait_state(&agent, "5", "unhealthy");
    // Without a threshold: the first record.
    record(2003, "NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=6 nc-id=0 action=TERMINATE_INSTANCE");
    wait_state(&agent, "6", "unhealthy");
    assert_eq!(state_of(&agent.metrics(), "7").as_deref(), Some("healthy"));
}
