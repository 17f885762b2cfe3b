use serde_json::json;

use crate::gpu_groups::{GpuGroup, GpuGroups};
use crate::node_config::{NodeGpu, PrometheusRoute};

use super::{selector::check_label_key, *};

const OPERATOR_NS: &str = "neuron-monitor";

fn nmc(namespace: &str, name: &str, spec: serde_json::Value) -> NeuronMonitorConfig {
    let mut config = NeuronMonitorConfig::new(name, serde_json::from_value(spec).unwrap());
    config.metadata.namespace = Some(namespace.to_owned());
    config
}

fn valid(namespace: &str, spec: serde_json::Value) -> ValidConfig {
    validate(&nmc(namespace, "c", spec), OPERATOR_NS).unwrap()
}

fn invalid(namespace: &str, spec: serde_json::Value) -> Invalid {
    validate(&nmc(namespace, "c", spec), OPERATOR_NS).unwrap_err()
}

fn secs(s: u64) -> Period {
    Period::from_secs(s)
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn an_empty_spec_in_a_team_namespace_takes_every_application_and_no_system_group() {
    let v = valid("team-a", json!({}));
    assert_eq!(v.key.to_string(), "team-a/c");
    assert_eq!(v.period, secs(5));
    assert!(v.selector.is_everything());
    assert_eq!(v.applications, Applications::All);
    assert_eq!(v.runtime_groups, RuntimeGroup::ALL.map(|g| (g, secs(5))).into_iter().collect());
    assert!(v.system_groups.is_empty());
    assert_eq!(
        v.route,
        Route {
            config: "team-a/c".into(),
            namespace: Some("team-a".into()),
            runtimes: vec![RouteRuntimes { tag_filter: None, groups: RuntimeGroup::ALL.to_vec() }],
            system_groups: vec![],
            prometheus: Some(PrometheusRoute::default()),
            cloudwatch: None,
            otlp: None,
        }
    );
}

#[test]
fn an_empty_spec_in_the_operator_namespace_also_takes_every_system_group() {
    let v = valid(OPERATOR_NS, json!({"period": "10s"}));
    assert_eq!(v.route.namespace, None);
    assert_eq!(v.route.system_groups, SystemGroup::ALL.to_vec());
    assert_eq!(v.system_groups, SystemGroup::ALL.map(|g| (g, secs(10))).into_iter().collect());
    assert!(v.runtime_groups.values().all(|p| *p == secs(10)));
}

#[test]
fn the_nearest_period_wins_and_entries_merge_at_their_shortest() {
    let v = valid(
        OPERATOR_NS,
        json!({
            "period": "10s",
            "runtimes": [
                {"tagFilter": "^train-", "period": "2s",
                 "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used", "period": "1s"}]},
                {"tagFilter": "bert", "metrics": [{"type": "neuroncore_counters", "period": "3s"}, {"type": "execution_stats"}]}
            ],
            "systemMetrics": {"period": "30s", "metrics": [{"type": "vcpu_usage"}, {"type": "memory_info", "period": "1m"}]}
        }),
    );
    let runtime: Vec<_> = v.runtime_groups.iter().map(|(g, p)| (*g, p.to_string())).collect();
    assert_eq!(
        runtime,
        vec![
            (RuntimeGroup::NeuroncoreCounters, "2s".into()),
            (RuntimeGroup::MemoryUsed, "1s".into()),
            (RuntimeGroup::ExecutionStats, "10s".into()),
        ]
    );
    let system: Vec<_> = v.system_groups.iter().map(|(g, p)| (*g, p.to_string())).collect();
    assert_eq!(system, vec![(SystemGroup::VcpuUsage, "30s".into()), (SystemGroup::MemoryInfo, "1m".into())]);
    assert_eq!(v.applications, Applications::Matching(vec!["^train-".into(), "bert".into()]));
    // Entries keep their order in the route (first match wins within a config too).
    assert_eq!(v.route.runtimes[0].tag_filter.as_deref(), Some("^train-"));
    assert_eq!(v.route.runtimes[1].groups, vec![RuntimeGroup::NeuroncoreCounters, RuntimeGroup::ExecutionStats]);
    assert_eq!(v.route.system_groups, vec![SystemGroup::VcpuUsage, SystemGroup::MemoryInfo]);
}

#[test]
fn an_entry_without_a_filter_takes_every_application() {
    let v = valid(
        "team-a",
        json!({"runtimes": [{"tagFilter": "a", "metrics": [{"type": "memory_used"}]},
                            {"metrics": [{"type": "memory_used"}]}]}),
    );
    assert_eq!(v.applications, Applications::All);
}

#[test]
fn a_tag_filter_that_does_not_compile_names_its_entry() {
    let e = invalid(
        "team-a",
        json!({"runtimes": [{"metrics": [{"type": "memory_used"}]},
                            {"tagFilter": "(unclosed", "metrics": [{"type": "memory_used"}]}]}),
    );
    assert_eq!(e.field, "spec.runtimes[1].tagFilter");
    let shown = e.to_string();
    assert!(shown.starts_with("spec.runtimes[1].tagFilter: regex parse error:"), "{shown}");
    assert!(shown.contains("unclosed group") && !shown.contains('\n'), "{shown}");
}

#[test]
fn tag_filters_go_refuses_are_refused() {
    for filter in [r"(?x)a # comment", r"\<word", r"a\b{start}", "a{1001}", "a{2,5000}", "(?u)x", "(?R)x"] {
        let e = invalid("team-a", json!({"runtimes": [{"tagFilter": filter, "metrics": [{"type": "memory_used"}]}]}));
        assert_eq!(e.field, "spec.runtimes[0].tagFilter", "{filter}");
        assert!(e.reason.contains("Go"), "{filter}: {e}");
    }
    for filter in [
        "(?i)Bert",
        "(?i:a)|(?-s:b)",
        "(?P<n>a)(?:b)",
        "[[:alpha:]]+",
        "a{2,5}",
        "a{2,}",
        r"\p{Greek}",
        r"\x{41}",
        r"\(?x",
        "[(?x)]",
        "[]{9999}]",
        "^serve-[0-9]+$",
    ] {
        let v = valid("team-a", json!({"runtimes": [{"tagFilter": filter, "metrics": [{"type": "memory_used"}]}]}));
        assert_eq!(v.applications, Applications::Matching(vec![filter.to_owned()]));
    }
}

#[test]
fn selector_errors_name_the_exact_field() {
    let cases = [
        (
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "In"}]}),
            "spec.nodeSelector.matchExpressions[1].values",
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": []}]}),
            "spec.nodeSelector.matchExpressions[0].values",
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            "spec.nodeSelector.matchExpressions[0].values",
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "not ok"]}]}),
            "spec.nodeSelector.matchExpressions[0].values[1]",
        ),
        (
            json!({"matchExpressions": [{"key": "-bad", "operator": "Exists"}]}),
            "spec.nodeSelector.matchExpressions[0].key",
        ),
        (
            json!({"matchExpressions": [{"key": "Bad_Prefix/x", "operator": "Exists"}]}),
            "spec.nodeSelector.matchExpressions[0].key",
        ),
        (json!({"matchLabels": {"zone": "us east"}}), "spec.nodeSelector.matchLabels[\"zone\"]"),
    ];
    for (selector, field) in cases {
        let e = invalid("team-a", json!({"nodeSelector": selector}));
        assert_eq!(e.field, field, "{selector}: {e}");
    }
    let e = invalid(
        "team-a",
        json!({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}}),
    );
    assert!(e.reason.contains("\"Gt\""), "{e}");
}

#[test]
fn selectors_follow_kubernetes_semantics() {
    let v = valid(
        "team-a",
        json!({"nodeSelector": {
        "matchLabels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"},
        "matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b", "us-east-1a"]},
            {"key": "pool", "operator": "NotIn", "values": ["spot"]},
            {"key": "neuron", "operator": "Exists"},
            {"key": "cordoned", "operator": "DoesNotExist"}
        ]}}),
    );
    let base = [
        ("node.kubernetes.io/instance-type", "trn1.32xlarge"),
        ("topology.kubernetes.io/zone", "us-east-1a"),
        ("neuron", ""),
    ];
    assert!(v.matches(&labels(&base)));
    // NotIn holds when the label is absent, and when its value is elsewhere.
    let mut with = labels(&base);
    with.insert("pool".into(), "od".into());
    assert!(v.matches(&with));
    with.insert("pool".into(), "spot".into());
    assert!(!v.matches(&with));
    let mut with = labels(&base);
    with.insert("cordoned".into(), "true".into());
    assert!(!v.matches(&with));
    let mut with = labels(&base);
    with.remove("neuron");
    assert!(!v.matches(&with));
    let mut with = labels(&base);
    with.insert("topology.kubernetes.io/zone".into(), "us-east-1c".into());
    assert!(!v.matches(&with));
    let mut with = labels(&base);
    with.insert("node.kubernetes.io/instance-type".into(), "inf2.xlarge".into());
    assert!(!v.matches(&with));

    // An empty selector, like no selector, matches every node.
    let all = valid("team-a", json!({"nodeSelector": {}}));
    assert!(all.selector.is_everything() && all.matches(&BTreeMap::new()));
}

#[test]
fn system_metrics_outside_the_operator_namespace_are_refused() {
    let e = invalid("team-a", json!({"systemMetrics": {"metrics": [{"type": "memory_info"}]}}));
    assert_eq!(e.field, "spec.systemMetrics");
    assert!(e.reason.contains("operator's namespace (neuron-monitor)"), "{e}");
}

#[test]
fn periods_out_of_range_or_unreadable_are_refused_by_field() {
    let cases = [
        (json!({"period": "500ms"}), "spec.period"),
        (json!({"period": "2h"}), "spec.period"),
        (json!({"period": "fast"}), "spec.period"),
        (json!({"period": "5"}), "spec.period"),
        (json!({"runtimes": [{"period": "0s", "metrics": [{"type": "memory_used"}]}]}), "spec.runtimes[0].period"),
        (
            json!({"runtimes": [{"metrics": [{"type": "memory_used"}, {"type": "execution_stats", "period": "61m"}]}]}),
            "spec.runtimes[0].metrics[1].period",
        ),
        (json!({"systemMetrics": {"period": "1d", "metrics": [{"type": "memory_info"}]}}), "spec.systemMetrics.period"),
        (
            json!({"systemMetrics": {"metrics": [{"type": "memory_info", "period": "999ms"}]}}),
            "spec.systemMetrics.metrics[0].period",
        ),
        (
            json!({"sinks": {"cloudwatch": {"namespace": "N", "flushInterval": "0.5s"}}}),
            "spec.sinks.cloudwatch.flushInterval",
        ),
    ];
    for (spec, field) in cases {
        let e = invalid(OPERATOR_NS, spec.clone());
        assert_eq!(e.field, field, "{spec}: {e}");
        assert!(e.reason.contains("1s to 1h"), "{e}");
    }
    // The bounds themselves are fine, and decimals are read.
    let v = valid(
        OPERATOR_NS,
        json!({"period": "1.5s", "runtimes": [{"period": "1h", "metrics": [{"type": "memory_used", "period": "1s"}]}]}),
    );
    assert_eq!(v.period, Period::from_millis(1500));
    assert_eq!(v.runtime_groups[&RuntimeGroup::MemoryUsed], secs(1));
}

#[test]
fn a_group_listed_twice_or_no_group_is_refused() {
    let e = invalid(
        "team-a",
        json!({"runtimes": [{"metrics": [{"type": "memory_used"}, {"type": "execution_stats"}, {"type": "inference_stats"}]}]}),
    );
    assert_eq!(e.field, "spec.runtimes[0].metrics[2].type");
    assert!(e.reason.contains("execution_stats"), "{e}");
    let e =
        invalid(OPERATOR_NS, json!({"systemMetrics": {"metrics": [{"type": "memory_info"}, {"type": "memory_info"}]}}));
    assert_eq!(e.field, "spec.systemMetrics.metrics[1].type");
    let e = invalid("team-a", json!({"runtimes": [{"metrics": []}]}));
    assert_eq!(e.field, "spec.runtimes[0].metrics");
    let e = invalid(OPERATOR_NS, json!({"systemMetrics": {"metrics": []}}));
    assert_eq!(e.field, "spec.systemMetrics.metrics");
    let e = invalid("team-a", json!({"runtimes": vec![json!({"metrics": [{"type": "memory_used"}]}); 17]}));
    assert_eq!(e.field, "spec.runtimes");
}

#[test]
fn runtimes_empty_collects_only_system_groups_and_is_refused_where_that_is_nothing() {
    let v = valid(OPERATOR_NS, json!({"runtimes": []}));
    assert_eq!(v.applications, Applications::None);
    assert!(v.runtime_groups.is_empty() && v.route.runtimes.is_empty());
    assert_eq!(v.system_groups.len(), 3);
    let e = invalid("team-a", json!({"runtimes": []}));
    assert_eq!(e.field, "spec.runtimes");
}

#[test]
fn sinks_are_copied_into_the_route_and_checked() {
    let v = valid(
        "team-a",
        json!({"sinks": {
            "prometheus": {"extraLabels": {"team": "a", "cost_center": "42"}},
            "cloudwatch": {"namespace": "TeamA/Neuron", "region": "eu-west-1", "dimensions": ["ClusterName", "PodName"],
                           "storageResolution": 1, "flushInterval": "30s"}
        }}),
    );
    let prometheus = v.route.prometheus.unwrap();
    assert_eq!(prometheus.extra_labels, labels(&[("team", "a"), ("cost_center", "42")]));
    assert!(!prometheus.loaded_model_info, "the loaded models' info series are asked for, not a default");
    let cloudwatch = v.route.cloudwatch.unwrap();
    assert_eq!(cloudwatch.namespace, "TeamA/Neuron");
    assert_eq!(cloudwatch.storage_resolution, Some(1));

    let off = valid("team-a", json!({"sinks": {"prometheus": {"enabled": false}}}));
    assert_eq!(off.route.prometheus, None);
    let on = valid("team-a", json!({"sinks": {"prometheus": {"enabled": true}}}));
    assert_eq!(on.route.prometheus, Some(PrometheusRoute::default()));
    let models = valid("team-a", json!({"sinks": {"prometheus": {"loadedModelInfo": true}}}));
    assert!(models.route.prometheus.is_some_and(|p| p.loaded_model_info));
    // Off, the route's JSON (and so its content hash) is what it was before the field.
    let json = serde_json::to_string(&on.route).unwrap();
    assert!(!json.contains("loadedModelInfo"), "{json}");

    let cases = [
        (json!({"prometheus": {"extraLabels": {"pod": "x"}}}), "spec.sinks.prometheus.extraLabels[\"pod\"]"),
        (json!({"prometheus": {"extraLabels": {"1st": "x"}}}), "spec.sinks.prometheus.extraLabels[\"1st\"]"),
        (json!({"prometheus": {"extraLabels": {"__name": "x"}}}), "spec.sinks.prometheus.extraLabels[\"__name\"]"),
        (
            json!({"prometheus": {"extraLabels": {"long": "x".repeat(129)}}}),
            "spec.sinks.prometheus.extraLabels[\"long\"]",
        ),
        (json!({"cloudwatch": {"namespace": "AWS/Neuron"}}), "spec.sinks.cloudwatch.namespace"),
        (json!({"cloudwatch": {"namespace": ""}}), "spec.sinks.cloudwatch.namespace"),
        (json!({"cloudwatch": {"namespace": "N", "region": "mars"}}), "spec.sinks.cloudwatch.region"),
        (json!({"cloudwatch": {"namespace": "N", "storageResolution": 5}}), "spec.sinks.cloudwatch.storageResolution"),
        (
            json!({"cloudwatch": {"namespace": "N", "dimensions": ["PodName", "NodeName", "PodName"]}}),
            "spec.sinks.cloudwatch.dimensions[2]",
        ),
        (
            json!({"cloudwatch": {"namespace": "N", "rollups": [["ClusterName"], ["Namespace", "Namespace"]]}}),
            "spec.sinks.cloudwatch.rollups[1][1]",
        ),
        (
            json!({"cloudwatch": {"namespace": "N", "naming": "ContainerInsights", "dimensions": ["PodName"]}}),
            "spec.sinks.cloudwatch.dimensions",
        ),
        (
            json!({"cloudwatch": {"namespace": "N", "naming": "ContainerInsights",
                                  "metrics": ["neuroncore_utilization"]}}),
            "spec.sinks.cloudwatch.metrics",
        ),
    ];
    for (sinks, field) in cases {
        let e = invalid("team-a", json!({ "sinks": sinks }));
        assert_eq!(e.field, field, "{sinks}: {e}");
    }
    let e =
        invalid("team-a", json!({"sinks": {"cloudwatch": {"namespace": "N", "rollups": vec![["ClusterName"]; 11]}}}));
    assert_eq!(e.field, "spec.sinks.cloudwatch.rollups");
    let many: BTreeMap<String, String> = (0..17).map(|i| (format!("l{i}"), "v".into())).collect();
    let e = invalid("team-a", json!({"sinks": {"prometheus": {"extraLabels": many}}}));
    assert_eq!(e.field, "spec.sinks.prometheus.extraLabels");
}

#[test]
fn the_otlp_sink_is_copied_into_the_route_checked_and_counted_in_its_size() {
    let otlp = json!({"endpoint": "http://otel-collector.observability:4318/v1/metrics",
                      "headersSecret": {"name": "otlp-token"}, "flushInterval": "15s"});
    let v = valid("team-a", json!({"sinks": {"otlp": otlp}}));
    let route = v.route.otlp.as_ref().expect("the OTLP sink in the route");
    assert_eq!(route.endpoint.as_deref(), Some("http://otel-collector.observability:4318/v1/metrics"));
    assert_eq!(route.headers_secret.as_ref().map(|s| s.name.as_str()), Some("otlp-token"));
    assert_eq!(v.rendered_bytes, serde_json::to_string(&v.route).unwrap().len());
    // CloudWatch's endpoint: nothing but the sink's presence is needed.
    assert!(valid(OPERATOR_NS, json!({"sinks": {"otlp": {}}})).route.otlp.is_some());

    let cases = [
        (json!({"endpoint": "ftp://c/v1/metrics"}), "spec.sinks.otlp.endpoint"),
        (json!({"endpoint": "http://c:99999/"}), "spec.sinks.otlp.endpoint"),
        (json!({"endpoint": "http://c/v1?tenant=a"}), "spec.sinks.otlp.endpoint"),
        (json!({"endpoint": "http://c", "region": "us-east-1"}), "spec.sinks.otlp.region"),
        (json!({"region": "mars"}), "spec.sinks.otlp.region"),
        (json!({"headersSecret": {"name": "token"}}), "spec.sinks.otlp.headersSecret"),
        (json!({"flushInterval": "500ms"}), "spec.sinks.otlp.flushInterval"),
        (json!({"flushInterval": "61m"}), "spec.sinks.otlp.flushInterval"),
    ];
    for (otlp, field) in cases {
        let e = invalid("team-a", json!({ "sinks": { "otlp": otlp } }));
        assert_eq!(e.field, field, "{otlp}: {e}");
    }
}

#[test]
fn an_object_without_namespace_is_refused() {
    let mut config = nmc("team-a", "c", json!({}));
    config.metadata.namespace = None;
    assert_eq!(validate(&config, OPERATOR_NS).unwrap_err().field, "metadata.namespace");
}

#[test]
fn key_matches_the_object_it_came_from() {
    let config = nmc("team-a", "c", json!({}));
    let v = validate(&config, OPERATOR_NS).unwrap();
    assert!(v.key_matches(&config));
    assert!(!v.key_matches(&nmc("team-b", "c", json!({}))));
    assert!(!v.key_matches(&nmc("team-a", "d", json!({}))));
}

#[test]
fn region_and_label_checks() {
    for r in ["us-east-1", "eu-central-2", "us-gov-west-1", "ap-southeast-4"] {
        assert!(crate::region::valid_region(r), "{r}");
    }
    for r in ["", "us-east", "useast-1", "US-east-1", "us--1", "u-east-1"] {
        assert!(!crate::region::valid_region(r), "{r}");
    }
    for k in ["a", "node.kubernetes.io/instance-type", "eks.amazonaws.com/nodegroup", "A_b.c-9"] {
        assert!(check_label_key(k).is_ok(), "{k}");
    }
    for k in ["", "/a", "a/", "-a", "a-", "x.io/b/c", &"a".repeat(64)] {
        assert!(check_label_key(k).is_err(), "{k}");
    }
}

#[test]
fn a_config_too_large_for_any_node_is_refused_naming_its_largest_part() {
    let runtimes: Vec<_> = (0..16)
        .map(|e| json!({"tagFilter": format!("^{e:02}-{}", "a".repeat(990)), "metrics": [{"type": "memory_used"}]}))
        .collect();
    let e = invalid("team-a", json!({"runtimes": runtimes}));
    assert_eq!((e.kind, e.field.as_str()), (Refusal::TooLarge, "spec.runtimes"), "{e}");
    assert!(e.reason.contains(&format!("at most {}", crate::limits::MAX_CONFIG_RENDERED_BYTES)), "{e}");
    // Schema-valid, and one entry fewer than the schema allows, but still too large.
    let e = invalid(
        "team-a",
        json!({"runtimes": runtimes[..15].to_vec(), "sinks": {"prometheus": {"extraLabels":
        (0..16).map(|l| (format!("l{l:02}"), json!("\u{1}".repeat(128)))).collect::<serde_json::Map<_, _>>()}}}),
    );
    assert_eq!(e.kind, Refusal::TooLarge, "{e}");
    // Within the bound: the size is what the route adds to a node's configuration.
    let v = valid("team-a", json!({"runtimes": runtimes[..2].to_vec()}));
    assert_eq!(v.rendered_bytes, serde_json::to_string(&v.route).unwrap().len());
    // Every other refusal is an invalid spec.
    assert_eq!(invalid("team-a", json!({"period": "0s"})).kind, Refusal::InvalidSpec);
}

#[test]
fn configs_are_given_room_operator_namespace_first_then_oldest_then_by_name() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |namespace: &str, name: &str, second: Option<i64>| {
        let mut c = nmc(namespace, name, json!({}));
        c.metadata.creation_timestamp =
            second.map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s).unwrap()));
        validate(&c, OPERATOR_NS).unwrap()
    };
    let mut configs = [
        at("team-a", "unstamped", None),
        at("team-b", "new", Some(9)),
        at("team-z", "old", Some(1)),
        at("team-a", "old", Some(1)),
        at(OPERATOR_NS, "newest", Some(99)),
    ];
    configs.sort_by(|a, b| a.precedes(b));
    let order: Vec<String> = configs.iter().map(|c| c.key.to_string()).collect();
    assert_eq!(order, ["neuron-monitor/newest", "team-a/old", "team-z/old", "team-b/new", "team-a/unstamped"]);
}

#[test]
fn health_is_for_the_operator_namespace_only() {
    let refused = invalid("team-a", json!({"health": {}}));
    assert_eq!((refused.field.as_str(), refused.kind), ("spec.health", Refusal::InvalidSpec));
    assert!(refused.reason.contains(OPERATOR_NS), "{}", refused.reason);
    assert_eq!(valid("team-a", json!({})).health, None);
}

#[test]
fn health_defaults_resolve_and_leave_the_flags_theirs() {
    use crate::node_config::{LogDestination, NodeTaint, DEFAULT_LOG_GROUP};
    // Absent: nothing for the nodes (the agent's flags, no taint, no logs).
    assert_eq!(valid(OPERATOR_NS, json!({})).health, None);
    let h = valid(OPERATOR_NS, json!({"health": {}})).health.expect("health");
    assert_eq!((h.config.as_str(), h.condition_type, h.kmsg_look_back), ("neuron-monitor/c", None, None));
    assert_eq!((h.taint, h.logs), (None, None), "taint and logs off by default");
    let h = valid(OPERATOR_NS, json!({"health": {"taint": {"enabled": true}, "logs": {}, "kmsgLookBack": "10m"}}))
        .health
        .expect("health");
    assert_eq!(h.taint, Some(NodeTaint::default()));
    assert_eq!(h.taint.unwrap().errors.len(), 5, "the fatal errors");
    assert_eq!(h.logs, Some(LogDestination { group: DEFAULT_LOG_GROUP.to_owned(), region: None }));
    assert_eq!(h.kmsg_look_back, Some(secs(600)));
    let h = valid(
        OPERATOR_NS,
        json!({"health": {"conditionType": "example.com/NeuronHardware", "taint": {"enabled": true, "errors": ["DMA_ERROR", "DEVICE_STATE_INVALID"]},
               "logs": {"group": "/team/neuron", "region": "eu-west-1"}}}),
    )
    .health
    .expect("health");
    assert_eq!(h.condition_type.as_deref(), Some("example.com/NeuronHardware"));
    assert_eq!(h.taint.unwrap().errors, ["DEVICE_STATE_INVALID", "DMA_ERROR"], "sorted");
    assert_eq!(h.logs.unwrap().region.as_deref(), Some("eu-west-1"));
    // Tainting off: no taint for the nodes, but the list is still checked.
    let off = valid(OPERATOR_NS, json!({"health": {"taint": {"enabled": false, "errors": ["DMA_ERROR"]}}}));
    assert_eq!(off.health.unwrap().taint, None);
}

#[test]
fn invalid_health_values_are_refused_by_field() {
    let cases = [
        (json!({"conditionType": "Ready"}), "spec.health.conditionType"),
        (json!({"conditionType": "DiskPressure"}), "spec.health.conditionType"),
        (json!({"conditionType": ""}), "spec.health.conditionType"),
        (json!({"conditionType": "-Neuron"}), "spec.health.conditionType"),
        (json!({"conditionType": "Neuron Health"}), "spec.health.conditionType"),
        (json!({"conditionType": "Example.com/Neuron"}), "spec.health.conditionType"),
        (json!({"conditionType": "a".repeat(64)}), "spec.health.conditionType"),
        (json!({"taint": {"enabled": true, "errors": []}}), "spec.health.taint.errors"),
        (json!({"taint": {"enabled": true, "errors": ["dma_error"]}}), "spec.health.taint.errors[0]"),
        (json!({"taint": {"enabled": false, "errors": ["DMA_ERROR", "DMA_ERROR"]}}), "spec.health.taint.errors[1]"),
        (json!({"taint": {"enabled": true, "errors": ["A".repeat(65)]}}), "spec.health.taint.errors[0]"),
        (json!({"kmsgLookBack": "500ms"}), "spec.health.kmsgLookBack"),
        (json!({"kmsgLookBack": "25h"}), "spec.health.kmsgLookBack"),
        (json!({"kmsgLookBack": "5"}), "spec.health.kmsgLookBack"),
        (json!({"logs": {"group": "aws/neuron"}}), "spec.health.logs.group"),
        (json!({"logs": {"group": "neuron events"}}), "spec.health.logs.group"),
        (json!({"logs": {"group": ""}}), "spec.health.logs.group"),
        (json!({"logs": {"group": "g".repeat(513)}}), "spec.health.logs.group"),
        (json!({"logs": {"region": "us_west_2"}}), "spec.health.logs.region"),
    ];
    for (health, field) in cases {
        let refused = invalid(OPERATOR_NS, json!({ "health": health }));
        assert_eq!(refused.field, field, "{health}: {refused}");
    }
    let many: Vec<String> = (0..33).map(|i| format!("E{i}")).collect();
    let refused = invalid(OPERATOR_NS, json!({"health": {"taint": {"enabled": true, "errors": many}}}));
    assert_eq!(refused.field, "spec.health.taint.errors");
    for ok in ["NeuronHealth", "neuron.example.com/hardware_health", "a", "Neuron-Health.v2"] {
        assert_eq!(check_condition_type(ok), Ok(()), "{ok}");
    }
}

#[test]
fn thresholds_resolve_sorted_and_device_taints_default_to_no_schedule() {
    use crate::{
        crd::DeviceTaintEffect,
        node_config::{FaultThreshold, NodeDeviceTaints},
    };
    let h = valid(OPERATOR_NS, json!({"health": {}})).health.expect("health");
    assert_eq!((h.device_taints, h.thresholds.len()), (None, 0), "off and none by default");
    let h = valid(
        OPERATOR_NS,
        json!({"health": {"deviceTaints": {"enabled": true}, "thresholds": [
            {"error": "SRAM_UNCORRECTABLE_ERROR", "count": 3, "window": "10m"},
            {"error": "DMA_ERROR", "count": 1, "window": "1s"}]}}),
    )
    .health
    .expect("health");
    assert_eq!(h.device_taints, Some(NodeDeviceTaints { effect: DeviceTaintEffect::NoSchedule }));
    let threshold =
        |error: &str, count, window| FaultThreshold { error: error.to_owned(), count, window: secs(window) };
    assert_eq!(h.thresholds, [threshold("DMA_ERROR", 1, 1), threshold("SRAM_UNCORRECTABLE_ERROR", 3, 600)], "sorted");
    let inform = valid(OPERATOR_NS, json!({"health": {"deviceTaints": {"enabled": true, "effect": "None"}}}));
    assert_eq!(inform.health.unwrap().device_taints.unwrap().effect, DeviceTaintEffect::Inform);
    let off = valid(OPERATOR_NS, json!({"health": {"deviceTaints": {"enabled": false, "effect": "NoExecute"}}}));
    assert_eq!(off.health.unwrap().device_taints, None);
}

#[test]
fn a_health_section_without_the_new_settings_renders_the_same_bytes() {
    let h = valid(OPERATOR_NS, json!({"health": {"taint": {"enabled": true}}})).health.expect("health");
    let json = serde_json::to_string(&h).unwrap();
    assert!(!json.contains("thresholds") && !json.contains("deviceTaints"), "{json}");
    assert_eq!(
        json,
        r#"{"config":"neuron-monitor/c","taint":{"errors":["DMA_ERROR","HANG_ON_COLLECTIVES","HBM_UNCORRECTABLE_ERROR","NC_UNCORRECTABLE_ERROR","SRAM_UNCORRECTABLE_ERROR"]}}"#
    );
}

#[test]
fn invalid_thresholds_are_refused_by_field() {
    let t = |error: &str, count: i64, window: &str| json!({"error": error, "count": count, "window": window});
    let cases = [
        (vec![t("dma", 1, "1m")], "spec.health.thresholds[0].error"),
        (vec![t("DEVICE_STATE_INVALID", 2, "1m")], "spec.health.thresholds[0].error"),
        (vec![t("UNHEALTHY_COMPONENT", 2, "1m")], "spec.health.thresholds[0].error"),
        (vec![t("DMA_ERROR", 2, "1m"), t("DMA_ERROR", 3, "1m")], "spec.health.thresholds[1].error"),
        (vec![t("DMA_ERROR", 0, "1m")], "spec.health.thresholds[0].count"),
        (vec![t("DMA_ERROR", 101, "1m")], "spec.health.thresholds[0].count"),
        (vec![t("DMA_ERROR", 2, "500ms")], "spec.health.thresholds[0].window"),
        (vec![t("DMA_ERROR", 2, "25h")], "spec.health.thresholds[0].window"),
        (vec![t("DMA_ERROR", 2, "often")], "spec.health.thresholds[0].window"),
    ];
    for (thresholds, field) in cases {
        let refused = invalid(OPERATOR_NS, json!({"health": {"thresholds": thresholds}}));
        assert_eq!(refused.field, field, "{refused}");
    }
    let many: Vec<_> = (0..17).map(|i| t(&format!("E{i}"), 2, "1m")).collect();
    assert_eq!(invalid(OPERATOR_NS, json!({"health": {"thresholds": many}})).field, "spec.health.thresholds");
}

#[test]
fn prometheus_target_labels_and_the_metrics_own_are_refused_as_extra_labels() {
    for name in ["job", "instance", "node", "agent_pod", "mode", "pod", "neuroncore"] {
        let e = invalid("team-a", json!({"sinks": {"prometheus": {"extraLabels": {name: "x"}}}}));
        assert_eq!(e.field, format!("spec.sinks.prometheus.extraLabels[{name:?}]"), "{name}");
        assert_eq!(e.kind, Refusal::InvalidSpec);
    }
    assert!(validate(
        &nmc("team-a", "c", json!({"sinks": {"prometheus": {"extraLabels": {"team": "a"}}}})),
        OPERATOR_NS
    )
    .is_ok());
    // The CRD's CEL rule refuses the same names at admission.
    let crd = serde_json::to_string(&<NeuronMonitorConfig as kube::CustomResourceExt>::crd()).unwrap();
    for name in sinks::RESERVED_LABELS {
        assert!(crd.contains(&format!("'{name}'")), "the CRD's rule does not refuse {name}");
    }
}

#[test]
fn a_sink_that_would_create_too_many_series_on_a_node_is_refused_naming_it() {
    // The default sinks: 2,688 CloudWatch metrics, 6,016 OTLP series on the largest node.
    assert!(validate(
        &nmc("team-a", "c", json!({"sinks": {"cloudwatch": {"namespace": "N"}, "otlp": {}}})),
        OPERATOR_NS
    )
    .is_ok());
    // Four per-core roll-ups: 5 × 2,688.
    let per_core: Vec<_> =
        [["NodeName", "PodName"], ["ClusterName", "PodName"], ["NodeName", "ContainerName"], ["RuntimeTag", "PodName"]]
            .iter()
            .map(|set| json!([set[0], set[1], "NeuronCore"]))
            .collect();
    let e = invalid("team-a", json!({"sinks": {"cloudwatch": {"namespace": "N", "rollups": per_core}}}));
    assert_eq!((e.kind, e.field.as_str()), (Refusal::TooManySeries, "spec.sinks.cloudwatch"));
    assert!(e.reason.contains("13440 series") && e.reason.contains("128 NeuronCores"), "{e}");
    // An allow-list brings it under the bound.
    let fewer = json!({"sinks": {"cloudwatch": {"namespace": "N", "rollups": per_core, "metrics": ["neuroncore_utilization"]}}});
    assert!(validate(&nmc("team-a", "c", fewer), OPERATOR_NS).is_ok());
}

#[test]
fn gpu_settings_are_for_the_operator_namespace_only() {
    let refused = invalid("team-a", json!({"gpu": {"enabled": false}}));
    assert_eq!((refused.field.as_str(), refused.kind), ("spec.gpu", Refusal::InvalidSpec));
    assert_eq!(valid("team-a", json!({})).gpu, None);
    assert_eq!(valid(OPERATOR_NS, json!({})).gpu, None, "no gpu section: the agent's defaults");
}

#[test]
fn gpu_settings_default_to_on_at_the_configs_period() {
    let on = |period| Some(NodeGpu { enabled: true, period, groups: GpuGroups::ALL });
    assert_eq!(valid(OPERATOR_NS, json!({"gpu": {}})).gpu, on(secs(5)));
    assert_eq!(valid(OPERATOR_NS, json!({"period": "10s", "gpu": {}})).gpu, on(secs(10)));
    assert_eq!(valid(OPERATOR_NS, json!({"period": "10s", "gpu": {"period": "1m"}})).gpu, on(secs(60)));
    let off = valid(OPERATOR_NS, json!({"gpu": {"enabled": false, "period": "30s"}})).gpu;
    assert_eq!(off, Some(NodeGpu { enabled: false, period: secs(30), groups: GpuGroups::ALL }));
}

#[test]
fn gpu_groups_are_those_named_and_an_empty_list_or_an_unknown_name_is_refused() {
    let named = valid(OPERATOR_NS, json!({"gpu": {"groups": ["nvlink", "utilization"]}})).gpu.unwrap();
    assert_eq!(named.groups, [GpuGroup::Utilization, GpuGroup::Nvlink].into_iter().collect());
    let empty = invalid(OPERATOR_NS, json!({"gpu": {"groups": []}}));
    assert_eq!((empty.field.as_str(), empty.kind), ("spec.gpu.groups", Refusal::InvalidSpec));
    assert!(empty.to_string().contains("enabled"), "{empty}");
    // An unknown name never gets this far: the CRD's enumeration refuses it at admission,
    // and the spec does not parse.
    let spec = json!({"selector": {}, "gpu": {"groups": ["utilisation"]}});
    assert!(serde_json::from_value::<crate::crd::NeuronMonitorConfigSpec>(spec).is_err());
}

#[test]
fn invalid_gpu_periods_are_refused_by_field_even_while_off() {
    for period in ["500ms", "2h", "5", "fast", ""] {
        for enabled in [true, false] {
            let refused = invalid(OPERATOR_NS, json!({"gpu": {"enabled": enabled, "period": period}}));
            assert_eq!(refused.field, "spec.gpu.period", "{period}: {refused}");
            assert_eq!(refused.kind, Refusal::InvalidSpec);
        }
    }
}
