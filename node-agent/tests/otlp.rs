//! The OTLP sinks of the real agent binary, on the simulator: against a real Prometheus 3
//! receiving OTLP (the dashboard's PromQL answers as it does on the scraped series; two
//! teams' endpoints each get their own series), and against the test receiver of
//! `neuron_e2e::otlp` (the SigV4 signature recomputed from a known test key, the gzip
//! protobuf body decoded; faults retried and counted; the last snapshot on SIGTERM).

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use api::{
    crd::{CloudWatchSinkSpec, OtlpSinkSpec},
    duration::Period,
    monitor_config::{MonitorConfig, RuntimeGroup, SystemGroup},
    node_config::{NodeConfig, Route, RouteRuntimes},
};
use neuron_e2e::{
    otlp::{points, Answer, Receiver},
    prometheus::{Prometheus, Sample},
};
use support::{Agent, Metrics, TempDir};

const KEY_ID: &str = "AKIDOTLPTEST";
const SECRET_KEY: &str = "otlp/test/secret/key";
const SESSION_TOKEN: &str = "otlp-test-session-token";

fn otlp(endpoint: Option<&str>, region: Option<&str>, flush: &str) -> OtlpSinkSpec {
    OtlpSinkSpec {
        endpoint: endpoint.map(str::to_owned),
        region: region.map(str::to_owned),
        flush_interval: Some(flush.to_owned()),
        ..Default::default()
    }
}

/// A route taking every application of `namespace` (`None`: every application and the
/// node-level groups) with its OTLP sink.
fn route(config: &str, namespace: Option<&str>, otlp: OtlpSinkSpec) -> Route {
    Route {
        config: config.to_owned(),
        namespace: namespace.map(str::to_owned),
        runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
        system_groups: if namespace.is_none() { SystemGroup::ALL.to_vec() } else { vec![] },
        prometheus: Some(Default::default()),
        cloudwatch: None,
        otlp: Some(otlp),
    }
}

/// The agent on `routes` (a node configuration file), with static test credentials and
/// nothing of the machine's AWS setup.
fn start_agent(sim_args: &[&str], routes: Vec<Route>, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Agent {
    let period: Period = "1s".parse().expect("period");
    let config = NodeConfig { monitor: MonitorConfig::all_groups(period), routes, health: None, gpu: None };
    Agent::start_configured(support::sim(), sim_args, args, |command, state_dir| {
        let path = state_dir.join("node-config.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("json")).expect("write the node config");
        command
            .arg("--node-config-file")
            .arg(&path)
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_SESSION_TOKEN", SESSION_TOKEN)
            .env_remove("AWS_PROFILE")
            .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("KUBECONFIG");
        for (key, value) in env {
            command.env(key, value);
        }
    })
}

fn sink_value(m: &Metrics, name: &str, sink: &str, extra: &[(&str, &str)]) -> f64 {
    let mut labels = vec![("sink", sink)];
    labels.extend_from_slice(extra);
    m.sum(name, &labels)
}

/// A query's samples without the `instance` label (the scrape's is the target's address,
/// OTLP's the resource's `service.instance.id`), sorted.
fn normalized(samples: &[Sample]) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out: Vec<_> = samples
        .iter()
        .map(|(labels, value)| {
            let mut labels = labels.clone();
            labels.remove("instance");
            (labels, *value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    out
}

/// The same series (and with `values`, the same values: exactly, but for the last bits an
/// aggregation over series in another order may round differently); `Err` says how not.
fn same(otlp: &[Sample], scraped: &[Sample], values: bool) -> Result<(), String> {
    let (otlp, scraped) = (normalized(otlp), normalized(scraped));
    if scraped.is_empty() {
        return Err("no data scraped".into());
    }
    let labels = |s: &[(BTreeMap<String, String>, f64)]| s.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>();
    if labels(&otlp) != labels(&scraped) {
        return Err(format!("other series: {otlp:?} through OTLP, {scraped:?} scraped"));
    }
    for ((l, a), (_, b)) in otlp.iter().zip(&scraped) {
        if values && a != b && (a - b).abs() > 1e-12 * a.abs().max(b.abs()) {
            return Err(format!("{l:?}: {a} through OTLP, {b} scraped"));
        }
    }
    Ok(())
}

/// Polls both servers until `promql` answers the same on both (see [`same`]).
fn assert_same(otlp: &Prometheus, scraper: &Prometheus, promql: &str, values: bool, what: &str) {
    let started = Instant::now();
    loop {
        let (a, b) = (otlp.query(promql).expect(promql), scraper.query(promql).expect(promql));
        match same(&a, &b, values) {
            Ok(()) => return,
            Err(why) if started.elapsed() > Duration::from_secs(20) => panic!("{what}: {promql}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// `rate(x[w])` / `increase(x[w])` → `x`: the selector a range function reads.
fn inner_selectors(promql: &str) -> Vec<String> {
    let mut out = Vec::new();
    for function in ["rate(", "increase("] {
        let mut rest = promql;
        while let Some(i) = rest.find(function) {
            let after = &rest[i + function.len()..];
            if let Some(end) = after.find('[') {
                out.push(after[..end].to_owned());
            }
            rest = after;
        }
    }
    out
}

/// The agents' own metrics, which `/metrics` serves and OTLP does not carry (they
/// describe the agent, not the node): the dashboard queries that read them stay on the
/// scraped series.
const SCRAPED_ONLY: [&str; 7] = [
    "up",
    "neuron_agent_monitor_up",
    "neuron_agent_monitor_restarts_total",
    "neuron_agent_last_report_timestamp_seconds",
    "neuron_agent_lines_rejected_total",
    "neuron_agent_report_processing_seconds_bucket",
    "neuron_agent_health_source_up",
];

/// Two simulated nodes (a trn1 with ECC events and a device fault, an inf2 with a group
/// in error), each pushing to Prometheus 3's OTLP receiver (its default translation) and
/// scraped by Debian's Prometheus: once the simulators stopped, every dashboard query on
/// the node's telemetry returns the same series with the same values through OTLP as
/// through scraping.
#[test]
fn every_dashboard_query_answers_the_same_through_otlp_as_through_scraping() {
    let receiver = Prometheus::start_otlp_receiver("").expect("prometheus3");
    let url = receiver.otlp_url();
    let node = |dir: &TempDir, sim: &[&str]| {
        let (sys, kmsg) = (dir.0.join("sys"), dir.0.join("kmsg"));
        let sim_args: Vec<String> = sim
            .iter()
            .map(|a| (*a).to_owned())
            .chain([
                format!("--sysfs-root={}", sys.display()),
                format!("--kmsg={}", kmsg.display()),
                "--hang-after=8".into(),
            ])
            .collect();
        let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
        let args = [
            format!("--sysfs-root={}", sys.display()),
            format!("--kmsg-path={}", kmsg.display()),
            "--health-interval=1s".into(),
            // The simulator stops writing (and beating the devices' heartbeat): no restart.
            "--silence-timeout=1h".into(),
            "--heartbeat-timeout=1h".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_agent(&sim_args, vec![route("neuron-monitor/all", None, otlp(Some(&url), None, "1s"))], &args, &[])
    };
    let (dir_a, dir_b) = (TempDir::new("otlp-dash-a"), TempDir::new("otlp-dash-b"));
    let trn1 = node(
        &dir_a,
        &[
            "--instance-type=trn1.2xlarge",
            // An EFA device, so that the dashboard's EFA queries are compared too.
            "--efa-devices=1",
            "--app=tag=serve,cores=0,util=60,rps=50,errors=2",
            "--ecc-every=2",
            "--health-fault=hbm-ue:0@1s",
        ],
    );
    let inf2 = node(
        &dir_b,
        &["--instance-type=inf2.8xlarge", "--app=tag=train,cores=0-1,util=90,rps=10", "--group-error=vcpu_usage"],
    );
    let scrape = format!(
        "  - job_name: neuron-node-agent\n    static_configs:\n      - targets: ['{}', '{}']\n",
        trn1.addr, inf2.addr
    );
    let scraper = Prometheus::start(&scrape).expect("prometheus");

    // Both simulators stopped, and both Prometheus servers hold what the agents hold.
    let mut totals = 0.0;
    for agent in [&trn1, &inf2] {
        agent.wait_for("eight reports applied", Duration::from_secs(60), |m| {
            (m.sum("neuron_agent_reports_total", &[]) >= 8.0).then_some(())
        });
        // A page rendered while the eighth report was applied can show its count but the
        // seventh's values; a page asked for afterwards holds the last report's.
        totals += agent.metrics().sum("execution_status_total", &[]);
    }
    assert!(totals > 0.0);
    let settled = |p: &Prometheus| {
        p.wait_for("sum(execution_status_total)", Duration::from_secs(60), |r| {
            (r.first().map(|s| s.1) == Some(totals)).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    };
    settled(&scraper);
    settled(&receiver);

    let names = |p: &Prometheus| -> BTreeSet<String> {
        let groups = p.query("group by (__name__) ({__name__!=\"\"})").expect("names");
        groups.into_iter().filter_map(|(labels, _)| labels.get("__name__").cloned()).collect()
    };
    let (scraped, sent) = (names(&scraper), names(&receiver));
    let dashboard = neuron_e2e::dashboard::load();
    let mut scraped_only = BTreeSet::new();
    let mut compared = 0;
    let mut kubelet_only = 0;
    for (title, expr) in neuron_e2e::dashboard::queries(&dashboard) {
        let promql = neuron_e2e::dashboard::expand(&expr);
        if neuron_e2e::dashboard::needs_kubelet(&promql) {
            kubelet_only += 1; // these agents have no kubelet: nothing to compare
            continue;
        }
        // The metrics it reads that OTLP does not carry: its words that name a scraped
        // metric, or one of the agent's own (some exist only once counted).
        let words = promql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        let own = |w: &str| scraped.contains(w) || w.starts_with("neuron_agent_");
        let missing: Vec<String> = words.filter(|w| own(w) && !sent.contains(*w)).map(str::to_owned).collect();
        if !missing.is_empty() {
            scraped_only.extend(missing);
            continue;
        }
        // Rates depend on when samples were taken: for them the same series, and the
        // same values of the counters underneath.
        let inner = inner_selectors(&promql);
        assert_same(&receiver, &scraper, &promql, inner.is_empty(), &title);
        for selector in inner {
            assert_same(&receiver, &scraper, &selector, true, &title);
        }
        compared += 1;
    }
    assert!(compared >= 20, "{compared} queries compared");
    assert!(kubelet_only >= 3, "{kubelet_only} allocation queries");
    let expected: BTreeSet<String> = SCRAPED_ONLY.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(scraped_only, expected, "queries left to the scraped series");
    eprintln!(
        "{compared} dashboard queries answer the same through OTLP; {} metrics are scraped only",
        scraped_only.len()
    );
}

/// Two teams' applications on one node, attributed to their pods through the real API
/// server, a test kubelet and a fake /proc, each team's config with its own endpoint (a
/// Prometheus 3 each): each receives its own pods' series and the node's description,
/// nothing of the other team and no node-level series.
#[test]
fn two_teams_with_two_endpoints_each_receive_only_their_own_series() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let teams = support::kubelet::TwoTeams::start(&rt, "otlp", 4300);
    let (a, b, node) = (&teams.a, &teams.b, &teams.node);
    let (receiver_a, receiver_b) = (
        Prometheus::start_otlp_receiver("").expect("prometheus3"),
        Prometheus::start_otlp_receiver("").expect("prometheus3"),
    );
    let routes = vec![
        route(&format!("{a}/otlp"), Some(a), otlp(Some(&receiver_a.otlp_url()), None, "1s")),
        route(&format!("{b}/otlp"), Some(b), otlp(Some(&receiver_b.otlp_url()), None, "1s")),
    ];
    let (sim, args) = (teams.sim_args(), teams.agent_args());
    let sim: Vec<&str> = sim.iter().map(String::as_str).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = neuron_e2e::ControlPlane::shared().kubeconfig.as_os_str();
    let agent = start_agent(&sim, routes, &args, &[("KUBECONFIG", kubeconfig)]);

    for (receiver, ns, pod, busy, idle, other) in
        [(&receiver_a, a, "train", ("0", 0.8), Some("3"), b), (&receiver_b, b, "serve", ("4", 0.5), Some("5"), a)]
    {
        let core =
            |c: &str| format!("neuroncore_utilization_ratio{{namespace=\"{ns}\",pod=\"{pod}\",neuroncore=\"{c}\"}}");
        receiver
            .wait_for(&core(busy.0), Duration::from_secs(60), |r| {
                (r.first().map(|s| s.1) == Some(busy.1)).then_some(())
            })
            .unwrap_or_else(|e| panic!("{e:#}"));
        if let Some(idle) = idle {
            // A core its pod holds and does not use: 0, on the team's endpoint.
            let r = receiver
                .wait_for(&core(idle), Duration::from_secs(30), |r| (!r.is_empty()).then(|| r.to_vec()))
                .unwrap();
            assert_eq!(r[0].1, 0.0, "{ns}: idle core {idle}");
        }
        let names_by_namespace = receiver.query("group by (__name__, namespace) ({__name__=~\".+\"})").unwrap();
        let mut namespaces = BTreeSet::new();
        for (labels, _) in &names_by_namespace {
            let name = labels.get("__name__").cloned().unwrap_or_default();
            if name == "target_info" {
                continue;
            }
            match labels.get("namespace") {
                Some(n) => {
                    namespaces.insert(n.clone());
                }
                // The node its pods run on, described; nothing else without a pod.
                None => assert!(
                    ["instance_info", "neuron_hardware_info", "neuroncore_peak_flops"].contains(&name.as_str()),
                    "{ns}: {name}"
                ),
            }
        }
        assert_eq!(namespaces, BTreeSet::from([ns.clone()]), "{ns} receives only its own namespace");
        assert!(!namespaces.contains(other));
        for node_level in
            ["system_vcpu_count", "hardware_ecc_events_total", "neuron_device_health_state", "neuron_agent_group_error"]
        {
            assert!(receiver.query(node_level).unwrap().is_empty(), "{ns}: {node_level}");
        }
        // The resources: the team's pod, on this node.
        let targets = receiver.query("target_info").unwrap();
        assert!(targets.iter().all(|(l, _)| l.get("k8s_namespace_name").is_none_or(|n| n == ns)), "{targets:?}");
        assert!(targets.iter().any(|(l, _)| l.get("k8s_pod_name").map(String::as_str) == Some(pod)), "{targets:?}");
        assert!(targets.iter().all(|(l, _)| l.get("k8s_node_name") == Some(node)), "{targets:?}");
    }
    let m = agent.metrics();
    for sink in [format!("{a}/otlp"), format!("{b}/otlp")] {
        assert!(sink_value(&m, "neuron_agent_otlp_points_sent_total", &sink, &[]) > 0.0, "{sink}");
        assert_eq!(sink_value(&m, "neuron_agent_otlp_failures_total", &sink, &[]), 0.0, "{sink}");
    }
}

/// `YYYYMMDDTHHMMSSZ` (X-Amz-Date) as a time.
fn amz_date(text: &str) -> SystemTime {
    let n = |range: std::ops::Range<usize>| -> i64 { text[range].parse().expect("a number") };
    let (y, mo, d, h, mi, s) = (n(0..4), n(4..6), n(6..8), n(9..11), n(11..13), n(13..15));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    UNIX_EPOCH + Duration::from_secs((days * 86_400 + h * 3600 + mi * 60 + s) as u64)
}

/// The signature SigV4 gives this request with the test key, its signed headers and
/// the time it names.
fn expected_signature(received: &neuron_e2e::otlp::Received, url: &str, body: &[u8]) -> String {
    use aws_sigv4::{
        http_request::{sign, SignableBody, SignableRequest, SigningSettings},
        sign::v4,
    };
    let authorization = &received.headers["authorization"];
    let signed: Vec<&str> = authorization
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .expect("SignedHeaders")
        .split(';')
        .collect();
    // The signer adds these itself, from the time and the credentials.
    let headers: Vec<(&str, &str)> = signed
        .iter()
        .filter(|h| !["x-amz-date", "x-amz-security-token", "host"].contains(*h))
        .map(|h| (*h, received.headers[*h].as_str()))
        .collect();
    let credentials =
        aws_credential_types::Credentials::new(KEY_ID, SECRET_KEY, Some(SESSION_TOKEN.to_owned()), None, "test");
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-west-2")
        .name("monitoring")
        .time(amz_date(&received.headers["x-amz-date"]))
        .settings(SigningSettings::default())
        .build()
        .expect("signing params")
        .into();
    let signable = SignableRequest::new("POST", url, headers.into_iter(), SignableBody::Bytes(body)).expect("signable");
    let (_, signature) = sign(signable, &params).expect("sign").into_parts();
    signature
}

/// A sink without `endpoint` sends to CloudWatch's OTLP endpoint of its region (here the
/// test receiver, through `--otlp-cloudwatch-endpoint`): each request is a gzip protobuf
/// export request signed with SigV4 for `monitoring` in that region, with the
/// credential chain's (static test) key, and the signature covers the body.
#[test]
fn cloudwatch_requests_are_sigv4_signed_gzip_protobuf() {
    let receiver = Receiver::start().expect("receiver");
    let url = receiver.url("/v1/metrics");
    let endpoint = format!("--otlp-cloudwatch-endpoint={url}");
    let agent = start_agent(
        &["--instance-type=trn1.2xlarge", "--app=tag=serve,cores=0,util=60,rps=50"],
        vec![route("neuron-monitor/cw", None, otlp(None, Some("us-west-2"), "1s"))],
        &[endpoint.as_str()],
        &[],
    );
    let received = receiver
        .wait_for("a request with data", Duration::from_secs(60), |r| r.iter().find(|r| !r.body.is_empty()).cloned())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!((received.method.as_str(), received.path.as_str()), ("POST", "/v1/metrics"));
    assert_eq!(received.headers["content-type"], "application/x-protobuf");
    assert_eq!(received.headers["content-encoding"], "gzip");
    assert!(received.headers["user-agent"].starts_with("neuron-node-agent/"));
    assert_eq!(received.headers["x-amz-security-token"], SESSION_TOKEN);

    let authorization = &received.headers["authorization"];
    let date = &received.headers["x-amz-date"][..8];
    let scope = format!("Credential={KEY_ID}/{date}/us-west-2/monitoring/aws4_request");
    assert!(authorization.starts_with("AWS4-HMAC-SHA256 ") && authorization.contains(&scope), "{authorization}");
    let signature = authorization.rsplit("Signature=").next().expect("a signature");
    assert_eq!(expected_signature(&received, &url, &received.body), signature, "{authorization}");
    // The body is signed: another body, another signature.
    let mut tampered = received.body.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert_ne!(expected_signature(&received, &url, &tampered), signature);

    let request = received.decode().expect("a gzip ExportMetricsServiceRequest");
    let points = points(&request);
    let util = points.iter().find(|p| {
        p.name == "neuroncore_utilization_ratio" && p.attributes.get("runtime_tag").map(String::as_str) == Some("serve")
    });
    let util = util.expect("the application's utilization");
    assert_eq!(util.value, 0.6);
    assert_eq!(util.resource.get("cloud.region").map(String::as_str), Some("us-west-2"));
    assert_eq!(util.resource.get("service.name").map(String::as_str), Some("neuron-node-agent"));
    let status = points.iter().find(|p| p.name == "execution_status_total").expect("a counter");
    assert!(status.counter && status.start_time_unix_nano > 0);
    drop(agent);
}

/// Throttling (with Retry-After), a 5xx and a stall are retried and counted, a partial
/// success's rejected points are counted, and nothing of it holds up `/metrics`; a sink
/// with an unusable endpoint, or a region in another AWS partition than the instance's,
/// is left out and counted while the other runs. On SIGTERM a
/// sink whose next flush is an hour away still sends its last snapshot.
#[test]
fn faults_are_retried_and_counted_and_sigterm_sends_the_last_snapshot() {
    let receiver = Receiver::start().expect("receiver");
    receiver.script([
        Answer::Status(429, vec![("Retry-After".into(), "1".into())]),
        Answer::Status(503, vec![]),
        Answer::Stall(Duration::from_secs(3)),
        Answer::Partial { rejected: 3, message: "3 points too old".into() },
    ]);
    let url = receiver.url("/v1/metrics");
    let agent = start_agent(
        &["--instance-type=trn1.2xlarge", "--app=tag=serve,cores=0,util=60,rps=50"],
        vec![
            route("team-a/otlp", None, otlp(Some(&url), None, "1s")),
            route("team-b/broken", None, otlp(Some("ftp://collector/v1/metrics"), None, "1s")),
            // CloudWatch's endpoint in another partition than the simulator's us-west-2.
            route("team-c/gov", None, otlp(None, Some("us-gov-west-1"), "1s")),
        ],
        &["--otlp-request-timeout=1s", "--otlp-retry-initial=50ms", "--otlp-retry-max=2s"],
        &[],
    );
    let sink = "team-a/otlp";
    let m = agent.wait_for("the faults handled", Duration::from_secs(60), |m| {
        let failures = |reason| sink_value(m, "neuron_agent_otlp_failures_total", sink, &[("reason", reason)]);
        let sent = sink_value(m, "neuron_agent_otlp_requests_total", sink, &[("result", "success")]);
        let partial = sink_value(m, "neuron_agent_otlp_dropped_points_total", sink, &[("reason", "partial_success")]);
        (failures("throttled") == 1.0
            && failures("server_error") == 1.0
            && failures("timeout") == 1.0
            && sent >= 2.0
            && partial == 3.0)
            .then(|| m.clone())
    });
    assert_eq!(sink_value(&m, "neuron_agent_otlp_invalid_sinks", "team-b/broken", &[("reason", "endpoint")]), 1.0);
    assert_eq!(sink_value(&m, "neuron_agent_otlp_points_sent_total", "team-b/broken", &[]), 0.0);
    assert_eq!(sink_value(&m, "neuron_agent_otlp_invalid_sinks", "team-c/gov", &[("reason", "partition")]), 1.0);
    assert_eq!(sink_value(&m, "neuron_agent_otlp_requests_total", "team-c/gov", &[]), 0.0);
    assert!(sink_value(&m, "neuron_agent_otlp_points_sent_total", sink, &[]) > 0.0);
    assert_eq!(sink_value(&m, "neuron_agent_otlp_dropped_points_total", sink, &[("reason", "rejected")]), 0.0);
    let received = receiver.received();
    // The request after the 429 waited for its Retry-After.
    let gap = received[1].at.duration_since(received[0].at);
    assert!(gap >= Duration::from_millis(900), "retried {gap:?} after a Retry-After of 1 s");
    // Every attempt of the first request carried the same bytes.
    assert!(received[..4].iter().all(|r| r.body == received[0].body));
    drop(agent);

    // SIGTERM: the last snapshot goes out, within the shutdown time limit.
    let last = Receiver::start().expect("receiver");
    let mut agent = start_agent(
        &["--instance-type=trn1.2xlarge", "--app=tag=serve,cores=0,util=60,rps=50"],
        vec![route("ops/hourly", None, otlp(Some(&last.url("/v1/metrics")), None, "1h"))],
        &["--otlp-shutdown-timeout=5s"],
        &[],
    );
    agent.wait_for("two reports", Duration::from_secs(30), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 2.0).then_some(())
    });
    let before = last.received().len();
    let asked = Instant::now();
    let status = agent.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let after = last.received();
    assert!(after.len() > before, "no request after SIGTERM");
    let final_request = after.last().expect("a request").decode().expect("a request");
    assert!(points(&final_request).iter().any(|p| p.name == "neuroncore_utilization_ratio"));
    eprintln!("SIGTERM → exit with the last snapshot sent: {:?}", asked.elapsed());
}

/// Peak resident memory of a process so far, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number")
}

/// Issue 24, fault 8: an accepted OTLP request whose answer (a partial success) is over
/// 64 KiB is not read: its points count as unconfirmed, not as sent nor as rejected.
#[test]
fn an_oversized_partial_success_is_counted_unconfirmed() {
    let receiver = Receiver::start().expect("receiver");
    receiver.script([Answer::Partial { rejected: 3, message: "x".repeat(100 * 1024) }]);
    let agent = start_agent(
        &["--instance-type=trn1.2xlarge", "--app=tag=serve,cores=0,util=60,rps=50"],
        vec![route("team-a/otlp", None, otlp(Some(&receiver.url("/v1/metrics")), None, "1s"))],
        &[],
        &[],
    );
    let sink = "team-a/otlp";
    let m = agent.wait_for("a second request answered", Duration::from_secs(30), |m| {
        (sink_value(m, "neuron_agent_otlp_requests_total", sink, &[("result", "success")]) >= 2.0).then(|| m.clone())
    });
    let first = receiver.received()[0].decode().expect("a request");
    let unconfirmed = sink_value(&m, "neuron_agent_otlp_unconfirmed_points_total", sink, &[]);
    assert_eq!(unconfirmed, points(&first).len() as f64, "the first request's points");
    assert_eq!(sink_value(&m, "neuron_agent_otlp_dropped_points_total", sink, &[("reason", "partial_success")]), 0.0);
    assert!(sink_value(&m, "neuron_agent_otlp_points_sent_total", sink, &[]) > 0.0, "the second request's");
    assert!(!receiver.received()[1].body.is_empty());
}

/// Issue 24, fault 8: a CloudWatch endpoint answering 200 with a body that never ends (1
/// GiB here) is read 64 KiB at most: the agent stays small, the datums count as
/// unconfirmed (not sent again), and an error status with such a body is retried.
#[test]
fn a_cloudwatch_answer_without_end_is_not_read() {
    let receiver = Receiver::start().expect("receiver");
    receiver.script([Answer::Filler { status: 500, bytes: 1 << 30 }, Answer::Filler { status: 200, bytes: 1 << 30 }]);
    let cloudwatch = CloudWatchSinkSpec {
        namespace: "Test/AnswerBounds".into(),
        flush_interval: Some("1s".into()),
        ..Default::default()
    };
    let route = Route { cloudwatch: Some(cloudwatch), otlp: None, ..route("ops/cw", None, otlp(None, None, "1s")) };
    let endpoint = receiver.url("");
    let agent = start_agent(
        &["--instance-type=trn1.2xlarge", "--app=tag=serve,cores=0,util=60,rps=50"],
        vec![route],
        &["--cloudwatch-retry-initial=50ms"],
        &[("AWS_ENDPOINT_URL_CLOUDWATCH", std::ffi::OsStr::new(endpoint.trim_end_matches('/')))],
    );
    let sink = "ops/cw";
    let value = |m: &Metrics, name: &str, extra: &[(&str, &str)]| sink_value(m, name, sink, extra);
    let m = agent.wait_for("the unconfirmed datums", Duration::from_secs(30), |m| {
        (value(m, "neuron_agent_cloudwatch_unconfirmed_datums_total", &[]) > 0.0).then(|| m.clone())
    });
    let too_large = value(&m, "neuron_agent_cloudwatch_failures_total", &[("reason", "response_too_large")]);
    assert_eq!(too_large, 2.0, "the 500 (retried) and the 200 (not sent again)");
    assert_eq!(value(&m, "neuron_agent_cloudwatch_dropped_datums_total", &[("reason", "rejected")]), 0.0);
    let received = receiver.received();
    assert!(received.len() >= 2 && received[0].body == received[1].body, "the 500's request sent again");
    let peak = peak_rss_kib(agent.child.id());
    assert!(peak < 300 * 1024, "peak RSS {peak} KiB");
    eprintln!("peak RSS with two 1 GiB answers: {} MiB", peak / 1024);
}

/// The figure of docs/performance.md from the real agent: what one flush of the operator
/// namespace's config (every group, the health series) sends for a simulated
/// trn1.32xlarge with 32 applications, one per core, and its 8 EFA devices, as the
/// agent counts it.
/// `cargo test -p neuron-node-agent --test otlp -- a_32_application_node --nocapture`
#[test]
fn a_32_application_node_sends_one_request_per_flush() {
    let receiver = Receiver::start().expect("receiver");
    let dir = TempDir::new("otlp-32");
    let sysfs_root = format!("--sysfs-root={}", dir.0.join("sys").display());
    let mut sim = vec!["--instance-type=trn1.32xlarge".to_owned(), "--hang-after=4".to_owned(), sysfs_root.clone()];
    sim.extend((0..32).map(|i| format!("--app=tag=app-{i:02},cores={i},util={},rps=10", 10 + i)));
    let sim: Vec<&str> = sim.iter().map(String::as_str).collect();
    let agent = start_agent(
        &sim,
        vec![route("neuron-monitor/all", None, otlp(Some(&receiver.url("/v1/metrics")), None, "1s"))],
        &["--silence-timeout=1h", &sysfs_root],
        &[],
    );
    let sink = "neuron-monitor/all";
    let m = agent.wait_for("four reports and three flushes after them", Duration::from_secs(60), |m| {
        let reports = m.sum("neuron_agent_reports_total", &[]);
        let sent = sink_value(m, "neuron_agent_otlp_requests_total", sink, &[("result", "success")]);
        (reports >= 4.0 && sent >= 8.0).then(|| m.clone())
    });
    let flushes = sink_value(&m, "neuron_agent_otlp_flushes_total", sink, &[]);
    let requests = sink_value(&m, "neuron_agent_otlp_requests_total", sink, &[("result", "success")]);
    let sent_points = sink_value(&m, "neuron_agent_otlp_points_sent_total", sink, &[]);
    let bytes = |encoding| sink_value(&m, "neuron_agent_otlp_sent_bytes_total", sink, &[("encoding", encoding)]);
    // The last request: a flush of the whole node after the simulator stopped.
    let last = receiver.received().last().cloned().expect("a request");
    let last_flush = points(&last.decode().expect("a request"));
    let last_points = last_flush.len();
    let efa_points = last_flush.iter().filter(|p| p.name.starts_with("efa_")).count();
    eprintln!(
        "{flushes} flushes, {requests} requests, {sent_points} points, {} bytes raw, {} bytes gzip; the last flush: \
         {last_points} points ({efa_points} EFA), {} bytes gzip",
        bytes("raw"),
        bytes("gzip"),
        last.body.len()
    );
    assert!(requests <= flushes, "one request per flush: {requests} for {flushes}");
    assert!(last_points > 1000, "{last_points} points");
    // The EFA devices' counters ride along (8 devices on a trn1.32xlarge).
    let efa_devices: BTreeSet<&String> = last_flush
        .iter()
        .filter(|p| p.name == "efa_tx_bytes_total")
        .filter_map(|p| p.attributes.get("efa_device"))
        .collect();
    assert_eq!(efa_devices.len(), 8, "{efa_devices:?}");
}
