//! CloudWatch across a fleet: the agent's CloudWatch sinks of 200 nodes, in one process,
//! started in the same instant (one config change reaching 200 nodes), against a counting
//! endpoint on 127.0.0.1. Each sink sends once per flush interval at a phase of its own,
//! and the phases spread over the interval: an account's PutMetricData rate stays smooth
//! instead of peaking once per interval.

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::{
    crd::CloudWatchSinkSpec,
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
    report::Report,
};
use neuron_node_agent::{
    delivery::backoff::Backoff,
    health::model::HealthModel,
    routing::{Routing, SharedRouting},
    sinks::cloudwatch::{select::AgentDimensions, telemetry::CloudWatchMetrics, Options, Sinks},
    state::NodeState,
};
use neuron_test_support::{fixture, IDLE_INF1};
use support::cloudwatch::{Arrival, CountingEndpoint};
use tokio_util::sync::CancellationToken;

const NODES: usize = 200;
const FLUSH: Duration = Duration::from_secs(4);
/// Intervals counted, after two of warm-up (the first holds each sink's first flush,
/// which also builds its SDK client: 200 at once keep a loaded machine busy).
const INTERVALS: u32 = 3;
const NAMESPACE_PREFIX: &str = "Fleet/Spread-";

/// Node `node`'s route: a CloudWatch namespace of its own, so that its requests can be
/// told apart.
fn node_config(node: usize) -> NodeConfig {
    let spec = CloudWatchSinkSpec {
        namespace: format!("{NAMESPACE_PREFIX}{node:05}"),
        region: Some("us-east-1".to_owned()),
        flush_interval: Some(format!("{}s", FLUSH.as_secs())),
        ..Default::default()
    };
    let route = Route {
        config: "neuron-monitor/fleet".to_owned(),
        namespace: None,
        runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: SystemGroup::ALL.to_vec(),
        prometheus: None,
        cloudwatch: Some(spec),
        otlp: None,
    };
    NodeConfig { monitor: Default::default(), routes: vec![route], health: None, gpu: None }
}

/// The node whose namespace the request's (CBOR) body names.
fn node_of(arrival: &Arrival) -> Option<usize> {
    let prefix = NAMESPACE_PREFIX.as_bytes();
    let at = arrival.body.windows(prefix.len()).position(|w| w == prefix)? + prefix.len();
    std::str::from_utf8(arrival.body.get(at..at + 5)?).ok()?.parse().ok()
}

/// Where in the interval a sink sends: of its requests' offsets into the interval, the
/// one nearest to the others on the circle of the interval (a median that one request
/// delayed by a stall of the machine does not move).
fn phase(offsets: &[f64], interval: f64) -> Option<f64> {
    let distance = |a: f64, b: f64| {
        let d = (a - b).rem_euclid(interval);
        d.min(interval - d)
    };
    offsets.iter().copied().min_by(|a, b| {
        let sum = |x: f64| offsets.iter().map(|o| distance(x, *o)).sum::<f64>();
        sum(*a).total_cmp(&sum(*b))
    })
}

#[test]
fn sinks_started_together_across_a_fleet_send_spread_over_the_interval() {
    let endpoint = CountingEndpoint::start();
    // Set before any thread of the runtime reads them.
    std::env::set_var("AWS_ENDPOINT_URL_CLOUDWATCH", format!("http://{}", endpoint.addr));
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let started = runtime.block_on(async {
        // Every node runs the same one-application inf1 report: one request per flush.
        let report = fixture(IDLE_INF1);
        let mut state = NodeState::default();
        state.apply(&Report::parse(&report).unwrap());
        let state = Arc::new(Mutex::new(state));
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = CloudWatchMetrics::register(&mut registry);
        let (reports, _) = tokio::sync::watch::channel(0u64);
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        for node in 0..NODES {
            let routing = SharedRouting::default();
            routing.replace(Routing::compile(&node_config(node)).unwrap());
            let sinks = Sinks {
                state: state.clone(),
                routing,
                reports: reports.subscribe(),
                options: Options {
                    agent: AgentDimensions { cluster_name: None, node_name: Some(format!("node-{node}")) },
                    queue_datums: 10_000,
                    backoff: Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(5) },
                    request_timeout: Duration::from_secs(10),
                    shutdown_timeout: Duration::from_secs(5),
                },
                metrics: metrics.clone(),
                health: Arc::new(Mutex::new(HealthModel::new("boot".to_owned(), Duration::from_secs(60)))),
            };
            tasks.push(tokio::spawn(sinks.run(shutdown.clone())));
        }
        // One report a second; the first starts every sink at once.
        let started = Instant::now();
        while started.elapsed() < FLUSH * (2 + INTERVALS) + Duration::from_millis(500) {
            reports.send_modify(|n| *n += 1);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        shutdown.cancel();
        for task in tasks {
            task.await.unwrap();
        }
        started
    });

    let from = started + FLUSH * 2;
    let window = FLUSH * INTERVALS;
    let counted: Vec<(usize, f64)> = endpoint
        .arrivals()
        .iter()
        .filter_map(|a| {
            let offset = a.at.checked_duration_since(from).filter(|o| *o < window)?;
            Some((node_of(a).expect("a request names its node's namespace"), offset.as_secs_f64()))
        })
        .collect();
    let mut per_second = vec![0usize; window.as_secs() as usize];
    let mut offsets: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (node, offset) in &counted {
        per_second[*offset as usize] += 1;
        offsets.entry(*node).or_default().push(offset.rem_euclid(FLUSH.as_secs_f64()));
    }
    let mut quarters = [0usize; 4];
    for node_offsets in offsets.values() {
        let p = phase(node_offsets, FLUSH.as_secs_f64()).unwrap_or_default();
        quarters[((p / FLUSH.as_secs_f64() * 4.0) as usize).min(3)] += 1;
    }
    let expected = NODES * INTERVALS as usize;
    println!(
        "{NODES} sinks, flush every {FLUSH:?}: {} requests in {} s (expected {expected}), per second {per_second:?}; \
         sinks by the quarter of the interval they send in: {quarters:?}",
        counted.len(),
        window.as_secs()
    );
    // Every sink sends, once per interval (a tick delayed on a loaded machine sends less).
    assert_eq!(offsets.len(), NODES, "sinks that sent in the window");
    assert!(
        counted.len() >= expected * 8 / 10 && counted.len() <= expected + NODES,
        "{} requests, expected {expected}",
        counted.len()
    );
    // Together, every sink would send in the same quarter. Spread, a quarter holds
    // Binomial(200, 1/4) sinks: 50 ± 6; 20 and 80 are 5 standard deviations away. A
    // stall of this process delays one interval's requests, which the median phase
    // leaves aside.
    assert!(quarters.iter().all(|q| (20..=80).contains(q)), "sinks by quarter: {quarters:?}");
    // Hence no second carries most of the fleet (50 a second on average; sent together,
    // about all 200).
    let busiest = per_second.iter().copied().max().unwrap_or(0);
    assert!(busiest <= NODES * 3 / 4, "{busiest} requests in one second: {per_second:?}");
}

#[test]
fn the_phase_of_a_sink_is_its_median_offset_on_the_circle() {
    assert_eq!(phase(&[1.0, 1.1, 1.2], 4.0), Some(1.1));
    // One request late: the phase stays with the others.
    assert_eq!(phase(&[1.0, 1.1, 2.9], 4.0), Some(1.1));
    // Around the end of the interval: 3.9 and 0.1 are neighbours.
    assert_eq!(phase(&[3.9, 0.1, 0.2], 4.0), Some(0.1));
    assert_eq!(phase(&[], 4.0), None);
}
