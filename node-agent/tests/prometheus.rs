//! The agent's exposition as Prometheus' own tools see it: `promtool check metrics`
//! and a real Prometheus server scraping the agent.

mod support;

use std::time::Duration;

use support::{promtool_complaints, Agent, Prometheus, TempDir, ACCEPTED_LINT};

const SCENARIO: &[&str] = &[
    "--instance-type=trn1.32xlarge",
    "--app=tag=train,cores=0-7,util=80,rps=50,errors=1",
    "--app=tag=serve,cores=8,util=25,rps=200",
    "--ecc-every=1",
];

fn start_agent() -> Agent {
    let agent = Agent::start(SCENARIO, &["--period", "500ms"]);
    agent.wait_for("two reports", Duration::from_secs(15), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 2.0).then_some(())
    });
    agent
}

#[test]
fn promtool_accepts_the_exposition() {
    let agent = start_agent();
    let (status, body) = agent.get("/metrics").expect("GET /metrics");
    assert_eq!(status, 200);
    assert!(body.contains("system_vcpu_count{"), "the test needs the series promtool flags");
    assert_eq!(promtool_complaints(&body), vec![ACCEPTED_LINT.to_owned()]);
}

#[test]
fn prometheus_scrapes_the_values_the_simulator_produced() {
    let agent = start_agent();
    let prometheus = Prometheus::start(&[agent.addr]);
    let serve =
        prometheus.wait_for(r#"neuroncore_utilization_ratio{runtime_tag="serve"}"#, Duration::from_secs(30), |r| {
            (r.len() == 1).then(|| r[0].clone())
        });
    assert_eq!(serve.1, 0.25);
    assert_eq!(serve.0.get("neuroncore").map(String::as_str), Some("8"));
    assert_eq!(serve.0.get("instance_type").map(String::as_str), Some("trn1.32xlarge"));
    // 8 cores busy at 80% for one runtime, 1 at 25% for the other, 23 idle at 0.
    let by_tag =
        prometheus.wait_for("sum by (runtime_tag) (neuroncore_utilization_ratio)", Duration::from_secs(10), |r| {
            (r.len() == 3).then(|| r.to_vec())
        });
    let total = |tag: &str| {
        by_tag.iter().find(|(l, _)| l.get("runtime_tag").map(String::as_str).unwrap_or("") == tag).map(|(_, v)| *v)
    };
    assert!((total("train").unwrap_or(0.0) - 6.4).abs() < 1e-9, "{by_tag:?}");
    assert_eq!(total(""), Some(0.0));
    assert_eq!(
        prometheus.query("count(neuroncore_utilization_ratio)").first().map(|r| r.1),
        Some(32.0),
        "trn1.32xlarge has 32 cores, each exported once"
    );
    // Counters go up as running sums; ECC events are counted per device.
    prometheus.wait_for(
        r#"execution_status_total{runtime_tag="serve",status_type="completed"} > 100"#,
        Duration::from_secs(20),
        |r| (!r.is_empty()).then_some(()),
    );
    prometheus.wait_for(
        r#"hardware_ecc_events_total{event_type="mem_ecc_corrected",neuron_device_index="0"} >= 2"#,
        Duration::from_secs(20),
        |r| (!r.is_empty()).then_some(()),
    );
    let up = prometheus.query(r#"up{job="neuron-node-agent"}"#);
    assert_eq!(up.first().map(|r| r.1), Some(1.0));
}

/// A trn2.48xlarge with logical NeuronCores (LNC=2, as neuron-monitor reports them): 64
/// logical cores, each with its two physical ones, all held by one application.
#[test]
fn a_trn2_node_shows_64_logical_and_128_physical_cores() {
    let agent =
        Agent::start(&["--instance-type=trn2.48xlarge", "--app=tag=big,cores=0-63,util=80"], &["--period", "500ms"]);
    let (logical, physical) = agent.wait_for("the core series", Duration::from_secs(20), |m| {
        let logical = m.find("neuroncore_utilization_ratio", &[("runtime_tag", "big")]);
        let physical = m.find("neuroncore_physical_utilization_ratio", &[("runtime_tag", "big")]);
        (logical.len() == 64 && physical.len() == 128).then(|| {
            let pairs: Vec<(u32, u32, f64)> = physical
                .iter()
                .map(|s| {
                    (s.labels["neuroncore"].parse().unwrap(), s.labels["physical_neuroncore"].parse().unwrap(), s.value)
                })
                .collect();
            (logical.len(), pairs)
        })
    });
    assert_eq!(logical, 64);
    let mut hosts: Vec<u32> = physical.iter().map(|(_, p, _)| *p).collect();
    hosts.sort_unstable();
    assert_eq!(hosts, (0..128).collect::<Vec<u32>>(), "every physical core once");
    for (logical, host, _) in &physical {
        assert_eq!(host / 2, *logical, "physical core {host} belongs to logical core {logical}");
    }
    // Each logical core's physical cores average to its own utilization.
    for logical in 0..64u32 {
        let mean: f64 = physical.iter().filter(|(l, _, _)| *l == logical).map(|(_, _, v)| v).sum::<f64>() / 2.0;
        assert!((mean - 0.8).abs() < 1e-9, "logical core {logical}: mean {mean}");
    }
}

/// The same trn2.48xlarge with LNC=1: 128 cores, each its own, no physical breakdown.
#[test]
fn a_trn2_node_with_lnc_1_shows_128_cores_and_no_physical_ones() {
    let sim = ["--instance-type=trn2.48xlarge", "--lnc=1", "--app=tag=big,cores=0-127,util=80"];
    let agent = Agent::start(&sim, &["--period", "500ms"]);
    let m = agent.wait_for("the core series", Duration::from_secs(20), |m| {
        (m.find("neuroncore_utilization_ratio", &[("runtime_tag", "big")]).len() == 128).then(|| m.clone())
    });
    assert!(m.find("neuroncore_physical_utilization_ratio", &[]).is_empty());
    let info = m.find("neuron_hardware_info", &[]);
    assert_eq!(info[0].labels["neuroncore_per_device_count"], "8", "{info:?}");
}

/// A trn3.48xlarge (LNC=2: 64 logical NeuronCore-v4, 128 physical) whose application hits
/// an error type newer than the documented six: everything the report says, nothing made
/// up, and an exposition promtool accepts.
#[test]
fn a_trn3_node_exports_what_its_reports_say() {
    let sim = [
        "--instance-type=trn3.48xlarge",
        "--app=tag=big,cores=0-39,util=60,rps=40,errors=4,error_type=memory_pressure",
    ];
    // A configuration taking everything, with the loaded models' info series (off by default).
    let dir = TempDir::new("trn3-models");
    let config = dir.0.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: { name: all, namespace: ops }\n\
         spec:\n  period: 1s\n  sinks:\n    prometheus: { loadedModelInfo: true }\n",
    )
    .expect("write the config");
    let agent = Agent::start(&sim, &["--config", config.to_str().expect("path")]);
    let m = agent.wait_for("the new series", Duration::from_secs(20), |m| {
        let errors = m.value("execution_errors_total", &[("runtime_tag", "big"), ("error_type", "memory_pressure")]);
        (errors.unwrap_or(0.0) > 0.0 && !m.find("neuron_runtime_loaded_model_info", &[]).is_empty()).then(|| m.clone())
    });
    let big = [("runtime_tag", "big")];
    assert_eq!(m.find("neuroncore_utilization_ratio", &big).len(), 40);
    assert_eq!(m.find("neuroncore_physical_utilization_ratio", &big).len(), 80);
    // The six documented types at the simulator's zeros, and the new one: nothing else.
    let mut types: Vec<String> =
        m.find("execution_errors_total", &big).iter().map(|s| s.labels["error_type"].clone()).collect();
    types.sort();
    assert_eq!(types, ["generic", "hardware", "memory_pressure", "model", "numerical", "runtime", "transient"]);
    assert_eq!(m.value("execution_errors_total", &[("runtime_tag", "big"), ("error_type", "generic")]), Some(0.0));

    let hardware = &m.find("neuron_hardware_info", &[])[0].labels;
    let field = |k: &str| hardware.get(k).map(String::as_str);
    assert_eq!(field("neuron_device_type"), Some("trainium3"));
    assert_eq!(field("neuroncore_version"), Some("v4"));
    assert_eq!(field("logical_neuroncore_config"), Some("2"));
    assert_eq!(field("neuron_device_memory_size"), Some(&*(144u64 << 30).to_string()));
    assert_eq!(field("neuroncore_per_device_count"), Some("4"), "existing labels stay");

    // One model per core, all running; an info series for the first 32.
    assert_eq!(m.value("neuron_runtime_loaded_models", &[("runtime_tag", "big"), ("state", "running")]), Some(40.0));
    assert_eq!(m.value("neuron_runtime_loaded_models", &[("runtime_tag", "big"), ("state", "idle")]), Some(0.0));
    assert_eq!(m.find("neuron_runtime_loaded_model_info", &big).len(), 32);
    assert!(m.sum("neuron_agent_report_values_refused_total", &[("what", "loaded_model")]) >= 8.0);
    // NeuronCore-v4's documented 315 MXFP8 TFLOPS, two physical cores per logical one.
    assert_eq!(m.value("neuroncore_peak_flops", &[("data_type", "mxfp8")]), Some(630e12));

    let (_, body) = agent.get("/metrics").expect("GET /metrics");
    assert_eq!(promtool_complaints(&body), vec![ACCEPTED_LINT.to_owned()]);
}
