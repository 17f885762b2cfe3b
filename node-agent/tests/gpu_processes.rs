//! The GPU processes on `/metrics` of the real agent binary, on the project's fake NVML
//! library: NVML lists a process once per MIG compute instance it runs in (and an odd
//! driver may list one twice off MIG), yet `/metrics` never carries two series of one
//! name and label set (issue 41, item 8).

mod support;

use std::{collections::BTreeMap, time::Duration};

use support::{Agent, Metrics, TempDir};

/// GPU 0 of a p4d.24xlarge in MIG mode: process 4242 runs in two compute instances of
/// GPU instance 1 (NVML lists it twice there, 1,000 and 500 MiB), 4343 in GPU instance 7;
/// GPU 1 (no MIG) lists process 4444 twice (300 and 100 MiB).
const CONFIG: &str = "instance_type: p4d.24xlarge\n\
gpus:\n\
- index: 0\n  mig: {enabled: true, instances: [{profile: 3g.20gb, gpu_instance_id: 1}, {profile: 1g.5gb, gpu_instance_id: 7}]}\n\
processes:\n\
- {gpu: 0, pid: 4242, used_memory_mib: 1000, gpu_instance_id: 1, compute_instance_id: 0, sm_util: 30}\n\
- {gpu: 0, pid: 4242, used_memory_mib: 500, gpu_instance_id: 1, compute_instance_id: 1, sm_util: 30}\n\
- {gpu: 0, pid: 4343, used_memory_mib: 200, gpu_instance_id: 7}\n\
- {gpu: 1, pid: 4444, used_memory_mib: 300}\n\
- {gpu: 1, pid: 4444, used_memory_mib: 100}\n";

const MIB: f64 = 1024.0 * 1024.0;

/// Each series of the page as `name{labels}`, with how many times it appears.
fn series_counts(m: &Metrics) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in &m.samples {
        let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        *counts.entry(format!("{}{{{}}}", s.name, labels.join(","))).or_default() += 1;
    }
    counts
}

#[test]
fn a_process_nvml_lists_twice_in_one_gpu_instance_is_one_series_with_its_memory_summed() {
    let dir = TempDir::new("gpu-processes");
    let config = dir.path().join("nvml.yaml");
    std::fs::write(&config, CONFIG).expect("write the fake NVML configuration");
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let args = ["--period", "500ms", "--nvml-library", library.to_str().expect("utf-8 path")];
    // A GPU-only host without Kubernetes: no neuron-monitor is started, so none is needed.
    let agent =
        Agent::start_with_env("/nonexistent/neuron-monitor", &[], &args, &[("FAKE_NVML_CONFIG", config.as_os_str())]);

    let m = agent.wait_for("two collections with the processes", Duration::from_secs(30), |m| {
        let collected = m.value("neuron_agent_gpu_collections_total", &[]).is_some_and(|n| n >= 2.0);
        (collected && !m.find("gpu_process_memory_used_bytes", &[("pid", "4444")]).is_empty()).then(|| m.clone())
    });
    let duplicates: Vec<(String, usize)> = series_counts(&m).into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(duplicates.is_empty(), "series on /metrics more than once: {duplicates:#?}");

    // One series per (GPU, GPU instance, PID), the compute instances' memory summed.
    let memory = |pid: &str| m.find("gpu_process_memory_used_bytes", &[("pid", pid)]);
    let mig = memory("4242");
    assert_eq!(mig.len(), 1, "{mig:?}");
    assert_eq!(mig[0].labels.get("GPU_I_ID").map(String::as_str), Some("1"));
    assert_eq!(mig[0].value, 1500.0 * MIB);
    let twice = memory("4444");
    assert_eq!(twice.len(), 1, "{twice:?}");
    assert_eq!(twice[0].value, 400.0 * MIB);
    assert_eq!(memory("4343").first().map(|s| s.value), Some(200.0 * MIB));
    // The utilization NVML samples per PID: the process's, once.
    let utilization = m.find("gpu_process_sm_utilization_percent", &[("pid", "4242")]);
    assert_eq!(utilization.iter().map(|s| s.value).collect::<Vec<_>>(), vec![30.0]);
    // Said in the agent's own metrics: two listings folded into others a collection.
    assert!(m.value("neuron_agent_gpu_processes_merged_total", &[]).is_some_and(|n| n >= 2.0), "{}", m.text);
    assert_eq!(m.value("neuron_agent_gpu_duplicate_series_total", &[]), Some(0.0));
}
