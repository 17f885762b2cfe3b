use std::{collections::BTreeSet, sync::Arc, time::Duration};

use api::{
    cloudwatch::catalogue::Unit,
    crd::{CloudWatchMetric, CloudWatchSinkSpec, Dimension},
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
    report::Report,
};

use super::{
    datum::{split, Accumulator, Datum, MetricKey, Values, MAX_DATUMS_PER_REQUEST, MAX_REQUEST_BYTES},
    publish::to_sdk,
    select::{AgentDimensions, View},
    SinkSettings,
};
use crate::{
    delivery::{aws::classify_service, backoff::Backoff},
    routing::Routing,
    state::{NodeState, PodCores, PodRef},
    testdata::{a_pod_per_runtime, fixture, TRN1N_32, TRN1_ERRORS},
};

fn key(name: &'static str, dims: &[(&'static str, &str)]) -> MetricKey {
    MetricKey { name, dimensions: dims.iter().map(|(n, v)| (*n, (*v).to_owned())).collect() }
}

fn cw(namespace: &str) -> CloudWatchSinkSpec {
    CloudWatchSinkSpec { namespace: namespace.to_owned(), ..Default::default() }
}

fn route(namespace: Option<&str>, filter: Option<&str>, spec: CloudWatchSinkSpec) -> Route {
    Route {
        config: "team/config".to_owned(),
        namespace: namespace.map(str::to_owned),
        runtimes: vec![RouteRuntimes { tag_filter: filter.map(str::to_owned), groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: SystemGroup::ALL.to_vec(),
        prometheus: None,
        cloudwatch: Some(spec),
        otlp: None,
    }
}

/// The sink of `route`, fresh.
fn view(route: Route, agent: &AgentDimensions) -> View {
    let routing =
        Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![route], health: None, gpu: None })
            .unwrap();
    let (route, runtimes) = routing.cloudwatch_routes().next().unwrap();
    let settings = SinkSettings::check(route.cloudwatch.as_ref().unwrap()).unwrap();
    View::new(route, runtimes, agent, settings.dimension_sets, true)
}

/// Samples `state` once through the sink of `route`; the datums of one flush.
fn sample(route: Route, state: &NodeState, agent: &AgentDimensions) -> Vec<Datum> {
    let mut view = view(route, agent);
    let mut acc = Accumulator::default();
    view.sample(state, &mut acc);
    acc.drain(std::time::SystemTime::UNIX_EPOCH, 60)
}

fn state_of(name: &str) -> NodeState {
    let mut state = NodeState::default();
    state.apply(&Report::parse(&fixture(name)).unwrap());
    state
}

fn names(datums: &[Datum]) -> BTreeSet<&'static str> {
    datums.iter().map(|d| d.key.name).collect()
}

fn dims(d: &Datum) -> Vec<&str> {
    d.key.dimensions.iter().map(|(n, _)| *n).collect()
}

#[test]
fn samples_become_one_datum_per_metric_with_value_counts() {
    let mut acc = Accumulator::default();
    let k = key("neuroncore_utilization", &[("NeuronCore", "0")]);
    for v in [50.0, 50.0, 70.0, f64::NAN] {
        acc.gauge(k.clone(), Unit::Percent, v);
    }
    acc.count(key("neuron_execution_errors", &[("ErrorType", "generic")]), 2.0);
    acc.count(key("neuron_execution_errors", &[("ErrorType", "generic")]), 3.0);
    let datums = acc.drain(std::time::SystemTime::UNIX_EPOCH, 60);
    assert_eq!(datums.len(), 2);
    let errors = &datums[0];
    assert_eq!(errors.key.name, "neuron_execution_errors");
    assert_eq!(errors.values, Values::Distribution(vec![(5.0, 1.0)]));
    assert_eq!(errors.unit, Unit::Count);
    let util = &datums[1];
    assert_eq!(util.values, Values::Distribution(vec![(50.0, 2.0), (70.0, 1.0)]));
    assert_eq!(util.sample_count(), 3.0);
    assert!(acc.is_empty(), "a flush starts over");
}

#[test]
fn more_than_150_distinct_values_become_a_statistic_set() {
    let mut acc = Accumulator::default();
    for i in 0..200 {
        acc.gauge(key("neuroncore_utilization", &[]), Unit::Percent, f64::from(i));
    }
    let datums = acc.drain(std::time::SystemTime::UNIX_EPOCH, 1);
    assert_eq!(datums[0].values, Values::Statistics { count: 200.0, sum: 19_900.0, min: 0.0, max: 199.0 });
    assert_eq!(datums[0].storage_resolution, 1);
}

fn datum(name: &'static str, dims: usize, values: usize) -> Datum {
    let dimensions = (0..dims).map(|i| ("PodName", format!("pod-{i}-{}", "x".repeat(200)))).collect();
    Datum {
        key: Arc::new(MetricKey { name, dimensions }),
        unit: Unit::Bytes,
        values: Values::Distribution((0..values).map(|v| (v as f64, 1.0)).collect()),
        timestamp: std::time::SystemTime::UNIX_EPOCH,
        storage_resolution: 60,
    }
}

#[test]
fn requests_hold_at_most_1000_datums() {
    let batches = split((0..2500).map(|_| datum("neuroncore_utilization", 2, 1)).collect(), "Team/Neuron");
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![1000, 1000, 500]);
}

#[test]
fn requests_stay_under_1_mb() {
    // 150 values and 20 long dimensions: ~9 KB each, so ~110 fit in a request.
    let datums: Vec<Datum> = (0..1000).map(|_| datum("neuroncore_memory_usage_tensors", 20, 150)).collect();
    let total: usize = datums.iter().map(Datum::encoded_size).sum();
    let batches = split(datums, "Team/Neuron");
    assert!(batches.len() >= total.div_ceil(MAX_REQUEST_BYTES));
    for batch in &batches {
        assert!(batch.len() <= MAX_DATUMS_PER_REQUEST);
        assert!(batch.iter().map(Datum::encoded_size).sum::<usize>() < MAX_REQUEST_BYTES);
    }
    assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 1000, "nothing lost in splitting");
}

#[test]
fn the_size_estimate_is_above_the_sdk_encoding() {
    // The real request body (CBOR) must be below the estimate, or requests could pass 1 MB.
    let d = datum("neuroncore_memory_usage_tensors", 20, 150);
    let sdk = to_sdk(&d);
    let cbor_lower_bound: usize =
        sdk.dimensions().iter().map(|x| x.name().unwrap().len() + x.value().unwrap().len()).sum::<usize>()
            + sdk.values().len() * 9
            + sdk.counts().len() * 9;
    assert!(d.encoded_size() > cbor_lower_bound + 200);
}

#[test]
fn sdk_datums_carry_values_and_counts_or_statistics() {
    let mut d = datum("neuroncore_utilization", 1, 2);
    let sdk = to_sdk(&d);
    assert_eq!(sdk.values(), &[0.0, 1.0]);
    assert_eq!(sdk.counts(), &[1.0, 1.0]);
    assert_eq!(sdk.storage_resolution(), Some(60));
    assert_eq!(sdk.unit().map(|u| u.as_str()), Some("Bytes"));
    d.values = Values::Statistics { count: 3.0, sum: 6.0, min: 1.0, max: 3.0 };
    let stats = to_sdk(&d).statistic_values().cloned().unwrap();
    assert_eq!(
        (stats.sample_count(), stats.sum(), stats.minimum(), stats.maximum()),
        (Some(3.0), Some(6.0), Some(1.0), Some(3.0))
    );
}

/// CloudWatch keeps fractional `Counts`, LocalStack (the end-to-end tests' CloudWatch)
/// truncates them: the agent's counts are whole sample counts, so nothing depends on
/// the difference, and this is where that is checked.
#[test]
fn counts_sent_are_whole_numbers() {
    let mut acc = Accumulator::default();
    for v in [0.5, 0.5, 1.25, 1e-3, 0.5, 99.999] {
        acc.gauge(key("neuroncore_utilization", &[]), Unit::Percent, v);
    }
    // Fractional events (a rate's share) are a value, counted once.
    acc.count(key("neuron_execution_errors", &[]), 0.5);
    acc.count(key("neuron_execution_errors", &[]), 0.25);
    let datums = acc.drain(std::time::SystemTime::UNIX_EPOCH, 60);
    assert_eq!(datums.len(), 2);
    for d in &datums {
        let sdk = to_sdk(d);
        assert!(!sdk.counts().is_empty(), "{sdk:?}");
        assert!(sdk.counts().iter().all(|c| c.fract() == 0.0 && *c >= 1.0), "{:?}", sdk.counts());
    }
    assert_eq!(to_sdk(&datums[0]).values(), &[0.75]);
    assert_eq!(to_sdk(&datums[1]).counts(), &[3.0, 1.0, 1.0, 1.0]);
}

#[test]
fn errors_are_sorted_into_retry_and_give_up() {
    let retried = |status, code| classify_service(status, code);
    assert_eq!(retried(400, "Throttling").reason, "throttled");
    assert!(retried(400, "Throttling").retry);
    assert_eq!(retried(429, "").reason, "throttled");
    assert_eq!(retried(500, "InternalServiceError").reason, "server_error");
    assert_eq!(retried(503, "").reason, "server_error");
    assert_eq!(retried(403, "ExpiredToken").reason, "auth");
    assert!(retried(403, "ExpiredToken").retry);
    let rejected = retried(400, "InvalidParameterValue");
    assert_eq!((rejected.reason, rejected.retry), ("rejected", false));
}

#[test]
fn backoff_grows_jittered_and_capped() {
    let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2) };
    for attempt in 0..30 {
        let cap = (Duration::from_millis(100) * 2u32.saturating_pow(attempt.min(20))).min(Duration::from_secs(2));
        let d = b.delay(attempt);
        assert!(d >= cap / 2 && d <= cap, "attempt {attempt}: {d:?} not in [{:?}, {cap:?}]", cap / 2);
    }
}

#[test]
fn default_set_on_a_32_runtime_node_fits_one_request() {
    let state = state_of(TRN1N_32);
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("ip-10-0-0-1".into()) };
    let datums = sample(route(None, None, cw("Ops/Neuron")), &state, &agent);
    // Every metric but ECC (no neuron_hw_counters in this report) and latency (null: the
    // recording caught no completed execution).
    assert_eq!(names(&datums).len(), 9, "{:?}", names(&datums));
    // Per core 6 × 32; device memory per device (no pod: the runtimes of a device share
    // it) 16; errors and status 6 + 6, all runtimes together.
    assert_eq!(datums.len(), 6 * 32 + 16 + 12);
    assert_eq!(split(datums.clone(), "Ops/Neuron").len(), 1);
    let util: Vec<&Datum> = datums.iter().filter(|d| d.key.name == "neuroncore_utilization").collect();
    assert_eq!(util.len(), 32, "one per core");
    assert_eq!(dims(util[0]), vec!["ClusterName", "NodeName", "NeuronCore", "NeuronDevice"]);
    let core_5 = util.iter().find(|d| d.key.dimensions.contains(&("NeuronCore", "5".into()))).unwrap();
    assert!(core_5.key.dimensions.contains(&("NeuronDevice", "2".into())));
    // Without pods, runtime-level metrics of all applications share a metric.
    let errors: Vec<&Datum> = datums.iter().filter(|d| d.key.name == "neuron_execution_errors").collect();
    assert_eq!(errors.len(), 6);
    assert_eq!(dims(errors[0]), vec!["ClusterName", "NodeName", "ErrorType"]);
}

#[test]
fn tag_filter_and_dimensions_choose_what_is_sent() {
    let state = state_of(TRN1N_32);
    let tag = state.runtimes[3].labels.runtime_tag.clone();
    let mut spec = cw("Team/Neuron");
    spec.dimensions = Some(vec![Dimension::RuntimeTag, Dimension::InstanceId, Dimension::AmiId]);
    spec.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization, CloudWatchMetric::NeuronExecutionStatus]);
    let datums = sample(route(None, Some(&format!("^{tag}$")), spec), &state, &AgentDimensions::default());
    assert_eq!(names(&datums), BTreeSet::from(["neuroncore_utilization", "neuron_execution_status"]));
    for d in &datums {
        assert!(d.key.dimensions.contains(&("RuntimeTag", tag.clone())), "{:?}", d.key);
        assert!(d.key.dimensions.contains(&("AmiId", "ami-0fd89cf018add6552".into())));
    }
    assert_eq!(datums.iter().filter(|d| d.key.name == "neuron_execution_status").count(), 6);
}

#[test]
fn rollups_publish_the_same_samples_under_coarser_sets() {
    let state = state_of(TRN1N_32);
    let mut spec = cw("Team/Neuron");
    spec.dimensions = Some(vec![Dimension::NeuronCore]);
    spec.rollups = Some(vec![vec![Dimension::InstanceType]]);
    spec.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization]);
    let datums = sample(route(None, None, spec), &state, &AgentDimensions::default());
    assert_eq!(datums.len(), 32 + 1);
    let rollup = datums.iter().find(|d| dims(d) == vec!["InstanceType"]).unwrap();
    assert_eq!(rollup.sample_count(), 32.0, "every core's sample, aggregated");
}

#[test]
fn a_namespaced_route_sees_only_its_pods_and_no_node_level_data() {
    let mut state = state_of(TRN1_ERRORS);
    let agent = AgentDimensions::default();
    let team = route(Some("team-a"), None, cw("TeamA/Neuron"));
    assert!(sample(team.clone(), &state, &agent).is_empty(), "no pod attributed: not the team's");
    let pod = Arc::new(PodRef {
        namespace: "team-a".into(),
        pod: "trainer-0".into(),
        owner: "trainer-0".into(),
        container: "main".into(),
        labels: vec![],
    });
    for rt in &mut state.runtimes {
        Arc::make_mut(&mut rt.labels).pod = Some(pod.clone());
    }
    let datums = sample(team, &state, &agent);
    assert!(!datums.is_empty());
    assert!(datums.iter().all(|d| d.key.dimensions.contains(&("Namespace", "team-a".into()))
        && d.key.dimensions.contains(&("PodName", "trainer-0".into()))
        && d.key.name != "neurondevice_hw_ecc_events"));
    assert!(sample(route(Some("team-b"), None, cw("TeamB/Neuron")), &state, &agent).is_empty());
}

#[test]
fn counters_send_increases_since_the_previous_sample() {
    let line = fixture(TRN1_ERRORS);
    let mut state = NodeState::default();
    state.apply(&Report::parse(&line).unwrap());
    let routing = Routing::compile(&NodeConfig {
        monitor: Default::default(),
        routes: vec![route(None, None, {
            let mut s = cw("Ops/Neuron");
            s.dimensions = Some(vec![Dimension::RuntimeTag]);
            s.metrics = Some(vec![CloudWatchMetric::NeuronExecutionErrors]);
            s
        })],
        health: None,
        gpu: None,
    })
    .unwrap();
    let (r, runtimes) = routing.cloudwatch_routes().next().unwrap();
    let sets = SinkSettings::check(r.cloudwatch.as_ref().unwrap()).unwrap().dimension_sets;
    let per_report: f64 =
        state.runtimes.iter().filter_map(|rt| rt.errors_total.as_ref()).flat_map(|t| t.iter().map(|(_, v)| v)).sum();
    assert!(per_report > 0.0, "the fixture has errors");
    let sum = |datums: Vec<Datum>| -> f64 {
        datums
            .iter()
            .map(|d| match &d.values {
                Values::Distribution(v) => v.iter().map(|(x, c)| x * c).sum::<f64>(),
                Values::Statistics { sum, .. } => *sum,
            })
            .sum()
    };
    // A sink started with the agent sends everything counted; twice the same report
    // doubles the running sums.
    let mut fresh = View::new(r, runtimes, &AgentDimensions::default(), sets.clone(), true);
    let mut acc = Accumulator::default();
    fresh.sample(&state, &mut acc);
    state.apply(&Report::parse(&line).unwrap());
    fresh.sample(&state, &mut acc);
    assert_eq!(sum(acc.drain(std::time::SystemTime::UNIX_EPOCH, 60)), 2.0 * per_report);
    // A sink started later sends only what it saw happen.
    let mut late = View::new(r, runtimes, &AgentDimensions::default(), sets, false);
    late.sample(&state, &mut acc);
    let baseline = acc.drain(std::time::SystemTime::UNIX_EPOCH, 60);
    assert_eq!(sum(baseline), 0.0);
    state.apply(&Report::parse(&line).unwrap());
    late.sample(&state, &mut acc);
    assert_eq!(sum(acc.drain(std::time::SystemTime::UNIX_EPOCH, 60)), per_report);
}

/// The devices' health through the sink of `route`: (device, values) of
/// `neurondevice_unhealthy`.
fn health_datums(route: Route, devices: &[(u32, bool)]) -> Vec<(String, Values)> {
    let mut view = view(route, &AgentDimensions::default());
    let mut acc = Accumulator::default();
    view.sample_health(&state_of(TRN1N_32).instance, devices, &mut acc);
    let mut out: Vec<(String, Values)> = acc
        .drain(std::time::SystemTime::UNIX_EPOCH, 60)
        .into_iter()
        .filter(|d| d.key.name == "neurondevice_unhealthy")
        .map(|d| {
            let device = d.key.dimensions.iter().find(|(n, _)| *n == "NeuronDevice").map(|(_, v)| v.clone());
            (device.unwrap_or_default(), d.values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn device_health_is_a_metric_of_node_level_sinks_only() {
    let devices = [(0, false), (3, true)];
    let datums = health_datums(route(None, None, cw("Ops/Neuron")), &devices);
    assert_eq!(
        datums,
        vec![
            ("0".to_owned(), Values::Distribution(vec![(0.0, 1.0)])),
            ("3".to_owned(), Values::Distribution(vec![(1.0, 1.0)]))
        ]
    );
    // A team's config sees no node-level data; an allow-list without it sends none.
    assert!(health_datums(route(Some("team-a"), None, cw("TeamA/Neuron")), &devices).is_empty());
    let utilization_only =
        CloudWatchSinkSpec { metrics: Some(vec![CloudWatchMetric::NeuroncoreUtilization]), ..cw("Ops/Neuron") };
    assert!(health_datums(route(None, None, utilization_only), &devices).is_empty());
}

/// A Container Insights sink of `route` on `state`: the datums of one sample.
fn insights(namespace: Option<&str>, state: &NodeState) -> Vec<Datum> {
    let mut spec = cw("ContainerInsights");
    spec.naming = Some(api::crd::CloudWatchNaming::ContainerInsights);
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("node-a".into()) };
    sample(route(namespace, None, spec), state, &agent)
}

fn value(d: &Datum, name: &str) -> Option<String> {
    d.key.dimensions.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
}

fn gauge_sum(d: &Datum) -> f64 {
    match &d.values {
        Values::Distribution(v) => v.iter().map(|(x, c)| x * c).sum(),
        Values::Statistics { sum, .. } => *sum,
    }
}

/// Two pods of two workloads on a trn1n.32xlarge, the runtimes alternating between them.
fn two_pods(state: &mut NodeState) -> [Arc<PodRef>; 2] {
    let pod = |ns: &str, pod: &str, owner: &str| {
        Arc::new(PodRef {
            namespace: ns.into(),
            pod: pod.into(),
            owner: owner.into(),
            container: "main".into(),
            labels: vec![],
        })
    };
    let pods = [pod("team-a", "train-6d4cf56db6-x7k2p", "train"), pod("team-b", "serve-0", "serve-0")];
    for (i, rt) in state.runtimes.iter_mut().enumerate() {
        Arc::make_mut(&mut rt.labels).pod = Some(pods[i % 2].clone());
    }
    pods
}

#[test]
fn container_insights_names_units_and_sets_are_the_catalogue_s() {
    use api::cloudwatch::catalogue::insights::{Family, METRICS};
    let mut state = state_of(TRN1N_32);
    assert!(state.runtimes.len() >= 2, "the fixture has several runtimes");
    let pods = two_pods(&mut state);
    let ops = insights(None, &state);
    assert!(!ops.is_empty());
    for d in &ops {
        let metric = METRICS.iter().find(|m| m.name == d.key.name).unwrap_or_else(|| panic!("{}", d.key.name));
        assert_eq!(d.unit, metric.unit, "{}", d.key.name);
        assert!(metric.dimension_sets().iter().any(|s| s.iter().map(|x| x.name()).eq(dims(d))), "{:?}", d.key);
        assert_eq!(value(d, "ClusterName").as_deref(), Some("prod"));
    }
    let families: BTreeSet<Family> =
        ops.iter().filter_map(|d| METRICS.iter().find(|m| m.name == d.key.name)).map(|m| m.family).collect();
    assert_eq!(families.len(), 3, "node, pod and container families");

    // Value formats: core0, device0; PodName the owner, FullPodName the pod.
    let core0 = ops
        .iter()
        .find(|d| d.key.name == "node_neuroncore_utilization" && value(d, "NeuronCore").as_deref() == Some("core0"))
        .unwrap();
    assert_eq!(value(core0, "NeuronDevice").as_deref(), Some("device0"));
    assert_eq!(value(core0, "NodeName").as_deref(), Some("node-a"));
    let train = ops
        .iter()
        .find(|d| {
            d.key.name == "pod_neuroncore_utilization" && value(d, "FullPodName").as_deref() == Some(&pods[0].pod)
        })
        .unwrap();
    assert_eq!(value(train, "PodName").as_deref(), Some("train"));

    // Each core credited to the pod whose runtime holds it (the CloudWatch agent copies one
    // pod onto every core).
    for d in ops.iter().filter(|d| d.key.name == "container_neuroncore_utilization") {
        let (Some(core), Some(pod)) = (value(d, "NeuronCore"), value(d, "FullPodName")) else { continue };
        let holder = state
            .runtimes
            .iter()
            .find(|rt| rt.cores.iter().any(|c| format!("core{}", c.index) == core))
            .and_then(|rt| rt.labels.pod.clone());
        let idle = state.idle_cores.iter().any(|c| format!("core{}", c.index) == core);
        assert!(idle || holder.map(|p| p.pod.clone()) == Some(pod.clone()), "{core} credited to {pod}");
    }

    // Node totals over every runtime (the agent keeps the first runtime's).
    let device_memory: f64 = state.runtimes.iter().filter_map(|rt| rt.memory_used.and_then(|m| m[1])).sum();
    let node_total = ops
        .iter()
        .find(|d| d.key.name == "node_neurondevice_runtime_memory_used_bytes" && dims(d) == vec!["ClusterName"])
        .unwrap();
    assert_eq!(gauge_sum(node_total), device_memory);
    // Coarse sets carry every per-core value (not pre-aggregated).
    let cluster_util =
        ops.iter().find(|d| d.key.name == "node_neuroncore_utilization" && dims(d) == vec!["ClusterName"]).unwrap();
    assert_eq!(cluster_util.sample_count(), 32.0);

    // A team's route: its own pod's pod_ and container_ series, nothing of the node.
    let team = insights(Some("team-a"), &state);
    assert!(!team.is_empty());
    for d in &team {
        assert!(!d.key.name.starts_with("node_"), "{}", d.key.name);
        assert!(!d.key.name.contains("ecc"), "{}", d.key.name);
        if let Some(pod) = value(d, "FullPodName") {
            assert_eq!(pod, pods[0].pod);
        }
        if dims(d) != vec!["ClusterName"] {
            assert_eq!(value(d, "Namespace").as_deref(), Some("team-a"), "{:?}", d.key);
        }
    }
}

/// The node's capacity metrics follow the allocation counts; a team's route gets none,
/// and a node whose kubelet has not said what can be allocated sends none.
#[test]
fn container_insights_capacity_metrics_come_from_the_allocation() {
    let mut state = state_of(TRN1N_32);
    assert!(!insights(None, &state).iter().any(|d| d.key.name.starts_with("node_neuroncore_limit")));
    let cores = crate::state::CoreAllocation { allocatable: 32, allocated: 8, allocated_idle: 2 };
    state.allocation = Some(crate::state::AllocationState { cores, ..Default::default() });
    let ops = insights(None, &state);
    let node_value = |name: &str| {
        let datum = ops.iter().find(|d| d.key.name == name && dims(d) == vec!["ClusterName"]);
        datum.map(gauge_sum).unwrap_or_else(|| panic!("{name} not sent"))
    };
    assert_eq!(node_value("node_neuroncore_limit"), 32.0);
    assert_eq!(node_value("node_neuroncore_usage_total"), 8.0);
    assert_eq!(node_value("node_neuroncore_available_capacity"), 24.0);
    assert_eq!(node_value("node_neuroncore_reserved_capacity"), 25.0);
    assert_eq!(node_value("node_neuroncore_unreserved_capacity"), 75.0);
    let per_node = ops.iter().find(|d| d.key.name == "node_neuroncore_limit" && dims(d).len() == 3).expect("per node");
    assert_eq!(value(per_node, "NodeName").as_deref(), Some("node-a"));
    assert!(!insights(Some("team-a"), &state).iter().any(|d| d.key.name.starts_with("node_")));

    // Each pod's cores: its request, limit and usage, and its share of the node's.
    let pods = two_pods(&mut state);
    if let Some(allocation) = &mut state.allocation {
        let cores = |pod: &Arc<PodRef>, allocated| PodCores { pod: pod.clone(), allocated, allocated_idle: 1 };
        allocation.pods = vec![cores(&pods[0], 6), cores(&pods[1], 2)];
    }
    let pod_value = |datums: &[Datum], name: &str, pod: &str| {
        let datum = datums.iter().find(|d| d.key.name == name && value(d, "FullPodName").as_deref() == Some(pod));
        datum.map(gauge_sum)
    };
    let ops = insights(None, &state);
    for name in ["pod_neuroncore_request", "pod_neuroncore_limit", "pod_neuroncore_usage_total"] {
        assert_eq!(pod_value(&ops, name, &pods[0].pod), Some(6.0), "{name}");
        assert_eq!(pod_value(&ops, name, &pods[1].pod), Some(2.0), "{name}");
    }
    assert_eq!(pod_value(&ops, "pod_neuroncore_reserved_capacity", &pods[0].pod), Some(18.75));
    let owner = ops.iter().find(|d| d.key.name == "pod_neuroncore_request" && dims(d).len() == 3).expect("by owner");
    assert_eq!(value(owner, "PodName").as_deref(), Some("train"));
    // A team sees its own pods' capacity only.
    let team = insights(Some("team-a"), &state);
    assert_eq!(pod_value(&team, "pod_neuroncore_request", &pods[0].pod), Some(6.0));
    assert_eq!(pod_value(&team, "pod_neuroncore_request", &pods[1].pod), None);
}

/// Classic naming: the node's cores by allocation state, one datum per state and set,
/// for a config that sees the node; a team's gets none, nor does an allow-list without
/// it, nor a node whose kubelet has not said.
#[test]
fn classic_allocation_counts_come_from_the_allocation() {
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("node-a".into()) };
    let mut spec = cw("Neuron");
    spec.rollups = Some(vec![vec![Dimension::ClusterName]]);
    let mut state = state_of(TRN1N_32);
    let counts = |datums: &[Datum]| -> Vec<(String, Vec<String>, f64)> {
        let ours = datums.iter().filter(|d| d.key.name == "neuron_node_neuroncores");
        let names = |d: &Datum| dims(d).into_iter().map(str::to_owned).collect();
        ours.map(|d| (value(d, "State").unwrap_or_default(), names(d), gauge_sum(d))).collect()
    };
    assert!(counts(&sample(route(None, None, spec.clone()), &state, &agent)).is_empty(), "no allocation known");
    let cores = crate::state::CoreAllocation { allocatable: 32, allocated: 8, allocated_idle: 2 };
    state.allocation = Some(crate::state::AllocationState { cores, ..Default::default() });
    let ops = counts(&sample(route(None, None, spec.clone()), &state, &agent));
    let rollup = ops.iter().filter(|(_, dims, _)| *dims == vec!["ClusterName", "State"]);
    let by_state: Vec<(&str, f64)> = rollup.map(|(s, _, v)| (s.as_str(), *v)).collect();
    assert_eq!(by_state, [("allocatable", 32.0), ("allocated", 8.0), ("allocated_idle", 2.0)]);
    assert_eq!(ops.len(), 6, "three states under two sets: {ops:?}");
    for (_, dims, _) in &ops {
        for per_device in ["NeuronCore", "NeuronDevice", "PodName", "RuntimeTag"] {
            assert!(!dims.iter().any(|d| d == per_device), "{dims:?}");
        }
    }
    assert!(counts(&sample(route(Some("team-a"), None, spec.clone()), &state, &agent)).is_empty());
    spec.metrics = Some(vec![CloudWatchMetric::NeuroncoreUtilization]);
    assert!(counts(&sample(route(None, None, spec), &state, &agent)).is_empty(), "not in the allow-list");
}

/// Classic naming, listed: each pod's cores by state, under the sets that name the pod or
/// not; a team's config gets its own pods', and without the listing nobody gets any.
#[test]
fn classic_pod_counts_are_sent_where_listed_to_each_config_of_its_pods() {
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("node-a".into()) };
    let mut state = state_of(TRN1N_32);
    let pods = two_pods(&mut state);
    let cores = crate::state::CoreAllocation { allocatable: 32, allocated: 8, allocated_idle: 3 };
    let held = |pod: &Arc<PodRef>, allocated, allocated_idle| PodCores { pod: pod.clone(), allocated, allocated_idle };
    let pod_cores = vec![held(&pods[0], 6, 3), held(&pods[1], 2, 0)];
    state.allocation = Some(crate::state::AllocationState { cores, pods: pod_cores, ..Default::default() });
    let counts = |datums: &[Datum]| -> Vec<(String, String, f64)> {
        let ours = datums.iter().filter(|d| d.key.name == "neuron_pod_neuroncores");
        let pod = |d: &Datum| value(d, "PodName").unwrap_or_default();
        ours.map(|d| (pod(d), value(d, "State").unwrap_or_default(), gauge_sum(d))).collect()
    };
    let mut spec = cw("Neuron");
    spec.dimensions =
        Some(vec![Dimension::ClusterName, Dimension::Namespace, Dimension::PodName, Dimension::ContainerName]);
    assert!(counts(&sample(route(None, None, spec.clone()), &state, &agent)).is_empty(), "not by default");
    spec.metrics = Some(vec![CloudWatchMetric::NeuronPodNeuroncores]);
    let ops = counts(&sample(route(None, None, spec.clone()), &state, &agent));
    let (train, serve) = (pods[0].pod.clone(), pods[1].pod.clone());
    let want = |pod: &str, allocated, idle| {
        [(pod.to_owned(), "allocated".to_owned(), allocated), (pod.to_owned(), "allocated_idle".to_owned(), idle)]
    };
    let mut all = want(&train, 6.0, 3.0).to_vec();
    all.extend(want(&serve, 2.0, 0.0));
    assert_eq!(ops, all);
    let named = sample(route(None, None, spec.clone()), &state, &agent);
    let pod_datum = named.iter().find(|d| d.key.name == "neuron_pod_neuroncores").expect("a datum");
    assert_eq!(dims(pod_datum), ["ClusterName", "Namespace", "PodName", "State"], "no container: the pod's cores");
    let team = counts(&sample(route(Some("team-a"), None, spec.clone()), &state, &agent));
    assert_eq!(team, want(&train, 6.0, 3.0), "a team's config: its own pod's");
    // Without the pod in the set: the pods the config sees, summed.
    spec.dimensions = Some(vec![Dimension::ClusterName]);
    let summed = counts(&sample(route(None, None, spec), &state, &agent));
    assert_eq!(
        summed,
        [(String::new(), "allocated".to_owned(), 8.0), (String::new(), "allocated_idle".to_owned(), 3.0)]
    );
}

#[test]
fn container_insights_leaves_out_sets_with_unknown_values() {
    let mut state = state_of(TRN1N_32);
    let mut pods = two_pods(&mut state);
    // A pod whose container is not known: its container_ series are left out.
    Arc::make_mut(&mut pods[0]).container = String::new();
    for (i, rt) in state.runtimes.iter_mut().enumerate() {
        Arc::make_mut(&mut rt.labels).pod = Some(pods[i % 2].clone());
    }
    let ops = insights(None, &state);
    let containers: Vec<&Datum> = ops.iter().filter(|d| d.key.name.starts_with("container_")).collect();
    assert!(!containers.is_empty());
    assert!(containers.iter().all(|d| value(d, "FullPodName").is_none_or(|p| p == pods[1].pod)));
    assert!(containers.iter().all(|d| value(d, "ContainerName").is_none_or(|c| c == "main")));
    assert!(ops.iter().any(|d| d.key.name.starts_with("pod_") && value(d, "FullPodName") == Some(pods[0].pod.clone())));
    // Without a cluster name no set can be filled: nothing (the sink is not started).
    let mut spec = cw("ContainerInsights");
    spec.naming = Some(api::crd::CloudWatchNaming::ContainerInsights);
    assert!(sample(route(None, None, spec), &state, &AgentDimensions::default()).is_empty());
}

#[test]
fn container_insights_on_a_32_pod_node_fits_two_requests() {
    let mut state = state_of(TRN1N_32);
    a_pod_per_runtime(&mut state, |_| "team-a");
    let ops = insights(None, &state);
    let requests = split(ops.clone(), "ContainerInsights");
    let bytes: usize = ops.iter().map(Datum::encoded_size).sum();
    eprintln!(
        "{} runtimes: {} datums, {} requests, ~{bytes} bytes per flush",
        state.runtimes.len(),
        ops.len(),
        requests.len()
    );
    // No ECC or latency in this report. node_: 7 per-core metrics × (1 + 1 + 32 cores)
    // and errors + device memory × 2 sets; pod_: 7 × (1 + 1 namespace + 3 × 32);
    // container_: 7 × (1 + 3 × 32). One datum per metric per flush.
    assert_eq!(ops.len(), 7 * 34 + 2 * 2 + 7 * (2 + 3 * 32) + 7 * (1 + 3 * 32));
    assert_eq!(requests.len(), 2);
}

/// The figures of docs/performance.md on the wire: what one flush sends for a trn1n.32xlarge
/// report with a pod per core, for the operator namespace's config in the classic naming
/// (the default set) and in Container Insights naming, as the SDK encodes it (CBOR, gzip
/// past 10 KiB), received by a test server. One report's values (a minute of varying
/// samples adds value/count pairs). For OTLP see `otlp_on_a_32_pod_node…`.
/// `cargo test -p neuron-node-agent --lib -- cloudwatch_bytes_on_the_wire --nocapture`
#[tokio::test]
async fn cloudwatch_bytes_on_the_wire_of_a_32_pod_node() {
    use aws_sdk_cloudwatch::config::{BehaviorVersion, Credentials, Region};
    use aws_smithy_http_client::tls;
    let mut state = state_of(TRN1N_32);
    a_pod_per_runtime(&mut state, |_| "team-a");
    let agent = AgentDimensions { cluster_name: Some("prod".into()), node_name: Some("node-a".into()) };
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    for (naming, namespace, datums) in [
        ("classic", "Ops/Neuron", sample(route(None, None, cw("Ops/Neuron")), &state, &agent)),
        ("ContainerInsights", "ContainerInsights", insights(None, &state)),
    ] {
        let receiver = neuron_e2e::otlp::Receiver::start().unwrap();
        let config = aws_sdk_cloudwatch::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-west-2"))
            .endpoint_url(receiver.url(""))
            .credentials_provider(Credentials::new("AKID", "secret", None, None, "test"))
            .retry_config(aws_sdk_cloudwatch::config::retry::RetryConfig::disabled())
            .http_client(http.clone())
            .build();
        let client = aws_sdk_cloudwatch::Client::from_conf(config);
        let requests = split(datums.clone(), namespace);
        for request in &requests {
            // The test server's answer is not CloudWatch's: only the request matters here.
            let _ = client
                .put_metric_data()
                .namespace(namespace)
                .set_metric_data(Some(request.iter().map(to_sdk).collect()))
                .send()
                .await;
        }
        let received = receiver.received();
        assert_eq!(received.len(), requests.len(), "{naming}");
        let mut wire = 0;
        let mut raw = 0;
        for r in &received {
            wire += r.body.len();
            raw += match r.headers.get("content-encoding").map(String::as_str) {
                Some("gzip") => {
                    let mut out = Vec::new();
                    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(r.body.as_slice()), &mut out).unwrap();
                    out.len()
                }
                _ => r.body.len(),
            };
        }
        eprintln!(
            "{naming}: {} datums, {} requests, {raw} bytes raw, {wire} bytes on the wire per flush",
            datums.len(),
            requests.len()
        );
        assert!(raw <= requests.len() * MAX_REQUEST_BYTES && wire < raw, "{naming}");
    }
}

/// 300 sinks started in the same instant (one config change reaching 300 nodes) flush
/// spread over their 60 s interval, not all at once: every tenth of it gets its share.
#[test]
fn sinks_started_together_first_flush_across_the_interval() {
    let interval = Duration::from_secs(60);
    let mut rng = fastrand::Rng::with_seed(7);
    let firsts: Vec<Duration> = (0..300).map(|_| super::first_flush(interval, &mut rng)).collect();
    assert!(firsts.iter().all(|f| !f.is_zero() && *f <= interval));
    let mut tenths = [0u32; 10];
    for f in &firsts {
        tenths[((f.as_secs_f64() / 6.0) as usize).min(9)] += 1;
    }
    // 30 expected in each; a fixed seed keeps this deterministic.
    assert!(tenths.iter().all(|n| (15..=45).contains(n)), "{tenths:?}");
}

#[test]
fn newer_error_types_statuses_and_percentiles_keep_their_names_and_none_is_made_up() {
    let line = |errors: &str| {
        format!(
            r#"{{"neuron_runtime_data":[{{"pid":7,"neuron_runtime_tag":"x","error":"","report":{{
                "execution_stats":{{"period":1.0,"error":"","error_summary":{{{errors}}},
                  "execution_summary":{{"completed":4,"preempted":1}},
                  "latency_stats":{{"total_latency":{{"p0":0.001,"p50":0.01,"p90":0.02,"p99":0.03}}}}}}}}}}]}}"#
        )
    };
    let mut spec = cw("Team/Neuron");
    spec.dimensions = Some(vec![Dimension::RuntimeTag]);
    let mut view = view(route(None, None, spec), &AgentDimensions::default());
    let mut state = NodeState::default();
    let mut flush = |state: &mut NodeState, errors: &str| {
        state.apply(&Report::parse(&line(errors)).unwrap());
        let mut acc = Accumulator::default();
        view.sample(state, &mut acc);
        acc.drain(std::time::SystemTime::UNIX_EPOCH, 60)
    };
    let split_of = |datums: &[Datum], name: &str, dimension: &str| -> Vec<(String, f64)> {
        let mut values: Vec<(String, f64)> = datums
            .iter()
            .filter(|d| d.key.name == name)
            .map(|d| {
                let value = d.key.dimensions.iter().find(|(n, _)| *n == dimension).map(|(_, v)| v.clone());
                let Values::Distribution(v) = &d.values else { panic!("few values") };
                (value.unwrap_or_default(), v.iter().map(|(x, c)| x * c).sum())
            })
            .collect();
        values.sort_by(|a, b| a.0.cmp(&b.0));
        values
    };
    let datums = flush(&mut state, r#""numerical":2,"oom":1"#);
    // Only the types the report carried, a newer one under its own name.
    assert_eq!(
        split_of(&datums, "neuron_execution_errors", "ErrorType"),
        [("numerical".into(), 2.0), ("oom".into(), 1.0)]
    );
    assert_eq!(
        split_of(&datums, "neuron_execution_status", "StatusType"),
        [("completed".into(), 4.0), ("preempted".into(), 1.0)]
    );
    // p50 and p99 of the documented seven, and the newer p90.
    let percentiles: Vec<String> =
        split_of(&datums, "neuron_execution_latency", "Percentile").into_iter().map(|(p, _)| p).collect();
    assert_eq!(percentiles, ["p50", "p90", "p99"]);
    // A type first seen later counts from its first report; one left out sends 0.
    let datums = flush(&mut state, r#""generic":3"#);
    assert_eq!(
        split_of(&datums, "neuron_execution_errors", "ErrorType"),
        [("generic".into(), 3.0), ("numerical".into(), 0.0), ("oom".into(), 0.0)]
    );
}
