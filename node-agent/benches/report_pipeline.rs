//! The per-report cost of the agent on the largest recorded report (32 runtimes on a
//! trn1n.32xlarge, 442 kB as one compact line):
//! - `baseline/serde_json_value`: an untyped `serde_json::Value` parse of the line, the
//!   floor any JSON-based exporter pays; the other numbers read as ratios to it;
//! - `parse_and_update`: typed parse + applying it to the node state (per report);
//! - `parse_update_attribute`: the same plus pod attribution with a populated cache (every
//!   runtime's process in a pod, every core held by a pod per the kubelet);
//! - `attribute`: the attribution step alone, on a state a report was just applied to
//!   (its share of `parse_update_attribute`, measured apart from the noise of parsing);
//! - `render_classic` / `render_openmetrics`: one `/metrics` scrape.
//!
//! `many_runtimes/*`: synthetic reports of N small runtimes (4 cores each), N from 128
//! to the cap (`api::limits::MAX_RUNTIMES_PER_REPORT`, 1024) and beyond it (5k, 20k, 80k:
//! entries past the cap are skipped unread). Before the criterion runs, a plain timing
//! loop prints the cost per runtime of parse + apply and of a scrape, as a ratio to the
//! 128-runtime case: near 1 within the cap means linear (the quadratic scans made it
//! grow with N), and far below 1 beyond the cap means the excess costs only its parse.
//!
//! `processes/read_32`: one read of the process series' files for 32 runtimes (this
//! process's real `/proc/<pid>/` 32 times), the cost they add per report period, off the
//! report path.
//!
//! Run: `cargo bench -p neuron-node-agent --bench report_pipeline`.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
};

use api::report::Report;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use k8s_openapi::api::core::v1::Pod;
use neuron_node_agent::{
    attribution::{
        podresources::{Allocation, DeviceOwnership, Unit},
        pods::{PodIndex, PodLabelKeys},
        Attribution, AttributionMetrics,
    },
    processes::{GonePids, ProcReader, ProcessMetrics},
    sinks::prometheus::{Exposition, Format},
    state::NodeState,
};
use neuron_test_support::{TempDir, TRN1N_32};
use prometheus_client::registry::Registry;
use support::compact_fixture;

mod support;

fn pipeline(c: &mut Criterion) {
    let line = compact_fixture(TRN1N_32);
    let mut group = c.benchmark_group("trn1n_32_runtimes");
    group.throughput(Throughput::Bytes(line.len() as u64));

    group.bench_function("baseline/serde_json_value", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(&line).expect("parse"))
    });

    // The agent's path (`Report::parse_reusing`), and serde reading the whole line.
    let mut state = NodeState::default();
    let mut buffer = String::new();
    group.bench_function("parse_and_update", |b| {
        b.iter(|| {
            let report = Report::parse_reusing(&line, &mut buffer).expect("parse");
            state.apply(&report);
        })
    });
    group.bench_function("parse_and_update/whole_line_by_serde", |b| {
        b.iter(|| {
            let report = Report::parse(&line).expect("parse");
            state.apply(&report);
        })
    });

    // One pod per runtime of the report: its process in the pod's cgroup, its core held by
    // the pod, one allow-listed label.
    let proc_root = TempDir::new("bench-proc");
    let attribution = populated_attribution(&state, proc_root.path());
    let mut attributed = NodeState::default();
    group.bench_function("parse_update_attribute", |b| {
        b.iter(|| {
            let report = Report::parse_reusing(&line, &mut buffer).expect("parse");
            attributed.apply(&report);
            attribution.attribute(&mut attributed);
        })
    });
    assert!(attributed.runtimes.iter().all(|rt| rt.labels.pod.is_some()), "every runtime attributed");
    group.bench_function("attribute", |b| b.iter(|| attribution.attribute(&mut attributed)));

    let state = Arc::new(Mutex::new(state));
    let exposition = Exposition::new(Registry::default(), state, Default::default(), Default::default());
    group.bench_function("render_classic", |b| b.iter(|| exposition.render(Format::Classic).expect("render")));
    group.bench_function("render_openmetrics", |b| b.iter(|| exposition.render(Format::OpenMetrics).expect("render")));
    group.finish();
}

fn populated_attribution(state: &NodeState, proc_root: &Path) -> Attribution {
    let mut pods = PodIndex::new(PodLabelKeys::new(&["app"]));
    let mut allocations = Vec::new();
    let mut listed = Vec::new();
    for (i, rt) in state.runtimes.iter().enumerate() {
        let pid = rt.pid.expect("fixture runtimes have PIDs");
        let uid = format!("{i:08x}-0000-4000-8000-000000000000");
        let cid = format!("{i:016x}").repeat(4);
        let name = format!("worker-{i}");
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("fake /proc");
        let cgroup = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope\n",
            uid.replace('-', "_")
        );
        std::fs::write(dir.join("cgroup"), cgroup).expect("fake cgroup file");
        listed.push(
            serde_json::from_value::<Pod>(serde_json::json!({
                "metadata": {"uid": uid, "namespace": format!("team-{}", i % 4), "name": name, "labels": {"app": name}},
                "spec": {"containers": [{"name": "main"}]},
                "status": {"phase": "Running", "containerStatuses": [{"name": "main",
                    "containerID": format!("containerd://{cid}"), "image": "", "imageID": "", "ready": true,
                    "restartCount": 0}]}
            }))
            .expect("pod"),
        );
        for core in &rt.cores {
            allocations.push(Allocation {
                namespace: format!("team-{}", i % 4),
                pod: name.clone(),
                container: "main".to_owned(),
                unit: Unit::Core,
                id: core.index,
                claim: None,
            });
        }
    }
    pods.replace(&listed);
    let mut devices = DeviceOwnership::default();
    devices.set(allocations);
    Attribution::new(
        PathBuf::from(proc_root),
        Arc::new(RwLock::new(pods)),
        Arc::new(RwLock::new(devices)),
        Default::default(),
        AttributionMetrics::default(),
    )
}

/// A report of `n` runtimes, each holding 4 of 512 cores with every runtime group.
fn many_runtimes_line(n: usize) -> String {
    let entries: Vec<String> = (0..n)
        .map(|i| {
            let cores: Vec<u32> = (0..4).map(|k| ((i * 4 + k) % 512) as u32).collect();
            let counters: Vec<String> =
                cores.iter().map(|c| format!(r#""{c}":{{"neuroncore_utilization":12.5,"flops":1e9}}"#)).collect();
            let memory: Vec<String> = cores
                .iter()
                .map(|c| format!(r#""{c}":{{"constants":1,"model_code":2,"model_shared_scratchpad":0,"runtime_memory":3,"tensors":4}}"#))
                .collect();
            format!(
                r#"{{"pid":{pid},"neuron_runtime_tag":"app-{i}","error":"","report":{{
                  "neuroncore_counters":{{"period":1,"error":"","neuroncores_in_use":{{{}}}}},
                  "memory_used":{{"period":1,"error":"","neuron_runtime_used_bytes":{{"host":1,"neuron_device":2,
                     "usage_breakdown":{{"neuroncore_memory_usage":{{{}}}}}}}}},
                  "neuron_runtime_vcpu_usage":{{"period":1,"error":"","vcpu_usage":{{"user":10,"system":5}}}},
                  "execution_stats":{{"period":1,"error":"","error_summary":{{"generic":1}},
                     "execution_summary":{{"completed":3}},"latency_stats":{{"total_latency":null}}}}}}}}"#,
                counters.join(","),
                memory.join(","),
                pid = 10_000 + i
            )
        })
        .collect();
    let text = format!(
        r#"{{"neuron_runtime_data":[{}],"system_data":{{}},
            "instance_info":{{"instance_id":"i-1","instance_type":"trn2.48xlarge","error":""}},
            "neuron_hardware_info":{{"neuron_device_count":32,"neuroncore_per_device_count":16,"error":""}}}}"#,
        entries.join(",")
    );
    // One line, as neuron-monitor writes it (the whitespace left is JSON's own).
    text.replace('\n', " ")
}

/// Mean seconds of `f` over enough runs to take about `budget`.
fn mean_seconds(budget: std::time::Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm
    let start = std::time::Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < budget || runs < 3 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / f64::from(runs)
}

fn many_runtimes(c: &mut Criterion) {
    // `cargo test --all-targets` runs benches once, unoptimized: small sizes, no table.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if bench_mode { &[128, 256, 512, 1024, 5_000, 20_000, 80_000] } else { &[128, 1024] };
    let lines: Vec<(usize, String)> = sizes.iter().map(|n| (*n, many_runtimes_line(*n))).collect();
    if bench_mode {
        print_ratios(&lines);
    }

    let mut group = c.benchmark_group("many_runtimes");
    group.sample_size(10);
    for (n, line) in lines.iter().filter(|(n, _)| [1024, 5_000].contains(n)) {
        group.throughput(Throughput::Elements(*n as u64));
        let (mut state, mut buffer) = (NodeState::default(), String::new());
        group.bench_function(format!("parse_and_update/{n}"), |b| {
            b.iter(|| state.apply(&Report::parse_reusing(line, &mut buffer).expect("parse")))
        });
        let exposition =
            Exposition::new(Registry::default(), Arc::new(Mutex::new(state)), Default::default(), Default::default());
        group.bench_function(format!("render_classic/{n}"), |b| {
            b.iter(|| exposition.render(Format::Classic).expect("render"))
        });
    }
    group.finish();
}

/// Prints the cost per runtime entry of parse + apply and of a scrape for each line, as
/// ratios to the first (smallest) one, all measured in this run.
fn print_ratios(lines: &[(usize, String)]) {
    let mut base: Option<(f64, f64)> = None;
    println!("many_runtimes: cost per runtime entry of the report, as a ratio to 128 runtimes");
    println!("{:>7} {:>10} {:>14} {:>8} {:>14} {:>8}", "entries", "line kB", "parse+apply", "ratio", "scrape", "ratio");
    for (n, line) in lines {
        let (mut state, mut buffer) = (NodeState::default(), String::new());
        let apply = mean_seconds(std::time::Duration::from_millis(600), || {
            state.apply(&Report::parse_reusing(line, &mut buffer).expect("parse"));
        });
        let exposition =
            Exposition::new(Registry::default(), Arc::new(Mutex::new(state)), Default::default(), Default::default());
        let scrape = mean_seconds(std::time::Duration::from_millis(400), || {
            exposition.render(Format::Classic).expect("render");
        });
        let per = (apply / *n as f64, scrape / *n as f64);
        let (base_apply, base_scrape) = *base.get_or_insert(per);
        println!(
            "{n:>7} {:>10} {:>11.3} ms {:>8.2} {:>11.3} ms {:>8.2}",
            line.len() / 1000,
            apply * 1e3,
            per.0 / base_apply,
            scrape * 1e3,
            per.1 / base_scrape
        );
    }
}

fn processes(c: &mut Criterion) {
    let reader = ProcReader::new("/proc".into(), ProcessMetrics::register(&mut Registry::default()));
    let pids = vec![std::process::id(); 32];
    let mut gone = GonePids::default();
    assert_eq!(reader.read_all(&pids, &mut gone).len(), 1, "this process is readable");
    c.bench_function("processes/read_32", |b| b.iter(|| reader.read_all(&pids, &mut gone)));
}

criterion_group!(benches, pipeline, many_runtimes, processes);
criterion_main!(benches);
