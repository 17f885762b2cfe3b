//! The CloudWatch sinks on a node with NVIDIA GPUs and no report (no Neuron device, no
//! neuron-monitor), in one process against LocalStack: each GPU collection is sampled
//! once and sent, without a report, to the sink's own region; reports in between do not
//! sample the GPUs again. (The agent binary on the fake NVML library: `cloudwatch.rs`.)

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::{
    crd::{CloudWatchSinkSpec, Dimension},
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
};
use neuron_e2e::localstack::CloudWatch;
use neuron_node_agent::{
    delivery::backoff::Backoff,
    gpu::{Gpu, GpuIdentity, GpuSnapshot, GpuSource, GpuValues},
    health::model::HealthModel,
    routing::{Routing, SharedRouting},
    sinks::cloudwatch::{select::AgentDimensions, telemetry::CloudWatchMetrics, Options, Sinks},
    state::NodeState,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn collection(n: u64, utilization: u32) -> Arc<GpuSnapshot> {
    let gpu = Gpu {
        identity: GpuIdentity {
            index: 0,
            uuid: "GPU-0aaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            pci_bus_id: "00000000:1E:00.0".into(),
            device: "nvidia0".into(),
            model: "NVIDIA A10G".into(),
        },
        values: GpuValues { utilization_gpu: Some(utilization), ..GpuValues::default() },
        ..Gpu::default()
    };
    Arc::new(GpuSnapshot {
        driver_version: "550.54.15".into(),
        gpus: vec![gpu],
        collections: n,
        ..GpuSnapshot::default()
    })
}

#[test]
fn gpu_collections_are_sent_without_a_report_each_once() {
    let cw = CloudWatch::start();
    // Set before any thread of the runtime reads them.
    std::env::set_var("AWS_ENDPOINT_URL_CLOUDWATCH", format!("http://{}", cw.addr()));
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    std::env::remove_var("AWS_REGION");
    std::env::remove_var("AWS_DEFAULT_REGION");
    let namespace = cw.namespace("GpuOnly");
    let spec = CloudWatchSinkSpec {
        namespace: namespace.clone(),
        region: Some("us-west-2".to_owned()),
        dimensions: Some(vec![Dimension::ClusterName]),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    let route = Route {
        config: "neuron-monitor/gpus".to_owned(),
        namespace: None,
        runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: SystemGroup::ALL.to_vec(),
        prometheus: None,
        cloudwatch: Some(spec),
        otlp: None,
    };
    let routing = SharedRouting::default();
    routing.replace(
        Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![route], health: None, gpu: None })
            .unwrap(),
    );

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let (reports, _) = watch::channel(0u64);
        let (collections, snapshot) = watch::channel(Arc::new(GpuSnapshot::default()));
        let mut registry = prometheus_client::registry::Registry::default();
        let sinks = Sinks {
            // No report: the instance (and its region) is unknown.
            state: Arc::new(Mutex::new(NodeState::default())),
            routing,
            reports: reports.subscribe(),
            options: Options {
                agent: AgentDimensions { cluster_name: Some("prod".into()), node_name: None },
                queue_datums: 1000,
                backoff: Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(2) },
                request_timeout: Duration::from_secs(30),
                shutdown_timeout: Duration::from_secs(30),
            },
            metrics: CloudWatchMetrics::register(&mut registry),
            health: Arc::new(Mutex::new(HealthModel::new("boot".to_owned(), Duration::from_secs(60)))),
            gpus: Some(GpuSource {
                snapshot,
                holders: Default::default(),
                process_pods: Default::default(),
                hostname: "gpu-host".into(),
            }),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sinks.run(shutdown.clone()));
        // Three collections, reports between them (as on a node with both).
        for (n, utilization) in [(1, 10), (2, 20), (3, 30)] {
            collections.send_replace(collection(n, utilization));
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                reports.send_modify(|r| *r += 1);
            }
        }
        // Shutdown flushes what is left and sends the queue.
        shutdown.cancel();
        task.await.unwrap();
    });

    let deadline = Instant::now() + Duration::from_secs(30);
    let utilization = loop {
        let stored = cw.stored();
        let rows: Vec<f64> = stored
            .iter()
            .filter(|s| s.namespace == namespace && s.name == "nvidia_smi_utilization_gpu")
            .inspect(|s| {
                let want: BTreeMap<String, String> =
                    [("index", "0"), ("name", "NVIDIA A10G"), ("host", "gpu-host"), ("ClusterName", "prod")]
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect();
                assert_eq!(s.dimensions, want);
            })
            .map(|s| s.value)
            .collect();
        if rows.len() >= 3 || Instant::now() > deadline {
            break rows;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut sorted = utilization.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, vec![10.0, 20.0, 30.0], "each collection once, none per report");
}
