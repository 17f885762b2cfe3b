//! The GPU collector on the project's fake NVML library: what each collection reads
//! again, and what it keeps between the reads of its costly values.

use std::time::Duration;

use api::gpu_groups::GpuGroups;
use neuron_node_agent::gpu::{nvml::NvmlReader, GpuMetrics, GpuSnapshot};
use neuron_test_support::TempDir;

fn energy(snapshot: &GpuSnapshot) -> Option<u64> {
    snapshot.gpus.first().and_then(|g| g.values.energy_millijoules)
}

fn utilization(snapshot: &GpuSnapshot) -> Option<u32> {
    snapshot.gpus.first().and_then(|g| g.values.utilization_gpu)
}

#[test]
fn costly_values_are_read_once_per_refresh_the_others_every_collection() {
    let dir = TempDir::new("gpu-collector");
    let config = dir.path().join("fake-nvml.yaml");
    let write = |util: u32| {
        let yaml = format!("instance_type: g5.xlarge\ngpus:\n  - {{index: 0, utilization_gpu: {util}}}\n");
        std::fs::write(&config, yaml).expect("fake NVML configuration");
    };
    write(10);
    // Read by the library at initialisation; this test is its process's only thread using it.
    std::env::set_var("FAKE_NVML_CONFIG", &config);
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let open = || NvmlReader::open(Some(&library), GpuMetrics::default()).expect("the fake NVML library");

    // The default refresh: the energy counter (4 ms of CPU per read on a real driver) is
    // kept between collections, while utilization follows each one.
    let reader = open();
    let first = reader.read(GpuGroups::ALL);
    assert_eq!(utilization(&first), Some(10));
    assert!(energy(&first).is_some(), "{first:?}");
    // The fake's energy grows with time, and it takes a changed file within ~100 ms.
    std::thread::sleep(Duration::from_millis(300));
    write(20);
    std::thread::sleep(Duration::from_millis(300));
    let second = reader.read(GpuGroups::ALL);
    assert_eq!(utilization(&second), Some(20), "utilization is read every collection");
    assert_eq!(energy(&second), energy(&first), "the energy counter waits for its refresh");

    // With no refresh interval the costly values are read every collection too.
    let every_time = open().with_slow_refresh(Duration::ZERO);
    let before = every_time.read(GpuGroups::ALL);
    std::thread::sleep(Duration::from_millis(300));
    let after = every_time.read(GpuGroups::ALL);
    assert!(energy(&after) > energy(&before), "{:?} then {:?}", energy(&before), energy(&after));
}
