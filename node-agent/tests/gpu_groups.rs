//! The GPU collector's groups and NVLink counters on the project's fake NVML library (its
//! own process: the library reads its configuration once per process).

use std::time::Duration;

use api::gpu_groups::{GpuGroup, GpuGroups};
use neuron_node_agent::gpu::{nvml::NvmlReader, GpuMetrics, GpuSnapshot};
use neuron_test_support::TempDir;

fn first_gpu(snapshot: &GpuSnapshot) -> &neuron_node_agent::gpu::Gpu {
    snapshot.gpus.first().expect("the fake p5.48xlarge has GPUs")
}

#[test]
fn nvlink_counters_and_bandwidth_and_only_the_groups_asked_for() {
    let dir = TempDir::new("gpu-groups");
    let config = dir.path().join("fake-nvml.yaml");
    let yaml = "instance_type: p5.48xlarge\n\
                gpus:\n  - {index: 0, utilization_gpu: 30, nvlink: {tx_kib_per_second: 4000000, rx_kib_per_second: 1000000, replay_errors: 7}}\n\
                processes:\n  - {gpu: 0, pid: 4242, used_memory_mib: 512, sm_util: 65}\n";
    std::fs::write(&config, yaml).expect("fake NVML configuration");
    std::env::set_var("FAKE_NVML_CONFIG", &config);
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let reader = NvmlReader::open(Some(&library), GpuMetrics::default()).expect("the fake NVML library");

    let first = reader.read(GpuGroups::ALL);
    let links = first_gpu(&first).values.nvlink.expect("an H100 SXM has NVLink");
    assert_eq!(links.replay_errors, Some(7));
    assert_eq!(links.bandwidth, None, "no bandwidth before a second read");
    std::thread::sleep(Duration::from_millis(500));
    let second = reader.read(GpuGroups::ALL);
    // 5,000,000 KiB/s together, divided by 1000 as DCGM does: 5000 (the fake's counters
    // move in whole milliseconds).
    let bandwidth = first_gpu(&second).values.nvlink.and_then(|l| l.bandwidth).expect("a bandwidth");
    assert!((4_900.0..=5_100.0).contains(&bandwidth), "{bandwidth}");
    assert_eq!(first_gpu(&second).processes.len(), 1);
    assert_eq!(first_gpu(&second).processes[0].sm_utilization, Some(65), "NVML's per-process sample");

    // NVLink alone: no utilization, no processes; ECC still read for health.
    let nvlink_only: GpuGroups = [GpuGroup::Nvlink].into_iter().collect();
    let only = reader.read(nvlink_only);
    let gpu = first_gpu(&only);
    assert_eq!(only.groups, nvlink_only);
    assert_eq!(gpu.values.utilization_gpu, None);
    assert!(gpu.processes.is_empty());
    assert!(gpu.values.nvlink.is_some());
    assert!(gpu.values.ecc.uncorrected_volatile.is_some(), "{gpu:?}");
    assert!(gpu.values.remapped_rows.failure.is_some(), "{gpu:?}");

    // Without the NVLink group, no NVLink read.
    let no_links: GpuGroups = GpuGroup::ALL.into_iter().filter(|g| *g != GpuGroup::Nvlink).collect();
    let without = reader.read(no_links);
    assert_eq!(first_gpu(&without).values.nvlink, None);
    assert_eq!(first_gpu(&without).values.utilization_gpu, Some(30));
}
