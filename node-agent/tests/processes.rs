//! The applications' process series of the real agent binary: from a fake `/proc` the
//! test writes (known values, files missing, a process gone) and from the real `/proc`
//! (this test process as the application, so the kernel's own formats are parsed).

mod support;

use std::time::Duration;

use support::{
    kubelet::{stat_line, FakeProc},
    Agent, Metrics, TempDir,
};

const PROCESS_SERIES: [&str; 7] = [
    "neuron_process_cpu_seconds_total",
    "neuron_process_resident_memory_bytes",
    "neuron_process_threads",
    "neuron_process_open_fds",
    "neuron_process_io_read_bytes_total",
    "neuron_process_io_write_bytes_total",
    "neuron_agent_process_read_failures_total",
];

fn sysconf(name: libc::c_int) -> f64 {
    // SAFETY: reads a constant of the system.
    let value = unsafe { libc::sysconf(name) };
    assert!(value > 0, "sysconf({name})");
    value as f64
}

/// Process series of `tag` by name (and `mode`), as `name` or `name{mode}`.
fn process_values(m: &Metrics, tag: &str) -> Vec<(String, f64)> {
    let mut values: Vec<(String, f64)> = m
        .samples
        .iter()
        .filter(|s| {
            s.name.starts_with("neuron_process_") && s.labels.get("runtime_tag").map(String::as_str) == Some(tag)
        })
        .map(|s| match s.labels.get("mode") {
            Some(mode) => (format!("{}{{{mode}}}", s.name), s.value),
            None => (s.name.clone(), s.value),
        })
        .collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    values
}

#[test]
fn process_series_come_from_the_proc_root_per_runtime_and_go_with_the_process() {
    let proc = FakeProc::new();
    // train: every file; its command name holds spaces and parentheses.
    proc.file(4242, "stat", &stat_line(4242, "pt (main) 1", (250, 50), 12, 1000));
    proc.file(
        4242,
        "io",
        "rchar: 9\nwchar: 9\nsyscr: 1\nsyscw: 1\nread_bytes: 12288\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n",
    );
    proc.fds(4242, 5);
    // serve: its io and fd/ are not readable (absent): those series are left out.
    proc.file(4243, "stat", &stat_line(4243, "serve", (10, 0), 2, 10));
    let apps = ["--app=tag=train,cores=0,util=50,pid=4242", "--app=tag=serve,cores=1,util=10,pid=4243"];
    let root = proc.root().to_str().expect("utf-8 path");
    let agent = Agent::start(&apps, &["--period", "300ms", "--proc-root", root]);

    let (hz, page) = (sysconf(libc::_SC_CLK_TCK), sysconf(libc::_SC_PAGESIZE));
    let m = agent.wait_for("both processes read", Duration::from_secs(20), |m| {
        (process_values(m, "train").len() == 7 && !process_values(m, "serve").is_empty()).then(|| m.clone())
    });
    let expected = |pairs: &[(&str, f64)]| pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect::<Vec<_>>();
    assert_eq!(
        process_values(&m, "train"),
        expected(&[
            ("neuron_process_cpu_seconds_total{system}", 50.0 / hz),
            ("neuron_process_cpu_seconds_total{user}", 250.0 / hz),
            ("neuron_process_io_read_bytes_total", 12288.0),
            ("neuron_process_io_write_bytes_total", 4096.0),
            ("neuron_process_open_fds", 5.0),
            ("neuron_process_resident_memory_bytes", 1000.0 * page),
            ("neuron_process_threads", 12.0),
        ])
    );
    assert_eq!(
        process_values(&m, "serve"),
        expected(&[
            ("neuron_process_cpu_seconds_total{system}", 0.0),
            ("neuron_process_cpu_seconds_total{user}", 10.0 / hz),
            ("neuron_process_resident_memory_bytes", 10.0 * page),
            ("neuron_process_threads", 2.0),
        ])
    );
    // Labelled like the runtime's other series.
    let threads = m.find("neuron_process_threads", &[("runtime_tag", "train")])[0].labels.clone();
    let mut vcpu = m.find("neuron_runtime_vcpu_usage_ratio", &[("runtime_tag", "train")])[0].labels.clone();
    vcpu.remove("usage_type");
    assert_eq!(threads, vcpu);
    assert!(m.sum("neuron_agent_process_read_failures_total", &[("file", "io"), ("reason", "gone")]) >= 1.0);
    assert!(m.sum("neuron_agent_process_read_failures_total", &[("file", "fd"), ("reason", "gone")]) >= 1.0);
    assert!(m.value("neuron_agent_process_read_seconds", &[]).is_some());
    let complaints = support::promtool_complaints(&m.text);
    assert!(complaints.iter().all(|c| c == support::ACCEPTED_LINT), "promtool: {complaints:#?}");

    // train's process is gone (the report still lists it): its series go, counted.
    let failed_before = m.sum("neuron_agent_process_read_failures_total", &[("file", "stat")]);
    proc.remove(4242);
    let m = agent.wait_for("train's process series gone", Duration::from_secs(20), |m| {
        process_values(m, "train").is_empty().then(|| m.clone())
    });
    assert!(m.value("neuron_runtime_vcpu_usage_ratio", &[("runtime_tag", "train"), ("usage_type", "user")]).is_some());
    assert_eq!(process_values(&m, "serve").len(), 4);
    assert!(m.sum("neuron_agent_process_read_failures_total", &[("file", "stat"), ("reason", "gone")]) > failed_before);
}

/// A report listing this test process as an application (or none when `pid` is `None`).
fn report(pid: Option<u32>) -> String {
    let runtimes = pid
        .map(|pid| format!(r#"{{"pid":{pid},"neuron_runtime_tag":"self","error":"","report":{{}}}}"#))
        .unwrap_or_default();
    format!(
        r#"{{"neuron_runtime_data":[{runtimes}],"instance_info":{{"error":"","instance_type":"trn1.2xlarge"}},
          "neuron_hardware_info":{{"neuron_device_count":1,"neuroncore_per_device_count":2,"error":""}}}}"#
    )
}

#[test]
fn the_real_proc_of_a_running_application_is_read_and_its_series_go_with_the_runtime() {
    // Two reports in turn: this process as an application, then no application.
    let dir = TempDir::new("procs-replay");
    let (with, without) = (dir.0.join("with.json"), dir.0.join("without.json"));
    std::fs::write(&with, report(Some(std::process::id()))).expect("write");
    std::fs::write(&without, report(None)).expect("write");
    let replay = [format!("--replay={}", with.display()), format!("--replay={}", without.display())];
    let agent = Agent::start(&[replay[0].as_str(), replay[1].as_str(), "--interval=1s"], &["--proc-root", "/proc"]);
    let own_fds = std::fs::read_dir("/proc/self/fd").expect("own fd/").count() as f64;
    for present in [true, false, true] {
        let m = agent.wait_for(&format!("own process series present={present}"), Duration::from_secs(20), |m| {
            let values = process_values(m, "self");
            (values.len() == if present { 7 } else { 0 }).then(|| m.clone())
        });
        if !present {
            for name in PROCESS_SERIES.iter().filter(|n| n.starts_with("neuron_process_")) {
                assert!(m.find(name, &[]).is_empty(), "{name} without a runtime");
            }
            continue;
        }
        let value = |name: &str| m.value(name, &[("runtime_tag", "self")]).expect(name);
        assert!(value("neuron_process_threads") >= 1.0);
        assert!(value("neuron_process_resident_memory_bytes") > 1_048_576.0);
        // The test harness opens and closes descriptors: the same order of magnitude.
        let fds = value("neuron_process_open_fds");
        assert!(fds >= 3.0 && fds < own_fds + 64.0, "{fds} open, {own_fds} seen here");
        for mode in ["user", "system"] {
            let cpu = m.value("neuron_process_cpu_seconds_total", &[("runtime_tag", "self"), ("mode", mode)]);
            assert!(cpu.is_some_and(|s| (0.0..3600.0).contains(&s)), "{mode}: {cpu:?}");
        }
        assert!(value("neuron_process_io_read_bytes_total") >= 0.0);
        assert!(value("neuron_process_io_write_bytes_total") >= 0.0);
        assert_eq!(m.sum("neuron_agent_process_read_failures_total", &[]), 0.0, "{}", m.text);
    }
}
