use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::crd::NeuronMonitorConfig;
use crate::duration::Period;
use crate::monitor_config::{RuntimeGroup, SystemGroup};
use k8s_openapi::api::core::v1::Node;
use regex::Regex;
use serde_json::json;

use super::*;
use crate::gpu_groups::GpuGroups;
use crate::validate::validate;

const OPERATOR_NS: &str = "neuron-monitor";

type TestNode = (String, BTreeMap<String, String>);

fn config(namespace: &str, name: &str, spec: serde_json::Value) -> ValidConfig {
    let mut c = NeuronMonitorConfig::new(name, serde_json::from_value(spec).unwrap());
    c.metadata.namespace = Some(namespace.to_owned());
    validate(&c, OPERATOR_NS).unwrap()
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn node(name: &str, kv: &[(&str, &str)]) -> (String, BTreeMap<String, String>) {
    (name.to_owned(), labels(kv))
}

fn periods<G: Copy>(groups: &[GroupConfig<G>]) -> Vec<(G, String)> {
    groups.iter().map(|g| (g.kind, g.period.map(|p| p.to_string()).unwrap_or_default())).collect()
}

fn only(tag_filter: &str, groups: &[&str]) -> serde_json::Value {
    let metrics: Vec<_> = groups.iter().map(|g| json!({"type": g})).collect();
    json!({"tagFilter": tag_filter, "metrics": metrics})
}

#[test]
fn one_default_config_collects_every_runtime_group_for_every_application() {
    let c = config("team-a", "c", json!({}));
    let out = render(&[&c]);
    assert_eq!(out.monitor.period, None);
    assert_eq!(out.monitor.neuron_runtimes.len(), 1);
    let entry = &out.monitor.neuron_runtimes[0];
    assert_eq!(entry.tag_filter, None);
    assert_eq!(periods(&entry.metrics), RuntimeGroup::ALL.map(|g| (g, "5s".to_owned())).to_vec());
    assert!(out.monitor.system_metrics.is_empty());
    assert_eq!(out.routes, vec![c.route.clone()]);
    // Every group carries its period, so neuron-monitor reads the same as we merged.
    for g in &entry.metrics {
        assert_eq!(out.monitor.group_period(entry, g), Period::from_secs(5));
    }
}

#[test]
fn the_shortest_period_of_any_config_wins_per_group() {
    let a = config("team-a", "a", json!({"period": "10s"}));
    let b = config(
        "team-b",
        "b",
        json!({"runtimes": [{"period": "2s", "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used", "period": "30s"}]}]}),
    );
    let c = config(
        OPERATOR_NS,
        "c",
        json!({"period": "1m", "runtimes": [],
               "systemMetrics": {"metrics": [{"type": "memory_info", "period": "3s"}, {"type": "vcpu_usage"}]}}),
    );
    let d = config(OPERATOR_NS, "d", json!({"period": "20s"}));
    let out = render(&[&a, &b, &c, &d]);
    let entry = &out.monitor.neuron_runtimes[0];
    assert_eq!(
        periods(&entry.metrics),
        vec![
            (RuntimeGroup::NeuroncoreCounters, "2s".into()),
            (RuntimeGroup::MemoryUsed, "10s".into()),
            (RuntimeGroup::NeuronRuntimeVcpuUsage, "10s".into()),
            (RuntimeGroup::ExecutionStats, "10s".into()),
        ]
    );
    assert_eq!(
        periods(&out.monitor.system_metrics),
        vec![
            (SystemGroup::VcpuUsage, "20s".into()),
            (SystemGroup::MemoryInfo, "3s".into()),
            (SystemGroup::NeuronHwCounters, "20s".into()),
        ]
    );
    assert_eq!(out.monitor.shortest_period(), Period::from_secs(2));
}

#[test]
fn tag_filters_merge_into_one_sorted_deduplicated_union() {
    let a =
        config("team-a", "a", json!({"runtimes": [only("^a-", &["memory_used"]), only("bert", &["execution_stats"])]}));
    let b = config(
        "team-b",
        "b",
        json!({"runtimes": [only("^a-", &["neuroncore_counters"]), only("(?i)llama|mistral", &["memory_used"])]}),
    );
    let out = render(&[&b, &a]);
    let entry = &out.monitor.neuron_runtimes[0];
    let union = entry.tag_filter.as_deref().unwrap();
    assert_eq!(union, "((?i)llama|mistral)|(^a-)|(bert)");
    assert_eq!(
        entry.metrics.iter().map(|g| g.kind).collect::<Vec<_>>(),
        vec![RuntimeGroup::NeuroncoreCounters, RuntimeGroup::MemoryUsed, RuntimeGroup::ExecutionStats]
    );
    // The union takes exactly what one of the filters takes.
    let re = Regex::new(union).unwrap();
    for (tag, taken) in
        [("a-1", true), ("xbertx", true), ("LLAMA-7b", true), ("Mistral", true), ("b-a-", false), ("gpt", false)]
    {
        assert_eq!(re.is_match(tag), taken, "{tag}");
    }

    // One filter stays as written.
    assert_eq!(render(&[&a]).monitor.neuron_runtimes[0].tag_filter.as_deref(), Some("(^a-)|(bert)"));
    let single = config("team-c", "c", json!({"runtimes": [only("^c$", &["memory_used"])]}));
    assert_eq!(render(&[&single]).monitor.neuron_runtimes[0].tag_filter.as_deref(), Some("^c$"));

    // A config taking every application removes the filter altogether.
    let every = config("team-d", "d", json!({"runtimes": [{"metrics": [{"type": "memory_used"}]}]}));
    assert_eq!(render(&[&a, &b, &every]).monitor.neuron_runtimes[0].tag_filter, None);

    // A union too long to be worth matching becomes "every application".
    let wide: Vec<ValidConfig> = (0..200)
        .map(|i| {
            config(
                &format!("team-{i}"),
                "c",
                json!({"runtimes": [only(&format!("^team-{i}-serve-[0-9]+-(online|batch|shadow)$"), &["memory_used"])]}),
            )
        })
        .collect();
    let refs: Vec<&ValidConfig> = wide.iter().collect();
    let union = render(&refs[..100]).monitor.neuron_runtimes[0].tag_filter.clone().unwrap();
    assert!(union.len() <= MAX_UNION_FILTER && Regex::new(&union).is_ok());
    assert_eq!(render(&refs).monitor.neuron_runtimes[0].tag_filter, None);

    // A config without runtime groups does not widen the filter.
    let system_only = config(OPERATOR_NS, "s", json!({"runtimes": []}));
    let out = render(&[&single, &system_only]);
    assert_eq!(out.monitor.neuron_runtimes[0].tag_filter.as_deref(), Some("^c$"));
    assert_eq!(out.monitor.system_metrics.len(), 3);
    let out = render(&[&system_only]);
    assert!(out.monitor.neuron_runtimes.is_empty());
}

#[test]
fn routes_are_sorted_by_config_and_scoped_by_namespace() {
    let team = config("team-a", "z", json!({}));
    let ops = config(OPERATOR_NS, "cluster", json!({}));
    let team_b = config("team-b", "a", json!({}));
    let out = render(&[&team_b, &team, &ops, &team]);
    let keys: Vec<_> = out.routes.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(keys, vec!["neuron-monitor/cluster", "team-a/z", "team-b/a"]);
    assert_eq!(out.routes[0].namespace, None);
    assert_eq!(out.routes[0].system_groups, SystemGroup::ALL.to_vec());
    assert_eq!(out.routes[1].namespace.as_deref(), Some("team-a"));
    assert!(out.routes[1].system_groups.is_empty());
}

/// A cluster with overlapping selectors: nodes of two instance types in two zones.
fn cluster() -> (Vec<TestNode>, Vec<ValidConfig>) {
    let nodes = vec![
        node("trn-a-1", &[("type", "trn1"), ("zone", "a")]),
        node("trn-a-2", &[("type", "trn1"), ("zone", "a")]),
        node("trn-b-1", &[("type", "trn1"), ("zone", "b")]),
        node("inf-a-1", &[("type", "inf2"), ("zone", "a"), ("spot", "true")]),
        node("inf-b-1", &[("type", "inf2"), ("zone", "b")]),
        node("gpu-1", &[("type", "p4d"), ("zone", "a")]),
    ];
    let configs = vec![
        config("team-a", "trn", json!({"nodeSelector": {"matchLabels": {"type": "trn1"}}, "period": "2s"})),
        config(
            "team-b",
            "zone-a",
            json!({"nodeSelector": {"matchLabels": {"zone": "a"}, "matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["p4d"]}]},
                                          "runtimes": [only("^b-", &["memory_used"])]}),
        ),
        config(
            "team-c",
            "on-demand",
            json!({"nodeSelector": {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}, {"key": "type", "operator": "In", "values": ["inf2", "trn1"]}]},
                                             "runtimes": [only("^c-", &["execution_stats"])]}),
        ),
        config(OPERATOR_NS, "inf", json!({"nodeSelector": {"matchLabels": {"type": "inf2"}}})),
        config("team-d", "nothing", json!({"nodeSelector": {"matchLabels": {"type": "trn2"}}})),
    ];
    (nodes, configs)
}

fn route_keys(config: &NodeConfig) -> Vec<&str> {
    config.routes.iter().map(|r| r.config.as_str()).collect()
}

#[test]
fn each_node_gets_the_configs_whose_selector_matches_it() {
    let (nodes, configs) = cluster();
    let out = render_all(&nodes, &configs).unwrap();
    let get = |n: &str| route_keys(out.get(n).unwrap());
    assert_eq!(get("trn-a-1"), vec!["team-a/trn", "team-b/zone-a", "team-c/on-demand"]);
    assert_eq!(get("trn-a-2"), get("trn-a-1"));
    assert_eq!(get("trn-b-1"), vec!["team-a/trn", "team-c/on-demand"]);
    assert_eq!(get("inf-a-1"), vec!["neuron-monitor/inf", "team-b/zone-a"]);
    assert_eq!(get("inf-b-1"), vec!["neuron-monitor/inf", "team-c/on-demand"]);
    // No config matches the GPU node: it is absent.
    assert!(out.get("gpu-1").is_none());
    assert_eq!(out.len(), 5);

    // The merged configuration of trn-a-1: team-a's default entry takes every application.
    let trn = &out.get("trn-a-1").unwrap().monitor;
    assert_eq!(trn.neuron_runtimes[0].tag_filter, None);
    assert!(trn.neuron_runtimes[0].metrics.iter().all(|g| g.period == Some(Period::from_secs(2))));
    assert!(trn.system_metrics.is_empty());
    // inf-b-1: the operator's config brings system groups and every application.
    let inf = &out.get("inf-b-1").unwrap().monitor;
    assert_eq!(inf.system_metrics.len(), 3);
    assert_eq!(inf.neuron_runtimes[0].tag_filter, None);
    // trn-b-1 with only filtered team configs besides team-a... team-a has no filter.
    // A node with only filtered configs gets their union:
    let only_filtered = render_all(&nodes, &configs[1..3]).unwrap();
    assert_eq!(
        only_filtered.get("trn-a-1").unwrap().monitor.neuron_runtimes[0].tag_filter.as_deref(),
        Some("(^b-)|(^c-)")
    );

    // Status counts.
    let count = |ns: &str, name: &str| out.matched_nodes(&ConfigKey { namespace: ns.into(), name: name.into() });
    assert_eq!(count("team-a", "trn"), 3);
    assert_eq!(count("team-b", "zone-a"), 3);
    assert_eq!(count("team-c", "on-demand"), 4);
    assert_eq!(count(OPERATOR_NS, "inf"), 2);
    assert_eq!(count("team-d", "nothing"), 0);
    assert_eq!(out.matched().len(), 5);
    let key = ConfigKey { namespace: "team-b".into(), name: "zone-a".into() };
    let mut names: Vec<_> = out.matched_node_names(&key).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["inf-a-1", "trn-a-1", "trn-a-2"]);

    // Counting per config with a predicate on nodes (e.g. "applied").
    let applied = out.count_matched_where(|node, _| node.starts_with("trn-a"));
    assert_eq!(applied[&ConfigKey { namespace: "team-a".into(), name: "trn".into() }], 2);
    assert_eq!(applied[&ConfigKey { namespace: "team-c".into(), name: "on-demand".into() }], 2);
    assert_eq!(applied[&ConfigKey { namespace: OPERATOR_NS.into(), name: "inf".into() }], 0);
    assert_eq!(applied.len(), 5);
    assert_eq!(out.count_matched_where(|_, _| true), *out.matched());

    // Nodes with the same configs share one rendering.
    assert_eq!(out.groups().len(), 4);
    let shared = out.groups().iter().find(|g| g.nodes.len() == 2).unwrap();
    assert_eq!(shared.nodes, vec!["trn-a-1", "trn-a-2"]);
    assert_eq!(shared.configs.len(), 3);
    let r = out.rendered("trn-a-2").unwrap();
    assert_eq!(r.json, serde_json::to_string(&r.config).unwrap());
    assert_eq!(r.hash, crate::node_config::content_hash(r.json.as_bytes()));
    assert_eq!(out.iter().count(), 5);
}

#[test]
fn render_all_agrees_with_rendering_each_node_alone() {
    let (nodes, configs) = many(300, 120, 7);
    let out = render_all(&nodes, &configs).unwrap();
    let mut rendered = 0;
    for (name, labels) in &nodes {
        let alone = render_node(labels, &configs);
        assert_eq!(out.get(name), alone.as_ref(), "{name}");
        rendered += usize::from(alone.is_some());
    }
    assert_eq!(out.len(), rendered);
    assert!(out.groups().len() > 3 && out.groups().len() < nodes.len());
    for c in &configs {
        let by_node = nodes.iter().filter(|(_, l)| c.matches(l)).count();
        assert_eq!(out.matched_nodes(&c.key), by_node, "{}", c.key);
        assert_eq!(out.matched_node_names(&c.key).count(), by_node, "{}", c.key);
    }
}

#[test]
fn output_is_byte_identical_whatever_the_input_order() {
    let (nodes, configs) = many(200, 150, 11);
    let reference = render_all(&nodes, &configs).unwrap();
    let json_of =
        |r: &Rendering| -> Vec<(String, String)> { r.iter().map(|(n, c)| (n.to_owned(), c.json.clone())).collect() };
    let expected = json_of(&reference);
    for seed in 1..6u64 {
        let mut nodes = nodes.clone();
        let mut configs = configs.clone();
        shuffle(&mut nodes, seed);
        shuffle(&mut configs, seed * 31);
        let again = render_all(&nodes, &configs).unwrap();
        assert_eq!(json_of(&again), expected, "seed {seed}");
        assert_eq!(again, reference, "seed {seed}");
        // The single-node path gives the same bytes too.
        for (name, labels) in nodes.iter().take(20) {
            if let Some(alone) = render_node(labels, &configs) {
                assert_eq!(
                    serde_json::to_vec(&alone).unwrap(),
                    serde_json::to_vec(reference.get(name).unwrap()).unwrap()
                );
            }
        }
    }
}

#[test]
fn nodes_can_be_given_as_node_objects() {
    let mut n = Node::default();
    n.metadata.name = Some("trn-1".into());
    n.metadata.labels = Some(labels(&[("type", "trn1")]));
    let unnamed = Node::default();
    let nodes = vec![Arc::new(n), Arc::new(unnamed)];
    let configs = vec![config("team-a", "a", json!({}))];
    let out = render_all(&nodes, &configs).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out.get("trn-1").is_some());
    let borrowed: Vec<(&str, &BTreeMap<String, String>)> = vec![("x", nodes[0].node_labels())];
    assert_eq!(render_all(&borrowed, &configs).unwrap().len(), 1);
}

#[test]
fn duplicate_nodes_and_configs_count_once_and_nothing_renders_nothing() {
    let (nodes, configs) = cluster();
    let mut doubled_nodes = nodes.clone();
    doubled_nodes.extend(nodes.iter().cloned());
    let mut doubled_configs = configs.clone();
    doubled_configs.extend(configs.iter().cloned());
    assert_eq!(render_all(&doubled_nodes, &doubled_configs).unwrap(), render_all(&nodes, &configs).unwrap());
    assert!(render_all(&nodes, &[]).unwrap().is_empty());
    let none: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    let out = render_all(&none, &configs).unwrap();
    assert!(out.is_empty() && out.matched().values().all(|n| *n == 0));
    assert_eq!(render_node(&labels(&[("type", "p4d")]), &configs[..1]), None);
}

// ---- a larger random cluster ---------------------------------------------------------

fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// `node_count` nodes and `config_count` configs over 40 namespaces with varied
/// selectors, filters and periods.
fn many(node_count: usize, config_count: usize, seed: u64) -> (Vec<TestNode>, Vec<ValidConfig>) {
    let mut state = seed | 1;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let types = ["inf2.xlarge", "trn1.32xlarge", "trn2.48xlarge"];
    let zones = ["a", "b", "c"];
    let periods = ["1s", "2s", "5s", "30s", "1m"];
    let nodes: Vec<_> = (0..node_count)
        .map(|i| {
            let mut l = labels(&[("type", types[next(3)]), ("zone", zones[next(3)]), ("host", &format!("h{i}"))]);
            if next(4) == 0 {
                l.insert("spot".into(), "true".into());
            }
            (format!("node-{i:04}"), l)
        })
        .collect();
    let configs = (0..config_count)
        .map(|i| {
            let operator = i % 25 == 0;
            let ns = if operator { OPERATOR_NS.to_owned() } else { format!("team-{}", i % 40) };
            let mut spec = json!({"period": periods[next(5)]});
            match next(6) {
                0 => spec["nodeSelector"] = json!({"matchLabels": {"type": types[next(3)]}}),
                1 => spec["nodeSelector"] = json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": [zones[next(3)]]}]}),
                2 => spec["nodeSelector"] = json!({"matchExpressions": [{"key": "spot", "operator": "Exists"}]}),
                3 => spec["nodeSelector"] = json!({"matchExpressions": [{"key": "host", "operator": "In", "values": [format!("h{}", next(node_count))]}]}),
                _ => {}
            }
            if next(3) > 0 {
                let groups = ["neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"];
                let first = next(4);
                let entries: Vec<_> = (0..1 + next(2))
                    .map(|e| json!({"tagFilter": format!("^{ns}-{e}-"), "period": periods[next(5)],
                                    "metrics": [{"type": groups[(first + e) % 4]}, {"type": groups[(first + e + 1) % 4], "period": periods[next(5)]}]}))
                    .collect();
                spec["runtimes"] = json!(entries);
            }
            if operator && next(2) == 0 {
                spec["systemMetrics"] = json!({"metrics": [{"type": "vcpu_usage", "period": periods[next(5)]}]});
            }
            config(&ns, &format!("c{i}"), spec)
        })
        .collect();
    (nodes, configs)
}

// ---- room on a node (crate::limits) ----------------------------------------------------

use crate::limits::{
    MAX_CONFIGS_PER_NAMESPACE_PER_NODE, MAX_EXTRA_LABELS_PER_SERIES, MAX_NAMESPACE_RENDERED_BYTES_PER_NODE,
    MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE, MAX_NODE_RENDERED_BYTES, MAX_NODE_TAG_FILTER_COST,
};
use crate::validate::Refusal;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A config created `at` seconds after a fixed instant.
fn created(namespace: &str, name: &str, at: i64, spec: serde_json::Value) -> ValidConfig {
    let mut c = NeuronMonitorConfig::new(name, serde_json::from_value(spec).unwrap());
    c.metadata.namespace = Some(namespace.to_owned());
    c.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + at).unwrap()));
    validate(&c, OPERATOR_NS).unwrap()
}

/// A spec of `entries` runtime entries with ~1,000-byte tag filters (about 1 kB each).
fn bulky(unique: usize, entries: usize) -> serde_json::Value {
    let runtimes: Vec<_> = (0..entries)
        .map(|e| json!({"tagFilter": format!("^{unique:03}-{e:02}-{}", "a".repeat(990)), "metrics": [{"type": "memory_used"}]}))
        .collect();
    json!({"runtimes": runtimes})
}

/// A spec with these extra Prometheus labels.
fn labelled(names: &[String]) -> serde_json::Value {
    let labels: serde_json::Map<_, _> = names.iter().map(|n| (n.clone(), json!("v"))).collect();
    json!({"sinks": {"prometheus": {"extraLabels": labels}}})
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}_{i:02}")).collect()
}

fn refusal_kind(out: &Rendering, namespace: &str, name: &str) -> Option<Refusal> {
    let key = ConfigKey { namespace: namespace.into(), name: name.into() };
    out.refusal(&key).map(|r| r.kind)
}

#[test]
fn a_namespace_fills_its_room_on_a_node_oldest_first_and_the_newest_are_refused() {
    let nodes = vec![node("n1", &[]), node("n2", &[])];
    // 20 configs of ~3 kB in one namespace, created one second apart, listed newest first.
    let mut configs: Vec<ValidConfig> =
        (0..20).rev().map(|i| created("team-a", &format!("m{i:02}"), i, bulky(i as usize, 3))).collect();
    configs.push(created("team-b", "other", 99, json!({})));
    configs.push(created(OPERATOR_NS, "cluster", 100, json!({})));
    let per_config = configs[0].rendered_bytes;
    let fits = MAX_NAMESPACE_RENDERED_BYTES_PER_NODE / per_config;
    assert!(fits > 2 && fits < 20, "{per_config} bytes per config");

    let out = render_all(&nodes, &configs).unwrap();
    for i in 0..20 {
        let kind = refusal_kind(&out, "team-a", &format!("m{i:02}"));
        assert_eq!(kind, (i >= fits).then_some(Refusal::NamespaceLimit), "m{i:02}");
    }
    let refused = out.refusal(&ConfigKey { namespace: "team-a".into(), name: "m19".into() }).unwrap();
    assert_eq!(refused.field, "spec.nodeSelector");
    assert!(refused.reason.contains("2 of 2 matched node(s), such as n1"), "{refused}");
    assert!(refused.reason.contains(&MAX_NAMESPACE_RENDERED_BYTES_PER_NODE.to_string()), "{refused}");
    // Everything else still renders, and a refused config is on no node.
    let routes = route_keys(out.get("n1").unwrap()).len();
    assert_eq!(routes, fits + 2);
    assert_eq!(out.matched_nodes(&ConfigKey { namespace: "team-a".into(), name: "m19".into() }), 2);
    assert_eq!(out.matched_node_names(&ConfigKey { namespace: "team-a".into(), name: "m19".into() }).count(), 0);
    // The same verdicts whatever the input order.
    for seed in 1..4 {
        let mut shuffled = configs.clone();
        shuffle(&mut shuffled, seed);
        assert_eq!(render_all(&nodes, &shuffled).unwrap(), out, "seed {seed}");
    }
}

#[test]
fn configs_per_namespace_per_node_are_bounded() {
    let nodes = vec![node("n1", &[])];
    let configs: Vec<ValidConfig> = (0..20).map(|i| created("team-a", &format!("c{i:02}"), i, json!({}))).collect();
    let out = render_all(&nodes, &configs).unwrap();
    assert_eq!(out.get("n1").unwrap().routes.len(), MAX_CONFIGS_PER_NAMESPACE_PER_NODE);
    assert_eq!(out.refused().len(), 20 - MAX_CONFIGS_PER_NAMESPACE_PER_NODE);
    assert!(out.refused().values().all(|r| r.kind == Refusal::NamespaceLimit && r.field == "spec.nodeSelector"));
    assert_eq!(refusal_kind(&out, "team-a", "c15"), None);
    assert_eq!(refusal_kind(&out, "team-a", "c16"), Some(Refusal::NamespaceLimit));
}

#[test]
fn a_full_node_refuses_the_newest_configs_and_the_operator_namespace_comes_first() {
    let nodes = vec![node("n1", &[])];
    // 30 namespaces of two ~15 kB configs each: more than a node takes.
    let mut configs = Vec::new();
    for ns in 0..30 {
        for c in 0..2 {
            let at = (ns * 2 + c) as i64;
            configs.push(created(&format!("team-{ns:02}"), &format!("c{c}"), at, bulky(ns * 2 + c, 15)));
        }
    }
    // The administrator's config is the newest, and still comes first.
    configs.push(created(OPERATOR_NS, "cluster", 1000, bulky(999, 15)));
    let out = render_all(&nodes, &configs).unwrap();
    assert_eq!(refusal_kind(&out, OPERATOR_NS, "cluster"), None);
    let rendered = out.rendered("n1").unwrap();
    let bytes: usize = rendered.config.routes.iter().map(|r| serde_json::to_string(r).unwrap().len()).sum();
    assert!(bytes <= MAX_NODE_RENDERED_BYTES, "{bytes}");
    assert!(rendered.json.len() + serde_json::to_string_pretty(&rendered.config.monitor).unwrap().len() < 1024 * 1024);
    // The oldest team configs are in, the newest refused; none is half-in.
    assert_eq!(refusal_kind(&out, "team-00", "c0"), None);
    assert_eq!(refusal_kind(&out, "team-29", "c1"), Some(Refusal::NodeLimit));
    let refused = out.refused().len();
    assert!(refused > 0 && refused < 60, "{refused}");
    assert_eq!(rendered.config.routes.len() + refused, 61);
    let order: Vec<bool> = (0..60)
        .map(|i| {
            out.refused().keys().any(|k| k.namespace == format!("team-{:02}", i / 2) && k.name == format!("c{}", i % 2))
        })
        .collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "refusals are the newest: {order:?}");
}

#[test]
fn a_config_that_does_not_fit_on_one_of_its_nodes_is_on_none() {
    let nodes = vec![node("a", &[("host", "a")]), node("b", &[("host", "b")])];
    let mut configs: Vec<ValidConfig> = (0..16)
        .map(|i| {
            created("team-a", &format!("pinned-{i:02}"), i, json!({"nodeSelector": {"matchLabels": {"host": "a"}}}))
        })
        .collect();
    configs.push(created("team-a", "everywhere", 100, json!({})));
    let out = render_all(&nodes, &configs).unwrap();
    let refused = out.refusal(&ConfigKey { namespace: "team-a".into(), name: "everywhere".into() }).unwrap();
    assert_eq!(refused.kind, Refusal::NamespaceLimit);
    assert!(refused.reason.contains("1 of 2 matched node(s), such as a"), "{refused}");
    assert!(out.get("b").is_none(), "node b carries nothing rather than half the config");
    assert_eq!(out.get("a").unwrap().routes.len(), 16);
}

#[test]
fn extra_labels_a_series_would_carry_are_bounded_per_namespace_with_the_operators_first() {
    let nodes = vec![node("n1", &[])];
    let configs = vec![
        // On every series: 10 + 16 labels.
        created(OPERATOR_NS, "c1", 50, labelled(&names("c", 10))),
        created(OPERATOR_NS, "c2", 60, labelled(&names("d", 16))),
        // team-a: the older config takes 16 more (42 > 32): refused, though older than c1.
        created("team-a", "a1", 0, labelled(&names("a", 16))),
        // 6 new names (32): fits; a config repeating names adds none.
        created("team-a", "a2", 1, labelled(&names("b", 6))),
        created("team-a", "a3", 2, labelled(&names("b", 6))),
        created("team-a", "a4", 3, labelled(&names("e", 1))),
        // Prometheus off: no label on any series.
        created("team-a", "a5", 4, json!({"sinks": {"prometheus": {"enabled": false, "extraLabels": {"z": "1"}}}})),
        // Another namespace's series are its own.
        created("team-b", "b1", 5, labelled(&names("b", 6))),
        created("team-b", "b2", 6, labelled(&names("f", 1))),
    ];
    let out = render_all(&nodes, &configs).unwrap();
    let kinds: Vec<(&str, Option<Refusal>)> =
        configs.iter().map(|c| (c.key.name.as_str(), refusal_kind(&out, &c.key.namespace, &c.key.name))).collect();
    assert_eq!(
        kinds,
        vec![
            ("c1", None),
            ("c2", None),
            ("a1", Some(Refusal::TooManyLabels)),
            ("a2", None),
            ("a3", None),
            ("a4", Some(Refusal::TooManyLabels)),
            ("a5", None),
            ("b1", None),
            ("b2", Some(Refusal::TooManyLabels)),
        ]
    );
    let refused = out.refusal(&ConfigKey { namespace: "team-a".into(), name: "a1".into() }).unwrap();
    assert_eq!(refused.field, "spec.sinks.prometheus.extraLabels");
    assert!(refused.reason.contains("42 extra labels"), "{refused}");
    assert!(refused.reason.contains(&format!("at most {MAX_EXTRA_LABELS_PER_SERIES}")), "{refused}");

    // The operator namespace's configs are bounded among themselves too.
    let configs = vec![
        created(OPERATOR_NS, "c1", 0, labelled(&names("c", 16))),
        created(OPERATOR_NS, "c2", 1, labelled(&names("d", 16))),
        created(OPERATOR_NS, "c3", 2, labelled(&names("e", 1))),
    ];
    let out = render_all(&nodes, &configs).unwrap();
    assert_eq!(refusal_kind(&out, OPERATOR_NS, "c2"), None);
    assert_eq!(refusal_kind(&out, OPERATOR_NS, "c3"), Some(Refusal::TooManyLabels));
}

#[test]
fn sixty_configs_of_sixteen_labels_on_the_same_runtimes_add_at_most_the_bound() {
    // Issue 10, item 10: 60 such configs put 968 labels on each series.
    let nodes = vec![node("n1", &[])];
    let configs: Vec<ValidConfig> = (0..60)
        .map(|i| created(OPERATOR_NS, &format!("l{i:02}"), i, labelled(&names(&format!("x{i:02}"), 16))))
        .collect();
    let out = render_all(&nodes, &configs).unwrap();
    let on_series: BTreeSet<&String> = out
        .get("n1")
        .unwrap()
        .routes
        .iter()
        .flat_map(|r| r.prometheus.iter().flat_map(|p| p.extra_labels.keys()))
        .collect();
    assert_eq!(on_series.len(), MAX_EXTRA_LABELS_PER_SERIES);
    assert_eq!(out.refused().len(), 58);
}

#[test]
fn a_node_takes_the_oldest_health_settings_and_the_others_are_told() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let aged = |name: &str, secs: i64, spec: serde_json::Value| {
        let mut c = NeuronMonitorConfig::new(name, serde_json::from_value(spec).unwrap());
        c.metadata.namespace = Some(OPERATOR_NS.to_owned());
        c.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap()));
        validate(&c, OPERATOR_NS).unwrap()
    };
    let old = aged("z-old", 100, json!({"health": {"conditionType": "OldType"}}));
    let new = aged(
        "a-new",
        200,
        json!({"health": {"conditionType": "NewType"}, "nodeSelector": {"matchLabels": {"pool": "x"}}}),
    );
    let plain = aged("b-plain", 50, json!({}));
    let nodes = [node("n1", &[("pool", "x")]), node("n2", &[])];
    let rendering = render_all(nodes.iter(), &[new.clone(), plain.clone(), old.clone()]).unwrap();
    for n in ["n1", "n2"] {
        let health = rendering.get(n).unwrap().health.as_ref().expect("health settings");
        assert_eq!(
            health.condition_type.as_deref(),
            Some("OldType"),
            "{n}: the oldest config's, not the first by name"
        );
    }
    let conflicts = rendering.health_conflicts();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    let conflict = &conflicts[&new.key];
    assert_eq!((conflict.nodes, conflict.in_force.as_str()), (1, "neuron-monitor/z-old"));
    // Alone, the newer one is in force; without any, nothing is rendered (same hash as before).
    let alone = render_all(nodes.iter(), &[new.clone(), plain.clone()]).unwrap();
    assert_eq!(alone.get("n1").unwrap().health.as_ref().unwrap().condition_type.as_deref(), Some("NewType"));
    assert_eq!(alone.get("n2").unwrap().health, None);
    assert!(!alone.rendered("n2").unwrap().json.contains("health"), "absent from the JSON");
    assert!(alone.health_conflicts().is_empty());
}

/// A spec whose runtime entries have these tag filters.
fn filtered(filters: &[String]) -> serde_json::Value {
    let runtimes: Vec<_> = filters.iter().map(|f| only(f, &["memory_used"])).collect();
    json!({"runtimes": runtimes})
}

/// `count` distinct tag filters of ~150 KiB each compiled (`\pL{6}` and a suffix).
fn costly_filters(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!(r"\pL{{6}}{prefix}{i:02}")).collect()
}

fn refusal_of<'a>(out: &'a Rendering, namespace: &str, name: &str) -> Option<&'a crate::validate::Invalid> {
    out.refused().get(&ConfigKey { namespace: namespace.into(), name: name.into() })
}

/// Issue 24: one namespace's costly tag filters count against its budget on each node;
/// the newer config that takes it over is refused naming the filter, the older ones and
/// other namespaces' keep theirs, and a filter already counted costs nothing more.
#[test]
fn a_namespaces_tag_filters_are_bounded_per_node_and_never_evict_another_namespace() {
    let one = crate::tag_filter::TagFilter::new(&costly_filters("a", 1)[0]).unwrap().cost();
    let fits = MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE / one;
    assert!((4..16).contains(&fits), "{one} bytes per filter");
    let first = costly_filters("a", fits - 2);
    let nodes = vec![node("n1", &[])];
    let configs = vec![
        created("team-a", "first", 0, filtered(&first)),
        // The same filters again: nothing more to compile.
        created("team-a", "again", 1, filtered(&first)),
        created("team-a", "greedy", 2, filtered(&costly_filters("b", 4))),
        // A newer team with as much: its own budget.
        created("team-b", "late", 3, filtered(&costly_filters("c", fits - 1))),
    ];
    let out = render_all(&nodes, &configs).unwrap();
    for (ns, name) in [("team-a", "first"), ("team-a", "again"), ("team-b", "late")] {
        assert!(refusal_of(&out, ns, name).is_none(), "{ns}/{name}: {:?}", refusal_of(&out, ns, name));
    }
    let refused = refusal_of(&out, "team-a", "greedy").expect("over the namespace's budget");
    assert_eq!(refused.kind, Refusal::NamespaceLimit);
    // The third new filter takes the namespace over: fits - 2 + 3 > fits.
    assert_eq!(refused.field, "spec.runtimes[2].tagFilter");
    assert!(refused.reason.contains("tag filters") && refused.reason.contains("KiB"), "{}", refused.reason);
    // The same verdicts whatever the input order.
    let mut reversed = configs.clone();
    reversed.reverse();
    assert_eq!(render_all(&nodes, &reversed).unwrap(), out);
}

/// A node's distinct tag filters, over all namespaces, stay within what the agent holds.
#[test]
fn a_nodes_tag_filters_are_bounded() {
    let one = crate::tag_filter::TagFilter::new(&costly_filters("n", 1)[0]).unwrap().cost();
    let per_namespace = MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE / one;
    let namespaces = MAX_NODE_TAG_FILTER_COST / (per_namespace * one) + 2;
    let configs: Vec<ValidConfig> = (0..namespaces)
        .map(|n| {
            created(
                &format!("team-{n:02}"),
                "c",
                n as i64,
                filtered(&costly_filters(&format!("n{n:02}x"), per_namespace)),
            )
        })
        .collect();
    let out = render_all(&[node("n1", &[])], &configs).unwrap();
    let refused: Vec<_> = out.refused().iter().map(|(k, r)| (k.namespace.as_str(), r.kind)).collect();
    assert!(!refused.is_empty() && refused.iter().all(|(_, kind)| *kind == Refusal::NodeLimit), "{refused:?}");
    // The newest namespaces are the ones refused.
    assert!(refused.iter().all(|(ns, _)| *ns >= format!("team-{:02}", namespaces - 3).as_str()), "{refused:?}");
}

#[test]
fn a_node_collects_its_gpus_when_any_config_asks_at_the_shortest_period() {
    let fast = config(OPERATOR_NS, "fast", json!({"gpu": {"period": "2s"}}));
    let slow = config(OPERATOR_NS, "slow", json!({"gpu": {"period": "30s"}}));
    let off = config(OPERATOR_NS, "off", json!({"gpu": {"enabled": false, "period": "1s"}}));
    let team = config("team-a", "team", json!({}));
    let gpu = |configs: &[&ValidConfig]| render(configs).gpu;
    let all = GpuGroups::ALL;
    let on = |s| Some(NodeGpu { enabled: true, period: Period::from_secs(s), groups: all });
    assert_eq!(gpu(&[&slow, &fast, &team]), on(2));
    assert_eq!(gpu(&[&off, &slow]), on(30), "one config off does not switch off another's");
    assert_eq!(gpu(&[&off, &team]), Some(NodeGpu { enabled: false, period: Period::from_secs(1), groups: all }));
    assert_eq!(gpu(&[&team]), None);
}

#[test]
fn configs_without_gpu_settings_render_as_before() {
    // The JSON (and so the ConfigMap's hash) of configs without `gpu` has no trace of it.
    let configs = [config(OPERATOR_NS, "ops", json!({"period": "10s"})), config("team-a", "team", json!({}))];
    let rendered = RenderedNode::new(render(&configs.iter().collect::<Vec<_>>())).unwrap();
    assert!(!rendered.json.contains("gpu"), "{}", rendered.json);
    let with = config(OPERATOR_NS, "ops", json!({"period": "10s", "gpu": {}}));
    let both = RenderedNode::new(render(&[&with, &configs[1]])).unwrap();
    assert_ne!(both.hash, rendered.hash);
    assert!(both.json.ends_with(r#","gpu":{"enabled":true,"period":"10s"}}"#), "{}", both.json);
}
