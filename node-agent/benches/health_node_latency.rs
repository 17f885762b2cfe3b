//! Fault-to-signal latency of hardware health on the real control plane: the real agent
//! binary with `--node-name`, the simulator's fake driver tree (trn1.32xlarge, 16
//! devices), and kernel-log records appended by this bench, each timed from its write to
//! the first time each signal shows it (polled every 10 ms):
//! - the series `neuron_hardware_errors_total{neuron_device_index,error}` on /metrics;
//! - the Node condition `NeuronHealth` naming the device and error in its message;
//! - an `events.k8s.io` Event for the Node with reason `NeuronHasError_<NAME>` naming the
//!   device.
//!
//! Fault k is error k/8 of four names on device k mod 8, a new fault every time (each
//! gets its own Event and changes that device's line of the condition's message).
//! Prints p50, p95 and max per signal.
//!
//! Before the faults, the agent's cost on a quiet node (healthy, the tree read every
//! second, a report every 5 s, the kernel log followed as a regular file): its threads'
//! CPU time and voluntary switches (wake-ups) a second over 20 s (2 s under `cargo test`).
//!
//! `cargo bench -p neuron-node-agent --bench health_node_latency -- [N]` (default 20, at
//! most 64); under `cargo test` (no `--bench`) it injects 2 faults and checks each signal
//! arrives.

use std::{
    io::Write,
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    api::{ListParams, PostParams},
    Api,
};
use neuron_e2e::{spawn_tied, workspace_bin, ControlPlane, Process};
use neuron_test_support::{free_port, http_get, random_u32, thread_run_time, TempDir};

const NAMES: [&str; 4] = ["HBM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "SRAM_UNCORRECTABLE_ERROR", "DMA_ERROR"];
/// Devices faults go to: the condition's message (at most 1,000 bytes) lists each
/// faulty device's latest fault, and 8 lines fit.
const DEVICES: usize = 8;
const LIMIT: Duration = Duration::from_secs(30);

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let requested = std::env::args().skip(1).find_map(|a| a.parse::<usize>().ok());
    let faults = requested.unwrap_or(if bench { 20 } else { 2 }).clamp(1, NAMES.len() * DEVICES);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let node = format!("neuron-bench-{:08x}", random_u32());
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(serde_json::json!({ "metadata": { "name": node } })).expect("node");
    rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");
    let events: Api<Event> = Api::namespaced(client, "default");

    let dir = TempDir::new("bench-health");
    let (sys, kmsg) = (dir.path().join("sys"), dir.path().join("kmsg"));
    let mut sim = Command::new(workspace_bin("neuron-monitor-sim"));
    sim.args(["--instance-type=trn1.32xlarge", "--sysfs-root"])
        .arg(&sys)
        .arg("--kmsg")
        .arg(&kmsg)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let (sim_pid, _sim_stdout) = spawn_tied(sim, libc::SIGTERM).expect("start the simulator's driver");
    wait("the fake driver tree", || sys.join("module/neuron/version").exists().then_some(()));

    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let path = |p: &Path| p.display().to_string();
    let args: Vec<String> = vec![
        format!("--listen={addr}"),
        format!("--state-dir={}", path(&dir.path().join("state"))),
        format!("--monitor-command={}", path(&workspace_bin("neuron-monitor-sim"))),
        "--monitor-arg=--instance-type=trn1.32xlarge".into(),
        format!("--sysfs-root={}", path(&sys)),
        format!("--kmsg-path={}", path(&kmsg)),
        "--health-interval=1s".into(),
        format!("--node-name={node}"),
        "--log=warn".into(),
    ];
    let agent = Process::start("neuron-node-agent", &args, &[], cp);
    let condition = |message: Option<&str>| {
        let nodes = nodes.clone();
        let node = node.as_str();
        let message = message.map(str::to_owned);
        rt.block_on(async move {
            let status = nodes.get_status(node).await.ok()?.status?;
            let c = status.conditions?.into_iter().find(|c| c.type_ == "NeuronHealth")?;
            match &message {
                None => (c.status == "False").then_some(()),
                Some(m) => c.message.is_some_and(|text| text.contains(m.as_str())).then_some(()),
            }
        })
    };
    wait("the condition NeuronHasNoError", || condition(None));
    let quiet = Duration::from_secs(if bench { 20 } else { 2 });
    let (cpu, wakeups) = thread_run_time(agent.child.id());
    std::thread::sleep(quiet);
    let (cpu_after, wakeups_after) = thread_run_time(agent.child.id());
    let secs = quiet.as_secs_f64();
    println!(
        "quiet node, {} s: agent CPU {:.3} ms a second, {:.1} wake-ups a second",
        quiet.as_secs(),
        (cpu_after - cpu).as_secs_f64() * 1e3 / secs,
        (wakeups_after - wakeups) as f64 / secs
    );

    let mut samples: [Vec<Duration>; 3] = Default::default();
    for k in 0..faults {
        let (device, name) = (k % DEVICES, NAMES[k / DEVICES]);
        let line = format!("3,{},{},-;NEURON_HW_ERR={name} nd-id={device} nc-id=0\n", 1000 + k, uptime_micros());
        let series = "neuron_hardware_errors_total{";
        let start = Instant::now();
        let mut file = std::fs::OpenOptions::new().append(true).open(&kmsg).expect("open the kernel log");
        file.write_all(line.as_bytes()).expect("append a record");
        drop(file);
        let mut seen: [Option<Duration>; 3] = [None; 3];
        while seen.iter().any(Option::is_none) {
            assert!(start.elapsed() < LIMIT, "fault {k}: signals seen {seen:?}");
            if seen[0].is_none() {
                let text = http_get(addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
                let labels = [format!("neuron_device_index=\"{device}\""), format!("error=\"{name}\"")];
                if text.lines().any(|l| l.starts_with(series) && labels.iter().all(|x| l.contains(x.as_str()))) {
                    seen[0] = Some(start.elapsed());
                }
            }
            if seen[1].is_none() && condition(Some(&format!("device {device}: {name} "))).is_some() {
                seen[1] = Some(start.elapsed());
            }
            if seen[2].is_none() && event_names(&rt, &events, &node, name, device) {
                seen[2] = Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for (all, one) in samples.iter_mut().zip(seen) {
            all.push(one.unwrap_or_default());
        }
        // The condition names a device's latest fault: the next one on this device
        // must not share its second.
        std::thread::sleep(Duration::from_millis(1100));
    }
    println!(
        "{faults} faults, kernel log followed as a regular file (100 ms tick), the Node reporter woken by the model"
    );
    for (signal, all) in ["series", "condition", "event"].iter().zip(&mut samples) {
        all.sort();
        let pick = |q: f64| all[((q * (all.len() - 1) as f64).round() as usize).min(all.len() - 1)];
        println!(
            "{signal:9} p50={:>5} ms p95={:>5} ms max={:>5} ms",
            pick(0.5).as_millis(),
            pick(0.95).as_millis(),
            all[all.len() - 1].as_millis()
        );
    }
    drop(agent);
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(sim_pid as libc::pid_t, libc::SIGTERM);
    }
}

/// An Event for `node` with reason `NeuronHasError_<name>` naming `device`.
fn event_names(rt: &tokio::runtime::Runtime, events: &Api<Event>, node: &str, name: &str, device: usize) -> bool {
    let (reason, part) = (format!("NeuronHasError_{name}"), format!("Neuron device {device}"));
    rt.block_on(async {
        let Ok(list) = events.list(&ListParams::default()).await else { return false };
        list.items.into_iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.reason.as_deref() == Some(reason.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains(&part))
        })
    })
}

fn uptime_micros() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let secs: f64 = text.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    (secs * 1e6) as u64
}

fn wait<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(start.elapsed() < LIMIT, "{what} within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
