use std::{collections::BTreeSet, sync::Arc, time::SystemTime};

use api::{
    cloudwatch::{
        catalogue::{gpu::CLASSIC, insights::GPU_METRICS, Unit},
        sink::SinkSettings,
    },
    crd::{CloudWatchMetric, CloudWatchNaming, CloudWatchSinkSpec, Dimension},
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
};

use super::GpuSample;
use crate::{
    gpu::{Gpu, GpuHolder, GpuHolders, GpuIdentity, GpuSnapshot, GpuValues},
    routing::Routing,
    sinks::cloudwatch::{
        datum::{Accumulator, Datum, Values},
        select::{AgentDimensions, View},
    },
    state::{InstanceLabels, PodRef},
};

const MIB: u64 = 1024 * 1024;

fn gpu(index: u32) -> Gpu {
    Gpu {
        identity: GpuIdentity {
            index,
            uuid: format!("GPU-{index}aaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x1b + index),
            device: format!("nvidia{index}"),
            model: "NVIDIA A10G".into(),
        },
        values: GpuValues {
            utilization_gpu: Some(10 + index),
            utilization_memory: Some(5 + index),
            memory_total_bytes: Some(23_028 * MIB),
            memory_reserved_bytes: Some(28 * MIB),
            // Not a whole number of MiB: nvidia-smi's MiB are whole.
            memory_used_bytes: Some(11_500 * MIB + 1234),
            memory_free_bytes: Some(11_500 * MIB - 1234),
            temperature_gpu_c: Some(40 + index),
            power_watts: Some(60.5 + f64::from(index)),
            pcie_link_gen: Some(4),
            pcie_link_width: Some(16),
            graphics_clock_mhz: Some(1710),
            sm_clock_mhz: Some(1710),
            memory_clock_mhz: Some(6251),
            ..GpuValues::default()
        },
        ..Gpu::default()
    }
}

fn snapshot(gpus: Vec<Gpu>) -> GpuSnapshot {
    GpuSnapshot { driver_version: "550.54.15".into(), gpus, collections: 1, ..GpuSnapshot::default() }
}

fn pod(namespace: &str, name: &str, container: &str) -> Arc<PodRef> {
    Arc::new(PodRef {
        namespace: namespace.into(),
        pod: name.into(),
        owner: "train".into(),
        container: container.into(),
        labels: vec![],
    })
}

/// GPU 1 held by team-a's pod.
fn held_by_team_a() -> GpuHolders {
    let uuid = gpu(1).identity.uuid.to_ascii_uppercase();
    GpuHolders::from([(uuid, vec![GpuHolder { pod: pod("team-a", "train-x7k2p", "main"), replica: None }])])
}

fn route(namespace: Option<&str>, spec: CloudWatchSinkSpec) -> Route {
    Route {
        config: "c".to_owned(),
        namespace: namespace.map(str::to_owned),
        runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: if namespace.is_none() { SystemGroup::ALL.to_vec() } else { vec![] },
        prometheus: None,
        cloudwatch: Some(spec),
        otlp: None,
    }
}

/// The datums of one flush after one GPU collection through the sink of `route`.
fn sample(route: Route, snapshot: &GpuSnapshot, holders: &GpuHolders) -> Vec<Datum> {
    let routing =
        Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![route], health: None, gpu: None })
            .unwrap();
    let (route, selection) = routing.cloudwatch_routes().next().unwrap();
    let settings = SinkSettings::check(route.cloudwatch.as_ref().unwrap()).unwrap();
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("node-a".into()) };
    let view = View::new(route, selection, &agent, settings.dimension_sets, true);
    let instance = Arc::new(InstanceLabels {
        instance_id: "i-0abc".into(),
        instance_type: "g5.12xlarge".into(),
        ..InstanceLabels::default()
    });
    let sample = GpuSample { snapshot, holders, hostname: "ip-10-0-0-1.ec2.internal", instance: &instance };
    let mut acc = Accumulator::default();
    view.sample_gpus(&sample, &mut acc);
    acc.drain(SystemTime::UNIX_EPOCH, 60)
}

fn classic() -> CloudWatchSinkSpec {
    CloudWatchSinkSpec { namespace: "Team/Gpu".into(), ..Default::default() }
}

fn insights() -> CloudWatchSinkSpec {
    CloudWatchSinkSpec { naming: Some(CloudWatchNaming::ContainerInsights), ..classic() }
}

fn dims(d: &Datum) -> Vec<(&str, &str)> {
    d.key.dimensions.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

fn value(d: &Datum, name: &str) -> Option<String> {
    d.key.dimensions.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
}

fn only_value(d: &Datum) -> f64 {
    match &d.values {
        Values::Distribution(v) if v.len() == 1 && v[0].1 == 1.0 => v[0].0,
        other => panic!("{}: one sample expected, got {other:?}", d.key.name),
    }
}

fn find<'d>(datums: &'d [Datum], name: &str, index: &str) -> &'d Datum {
    datums
        .iter()
        .find(|d| d.key.name == name && value(d, "index").as_deref() == Some(index))
        .unwrap_or_else(|| panic!("{name} of GPU {index}"))
}

#[test]
fn classic_gpu_series_carry_the_cloudwatch_agents_names_dimensions_and_no_unit() {
    let snap = snapshot(vec![gpu(0), gpu(1)]);
    let ops = sample(route(None, classic()), &snap, &held_by_team_a());
    let names: BTreeSet<&str> = ops.iter().map(|d| d.key.name).collect();
    assert_eq!(names, CLASSIC.iter().map(|m| m.name).collect());
    assert_eq!(ops.len(), 2 * CLASSIC.len(), "one series per GPU and metric under the default set");
    assert!(ops.iter().all(|d| d.unit == Unit::NoUnit), "no unit, as the CloudWatch agent");
    // index, name, host first; then what of the default set applies to a GPU: the cluster,
    // the node, and the pod where one holds the GPU (no NeuronCore, no NeuronDevice).
    let unheld = find(&ops, "nvidia_smi_utilization_gpu", "0");
    assert_eq!(
        dims(unheld),
        vec![
            ("index", "0"),
            ("name", "NVIDIA A10G"),
            ("host", "ip-10-0-0-1.ec2.internal"),
            ("ClusterName", "prod"),
            ("NodeName", "node-a")
        ]
    );
    let held = find(&ops, "nvidia_smi_utilization_gpu", "1");
    assert_eq!(
        dims(held)[3..],
        [
            ("ClusterName", "prod"),
            ("NodeName", "node-a"),
            ("Namespace", "team-a"),
            ("PodName", "train-x7k2p"),
            ("ContainerName", "main")
        ]
    );
    // Values in the CloudWatch agent's units: %, °C, W, whole MiB, MHz.
    let of = |name: &str| only_value(find(&ops, name, "1"));
    assert_eq!(of("nvidia_smi_utilization_gpu"), 11.0);
    assert_eq!(of("nvidia_smi_utilization_memory"), 6.0);
    assert_eq!(of("nvidia_smi_temperature_gpu"), 41.0);
    assert_eq!(of("nvidia_smi_power_draw"), 61.5);
    assert_eq!(of("nvidia_smi_memory_total"), 23_028.0);
    assert_eq!(of("nvidia_smi_memory_used"), 11_500.0);
    assert_eq!(of("nvidia_smi_memory_free"), 11_499.0);
    assert_eq!(of("nvidia_smi_pcie_link_gen_current"), 4.0);
    assert_eq!(of("nvidia_smi_pcie_link_width_current"), 16.0);
    assert_eq!(of("nvidia_smi_clocks_current_memory"), 6251.0);
}

#[test]
fn a_team_gets_the_gpus_its_pods_hold_and_the_operator_namespace_every_gpu() {
    let snap = snapshot(vec![gpu(0), gpu(1)]);
    let holders = held_by_team_a();
    let team_a = sample(route(Some("team-a"), classic()), &snap, &holders);
    let indices: BTreeSet<String> = team_a.iter().filter_map(|d| value(d, "index")).collect();
    assert_eq!(indices, BTreeSet::from(["1".to_owned()]));
    assert!(sample(route(Some("team-b"), classic()), &snap, &holders).is_empty());
    let ops = sample(route(None, classic()), &snap, &holders);
    let indices: BTreeSet<String> = ops.iter().filter_map(|d| value(d, "index")).collect();
    assert_eq!(indices.len(), 2);
}

#[test]
fn roll_ups_repeat_the_gpu_series_and_an_allow_list_leaves_gpus_out() {
    let snap = snapshot(vec![gpu(0)]);
    let mut spec = classic();
    spec.dimensions = Some(vec![Dimension::InstanceId, Dimension::NeuronCore]);
    spec.rollups = Some(vec![vec![Dimension::ClusterName]]);
    let datums = sample(route(None, spec), &snap, &GpuHolders::new());
    let util: Vec<Vec<(&str, &str)>> =
        datums.iter().filter(|d| d.key.name == "nvidia_smi_utilization_gpu").map(dims).collect();
    assert_eq!(util.len(), 2, "{util:?}");
    assert!(util.iter().any(|d| d[3..] == [("InstanceId", "i-0abc")]), "{util:?}");
    assert!(util.iter().any(|d| d[3..] == [("ClusterName", "prod")]), "{util:?}");
    let mut listed = classic();
    listed.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization]);
    assert!(sample(route(None, listed), &snap, &GpuHolders::new()).is_empty());
}

#[test]
fn container_insights_gpu_series_have_its_names_units_and_sets() {
    let snap = snapshot(vec![gpu(0), gpu(1)]);
    let ops = sample(route(None, insights()), &snap, &held_by_team_a());
    for d in &ops {
        let m = GPU_METRICS.iter().find(|m| m.name == d.key.name).unwrap_or_else(|| panic!("{}", d.key.name));
        assert_eq!(d.unit, m.unit, "{}", d.key.name);
        let names: Vec<&str> = d.key.dimensions.iter().map(|(n, _)| *n).collect();
        assert!(m.dimension_sets().iter().any(|s| s.iter().map(|x| x.name()).eq(names.iter().copied())), "{d:?}");
    }
    // Every set of every metric: node ones for both GPUs, pod and container ones for the
    // held GPU.
    let expected: usize = GPU_METRICS.iter().map(|m| m.dimension_sets().len()).sum();
    let distinct: BTreeSet<(&str, Vec<&str>)> =
        ops.iter().map(|d| (d.key.name, d.key.dimensions.iter().map(|(n, _)| *n).collect())).collect();
    assert_eq!(distinct.len(), expected);
    let device = |name: &str, gpu: &str| {
        ops.iter()
            .find(|d| d.key.name == name && value(d, "GpuDevice").as_deref() == Some(gpu))
            .unwrap_or_else(|| panic!("{name} {gpu}"))
    };
    let node0 = device("node_gpu_memory_used", "nvidia0");
    assert_eq!(
        dims(node0),
        vec![
            ("ClusterName", "prod"),
            ("NodeName", "node-a"),
            ("InstanceId", "i-0abc"),
            ("InstanceType", "g5.12xlarge"),
            ("GpuDevice", "nvidia0")
        ]
    );
    assert_eq!(only_value(node0), (11_500 * MIB + 1234) as f64, "bytes, as read");
    let pod1 = device("pod_gpu_utilization", "nvidia1");
    assert_eq!(
        dims(pod1),
        vec![
            ("ClusterName", "prod"),
            ("Namespace", "team-a"),
            ("PodName", "train"),
            ("FullPodName", "train-x7k2p"),
            ("GpuDevice", "nvidia1")
        ]
    );
    assert_eq!(only_value(pod1), 11.0);
    // Framebuffer used of the usable (total less reserved), as DCGM's FB_USED_PERCENT.
    let percent = only_value(device("container_gpu_memory_utilization", "nvidia1"));
    assert!((percent - (11_500.0 * MIB as f64 + 1234.0) * 100.0 / (23_000.0 * MIB as f64)).abs() < 1e-9);
    assert_eq!(only_value(device("node_gpu_power_draw", "nvidia1")), 61.5);
    assert!(!ops.iter().any(|d| d.key.name.starts_with("pod_") && value(d, "GpuDevice").as_deref() == Some("nvidia0")));
    // Coarse sets carry each GPU's value (not pre-aggregated).
    let cluster = ops.iter().find(|d| d.key.name == "node_gpu_temperature" && d.key.dimensions.len() == 1).unwrap();
    assert_eq!(cluster.sample_count(), 2.0);

    // A team's route: its pod's series, nothing of the node.
    let team = sample(route(Some("team-a"), insights()), &snap, &held_by_team_a());
    assert!(!team.is_empty() && team.iter().all(|d| !d.key.name.starts_with("node_")));
}

#[test]
fn a_gpu_shared_by_replicas_of_one_pod_is_one_pod_series() {
    let snap = snapshot(vec![gpu(0)]);
    let uuid = gpu(0).identity.uuid.to_ascii_uppercase();
    let p = pod("team-a", "serve-0", "srv");
    let other = pod("team-a", "serve-1", "srv");
    let holders = GpuHolders::from([(
        uuid,
        vec![
            GpuHolder { pod: p.clone(), replica: Some(0) },
            GpuHolder { pod: p, replica: Some(1) },
            GpuHolder { pod: other, replica: Some(2) },
        ],
    )]);
    let ops = sample(route(None, insights()), &snap, &holders);
    let finest = |name: &str, pod: &str| {
        ops.iter()
            .find(|d| {
                d.key.name == name && value(d, "FullPodName").as_deref() == Some(pod) && value(d, "GpuDevice").is_some()
            })
            .unwrap_or_else(|| panic!("{name} {pod}"))
            .sample_count()
    };
    assert_eq!(finest("pod_gpu_utilization", "serve-0"), 1.0);
    assert_eq!(finest("container_gpu_utilization", "serve-0"), 1.0);
    assert_eq!(finest("pod_gpu_utilization", "serve-1"), 1.0);
    // The node's series counts the GPU once.
    let node = ops.iter().find(|d| d.key.name == "node_gpu_utilization" && d.key.dimensions.len() == 1).unwrap();
    assert_eq!(node.sample_count(), 1.0);
}

#[test]
fn a_lost_gpu_or_a_stale_collection_sends_nothing() {
    let mut lost = gpu(1);
    lost.lost = true;
    let datums = sample(route(None, classic()), &snapshot(vec![gpu(0), lost]), &GpuHolders::new());
    assert!(!datums.is_empty() && datums.iter().all(|d| value(d, "index").as_deref() == Some("0")));
    let stale = GpuSnapshot { stale: true, ..snapshot(vec![gpu(0)]) };
    assert!(sample(route(None, insights()), &stale, &GpuHolders::new()).is_empty());
}
