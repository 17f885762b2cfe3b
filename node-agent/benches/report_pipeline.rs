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
    sinks::prometheus::{Exposition, Format},
    state::NodeState,
};
use prometheus_client::registry::Registry;

fn compact_fixture(name: &str) -> String {
    let dir = std::env::var("NEURON_FIXTURES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/neuron-monitor").to_owned());
    let path = format!("{dir}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    serde_json::to_string(&value).expect("re-encode")
}

fn pipeline(c: &mut Criterion) {
    let line = compact_fixture("trn1n.32xlarge-32runtimes.json");
    let mut group = c.benchmark_group("trn1n_32_runtimes");
    group.throughput(Throughput::Bytes(line.len() as u64));

    group.bench_function("baseline/serde_json_value", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(&line).expect("parse"))
    });

    let mut state = NodeState::default();
    group.bench_function("parse_and_update", |b| {
        b.iter(|| {
            let report = Report::parse(&line).expect("parse");
            state.apply(&report);
        })
    });

    // One pod per runtime of the report: its process in the pod's cgroup, its core held by
    // the pod, one allow-listed label.
    let proc_root = std::env::temp_dir().join(format!("neuron-bench-proc-{}", std::process::id()));
    let attribution = populated_attribution(&state, &proc_root);
    let mut attributed = NodeState::default();
    group.bench_function("parse_update_attribute", |b| {
        b.iter(|| {
            let report = Report::parse(&line).expect("parse");
            attributed.apply(&report);
            attribution.attribute(&mut attributed);
        })
    });
    assert!(attributed.runtimes.iter().all(|rt| rt.labels.pod.is_some()), "every runtime attributed");
    group.bench_function("attribute", |b| b.iter(|| attribution.attribute(&mut attributed)));
    let _ = std::fs::remove_dir_all(&proc_root);

    let state = Arc::new(Mutex::new(state));
    let exposition = Exposition::new(Registry::default(), state, Default::default());
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
        AttributionMetrics::default(),
    )
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
