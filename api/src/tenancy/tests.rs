use serde_json::json;

use super::*;

fn policy(value: serde_json::Value) -> Result<TenancyPolicy, PolicyError> {
    let spec: PolicySpec =
        serde_json::from_value(value).map_err(|e| PolicyError { field: "(parse)".into(), reason: e.to_string() })?;
    TenancyPolicy::compile(&spec)
}

fn spec(value: serde_json::Value) -> NeuronMonitorConfigSpec {
    serde_json::from_value(value).unwrap()
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn nodes(regions: &[(&str, &str)]) -> NodeRegions {
    regions.iter().map(|(r, n)| (r.to_string(), n.to_string())).collect()
}

/// The field a team config is refused for under the built-in policy on a node of
/// us-west-2, if any.
fn refused_field(namespace: &str, value: serde_json::Value) -> Option<String> {
    let built_in = TenancyPolicy::default();
    let rules = built_in.rules_for(namespace, &no_labels());
    let nodes = nodes(&[("us-west-2", "node-a")]);
    check_targets(&spec(value), namespace, namespace == "neuron-monitor", rules, &nodes).err().map(|e| {
        assert_eq!(e.kind, Refusal::OutsidePolicy, "{e}");
        e.field
    })
}

fn cloudwatch(namespace: &str) -> serde_json::Value {
    json!({ "sinks": { "cloudwatch": { "namespace": namespace } } })
}

#[test]
fn the_built_in_policy_gives_each_team_its_own_prefix_and_nothing_else() {
    assert_eq!(refused_field("team-a", cloudwatch("Teams/team-a/Neuron")), None);
    assert_eq!(refused_field("team-a", cloudwatch("Teams/team-a/serving/latency")), None);
    // The attack: another team's namespace, or one outside any team's.
    for other in ["Teams/team-b/Neuron", "TeamB/Neuron", "Teams/team-a", "Teams/team-ab/Neuron", "teams/team-a/Neuron"]
    {
        assert_eq!(
            refused_field("team-a", cloudwatch(other)).as_deref(),
            Some("spec.sinks.cloudwatch.namespace"),
            "{other}"
        );
    }
    // The operator's namespace is the cluster operator's.
    assert_eq!(refused_field("neuron-monitor", cloudwatch("Anything/At/All")), None);
    let policy = TenancyPolicy::default();
    let rules = policy.rules_for("team-a", &no_labels());
    assert_eq!((rules.regions.as_ref(), rules.otlp_endpoints.len(), rules.monthly_cost_ceiling_usd), (None, 0, None));
}

#[test]
fn a_region_of_another_partition_is_refused_for_every_sink_and_every_namespace() {
    let gov = |sinks: serde_json::Value| spec(json!({ "sinks": sinks }));
    let cases = [
        (
            gov(json!({ "cloudwatch": { "namespace": "Teams/team-a/N", "region": "us-gov-west-1" } })),
            "spec.sinks.cloudwatch.region",
        ),
        (gov(json!({ "otlp": { "region": "us-gov-west-1" } })), "spec.sinks.otlp.region"),
        (gov(json!({ "otlp": { "region": "cn-north-1" } })), "spec.sinks.otlp.region"),
    ];
    let policy = TenancyPolicy::default();
    let on_aws = nodes(&[("us-west-2", "node-a")]);
    for (config, field) in &cases {
        for (namespace, cluster_wide) in [("team-a", false), ("neuron-monitor", true)] {
            let e = check_targets(config, namespace, cluster_wide, policy.rules_for(namespace, &no_labels()), &on_aws)
                .unwrap_err();
            assert_eq!((e.kind, e.field.as_str()), (Refusal::OutsidePolicy, *field), "{namespace}: {e}");
            assert!(e.reason.contains("node node-a is in aws (us-west-2)"), "{e}");
        }
    }
    // The health event stream too (a config of the operator's namespace).
    let logs = spec(json!({ "health": { "logs": { "region": "us-gov-east-1" } } }));
    let e = check_targets(&logs, "neuron-monitor", true, policy.rules_for("neuron-monitor", &no_labels()), &on_aws)
        .unwrap_err();
    assert_eq!(e.field, "spec.health.logs.region");
    // Another region of the node's partition is taken; so is any, where no node's region is known.
    let east = gov(json!({ "cloudwatch": { "namespace": "Teams/team-a/N", "region": "us-east-1" } }));
    assert!(check_targets(&east, "team-a", false, policy.rules_for("team-a", &no_labels()), &on_aws).is_ok());
    let (config, _) = &cases[0];
    assert!(
        check_targets(config, "team-a", false, policy.rules_for("team-a", &no_labels()), &NodeRegions::new()).is_ok()
    );
    // GovCloud nodes may use GovCloud regions, and no other.
    let on_gov = nodes(&[("us-gov-west-1", "gov-node")]);
    assert!(check_targets(config, "team-a", false, policy.rules_for("team-a", &no_labels()), &on_gov).is_ok());
    assert!(check_targets(&east, "team-a", false, policy.rules_for("team-a", &no_labels()), &on_gov).is_err());
}

#[test]
fn a_region_list_holds_named_regions_and_the_nodes_own() {
    let policy = policy(json!({ "default": { "regions": ["us-east-1", "us-west-2"] } })).unwrap();
    let rules = policy.rules_for("team-a", &no_labels());
    let named =
        |region: &str| spec(json!({ "sinks": { "cloudwatch": { "namespace": "Teams/team-a/N", "region": region } } }));
    let west = nodes(&[("us-west-2", "w")]);
    assert!(check_targets(&named("us-east-1"), "team-a", false, rules, &west).is_ok());
    let e = check_targets(&named("eu-west-1"), "team-a", false, rules, &west).unwrap_err();
    assert_eq!(e.field, "spec.sinks.cloudwatch.region");
    assert!(e.reason.contains("\"us-east-1\", \"us-west-2\""), "{e}");
    // Without a region the node's is used: it must be listed.
    let unnamed = spec(json!({ "sinks": { "otlp": {} } }));
    assert!(check_targets(&unnamed, "team-a", false, rules, &west).is_ok());
    let e = check_targets(&unnamed, "team-a", false, rules, &nodes(&[("eu-west-1", "eu-node")])).unwrap_err();
    assert_eq!(e.field, "spec.sinks.otlp.region");
    assert!(e.reason.contains("eu-node"), "{e}");
    // The operator's namespace is not held to the list, only to the partition.
    assert!(check_targets(&named("eu-west-1"), "neuron-monitor", true, rules, &west).is_ok());
}

#[test]
fn otlp_endpoints_are_none_by_default_and_matched_exactly_when_listed() {
    let to = |url: &str| spec(json!({ "sinks": { "otlp": { "endpoint": url } } }));
    let west = nodes(&[("us-west-2", "w")]);
    let built_in = TenancyPolicy::default();
    let e = check_targets(
        &to("http://collector.example:4318/v1/metrics"),
        "team-a",
        false,
        built_in.rules_for("team-a", &no_labels()),
        &west,
    )
    .unwrap_err();
    assert_eq!(e.field, "spec.sinks.otlp.endpoint");
    assert!(e.reason.contains("allows none"), "{e}");
    // CloudWatch's own OTLP endpoint (no endpoint) is always allowed.
    assert!(check_targets(
        &spec(json!({ "sinks": { "otlp": {} } })),
        "team-a",
        false,
        built_in.rules_for("team-a", &no_labels()),
        &west
    )
    .is_ok());

    let listed = policy(json!({ "default": { "otlpEndpoints": [
        "http://otel-collector.observability:4318/v1/metrics",
        "https://gateway.example/{namespace}/",
    ] } }))
    .unwrap();
    let rules = listed.rules_for("team-a", &no_labels());
    for ok in [
        "http://otel-collector.observability:4318/v1/metrics",
        "http://OTEL-COLLECTOR.observability:4318/v1/metrics",
        "https://gateway.example/team-a/v1/metrics",
        "https://gateway.example:443/team-a/v1/metrics",
    ] {
        assert!(check_targets(&to(ok), "team-a", false, rules, &west).is_ok(), "{ok}");
    }
    for crafted in [
        // A trailing dot: refused by the sink's parser, which the policy now shares.
        "http://otel-collector.observability.:4318/v1/metrics",
        "http://otel-collector.observability:4318@evil.example/v1/metrics",
        "http://otel-collector.observability:4318/v1/metrics/../../admin",
        "http://otel-collector.observability.evil.example:4318/v1/metrics",
        "http://otel-collector.observability:4319/v1/metrics",
        "https://otel-collector.observability:4318/v1/metrics",
        "https://gateway.example/team-b/v1/metrics",
        "https://gateway.example/team-ab/v1/metrics",
        "https://gateway.example/team-a/../team-b/v1/metrics",
        "https://gateway.example/team-a%2f..%2fteam-b/v1/metrics",
    ] {
        let e = check_targets(&to(crafted), "team-a", false, rules, &west).unwrap_err();
        assert_eq!((e.kind, e.field.as_str()), (Refusal::OutsidePolicy, "spec.sinks.otlp.endpoint"), "{crafted}");
    }
    // Team b's own path is team b's.
    assert!(check_targets(
        &to("https://gateway.example/team-b/v1/metrics"),
        "team-b",
        false,
        listed.rules_for("team-b", &no_labels()),
        &west
    )
    .is_ok());
}

#[test]
fn overrides_pick_namespaces_by_name_or_label_and_inherit_what_they_leave_out() {
    let p = policy(json!({
        "default": { "cloudWatchNamespaces": ["Teams/{namespace}/*"], "monthlyCostCeilingUsd": 100 },
        "overrides": [
            { "namespaces": ["ml-platform"], "cloudWatchNamespaces": ["Platform/*"], "monthlyCostCeilingUsd": null },
            { "namespaceSelector": { "matchLabels": { "tier": "gold" } }, "monthlyCostCeilingUsd": 1000,
              "otlpEndpoints": ["http://collector.gold:4318/v1/metrics"] },
            { "namespaces": ["ml-platform", "late"], "monthlyCostCeilingUsd": 1 },
        ],
    }))
    .unwrap();
    let gold: BTreeMap<String, String> = [("tier".to_owned(), "gold".to_owned())].into();
    let platform = p.rules_for("ml-platform", &gold);
    assert_eq!(platform.cloudwatch_namespaces, vec!["Platform/*"]);
    assert_eq!(platform.monthly_cost_ceiling_usd, None, "null: no ceiling; the first override that matches wins");
    let team = p.rules_for("team-a", &gold);
    assert_eq!(team.monthly_cost_ceiling_usd, Some(1000.0));
    assert_eq!(team.cloudwatch_namespaces, vec!["Teams/{namespace}/*"], "inherited from the default");
    assert_eq!(team.otlp_endpoints.len(), 1);
    let plain = p.rules_for("team-a", &no_labels());
    assert_eq!((plain.monthly_cost_ceiling_usd, plain.otlp_endpoints.len()), (Some(100.0), 0));
    assert_eq!(p.rules_for("late", &no_labels()).monthly_cost_ceiling_usd, Some(1.0));
}

#[test]
fn a_policy_that_is_not_valid_names_the_field() {
    let field = |value: serde_json::Value| policy(value).unwrap_err().field;
    assert_eq!(
        field(json!({ "default": { "cloudWatchNamespaces": ["Teams/{namespace}*"] } })),
        "default.cloudWatchNamespaces[0]"
    );
    assert_eq!(
        field(json!({ "default": { "cloudWatchNamespaces": ["Teams/x", "Teams/{namespace}-*"] } })),
        "default.cloudWatchNamespaces[1]"
    );
    assert_eq!(field(json!({ "default": { "cloudWatchNamespaces": ["AWS/*"] } })), "default.cloudWatchNamespaces[0]");
    assert_eq!(field(json!({ "default": { "cloudWatchNamespaces": ["a*b"] } })), "default.cloudWatchNamespaces[0]");
    assert_eq!(field(json!({ "default": { "cloudWatchNamespaces": ["a|b"] } })), "default.cloudWatchNamespaces[0]");
    assert_eq!(field(json!({ "default": { "regions": ["us-east-1", "mars"] } })), "default.regions[1]");
    assert_eq!(
        field(json!({ "default": { "otlpEndpoints": ["http://user@collector/"] } })),
        "default.otlpEndpoints[0]"
    );
    assert_eq!(field(json!({ "default": { "monthlyCostCeilingUsd": -1 } })), "default.monthlyCostCeilingUsd");
    assert_eq!(field(json!({ "overrides": [{ "regions": [] }] })), "overrides[0]");
    assert_eq!(field(json!({ "overrides": [{ "namespaces": ["Team_A"] }] })), "overrides[0].namespaces[0]");
    assert_eq!(
        field(
            json!({ "overrides": [{ "namespaceSelector": { "matchExpressions": [{ "key": "a", "operator": "In" }] } }] })
        ),
        "overrides[0].namespaceSelector.matchExpressions[0].values"
    );
    // A misspelt rule is an error, not a rule silently left out.
    assert_eq!(field(json!({ "default": { "cloudwatchNamespaces": ["*"] } })), "(parse)");
    assert_eq!(field(json!({ "overrides": [{ "namespaces": ["a"], "otlpEndpoint": [] }] })), "(parse)");
    // Patterns that keep teams apart are taken.
    for ok in [
        "Teams/{namespace}/*",
        "{namespace}.Neuron",
        "Neuron/{namespace}",
        "*",
        "Shared/Neuron",
        "Teams/{namespace}_x*",
    ] {
        assert!(policy(json!({ "default": { "cloudWatchNamespaces": [ok] } })).is_ok(), "{ok}");
    }
}

#[test]
fn a_ceiling_refuses_the_newest_configs_first() {
    let priced = |usd: f64, last: Option<f64>| Priced { usd, last_accepted_usd: last };
    let fits = share_ceiling(
        "team-a",
        100.0,
        &[priced(60.0, None), priced(50.0, None), priced(30.0, None), priced(20.0, None)],
    );
    assert!(matches!(fits[0], Fit::Admitted) && matches!(fits[2], Fit::Admitted));
    let Fit::Refused(why) = &fits[1] else { panic!("{fits:?}") };
    assert_eq!((why.kind, why.field.as_str()), (Refusal::CostCeiling, "spec.sinks"));
    assert!(why.reason.contains("$50.00") && why.reason.contains("$110.00") && why.reason.contains("$100.00"), "{why}");
    // What the refused config would have taken stays free: the next ones fit if they can.
    assert!(matches!(fits[3], Fit::Refused(_)), "60 + 30 + 20 > 100");
    // An established config whose update costs too much keeps its last accepted version.
    let fits = share_ceiling("team-a", 100.0, &[priced(150.0, Some(40.0)), priced(50.0, None), priced(20.0, None)]);
    assert!(matches!(fits[0], Fit::LastAccepted(_)), "{fits:?}");
    assert!(matches!(fits[1], Fit::Admitted) && matches!(fits[2], Fit::Refused(_)), "{fits:?}");
}
