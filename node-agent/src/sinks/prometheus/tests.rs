use super::*;
use crate::{
    routing::Routing,
    testdata::{fixture, IDLE_INF1, TRN1N_32, TRN1_ERRORS},
};
use api::report::Report;

fn exposition(lines: &[String]) -> Exposition {
    exposition_with(lines, SharedRouting::default())
}

fn exposition_with(lines: &[String], routing: SharedRouting) -> Exposition {
    let mut state = NodeState::default();
    for line in lines {
        state.apply(&Report::parse(line).unwrap());
    }
    // As attribution sets it on a node whose kubelet says what can be allocated.
    let counts = crate::state::CoreAllocation { allocatable: 2, allocated: 1, allocated_idle: 1 };
    state.allocation = Some(crate::state::AllocationState {
        cores: counts,
        devices_allocatable: 1,
        devices_allocated: 1,
        devices: vec![(0, counts)],
        pods: Vec::new(),
    });
    Exposition::new(Registry::default(), Arc::new(Mutex::new(state)), Default::default(), routing)
}

/// One configuration taking everything, with the loaded models' info series.
fn with_model_info() -> SharedRouting {
    let config = api::node_config::NodeConfig {
        routes: vec![api::node_config::Route {
            config: "ops/all".into(),
            runtimes: vec![api::node_config::RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
            system_groups: SystemGroup::ALL.to_vec(),
            prometheus: Some(api::node_config::PrometheusRoute { loaded_model_info: true, ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let routing = SharedRouting::default();
    routing.replace(Routing::compile(&config).unwrap());
    routing
}

fn series<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .collect()
}

#[test]
fn exactly_one_core_series_per_runtime_on_the_32_runtime_fixture() {
    let text = exposition(&[fixture(TRN1N_32)]).render(Format::Classic).unwrap();
    let cores = series(&text, "neuroncore_utilization_ratio");
    assert_eq!(cores.len(), 32, "{cores:#?}");
    let busy: Vec<&&str> = cores.iter().filter(|l| l.contains(r#"runtime_tag="538""#)).collect();
    assert_eq!(busy.len(), 1);
    assert!(busy[0].contains(r#"neuroncore="1""#) && busy[0].ends_with(" 0.01"), "{}", busy[0]);
    assert_eq!(series(&text, "neuroncore_memory_usage_tensors").len(), 32);
    assert!(text.contains(r#"memory_location="None""#));
    assert!(text.contains(r#"instance_type="trn1n.32xlarge""#));
    assert_eq!(series(&text, "neuron_hardware_info").len(), 1);
    // The counts, then the newer fields this report has (not the type, memory size, LNC).
    assert!(
        text.contains(
            r#"neuron_device_count="16",neuroncore_per_device_count="2",neuron_device_version="v2",neuroncore_version="v2"} 1"#
        ),
        "{text}"
    );
}

#[test]
fn classic_format_names_counters_and_info_as_prometheus_expects() {
    let text = exposition(&[fixture(TRN1_ERRORS)]).render(Format::Classic).unwrap();
    assert!(text.contains("# TYPE execution_errors_total counter\n"));
    assert!(text.contains("# TYPE execution_status_total counter\n"));
    assert!(text.contains("# TYPE instance_info gauge\n"));
    assert!(text.contains("# TYPE neuron_hardware_info gauge\n"));
    assert!(text.contains("# HELP hardware_ecc_events_total "));
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    let generic =
        series(&text, "execution_errors_total").into_iter().find(|l| l.contains(r#"error_type="generic""#)).unwrap();
    assert!(generic.ends_with(" 23654.0"), "{generic}");
    assert_eq!(series(&text, "execution_latency_seconds").len(), 7);
    let device = series(&text, "execution_device_latency_seconds");
    assert_eq!(device.len(), 7);
    let p50 = device.iter().find(|l| l.contains(r#"percentile="p50""#)).unwrap();
    assert!(p50.ends_with(" 0.000095367431640625"), "{p50}");
    assert_eq!(series(&text, "system_vcpu_count").len(), 1);
}

#[test]
fn openmetrics_format_when_asked() {
    let text = exposition(&[fixture(TRN1_ERRORS)]).render(Format::OpenMetrics).unwrap();
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains("# TYPE execution_errors counter\n"));
    assert!(text.contains("# TYPE instance info\n"));
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")),
        Format::OpenMetrics
    );
    assert_eq!(Format::negotiate(Some("text/plain")), Format::Classic);
    assert_eq!(Format::negotiate(None), Format::Classic);
}

#[test]
fn an_idle_node_still_shows_its_hardware_and_idle_cores() {
    let text = exposition(&[fixture(IDLE_INF1)]).render(Format::Classic).unwrap();
    let cores = series(&text, "neuroncore_utilization_ratio");
    assert_eq!(cores.len(), 4);
    assert!(cores.iter().all(|l| !l.contains("runtime_tag") && l.ends_with(" 0.0")), "{cores:#?}");
    assert!(text.contains("system_vcpu_count{"));
    assert_eq!(series(&text, "neuron_hardware_info").len(), 1);
    assert_eq!(series(&text, "instance_info").len(), 1);
    assert_eq!(series(&text, "execution_latency_seconds").len(), 0, "null latency stays absent");
    assert_eq!(series(&text, "execution_device_latency_seconds").len(), 0);
}

#[test]
fn a_group_in_error_is_visible_and_not_zero() {
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "neuron_runtime_vcpu_usage":{"period":1.0,"error":"open /proc/7/stat: no such file or directory"}}}],
        "instance_info":{"instance_id":"i-1","error":""},
        "neuron_hardware_info":{"neuron_device_count":1,"neuroncore_per_device_count":2,"error":""}}"#;
    let text = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    assert_eq!(series(&text, "neuron_runtime_vcpu_usage_ratio").len(), 0);
    let errors = series(&text, "neuron_agent_group_error");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].contains(r#"group="neuron_runtime_vcpu_usage",runtime_tag="x",kind="monitor"} 1"#),
        "{}",
        errors[0]
    );
}

#[test]
fn nothing_but_self_metrics_before_the_first_report() {
    let text = exposition(&[]).render(Format::Classic).unwrap();
    assert!(!text.contains("instance_info"));
    assert!(!text.contains("neuroncore_utilization_ratio"));
}

#[test]
fn classic_conversion_is_line_exact() {
    let open = "# HELP a_b Help text.\n# TYPE a_b counter\na_b_total{x=\"1\"} 2\n# HELP i Info.\n# TYPE i info\ni_info{v=\"1\"} 1\n# HELP g G.\n# TYPE g gauge\n# UNIT g seconds\ng 1.5\n# EOF\n";
    assert_eq!(
        openmetrics_to_classic(open),
        "# HELP a_b_total Help text.\n# TYPE a_b_total counter\na_b_total{x=\"1\"} 2\n# HELP i_info Info.\n# TYPE i_info gauge\ni_info{v=\"1\"} 1\n# HELP g G.\n# TYPE g gauge\ng 1.5\n"
    );
}

#[test]
fn pod_labels_go_on_runtime_series_and_on_idle_cores_a_pod_holds() {
    use crate::state::PodRef;
    let mut state = NodeState::default();
    state.apply(&Report::parse(&fixture(IDLE_INF1)).unwrap());
    let pod = Arc::new(PodRef {
        namespace: "team-a".into(),
        pod: "train-0".into(),
        owner: "train".into(),
        container: "main".into(),
        labels: vec![("label_app".into(), "train".into()), ("team".into(), "pod".into())],
    });
    for rt in &mut state.runtimes {
        Arc::make_mut(&mut rt.labels).pod = Some(pod.clone());
    }
    let idle = state.idle_cores.first().map(|c| c.index).expect("an idle core");
    state.idle_cores[0].pod = Some(pod.clone());
    // A configuration label named like a pod label wins.
    let config = api::node_config::NodeConfig {
        monitor: Default::default(),
        routes: vec![api::node_config::Route {
            config: "ops/all".into(),
            namespace: None,
            runtimes: vec![api::node_config::RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
            system_groups: vec![],
            prometheus: Some(api::node_config::PrometheusRoute {
                extra_labels: BTreeMap::from([("team".to_owned(), "config".to_owned())]),
                loaded_model_info: false,
            }),
            cloudwatch: None,
            otlp: None,
        }],
        health: None,
        gpu: None,
    };
    let routing = SharedRouting::default();
    routing.replace(Routing::compile(&config).unwrap());
    let text = Exposition::new(Registry::default(), Arc::new(Mutex::new(state)), Default::default(), routing)
        .render(Format::Classic)
        .unwrap();
    let pod_labels = r#"namespace="team-a",pod="train-0",container="main",label_app="train""#;
    let runtime_series = series(&text, "execution_status_total");
    assert!(!runtime_series.is_empty());
    for line in runtime_series {
        assert!(line.contains(pod_labels) && line.contains(r#"team="config""#), "{line}");
        assert!(!line.contains(r#"team="pod""#), "{line}");
    }
    let cores = series(&text, "neuroncore_utilization_ratio");
    let idle_line = cores.iter().find(|l| l.contains(&format!(r#"neuroncore="{idle}""#))).unwrap();
    assert!(idle_line.contains(pod_labels) && !idle_line.contains("runtime_tag"), "{idle_line}");
    assert!(idle_line.contains(r#"team="pod""#), "no configuration label on a node series: {idle_line}");
    let other_idle = cores.iter().filter(|l| !l.contains("runtime_tag") && !l.contains("namespace=")).count();
    assert!(other_idle > 0, "idle cores no pod holds keep no pod labels");
}

#[test]
fn extra_labels_beyond_the_cap_are_left_off_and_counted() {
    use api::limits::MAX_EXTRA_LABELS_PER_SERIES;
    let mut state = NodeState::default();
    state.apply(&Report::parse(&fixture(TRN1N_32)).unwrap());
    // 60 configurations matching every runtime, 16 labels each.
    let routes = (0..60)
        .map(|c| api::node_config::Route {
            config: format!("team/c{c:02}"),
            namespace: None,
            runtimes: vec![api::node_config::RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
            system_groups: vec![],
            prometheus: Some(api::node_config::PrometheusRoute {
                extra_labels: (0..16).map(|l| (format!("c{c:02}_l{l:02}"), "v".to_owned())).collect(),
                loaded_model_info: false,
            }),
            cloudwatch: None,
            otlp: None,
        })
        .collect();
    let routing = SharedRouting::default();
    routing.replace(
        Routing::compile(&api::node_config::NodeConfig {
            monitor: Default::default(),
            routes,
            health: None,
            gpu: None,
        })
        .unwrap(),
    );
    let text = Exposition::new(Registry::default(), Arc::new(Mutex::new(state)), Default::default(), routing)
        .render(Format::Classic)
        .unwrap();
    for line in series(&text, "execution_status_total") {
        assert_eq!(line.matches("=\"v\"").count(), MAX_EXTRA_LABELS_PER_SERIES, "{line}");
    }
    let dropped = series(&text, "neuron_agent_extra_labels_dropped");
    assert_eq!(dropped.len(), 1);
    let expected = (60 * 16 - MAX_EXTRA_LABELS_PER_SERIES) * 32;
    let value: f64 = dropped[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(value, expected as f64, "{}", dropped[0]);
}

#[test]
fn a_report_with_only_device_latency_exports_it() {
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "execution_stats":{"period":1.0,"error":"","latency_stats":{"total_latency":null,
          "device_latency":{"p0":0.001,"p1":0.001,"p25":0.002,"p50":0.003,"p75":0.004,"p99":0.005,"p100":0.006}}}}}],
        "instance_info":{"instance_id":"i-1","error":""}}"#;
    let text = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    assert_eq!(series(&text, "execution_latency_seconds").len(), 0);
    let device = series(&text, "execution_device_latency_seconds");
    assert_eq!(device.len(), 7, "{device:#?}");
    assert!(device.iter().any(|l| l.contains(r#"percentile="p99""#) && l.ends_with(" 0.005")), "{device:#?}");
}

#[test]
fn flops_are_exported_for_the_cores_a_runtime_holds() {
    // neuron-monitor lists every core under every runtime, zeros on those it does not own.
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "neuroncore_counters":{"period":1.0,"error":"","neuroncores_in_use":{
          "0":{"neuroncore_utilization":50.0,"flops":1.5e12,"effective_flops":1.2e12},
          "1":{"neuroncore_utilization":0.0,"flops":0.0},
          "2":{"neuroncore_utilization":20.0,"effective_flops":3.0e11}}}}}],
        "instance_info":{"instance_id":"i-1","error":""}}"#;
    let text = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    let flops = series(&text, "neuroncore_flops");
    assert_eq!(flops.len(), 1, "{flops:#?}");
    assert!(flops[0].contains(r#"neuroncore="0""#) && flops[0].ends_with(" 1500000000000.0"), "{flops:#?}");
    let effective = series(&text, "neuroncore_effective_flops");
    assert_eq!(effective.len(), 2, "{effective:#?}");
    assert!(effective.iter().any(|l| l.contains(r#"neuroncore="2""#) && l.ends_with(" 300000000000.0")));
}

#[test]
fn process_series_follow_the_runtimes_of_the_state() {
    use crate::processes::ProcessSample;
    let report = |runtimes: &str| {
        format!(
            r#"{{"neuron_runtime_data":[{runtimes}],"instance_info":{{"error":"","instance_id":"i-1"}},
              "neuron_hardware_info":{{"neuron_device_count":1,"neuroncore_per_device_count":2,"error":""}}}}"#
        )
    };
    let train = r#"{"pid":7,"neuron_runtime_tag":"train","error":"","report":{}}"#;
    let state = Arc::new(Mutex::new(NodeState::default()));
    state.lock().unwrap().apply(&Report::parse(&report(train)).unwrap());
    let sample = ProcessSample {
        cpu_seconds: Some([1.5, 0.25]),
        resident_bytes: Some(4096.0),
        threads: Some(3.0),
        open_fds: Some(9.0),
        io_bytes: None,
    };
    // PID 8 is no runtime's: nothing of it is exported.
    let processes = Arc::new(Mutex::new(BTreeMap::from([(7, sample), (8, sample)])));
    let exposition = Exposition::new(Registry::default(), state.clone(), processes, SharedRouting::default());
    let text = exposition.render(Format::Classic).unwrap();
    let labels =
        r#"instance_id="i-1",instance_type="",availability_zone="",region="",subnet_id="",runtime_tag="train""#;
    for (name, value) in [
        ("neuron_process_resident_memory_bytes", "4096.0"),
        ("neuron_process_threads", "3.0"),
        ("neuron_process_open_fds", "9.0"),
    ] {
        assert_eq!(series(&text, name), [format!(r#"{name}{{instance_name="",{labels}}} {value}"#)], "{text}");
    }
    assert_eq!(
        series(&text, "neuron_process_cpu_seconds_total"),
        [
            format!(r#"neuron_process_cpu_seconds_total{{instance_name="",{labels},mode="user"}} 1.5"#),
            format!(r#"neuron_process_cpu_seconds_total{{instance_name="",{labels},mode="system"}} 0.25"#),
        ]
    );
    assert!(text.contains("# TYPE neuron_process_cpu_seconds_total counter\n"));
    // An unreadable io file: no I/O series, not zeros.
    assert!(!text.contains("neuron_process_io"), "{text}");

    // The runtime goes: its process series go with it, whatever the table still holds.
    state.lock().unwrap().apply(&Report::parse(&report("")).unwrap());
    let text = exposition.render(Format::Classic).unwrap();
    assert!(!text.contains("neuron_process_"), "{text}");
}

#[test]
fn error_types_statuses_and_percentiles_are_exported_as_reported() {
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "execution_stats":{"period":1.0,"error":"","error_summary":{"numerical":2,"oom":1},
          "execution_summary":{"completed":4,"preempted":1},
          "latency_stats":{"total_latency":{"p50":0.01,"p90":0.02},"device_latency":null}}}}],
        "instance_info":{"instance_id":"i-1","error":""}}"#;
    let text = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    let label_values = |name: &str, label: &str| -> Vec<String> {
        let key = format!(r#"{label}=""#);
        series(&text, name)
            .iter()
            .map(|l| l.split(&key).nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_owned())
            .collect()
    };
    // No `generic 0` made up: only what the report carried, a newer type under its name.
    assert_eq!(label_values("execution_errors_total", "error_type"), ["numerical", "oom"]);
    assert_eq!(label_values("execution_status_total", "status_type"), ["completed", "preempted"]);
    assert_eq!(label_values("execution_latency_seconds", "percentile"), ["p50", "p90"]);
    assert!(series(&text, "execution_errors_total").iter().any(|l| l.contains("oom") && l.ends_with(" 1.0")));
}

#[test]
fn loaded_models_a_count_by_state_and_an_info_series_each() {
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "memory_used":{"period":1.0,"error":"","loaded_models":[
          {"name":"bert.neff","uuid":"u1","model_id":10005,"is_running":true,"subgraphs":{}},
          {"name":"gpt.neff","model_id":10006,"is_running":false}]}}}],
        "instance_info":{"instance_id":"i-1","error":""}}"#;
    // The count by default, the info series when a configuration asks for them.
    let default = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    assert_eq!(series(&default, "neuron_runtime_loaded_models").len(), 2);
    assert!(series(&default, "neuron_runtime_loaded_model_info").is_empty(), "{default}");
    let text = exposition_with(&[line.to_owned()], with_model_info()).render(Format::Classic).unwrap();
    let counts = series(&text, "neuron_runtime_loaded_models");
    assert_eq!(counts.len(), 2, "running and idle; no unknown while every model says: {counts:#?}");
    assert!(counts.iter().any(|l| l.contains(r#"state="running""#) && l.ends_with(" 1.0")), "{counts:#?}");
    assert!(counts.iter().any(|l| l.contains(r#"state="idle""#) && l.ends_with(" 1.0")), "{counts:#?}");
    let info = series(&text, "neuron_runtime_loaded_model_info");
    assert_eq!(info.len(), 2, "{info:#?}");
    assert!(info[0].contains(r#"runtime_tag="x",model_name="bert.neff",running="true",model_id="10005"} 1"#));
    assert!(text.contains("# TYPE neuron_runtime_loaded_model_info gauge\n"));
}

#[test]
fn newer_hardware_fields_and_documented_peaks() {
    let line = r#"{"instance_info":{"instance_id":"i-1","instance_type":"trn2.48xlarge","error":""},
        "neuron_hardware_info":{"neuron_device_type":"trainium2","neuron_device_version":"v4","neuroncore_version":"v3d",
          "neuron_device_count":16,"neuron_device_memory_size":103079215104,"neuroncore_per_device_count":4,
          "logical_neuroncore_config":2,"error":""}}"#;
    let text = exposition(&[line.to_owned()]).render(Format::Classic).unwrap();
    let hardware = series(&text, "neuron_hardware_info");
    assert_eq!(hardware.len(), 1);
    assert!(
        hardware[0].contains(
            r#"neuron_device_count="16",neuroncore_per_device_count="4",neuron_device_type="trainium2",neuron_device_version="v4",neuroncore_version="v3d",neuron_device_memory_size="103079215104",logical_neuroncore_config="2"} 1"#
        ),
        "{}",
        hardware[0]
    );
    // A logical core of two NeuronCore-v3: twice the documented 79 BF16 TFLOPS.
    let peaks = series(&text, "neuroncore_peak_flops");
    assert_eq!(peaks.len(), api::hardware::peak_flops(api::hardware::Generation::Trainium2).len());
    let bf16 = peaks.iter().find(|l| l.contains(r#"data_type="bf16""#)).unwrap();
    assert!(bf16.ends_with(" 158000000000000.0"), "{bf16}");

    // An instance type the table does not know, named by its device type; LNC=1.
    let line = line
        .replace("trn2.48xlarge", "trn2x.future")
        .replace(r#""logical_neuroncore_config":2"#, r#""logical_neuroncore_config":1"#);
    let text = exposition(&[line]).render(Format::Classic).unwrap();
    let bf16 = series(&text, "neuroncore_peak_flops").into_iter().find(|l| l.contains(r#"data_type="bf16""#)).unwrap();
    assert!(bf16.ends_with(" 79000000000000.0"), "{bf16}");
    // Neither known: no peak rather than a guess.
    let text = exposition(&[fixture(IDLE_INF1).replace("inf1.xlarge", "x9.large")]).render(Format::Classic).unwrap();
    assert!(series(&text, "neuroncore_peak_flops").is_empty());
}

/// The operator's OTLP cost estimate counts the families `/metrics` serves (the OTLP sink
/// sends the same): a family added here and not in `api::cloudwatch::cost::otlp` would go
/// unpriced.
#[test]
fn the_otlp_cost_estimate_counts_every_family_served() {
    let known: Vec<&str> = api::cloudwatch::cost::otlp::family_names().collect();
    for fixture_name in [TRN1N_32, TRN1_ERRORS, IDLE_INF1] {
        let text = exposition_with(&[fixture(fixture_name)], with_model_info()).render(Format::Classic).unwrap();
        let served: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .filter(|name| !name.starts_with("neuron_agent_"))
            .collect();
        assert!(served.len() >= 10, "{fixture_name}: {served:?}");
        for name in served {
            assert!(
                known.contains(&name),
                "{fixture_name}: /metrics serves {name}, which the OTLP estimate does not count"
            );
        }
    }
}

/// A scrape writes into the buffers of the scrapes before it: the page of the 32-runtime
/// node is half a megabyte, which built afresh each time cost ~245 page faults.
#[test]
fn a_render_reuses_the_buffers_of_the_renders_before_it() {
    let exposition = exposition(&[fixture(TRN1N_32)]);
    let buffers = exposition.buffers.clone();
    let first = exposition.render(Format::Classic).unwrap();
    let page = first.to_string();
    drop(first);
    // The page and the agent's own metrics before their classic conversion, both kept.
    let kept: Vec<(*const u8, usize)> = buffers.0.lock().unwrap().iter().map(|b| (b.as_ptr(), b.capacity())).collect();
    assert_eq!(kept.len(), 2);
    let second = exposition.render(Format::Classic).unwrap();
    assert_eq!(&*second, page, "the same state renders the same page");
    assert!(
        kept.contains(&(second.as_ptr(), second.text.capacity())),
        "the page was written into a kept buffer, unchanged in size"
    );
    // Two pages alive at once have their own buffers: three renders, two buffers in all.
    let third = exposition.render(Format::OpenMetrics).unwrap();
    assert_ne!(third.as_ptr(), second.as_ptr());
    drop((second, third));
    assert_eq!(buffers.0.lock().unwrap().len(), 2);
    // A buffer that grew past the limit is not kept.
    buffers.give(String::with_capacity(MAX_KEPT_BUFFER + 1));
    assert!(buffers.0.lock().unwrap().iter().all(|b| b.capacity() <= MAX_KEPT_BUFFER));
}

/// The page's own text encoder writes, byte for byte, what prometheus-client's encoder
/// wrote, in both formats: every family of the 32-runtime fixture, with pods, a
/// configuration's labels, the loaded models' info family and label values to escape.
#[test]
fn the_pages_text_is_what_prometheus_client_wrote() {
    use crate::state::PodRef;
    use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

    struct Reference(NodeCollector);
    impl fmt::Debug for Reference {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Reference")
        }
    }
    impl Collector for Reference {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
            self.0.export(&mut encoder)
        }
    }

    let mut state = NodeState::default();
    state.apply(&Report::parse(&fixture(TRN1N_32)).unwrap());
    let pod = Arc::new(PodRef {
        namespace: "team-a".into(),
        pod: "train-0".into(),
        owner: "train".into(),
        container: "main".into(),
        labels: vec![("label_note".into(), "a \"quoted\\ value\nover two lines".into())],
    });
    for rt in state.runtimes.iter_mut().step_by(2) {
        Arc::make_mut(&mut rt.labels).pod = Some(pod.clone());
    }
    let state = Arc::new(Mutex::new(state));
    let node = || NodeCollector { state: state.clone(), processes: Default::default(), routing: with_model_info() };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Reference(node())));
    let mut reference = String::new();
    own_metrics::encode(&mut reference, &registry).unwrap();
    assert!(reference.contains(r#"label_note="a \"quoted\\ value\nover two lines""#), "escaped");
    assert!(reference.contains("neuron_runtime_loaded_model_info{"), "an info family");

    let open = render_families(&node(), Format::OpenMetrics) + "# EOF\n";
    assert_eq!(open, reference);
    assert_eq!(render_families(&node(), Format::Classic), openmetrics_to_classic(&reference));
}

/// Series of two hosts' labels interleaved in one family, a copy of one of them, and the
/// same labels again in the next family: each series carries its own host's labels (the
/// encoder writes the host's labels from a cache it checks by address within a family).
#[test]
fn each_series_carries_its_own_hosts_labels() {
    use crate::state::InstanceLabels;
    let a = InstanceLabels { instance_id: "i-a".into(), ..InstanceLabels::default() };
    let b = InstanceLabels { instance_id: "i-b".into(), ..InstanceLabels::default() };
    let b_copy = b.clone();
    let mut page = String::new();
    let mut encoder = text::TextEncoder::new(&mut page, Format::Classic);
    for (name, hosts) in [("one", [&a, &b, &b_copy, &a]), ("two", [&b_copy, &a, &a, &b])] {
        let mut family = Family::new(name, "help", MetricType::Gauge);
        for (i, host) in (0u32..).zip(hosts) {
            family.push(Labels::node(host).number("n", i), Some(1.0));
        }
        family.write(&mut encoder).unwrap();
    }
    let ids: Vec<&str> = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("instance_id=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(ids, ["i-a", "i-b", "i-b", "i-a", "i-b", "i-a", "i-a", "i-b"]);
}

/// Kept families answer the scrapes that arrived before their render began (they waited
/// for a slot), as the same bytes, not a copy; not those of another format, nor a scrape
/// that saw a report their render had not. The page of the routes is the agent's own
/// metrics, then the families: the whole page's text.
#[test]
fn kept_families_are_shared_with_the_scrapes_they_answer() {
    let exposition = exposition(&[fixture(TRN1N_32)]);
    let asked = Instant::now();
    let rendered = exposition.render_families(Format::Classic, 5).unwrap();
    let shared = exposition.shared_families(Format::Classic, 5, asked).expect("rendered since the scrape asked");
    assert_eq!((shared.as_ptr(), shared.len()), (rendered.as_ptr(), rendered.len()), "shared, not copied");
    assert!(exposition.shared_families(Format::OpenMetrics, 5, asked).is_none(), "another format");
    let after_a_report = Instant::now();
    assert!(exposition.shared_families(Format::Classic, 6, after_a_report).is_none(), "a report since their render");
    // The next render takes their place.
    let later = exposition.render_families(Format::Classic, 6).unwrap();
    let kept = exposition.shared_families(Format::Classic, 6, after_a_report).expect("the later render");
    assert_eq!(kept.as_ptr(), later.as_ptr());

    for format in [Format::Classic, Format::OpenMetrics] {
        let parts = [exposition.own_metrics(format).unwrap(), exposition.render_families(format, 6).unwrap()].concat();
        let whole = exposition.render(format).unwrap();
        // The renders' own count moved by one between the two.
        let without_renders = |text: &str| {
            text.lines().filter(|l| !l.starts_with("neuron_agent_metrics_renders")).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(without_renders(std::str::from_utf8(&parts).unwrap()), without_renders(&whole), "{format:?}");
    }
}
