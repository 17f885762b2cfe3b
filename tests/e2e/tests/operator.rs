//! The operator and the node agent on the real control plane: `kubectl apply` of
//! NeuronMonitorConfigs, fake Neuron nodes, node ConfigMaps, status, agent reload.
//!
//! Operators watch configs cluster-wide, so the tests of this binary run one at a
//! time; each has its own operator namespace and nodes labelled for it alone.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use api::{
    crd::NeuronMonitorConfig,
    gpu_groups::{GpuGroup, GpuGroups},
    node_config::{
        configmap_name, NodeConfig, NodeGpu, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION, NODE_CONFIG_KEY,
    },
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Node},
    events::v1::Event,
};
use kube::{
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    Api, Client, ResourceExt,
};
use neuron_e2e::{
    cmdline, free_port, http_get, kubectl, random_u32, sample, wait_for, workspace_bin, ControlPlane, Process,
};
use serde_json::json;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

struct Scenario {
    cp: &'static ControlPlane,
    client: Client,
    /// The operator's namespace.
    ns: String,
    /// Label value that marks this test's nodes (`e2e-run=<run>`).
    run: String,
}

impl Scenario {
    async fn new(prefix: &str) -> Scenario {
        let cp = ControlPlane::shared();
        cp.install_crds().await;
        let ns = cp.namespace(prefix).await;
        Scenario { cp, client: cp.client().await, ns, run: format!("{prefix}-{:x}", random_u32()) }
    }

    fn operator(&self) -> (Process, SocketAddr) {
        self.operator_with(&[])
    }

    /// The operator with more flags.
    fn operator_with(&self, extra: &[String]) -> (Process, SocketAddr) {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut args = vec!["--namespace".into(), self.ns.clone(), "--listen".into(), addr.to_string()];
        args.extend_from_slice(extra);
        (Process::start("neuron-operator", &args, &[("NEURON_OPERATOR_LOG", "info".into())], self.cp), addr)
    }

    /// The node agent for `node`, following its ConfigMap, on the simulator; with its
    /// address and its state directory (for the test to remove).
    fn agent(&self, node: &str) -> (Process, SocketAddr, PathBuf) {
        let state_dir = std::env::temp_dir().join(format!("nm-agent-{}", self.run));
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let args = [
            "--node-name",
            node,
            "--config-namespace",
            &self.ns,
            "--monitor-command",
            &workspace_bin("neuron-monitor-sim").display().to_string(),
            "--listen",
            &addr.to_string(),
            "--state-dir",
            &state_dir.display().to_string(),
            "--stop-grace",
            "1s",
        ]
        .map(String::from);
        (Process::start("neuron-node-agent", &args, &[], self.cp), addr, state_dir)
    }

    /// A fake Node of `instance_type` in us-west-2, labelled for this test.
    async fn node(&self, name: &str, instance_type: &str) -> Node {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([
                    ("node.kubernetes.io/instance-type".to_owned(), instance_type.to_owned()),
                    ("topology.kubernetes.io/region".to_owned(), "us-west-2".to_owned()),
                    ("e2e-run".to_owned(), self.run.clone()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Node>::all(self.client.clone()).create(&PostParams::default(), &node).await.unwrap()
    }

    async fn team_namespace(&self, prefix: &str) -> String {
        self.cp.namespace(prefix).await
    }

    fn apply(&self, yaml: &str) -> (bool, String) {
        let (ok, out, err) = kubectl(self.cp, &["apply", "-f", "-"], Some(yaml));
        (ok, format!("{out}{err}"))
    }

    async fn configmap(&self, node: &str) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns).get_opt(&configmap_name(node)).await.ok().flatten()
    }

    async fn node_config(&self, node: &str) -> Option<NodeConfig> {
        let cm = self.configmap(node).await?;
        serde_json::from_str(cm.data?.get(NODE_CONFIG_KEY)?).ok()
    }

    async fn config(&self, namespace: &str, name: &str) -> Option<NeuronMonitorConfig> {
        Api::<NeuronMonitorConfig>::namespaced(self.client.clone(), namespace).get_opt(name).await.ok().flatten()
    }

    async fn condition(&self, namespace: &str, name: &str, type_: &str) -> Option<(String, String, String)> {
        let config = self.config(namespace, name).await?;
        let status = config.status?;
        let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
        Some((c.status, c.reason, c.message))
    }

    async fn wait<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        wait_for(Duration::from_secs(60), check).await.unwrap_or_else(|| panic!("timed out waiting for {what}"))
    }
}

fn config_yaml(namespace: &str, name: &str, run: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  nodeSelector:\n    matchLabels:\n      e2e-run: {run}\n{spec_extra}"
    )
}

#[tokio::test]
async fn configs_render_into_node_configmaps_with_status_and_clean_up() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-render").await;
    let (_operator, _) = s.operator();
    let trn = format!("{}-trn", s.run);
    let inf = format!("{}-inf", s.run);
    let cpu = format!("{}-cpu", s.run);
    s.node(&trn, "trn1.32xlarge").await;
    s.node(&inf, "inf2.xlarge").await;
    s.node(&cpu, "m5.large").await;
    let team = s.team_namespace("team-a").await;

    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  period: 10s\n"));
    assert!(ok, "{out}");
    // Only the trn node: a second label under matchLabels.
    let team_spec = format!(
        "      node.kubernetes.io/instance-type: trn1.32xlarge\n  runtimes:\n  - tagFilter: '^serve'\n    \
         period: 1s\n    metrics:\n    - type: neuroncore_counters\n  sinks:\n    cloudwatch:\n      \
         namespace: Teams/{team}/Neuron\n"
    );
    let (ok, out) = s.apply(&config_yaml(&team, "serving", &s.run, &team_spec));
    assert!(ok, "{out}");

    // Both Neuron nodes get a configuration; the CPU node does not.
    let trn_config = s
        .wait("the trn node's configuration with both routes", || async {
            s.node_config(&trn).await.filter(|c| c.routes.len() == 2)
        })
        .await;
    let routes: Vec<&str> = trn_config.routes.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(routes, vec![format!("{}/cluster", s.ns).as_str(), format!("{team}/serving").as_str()]);
    assert_eq!(trn_config.routes[0].namespace, None, "the operator namespace's config sees everything");
    assert_eq!(trn_config.routes[1].namespace.as_deref(), Some(team.as_str()));
    // One merged runtime entry; the counters group at the shortest period asked for it.
    let monitor = serde_json::to_value(&trn_config.monitor).unwrap();
    let metrics = monitor["neuron_runtimes"][0]["metrics"].as_array().unwrap();
    let counters = metrics.iter().find(|m| m["type"] == "neuroncore_counters").unwrap();
    assert_eq!(counters["period"], "1s");
    assert!(!monitor["system_metrics"].as_array().unwrap().is_empty(), "the cluster config collects node groups");
    s.wait("the inf node's configuration", || async { s.node_config(&inf).await }).await;
    assert!(s.configmap(&cpu).await.is_none(), "a non-Neuron node gets nothing");
    let cm = s.configmap(&trn).await.unwrap();
    let owner = &cm.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", trn.as_str()), "owned by its node");

    // Status: matched nodes, accepted, not ready (no agent runs).
    s.wait("the team config's status", || async {
        let c = s.config(&team, "serving").await?;
        let status = c.status?;
        (status.matched_nodes == 1 && status.observed_generation == c.metadata.generation).then_some(())
    })
    .await;
    assert_eq!(s.condition(&team, "serving", "Accepted").await.unwrap().0, "True");
    let ready = s.condition(&team, "serving", "Ready").await.unwrap();
    assert_eq!((ready.0.as_str(), ready.1.as_str()), ("False", "Applying"));
    // Each config's status is its own write: the cluster's may come after the team's.
    let cluster_status = s
        .wait("the cluster config's status", || async {
            let c = s.config(&s.ns, "cluster").await?;
            c.status.filter(|status| status.observed_generation == c.metadata.generation && status.matched_nodes == 2)
        })
        .await;
    assert_eq!(cluster_status.matched_nodes, 2);
    assert_eq!(cluster_status.estimated_cloud_watch_metrics, None, "no CloudWatch sink, no estimate");
    // The team sees its CloudWatch bill before it arrives: 32 cores of one trn1.32xlarge.
    let team_status = s.config(&team, "serving").await.unwrap().status.unwrap();
    let metrics = team_status.estimated_cloud_watch_metrics.unwrap_or(0);
    assert!(metrics >= 32, "estimate {metrics}");
    let cost: f64 = team_status.estimated_monthly_cost_usd.as_deref().unwrap_or("").parse().unwrap();
    // $0.30 a metric, and one PutMetricData request a minute ($0.432 a month).
    assert!((cost - (metrics as f64 * 0.30 + 0.432)).abs() < 0.01, "{cost} for {metrics} metrics at $0.30");
    let (ok, table, err) = kubectl(s.cp, &["get", "nmc", "-n", &team, "--no-headers"], None);
    assert!(ok, "{err}");
    let columns: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(&columns[..6], &["serving", "1", "0", "0", "True", "False"], "kubectl get nmc: {table}");

    // Deleting a config takes its route away; deleting a node takes its ConfigMap.
    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &team)
        .delete("serving", &DeleteParams::default())
        .await
        .unwrap();
    s.wait("the team route gone", || async { s.node_config(&trn).await.filter(|c| c.routes.len() == 1) }).await;
    Api::<Node>::all(s.client.clone()).delete(&inf, &DeleteParams::default()).await.unwrap();
    s.wait("the deleted node's ConfigMap gone", || async { s.configmap(&inf).await.is_none().then_some(()) }).await;
    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &s.ns)
        .delete("cluster", &DeleteParams::default())
        .await
        .unwrap();
    s.wait("no configuration left", || async { s.configmap(&trn).await.is_none().then_some(()) }).await;
    Api::<Node>::all(s.client.clone()).delete(&trn, &DeleteParams::default()).await.unwrap();
    Api::<Node>::all(s.client.clone()).delete(&cpu, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn invalid_configs_are_refused_at_admission_naming_the_field() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-admission").await;
    let cases: [(&str, &str); 24] = [
        ("  period: 500ms\n", "spec.period"),
        ("  period: 2h\n", "spec.period"),
        ("  runtimes:\n  - metrics:\n    - type: gpu_counters\n", "spec.runtimes[0].metrics[0].type"),
        ("  runtimes:\n  - metrics:\n    - type: memory_used\n    - type: memory_used\n", "spec.runtimes[0].metrics"),
        ("  sinks:\n    cloudwatch:\n      namespace: AWS/Neuron\n", "spec.sinks.cloudwatch.namespace"),
        (
            "  sinks:\n    cloudwatch:\n      namespace: Team\n      storageResolution: 30\n",
            "spec.sinks.cloudwatch.storageResolution",
        ),
        ("  sinks:\n    cloudwatch:\n      namespace: ''\n", "spec.sinks.cloudwatch.namespace"),
        ("  health:\n    conditionType: Ready\n", "spec.health.conditionType"),
        ("  health:\n    conditionType: 'Neuron Health'\n", "spec.health.conditionType"),
        ("  health:\n    kmsgLookBack: 25h\n", "spec.health.kmsgLookBack"),
        ("  health:\n    taint:\n      enabled: true\n      errors: [dma_error]\n", "spec.health.taint.errors[0]"),
        ("  health:\n    logs:\n      group: aws/neuron\n", "spec.health.logs.group"),
        ("  health:\n    logs:\n      region: us_west_2\n", "spec.health.logs.region"),
        ("  health:\n    deviceTaints:\n      effect: PreferNoSchedule\n", "spec.health.deviceTaints.effect"),
        ("  health:\n    thresholds:\n    - {error: DMA_ERROR, count: 0, window: 1m}\n", "spec.health.thresholds[0].count"),
        ("  health:\n    thresholds:\n    - {error: DMA_ERROR, count: 101, window: 1m}\n", "spec.health.thresholds[0].count"),
        ("  health:\n    thresholds:\n    - {error: DMA_ERROR, count: 2, window: 25h}\n", "spec.health.thresholds[0].window"),
        (
            "  health:\n    thresholds:\n    - {error: UNHEALTHY_COMPONENT, count: 2, window: 1m}\n",
            "spec.health.thresholds[0].error",
        ),
        (
            "  health:\n    thresholds:\n    - {error: DMA_ERROR, count: 2, window: 1m}\n    - {error: DMA_ERROR, count: 3, window: 1m}\n",
            "spec.health.thresholds[1]",
        ),
        ("  gpu:\n    period: 500ms\n", "spec.gpu.period"),
        ("  gpu:\n    period: 2h\n", "spec.gpu.period"),
        ("  gpu:\n    enabled: sometimes\n", "spec.gpu.enabled"),
        // Prometheus' target labels (issue 14).
        ("  sinks:\n    prometheus:\n      extraLabels: { job: x }\n", "spec.sinks.prometheus.extraLabels"),
        ("  sinks:\n    prometheus:\n      extraLabels: { instance: x }\n", "spec.sinks.prometheus.extraLabels"),
    ];
    for (i, (spec, field)) in cases.iter().enumerate() {
        let (ok, out) = s.apply(&config_yaml(&s.ns, &format!("bad-{i}"), &s.run, spec));
        assert!(!ok, "case {i} ({field}) was accepted:\n{spec}");
        assert!(out.contains(field), "case {i}: the refusal names {field}: {out}");
    }
    let (ok, out) = s.apply(&config_yaml(
        &s.ns,
        "duplicate-dims",
        &s.run,
        "  sinks:\n    cloudwatch:\n      namespace: Team\n      dimensions: [PodName, PodName]\n",
    ));
    assert!(!ok && out.contains("spec.sinks.cloudwatch.dimensions"), "{out}");
    // Container Insights naming has its own metrics and sets: ours are refused by field.
    for field in ["dimensions: [PodName]", "rollups: [[ClusterName]]", "metrics: [neuroncore_utilization]"] {
        let spec = format!("  sinks:\n    cloudwatch:\n      namespace: ContainerInsights\n      naming: ContainerInsights\n      {field}\n");
        let (ok, out) = s.apply(&config_yaml(&s.ns, "insights", &s.run, &spec));
        let name = field.split(':').next().unwrap_or_default();
        assert!(!ok && out.contains(&format!("spec.sinks.cloudwatch.{name}")), "{field}: {out}");
    }
    let spec = "  sinks:\n    cloudwatch:\n      namespace: ContainerInsights\n      naming: ContainerInsights\n";
    let (ok, out) = s.apply(&config_yaml(&s.ns, "insights", &s.run, spec));
    assert!(ok, "{out}");
}

/// The content hash a node's ConfigMap carries.
async fn config_hash(s: &Scenario, node: &str) -> Option<String> {
    s.configmap(node).await?.metadata.annotations?.get(CONFIG_HASH_ANNOTATION).cloned()
}

#[tokio::test]
async fn gpu_nodes_are_rendered_with_gpu_nodes_and_neuron_nodes_keep_their_bytes() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-gpu").await;
    let p5 = format!("{}-p5", s.run);
    let trn = format!("{}-trn", s.run);
    s.node(&p5, "p5.48xlarge").await;
    s.node(&trn, "trn1.2xlarge").await;
    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  period: 10s\n"));
    assert!(ok, "{out}");
    let matched = |n: i32| {
        let s = &s;
        move || async move {
            let status = s.config(&s.ns, "cluster").await?.status?;
            (status.matched_nodes == n).then_some(())
        }
    };
    let no_election = "--leader-election=false".to_owned();

    // Without --gpu-nodes (the default): the GPU node gets nothing.
    let neuron_hash = {
        let _operator = s.operator_with(std::slice::from_ref(&no_election));
        s.wait("the Neuron node's configuration", || async { config_hash(&s, &trn).await }).await;
        s.wait("one matched node", matched(1)).await;
        assert!(s.configmap(&p5).await.is_none(), "no configuration for a GPU node without --gpu-nodes");
        config_hash(&s, &trn).await.unwrap()
    };

    // With it: the GPU node too, counted in the status; the Neuron node's bytes unchanged.
    let _operator = s.operator_with(&[no_election, "--gpu-nodes=true".to_owned()]);
    let gpu = s.wait("the GPU node's configuration", || async { s.node_config(&p5).await }).await;
    assert_eq!(gpu.gpu, None, "no config sets spec.gpu: the agent's defaults");
    s.wait("two matched nodes", matched(2)).await;
    assert_eq!(config_hash(&s, &trn).await.as_deref(), Some(neuron_hash.as_str()));

    // spec.gpu reaches every node's configuration (Neuron nodes ignore it).
    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  period: 10s\n  gpu:\n    period: 30s\n"));
    assert!(ok, "{out}");
    let want = Some(NodeGpu { enabled: true, period: "30s".parse().unwrap(), groups: GpuGroups::ALL });
    s.wait("the GPU period rendered", || async { s.node_config(&p5).await.filter(|c| c.gpu == want) }).await;
    // Named groups reach the node; an unknown one is refused by the API server, naming it.
    let groups = "  gpu:\n    period: 30s\n    groups: [nvlink, utilization]\n";
    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, groups));
    assert!(ok, "{out}");
    let named: GpuGroups = [GpuGroup::Utilization, GpuGroup::Nvlink].into_iter().collect();
    s.wait("the GPU groups rendered", || async {
        s.node_config(&p5).await.filter(|c| c.gpu.is_some_and(|g| g.groups == named))
    })
    .await;
    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  gpu:\n    groups: [utilisation]\n"));
    assert!(!ok && out.contains("spec.gpu.groups[0]") && out.contains("utilisation"), "{out}");
    let (ok, out) = s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  gpu:\n    enabled: false\n"));
    assert!(ok, "{out}");
    s.wait("the GPU collector switched off", || async {
        s.node_config(&p5).await.filter(|c| c.gpu.is_some_and(|g| !g.enabled))
    })
    .await;

    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &s.ns)
        .delete("cluster", &DeleteParams::default())
        .await
        .unwrap();
    for node in [&p5, &trn] {
        Api::<Node>::all(s.client.clone()).delete(node, &DeleteParams::default()).await.unwrap();
    }
}

#[tokio::test]
async fn what_admission_cannot_check_is_reported_and_changes_nothing() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-status").await;
    let (_operator, _) = s.operator();
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.2xlarge").await;
    let team = s.team_namespace("team-b").await;

    let good = "  runtimes:\n  - tagFilter: '^serve-'\n    metrics:\n    - type: memory_used\n";
    assert!(s.apply(&config_yaml(&team, "serving", &s.run, good)).0);
    let before = s
        .wait("a rendered configuration", || async {
            let cm = s.configmap(&node).await?;
            cm.annotations().get(CONFIG_HASH_ANNOTATION).cloned()
        })
        .await;
    // A regex that does not compile: accepted by the schema, refused by the operator.
    let bad = "  runtimes:\n  - tagFilter: 'serve-(('\n    metrics:\n    - type: memory_used\n";
    assert!(s.apply(&config_yaml(&team, "serving", &s.run, bad)).0);
    let accepted = s
        .wait("Accepted=False", || async { s.condition(&team, "serving", "Accepted").await.filter(|c| c.0 == "False") })
        .await;
    assert_eq!(accepted.1, "InvalidSpec");
    assert!(accepted.2.contains("spec.runtimes[0].tagFilter"), "{accepted:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = s.configmap(&node).await.unwrap().annotations().get(CONFIG_HASH_ANNOTATION).cloned();
    assert_eq!(after.as_deref(), Some(before.as_str()), "the node keeps its last good configuration");

    // Node-level groups from a team namespace, and a selector that matches nothing.
    let system = "  systemMetrics:\n    metrics:\n    - type: memory_info\n";
    assert!(s.apply(&config_yaml(&team, "greedy", &s.run, system)).0);
    let greedy = s
        .wait("greedy rejected", || async { s.condition(&team, "greedy", "Accepted").await.filter(|c| c.0 == "False") })
        .await;
    assert!(greedy.2.contains("spec.systemMetrics"), "{greedy:?}");
    assert!(s.apply(&config_yaml(&team, "nowhere", "no-such-run", "")).0);
    let nowhere = s
        .wait("no matching nodes", || async {
            s.condition(&team, "nowhere", "Accepted").await.filter(|c| c.0 == "False")
        })
        .await;
    assert_eq!(nowhere.1, "NoMatchingNodes");
    assert!(nowhere.2.contains("spec.nodeSelector"), "{nowhere:?}");
    // Health settings from a team namespace.
    assert!(s.apply(&config_yaml(&team, "healer", &s.run, "  health:\n    taint:\n      enabled: true\n")).0);
    let healer = s
        .wait("healer rejected", || async { s.condition(&team, "healer", "Accepted").await.filter(|c| c.0 == "False") })
        .await;
    assert_eq!(healer.1, "InvalidSpec");
    assert!(healer.2.contains("spec.health"), "{healer:?}");
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// `spec.health.deviceTaints` on a cluster whose API server serves no DeviceTaintRule
/// (the test control plane, Kubernetes 1.35 without the alpha API, as clusters run by
/// default): refused in the config's status with the reason, the field named, and never
/// rendered; the same config without it is accepted, its thresholds rendered.
#[tokio::test]
async fn device_taints_are_refused_where_the_api_is_not_served_and_rendered_where_it_is() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-devtaint").await;
    let (_operator, _) = s.operator();
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.32xlarge").await;
    let thresholds = "    thresholds:\n    - {error: DMA_ERROR, count: 3, window: 10m}\n";
    let spec = format!("  health:\n    deviceTaints:\n      enabled: true\n      effect: NoExecute\n{thresholds}");
    assert!(s.apply(&config_yaml(&s.ns, "fleet", &s.run, &spec)).0);
    // Kubernetes 1.37 serves DeviceTaintRules (v1) by default, earlier versions only with
    // the alpha API turned on, which this control plane does not.
    let (ok, resources, err) = kubectl(s.cp, &["api-resources", "--api-group=resource.k8s.io", "-o", "name"], None);
    assert!(ok, "{err}");
    if resources.lines().any(|r| r.starts_with("devicetaintrules")) {
        let health = s
            .wait("the device taints rendered", || async {
                s.node_config(&node).await.and_then(|c| c.health).filter(|h| h.device_taints.is_some())
            })
            .await;
        assert_eq!(health.device_taints.map(|d| d.effect), Some(api::crd::DeviceTaintEffect::NoExecute));
        s.wait("Accepted=True", || async { s.condition(&s.ns, "fleet", "Accepted").await.filter(|c| c.0 == "True") })
            .await;
    } else {
        let refused = s
            .wait("Accepted=False", || async {
                s.condition(&s.ns, "fleet", "Accepted").await.filter(|c| c.0 == "False")
            })
            .await;
        assert_eq!(refused.1, "Unsupported", "{refused:?}");
        assert!(refused.2.contains("spec.health.deviceTaints") && refused.2.contains("DeviceTaintRule"), "{refused:?}");
        assert!(s.node_config(&node).await.is_none_or(|c| c.health.is_none()), "never rendered");
    }

    let spec = format!("  health:\n    deviceTaints:\n      enabled: false\n{thresholds}");
    assert!(s.apply(&config_yaml(&s.ns, "fleet", &s.run, &spec)).0);
    let health = s
        .wait("the thresholds rendered without device taints", || async {
            s.node_config(&node).await.and_then(|c| c.health).filter(|h| h.device_taints.is_none())
        })
        .await;
    assert_eq!(health.thresholds.len(), 1);
    assert_eq!((health.thresholds[0].error.as_str(), health.thresholds[0].count), ("DMA_ERROR", 3));
    // The status follows the rendering: accepted once written.
    s.wait("Accepted=True", || async { s.condition(&s.ns, "fleet", "Accepted").await.filter(|c| c.0 == "True") }).await;
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// The running simulator's configuration file and its content.
fn monitor_config_of(agent: &Process) -> Option<(u32, String, String)> {
    let child = *agent.children().first()?;
    let args = cmdline(child);
    let file = args.iter().skip_while(|a| *a != "-c").nth(1)?.clone();
    let content = std::fs::read_to_string(&file).ok()?;
    Some((child, file, content))
}

#[tokio::test]
async fn the_agent_reloads_a_changed_config_within_a_second() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-reload").await;
    let (_operator, operator_addr) = s.operator();
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.2xlarge").await;
    assert!(s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  period: 2s\n")).0);

    let (agent, agent_addr, state_dir) = s.agent(&node);
    // The agent runs the rendered configuration and acknowledges it; status follows.
    s.wait("the agent on the rendered configuration", || async {
        monitor_config_of(&agent).filter(|(_, _, content)| content.contains("\"2s\""))
    })
    .await;
    s.wait("the acknowledgement", || async {
        let cm = s.configmap(&node).await?;
        let a = cm.annotations();
        (a.get(APPLIED_HASH_ANNOTATION) == a.get(CONFIG_HASH_ANNOTATION)).then_some(())
    })
    .await;
    s.wait("Ready with one applied node", || async {
        let status = s.config(&s.ns, "cluster").await?.status?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.applied_nodes == 1).then_some(())
    })
    .await;

    // 20 changes in a row: time from the API write to the agent's acknowledgement of the
    // new node configuration (in force: its routes, and the neuron-monitor file written).
    let api: Api<NeuronMonitorConfig> = Api::namespaced(s.client.clone(), &s.ns);
    let acknowledged = || async {
        let cm = s.configmap(&node).await?;
        let a = cm.annotations();
        a.get(APPLIED_HASH_ANNOTATION).filter(|h| a.get(CONFIG_HASH_ANNOTATION) == Some(*h)).cloned()
    };
    let mut latencies = Vec::new();
    let mut last_period = String::new();
    let series_started = Instant::now();
    for i in 0..20u64 {
        let period = format!("{}s", 3 + i % 2 + 2 * (i % 5));
        let before = acknowledged().await;
        let started = Instant::now();
        api.patch("cluster", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "period": period } })))
            .await
            .unwrap();
        loop {
            let now = acknowledged().await;
            if now.is_some() && now != before {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "change {i} ({period}) never reached the agent");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(started.elapsed());
        last_period = period;
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p95 = latencies[latencies.len() * 95 / 100];
    println!("config change → in force on the agent: p50 {p50:?}, p95 {p95:?}, max {:?}", latencies.last().unwrap());
    assert!(p50 < Duration::from_secs(1), "p50 {p50:?}");
    // neuron-monitor follows at its restart pace (3 at once, then one per 10 s): it
    // ends on the last configuration, after far fewer restarts than changes.
    let expected = format!("\"{last_period}\"");
    s.wait("neuron-monitor on the last configuration", || async {
        monitor_config_of(&agent).filter(|(_, _, content)| content.contains(&expected))
    })
    .await;
    let agent_metrics = http_get(agent_addr, "/metrics").unwrap().1;
    let restarts =
        labelled_sample(&agent_metrics, "neuron_agent_monitor_restarts_total", &["reason=\"config_changed\""])
            .unwrap_or(0.0);
    let allowed = 4.0 + (series_started.elapsed().as_secs_f64() / 10.0).ceil();
    println!("20 changes in {:?}: {restarts} restarts of neuron-monitor", series_started.elapsed());
    assert!((1.0..=allowed).contains(&restarts), "{restarts} restarts (at most {allowed})");
    assert!(sample(&agent_metrics, "neuron_agent_reports_total").is_some());
    let operator_metrics = http_get(operator_addr, "/metrics").unwrap().1;
    assert_eq!(sample(&operator_metrics, "neuron_operator_leader"), Some(1.0));
    drop(agent);
    let _ = std::fs::remove_dir_all(&state_dir);
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_hand_over_on_shutdown() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-leader").await;
    let mut replicas = [s.operator(), s.operator()];
    let leads =
        |addr: SocketAddr| http_get(addr, "/metrics").and_then(|(_, body)| sample(&body, "neuron_operator_leader"));
    let addrs = [replicas[0].1, replicas[1].1];
    let leader = s
        .wait("exactly one leader", || async {
            let (a, b) = (leads(addrs[0])?, leads(addrs[1])?);
            match (a, b) {
                (1.0, 0.0) => Some(0),
                (0.0, 1.0) => Some(1),
                _ => None,
            }
        })
        .await;
    let status = replicas[leader].0.terminate(Duration::from_secs(10)).expect("the leader stops on SIGTERM");
    assert!(status.success(), "{status}");
    let started = Instant::now();
    let follower = addrs[1 - leader];
    s.wait("the other replica takes over", || async { (leads(follower)? == 1.0).then_some(()) }).await;
    // The lease was released on shutdown: no wait for it to expire (15 s).
    assert!(started.elapsed() < Duration::from_secs(10), "hand-over took {:?}", started.elapsed());
}

/// Without leader election the operator still passes only on a change (or its resync):
/// between two events it must do no work. The interval is bounded by events, not time:
/// the first pass, then a config's status written for a node created after it.
#[tokio::test]
async fn an_operator_without_election_passes_only_on_changes_and_stops_on_sigterm() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-idle").await;
    let (mut operator, addr) = s.operator_with(&["--leader-election=false".to_owned()]);
    let reconciles =
        || http_get(addr, "/metrics").and_then(|(_, body)| sample(&body, "neuron_operator_reconciles_total"));
    let first = s.wait("the first pass", || async { reconciles().filter(|n| *n >= 1.0) }).await;

    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.2xlarge").await;
    let (ok, out) = s.apply(&config_yaml(
        &s.ns,
        "cluster",
        &s.run,
        "  period: 10s
",
    ));
    assert!(ok, "{out}");
    s.wait("the config's status for its node", || async {
        let c = s.config(&s.ns, "cluster").await?;
        c.status.filter(|status| status.observed_generation == c.metadata.generation && status.matched_nodes == 1)
    })
    .await;
    // A node and a config: a few passes (each watch event, the status write's own echo).
    // A loop that passes without waiting runs thousands in the same time.
    let passes = reconciles().expect("the operator's metrics") - first;
    assert!(passes <= 20.0, "{passes} passes for one node and one config");

    // Nothing in flight: every task stops at the cancel, within the HTTP server's grace
    // (5 s), none held until the stop's own limit (7 s) and aborted.
    let status = operator.terminate(Duration::from_secs(5)).expect("the operator stops on SIGTERM within its grace");
    assert!(status.success(), "{status}");
    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &s.ns)
        .delete("cluster", &DeleteParams::default())
        .await
        .unwrap();
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// The value of the sample `name{labels}` whose label set contains every `label` given.
fn labelled_sample(exposition: &str, name: &str, labels: &[&str]) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        labels.iter().all(|l| set.split(',').any(|x| x == *l)).then(|| value.trim().parse().ok())?
    })
}

/// A config object with a spec given as JSON, created through the API (faster than
/// kubectl for dozens of them; the API server's schema checks it all the same).
async fn create_config(s: &Scenario, namespace: &str, name: &str, mut spec: serde_json::Value) {
    spec["nodeSelector"] = json!({ "matchLabels": { "e2e-run": s.run } });
    let config: NeuronMonitorConfig = serde_json::from_value(json!({
        "apiVersion": "neuronmonitor.io/v1alpha1",
        "kind": "NeuronMonitorConfig",
        "metadata": { "name": name, "namespace": namespace },
        "spec": spec,
    }))
    .unwrap();
    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), namespace)
        .create(&PostParams::default(), &config)
        .await
        .unwrap_or_else(|e| panic!("creating {namespace}/{name}: {e}"));
}

/// `entries` runtime entries with distinct tag filters of ~1,000 bytes (each compiles, and
/// `labels` extra labels of 128 characters: schema-valid, `unique` keeps configs apart.
fn bulky_spec(unique: usize, entries: usize, labels: usize) -> serde_json::Value {
    let runtimes: Vec<_> = (0..entries)
        .map(|e| json!({ "tagFilter": format!("^{unique:03}-{e:02}-{}", "a".repeat(990)), "metrics": [{"type": "memory_used"}] }))
        .collect();
    let extra: serde_json::Map<String, serde_json::Value> =
        (0..labels).map(|l| (format!("label_{l:02}"), json!("v".repeat(128)))).collect();
    json!({ "runtimes": runtimes, "sinks": { "prometheus": { "extraLabels": extra } } })
}

/// (status, reason, message) of every config of a namespace whose Accepted condition is
/// for its current generation, by name.
async fn accepted_conditions(s: &Scenario, namespace: &str) -> BTreeMap<String, (String, String, String)> {
    let list = Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), namespace)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter_map(|c| {
            let status = c.status.as_ref()?;
            (status.observed_generation == c.metadata.generation).then_some(())?;
            let a = status.conditions.iter().find(|x| x.type_ == "Accepted")?;
            Some((c.name_any(), (a.status.clone(), a.reason.clone(), a.message.clone())))
        })
        .collect()
}

/// Issue 10, item 4: 60 schema-valid configs of ~20 kB in one team namespace used to push
/// the nodes' ConfigMaps over the API server's 1 MiB limit; every pass then failed and an
/// administrator's change never reached the nodes, while status said "rendered".
#[tokio::test]
async fn one_teams_configs_cannot_stall_the_nodes() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-stall").await;
    let (_operator, operator_addr) = s.operator();
    let nodes = [format!("{}-a", s.run), format!("{}-b", s.run)];
    for node in &nodes {
        s.node(node, "trn1.32xlarge").await;
    }
    assert!(s.apply(&config_yaml(&s.ns, "cluster", &s.run, "  period: 10s\n")).0);
    for node in &nodes {
        s.wait("the cluster config on the node", || async { s.node_config(node).await }).await;
    }
    let big = s.team_namespace("team-big").await;
    let small = s.team_namespace("team-small").await;
    for i in 0..60 {
        create_config(&s, &big, &format!("big-{i:02}"), bulky_spec(i, 16, 16)).await;
    }
    for i in 0..20 {
        create_config(&s, &big, &format!("medium-{i:02}"), bulky_spec(100 + i, 3, 0)).await;
    }
    create_config(
        &s,
        &small,
        "serving",
        json!({ "runtimes": [{ "tagFilter": "^serve", "metrics": [{"type": "memory_used"}] }] }),
    )
    .await;

    // The administrator's change reaches every node.
    Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &s.ns)
        .patch("cluster", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "period": "30s" } })))
        .await
        .unwrap();
    for node in &nodes {
        s.wait("the administrator's change on the node", || async {
            let config = s.node_config(node).await?;
            let system = &config.monitor.system_metrics;
            (!system.is_empty() && system.iter().all(|g| g.period.map(|p| p.to_string()).as_deref() == Some("30s")))
                .then_some(config)
        })
        .await;
    }

    // Every config has a verdict for its generation; the oversized ones are refused by field.
    let verdicts = s
        .wait("a verdict on every team config", || async {
            let v = accepted_conditions(&s, &big).await;
            (v.len() == 80).then_some(v)
        })
        .await;
    for i in 0..60 {
        let (status, reason, message) = &verdicts[&format!("big-{i:02}")];
        assert_eq!((status.as_str(), reason.as_str()), ("False", "TooLarge"), "big-{i:02}: {message}");
        assert!(message.contains("spec.runtimes"), "big-{i:02}: {message}");
    }
    // The medium ones fill the namespace's budget, oldest first; the newest are refused.
    let medium: Vec<&(String, String, String)> = (0..20).map(|i| &verdicts[&format!("medium-{i:02}")]).collect();
    let admitted = medium.iter().take_while(|v| v.0 == "True").count();
    assert!((2..20).contains(&admitted), "{medium:?}");
    for (status, reason, message) in &medium[admitted..] {
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NamespaceLimit"), "{message}");
        assert!(message.contains("spec.nodeSelector"), "{message}");
    }
    let (status, _, message) = s.condition(&small, "serving", "Accepted").await.unwrap();
    assert_eq!(status, "True", "another team's config keeps rendering: {message}");

    // What the nodes carry: the cluster config, the other team's, the admitted ones.
    for node in &nodes {
        let cm = s.configmap(node).await.unwrap();
        let size: usize = cm.data.as_ref().unwrap().values().map(String::len).sum();
        assert!(size < 1024 * 1024, "{size} bytes");
        println!("{node}: ConfigMap data {size} bytes; {admitted} of 20 medium configs admitted");
        let config: NodeConfig = serde_json::from_str(&cm.data.unwrap()[NODE_CONFIG_KEY]).unwrap();
        let routes: Vec<&str> = config.routes.iter().map(|r| r.config.as_str()).collect();
        assert!(routes.contains(&format!("{}/cluster", s.ns).as_str()), "{routes:?}");
        assert!(routes.contains(&format!("{small}/serving").as_str()), "{routes:?}");
        assert_eq!(routes.iter().filter(|r| r.starts_with(&format!("{big}/"))).count(), admitted, "{routes:?}");
    }
    let cluster = s.config(&s.ns, "cluster").await.unwrap().status.unwrap();
    assert_eq!(cluster.matched_nodes, 2);
    let big_status = s.config(&big, "big-00").await.unwrap().status.unwrap();
    assert_eq!(big_status.matched_nodes, 0, "a refused config is on no node");

    // Counted in the operator's metrics, and announced by a Warning Event. The gauges are
    // the latest pass's over every config of the cluster (the tests beside this one share
    // the operator): they must come to the refusals the statuses show, this team's among
    // them, within the wait.
    let refused = |metrics: &str, reason: &str| {
        labelled_sample(metrics, "neuron_operator_refused_configs", &[&format!("reason=\"{reason}\"")])
    };
    let all: Api<NeuronMonitorConfig> = Api::all(s.client.clone());
    s.wait("the refusals counted by reason", || async {
        let statuses = all.list(&Default::default()).await.ok()?;
        let shown = |reason: &str| {
            let refused_as = |c: &&NeuronMonitorConfig| {
                c.status.as_ref().is_some_and(|st| {
                    st.conditions.iter().any(|k| k.type_ == "Accepted" && k.status == "False" && k.reason == reason)
                })
            };
            statuses.items.iter().filter(refused_as).count() as f64
        };
        let metrics = http_get(operator_addr, "/metrics")?.1;
        let (too_large, namespace_limit) = (shown("TooLarge"), shown("NamespaceLimit"));
        (too_large >= 60.0
            && namespace_limit >= (20 - admitted) as f64
            && refused(&metrics, "TooLarge") == Some(too_large)
            && refused(&metrics, "NamespaceLimit") == Some(namespace_limit))
        .then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &big);
    s.wait("a TooLarge Event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("TooLarge")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("big-00")
            })
            .then_some(())
    })
    .await;
    for node in &nodes {
        Api::<Node>::all(s.client.clone()).delete(node, &DeleteParams::default()).await.unwrap();
    }
}

/// One node whose ConfigMap cannot be written (here an immutable ConfigMap in the way)
/// must not stop the others, nor be claimed in status; the write is retried.
#[tokio::test]
async fn a_node_that_cannot_be_written_does_not_stop_the_others() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-writefail").await;
    let nodes: Vec<String> = (0..4).map(|i| format!("{}-{i}", s.run)).collect();
    for node in &nodes {
        s.node(node, "trn1.2xlarge").await;
    }
    let blocked = &nodes[2];
    let configmaps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    let obstacle: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": configmap_name(blocked) },
        "data": { "placeholder": "immutable" },
        "immutable": true,
    }))
    .unwrap();
    configmaps.create(&PostParams::default(), &obstacle).await.unwrap();
    let (_operator, operator_addr) = s.operator();
    assert!(s.apply(&config_yaml(&s.ns, "cluster", &s.run, "")).0);

    for node in nodes.iter().filter(|n| *n != blocked) {
        s.wait("the other nodes' configuration", || async { s.node_config(node).await }).await;
    }
    let status = s
        .wait("a status that counts only the written nodes", || async {
            let status = s.config(&s.ns, "cluster").await?.status?;
            (status.matched_nodes == 3).then_some(status)
        })
        .await;
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "WriteFailed"), "{ready:?}");
    let accepted = status.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
    assert!(accepted.message.contains("3 of 4"), "{accepted:?}");
    let failures = s
        .wait("the failed write counted", || async {
            let metrics = http_get(operator_addr, "/metrics")?.1;
            labelled_sample(&metrics, "neuron_operator_write_failures_total", &["kind=\"configmap\""])
        })
        .await;
    assert!(failures >= 1.0);

    // Once the obstacle is gone, a retry writes the node.
    configmaps.delete(&configmap_name(blocked), &DeleteParams::default()).await.unwrap();
    s.wait("the blocked node written on a retry", || async { s.node_config(blocked).await }).await;
    s.wait("every node counted", || async {
        let status = s.config(&s.ns, "cluster").await?.status?;
        (status.matched_nodes == 4).then_some(())
    })
    .await;
    for node in &nodes {
        Api::<Node>::all(s.client.clone()).delete(node, &DeleteParams::default()).await.unwrap();
    }
}

/// Issue 10, item 10: 60 configs taking the same applications stacked 960 extra labels
/// on each runtime series. The operator admits configs until the labels a series would
/// carry reach the bound, refuses the rest naming the field, and the agent's series
/// carry no more.
#[tokio::test]
async fn extra_labels_a_series_carries_are_bounded() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-labels").await;
    let (_operator, operator_addr) = s.operator();
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.2xlarge").await;
    for i in 0..60 {
        let labels: serde_json::Map<String, serde_json::Value> =
            (0..16).map(|l| (format!("x{i:02}_{l:02}"), json!("v"))).collect();
        let spec = json!({ "period": "1s", "runtimes": [{ "metrics": [{"type": "neuroncore_counters"}] }],
                           "sinks": { "prometheus": { "extraLabels": labels } } });
        create_config(&s, &s.ns, &format!("labels-{i:02}"), spec).await;
    }
    let verdicts = s
        .wait("a verdict on every config", || async {
            let v = accepted_conditions(&s, &s.ns).await;
            (v.len() == 60).then_some(v)
        })
        .await;
    let accepted: Vec<&String> = verdicts.iter().filter(|(_, v)| v.0 == "True").map(|(k, _)| k).collect();
    assert_eq!(accepted, vec!["labels-00", "labels-01"], "32 labels: the two oldest configs");
    for (name, (status, reason, message)) in verdicts.iter().skip(2) {
        assert_eq!((status.as_str(), reason.as_str()), ("False", "TooManyLabels"), "{name}: {message}");
        assert!(message.contains("spec.sinks.prometheus.extraLabels"), "{name}: {message}");
    }
    let metrics = http_get(operator_addr, "/metrics").unwrap().1;
    assert_eq!(labelled_sample(&metrics, "neuron_operator_refused_configs", &["reason=\"TooManyLabels\""]), Some(58.0));

    // The agent's runtime series carry the admitted configs' labels, and no more.
    let (_agent, agent_addr, state_dir) = s.agent(&node);
    let series = s
        .wait("a runtime series with the extra labels", || async {
            let body = http_get(agent_addr, "/metrics")?.1;
            body.lines()
                .find(|l| l.starts_with("neuroncore_utilization_ratio{") && l.contains("x00_00="))
                .map(str::to_owned)
        })
        .await;
    let extra = series.split(['{', ',']).filter(|l| l.starts_with('x') && l.contains("=\"")).count();
    assert_eq!(extra, 32, "{series}");
    println!("extra labels on a runtime series: {extra} (series line {} bytes)", series.len());
    let _ = std::fs::remove_dir_all(&state_dir);
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// One file of NeuronMonitorConfig documents means the same on a host without Kubernetes
/// (`neuron-node-agent --config FILE`) as in a cluster: applied here, the operator renders
/// a node's configuration; run there, the agent renders its own, byte for byte the same
/// (equal content hashes).
#[tokio::test]
async fn a_config_file_renders_on_a_host_as_the_operator_renders_it_for_a_node() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-standalone").await;
    let (_operator, _) = s.operator();
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.32xlarge").await;
    // In the operator's namespace: on a host every document sees every application, as
    // the operator namespace's configs do. No nodeSelector: a host has nothing to select.
    let yaml = format!(
        "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: serving, namespace: {ns} }}\n\
         spec:\n  period: 2s\n  runtimes:\n  - tagFilter: '^serve-'\n    period: 1s\n    metrics: [{{type: neuroncore_counters}}, {{type: execution_stats}}]\n\
         \x20 sinks:\n    prometheus: {{ extraLabels: {{ team: serving }} }}\n    cloudwatch: {{ namespace: Serving/Neuron, flushInterval: 30s }}\n\
         ---\n\
         apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: fleet, namespace: {ns} }}\n\
         spec:\n  period: 10s\n  systemMetrics: {{ metrics: [{{type: memory_info}}, {{type: neuron_hw_counters}}] }}\n",
        ns = s.ns
    );
    let (ok, out) = s.apply(&yaml);
    assert!(ok, "{out}");
    // Without a nodeSelector these configs match every Neuron node of the control plane,
    // those of later tests too: deleted however this test ends.
    let _delete = DeleteOnDrop { cp: s.cp, yaml: yaml.clone() };
    let cluster_hash = s
        .wait("the node's configuration with both routes", || async {
            let cm = s.configmap(&node).await?;
            let config: NodeConfig = serde_json::from_str(cm.data.as_ref()?.get(NODE_CONFIG_KEY)?).ok()?;
            (config.routes.len() == 2).then(|| cm.annotations().get(CONFIG_HASH_ANNOTATION).cloned())?
        })
        .await;

    let dir = std::env::temp_dir().join(format!("nm-standalone-{}", s.run));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("neuron-monitor.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let args = [
        "--config",
        &file.display().to_string(),
        "--monitor-command",
        &workspace_bin("neuron-monitor-sim").display().to_string(),
        "--listen",
        &addr.to_string(),
        "--state-dir",
        &dir.join("state").display().to_string(),
    ]
    .map(String::from);
    let agent = Process::start("neuron-node-agent", &args, &[], s.cp);
    let host_hash = s
        .wait("the agent running the file", || async {
            let metrics = http_get(addr, "/metrics")?.1;
            let line =
                metrics.lines().find(|l| l.starts_with("neuron_agent_config{") && l.contains("source=\"config\""))?;
            let hash = line.split("hash=\"").nth(1)?.split('"').next()?;
            Some(hash.to_owned())
        })
        .await;
    assert_eq!(host_hash, cluster_hash, "the agent rendered the file as the operator rendered it for the node");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// `spec.health`: rendered into the nodes' configuration (one config's settings per node,
/// the oldest's; the other config told in its status), and the matched nodes whose health
/// condition (of the configured type) is True counted in status and `kubectl get`.
#[tokio::test]
async fn health_settings_are_rendered_and_unhealthy_nodes_counted() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-health").await;
    let (_operator, _) = s.operator();
    let (a, b) = (format!("{}-a", s.run), format!("{}-b", s.run));
    s.node(&a, "trn1.32xlarge").await;
    s.node(&b, "trn1.2xlarge").await;
    let health = "  health:\n    conditionType: e2e.example.com/NeuronHardware\n    kmsgLookBack: 10m\n    taint:\n      \
                  enabled: true\n      errors: [NC_UNCORRECTABLE_ERROR, DMA_ERROR]\n    logs:\n      region: us-west-2\n";
    assert!(s.apply(&config_yaml(&s.ns, "fleet", &s.run, health)).0);
    let expected = json!({
        "config": format!("{}/fleet", s.ns),
        "conditionType": "e2e.example.com/NeuronHardware",
        "taint": { "errors": ["DMA_ERROR", "NC_UNCORRECTABLE_ERROR"] },
        "kmsgLookBack": "10m",
        "logs": { "group": "/aws/neuron/hardware-events", "region": "us-west-2" },
    });
    for node in [&a, &b] {
        let config = s
            .wait("the health settings in the node's configuration", || async {
                s.node_config(node).await.filter(|c| c.health.is_some())
            })
            .await;
        assert_eq!(serde_json::to_value(&config.health).unwrap(), expected, "{node}");
    }
    let status = s
        .wait("the fleet config's status", || async {
            let status = s.config(&s.ns, "fleet").await?.status?;
            (status.matched_nodes == 2).then_some(status)
        })
        .await;
    assert_eq!(status.unhealthy_nodes, 0);
    let settings = status.conditions.iter().find(|c| c.type_ == "HealthSettings").expect("HealthSettings");
    assert_eq!((settings.status.as_str(), settings.reason.as_str()), ("True", "InForce"));

    // A node whose configured condition is True is unhealthy; the default type on the
    // other node is not the one its configuration names.
    let nodes: Api<Node> = Api::all(s.client.clone());
    let set_condition = |node: String, type_: &'static str, status: &'static str| {
        let nodes = nodes.clone();
        async move {
            let patch = json!({ "status": { "conditions": [{ "type": type_, "status": status, "reason": "E2E" }] } });
            nodes.patch_status(&node, &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
        }
    };
    set_condition(a.clone(), "e2e.example.com/NeuronHardware", "True").await;
    set_condition(b.clone(), "NeuronHealth", "True").await;
    s.wait("one unhealthy node", || async {
        (s.config(&s.ns, "fleet").await?.status?.unhealthy_nodes == 1).then_some(())
    })
    .await;
    let (ok, table, err) = kubectl(s.cp, &["get", "nmc", "-n", &s.ns, "fleet", "--no-headers"], None);
    assert!(ok, "{err}");
    let columns: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(&columns[..4], &["fleet", "2", "0", "1"], "kubectl get nmc: {table}");
    set_condition(a.clone(), "e2e.example.com/NeuronHardware", "False").await;
    s.wait("healthy again", || async { (s.config(&s.ns, "fleet").await?.status?.unhealthy_nodes == 0).then_some(()) })
        .await;

    // A newer config with health settings: the nodes keep the fleet's, and it is told.
    assert!(s.apply(&config_yaml(&s.ns, "newer", &s.run, "  health:\n    conditionType: Other\n")).0);
    let overridden = s
        .wait("the newer config told", || async {
            s.condition(&s.ns, "newer", "HealthSettings").await.filter(|c| c.0 == "False")
        })
        .await;
    assert_eq!(overridden.1, "Overridden");
    assert!(
        overridden.2.contains(&format!("{}/fleet", s.ns)) && overridden.2.contains("on 2 of its 2"),
        "{overridden:?}"
    );
    assert_eq!(
        s.node_config(&a).await.unwrap().health.unwrap().condition_type.as_deref(),
        Some("e2e.example.com/NeuronHardware")
    );
    let fleet = s.condition(&s.ns, "fleet", "HealthSettings").await.unwrap();
    assert_eq!(fleet.0, "True", "{fleet:?}");
    for node in [&a, &b] {
        nodes.delete(node, &DeleteParams::default()).await.unwrap();
    }
}

/// Deletes the objects of a YAML document stream when dropped (also when a test panics).
struct DeleteOnDrop {
    cp: &'static ControlPlane,
    yaml: String,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let (ok, out, err) = kubectl(self.cp, &["delete", "--ignore-not-found", "-f", "-"], Some(&self.yaml));
        if !ok {
            eprintln!("cleaning up: kubectl delete failed: {out}{err}");
        }
    }
}

// --- Tenancy (issue 14) and the cost of each mode (issue 17) ---------------------------

/// The chart's tenancy policy ConfigMap (default values, or `--set` ones) for a release
/// in `namespace`, and the operator flags the chart gives it.
fn chart_tenancy(namespace: &str, set: &[&str]) -> (String, Vec<String>) {
    let chart = neuron_e2e::repo_root().join("charts/neuron-monitor");
    let mut command = std::process::Command::new(neuron_e2e::tool("helm"));
    command.args(["template", "nm", &chart.display().to_string(), "--namespace", namespace]);
    for value in set {
        command.args(["--set", value]);
    }
    let out = command.output().expect("helm runs");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut policy = None;
    let mut flags = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let doc: serde_norway::Value = serde::Deserialize::deserialize(document).expect("YAML");
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        if doc["kind"] == "ConfigMap" && name.ends_with("-tenancy") {
            policy = Some(serde_norway::to_string(&doc).unwrap());
        }
        if doc["kind"] == "Deployment" {
            let args = doc["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().unwrap();
            flags = args
                .iter()
                .filter_map(|a| a.as_str())
                .filter(|a| a.starts_with("--tenancy-policy=") || a.starts_with("--otlp-usd-per-gb="))
                .map(str::to_owned)
                .collect();
        }
    }
    (policy.expect("the chart renders the tenancy policy"), flags)
}

/// A policy ConfigMap of our own, applied (created or replaced) in the operator's namespace.
fn apply_policy(s: &Scenario, name: &str, policy: &str) {
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {}\ndata:\n  policy.yaml: |\n{}",
        s.ns,
        policy.lines().map(|l| format!("    {l}\n")).collect::<String>()
    );
    let (ok, out) = s.apply(&yaml);
    assert!(ok, "{out}");
}

/// Deletes these namespaces, and the configs in them, when dropped (also when a test
/// panics): operators watch configs cluster-wide, and the tests that follow count refusals.
fn delete_namespaces_on_drop(cp: &'static ControlPlane, namespaces: &[&str]) -> DeleteOnDrop {
    let documents: Vec<String> =
        namespaces.iter().map(|n| format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {n}\n")).collect();
    DeleteOnDrop { cp, yaml: documents.join("---\n") }
}

/// Configs refused for `reason` in the operator's last pass, once it has made one. Other
/// tests leave configs behind in their namespaces, which every operator of this binary
/// sees: tests count refusals from this baseline.
async fn refused_in_last_pass(s: &Scenario, operator: SocketAddr, reason: &str) -> f64 {
    let label = format!("reason=\"{reason}\"");
    s.wait("the operator's first pass", || async {
        let metrics = http_get(operator, "/metrics")?.1;
        (sample(&metrics, "neuron_operator_reconciles_total")? >= 1.0).then_some(())?;
        labelled_sample(&metrics, "neuron_operator_refused_configs", &[&label])
    })
    .await
}

/// Waits for a config's Accepted condition for its current generation with `status`.
async fn verdict(s: &Scenario, namespace: &str, name: &str, status: &str) -> (String, String, String) {
    s.wait(&format!("{namespace}/{name} Accepted={status}"), || async {
        accepted_conditions(s, namespace).await.remove(name).filter(|v| v.0 == status)
    })
    .await
}

/// The attack run's findings (issue 14): with the chart's default tenancy policy, a team's
/// config publishing into another team's CloudWatch namespace, or naming a region of
/// another partition (us-gov-west-1 from an aws node), is refused with its own reason and
/// the field named, announced by a Warning Event and counted; nothing of it reaches the
/// node. So are an OTLP endpoint no policy lists and a sink of too many series.
#[tokio::test]
async fn the_charts_default_policy_refuses_the_attacks_configs() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-tenancy").await;
    let (policy, flags) = chart_tenancy(&s.ns, &[]);
    assert!(flags.iter().any(|f| f.starts_with("--tenancy-policy=")), "{flags:?}");
    let (ok, out) = s.apply(&policy);
    assert!(ok, "{out}");
    let (_operator, operator_addr) = s.operator_with(&flags);
    let (outside_before, series_before) = (
        refused_in_last_pass(&s, operator_addr, "OutsidePolicy").await,
        refused_in_last_pass(&s, operator_addr, "TooManySeries").await,
    );
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.32xlarge").await;
    let (team_a, team_b) = (s.team_namespace("team-a").await, s.team_namespace("team-b").await);
    let _cleanup = delete_namespaces_on_drop(s.cp, &[&team_a, &team_b, &s.ns]);

    let cloudwatch =
        |namespace: &str, extra: &str| format!("  sinks:\n    cloudwatch:\n      namespace: {namespace}\n{extra}");
    assert!(s.apply(&config_yaml(&team_a, "own", &s.run, &cloudwatch(&format!("Teams/{team_a}/Neuron"), ""))).0);
    let refused = [
        ("intruder", cloudwatch(&format!("Teams/{team_b}/Neuron"), ""), "spec.sinks.cloudwatch.namespace"),
        (
            "govcloud",
            cloudwatch(&format!("Teams/{team_a}/Neuron"), "      region: us-gov-west-1\n"),
            "spec.sinks.cloudwatch.region",
        ),
        (
            "collector",
            "  sinks:\n    otlp:\n      endpoint: http://attacker.example:4318/v1/metrics\n".to_owned(),
            "spec.sinks.otlp.endpoint",
        ),
        ("china", "  sinks:\n    otlp:\n      region: cn-north-1\n".to_owned(), "spec.sinks.otlp.region"),
    ];
    for (name, spec, _) in &refused {
        let (ok, out) = s.apply(&config_yaml(&team_a, name, &s.run, spec));
        assert!(ok, "{name}: {out}");
    }
    // The operator's namespace is held to the partition too: its health event stream.
    let logs = "  health:\n    logs:\n      region: us-gov-east-1\n";
    assert!(s.apply(&config_yaml(&s.ns, "cluster", &s.run, logs)).0);
    // Series: four more per-core roll-ups, 13,440 series on the largest node.
    let rollups = "      rollups: [[NodeName, PodName, NeuronCore], [ClusterName, PodName, NeuronCore], \
                   [NodeName, ContainerName, NeuronCore], [RuntimeTag, PodName, NeuronCore]]\n";
    assert!(s.apply(&config_yaml(&team_a, "wide", &s.run, &cloudwatch(&format!("Teams/{team_a}/Wide"), rollups))).0);

    let own = verdict(&s, &team_a, "own", "True").await;
    assert_eq!(own.1, "Valid");
    for (name, _, field) in &refused {
        let (_, reason, message) = verdict(&s, &team_a, name, "False").await;
        assert_eq!(reason, "OutsidePolicy", "{name}: {message}");
        assert!(message.starts_with(field), "{name}: the refusal names {field}: {message}");
    }
    let (_, reason, message) = verdict(&s, &s.ns, "cluster", "False").await;
    assert_eq!(reason, "OutsidePolicy");
    assert!(message.starts_with("spec.health.logs.region") && message.contains("aws-us-gov"), "{message}");
    let (_, reason, message) = verdict(&s, &team_a, "wide", "False").await;
    assert_eq!(reason, "TooManySeries");
    assert!(message.starts_with("spec.sinks.cloudwatch:") && message.contains("13440 series"), "{message}");

    // Only the accepted config reaches the node.
    let config = s.wait("the node's configuration", || async { s.node_config(&node).await }).await;
    let routes: Vec<&str> = config.routes.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(routes, vec![format!("{team_a}/own").as_str()]);
    // Announced by a Warning Event of its reason, and counted.
    let events: Api<Event> = Api::namespaced(s.client.clone(), &team_a);
    s.wait("a Warning Event OutsidePolicy on the intruder", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("OutsidePolicy")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("intruder")
            })
            .then_some(())
    })
    .await;
    assert_eq!(refused_in_last_pass(&s, operator_addr, "OutsidePolicy").await - outside_before, 5.0);
    assert_eq!(refused_in_last_pass(&s, operator_addr, "TooManySeries").await - series_before, 1.0);
    let metrics = http_get(operator_addr, "/metrics").unwrap().1;
    assert_eq!(sample(&metrics, "neuron_operator_tenancy_policy_valid"), Some(1.0));
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// A policy edit is in force without a restart: a refused config becomes accepted when
/// the policy allows it, an accepted one refused when the policy stops allowing it. A
/// refused update keeps the nodes on the last accepted version while that version is
/// within the policy; a policy that is not valid changes nothing and is announced.
#[tokio::test]
async fn a_policy_change_is_applied_and_refused_updates_keep_the_last_accepted_version() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-policy").await;
    let team = s.team_namespace("team-a").await;
    let _cleanup = delete_namespaces_on_drop(s.cp, &[&team, &s.ns]);
    let name = "tenancy";
    apply_policy(&s, name, "default:\n  cloudWatchNamespaces: ['Teams/{namespace}/*']\n");
    let (_operator, operator_addr) = s.operator_with(&[format!("--tenancy-policy={name}")]);
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.2xlarge").await;
    let sink_namespace = |config: &NodeConfig| -> Option<String> {
        config.routes.iter().find(|r| r.config.ends_with("/serving"))?.cloudwatch.as_ref().map(|c| c.namespace.clone())
    };
    let serving = |namespace: &str| {
        config_yaml(&team, "serving", &s.run, &format!("  sinks:\n    cloudwatch:\n      namespace: {namespace}\n"))
    };
    let own = format!("Teams/{team}/Neuron");
    assert!(s.apply(&serving(&own)).0);
    verdict(&s, &team, "serving", "True").await;
    s.wait("the team's route on the node", || async {
        (sink_namespace(&s.node_config(&node).await?)? == own).then_some(())
    })
    .await;

    // An update outside the policy: refused, the node keeps the last accepted version.
    assert!(s.apply(&serving("Shared/Neuron")).0);
    let (_, reason, message) = verdict(&s, &team, "serving", "False").await;
    assert_eq!(reason, "OutsidePolicy", "{message}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sink_namespace(&s.node_config(&node).await.unwrap()).as_deref(), Some(own.as_str()));

    // The policy allows it now: accepted and rendered, without touching the config.
    let edited = Instant::now();
    apply_policy(&s, name, "default:\n  cloudWatchNamespaces: ['Teams/{namespace}/*', 'Shared/*']\n");
    s.wait("the update rendered under the new policy", || async {
        (sink_namespace(&s.node_config(&node).await?)? == "Shared/Neuron").then_some(())
    })
    .await;
    println!("policy edit → the node's configuration follows it: {:?}", edited.elapsed());
    verdict(&s, &team, "serving", "True").await;

    // A policy that is not valid: the last valid one stays, and it is said.
    apply_policy(&s, name, "default:\n  cloudWatchNamespaces: ['Teams/{namespace}*']\n");
    s.wait("the invalid policy counted", || async {
        let metrics = http_get(operator_addr, "/metrics")?.1;
        (sample(&metrics, "neuron_operator_tenancy_policy_valid")? == 0.0).then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns);
    let event = s
        .wait("a Warning Event InvalidPolicy on the ConfigMap", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("InvalidPolicy")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        })
        .await;
    assert!(event.note.unwrap_or_default().contains("default.cloudWatchNamespaces[0]"));
    assert_eq!(accepted_conditions(&s, &team).await["serving"].0, "True");

    // A policy that tightens takes effect on established configs: the last accepted
    // version is outside it too, so the config leaves the node.
    apply_policy(&s, name, "default:\n  cloudWatchNamespaces: ['Teams/{namespace}/*']\n");
    let (_, reason, _) = verdict(&s, &team, "serving", "False").await;
    assert_eq!(reason, "OutsidePolicy");
    s.wait("the config off the node", || async {
        let config = s.node_config(&node).await;
        config.is_none_or(|c| sink_namespace(&c).is_none()).then_some(())
    })
    .await;
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// A namespace's monthly ceiling (issue 14) refuses its newest configs first, at the
/// estimate of each config's own mode; the status prices every mode (issue 17) and names
/// the cheapest.
#[tokio::test]
async fn a_cost_ceiling_refuses_the_newest_configs_and_status_prices_each_mode() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-ceiling").await;
    let team = s.team_namespace("team-a").await;
    let _cleanup = delete_namespaces_on_drop(s.cp, &[&team, &s.ns]);
    // The chart's policy with a ceiling, as a user sets it.
    let (policy, flags) = chart_tenancy(&s.ns, &["tenancy.default.monthlyCostCeilingUsd=300"]);
    assert!(s.apply(&policy).0);
    let (_operator, operator_addr) = s.operator_with(&flags);
    let ceiling_before = refused_in_last_pass(&s, operator_addr, "CostCeiling").await;
    let node = format!("{}-trn", s.run);
    s.node(&node, "trn1.32xlarge").await;
    // One config a second, so that creation times order them; each costs $202.03 as a
    // classic CloudWatch sink on a trn1.32xlarge.
    for name in ["first", "second"] {
        let spec = format!("  sinks:\n    cloudwatch:\n      namespace: Teams/{team}/{name}\n");
        assert!(s.apply(&config_yaml(&team, name, &s.run, &spec)).0);
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // An OTLP sink to CloudWatch costs far less: it fits next to the first.
    let otlp = "  sinks:\n    otlp: {}\n";
    assert!(s.apply(&config_yaml(&team, "third", &s.run, otlp)).0);

    verdict(&s, &team, "first", "True").await;
    let (_, reason, message) = verdict(&s, &team, "second", "False").await;
    assert_eq!(reason, "CostCeiling", "{message}");
    assert!(
        message.starts_with("spec.sinks:") && message.contains("$202.03") && message.contains("$300.00"),
        "{message}"
    );
    verdict(&s, &team, "third", "True").await;

    let first = s.config(&team, "first").await.unwrap().status.unwrap();
    assert_eq!(first.estimated_monthly_cost_usd.as_deref(), Some("202.03"));
    let cost = first.estimated_cost.expect("every mode priced");
    assert_eq!((cost.classic.series, cost.classic.monthly_usd.as_str()), (672, "202.03"));
    assert_eq!(cost.classic.requests_per_month, Some(43_200));
    assert_eq!(cost.otlp.series, 1472);
    assert!(cost.otlp.bytes_per_month.unwrap_or(0) > 0 && cost.otlp.requests_per_month.is_none());
    assert_eq!(cost.cheapest_mode, "Otlp");
    let otlp_usd: f64 = cost.otlp.monthly_usd.parse().unwrap();
    let third = s.config(&team, "third").await.unwrap().status.unwrap();
    assert_eq!(third.estimated_cloud_watch_metrics, None, "no CloudWatch sink");
    assert_eq!(third.estimated_monthly_cost_usd.as_deref(), Some(format!("{otlp_usd:.2}").as_str()));
    println!(
        "one trn1.32xlarge, a team's default groups: classic ${}, Container Insights ${}, OTLP ${}",
        cost.classic.monthly_usd, cost.container_insights.monthly_usd, cost.otlp.monthly_usd
    );

    assert_eq!(refused_in_last_pass(&s, operator_addr, "CostCeiling").await - ceiling_before, 1.0);
    let config = s.node_config(&node).await.unwrap();
    assert!(!config.routes.iter().any(|r| r.config.ends_with("/second")), "the refused config is on no node");
    Api::<Node>::all(s.client.clone()).delete(&node, &DeleteParams::default()).await.unwrap();
}

/// Issue 24: one tenant's tag filters got agents OOM-killed. A namespace's distinct
/// filters count against its budget on each node: the config that takes it over is
/// refused with the filter named, the older one and another namespace's keep theirs, and a
/// single filter over the per-filter limit is refused at validation.
#[tokio::test]
async fn a_namespaces_costly_tag_filters_are_refused_by_field() {
    use api::{limits::MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE, tag_filter::TagFilter};
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-filters").await;
    let (_operator, _) = s.operator();
    s.node(&format!("{}-trn", s.run), "trn1.2xlarge").await;
    let (team, other) = (s.team_namespace("team-f").await, s.team_namespace("team-g").await);
    let filter = |prefix: &str, i: usize| format!(r"\pL{{6}}{prefix}{i:02}");
    let spec = |filters: Vec<String>| {
        let runtimes: Vec<_> =
            filters.iter().map(|f| json!({ "tagFilter": f, "metrics": [{ "type": "memory_used" }] })).collect();
        json!({ "nodeSelector": { "matchLabels": { "e2e-run": s.run } }, "runtimes": runtimes })
    };
    let fits = MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE / TagFilter::new(&filter("a", 0)).unwrap().cost();
    assert!((3..=16).contains(&fits), "{fits}");
    // Same second: "first" precedes "greedy" by name.
    create_config(&s, &team, "first", spec((0..fits - 1).map(|i| filter("a", i)).collect())).await;
    create_config(&s, &team, "greedy", spec((0..3).map(|i| filter("b", i)).collect())).await;
    create_config(&s, &other, "late", spec((0..fits).map(|i| filter("c", i)).collect())).await;
    create_config(&s, &other, "huge", spec(vec![r"\pL{1000}".to_owned()])).await;

    let verdicts = s
        .wait("verdicts in both namespaces", || async {
            let (t, o) = (accepted_conditions(&s, &team).await, accepted_conditions(&s, &other).await);
            (t.len() == 2 && o.len() == 2).then_some((t, o))
        })
        .await;
    let (team_verdicts, other_verdicts) = verdicts;
    assert_eq!(team_verdicts["first"].0, "True", "{team_verdicts:?}");
    assert_eq!(other_verdicts["late"].0, "True", "{other_verdicts:?}");
    let (status, reason, message) = &team_verdicts["greedy"];
    assert_eq!((status.as_str(), reason.as_str()), ("False", "NamespaceLimit"), "{message}");
    assert!(message.contains("spec.runtimes[1].tagFilter") && message.contains("tag filters"), "{message}");
    let (status, reason, message) = &other_verdicts["huge"];
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"), "{message}");
    assert!(message.contains("spec.runtimes[0].tagFilter") && message.contains("too costly"), "{message}");
}

/// The extra label `rev` of a config's Prometheus series on a node's ConfigMap.
async fn rev_on(s: &Scenario, node: &str, config: &str) -> Option<String> {
    let routes = s.node_config(node).await?.routes;
    let route = routes.into_iter().find(|r| r.config == config)?;
    route.prometheus?.extra_labels.get("rev").cloned()
}

fn revision(rev: usize) -> serde_json::Value {
    json!({ "spec": { "sinks": { "prometheus": { "extraLabels": { "rev": format!("r{rev}") } } } } })
}

/// Issue 24, fault 4: a tenant patching its config in a loop rewrote every node it
/// selects (150 patches, 150 ConfigMap writes for two nodes) and restarted neuron-monitor
/// for every tenant there. Its changes are adopted at a pace; another team's change made
/// meanwhile reaches the nodes at once, and the tenant's newest version lands in the end.
#[tokio::test]
async fn a_tenant_editing_in_a_loop_is_paced_and_other_tenants_are_not() {
    let _serial = SERIAL.lock().await;
    let s = Scenario::new("nm-thrash").await;
    let (_operator, operator_addr) = s.operator();
    let nodes = [format!("{}-a", s.run), format!("{}-b", s.run)];
    for node in &nodes {
        s.node(node, "trn1.32xlarge").await;
    }
    let thrash = s.team_namespace("team-loop").await;
    let calm = s.team_namespace("team-calm").await;
    let spec = || json!({ "sinks": { "prometheus": { "extraLabels": { "rev": "r0" } } } });
    create_config(&s, &thrash, "loop", spec()).await;
    create_config(&s, &calm, "steady", spec()).await;
    let (loop_route, steady_route) = (format!("{thrash}/loop"), format!("{calm}/steady"));
    for node in &nodes {
        s.wait("both teams on the node", || async {
            (rev_on(&s, node, &loop_route).await.is_some() && rev_on(&s, node, &steady_route).await.is_some())
                .then_some(())
        })
        .await;
    }
    let writes = || async {
        let metrics = http_get(operator_addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
        labelled_sample(&metrics, "neuron_operator_writes_total", &["kind=\"configmap\"", "action=\"apply\""])
            .unwrap_or(0.0)
    };
    let before = writes().await;

    // 150 patches in about 10 s; halfway, the other team changes its config once.
    let loops = Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &thrash);
    let steady = Api::<NeuronMonitorConfig>::namespaced(s.client.clone(), &calm);
    let started = Instant::now();
    let mut other_team_took = None;
    for rev in 1..=150 {
        loops.patch("loop", &PatchParams::default(), &Patch::Merge(revision(rev))).await.unwrap();
        if rev == 75 {
            steady.patch("steady", &PatchParams::default(), &Patch::Merge(revision(1))).await.unwrap();
            let asked = Instant::now();
            for node in &nodes {
                s.wait("the other team's change", || async {
                    (rev_on(&s, node, &steady_route).await.as_deref() == Some("r1")).then_some(())
                })
                .await;
            }
            other_team_took = Some(asked.elapsed());
            let metrics = http_get(operator_addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
            assert_eq!(sample(&metrics, "neuron_operator_namespaces_held"), Some(1.0), "the looping team is held");
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let thrashed = started.elapsed();
    let during = writes().await - before;

    // The newest version lands on every node, and its status says so.
    for node in &nodes {
        s.wait("the looping team's newest version", || async {
            (rev_on(&s, node, &loop_route).await.as_deref() == Some("r150")).then_some(())
        })
        .await;
    }
    s.wait("the status of the newest generation", || async {
        let config = s.config(&thrash, "loop").await?;
        (config.status?.observed_generation == config.metadata.generation).then_some(())
    })
    .await;
    let landed = started.elapsed();
    let other_team_took = other_team_took.expect("the other team changed its config");
    println!(
        "150 patches in {thrashed:?}: {during} ConfigMap writes for {} nodes; the other team's change on the nodes \
         in {other_team_took:?}; the newest version landed after {landed:?}",
        nodes.len()
    );
    // Per node: the burst of 5, one per 10 s of the loop, the other team's change, and
    // one more for a slot at the end.
    let allowed = nodes.len() as f64 * (5.0 + (thrashed.as_secs_f64() / 10.0).ceil() + 2.0);
    assert!(during <= allowed, "{during} ConfigMap writes, at most {allowed} expected");
    assert!(other_team_took < Duration::from_secs(5), "the other team waited {other_team_took:?}");
    for node in &nodes {
        Api::<Node>::all(s.client.clone()).delete(node, &DeleteParams::default()).await.unwrap();
    }
}
