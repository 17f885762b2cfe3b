//! The agent's own cost per GPU collection, on the project's fake NVML library as a
//! p5.48xlarge (8 H100, 4 compute processes):
//! - `baseline/index_8`: one NVML call per GPU (its index), the floor of any reader; the
//!   other numbers read as ratios to it;
//! - `read_8`: one collection by the agent's reader (every value, processes, fields);
//! - `render_8`: the GPU series of one `/metrics` scrape.
//!
//! The fake library answers from memory: on a real driver each call goes to the kernel,
//! and `tests/gpu/real-driver-check.sh` measures that (CPU per collection, RSS).
//!
//! Run: `cargo build --release -p nvidia-ml-fake && cargo bench -p neuron-node-agent --bench gpu`
//! (`NVML_FAKE_LIBRARY=path` names another build of the library).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use api::gpu_groups::GpuGroups;
use criterion::{criterion_group, criterion_main, Criterion};
use neuron_node_agent::{
    gpu::{dcgm::encode_gpus, nvml::NvmlReader, GpuHolders, GpuMetrics, GpuSnapshot},
    routing::Routing,
    series::{Exported, FamilyEncoder, Scope},
    sinks::prometheus::{Exposition, Format},
    state::{InstanceLabels, NodeState},
};
use neuron_test_support::TempDir;
use prometheus_client::registry::Registry;

const CONFIG: &str = "instance_type: p5.48xlarge
processes:
  - {gpu: 0, pid: 101, used_memory_mib: 30000}
  - {gpu: 1, pid: 102, used_memory_mib: 30000}
  - {gpu: 2, pid: 103, used_memory_mib: 30000}
  - {gpu: 3, pid: 104, used_memory_mib: 30000}
";

/// The fake library beside this executable's build (`target/<profile>/`).
fn fake_library() -> PathBuf {
    if let Some(path) = std::env::var_os("NVML_FAKE_LIBRARY") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let library = profile_dir.join("libnvidia_ml_fake.so");
    assert!(
        library.exists(),
        "{} is missing: build it first (`cargo build [--release] -p nvidia-ml-fake`)",
        library.display()
    );
    library
}

/// The GPU series of a snapshot, as one scrape encodes them.
struct Gpus(GpuSnapshot, Routing);

impl Exported for Gpus {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), std::fmt::Error> {
        let (instance, holders) = (InstanceLabels::default(), GpuHolders::new());
        encode_gpus(&self.0, "node-1", &instance, &holders, Scope::Exposition(&self.1), encoder)
    }
}

fn gpu(c: &mut Criterion) {
    let dir = TempDir::new("bench-gpu");
    let config = dir.path().join("fake-nvml.yaml");
    std::fs::write(&config, CONFIG).expect("fake NVML configuration");
    // Read by the library at initialisation, before any thread of the bench starts.
    std::env::set_var("FAKE_NVML_CONFIG", &config);
    let reader =
        NvmlReader::open(Some(&fake_library()), GpuMetrics::register(&mut Registry::default())).expect("fake NVML");
    let snapshot = reader.read(GpuGroups::ALL);
    assert_eq!(snapshot.gpus.len(), 8);
    assert_eq!(snapshot.gpus.iter().map(|g| g.processes.len()).sum::<usize>(), 4);
    assert!(snapshot.gpus.iter().all(|g| g.values.memory_total_bytes.is_some() && !g.lost));

    let mut group = c.benchmark_group("gpu");
    let nvml = reader.nvml();
    group.bench_function("baseline/index_8", |b| {
        b.iter(|| (0..8).filter_map(|i| nvml.device_by_index(i).ok()?.index().ok()).sum::<u32>())
    });
    group.bench_function("read_8", |b| b.iter(|| reader.read(GpuGroups::ALL)));

    let state = Arc::new(Mutex::new(NodeState::default()));
    let mut exposition = Exposition::new(Registry::default(), state, Default::default(), Default::default());
    exposition.export(Box::new(Gpus(snapshot, Routing::default())));
    let page = exposition.render(Format::OpenMetrics).expect("render");
    assert_eq!(page.matches("DCGM_FI_DEV_GPU_UTIL{").count(), 8);
    drop(page);
    group.bench_function("render_8", |b| b.iter(|| exposition.render(Format::OpenMetrics).expect("render")));
    group.finish();
    drop(dir);
}

criterion_group!(benches, gpu);
criterion_main!(benches);
