//! The CloudWatch sinks of the real agent binary, on the simulator, against LocalStack
//! (see `support::cloudwatch`): what LocalStack stored (its raw datapoint listing,
//! ListMetrics and GetMetricData through the SDK) is what the simulator produced, large
//! nodes are split into valid requests, faults are retried and counted without blocking
//! `/metrics`, SIGTERM sends what is queued.
//!
//! Every test works in CloudWatch namespaces of its own (`cw.namespace(..)`; the helpers
//! below take the short name). What LocalStack does not check of CloudWatch's rules (1,000
//! datums and 1 MB per request, 150 values, whole counts, storage resolution 1 or 60) is
//! checked on the agent's own code by the unit tests of `sinks::cloudwatch`.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant, SystemTime},
};

use api::{
    crd::{CloudWatchMetric, CloudWatchSinkSpec, Dimension},
    duration::Period,
    monitor_config::{MonitorConfig, RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
};
use aws_sdk_cloudwatch::{
    primitives::DateTime,
    types::{Dimension as CwDimension, DimensionFilter, Metric, MetricDataQuery, MetricStat, Statistic},
};
use neuron_e2e::localstack::{CloudWatch, StoredValue};
use support::{
    cloudwatch::{sdk_client, start_agent, Fault, FaultProxy},
    kubelet::running_pod,
    Agent, Metrics,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A sink to this test's CloudWatch namespace `namespace`.
fn sink(cw: &CloudWatch, namespace: &str, dimensions: &[Dimension], flush: &str) -> CloudWatchSinkSpec {
    CloudWatchSinkSpec {
        namespace: cw.namespace(namespace),
        dimensions: Some(dimensions.to_vec()),
        flush_interval: Some(flush.to_owned()),
        ..Default::default()
    }
}

fn route(config: &str, namespace: Option<&str>, filter: Option<&str>, cloudwatch: CloudWatchSinkSpec) -> Route {
    Route {
        config: config.to_owned(),
        namespace: namespace.map(str::to_owned),
        runtimes: vec![RouteRuntimes { tag_filter: filter.map(str::to_owned), groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: if namespace.is_none() { SystemGroup::ALL.to_vec() } else { vec![] },
        prometheus: Some(Default::default()),
        cloudwatch: Some(cloudwatch),
        otlp: None,
    }
}

fn node_config(routes: Vec<Route>) -> serde_json::Value {
    let period: Period = "500ms".parse().expect("period");
    serde_json::to_value(NodeConfig { monitor: MonitorConfig::all_groups(period), routes, health: None, gpu: None })
        .expect("json")
}

/// The agent's counter or gauge for one sink (0 when absent).
fn sink_value(m: &Metrics, name: &str, sink: &str, extra: &[(&str, &str)]) -> f64 {
    let mut labels = vec![("sink", sink)];
    labels.extend_from_slice(extra);
    m.sum(name, &labels)
}

/// Waits until the simulator stopped writing (`--hang-after`) and a sink has flushed
/// everything: no report for a while, queue empty, nothing sent for two flushes.
fn wait_settled(agent: &Agent, sink: &str, reports: f64) -> Metrics {
    agent.wait_for("all reports applied", Duration::from_secs(30), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= reports).then_some(())
    });
    let last = std::cell::Cell::new((-1.0, Instant::now()));
    agent.wait_for("the sink to send everything", Duration::from_secs(60), |m| {
        let sent = sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", sink, &[]);
        let queued = sink_value(m, "neuron_agent_cloudwatch_queue_datums", sink, &[]);
        if sent != last.get().0 || queued > 0.0 {
            last.set((sent, Instant::now()));
            return None;
        }
        (sent > 0.0 && last.get().1.elapsed() > Duration::from_millis(2500)).then(|| m.clone())
    })
}

/// Asserts that a counter's sum in CloudWatch is the agent's value `expected`: exactly,
/// when no attempt of any sink failed and neuron-monitor never restarted; at least,
/// otherwise. An attempt that timed out under load may have been stored before it was
/// sent again (delivery is at least once, never less); and the sinks counted the events
/// of a neuron-monitor that restarted (its built-in configuration replaced by the node's,
/// or an exit), whose totals the simulator restarts from zero and the agent's own counter
/// with them.
fn assert_counter_sum(cw: &CloudWatch, m: &Metrics, namespace: &str, name: &str, dims: &[(&str, &str)], expected: f64) {
    let stored = statistic(cw, namespace, name, dims, "Sum");
    let failed = m.sum("neuron_agent_cloudwatch_failures_total", &[]);
    let restarted = m.sum("neuron_agent_monitor_restarts_total", &[]);
    if failed == 0.0 && restarted == 0.0 {
        assert_eq!(stored, Some(expected), "{namespace} {name} {dims:?}");
    } else {
        assert!(
            stored.is_some_and(|s| s >= expected),
            "{namespace} {name} {dims:?}: {stored:?} < {expected} ({failed} failed attempts, {restarted} restarts)"
        );
    }
}

fn dims(pairs: &[(&str, &str)]) -> Vec<CwDimension> {
    pairs.iter().map(|(n, v)| CwDimension::builder().name(*n).value(*v).build()).collect()
}

/// Every metric of this test's namespace `namespace`, through ListMetrics (all pages).
fn list_metrics(cw: &CloudWatch, namespace: &str, filters: &[(&str, &str)]) -> Vec<Metric> {
    let client = sdk_client(cw.addr());
    runtime().block_on(async {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let mut req = client.list_metrics().namespace(cw.namespace(namespace)).set_next_token(token);
            for (n, v) in filters {
                req = req.dimensions(DimensionFilter::builder().name(*n).value(*v).build());
            }
            let page = req.send().await.expect("ListMetrics");
            out.extend(page.metrics().iter().cloned());
            token = page.next_token().map(str::to_owned);
            if token.is_none() {
                return out;
            }
        }
    })
}

/// One statistic of one metric (exactly these dimensions) over the last hour, through
/// GetMetricData (one period), checked against the same statistic of LocalStack's raw
/// datapoints with exactly these dimensions: LocalStack's queries match dimensions as a
/// subset (CloudWatch's exactly), so an ambiguous query fails here instead of passing.
fn statistic(cw: &CloudWatch, namespace: &str, name: &str, dimensions: &[(&str, &str)], stat: &str) -> Option<f64> {
    let client = sdk_client(cw.addr());
    let now = SystemTime::now();
    let query = MetricDataQuery::builder()
        .id("q")
        .metric_stat(
            MetricStat::builder()
                .metric(
                    Metric::builder()
                        .namespace(cw.namespace(namespace))
                        .metric_name(name)
                        .set_dimensions(Some(dims(dimensions)))
                        .build(),
                )
                .period(7200)
                .stat(stat)
                .build(),
        )
        .build();
    let out = runtime().block_on(async {
        client
            .get_metric_data()
            .metric_data_queries(query)
            .start_time(DateTime::from(now - Duration::from_secs(3600)))
            .end_time(DateTime::from(now + Duration::from_secs(60)))
            .send()
            .await
            .expect("GetMetricData")
    });
    let values = out.metric_data_results().first().map(|r| r.values().to_vec()).unwrap_or_default();
    let answered: Option<f64> = (!values.is_empty()).then(|| values.iter().sum());

    let exact: BTreeMap<String, String> = dimensions.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    let namespace = cw.namespace(namespace);
    let raw: Vec<f64> = cw
        .stored()
        .into_iter()
        .filter(|s| s.namespace == namespace && s.name == name && s.dimensions == exact)
        .map(|s| s.value)
        .collect();
    let computed: Option<f64> = (!raw.is_empty()).then(|| match stat {
        "Sum" => raw.iter().sum(),
        "SampleCount" => raw.len() as f64,
        "Minimum" => raw.iter().copied().fold(f64::INFINITY, f64::min),
        "Maximum" => raw.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        "Average" => raw.iter().sum::<f64>() / raw.len() as f64,
        other => panic!("statistic {other} is not one LocalStack has"),
    });
    let same = match (answered, computed) {
        (Some(a), Some(c)) => (a - c).abs() <= 1e-9 * a.abs().max(1.0),
        (a, c) => a == c,
    };
    assert!(
        same,
        "{namespace} {name} {dimensions:?} {stat}: GetMetricData says {answered:?}, the raw datapoints {computed:?}"
    );
    answered
}

/// The units a metric's datapoints were stored with, through GetMetricStatistics.
fn units(cw: &CloudWatch, metric: &Metric) -> BTreeSet<String> {
    let client = sdk_client(cw.addr());
    let now = SystemTime::now();
    let out = runtime().block_on(async {
        client
            .get_metric_statistics()
            .set_namespace(metric.namespace().map(str::to_owned))
            .set_metric_name(metric.metric_name().map(str::to_owned))
            .set_dimensions(Some(metric.dimensions().to_vec()))
            .statistics(Statistic::SampleCount)
            .period(7200)
            .start_time(DateTime::from(now - Duration::from_secs(3600)))
            .end_time(DateTime::from(now + Duration::from_secs(60)))
            .send()
            .await
            .expect("GetMetricStatistics")
    });
    out.datapoints().iter().filter_map(|d| d.unit().map(|u| u.as_str().to_owned())).collect()
}

/// A datum as stored: namespace, metric name, dimensions, timestamp.
type DatumKey<'a> = (&'a str, &'a str, &'a BTreeMap<String, String>, i64);

/// The datums LocalStack stored: its raw datapoints grouped by metric and timestamp (a
/// datum's values share its timestamp, and a sink's flushes are at least a second apart),
/// with the values of each.
fn datums(stored: &[StoredValue]) -> BTreeMap<DatumKey<'_>, Vec<f64>> {
    let mut out: BTreeMap<_, Vec<f64>> = BTreeMap::new();
    for s in stored {
        out.entry(s.datum()).or_default().push(s.value);
    }
    out
}

fn names(metrics: &[Metric]) -> BTreeSet<String> {
    metrics.iter().filter_map(|m| m.metric_name().map(str::to_owned)).collect()
}

/// Each `node_gpu_*` metric published, with the names of its dimensions.
fn node_gpu_sets(metrics: &[Metric]) -> BTreeSet<(String, BTreeSet<String>)> {
    metrics
        .iter()
        .filter(|m| m.metric_name().is_some_and(|n| n.starts_with("node_gpu_")))
        .map(|m| (m.metric_name().unwrap_or_default().to_owned(), dimension_map(m).into_keys().collect()))
        .collect()
}

/// Every `node_gpu_*` metric of the Container Insights catalogue with each of its sets.
fn catalogue_node_gpu_sets() -> BTreeSet<(String, BTreeSet<String>)> {
    api::cloudwatch::catalogue::insights::GPU_METRICS
        .iter()
        .filter(|g| g.name.starts_with("node_"))
        .flat_map(|g| {
            g.dimension_sets().iter().map(|s| (g.name.to_owned(), s.iter().map(|d| d.name().to_owned()).collect()))
        })
        .collect()
}

fn dimension_map(m: &Metric) -> BTreeMap<String, String> {
    m.dimensions().iter().map(|d| (d.name().unwrap_or("").to_owned(), d.value().unwrap_or("").to_owned())).collect()
}

const SIM_SMALL: &[&str] = &[
    "--instance-type=trn1.2xlarge",
    "--app=tag=train,cores=0,util=80,rps=50,errors=2",
    "--app=tag=serve,cores=1,util=25,rps=200",
    "--ecc-every=1",
    "--hang-after=6",
];
/// Without a silence limit the agent would restart the simulator once it hangs.
const NO_RESTART: &[&str] = &["--silence-timeout", "1h", "--cluster-name", "prod", "--node-name", "node-a"];

#[test]
fn what_is_stored_is_what_the_simulator_produced() {
    let cw = CloudWatch::start();
    let ops_dims = [Dimension::ClusterName, Dimension::NodeName, Dimension::NeuronCore, Dimension::RuntimeTag];
    let mut serve = sink(&cw, "Serve/Neuron", &[Dimension::RuntimeTag], "1s");
    serve.metrics = Some(vec![
        CloudWatchMetric::NeuroncoreUtilization,
        CloudWatchMetric::NeuronExecutionLatency,
        CloudWatchMetric::NeuronExecutionStatus,
    ]);
    let config = node_config(vec![
        route("ops/all", None, None, sink(&cw, "Ops/Neuron", &ops_dims, "1s")),
        route("ops/serve", None, Some("^serve$"), serve),
    ]);
    let agent = start_agent(SIM_SMALL, &config, cw.addr(), NO_RESTART);
    let m = wait_settled(&agent, "ops/all", 6.0);
    wait_settled(&agent, "ops/serve", 6.0);

    // Every metric the node produces, with the agent's dimensions.
    let ops = list_metrics(&cw, "Ops/Neuron", &[]);
    let expected: BTreeSet<String> = [
        "neuroncore_utilization",
        "neuroncore_memory_usage_constants",
        "neuroncore_memory_usage_model_code",
        "neuroncore_memory_usage_model_shared_scratchpad",
        "neuroncore_memory_usage_runtime_memory",
        "neuroncore_memory_usage_tensors",
        "neurondevice_runtime_memory_used_bytes",
        "neuron_execution_errors",
        "neuron_execution_status",
        "neuron_execution_latency",
        "neurondevice_hw_ecc_events",
        // `--ecc-every=1` counts uncorrectable SRAM errors: the device's health is known.
        "neurondevice_unhealthy",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(names(&ops), expected);
    for metric in &ops {
        let d = dimension_map(metric);
        assert_eq!(d.get("ClusterName").map(String::as_str), Some("prod"), "{metric:?}");
        assert_eq!(d.get("NodeName").map(String::as_str), Some("node-a"), "{metric:?}");
    }

    // Gauges: the simulator's values.
    let util = |core: &str, tag: &str| {
        let d = [("ClusterName", "prod"), ("NodeName", "node-a"), ("NeuronCore", core), ("RuntimeTag", tag)];
        statistic(&cw, "Ops/Neuron", "neuroncore_utilization", &d, "Average")
    };
    assert_eq!(util("0", "train"), Some(80.0));
    assert_eq!(util("1", "serve"), Some(25.0));
    let p50 = [("ClusterName", "prod"), ("NodeName", "node-a"), ("RuntimeTag", "serve"), ("Percentile", "p50")];
    assert_eq!(statistic(&cw, "Ops/Neuron", "neuron_execution_latency", &p50, "Maximum"), Some(0.01));

    // Counters: the sums of the per-period counts equal the agent's own running sums.
    let prom =
        |name: &str, labels: &[(&str, &str)]| m.value(name, labels).unwrap_or_else(|| panic!("{name} {labels:?}"));
    let completed = prom("execution_status_total", &[("runtime_tag", "serve"), ("status_type", "completed")]);
    assert!(completed >= 500.0, "six reports of 100 executions each, at least five carrying execution_stats");
    let d = [("ClusterName", "prod"), ("NodeName", "node-a"), ("RuntimeTag", "serve"), ("StatusType", "completed")];
    assert_counter_sum(&cw, &m, "Ops/Neuron", "neuron_execution_status", &d, completed);
    let errors = prom("execution_errors_total", &[("runtime_tag", "train"), ("error_type", "generic")]);
    let d = [("ClusterName", "prod"), ("NodeName", "node-a"), ("RuntimeTag", "train"), ("ErrorType", "generic")];
    assert_counter_sum(&cw, &m, "Ops/Neuron", "neuron_execution_errors", &d, errors);
    let d = [("ClusterName", "prod"), ("NodeName", "node-a"), ("RuntimeTag", "train"), ("ErrorType", "hardware")];
    assert_eq!(statistic(&cw, "Ops/Neuron", "neuron_execution_errors", &d, "Sum"), Some(0.0));
    let ecc = prom("hardware_ecc_events_total", &[("event_type", "mem_ecc_corrected"), ("neuron_device_index", "0")]);
    let d = [("ClusterName", "prod"), ("NodeName", "node-a"), ("EventType", "mem_ecc_corrected")];
    assert_counter_sum(&cw, &m, "Ops/Neuron", "neurondevice_hw_ecc_events", &d, ecc);

    // The tag-filtered sink: only `serve`, only its allow-list, no node-level data.
    let serve = list_metrics(&cw, "Serve/Neuron", &[]);
    assert_eq!(
        names(&serve),
        ["neuron_execution_latency", "neuron_execution_status", "neuroncore_utilization"].map(str::to_owned).into()
    );
    assert!(serve.iter().all(|m| dimension_map(m).get("RuntimeTag").map(String::as_str) == Some("serve")));
    let d = [("RuntimeTag", "serve"), ("StatusType", "completed")];
    assert_counter_sum(&cw, &m, "Serve/Neuron", "neuron_execution_status", &d, completed);

    // What LocalStack stored: every datum the agent counted as sent, one per metric and
    // flush, values with counts, CloudWatch units. (LocalStack stores StorageResolution
    // without a way to read it back: `sdk_datums_carry_values_and_counts_or_statistics`
    // and api's sink settings tests check it.)
    let now = agent.metrics();
    let stored = cw.stored();
    let datums = datums(&stored);
    let sent = sink_value(&now, "neuron_agent_cloudwatch_datums_sent_total", "ops/all", &[])
        + sink_value(&now, "neuron_agent_cloudwatch_datums_sent_total", "ops/serve", &[]);
    // Exactly, unless an attempt failed and was sent again (at least once, never less).
    if now.sum("neuron_agent_cloudwatch_failures_total", &[]) == 0.0 {
        assert_eq!(datums.len() as f64, sent, "every datum the agent counted as sent is stored");
    } else {
        assert!(datums.len() as f64 >= sent, "every datum the agent counted as sent is stored");
    }
    let flushes = sink_value(&now, "neuron_agent_cloudwatch_flushes_total", "ops/all", &[]);
    let ops_namespace = cw.namespace("Ops/Neuron");
    let util: Vec<_> = datums
        .iter()
        .filter(|((ns, name, _, _), _)| *ns == ops_namespace && *name == "neuroncore_utilization")
        .collect();
    assert!(util.len() as f64 <= 2.0 * flushes, "one datum per core and flush, not per sample");
    assert!(util.iter().any(|(_, values)| values.len() > 1), "samples carried as counts");
    for metric in ops.iter().chain(&serve) {
        let unit = match metric.metric_name().unwrap_or_default() {
            "neuroncore_utilization" => "Percent",
            "neuron_execution_latency" => "Seconds",
            n if n.contains("memory") => "Bytes",
            _ => "Count",
        };
        assert_eq!(units(&cw, metric), BTreeSet::from([unit.to_owned()]), "{metric:?}");
    }
}

fn large_node_args(apps: usize) -> Vec<String> {
    let mut args = vec!["--instance-type=trn1.32xlarge".to_owned(), "--hang-after=4".to_owned()];
    for i in 0..apps {
        args.push(format!("--app=tag=app-{i:02},cores={i},util={},rps=10", 10 + i));
    }
    args
}

#[test]
fn a_large_node_is_split_into_valid_requests() {
    let cw = CloudWatch::start();
    let mut spec = sink(&cw, "Big/Neuron", &[Dimension::NodeName, Dimension::NeuronCore, Dimension::RuntimeTag], "2s");
    // The same metrics once more per application: well over 1,000 datums per flush.
    spec.rollups = Some(vec![vec![Dimension::RuntimeTag]]);
    let config = node_config(vec![route("ops/big", None, None, spec)]);
    let sim = large_node_args(32);
    let sim: Vec<&str> = sim.iter().map(String::as_str).collect();
    // Through the proxy (no faults planned), which logs each request's size.
    let proxy = FaultProxy::start(cw.addr());
    let agent = start_agent(&sim, &config, proxy.addr, NO_RESTART);
    let m = wait_settled(&agent, "ops/big", 4.0);
    let sent = sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", "ops/big", &[]);
    let flushes = sink_value(&m, "neuron_agent_cloudwatch_flushes_total", "ops/big", &[]);
    let requests = sink_value(&m, "neuron_agent_cloudwatch_requests_total", "ops/big", &[("result", "success")]);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_requests_total", "ops/big", &[("result", "failure")]), 0.0);
    assert!(sent / flushes > 1000.0, "{sent} datums in {flushes} flushes");
    // A flush of the node's first report alone (fewer series) can fit one request: what
    // is checked is that the large ones were split.
    assert!(requests > flushes, "{requests} requests for {flushes} flushes");
    // Every request accepted and under 1 MB once decompressed. LocalStack enforces neither
    // 1,000 datums nor 1 MB per request: `requests_hold_at_most_1000_datums` and
    // `requests_stay_under_1_mb` check the agent's split.
    let log = proxy.requests();
    assert_eq!(log.len() as f64, requests);
    for r in &log {
        assert!(r.bytes <= 1_000_000 && r.status == 200, "{r:?}");
    }
    eprintln!(
        "large node: {} requests, {sent} datums, largest {} bytes (gzip: {})",
        log.len(),
        log.iter().map(|r| r.bytes).max().unwrap_or(0),
        log.iter().any(|r| r.gzip)
    );
    // Every datum stored.
    assert_eq!(datums(&cw.stored()).len() as f64, sent, "every datum the agent counted as sent is stored");
    let metrics = list_metrics(&cw, "Big/Neuron", &[]);
    assert!(metrics.len() > 1000, "{} metrics", metrics.len());
    let core = [("NodeName", "node-a"), ("NeuronCore", "7"), ("RuntimeTag", "app-07")];
    assert_eq!(statistic(&cw, "Big/Neuron", "neuroncore_utilization", &core, "Average"), Some(17.0));
    let rollup = [("RuntimeTag", "app-07")];
    assert_eq!(statistic(&cw, "Big/Neuron", "neuroncore_utilization", &rollup, "Average"), Some(17.0));
}

/// Requests per flush for the default metric set on a trn1.32xlarge with 32
/// applications: one datum per metric per flush whatever the interval, so requests per
/// flush are requests per node-minute at the default 60 s flush.
#[test]
fn default_set_on_a_trn1_32xlarge_takes_at_most_2_requests_per_flush() {
    let cw = CloudWatch::start();
    let mut default = sink(&cw, "Default/Neuron", &[], "2s");
    default.dimensions = None;
    // The default set with pods attributed: each application its own series. RuntimeTag
    // stands in for PodName, which needs attribution.
    let mut per_app = default.clone();
    per_app.namespace = cw.namespace("PerApp/Neuron");
    let mut set = api::cloudwatch::catalogue::DEFAULT_DIMENSIONS.to_vec();
    set.push(Dimension::RuntimeTag);
    per_app.dimensions = Some(set);
    let config =
        node_config(vec![route("ops/default", None, None, default), route("ops/per-app", None, None, per_app)]);
    let sim = large_node_args(32);
    let sim: Vec<&str> = sim.iter().map(String::as_str).collect();
    let agent = start_agent(&sim, &config, cw.addr(), NO_RESTART);
    wait_settled(&agent, "ops/default", 4.0);
    let m = wait_settled(&agent, "ops/per-app", 4.0);
    for sink in ["ops/default", "ops/per-app"] {
        let flushes = sink_value(&m, "neuron_agent_cloudwatch_flushes_total", sink, &[]);
        let requests = sink_value(&m, "neuron_agent_cloudwatch_requests_total", sink, &[("result", "success")]);
        let datums = sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", sink, &[]);
        eprintln!(
            "{sink}: {flushes} flushes, {requests} requests, {datums} datums: {:.2} requests and {:.0} datums per flush",
            requests / flushes,
            datums / flushes
        );
        assert!(requests / flushes <= 2.0, "{sink}: {requests} requests in {flushes} flushes");
    }
}

#[test]
fn faults_are_retried_and_counted_and_never_block_metrics() {
    let cw = CloudWatch::start();
    let proxy = FaultProxy::start(cw.addr());
    proxy.plan([
        Fault::Throttle,
        Fault::Throttle,
        Fault::Throttle,
        Fault::ServerError,
        Fault::ServerError,
        Fault::Slow(Duration::from_millis(1500)),
        // Longer than the agent's attempt time-out: the request is given up and retried.
        Fault::Stall(Duration::from_secs(4)),
    ]);
    let config =
        node_config(vec![route("ops/all", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag], "1s"))]);
    let mut args = NO_RESTART.to_vec();
    args.extend([
        "--cloudwatch-retry-initial",
        "100ms",
        "--cloudwatch-retry-max",
        "400ms",
        "--cloudwatch-request-timeout",
        "2500ms",
    ]);
    let agent = start_agent(SIM_SMALL, &config, proxy.addr, &args);

    // While CloudWatch is slow or stalled, /metrics answers at once.
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut scrape = || {
        let t = Instant::now();
        let (status, _) = agent.get("/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    };
    while proxy.injected.load(std::sync::atomic::Ordering::Relaxed) < 7 {
        assert!(start.elapsed() < Duration::from_secs(60), "the faults were not all served");
        scrape();
    }
    // The stall has begun and lasts 4 s.
    let stalled = Instant::now();
    let mut scrapes_during_stall = 0;
    while stalled.elapsed() < Duration::from_secs(2) {
        scrape();
        scrapes_during_stall += 1;
    }
    assert!(scrapes_during_stall > 10, "{scrapes_during_stall}");
    assert!(slowest < Duration::from_millis(500), "a scrape took {slowest:?}");

    let m = wait_settled(&agent, "ops/all", 6.0);
    let failures = |reason| sink_value(&m, "neuron_agent_cloudwatch_failures_total", "ops/all", &[("reason", reason)]);
    assert_eq!(failures("throttled"), 3.0);
    assert_eq!(failures("server_error"), 2.0);
    assert!(failures("timeout") >= 1.0);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_dropped_datums_total", "ops/all", &[]), 0.0);
    // Nothing lost: the stored sums are the agent's running sums. Delivery is at least
    // once: under load the slow request can outlast the attempt time-out and be stored
    // before its retry is; only where no request reached CloudWatch twice is it exactly once.
    let completed = m.value("execution_status_total", &[("runtime_tag", "serve"), ("status_type", "completed")]);
    let completed = completed.expect("the agent's running sum");
    let d = [("RuntimeTag", "serve"), ("StatusType", "completed")];
    let stored = statistic(&cw, "Ops/Neuron", "neuron_execution_status", &d, "Sum");
    match proxy.resent() {
        0 => assert_eq!(stored, Some(completed)),
        resent => assert!(
            stored.is_some_and(|s| s >= completed),
            "{stored:?} stored < {completed} counted ({resent} requests stored twice)"
        ),
    }
}

#[test]
fn sigterm_sends_what_is_queued() {
    let cw = CloudWatch::start();
    // A flush interval longer than the test: only the shutdown flush sends anything.
    let config =
        node_config(vec![route("ops/all", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag], "1h"))]);
    let mut agent = start_agent(SIM_SMALL, &config, cw.addr(), NO_RESTART);
    let m = agent.wait_for("all reports", Duration::from_secs(30), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 6.0).then(|| m.clone())
    });
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", "ops/all", &[]), 0.0);
    assert!(list_metrics(&cw, "Ops/Neuron", &[]).is_empty());
    let completed = m.value("execution_status_total", &[("runtime_tag", "train"), ("status_type", "completed")]);
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let d = [("RuntimeTag", "train"), ("StatusType", "completed")];
    assert_eq!(statistic(&cw, "Ops/Neuron", "neuron_execution_status", &d, "Sum"), completed);
    assert_eq!(
        statistic(&cw, "Ops/Neuron", "neuroncore_utilization", &[("RuntimeTag", "train")], "Average"),
        Some(80.0)
    );
}

/// A sink with an invalid region, or (defense in depth behind the operator's tenancy
/// policy) a region of another AWS partition than the instance's — `us-gov-west-1` from
/// the simulator's `us-west-2` — is left out and counted; the others run.
#[test]
fn an_invalid_sink_is_left_out_and_the_others_run() {
    let cw = CloudWatch::start();
    let mut bad = sink(&cw, "Bad/Neuron", &[Dimension::RuntimeTag], "1s");
    bad.region = Some("mars".to_owned());
    let mut gov = sink(&cw, "Gov/Neuron", &[Dimension::RuntimeTag], "1s");
    gov.region = Some("us-gov-west-1".to_owned());
    let config = node_config(vec![
        route("team/bad", None, None, bad),
        route("team/gov", None, None, gov),
        route("ops/all", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag], "1s")),
    ]);
    let agent = start_agent(SIM_SMALL, &config, cw.addr(), NO_RESTART);
    let m = wait_settled(&agent, "ops/all", 6.0);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_invalid_sinks", "team/bad", &[("reason", "region")]), 1.0);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_requests_total", "team/bad", &[]), 0.0);
    assert!(list_metrics(&cw, "Bad/Neuron", &[]).is_empty());
    let gov = sink_value(&m, "neuron_agent_cloudwatch_invalid_sinks", "team/gov", &[("reason", "partition")]);
    assert_eq!(gov, 1.0, "{}", m.text);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_requests_total", "team/gov", &[]), 0.0);
    assert!(list_metrics(&cw, "Gov/Neuron", &[]).is_empty());
    assert!(!list_metrics(&cw, "Ops/Neuron", &[]).is_empty());
    assert!(m.value("neuroncore_utilization_ratio", &[("runtime_tag", "train"), ("neuroncore", "0")]).is_some());
}

/// Per-namespace routing by pod. Without pods attributed (no Kubernetes here), a
/// namespaced route sees nothing, while the operator's route sees everything.
#[test]
fn a_namespaced_route_sees_only_applications_of_its_namespace() {
    let cw = CloudWatch::start();
    let config = node_config(vec![
        route("team-a/cw", Some("team-a"), None, sink(&cw, "TeamA/Neuron", &[Dimension::PodName], "1s")),
        route("ops/all", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag], "1s")),
    ]);
    let agent = start_agent(SIM_SMALL, &config, cw.addr(), NO_RESTART);
    let m = wait_settled(&agent, "ops/all", 6.0);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", "team-a/cw", &[]), 0.0);
    assert!(list_metrics(&cw, "TeamA/Neuron", &[]).is_empty());
    assert!(!list_metrics(&cw, "Ops/Neuron", &[]).is_empty());
}

/// Two teams' applications on one node, attributed to their pods through the real API
/// server, a test kubelet and a fake /proc: each team's CloudWatch namespace gets exactly
/// its pods' metrics, and the node-level metrics go only to the operator's route.
#[test]
fn each_namespace_gets_exactly_its_pods_metrics() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let teams = support::kubelet::TwoTeams::start(&rt, "cw", 4100);
    let (a, b) = (teams.a.clone(), teams.b.clone());

    let cw = CloudWatch::start();
    let team_dims = [Dimension::Namespace, Dimension::PodName, Dimension::ContainerName, Dimension::NeuronCore];
    let config = node_config(vec![
        route("a/cw", Some(&a), None, sink(&cw, "TeamA/Neuron", &team_dims, "1s")),
        route("b/cw", Some(&b), None, sink(&cw, "TeamB/Neuron", &team_dims, "1s")),
        route("ops/all", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag, Dimension::NeuronDevice], "1s")),
    ]);
    let (sim, args) = (teams.sim_args(), teams.agent_args());
    let sim: Vec<&str> = sim.iter().map(String::as_str).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = neuron_e2e::ControlPlane::shared().kubeconfig.as_os_str();
    let agent =
        support::cloudwatch::start_agent_with_env(&sim, &config, cw.addr(), &args, &[("KUBECONFIG", kubeconfig)]);
    agent.wait_for("both teams' sinks sending", Duration::from_secs(60), |m| {
        let sent = |s| sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", s, &[]);
        (sent("a/cw") > 0.0 && sent("b/cw") > 0.0 && sent("ops/all") > 0.0).then_some(())
    });
    // Two more flushes with everything attributed.
    std::thread::sleep(Duration::from_millis(2500));

    let team_a = list_metrics(&cw, "TeamA/Neuron", &[]);
    assert!(!team_a.is_empty());
    for m in &team_a {
        let d = dimension_map(m);
        assert_eq!(d.get("Namespace"), Some(&a), "{m:?}");
        assert_eq!(d.get("PodName").map(String::as_str), Some("train"), "{m:?}");
        assert_ne!(m.metric_name(), Some("neurondevice_hw_ecc_events"));
    }
    let team_b = list_metrics(&cw, "TeamB/Neuron", &[]);
    assert!(!team_b.is_empty());
    assert!(team_b.iter().all(|m| dimension_map(m).get("PodName").map(String::as_str) == Some("serve")));
    assert!(team_b.iter().all(|m| dimension_map(m).get("Namespace") == Some(&b)));

    // Values: the team's cores, and the core its pod holds but does not use (idle, 0 %).
    let util = |ns: &str, pod: &str, container: &str, core: &str, cw_ns: &str| {
        let d = [("Namespace", ns), ("PodName", pod), ("ContainerName", container), ("NeuronCore", core)];
        statistic(&cw, cw_ns, "neuroncore_utilization", &d, "Maximum")
    };
    assert_eq!(util(&a, "train", "main", "0", "TeamA/Neuron"), Some(80.0));
    assert_eq!(util(&a, "train", "main", "2", "TeamA/Neuron"), Some(80.0));
    assert_eq!(util(&b, "serve", "srv", "4", "TeamB/Neuron"), Some(50.0));
    assert_eq!(util(&a, "train", "main", "3", "TeamA/Neuron"), Some(0.0));

    // The operator's route: both applications and the node-level ECC counters.
    let ops = list_metrics(&cw, "Ops/Neuron", &[]);
    let tags: BTreeSet<String> = ops.iter().filter_map(|m| dimension_map(m).get("RuntimeTag").cloned()).collect();
    assert_eq!(tags, ["serve", "train"].map(str::to_owned).into());
    assert!(ops.iter().any(|m| m.metric_name() == Some("neurondevice_hw_ecc_events")));
    assert!(!list_metrics(&cw, "TeamA/Neuron", &[])
        .iter()
        .any(|m| m.metric_name() == Some("neurondevice_hw_ecc_events")));
}

/// A NeuronMonitorConfig selecting the nodes labelled `e2e-run=<run>`, every runtime
/// group at 1 s, with a CloudWatch sink flushed every second.
fn monitor_config(
    namespace: &str,
    name: &str,
    run: &str,
    cloudwatch: CloudWatchSinkSpec,
) -> api::crd::NeuronMonitorConfig {
    use api::crd::{NeuronMonitorConfig, NeuronMonitorConfigSpec, SinksSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let mut config = NeuronMonitorConfig::new(
        name,
        NeuronMonitorConfigSpec {
            node_selector: Some(LabelSelector {
                match_labels: Some([("e2e-run".to_owned(), run.to_owned())].into()),
                ..Default::default()
            }),
            period: Some("1s".to_owned()),
            sinks: Some(SinksSpec { cloudwatch: Some(cloudwatch), ..Default::default() }),
            ..Default::default()
        },
    );
    config.metadata.namespace = Some(namespace.to_owned());
    config
}

/// The whole chain of issue 6: the real operator renders three NeuronMonitorConfigs
/// (two teams' and one in its own namespace) into the node's ConfigMap; the agent
/// follows it, attributes the simulator's two applications to the teams' pods (real API
/// server, test kubelet, fake /proc) and publishes each team's pods to that team's
/// CloudWatch namespace only, the node-level metrics only to the operator namespace's.
#[test]
fn the_operator_gives_each_team_its_own_cloudwatch_namespace() {
    use api::{
        crd::NeuronMonitorConfig,
        node_config::{configmap_name, NodeConfig, NODE_CONFIG_KEY},
    };
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{Api, DeleteParams, PostParams};
    use neuron_node_agent::attribution::podresources::NEURONCORE;
    use support::kubelet::{container_id, containerd_cgroup, holding, FakeProc, PodResourcesServer};

    const REPORTS: f64 = 6.0;
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = neuron_e2e::ControlPlane::shared();
    rt.block_on(cp.install_crds());
    let client = rt.block_on(cp.client());
    let (ops, a, b) = rt.block_on(async {
        (cp.namespace("cw-ops").await, cp.namespace("cw-team-a").await, cp.namespace("cw-team-b").await)
    });
    let run = format!("cw-op-{:08x}", neuron_e2e::random_u32());
    let node = format!("{run}-trn");

    // A Neuron node of its own, and the operator watching the configs.
    let node_object: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node, "labels": {
            "node.kubernetes.io/instance-type": "trn1.2xlarge", "e2e-run": run,
        }}
    }))
    .expect("node");
    let nodes: Api<Node> = Api::all(client.clone());
    rt.block_on(nodes.create(&PostParams::default(), &node_object)).expect("create the node");
    let operator_addr = format!("127.0.0.1:{}", support::free_port());
    let _operator = neuron_e2e::Process::start(
        "neuron-operator",
        &["--namespace".into(), ops.clone(), "--listen".into(), operator_addr],
        &[("NEURON_OPERATOR_LOG", "info".into())],
        cp,
    );

    // Each team's pod on the node, running one application of the simulator.
    let (cid_a, cid_b) = (container_id(0xa3), container_id(0xb3));
    let uid_a = rt.block_on(running_pod(&client, &a, "train", &node, "main", &cid_a));
    let uid_b = rt.block_on(running_pod(&client, &b, "serve", &node, "srv", &cid_b));
    let proc = FakeProc::new();
    proc.process(4201, &containerd_cgroup(&uid_a, &cid_a));
    proc.process(4202, &containerd_cgroup(&uid_b, &cid_b));
    let dir = support::TempDir::new("kubelet");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    kubelet.set(vec![holding(&a, "train", "main", NEURONCORE, &[0]), holding(&b, "serve", "srv", NEURONCORE, &[1])]);

    // The three configs, through the API; each team in its own CloudWatch namespace, as
    // the built-in tenancy policy gives it (Teams/<namespace>/…).
    let cw = CloudWatch::start();
    let (team_a, team_b) = (format!("Teams/{a}/Neuron"), format!("Teams/{b}/Neuron"));
    let (team_a, team_b) = (team_a.as_str(), team_b.as_str());
    let team_dims = [Dimension::Namespace, Dimension::PodName, Dimension::ContainerName, Dimension::NeuronCore];
    let cluster_dims = [Dimension::NodeName, Dimension::Namespace, Dimension::PodName, Dimension::RuntimeTag];
    let configs = [
        monitor_config(&a, "team", &run, sink(&cw, team_a, &team_dims, "1s")),
        monitor_config(&b, "team", &run, sink(&cw, team_b, &team_dims, "2s")),
        monitor_config(&ops, "cluster", &run, sink(&cw, "Cluster/Neuron", &cluster_dims, "1s")),
    ];
    for config in &configs {
        let namespace = config.metadata.namespace.as_deref().expect("namespace");
        let api: Api<NeuronMonitorConfig> = Api::namespaced(client.clone(), namespace);
        rt.block_on(api.create(&PostParams::default(), config)).expect("create the NeuronMonitorConfig");
    }
    let (route_a, route_b, route_ops) = (format!("{a}/team"), format!("{b}/team"), format!("{ops}/cluster"));

    // The operator renders the three routes into the node's ConfigMap.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ops);
    let rendered = rt
        .block_on(neuron_e2e::wait_for(Duration::from_secs(30), || async {
            let cm = configmaps.get_opt(&configmap_name(&node)).await.ok()??;
            let config: NodeConfig = serde_json::from_str(cm.data?.get(NODE_CONFIG_KEY)?).ok()?;
            (config.routes.len() == 3).then_some(config)
        }))
        .expect("the node's ConfigMap with the three routes within 30s");
    let mut routes: Vec<_> =
        rendered.routes.iter().map(|r| (r.config.clone(), r.namespace.clone(), !r.system_groups.is_empty())).collect();
    routes.sort();
    let mut expected = vec![
        (route_a.clone(), Some(a.clone()), false),
        (route_b.clone(), Some(b.clone()), false),
        (route_ops.clone(), None, true),
    ];
    expected.sort();
    assert_eq!(routes, expected, "routes: (config, namespace, node-level groups)");

    // The agent, following the operator's ConfigMap.
    let sim = [
        "--instance-type=trn1.2xlarge",
        "--app=tag=train,cores=0,util=80,rps=20,pid=4201",
        "--app=tag=serve,cores=1,util=30,rps=40,pid=4202",
        "--ecc-every=1",
        "--hang-after=6",
    ];
    let args = [
        "--node-name",
        node.as_str(),
        "--config-namespace",
        ops.as_str(),
        "--proc-root",
        proc.root().to_str().expect("utf-8 path"),
        "--pod-resources-socket",
        kubelet.socket.to_str().expect("utf-8 path"),
        "--pod-resources-interval",
        "300ms",
        // The simulator stops writing after six reports: no restart for that.
        "--silence-timeout",
        "1h",
    ];
    let agent = support::cloudwatch::start_agent_without_file(
        &sim,
        cw.addr(),
        &args,
        &[("KUBECONFIG", cp.kubeconfig.as_os_str())],
    );

    // Status: every config applied by the agent, with a CloudWatch estimate.
    let mut estimates: BTreeMap<String, i64> = BTreeMap::new();
    for config in &configs {
        let namespace = config.metadata.namespace.as_deref().expect("namespace");
        let name = config.metadata.name.as_deref().expect("name");
        let api: Api<NeuronMonitorConfig> = Api::namespaced(client.clone(), namespace);
        let status = rt
            .block_on(neuron_e2e::wait_for(Duration::from_secs(30), || async {
                let status = api.get_opt(name).await.ok()??.status?;
                (status.applied_nodes == 1 && status.estimated_cloud_watch_metrics.is_some()).then_some(status)
            }))
            .unwrap_or_else(|| {
                panic!("{namespace}/{name}: no status with the agent's acknowledgement and an estimate")
            });
        let estimate = status.estimated_cloud_watch_metrics.unwrap_or(0);
        assert!(estimate > 0, "{namespace}/{name}: estimated {estimate} CloudWatch metrics");
        let cw_namespace = config.spec.sinks.as_ref().and_then(|s| s.cloudwatch.as_ref()).map(|c| c.namespace.clone());
        estimates.insert(cw_namespace.expect("a CloudWatch sink"), estimate);
        assert_eq!(status.matched_nodes, 1, "{namespace}/{name}");
        eprintln!(
            "{namespace}/{name}: {estimate} CloudWatch metrics, ${} a month",
            status.estimated_monthly_cost_usd.as_deref().unwrap_or("?")
        );
    }

    // Everything the simulator produced is stored.
    wait_settled(&agent, &route_a, REPORTS);
    wait_settled(&agent, &route_b, REPORTS);
    let m = wait_settled(&agent, &route_ops, REPORTS);

    // Each team's namespace: its pod's series only, no node-level metric.
    for (cw_ns, ns, pod, container, core, util) in
        [(team_a, &a, "train", "main", "0", 80.0), (team_b, &b, "serve", "srv", "1", 30.0)]
    {
        let metrics = list_metrics(&cw, cw_ns, &[]);
        assert!(names(&metrics).contains("neuroncore_utilization"), "{cw_ns}: {:?}", names(&metrics));
        assert!(names(&metrics).contains("neuron_execution_status"), "{cw_ns}: {:?}", names(&metrics));
        assert!(!names(&metrics).contains("neurondevice_hw_ecc_events"), "{cw_ns}: node-level metric");
        for metric in &metrics {
            let d = dimension_map(metric);
            assert_eq!(d.get("Namespace"), Some(ns), "{cw_ns}: {metric:?}");
            assert_eq!(d.get("PodName").map(String::as_str), Some(pod), "{cw_ns}: {metric:?}");
            assert_eq!(d.get("ContainerName").map(String::as_str), Some(container), "{cw_ns}: {metric:?}");
            if let Some(c) = d.get("NeuronCore") {
                assert_eq!(c, core, "{cw_ns}: only the pod's core: {metric:?}");
            }
        }
        // The application's utilization, every sample of it: minimum = maximum.
        let d = [("Namespace", ns.as_str()), ("PodName", pod), ("ContainerName", container), ("NeuronCore", core)];
        for stat in ["Minimum", "Maximum", "Average"] {
            assert_eq!(statistic(&cw, cw_ns, "neuroncore_utilization", &d, stat), Some(util), "{cw_ns} {stat}");
        }
        // Counters: the team's sum is the agent's running sum of its application.
        let tag = pod; // the simulator's tag of each team's application is its pod's name
        let completed = m.sum("execution_status_total", &[("runtime_tag", tag), ("status_type", "completed")]);
        assert!(completed > 0.0, "{tag}: no completed executions");
        let d =
            [("Namespace", ns.as_str()), ("PodName", pod), ("ContainerName", container), ("StatusType", "completed")];
        assert_counter_sum(&cw, &m, cw_ns, "neuron_execution_status", &d, completed);
    }

    // The operator namespace's config: both applications, attributed, and the node-level
    // ECC counters, whose sums are the agent's.
    let cluster = list_metrics(&cw, "Cluster/Neuron", &[]);
    let pods: BTreeSet<(String, String, String)> = cluster
        .iter()
        .filter(|m| m.metric_name() == Some("neuroncore_utilization"))
        .map(dimension_map)
        .map(|d| {
            let get = |k: &str| d.get(k).cloned().unwrap_or_default();
            (get("Namespace"), get("PodName"), get("RuntimeTag"))
        })
        .collect();
    assert_eq!(
        pods,
        [(a.clone(), "train".to_owned(), "train".to_owned()), (b.clone(), "serve".to_owned(), "serve".to_owned())]
            .into()
    );
    for (ns, pod, util) in [(&a, "train", 80.0), (&b, "serve", 30.0)] {
        let d = [("NodeName", node.as_str()), ("Namespace", ns.as_str()), ("PodName", pod), ("RuntimeTag", pod)];
        assert_eq!(statistic(&cw, "Cluster/Neuron", "neuroncore_utilization", &d, "Maximum"), Some(util));
        assert_eq!(statistic(&cw, "Cluster/Neuron", "neuroncore_utilization", &d, "Minimum"), Some(util));
    }
    let ecc: Vec<_> = cluster.iter().filter(|m| m.metric_name() == Some("neurondevice_hw_ecc_events")).collect();
    assert!(!ecc.is_empty(), "no ECC metric in Cluster/Neuron: {:?}", names(&cluster));
    for metric in &ecc {
        let d = dimension_map(metric);
        assert_eq!(d.get("NodeName"), Some(&node), "{metric:?}");
        assert!(!d.contains_key("PodName") && !d.contains_key("Namespace"), "node-level, not a pod's: {metric:?}");
    }
    let corrected = m.sum("hardware_ecc_events_total", &[("event_type", "mem_ecc_corrected")]);
    assert!(corrected > 0.0, "the simulator reported ECC events");
    let d = [("NodeName", node.as_str()), ("EventType", "mem_ecc_corrected")];
    assert_counter_sum(&cw, &m, "Cluster/Neuron", "neurondevice_hw_ecc_events", &d, corrected);
    for cw_ns in [team_a, team_b] {
        assert!(list_metrics(&cw, cw_ns, &[("EventType", "mem_ecc_corrected")]).is_empty(), "{cw_ns}");
    }
    // The operator's estimate is an upper bound of what the sink creates.
    for cw_ns in [team_a, team_b, "Cluster/Neuron"] {
        let created = list_metrics(&cw, cw_ns, &[]).len() as i64;
        let estimate = estimates.get(&cw.namespace(cw_ns)).copied().unwrap_or(0);
        eprintln!("{cw_ns}: {created} metrics created, {estimate} estimated");
        assert!(created <= estimate, "{cw_ns}: {created} metrics created, more than the {estimate} estimated");
    }
    // Nothing else was written (in this test's namespaces: the others are other tests').
    let namespaces: BTreeSet<String> = cw.stored().into_iter().map(|d| d.namespace).collect();
    assert_eq!(namespaces, ["Cluster/Neuron", team_a, team_b].map(|n| cw.namespace(n)).into());

    drop(agent);
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the node");
    eprintln!("operator → agent → CloudWatch per namespace: {:?}", started.elapsed());
}

/// The Container Insights list as the CloudWatch agent's source publishes it, written out
/// here apart from the catalogue: (metric name, dimension names) of a family,
/// without the `UltraServer` and `Service` sets the agent cannot fill.
fn container_insights_list(node: bool, ecc: bool) -> BTreeSet<(String, BTreeSet<String>)> {
    type Set = BTreeSet<String>;
    const PER_CORE: [&str; 7] = [
        "neuroncore_utilization",
        "neuroncore_memory_usage_constants",
        "neuroncore_memory_usage_model_code",
        "neuroncore_memory_usage_model_shared_scratchpad",
        "neuroncore_memory_usage_runtime_memory",
        "neuroncore_memory_usage_tensors",
        "neuroncore_memory_usage_total",
    ];
    const ECC: &str = "neurondevice_hw_ecc_events_total";
    let sets = |sets: &[&[&str]]| -> Vec<BTreeSet<String>> {
        sets.iter().map(|s| s.iter().map(|d| (*d).to_owned()).collect()).collect()
    };
    let (c, ns, pod, full, ctr) = ("ClusterName", "Namespace", "PodName", "FullPodName", "ContainerName");
    let (id, node_name, itype, dev, core) = ("InstanceId", "NodeName", "InstanceType", "NeuronDevice", "NeuronCore");
    let mut out = BTreeSet::new();
    let mut add = |name: String, sets: Vec<BTreeSet<String>>| {
        for s in sets {
            out.insert((name.clone(), s));
        }
    };
    // (prefix, per-core sets, per-device sets)
    let mut families: Vec<(&str, Vec<Set>, Vec<Set>)> = vec![
        (
            "pod_",
            sets(&[&[c], &[c, ns], &[c, ns, pod], &[c, ns, pod, full], &[c, ns, pod, full, dev, core]]),
            sets(&[&[c], &[c, ns], &[c, ns, pod], &[c, ns, pod, full], &[c, ns, pod, full, dev]]),
        ),
        (
            "container_",
            sets(&[&[c], &[c, ns, pod, ctr], &[c, ns, pod, full, ctr], &[c, ns, pod, full, ctr, dev, core]]),
            sets(&[&[c], &[c, ns, pod, ctr], &[c, ns, pod, full, ctr], &[c, ns, pod, full, ctr, dev]]),
        ),
    ];
    if node {
        families.push((
            "node_",
            sets(&[&[c], &[c, id, node_name], &[c, itype, id, node_name, dev, core]]),
            sets(&[&[c], &[c, id, node_name], &[c, id, node_name, dev]]),
        ));
        for name in [
            "node_neuron_execution_errors_total",
            "node_neurondevice_runtime_memory_used_bytes",
            "node_neuron_execution_latency",
        ] {
            add(name.to_owned(), sets(&[&[c], &[c, id, node_name]]));
        }
    }
    for (prefix, per_core, per_device) in families {
        for suffix in PER_CORE {
            add(format!("{prefix}{suffix}"), per_core.clone());
        }
        if ecc {
            add(format!("{prefix}{ECC}"), per_device);
        }
    }
    out
}

/// `naming: ContainerInsights` on a trn1.32xlarge-size node with two teams' pods of two
/// workloads (a Deployment's, a CronJob's), attributed through the real API server, a test
/// kubelet and a fake /proc: the operator namespace's config publishes exactly the
/// reference's names and dimension sets with its units and value formats, each team's
/// only its own pods' `pod_` and `container_` series.
#[test]
fn container_insights_naming_publishes_exactly_its_names_and_sets() {
    use api::crd::CloudWatchNaming;
    use k8s_openapi::api::{apps::v1::ReplicaSet, batch::v1::Job};
    use neuron_node_agent::attribution::podresources::{NEURONCORE, NEURONDEVICE};
    use support::kubelet::{container_id, containerd_cgroup, holding, running_pod_with, FakeProc, PodResourcesServer};

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = neuron_e2e::ControlPlane::shared();
    let node = format!("neuron-node-{:08x}", neuron_e2e::random_u32());
    let (a, b) = rt.block_on(async { (cp.namespace("ci-a").await, cp.namespace("ci-b").await) });
    let client = rt.block_on(cp.client());
    // The owners exist (no controller runs them), so the garbage collector keeps the pods.
    let template = |labels: serde_json::Value, restart: &str| {
        serde_json::json!({"metadata": {"labels": labels}, "spec": {"restartPolicy": restart,
            "containers": [{"name": "c", "image": "registry.invalid/neuron-app:1"}]}})
    };
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train-6d4cf56db6"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "train"}},
                 "template": template(serde_json::json!({"app": "train"}), "Always")}
    }))
    .expect("replica set");
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nightly-eval-29412345"},
        "spec": {"suspend": true, "template": template(serde_json::json!({"app": "eval"}), "Never")}
    }))
    .expect("job");
    let (rs_uid, job_uid) = rt.block_on(async {
        let pp = kube::api::PostParams::default();
        let rs = kube::Api::<ReplicaSet>::namespaced(client.clone(), &a).create(&pp, &rs).await.expect("create rs");
        let job = kube::Api::<Job>::namespaced(client.clone(), &b).create(&pp, &job).await.expect("create job");
        (rs.metadata.uid.expect("uid"), job.metadata.uid.expect("uid"))
    });
    let owner = |api_version: &str, kind: &str, name: &str, uid: &str| serde_json::json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true});
    let (train, eval) = ("train-6d4cf56db6-x7k2p", "nightly-eval-29412345-q8z4m");
    let (cid_a, cid_b) = (container_id(0xa3), container_id(0xb3));
    let uid_a = rt.block_on(running_pod_with(
        &client,
        &a,
        train,
        &node,
        "main",
        &cid_a,
        serde_json::json!({"app": "train", "pod-template-hash": "6d4cf56db6"}),
        Some(owner("apps/v1", "ReplicaSet", "train-6d4cf56db6", &rs_uid)),
    ));
    let uid_b = rt.block_on(running_pod_with(
        &client,
        &b,
        eval,
        &node,
        "eval",
        &cid_b,
        serde_json::json!({"app": "eval"}),
        Some(owner("batch/v1", "Job", "nightly-eval-29412345", &job_uid)),
    ));
    let proc = FakeProc::new();
    proc.process(4201, &containerd_cgroup(&uid_a, &cid_a));
    proc.process(4202, &containerd_cgroup(&uid_b, &cid_b));
    let dir = support::TempDir::new("kubelet");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    kubelet
        .set(vec![holding(&a, train, "main", NEURONDEVICE, &[0, 1]), holding(&b, eval, "eval", NEURONCORE, &[4, 5])]);

    let cw = CloudWatch::start();
    let insights = |namespace: &str| CloudWatchSinkSpec {
        namespace: cw.namespace(namespace),
        naming: Some(CloudWatchNaming::ContainerInsights),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    let config = node_config(vec![
        route("a/cw", Some(&a), None, insights("TeamA")),
        route("b/cw", Some(&b), None, insights("TeamB")),
        route("ops/all", None, None, insights("ContainerInsights")),
    ]);
    let sim = [
        "--instance-type=trn1.32xlarge",
        "--app=tag=train,cores=0-2,util=80,rps=20,errors=2,pid=4201",
        "--app=tag=eval,cores=4,util=50,rps=40,pid=4202",
        "--ecc-every=1",
    ];
    let args = [
        "--cluster-name",
        "prod",
        "--node-name",
        node.as_str(),
        "--proc-root",
        proc.root().to_str().expect("utf-8 path"),
        "--pod-resources-socket",
        kubelet.socket.to_str().expect("utf-8 path"),
        "--pod-resources-interval",
        "300ms",
    ];
    let kubeconfig = cp.kubeconfig.as_os_str();
    let agent =
        support::cloudwatch::start_agent_with_env(&sim, &config, cw.addr(), &args, &[("KUBECONFIG", kubeconfig)]);
    agent.wait_for("both teams' sinks sending", Duration::from_secs(60), |m| {
        let sent = |s| sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", s, &[]);
        (sent("a/cw") > 0.0 && sent("b/cw") > 0.0 && sent("ops/all") > 0.0).then_some(())
    });
    // Two more flushes with everything attributed.
    std::thread::sleep(Duration::from_millis(2500));
    let m = agent.metrics();

    let published = |metrics: &[Metric]| -> BTreeSet<(String, BTreeSet<String>)> {
        metrics
            .iter()
            .map(|m| (m.metric_name().unwrap_or_default().to_owned(), dimension_map(m).into_keys().collect()))
            .collect()
    };
    let ops = list_metrics(&cw, "ContainerInsights", &[]);
    assert_eq!(published(&ops), container_insights_list(true, true));
    for (namespace, team) in [("TeamA", &a), ("TeamB", &b)] {
        let metrics = list_metrics(&cw, namespace, &[]);
        assert_eq!(published(&metrics), container_insights_list(false, false), "{namespace}");
        for metric in &metrics {
            let d = dimension_map(metric);
            assert!(d.get("Namespace").is_none_or(|ns| ns == team), "{metric:?}");
        }
    }
    for metric in &ops {
        let name = metric.metric_name().unwrap_or_default();
        let unit = match name {
            n if n.ends_with("neuroncore_utilization") => "Percent",
            "node_neuron_execution_latency" => "Seconds",
            n if n.ends_with("_total") && !n.contains("memory") => "Count",
            _ => "Bytes",
        };
        assert_eq!(units(&cw, metric), BTreeSet::from([unit.to_owned()]), "{metric:?}");
    }

    // Value formats: PodName the workload, FullPodName the pod, core<N> and device<M>.
    let core = |pod: &str, full: &str, ns: &str, device: &str, core: &str| {
        [
            ("ClusterName", "prod"),
            ("Namespace", ns),
            ("PodName", pod),
            ("FullPodName", full),
            ("NeuronDevice", device),
            ("NeuronCore", core),
        ]
        .map(|(n, v)| (n, v.to_owned()))
    };
    let stat = |cw_ns: &str, name: &str, d: &[(&str, String)], s: &str| {
        let d: Vec<(&str, &str)> = d.iter().map(|(n, v)| (*n, v.as_str())).collect();
        statistic(&cw, cw_ns, name, &d, s)
    };
    let train_core0 = core("train", train, &a, "device0", "core0");
    assert_eq!(stat("TeamA", "pod_neuroncore_utilization", &train_core0, "Average"), Some(80.0));
    assert_eq!(stat("ContainerInsights", "pod_neuroncore_utilization", &train_core0, "Average"), Some(80.0));
    // The core the train pod holds and does not use: its own, at 0 %.
    let train_core3 = core("train", train, &a, "device1", "core3");
    assert_eq!(stat("TeamA", "pod_neuroncore_utilization", &train_core3, "Maximum"), Some(0.0));
    let eval_core4 = core("nightly-eval", eval, &b, "device2", "core4");
    assert_eq!(stat("TeamB", "pod_neuroncore_utilization", &eval_core4, "Average"), Some(50.0));
    let node_core =
        [("ClusterName", "prod"), ("NodeName", node.as_str()), ("NeuronDevice", "device2"), ("NeuronCore", "core4")];
    let node_core: Vec<(&str, String)> = node_core.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
    let stored_node_core: Vec<_> = cw
        .stored()
        .into_iter()
        .filter(|s| {
            s.name == "node_neuroncore_utilization" && node_core.iter().all(|(n, v)| s.dimensions.get(*n) == Some(v))
        })
        .collect();
    assert!(!stored_node_core.is_empty() && stored_node_core.iter().all(|s| s.value == 50.0));

    // The node's device memory: the sum over both runtimes (the CloudWatch agent keeps one).
    let device_memory = m.sum("neuron_runtime_memory_used_bytes", &[("memory_location", "neuron_device")]);
    let per_runtime: Vec<f64> = ["train", "eval"]
        .iter()
        .filter_map(|tag| {
            m.value("neuron_runtime_memory_used_bytes", &[("runtime_tag", tag), ("memory_location", "neuron_device")])
        })
        .collect();
    assert_eq!(per_runtime.len(), 2);
    assert!(per_runtime.iter().all(|v| *v > 0.0) && device_memory == per_runtime.iter().sum::<f64>());
    // The finest node set: LocalStack matches a query's dimensions as a subset.
    let name = "node_neurondevice_runtime_memory_used_bytes";
    let finest = ops.iter().filter(|m| m.metric_name() == Some(name)).map(dimension_map).max_by_key(|d| d.len());
    let finest = finest.unwrap_or_default();
    let node_dims: Vec<(&str, String)> = finest.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    assert_eq!(finest.get("NodeName"), Some(&node));
    assert!(finest.get("InstanceId").is_some_and(|id| id.starts_with("i-")), "{finest:?}");
    assert_eq!(stat("ContainerInsights", name, &node_dims, "Maximum"), Some(device_memory));
    // Errors: deltas summed over types and runtimes, never more than the agent counted.
    let sum = stat("ContainerInsights", "node_neuron_execution_errors_total", &node_dims, "Sum").unwrap_or(0.0);
    let errors = agent.metrics().sum("execution_errors_total", &[]);
    assert!(sum > 0.0 && sum <= errors, "{sum} of {errors}");
}

/// The node's cores by allocation state, from the kubelet's allocatable devices and the
/// pods' allocations, in LocalStack: the classic `neuron_node_neuroncores` by `State`, and
/// Container Insights' node and pod capacity metrics.
#[test]
fn the_nodes_allocation_reaches_cloudwatch_in_both_namings() {
    use api::crd::CloudWatchNaming;
    use neuron_node_agent::attribution::podresources::{proto::ContainerDevices, NEURONCORE, NEURONDEVICE};
    use support::kubelet::{container_id, holding, PodResourcesServer};

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = neuron_e2e::ControlPlane::shared();
    let node = format!("neuron-alloc-{:08x}", neuron_e2e::random_u32());
    let ns = rt.block_on(cp.namespace("cw-alloc"));
    let client = rt.block_on(cp.client());
    rt.block_on(running_pod(&client, &ns, "train", &node, "main", &container_id(0xa7)));
    let dir = support::TempDir::new("kubelet-alloc");
    let kubelet = PodResourcesServer::start(&dir.0.join("kubelet.sock"));
    let ids = |n: u32| (0..n).map(|i| i.to_string()).collect();
    kubelet.set_allocatable(Some(vec![
        ContainerDevices { resource_name: NEURONDEVICE.into(), device_ids: ids(16) },
        ContainerDevices { resource_name: NEURONCORE.into(), device_ids: ids(32) },
    ]));
    // train holds 4 cores and runs nothing on them: allocated, and idle after 1 s.
    kubelet.set(vec![holding(&ns, "train", "main", NEURONCORE, &[0, 1, 2, 3])]);

    let cw = CloudWatch::start();
    let insights = CloudWatchSinkSpec {
        namespace: cw.namespace("ContainerInsights"),
        naming: Some(CloudWatchNaming::ContainerInsights),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    // The team lists the pods' counts, which no config sends by default.
    let team = CloudWatchSinkSpec {
        metrics: Some(vec![CloudWatchMetric::NeuronPodNeuroncores]),
        ..sink(&cw, "Team/Neuron", &[Dimension::ClusterName, Dimension::Namespace, Dimension::PodName], "1s")
    };
    let config = node_config(vec![
        route("ops/classic", None, None, sink(&cw, "Ops/Neuron", &[Dimension::ClusterName], "1s")),
        route("ops/insights", None, None, insights),
        route(&format!("{ns}/team"), Some(&ns), None, team),
    ]);
    let socket = kubelet.socket.to_str().expect("utf-8 path");
    let args = ["--cluster-name", "prod", "--node-name", &node, "--pod-resources-socket", socket];
    let args = [&args[..], &["--pod-resources-interval", "300ms", "--idle-core-window", "1s"]].concat();
    let kubeconfig = cp.kubeconfig.as_os_str();
    // The one application runs on a core no pod holds.
    let sim = ["--instance-type=trn1.32xlarge", "--app=tag=other,cores=8,util=50"];
    let agent =
        support::cloudwatch::start_agent_with_env(&sim, &config, cw.addr(), &args, &[("KUBECONFIG", kubeconfig)]);
    agent.wait_for("train's cores allocated and idle", Duration::from_secs(30), |m| {
        (m.value("neuron_node_neuroncores", &[("state", "allocated_idle")]) == Some(4.0)).then_some(())
    });
    let stored = |name: &str, dimension: (&str, &str), value: f64| {
        cw.stored().iter().any(|s| {
            s.name == name && s.dimensions.get(dimension.0).map(String::as_str) == Some(dimension.1) && s.value == value
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(stored("neuron_node_neuroncores", ("State", "allocated_idle"), 4.0)
        && stored("pod_neuroncore_request", ("FullPodName", "train"), 4.0)
        && stored("neuron_pod_neuroncores", ("State", "allocated_idle"), 4.0))
    {
        assert!(Instant::now() < deadline, "the allocation never reached LocalStack: {:?}", cw.stored());
        std::thread::sleep(Duration::from_millis(200));
    }

    let classic = |state: &str| {
        statistic(&cw, "Ops/Neuron", "neuron_node_neuroncores", &[("ClusterName", "prod"), ("State", state)], "Maximum")
    };
    assert_eq!(
        (classic("allocatable"), classic("allocated"), classic("allocated_idle")),
        (Some(32.0), Some(4.0), Some(4.0))
    );
    let classic_units: BTreeSet<String> = list_metrics(&cw, "Ops/Neuron", &[])
        .iter()
        .filter(|m| m.metric_name() == Some("neuron_node_neuroncores"))
        .flat_map(|m| units(&cw, m))
        .collect();
    assert_eq!(classic_units, BTreeSet::from(["Count".to_owned()]));
    let opted_in = |namespace: &str| {
        list_metrics(&cw, namespace, &[]).iter().any(|m| m.metric_name() == Some("neuron_pod_neuroncores"))
    };
    assert!(!opted_in("Ops/Neuron"), "the pods' counts are sent only where listed");
    let team_pod = |state: &str| {
        let dimensions = [("ClusterName", "prod"), ("Namespace", ns.as_str()), ("PodName", "train"), ("State", state)];
        statistic(&cw, "Team/Neuron", "neuron_pod_neuroncores", &dimensions, "Maximum")
    };
    assert_eq!((team_pod("allocated"), team_pod("allocated_idle")), (Some(4.0), Some(4.0)));
    let node_level = |name: &str| statistic(&cw, "ContainerInsights", name, &[("ClusterName", "prod")], "Maximum");
    assert_eq!(node_level("node_neuroncore_limit"), Some(32.0));
    assert_eq!(node_level("node_neuroncore_usage_total"), Some(4.0));
    assert_eq!(node_level("node_neuroncore_available_capacity"), Some(28.0));
    assert_eq!(node_level("node_neuroncore_reserved_capacity"), Some(12.5));
    let pod = [("ClusterName", "prod"), ("Namespace", ns.as_str()), ("PodName", "train"), ("FullPodName", "train")];
    let pod_level = |name: &str| statistic(&cw, "ContainerInsights", name, &pod, "Maximum");
    assert_eq!((pod_level("pod_neuroncore_request"), pod_level("pod_neuroncore_limit")), (Some(4.0), Some(4.0)));
    assert_eq!(pod_level("pod_neuroncore_reserved_capacity"), Some(12.5));
}

/// Every Container Insights set has `ClusterName`: without `--cluster-name` the sink is
/// left out, counted and logged, while a classic sink beside it runs.
#[test]
fn a_container_insights_sink_needs_a_cluster_name() {
    let cw = CloudWatch::start();
    let insights = CloudWatchSinkSpec {
        namespace: cw.namespace("ContainerInsights"),
        naming: Some(api::crd::CloudWatchNaming::ContainerInsights),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    let config = node_config(vec![
        route("ops/insights", None, None, insights),
        route("ops/classic", None, None, sink(&cw, "Ops/Neuron", &[Dimension::RuntimeTag], "1s")),
    ]);
    let agent = start_agent(SIM_SMALL, &config, cw.addr(), &["--silence-timeout", "1h"]);
    let m = wait_settled(&agent, "ops/classic", 6.0);
    let invalid =
        |reason| sink_value(&m, "neuron_agent_cloudwatch_invalid_sinks", "ops/insights", &[("reason", reason)]);
    assert_eq!(invalid("cluster_name"), 1.0);
    assert_eq!(sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", "ops/insights", &[]), 0.0);
    assert!(list_metrics(&cw, "ContainerInsights", &[]).is_empty());
    assert!(!list_metrics(&cw, "Ops/Neuron", &[]).is_empty());
}

// --- NVIDIA GPUs, on the fake NVML library ------------------------------------------------

/// The fake NVML library (crate `nvidia-ml-fake`), built beside the agent.
fn fake_nvml() -> std::path::PathBuf {
    let agent = std::path::Path::new(support::AGENT);
    let lib = agent.parent().expect("the agent's directory").join("libnvidia_ml_fake.so");
    assert!(lib.is_file(), "{} is missing: cargo build -p nvidia-ml-fake", lib.display());
    lib
}

/// A g5.12xlarge (4 × A10G) with the values of GPUs 0 and 3 set: (index, utilization,
/// memory utilization, memory used MiB, temperature °C, power W).
const GPU_VALUES: [(u32, u32, u32, u64, u32, u32); 2] = [(0, 17, 9, 1024, 41, 61), (3, 83, 44, 20_000, 67, 190)];

fn fake_nvml_config(dir: &support::TempDir) -> std::path::PathBuf {
    let mut yaml = String::from("instance_type: g5.12xlarge\ngpus:\n");
    for (index, util, mem_util, used, temp, power) in GPU_VALUES {
        yaml += &format!(
            "  - {{index: {index}, utilization_gpu: {util}, utilization_memory: {mem_util}, \
             memory_used_mib: {used}, temperature_c: {temp}, power_w: {power}}}\n"
        );
    }
    let path = dir.0.join("fake-nvml.yaml");
    std::fs::write(&path, yaml).expect("write the fake NVML config");
    path
}

/// One value of a GPU's `DCGM_FI_DEV_*` series on `/metrics` (what NVML said).
fn dcgm(m: &Metrics, field: &str, gpu: u32) -> f64 {
    let gpu = gpu.to_string();
    m.value(field, &[("gpu", gpu.as_str())]).unwrap_or_else(|| panic!("{field} of GPU {gpu} on /metrics"))
}

#[test]
fn a_gpu_only_node_sends_the_cloudwatch_agents_nvidia_smi_names_and_dimensions() {
    let dir = support::TempDir::new("gpu-classic");
    let cw = CloudWatch::start();
    // No Neuron device: no neuron-monitor, no report; the GPU collections drive the sink,
    // and the region is the environment's.
    let config =
        node_config(vec![route("ops/gpu", None, None, sink(&cw, "GpuClassic", &[Dimension::ClusterName], "1s"))]);
    let lib = fake_nvml();
    let args = ["--nvml-library", lib.to_str().expect("utf-8 path"), "--cluster-name", "prod", "--period", "1s"];
    let yaml = fake_nvml_config(&dir);
    let env = [("FAKE_NVML_CONFIG", yaml.as_os_str()), ("AWS_REGION", std::ffi::OsStr::new("us-west-2"))];
    let agent = support::cloudwatch::start_agent_with_env(&[], &config, cw.addr(), &args, &env);
    agent.wait_for("the GPU sink sending", Duration::from_secs(60), |m| {
        (sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", "ops/gpu", &[]) > 0.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(2500));
    let m = agent.metrics();
    assert_eq!(m.sum("neuron_agent_reports_total", &[]), 0.0, "no report on a GPU-only node");

    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname").trim().to_owned();
    let metrics = list_metrics(&cw, "GpuClassic", &[]);
    let published: BTreeSet<(String, BTreeSet<String>)> = metrics
        .iter()
        .map(|m| (m.metric_name().unwrap_or_default().to_owned(), dimension_map(m).into_keys().collect()))
        .collect();
    let dimensions: BTreeSet<String> = ["index", "name", "host", "ClusterName"].map(str::to_owned).into();
    let expected: BTreeSet<(String, BTreeSet<String>)> =
        api::cloudwatch::catalogue::gpu::CLASSIC.iter().map(|g| (g.name.to_owned(), dimensions.clone())).collect();
    assert_eq!(published, expected);
    let indices: BTreeSet<String> = metrics.iter().filter_map(|m| dimension_map(m).get("index").cloned()).collect();
    assert_eq!(indices, ["0", "1", "2", "3"].map(str::to_owned).into(), "the 4 GPUs of a g5.12xlarge");
    for metric in &metrics {
        let d = dimension_map(metric);
        assert_eq!(
            (d["name"].as_str(), d["host"].as_str(), d["ClusterName"].as_str()),
            ("NVIDIA A10G", host.as_str(), "prod")
        );
        assert_eq!(units(&cw, metric), BTreeSet::from(["None".to_owned()]), "{metric:?}");
    }
    // The values the fake library was told, in nvidia-smi's units.
    for (index, util, mem_util, used, temp, power) in GPU_VALUES {
        let i = index.to_string();
        let dims = [("index", i.as_str()), ("name", "NVIDIA A10G"), ("host", host.as_str()), ("ClusterName", "prod")];
        for (name, want) in [
            ("nvidia_smi_utilization_gpu", f64::from(util)),
            ("nvidia_smi_utilization_memory", f64::from(mem_util)),
            ("nvidia_smi_memory_used", used as f64),
            ("nvidia_smi_temperature_gpu", f64::from(temp)),
            ("nvidia_smi_power_draw", f64::from(power)),
            ("nvidia_smi_memory_total", dcgm(&m, "DCGM_FI_DEV_FB_TOTAL", index)),
        ] {
            for stat in ["Minimum", "Maximum"] {
                assert_eq!(statistic(&cw, "GpuClassic", name, &dims, stat), Some(want), "{name} of GPU {index}");
            }
        }
    }
}

#[test]
fn container_insights_gpu_names_sets_and_units_on_a_node_with_both() {
    use api::crd::CloudWatchNaming;
    let lib = fake_nvml();
    let dir = support::TempDir::new("gpu-insights");
    // A Neuron device as well: neuron-monitor (the simulator) runs and reports, which tell
    // the instance; the GPUs are sampled once per collection all the same.
    std::fs::create_dir_all(dir.0.join("sysfs/devices/virtual/neuron_device/neuron0")).expect("sysfs");
    let cp = neuron_e2e::ControlPlane::shared();
    let node = format!("gpu-node-{:08x}", neuron_e2e::random_u32());
    let cw = CloudWatch::start();
    let spec = CloudWatchSinkSpec {
        namespace: cw.namespace("GpuInsights"),
        naming: Some(CloudWatchNaming::ContainerInsights),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    let config = node_config(vec![route("ops/ci", None, None, spec)]);
    let args = [
        "--nvml-library",
        lib.to_str().expect("utf-8 path"),
        "--cluster-name",
        "prod",
        "--node-name",
        node.as_str(),
        "--period",
        "1s",
    ];
    let yaml = fake_nvml_config(&dir);
    let sysfs = dir.0.join("sysfs");
    let kubeconfig = cp.kubeconfig.as_os_str();
    let env = [
        ("FAKE_NVML_CONFIG", yaml.as_os_str()),
        ("NEURON_AGENT_SYSFS_ROOT", sysfs.as_os_str()),
        ("KUBECONFIG", kubeconfig),
    ];
    let sim = ["--instance-type=trn1.2xlarge", "--app=tag=train,cores=0,util=80,rps=50"];
    let agent = support::cloudwatch::start_agent_with_env(&sim, &config, cw.addr(), &args, &env);
    agent.wait_for("reports and the GPU sink sending", Duration::from_secs(60), |m| {
        let sent = sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", "ops/ci", &[]);
        (sent > 0.0 && m.sum("neuron_agent_reports_total", &[]) > 2.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(2500));

    let metrics = list_metrics(&cw, "GpuInsights", &[]);
    let gpu_metrics: Vec<&Metric> =
        metrics.iter().filter(|m| m.metric_name().is_some_and(|n| n.starts_with("node_gpu_"))).collect();
    // No pod holds a GPU here: the node family, with every one of its sets.
    assert_eq!(node_gpu_sets(&metrics), catalogue_node_gpu_sets());
    assert!(!metrics.iter().any(|m| m.metric_name().is_some_and(|n| n.starts_with("pod_gpu_"))));
    for metric in &gpu_metrics {
        let name = metric.metric_name().unwrap_or_default();
        let unit = match name {
            n if n.ends_with("utilization") => "Percent",
            n if n.contains("memory") => "Bytes",
            _ => "None",
        };
        assert_eq!(units(&cw, metric), BTreeSet::from([unit.to_owned()]), "{metric:?}");
    }
    let finest = |device: &str| -> BTreeMap<String, String> {
        let m = gpu_metrics
            .iter()
            .find(|m| {
                m.metric_name() == Some("node_gpu_utilization")
                    && dimension_map(m).get("GpuDevice").map(String::as_str) == Some(device)
            })
            .unwrap_or_else(|| panic!("node_gpu_utilization of {device}"));
        dimension_map(m)
    };
    let m = agent.metrics();
    for (index, util, _, used, temp, power) in GPU_VALUES {
        let device = format!("nvidia{index}");
        let dims = finest(&device);
        assert_eq!((dims["ClusterName"].as_str(), dims["NodeName"].as_str()), ("prod", node.as_str()));
        assert!(!dims["InstanceId"].is_empty() && !dims["InstanceType"].is_empty(), "{dims:?}");
        let dims: Vec<(&str, &str)> = dims.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let total_bytes = dcgm(&m, "DCGM_FI_DEV_FB_TOTAL", index) * 1024.0 * 1024.0;
        for (name, want) in [
            ("node_gpu_utilization", f64::from(util)),
            ("node_gpu_memory_used", used as f64 * 1024.0 * 1024.0),
            ("node_gpu_memory_total", total_bytes),
            ("node_gpu_temperature", f64::from(temp)),
            ("node_gpu_power_draw", f64::from(power)),
        ] {
            for stat in ["Minimum", "Maximum"] {
                assert_eq!(statistic(&cw, "GpuInsights", name, &dims, stat), Some(want), "{name} of {device}");
            }
        }
        // One sample per GPU collection, not one per report as well (collections counted
        // after the samples were read: the agent goes on collecting).
        let samples = statistic(&cw, "GpuInsights", "node_gpu_utilization", &dims, "SampleCount").unwrap_or(0.0);
        let collections = agent.metrics().sum("neuron_agent_gpu_collections_total", &[]);
        assert!(samples >= 1.0 && samples <= collections, "{samples} samples of {collections} collections");
    }
}

/// A GPU-only node (no Neuron device, no report) whose Node object in the real API server
/// names its instance (`spec.providerID`, the instance-type, region and zone labels): the
/// GPU series on `/metrics` carry the instance labels, and Container Insights gets every
/// node set of the GPU families, those naming InstanceId and InstanceType included.
#[test]
fn a_gpu_only_node_takes_its_instance_from_its_node_object() {
    use api::crd::CloudWatchNaming;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{DeleteParams, PostParams};
    const INSTANCE: &str = "i-0123456789abcdef0";
    let lib = fake_nvml();
    let dir = support::TempDir::new("gpu-identity");
    std::fs::create_dir_all(dir.0.join("sysfs")).expect("an empty sysfs: no Neuron device");
    let cp = neuron_e2e::ControlPlane::shared();
    let rt = runtime();
    let node = format!("gpu-only-{:08x}", neuron_e2e::random_u32());
    let nodes: kube::Api<Node> = kube::Api::all(rt.block_on(cp.client()));
    let object: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node, "labels": {
            "node.kubernetes.io/instance-type": "g5.12xlarge",
            "topology.kubernetes.io/region": "us-west-2", "topology.kubernetes.io/zone": "us-west-2b"}},
        "spec": {"providerID": format!("aws:///us-west-2b/{INSTANCE}")}
    }))
    .expect("a Node");
    rt.block_on(nodes.create(&PostParams::default(), &object)).expect("create the Node");
    let cw = CloudWatch::start();
    let spec = CloudWatchSinkSpec {
        namespace: cw.namespace("GpuIdentity"),
        naming: Some(CloudWatchNaming::ContainerInsights),
        flush_interval: Some("1s".to_owned()),
        ..Default::default()
    };
    let config = node_config(vec![route("ops/ci", None, None, spec)]);
    let lib = lib.to_str().expect("utf-8 path");
    let args = ["--nvml-library", lib, "--cluster-name", "prod", "--node-name", &node, "--period", "1s"];
    let yaml = fake_nvml_config(&dir);
    let sysfs = dir.0.join("sysfs");
    let env = [
        ("FAKE_NVML_CONFIG", yaml.as_os_str()),
        ("NEURON_AGENT_SYSFS_ROOT", sysfs.as_os_str()),
        ("KUBECONFIG", cp.kubeconfig.as_os_str()),
        ("AWS_REGION", std::ffi::OsStr::new("us-west-2")),
    ];
    let agent = support::cloudwatch::start_agent_with_env(&[], &config, cw.addr(), &args, &env);
    let m = agent.wait_for("the instance labels on the GPU series", Duration::from_secs(60), |m| {
        m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0"), ("instance_id", INSTANCE)]).first().map(|_| m.clone())
    });
    let util = &m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")])[0].labels;
    let labels = ["instance_type", "availability_zone", "region"].map(|k| util.get(k).cloned().unwrap_or_default());
    assert_eq!(labels, ["g5.12xlarge", "us-west-2b", "us-west-2"].map(str::to_owned));
    assert_eq!(m.sum("neuron_agent_reports_total", &[]), 0.0, "no report on a GPU-only node");
    // A collection sampled after the identity was read, and a flush after it.
    let collections = m.sum("neuron_agent_gpu_collections_total", &[]);
    let m = agent.wait_for("two more GPU collections", Duration::from_secs(30), |m| {
        (m.sum("neuron_agent_gpu_collections_total", &[]) >= collections + 2.0).then(|| m.clone())
    });
    let sent = sink_value(&m, "neuron_agent_cloudwatch_datums_sent_total", "ops/ci", &[]);
    agent.wait_for("a flush after them", Duration::from_secs(30), |m| {
        (sink_value(m, "neuron_agent_cloudwatch_datums_sent_total", "ops/ci", &[]) > sent).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));

    let metrics = list_metrics(&cw, "GpuIdentity", &[]);
    let published = node_gpu_sets(&metrics);
    let expected = catalogue_node_gpu_sets();
    assert!(expected.iter().any(|(_, set)| set.contains("InstanceId")), "the catalogue names InstanceId sets");
    assert_eq!(published, expected, "every node set, InstanceId's and InstanceType's included");
    let with_id: Vec<BTreeMap<String, String>> =
        metrics.iter().map(dimension_map).filter(|d| d.contains_key("InstanceId")).collect();
    assert!(!with_id.is_empty());
    for d in &with_id {
        assert_eq!(d["InstanceId"], INSTANCE, "{d:?}");
        assert_eq!(d.get("InstanceType").map(String::as_str).unwrap_or("g5.12xlarge"), "g5.12xlarge", "{d:?}");
    }
    rt.block_on(nodes.delete(&node, &DeleteParams::default())).expect("delete the Node");
}
