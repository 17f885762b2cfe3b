use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use api::{
    crd::OtlpSinkSpec,
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, PrometheusRoute, Route, RouteRuntimes},
    report::Report,
};
use http::{HeaderValue, StatusCode};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::{ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse},
    common::v1::{any_value, KeyValue},
    metrics::v1::{metric::Data, AggregationTemporality, Metric, NumberDataPoint, ResourceMetrics},
};
use prometheus_client::registry::Registry;
use prost::Message;

use super::{
    encode::{unix_nanos, Identity, MAX_ATTRIBUTES},
    request::{split, Request, MAX_POINTS_PER_REQUEST, MAX_REQUEST_BYTES},
    send::{classify, partial_success, retry_after},
    *,
};
use crate::{
    efa::{
        sysfs::{Counter, Device, Port},
        EfaCollector, EfaSource,
    },
    sinks::prometheus::{Exposition, Format},
    state::PodRef,
    testdata::{a_pod_per_runtime, fixture, TRN1N_32, TRN1_ERRORS},
};

fn route(config: &str, namespace: Option<&str>, extra: &[(&str, &str)]) -> Route {
    Route {
        config: config.to_owned(),
        namespace: namespace.map(str::to_owned),
        runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: if namespace.is_none() { SystemGroup::ALL.to_vec() } else { vec![] },
        prometheus: Some(PrometheusRoute {
            extra_labels: extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            loaded_model_info: false,
        }),
        cloudwatch: None,
        otlp: Some(OtlpSinkSpec { endpoint: Some("http://127.0.0.1:4318".into()), ..Default::default() }),
    }
}

fn state_of(fixture_name: &str) -> NodeState {
    let mut state = NodeState::default();
    state.apply(&Report::parse(&fixture(fixture_name)).unwrap());
    state
}

fn identity() -> Identity {
    Identity {
        node_name: Some("ip-10-0-1-5.ec2.internal".into()),
        cluster_name: Some("prod".into()),
        platform: "aws_eks",
    }
}

/// A sink of `route` (the only route of the node) over `state`.
fn sink(route: &Route, state: NodeState, started: SystemTime) -> Sink {
    sink_over(route, Arc::new(Mutex::new(state)), started)
}

fn sink_over(route: &Route, state: Arc<Mutex<NodeState>>, started: SystemTime) -> Sink {
    let routing = Routing::compile(&NodeConfig {
        monitor: Default::default(),
        routes: vec![route.clone()],
        health: None,
        gpu: None,
    })
    .unwrap();
    let selection = routing.otlp_routes().next().unwrap().1.clone();
    Sink {
        name: route.config.clone(),
        route: route.clone(),
        selection,
        settings: OtlpSettings::check(route.otlp.as_ref().unwrap()).unwrap(),
        sources: Sources { state, processes: Default::default(), efa: Default::default(), gpu: None, health: None },
        identity: identity(),
        starts: Mutex::new(StartTimes::new(started)),
        queue: Arc::new(Queue::new(1, {
            let metrics = OtlpMetrics::default();
            metrics.common.queue_metrics(&route.config)
        })),
        metrics: OtlpMetrics::default(),
        region: Mutex::new(None),
        unusable: Mutex::new(None),
    }
}

/// Decodes a snapshot's requests back.
fn decode(requests: &[Request]) -> Vec<ExportMetricsServiceRequest> {
    requests
        .iter()
        .map(|r| {
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(r.body.as_slice()), &mut raw).unwrap();
            assert_eq!(raw.len(), r.raw_bytes);
            ExportMetricsServiceRequest::decode(raw.as_slice()).unwrap()
        })
        .collect()
}

fn string(kv: &KeyValue) -> &str {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s,
        _ => panic!("not a string: {kv:?}"),
    }
}

fn points(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

/// Every point as (name, labels, value), with its resource's attributes.
type Series = (String, BTreeMap<String, String>, String);

fn series_of(requests: &[ExportMetricsServiceRequest]) -> Vec<(Series, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    for rm in requests.iter().flat_map(|r| &r.resource_metrics) {
        let resource: BTreeMap<String, String> =
            rm.resource.iter().flat_map(|r| &r.attributes).map(|kv| (kv.key.clone(), string(kv).to_owned())).collect();
        for metric in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            for p in points(metric) {
                let labels = p.attributes.iter().map(|kv| (kv.key.clone(), string(kv).to_owned())).collect();
                let value = match p.value {
                    Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v)) => v,
                    other => panic!("not a double: {other:?}"),
                };
                out.push(((metric.name.clone(), labels, format!("{value:?}")), resource.clone()));
            }
        }
    }
    out
}

/// The series of a classic exposition, as (name, labels, value).
fn exposition_series(text: &str) -> BTreeSet<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (name, rest) = line.split_once('{').unwrap_or_else(|| panic!("every series has labels: {line}"));
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            let labels = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once("=\"").unwrap();
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .collect();
            let value: f64 = value.parse().unwrap_or(f64::NAN);
            (name.to_owned(), labels, format!("{value:?}"))
        })
        .collect()
}

/// The operator namespace's sink sends exactly the series of `/metrics` with the same
/// names, labels and values (the agent's own registry apart: it is not the node's).
#[test]
fn a_cluster_wide_sink_sends_exactly_what_metrics_shows() {
    let mut state = state_of(TRN1_ERRORS);
    a_pod_per_runtime(&mut state, |_| "team-a");
    let ops = route("neuron-monitor/all", None, &[("cluster", "prod")]);
    let routing = SharedRouting::default();
    routing.replace(
        Routing::compile(&NodeConfig {
            monitor: Default::default(),
            routes: vec![ops.clone()],
            health: None,
            gpu: None,
        })
        .unwrap(),
    );
    let state = Arc::new(Mutex::new(state));
    // An EFA device no pod holds: the operator namespace's to send.
    let efa = EfaSource::default();
    let counter = |name: &str, value| Counter { name: name.into(), value };
    efa.table.lock().unwrap().push(Device {
        name: "rdmap16s27".into(),
        counters: vec![counter("cmds_err", 3)],
        ports: vec![Port { number: 1, counters: vec![counter("rx_bytes", 1 << 40), counter("tx_bytes", 4096)] }],
    });
    let collector = EfaCollector { source: efa.clone(), state: state.clone(), routing: routing.clone() };
    let mut exposition = Exposition::new(Registry::default(), state.clone(), Default::default(), routing);
    exposition.export(Box::new(collector));
    // The node's families: what the OTLP sink sends (the agent's own metrics are not).
    let families = exposition.render_families(Format::Classic, 0).unwrap();
    let scraped = exposition_series(std::str::from_utf8(&families).unwrap());
    let mut sink = sink_over(&ops, state, SystemTime::now());
    sink.sources.efa = efa;
    let sent: BTreeSet<Series> = series_of(&decode(&sink.snapshot())).into_iter().map(|(s, _)| s).collect();
    assert!(scraped.len() > 50, "{} series", scraped.len());
    assert_eq!(sent, scraped);
    assert!(sent.iter().any(|(n, l, _)| n == "execution_errors_total" && l["cluster"] == "prod"));
    assert!(sent.iter().any(|(n, l, v)| n == "efa_rx_bytes_total" && l["port"] == "1" && v == "1099511627776.0"));
    assert!(sent.iter().any(|(n, l, _)| n == "efa_cmds_err_total" && !l.contains_key("port")));
    assert!(sent.iter().any(|(n, _, v)| n == "instance_info" && v == "1.0"));
}

#[test]
fn counters_are_cumulative_sums_with_stable_start_times_gauges_are_gauges() {
    let started = SystemTime::now() - Duration::from_secs(600);
    let ops = route("neuron-monitor/all", None, &[]);
    let sink = sink(&ops, state_of(TRN1_ERRORS), started);
    let first = decode(&sink.snapshot());
    let metric = |requests: &[ExportMetricsServiceRequest], name: &str| -> Metric {
        requests
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .clone()
    };
    let errors = metric(&first, "execution_errors_total");
    let Some(Data::Sum(sum)) = &errors.data else { panic!("a counter is a sum: {errors:?}") };
    assert!(sum.is_monotonic);
    assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    assert!(sum.data_points.iter().all(|p| p.start_time_unix_nano == unix_nanos(started)));
    assert!(sum.data_points.iter().all(|p| p.time_unix_nano > p.start_time_unix_nano));
    assert!(errors.unit.is_empty() && !errors.description.is_empty());
    for gauge in ["neuroncore_utilization_ratio", "instance_info", "execution_latency_seconds"] {
        let m = metric(&first, gauge);
        let Some(Data::Gauge(g)) = &m.data else { panic!("{gauge} is a gauge: {m:?}") };
        assert!(g.data_points.iter().all(|p| p.start_time_unix_nano == 0), "{gauge}");
    }

    // The next snapshot: the same start while the running sums grow.
    let between = unix_nanos(SystemTime::now());
    let second = decode(&sink.snapshot());
    let Some(Data::Sum(again)) = metric(&second, "execution_errors_total").data else { panic!() };
    assert!(again.data_points.iter().all(|p| p.start_time_unix_nano == unix_nanos(started)));
    // A series that left and came back (its running sum restarted) starts at the
    // snapshot before its return.
    sink.sources.state.lock().unwrap().runtimes.clear();
    let _ = sink.snapshot();
    let reset = unix_nanos(SystemTime::now());
    sink.sources.state.lock().unwrap().apply(&Report::parse(&fixture(TRN1_ERRORS)).unwrap());
    let third = decode(&sink.snapshot());
    let Some(Data::Sum(restarted)) = metric(&third, "execution_errors_total").data else { panic!() };
    assert!(restarted.data_points.iter().all(|p| (between..=reset).contains(&p.start_time_unix_nano)));
    assert!(sink.starts.lock().unwrap().len() < 100, "series that left are forgotten");
}

#[test]
fn resources_follow_the_semantic_conventions_and_pods_have_their_own() {
    let mut state = state_of(TRN1N_32);
    state.instance = Arc::new(crate::state::InstanceLabels {
        region: "us-west-2".into(),
        availability_zone: "us-west-2a".into(),
        ..(*state.instance).clone()
    });
    a_pod_per_runtime(&mut state, |_| "team-a");
    let ops = route("neuron-monitor/all", None, &[]);
    let sent = series_of(&decode(&sink(&ops, state, SystemTime::now()).snapshot()));
    let node_only = sent.iter().find(|((n, _, _), _)| n == "system_vcpu_count").unwrap();
    let resource = &node_only.1;
    for (key, value) in [
        ("service.name", "neuron-node-agent"),
        ("service.instance.id", "ip-10-0-1-5.ec2.internal"),
        ("k8s.node.name", "ip-10-0-1-5.ec2.internal"),
        ("k8s.cluster.name", "prod"),
        ("cloud.provider", "aws"),
        ("cloud.platform", "aws_eks"),
        ("cloud.region", "us-west-2"),
        ("cloud.availability_zone", "us-west-2a"),
        ("host.type", "trn1n.32xlarge"),
    ] {
        assert_eq!(resource.get(key).map(String::as_str), Some(value), "{key}: {resource:?}");
    }
    assert!(resource.contains_key("host.id"));
    assert!(!resource.contains_key("k8s.pod.name"), "node series on the node's resource");
    // A pod's series: on its pod's resource, the /metrics labels on the point.
    for ((name, labels, _), resource) in sent.iter().filter(|((_, l, _), _)| l.contains_key("pod")) {
        assert_eq!(resource.get("k8s.pod.name"), labels.get("pod"), "{name}");
        assert_eq!(resource.get("k8s.namespace.name").map(String::as_str), Some("team-a"), "{name}");
        assert_eq!(resource.get("k8s.container.name").map(String::as_str), Some("main"), "{name}");
    }
    let pods: BTreeSet<&String> = sent.iter().filter_map(|(_, r)| r.get("k8s.pod.name")).collect();
    assert_eq!(pods.len(), 32);
}

#[test]
fn a_team_sink_sends_its_namespace_only_and_no_node_series() {
    let state = || {
        let mut state = state_of(TRN1N_32);
        a_pod_per_runtime(&mut state, |i| if i % 2 == 0 { "team-a" } else { "team-b" });
        state
    };
    let team = route("team-a/otlp", Some("team-a"), &[("team", "a")]);
    let sent = series_of(&decode(&sink(&team, state(), SystemTime::now()).snapshot()));
    assert!(!sent.is_empty());
    for ((name, labels, _), resource) in &sent {
        if ["instance_info", "neuron_hardware_info", "neuroncore_peak_flops"].contains(&name.as_str()) {
            // The node its pods run on, described: no pod.
            assert!(!labels.contains_key("pod"), "{name}");
            continue;
        }
        assert_eq!(labels.get("namespace").map(String::as_str), Some("team-a"), "{name} {labels:?}");
        assert_eq!(labels.get("team").map(String::as_str), Some("a"), "{name}");
        assert_eq!(resource.get("k8s.namespace.name").map(String::as_str), Some("team-a"));
    }
    let names: BTreeSet<&str> = sent.iter().map(|((n, _, _), _)| n.as_str()).collect();
    for node_level in ["system_vcpu_count", "hardware_ecc_events_total", "neuron_agent_group_error"] {
        assert!(!names.contains(node_level), "{node_level}");
    }
    assert_eq!(sent.iter().filter(|((n, _, _), _)| n == "neuroncore_utilization_ratio").count(), 16);

    // A team with nothing on the node sends nothing, not even the node's description.
    let other = route("team-c/otlp", Some("team-c"), &[]);
    assert!(sink(&other, state(), SystemTime::now()).snapshot().is_empty());
}

#[test]
fn attributes_beyond_150_a_point_are_left_off_and_counted() {
    let mut state = state_of(TRN1_ERRORS);
    let pod = PodRef {
        namespace: "team-a".into(),
        pod: "p".into(),
        owner: "p".into(),
        container: "c".into(),
        labels: (0..200).map(|i| (format!("label_l{i:03}"), "v".into())).collect(),
    };
    for rt in &mut state.runtimes {
        Arc::make_mut(&mut rt.labels).pod = Some(Arc::new(pod.clone()));
    }
    let ops = route("neuron-monitor/all", None, &[]);
    let sink = sink(&ops, state, SystemTime::now());
    let requests = decode(&sink.snapshot());
    for rm in requests.iter().flat_map(|r| &r.resource_metrics) {
        let resource = rm.resource.as_ref().map_or(0, |r| r.attributes.len());
        for metric in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            for p in points(metric) {
                assert!(resource + p.attributes.len() <= MAX_ATTRIBUTES, "{}", metric.name);
            }
        }
    }
    let dropped = sink.metrics.attributes_dropped.get_or_create(&SinkLabel { sink: ops.config.clone() }).get();
    assert!(dropped > 0);
}

/// Splitting keeps every point under its resource and metric, and every request within
/// the limits, whatever they are.
#[test]
fn requests_stay_within_the_limits_and_lose_nothing() {
    let mut state = state_of(TRN1N_32);
    a_pod_per_runtime(&mut state, |_| "team-a");
    let ops = route("neuron-monitor/all", None, &[]);
    let sink = sink(&ops, state, SystemTime::now());
    let all = sink.snapshot();
    assert_eq!(all.len(), 1, "one request at the default limits");
    let whole = decode(&all);
    let expected = series_of(&whole);
    for (max_points, max_bytes) in
        [(MAX_POINTS_PER_REQUEST, MAX_REQUEST_BYTES), (100, 1_000_000), (10_000, 20_000), (7, 3_000), (1, 1)]
    {
        let resources: Vec<ResourceMetrics> = whole.iter().flat_map(|r| r.resource_metrics.clone()).collect();
        let parts = split(resources, max_points, max_bytes);
        let mut total = 0;
        for part in &parts {
            let n: usize = part
                .resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .map(|m| points(m).len())
                .sum();
            total += n;
            assert!(n <= max_points.max(1));
            assert!(n == 1 || part.encoded_len() <= max_bytes, "{} bytes > {max_bytes}", part.encoded_len());
        }
        assert_eq!(total, expected.len());
        assert_eq!(series_of(&parts), expected, "({max_points}, {max_bytes})");
    }
}

#[test]
fn failures_are_sorted_and_retry_after_is_read() {
    assert_eq!(
        classify(StatusCode::TOO_MANY_REQUESTS, Some(Duration::from_secs(3))).retry_after,
        Some(Duration::from_secs(3))
    );
    for (status, reason, retry) in [
        (429, "throttled", true),
        (503, "server_error", true),
        (500, "server_error", true),
        (502, "server_error", true),
        (408, "timeout", true),
        (401, "auth", true),
        (403, "auth", true),
        (400, "rejected", false),
        (413, "rejected", false),
        (404, "rejected", false),
    ] {
        let f = classify(StatusCode::from_u16(status).unwrap(), Some(Duration::from_secs(1)));
        assert_eq!((f.reason, f.retry), (reason, retry), "{status}");
        assert_eq!(f.retry_after.is_some(), retry, "{status}");
    }
    assert_eq!(retry_after(Some(&HeaderValue::from_static("7"))), Some(Duration::from_secs(7)));
    assert_eq!(retry_after(Some(&HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"))), None);
    assert_eq!(retry_after(None), None);

    let body = |rejected: i64, message: &str| {
        ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: rejected,
                error_message: message.into(),
            }),
        }
        .encode_to_vec()
    };
    assert_eq!(partial_success(&body(5, "too old")), Some((5, "too old".to_owned())));
    assert_eq!(partial_success(&body(0, "")), None);
    assert_eq!(partial_success(&body(-3, "odd")), Some((0, "odd".to_owned())));
    assert_eq!(partial_success(b""), None);
    assert_eq!(partial_success(b"\xff\xff\xff"), None);
}

#[test]
fn sinks_started_together_first_flush_across_the_interval() {
    let interval = Duration::from_secs(60);
    let mut rng = fastrand::Rng::with_seed(11);
    let firsts: Vec<Duration> = (0..300).map(|_| first_flush(interval, &mut rng)).collect();
    assert!(firsts.iter().all(|f| !f.is_zero() && *f <= interval));
    let mut tenths = [0u32; 10];
    for f in &firsts {
        tenths[((f.as_secs_f64() / 6.0) as usize).min(9)] += 1;
    }
    assert!(tenths.iter().all(|n| (15..=45).contains(n)), "{tenths:?}");
}

/// The figure of docs/performance.md: what the operator namespace's config (the default
/// set: every group) sends per flush for a trn1n.32xlarge report with a pod per core.
/// `cargo test -p neuron-node-agent --lib -- otlp_on_a_32 --nocapture`
#[test]
fn otlp_on_a_32_pod_node_is_one_request_per_flush() {
    let mut state = state_of(TRN1N_32);
    a_pod_per_runtime(&mut state, |_| "team-a");
    let ops = route("neuron-monitor/all", None, &[]);
    let requests = sink(&ops, state, SystemTime::now()).snapshot();
    let points: usize = requests.iter().map(|r| r.points).sum();
    let raw: usize = requests.iter().map(|r| r.raw_bytes).sum();
    let gzip: usize = requests.iter().map(|r| r.body.len()).sum();
    eprintln!("{} requests, {points} points, {raw} bytes raw, {gzip} bytes gzip per flush", requests.len());
    assert_eq!(requests.len(), 1);
    assert!(gzip * 5 < raw, "gzip takes the repeated labels away: {gzip} of {raw}");
}
