//! The Helm chart (charts/neuron-monitor) against the real tools and the real API server:
//! `helm lint`/`helm template` on every values file, every rendered object accepted by
//! kube-apiserver (with the Prometheus Operator's real CRDs), `helm install`, the
//! operator and an agent doing their whole job as the chart's ServiceAccounts with its
//! RBAC and nothing more, the alert rules under promtool, the dashboard's queries on a
//! real Prometheus scraping simulated agents, and the values schema.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use api::node_config::{configmap_name, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION, MONITOR_CONFIG_KEY};
use k8s_openapi::{
    api::{
        authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec},
        coordination::v1::Lease,
        core::v1::{ConfigMap, Node, Pod, Secret},
        events::v1::Event,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api, Client, ResourceExt,
};
use neuron_e2e::{
    chart::{
        api_answer, assert_refused, chart_args, chart_dir, chart_env, documents, find, helm, kind, one, run, strings,
        template_as,
    },
    fixture_path, free_port, http_get, https, kubectl,
    prometheus::Prometheus,
    random_u32, repo_root, sample, spawn_tied, tool, wait_for, workspace_bin, ControlPlane, Process, NODE_NAME_EXTRA,
    PROMETHEUS_OPERATOR_CRDS,
};
use serde_json::json;
use serde_norway::Value;

const RELEASE: &str = "nm";
/// The monitoring.coreos.com kinds the chart renders when the cluster serves them.
const MONITORING_KINDS: [&str; 3] = ["ServiceMonitor", "PodMonitor", "PrometheusRule"];

/// The realistic values files (charts/neuron-monitor/ci/), sorted.
fn values_files() -> Vec<PathBuf> {
    let dir = chart_dir().join("ci");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "expected the realistic values files in {}", dir.display());
    files
}

/// `helm template` of the chart as release [`RELEASE`]; panics with helm's message when
/// it fails.
fn template(namespace: &str, values: Option<&Path>, extra: &[&str]) -> String {
    template_as(RELEASE, namespace, values, extra)
}

/// `--api-versions` flags that make helm render every monitoring.coreos.com kind.
fn monitoring_api_flags() -> Vec<String> {
    MONITORING_KINDS
        .iter()
        .flat_map(|k| ["--api-versions".to_owned(), format!("monitoring.coreos.com/v1/{k}")])
        .collect()
}

/// The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), from the
/// repository's fixtures, applied and established.
async fn install_monitoring_crds(cp: &ControlPlane) {
    let dir = fixture_path(PROMETHEUS_OPERATOR_CRDS);
    assert!(dir.is_dir(), "the Prometheus Operator CRDs are missing: {}", dir.display());
    let dir = dir.display().to_string();
    let (ok, out, err) = kubectl(cp, &["apply", "--server-side", "--force-conflicts", "-f", &dir], None);
    assert!(ok, "applying {dir}: {out}{err}");
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client().await);
    for plural in ["servicemonitors", "podmonitors", "prometheusrules"] {
        let name = format!("{plural}.monitoring.coreos.com");
        wait(&format!("{name} established"), Duration::from_secs(60), || async {
            let conditions = crds.get(&name).await.ok()?.status?.conditions?;
            conditions.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
    }
}

async fn install_all_crds(cp: &ControlPlane) {
    cp.install_crds().await;
    install_monitoring_crds(cp).await;
}

#[test]
fn the_chart_holds_the_generated_crds() {
    let generated = repo_root().join("crds");
    let in_chart = chart_dir().join("crds");
    let list = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(list(&in_chart), list(&generated), "charts/neuron-monitor/crds/ and crds/ hold different files");
    for name in list(&generated) {
        let a = std::fs::read(generated.join(&name)).unwrap();
        let b = std::fs::read(in_chart.join(&name)).unwrap();
        assert!(
            a == b,
            "charts/neuron-monitor/crds/{name} differs from crds/{name}: cp crds/{name} charts/neuron-monitor/crds/"
        );
    }
}

/// The agent's instance types in the chart are api::hardware's list, whole (the chart
/// cannot import it); checked on values.yaml itself, without helm.
#[test]
fn the_chart_lists_every_known_instance_type() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let values: Value = serde_norway::from_str(&text).unwrap();
    let known: Vec<String> = api::hardware::INSTANCE_TYPES.iter().map(|t| t.name.to_owned()).collect();
    assert_eq!(strings(&values["agent"]["instanceTypes"]), known, "values.yaml's agent.instanceTypes");
    let families: Vec<&str> = api::hardware::NEURON_INSTANCE_FAMILIES.iter().map(|f| f.trim_end_matches('.')).collect();
    let comment = text.lines().skip_while(|l| !l.contains("Nodes the agent runs on")).take(2).collect::<String>();
    assert!(comment.contains(&families.join(", ")), "the comment above agent.instanceTypes names {families:?}");
}

#[test]
fn the_charts_gpu_instance_types_have_nvidia_gpus() {
    let values: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap()).unwrap();
    let types = strings(&values["gpu"]["instanceTypes"]);
    assert!(types.iter().any(|t| t == "p5.48xlarge") && types.iter().any(|t| t == "g5.xlarge"), "{types:?}");
    for t in types {
        assert!(api::hardware::NVIDIA_INSTANCE_FAMILIES.iter().any(|f| t.starts_with(f)), "{t} is no NVIDIA family");
    }
}

/// The agent's DaemonSet and the operator's Deployment rendered with `extra` flags.
fn agent_and_operator(extra: &[&str]) -> (Value, Value) {
    let docs = documents(&template("neuron-monitor", None, extra));
    (one(&docs, "DaemonSet").clone(), one(&docs, "Deployment").clone())
}

#[test]
fn gpu_nodes_are_selected_and_given_nvml_only_when_gpu_is_enabled() {
    let nvml_arg = "--nvml-library=/host/nvidia-lib/libnvidia-ml.so.1".to_owned();
    let terms = |ds: &Value| {
        ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|t| t["matchExpressions"][0]["key"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let tolerates_gpu = |ds: &Value| {
        ds["spec"]["template"]["spec"]["tolerations"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu")
    };
    let volumes = |ds: &Value| serde_json::to_string(&ds["spec"]["template"]["spec"]["volumes"]).unwrap();

    // Off (the default): Neuron nodes only, nothing of NVML, the operator without GPU nodes.
    let (ds, op) = agent_and_operator(&[]);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(terms(&ds), ["node.kubernetes.io/instance-type"]);
    assert!(!strings(&c["args"]).contains(&nvml_arg) && !volumes(&ds).contains("nvidia"));
    assert!(!tolerates_gpu(&ds));
    assert!(!strings(&op["spec"]["template"]["spec"]["containers"][0]["args"])
        .iter()
        .any(|a| a.starts_with("--gpu-nodes")));

    // On, hostPath: GPU nodes by instance type or the GPU Operator's label, the driver's
    // library directory read-only, the operator told.
    let (ds, op) = agent_and_operator(&["--set", "gpu.enabled=true"]);
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        terms(&ds),
        ["node.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "nvidia.com/gpu.present"]
    );
    assert!(strings(&c["args"]).contains(&nvml_arg));
    let mount = c["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"] == "nvidia-lib").expect("mount");
    assert_eq!((mount["mountPath"].as_str(), mount["readOnly"].as_bool()), (Some("/host/nvidia-lib"), Some(true)));
    let volume = pod["volumes"].as_sequence().unwrap().iter().find(|v| v["name"] == "nvidia-lib").expect("volume");
    assert_eq!(volume["hostPath"]["path"].as_str(), Some("/usr/lib64"));
    assert!(tolerates_gpu(&ds));
    assert!(strings(&op["spec"]["template"]["spec"]["containers"][0]["args"]).contains(&"--gpu-nodes=true".to_owned()));
    // It takes no GPU from the workloads: no device-plugin request.
    assert!(!serde_json::to_string(&c["resources"]).unwrap().contains("nvidia.com"), "{:?}", c["resources"]);

    // On, runtime: the NVIDIA runtime injects the management library only; no host mount.
    let (ds, _) = agent_and_operator(&["--set", "gpu.enabled=true,gpu.access=runtime,gpu.runtimeClassName=nvidia"]);
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(pod["runtimeClassName"].as_str(), Some("nvidia"));
    assert!(!strings(&c["args"]).contains(&nvml_arg) && !volumes(&ds).contains("nvidia"));
    let env = serde_json::to_string(&c["env"]).unwrap();
    assert!(env.contains(r#"{"name":"NVIDIA_VISIBLE_DEVICES","value":"all"}"#), "{env}");
    assert!(env.contains(r#"{"name":"NVIDIA_DRIVER_CAPABILITIES","value":"utility"}"#), "{env}");
}

#[test]
fn the_gpu_dashboard_ships_with_gpu_enabled_and_reads_only_what_the_agent_exports() {
    let dashboards = |extra: &[&str]| {
        let docs = documents(&template("neuron-monitor", None, extra));
        let cm = find(&docs, "ConfigMap")
            .into_iter()
            .find(|c| c["metadata"]["name"].as_str().unwrap().ends_with("dashboard"));
        let data = cm.expect("dashboard ConfigMap")["data"].clone();
        data.as_mapping().unwrap().keys().map(|k| k.as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(dashboards(&[]), ["neuron-monitor.json"]);
    assert_eq!(dashboards(&["--set", "gpu.enabled=true"]), ["neuron-monitor.json", "neuron-monitor-gpu.json"]);

    let text = std::fs::read_to_string(chart_dir().join("files/gpu-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_ne!(dashboard["uid"], neuron_e2e::dashboard::load()["uid"], "a dashboard of its own");
    let queries = neuron_e2e::dashboard::queries(&dashboard);
    assert!(queries.len() >= 10, "{} queries", queries.len());
    let sources = source_text(&[repo_root().join("node-agent/src")]);
    for (title, expr) in &queries {
        let names = neuron_e2e::dashboard::metric_names(expr);
        assert!(!names.is_empty(), "{title}: {expr} reads no metric");
        for metric in names {
            assert!(registered(&sources, &metric), "{title} reads {metric}, which the agent does not register");
        }
    }
}

#[test]
fn helm_lint_passes_with_the_default_and_every_values_file() {
    let chart = chart_dir().display().to_string();
    let (ok, out, err) = helm(&["lint", "--strict", &chart]);
    assert!(ok, "helm lint (default values): {out}{err}");
    for file in values_files() {
        let file = file.display().to_string();
        let (ok, out, err) = helm(&["lint", "--strict", &chart, "--values", &file]);
        assert!(ok, "helm lint --values {file}: {out}{err}");
    }
}

#[test]
fn templates_render_what_the_chart_promises() {
    let api = monitoring_api_flags();
    let api: Vec<&str> = api.iter().map(String::as_str).collect();
    let docs = documents(&template("neuron-monitor", None, &api));

    // Operator: two replicas electing a leader, probes, locked down, downward API, JSON logs.
    let deploy = one(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"].as_i64(), Some(2));
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    assert!(args.contains(&"--leader-election=true".to_owned()), "{args:?}");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"].as_str(), Some("/healthz"));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"].as_str(), Some("/readyz"));
    assert_eq!(c["ports"][0]["containerPort"].as_i64(), Some(8080));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"));
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(strings(&c["securityContext"]["capabilities"]["drop"]), vec!["ALL"]);
    assert!(c["resources"]["requests"]["memory"].is_string() && c["resources"]["limits"]["memory"].is_string());
    let env: BTreeMap<String, String> = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            let v = e["valueFrom"]["fieldRef"]["fieldPath"].as_str().or(e["value"].as_str()).unwrap_or_default();
            (e["name"].as_str().unwrap().to_owned(), v.to_owned())
        })
        .collect();
    assert_eq!(env["OPERATOR_NAMESPACE"], "metadata.namespace");
    assert_eq!(env["POD_NAME"], "metadata.name");
    assert_eq!(env["NEURON_OPERATOR_LOG_FORMAT"], "json");
    assert_eq!(one(&docs, "PodDisruptionBudget")["spec"]["minAvailable"].as_i64(), Some(1));

    // Agent: Neuron nodes only, tolerations, priority, host PID, socket read-only, NODE_NAME.
    let ds = one(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"][0];
    assert_eq!(term["key"].as_str(), Some("node.kubernetes.io/instance-type"));
    assert_eq!(term["operator"].as_str(), Some("In"));
    // The whole list of the Neuron types the agent knows (api::hardware), in its order.
    let known: Vec<String> = api::hardware::INSTANCE_TYPES.iter().map(|t| t.name.to_owned()).collect();
    assert_eq!(strings(&term["values"]), known, "agent.instanceTypes of values.yaml and api::hardware differ");
    let tolerations: Vec<&str> =
        pod["tolerations"].as_sequence().unwrap().iter().filter_map(|t| t["key"].as_str()).collect();
    assert_eq!(tolerations, vec!["aws.amazon.com/neuron", "CriticalAddonsOnly"]);
    assert_eq!(pod["priorityClassName"].as_str(), Some("system-node-critical"));
    assert_eq!(pod["hostPID"].as_bool(), Some(true));
    assert_eq!(ds["spec"]["updateStrategy"]["type"].as_str(), Some("RollingUpdate"));
    assert!(!ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_null());
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    assert!(args.contains(&"--config-namespace=neuron-monitor".to_owned()), "{args:?}");
    assert!(args.contains(&"--monitor-command=/opt/aws/neuron/bin/neuron-monitor".to_owned()), "{args:?}");
    assert_eq!(c["env"][0]["name"].as_str(), Some("NODE_NAME"));
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as_str(), Some("spec.nodeName"));
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let socket = mounts.iter().find(|m| m["mountPath"] == "/var/lib/kubelet/pod-resources").expect("socket mount");
    assert_eq!(socket["readOnly"].as_bool(), Some(true));
    let state = mounts.iter().find(|m| m["name"] == "state").unwrap();
    assert!(args.contains(&format!("--state-dir={}", state["mountPath"].as_str().unwrap())));
    let volumes = pod["volumes"].as_sequence().unwrap();
    assert!(volumes.iter().any(|v| v["name"] == "state" && v["emptyDir"].is_mapping()));
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(c["securityContext"]["privileged"].as_bool(), Some(true), "the default device access");

    // Monitoring objects with the API, none without it, all of them when forced.
    let kinds = |docs: &[Value]| -> BTreeSet<String> { docs.iter().map(|d| kind(d).to_owned()).collect() };
    let with_api = kinds(&docs);
    assert!(with_api.contains("ServiceMonitor") && with_api.contains("PrometheusRule"), "{with_api:?}");
    assert!(!with_api.contains("PodMonitor"), "PodMonitor is off by default");
    let without = kinds(&documents(&template("neuron-monitor", None, &[])));
    assert!(MONITORING_KINDS.iter().all(|k| !without.contains(*k)), "{without:?}");
    let forced = kinds(&documents(&template("neuron-monitor", None, &["--set", "monitoring.force=true"])));
    assert!(forced.contains("ServiceMonitor") && forced.contains("PrometheusRule"), "{forced:?}");

    // The agents' ServiceMonitor gives the job name the alerts and dashboard expect.
    let sm = find(&docs, "ServiceMonitor")
        .into_iter()
        .find(|s| s["metadata"]["name"].as_str().unwrap().ends_with("node-agent"));
    let sm = sm.expect("the agents' ServiceMonitor");
    let service = find(&docs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == sm["metadata"]["name"])
        .expect("the agents' Service");
    let job_label = sm["spec"]["jobLabel"].as_str().unwrap();
    assert_eq!(service["metadata"]["labels"][job_label].as_str(), Some("neuron-node-agent"));
    assert_eq!(service["spec"]["ports"][0]["port"].as_i64(), Some(9010));

    // The PrometheusRule is files/alerts.yaml, rule for rule.
    let file: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart_dir().join("files/alerts.yaml")).unwrap()).unwrap();
    assert_eq!(one(&docs, "PrometheusRule")["spec"]["groups"], file["groups"]);
    // ... with ruleLabels added to every alert, and disabled alerts left out.
    let irsa = documents(&template("ns", Some(&chart_dir().join("ci/irsa-cloudwatch-values.yaml")), &api));
    let rules = &one(&irsa, "PrometheusRule")["spec"]["groups"];
    let all: Vec<&Value> =
        rules.as_sequence().unwrap().iter().flat_map(|g| g["rules"].as_sequence().unwrap()).collect();
    assert!(all.iter().all(|r| r["labels"]["team"] == "ml-platform" && r["labels"]["severity"].is_string()));
    // The hardware-health event stream: off by default, its flags when enabled.
    let agent_args = |docs: &[Value]| -> Vec<String> {
        let ds = one(docs, "DaemonSet");
        let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().expect("agent args");
        args.iter().filter_map(|a| a.as_str()).filter(|a| a.starts_with("--health-log")).map(str::to_owned).collect()
    };
    assert!(agent_args(&docs).is_empty());
    assert_eq!(agent_args(&irsa), ["--health-log-group=/aws/neuron/hardware-events", "--health-log-region=us-west-2"]);
    let pm = documents(&template("ns", Some(&chart_dir().join("ci/podmonitor-values.yaml")), &api));
    let text = serde_norway::to_string(&one(&pm, "PrometheusRule")["spec"]).unwrap();
    assert!(!text.contains("NeuronMonitorOutputRejected") && text.contains("NeuronAgentDown"));
    assert_eq!(find(&pm, "PodMonitor").len(), 2, "agents and operator");
    assert!(find(&pm, "ServiceMonitor").is_empty());

    // The dashboard ConfigMap carries files/dashboard.json and the sidecar's label.
    let dashboard =
        find(&docs, "ConfigMap").into_iter().find(|c| c["metadata"]["name"].as_str().unwrap().ends_with("dashboard"));
    let dashboard = dashboard.expect("dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"].as_str(), Some("1"));
    let embedded: serde_json::Value =
        serde_json::from_str(dashboard["data"]["neuron-monitor.json"].as_str().unwrap()).unwrap();
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart_dir().join("files/dashboard.json")).unwrap()).unwrap();
    assert_eq!(embedded, file);

    // The default NeuronMonitorConfig lives in the release namespace.
    let nmc = one(&docs, "NeuronMonitorConfig");
    assert_eq!(nmc["metadata"]["namespace"].as_str(), Some("neuron-monitor"));

    // The OTLP headers mirror: an empty Secret, named to both binaries.
    let mirror = find(&docs, "Secret")
        .into_iter()
        .find(|s| s["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-otlp-headers")))
        .expect("the OTLP headers Secret");
    assert!(mirror["data"].is_null(), "created empty: {mirror:?}");
    let flag = format!("--otlp-headers-secret={}", mirror["metadata"]["name"].as_str().unwrap());
    for k in ["Deployment", "DaemonSet"] {
        assert!(strings(&one(&docs, k)["spec"]["template"]["spec"]["containers"][0]["args"]).contains(&flag), "{k}");
    }
}

/// The names of the Secrets rendered; the (empty) OTLP headers mirror is always one.
fn secret_names(docs: &[Value]) -> Vec<&str> {
    find(docs, "Secret").iter().filter_map(|s| s["metadata"]["name"].as_str()).collect()
}

/// The metrics endpoints (values `metricsEndpoint`): HTTPS with the chart's own
/// certificate, token reviews granted to both binaries, the reader ClusterRole, monitors
/// that send a token and check the certificate; cert-manager, plain HTTP and the
/// NetworkPolicy when asked.
#[test]
fn templates_render_the_metrics_endpoints_behind_https_and_tokens() {
    let api = monitoring_api_flags();
    let api: Vec<&str> = api.iter().map(String::as_str).collect();
    let docs = documents(&template("neuron-monitor", None, &api));
    let args_of = |docs: &[Value], workload: &str| {
        strings(&one(docs, workload)["spec"]["template"]["spec"]["containers"][0]["args"])
    };
    for workload in ["DaemonSet", "Deployment"] {
        let args = args_of(&docs, workload);
        for flag in ["--tls-cert-file=", "--tls-key-file=", "--probe-listen=0.0.0.0:"] {
            assert!(args.iter().any(|a| a.starts_with(flag)), "{workload}: {flag} in {args:?}");
        }
        assert!(args.contains(&"--metrics-auth=true".to_owned()), "{workload}: {args:?}");
        let (secret, _) = certificate_files(&docs, workload);
        assert_eq!(secret, "nm-neuron-monitor-metrics-tls");
    }
    // The chart's own certificate and CA; the CA published on its own.
    let secret = find(&docs, "Secret").into_iter().find(|d| d["metadata"]["name"] == "nm-neuron-monitor-metrics-tls");
    let secret = secret.expect("the certificate Secret");
    assert_eq!(secret["type"].as_str(), Some("kubernetes.io/tls"));
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(secret["data"][key].as_str().is_some_and(|v| !v.is_empty()), "{key}");
    }
    let ca = find(&docs, "ConfigMap").into_iter().find(|d| d["metadata"]["name"] == "nm-neuron-monitor-metrics-ca");
    assert!(ca.expect("the CA ConfigMap")["data"]["ca.crt"].as_str().unwrap().contains("BEGIN CERTIFICATE"));
    // Both binaries may review tokens; a scraper needs get on /metrics.
    for role in ["nm-neuron-monitor-node-agent", "nm-neuron-monitor-operator"] {
        let role = find(&docs, "ClusterRole").into_iter().find(|r| r["metadata"]["name"] == role).expect(role);
        let rules = serde_norway::to_string(&role["rules"]).unwrap();
        assert!(rules.contains("tokenreviews") && rules.contains("subjectaccessreviews"), "{rules}");
    }
    let reader =
        find(&docs, "ClusterRole").into_iter().find(|r| r["metadata"]["name"] == "nm-neuron-monitor-metrics-reader");
    let reader = &reader.expect("the reader ClusterRole")["rules"][0];
    assert_eq!(
        (strings(&reader["nonResourceURLs"]), strings(&reader["verbs"])),
        (vec!["/metrics".to_owned()], vec!["get".to_owned()])
    );
    assert!(
        find(&docs, "ClusterRoleBinding").iter().all(|b| b["metadata"]["name"] != "nm-neuron-monitor-metrics-reader"),
        "bound only when named"
    );
    // The ServiceMonitors: HTTPS to the Service's name, the published CA, Prometheus's token.
    for (suffix, service) in
        [("node-agent", "nm-neuron-monitor-node-agent"), ("operator", "nm-neuron-monitor-operator")]
    {
        let monitor = find(&docs, "ServiceMonitor")
            .into_iter()
            .find(|m| m["metadata"]["name"].as_str().unwrap().ends_with(suffix))
            .unwrap();
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"].as_str(), Some("https"));
        assert_eq!(
            endpoint["tlsConfig"]["serverName"].as_str(),
            Some(format!("{service}.neuron-monitor.svc").as_str())
        );
        assert_eq!(endpoint["tlsConfig"]["ca"]["configMap"]["name"].as_str(), Some("nm-neuron-monitor-metrics-ca"));
        assert!(endpoint["bearerTokenFile"].as_str().is_some_and(|f| f.ends_with("serviceaccount/token")));
    }
    // On by default (issue 24, fault 3): the metrics ports admit the monitoring
    // namespace only, the probe ports no pod at all.
    let policies = find(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), 2, "on by default, one per component");
    for policy in policies {
        let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
        assert_eq!(ingress.len(), 1, "the metrics port only: {ingress:?}");
        let from = ingress[0]["from"].as_sequence().unwrap();
        assert_eq!(from.len(), 1, "{from:?}");
        let namespace = &from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"];
        assert_eq!(namespace.as_str(), Some("monitoring"));
    }

    // PodMonitors: the chart's scraper ServiceAccount and its token Secret, bound to the reader role.
    let pm = documents(&template("ns", Some(&chart_dir().join("ci/podmonitor-values.yaml")), &api));
    let endpoint = &find(&pm, "PodMonitor")[0]["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["authorization"]["credentials"]["name"].as_str(), Some("nm-neuron-monitor-metrics-scraper"));
    let token = find(&pm, "Secret")
        .into_iter()
        .find(|s| s["type"] == "kubernetes.io/service-account-token")
        .expect("the scraper's token");
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"].as_str(),
        Some("nm-neuron-monitor-metrics-scraper")
    );
    let binding = find(&pm, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "nm-neuron-monitor-metrics-reader")
        .expect("bound");
    assert_eq!(binding["subjects"][0]["name"].as_str(), Some("nm-neuron-monitor-metrics-scraper"));

    // cert-manager: a Certificate into the same Secret (a self-signed Issuer unless one is
    // named); the monitors take the CA from the Secret.
    let cm = documents(&template(
        "neuron-monitor",
        None,
        &[&api[..], &["--set", "metricsEndpoint.tls.source=certManager"]].concat(),
    ));
    let certificate = one(&cm, "Certificate");
    assert_eq!(certificate["spec"]["secretName"].as_str(), Some("nm-neuron-monitor-metrics-tls"));
    assert!(strings(&certificate["spec"]["dnsNames"])
        .contains(&"nm-neuron-monitor-node-agent.neuron-monitor.svc".to_owned()));
    assert_eq!(one(&cm, "Issuer")["spec"]["selfSigned"], Value::Mapping(Default::default()));
    assert_eq!(secret_names(&cm), ["nm-neuron-monitor-otlp-headers"], "no chart-made certificate");
    let ca = &find(&cm, "ServiceMonitor")[0]["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"];
    assert_eq!((ca["name"].as_str(), ca["key"].as_str()), (Some("nm-neuron-monitor-metrics-tls"), Some("ca.crt")));

    // Plain HTTP (local trials): no certificate, no token checks, plain monitors.
    let plain = ["--set", "metricsEndpoint.tls.enabled=false", "--set", "metricsEndpoint.authorization.enabled=false"];
    let plain = documents(&template("neuron-monitor", None, &[&api[..], &plain].concat()));
    let args = args_of(&plain, "DaemonSet");
    assert!(
        args.contains(&"--metrics-auth=false".to_owned()) && !args.iter().any(|a| a.starts_with("--tls-")),
        "{args:?}"
    );
    assert_eq!(secret_names(&plain), ["nm-neuron-monitor-otlp-headers"], "no certificate");
    assert!(find(&plain, "ServiceMonitor")[0]["spec"]["endpoints"][0]["scheme"].is_null());

    // The NetworkPolicy: the metrics port from the Prometheus pods named, the probe port
    // from the sources given, nothing else.
    let set = [
        "--set",
        "metricsEndpoint.networkPolicy.enabled=true",
        "--set",
        "metricsEndpoint.networkPolicy.prometheusNamespace=monitoring",
        "--set",
        "metricsEndpoint.networkPolicy.prometheusPodLabels.app\\.kubernetes\\.io/name=prometheus",
        "--set",
        "metricsEndpoint.networkPolicy.probeSources[0].ipBlock.cidr=10.0.0.0/16",
    ];
    let policies = documents(&template("neuron-monitor", None, &set));
    let policies = find(&policies, "NetworkPolicy");
    assert_eq!(policies.len(), 2, "one per component");
    for (policy, (port, probe)) in policies.iter().zip([(9010, 9011), (8080, 8081)]) {
        assert_eq!(strings(&policy["spec"]["policyTypes"]), vec!["Ingress"]);
        let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
        assert_eq!(ingress.len(), 2, "{ingress:?}");
        assert_eq!(ingress[0]["ports"][0]["port"].as_i64(), Some(port));
        let from = &ingress[0]["from"][0];
        assert_eq!(
            from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].as_str(),
            Some("monitoring")
        );
        assert_eq!(from["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(), Some("prometheus"));
        assert_eq!(ingress[1]["ports"][0]["port"].as_i64(), Some(probe));
        assert_eq!(ingress[1]["from"][0]["ipBlock"]["cidr"].as_str(), Some("10.0.0.0/16"));
    }
}

/// Every object of the default and of every values file, accepted by kube-apiserver
/// (`kubectl apply --dry-run=server`): schemas, CEL rules, the Prometheus Operator's CRDs.
#[tokio::test]
async fn every_rendered_object_is_accepted_by_the_api_server() {
    let cp = ControlPlane::shared();
    install_all_crds(cp).await;
    let api = monitoring_api_flags();
    let api: Vec<&str> = api.iter().map(String::as_str).collect();
    let mut cases: Vec<Option<PathBuf>> = vec![None];
    cases.extend(values_files().into_iter().map(Some));
    let mut accepted = 0;
    let mut kinds_seen = BTreeSet::new();
    for values in &cases {
        // A release of its own: cluster-scoped names (ClusterRoles) derive from it.
        let ns = cp.namespace("nm-dry").await;
        let rendered = template_as(&ns, &ns, values.as_deref(), &api);
        let docs = documents(&rendered);
        // Objects may go to another namespace (the dashboard): it must exist.
        for other in docs.iter().filter_map(|d| d["metadata"]["namespace"].as_str()).collect::<BTreeSet<_>>() {
            if other != ns {
                let _ = kubectl(cp, &["create", "namespace", other], None);
            }
        }
        let (ok, out, err) = kubectl(cp, &["apply", "--dry-run=server", "-f", "-"], Some(&rendered));
        assert!(ok, "values {values:?}: the API server refused:\n{err}\n{out}");
        let lines = out.lines().filter(|l| l.ends_with("(server dry run)")).count();
        assert_eq!(lines, docs.len(), "values {values:?}: every object accepted:\n{out}");
        accepted += lines;
        kinds_seen.extend(docs.iter().map(|d| kind(d).to_owned()));
    }
    for k in MONITORING_KINDS.iter().chain(&[
        "DaemonSet",
        "Deployment",
        "NeuronMonitorConfig",
        "PodDisruptionBudget",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
        "ClusterRoleBinding",
        "Secret",
    ]) {
        assert!(kinds_seen.contains(*k), "no {k} was checked: {kinds_seen:?}");
    }
    println!("{accepted} objects of {} values sets accepted by the API server", cases.len());
}

#[tokio::test]
async fn wrong_values_are_refused_naming_the_field() {
    let cases: [(&[&str], &str); 19] = [
        (&["--set", "operator.replicas=two"], "/operator/replicas"),
        // Beyond what the agent's --idle-core-window takes: refused before a crash loop.
        (&["--set", "agent.idleCores.window=25h"], "/agent/idleCores/window"),
        (&["--set", "agent.idleCores.window=500ms"], "/agent/idleCores/window"),
        (&["--set", "agent.deviceAccess=root"], "/agent/deviceAccess"),
        (&["--set", "agent.neuronMonitor.source=usr"], "/agent/neuronMonitor/source"),
        (&["--set", "agent.period=5"], "/agent/period"),
        (&["--set", "agent.tolerationz[0].key=x"], "tolerationz"),
        (&["--set", "monitoring.serviceMonitor.interval=often"], "/monitoring/serviceMonitor/interval"),
        (&["--set", "operator.image.digest=latest"], "/operator/image/digest"),
        (&["--set", "tenancy.default.regions[0]=mars"], "/tenancy/default/regions/0"),
        (&["--set", "tenancy.default.monthlyCostCeilingUsd=-5"], "/tenancy/default/monthlyCostCeilingUsd"),
        (&["--set", "tenancy.default.cloudwatchNamespaces[0]=x"], "cloudwatchNamespaces"),
        // Rules between fields, said by the templates.
        (&["--set", "operator.leaderElection.enabled=false"], "operator.leaderElection.enabled"),
        (&["--set", "monitoring.podMonitor.enabled=true"], "monitoring.podMonitor.enabled"),
        (&["--set", "metricsEndpoint.tls.source=vault"], "/metricsEndpoint/tls/source"),
        (&["--set", "metricsEndpoint.tls.enabled=false"], "metricsEndpoint.authorization.enabled"),
        (
            &["--set", "metricsEndpoint.networkPolicy.prometheusNamespace="],
            "metricsEndpoint.networkPolicy.prometheusNamespace",
        ),
        (&["--set", "cloudwatchAddon.enabled=true"], "cloudwatchAddon.secretName"),
        (
            &[
                "--set",
                "cloudwatchAddon.enabled=true",
                "--set",
                "cloudwatchAddon.secretName=x",
                "--set",
                "metricsEndpoint.networkPolicy.enabled=false",
            ],
            "metricsEndpoint.networkPolicy.enabled",
        ),
    ];
    let chart = chart_dir().display().to_string();
    for (set, field) in cases {
        let mut args = vec!["template", RELEASE, &chart];
        args.extend_from_slice(set);
        let (ok, _, err) = helm(&args);
        assert!(!ok, "{set:?} was accepted");
        assert!(err.contains(field), "{set:?}: the error names {field}: {err}");
    }
    // The same check at install, on a real cluster: nothing is installed.
    let cp = ControlPlane::shared();
    let ns = cp.namespace("nm-bad").await;
    let kubeconfig = cp.kubeconfig.display().to_string();
    let (ok, _, err) = helm(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        &ns,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "agent.deviceAccess=root",
    ]);
    assert!(!ok && err.contains("/agent/deviceAccess"), "{err}");
    let (ok, out, err) = helm(&["list", "--namespace", &ns, "--kubeconfig", &kubeconfig, "--short"]);
    assert!(ok && out.trim().is_empty(), "nothing installed: {out}{err}");
}

/// The rules a ServiceAccount has in `namespace`, as `group/resource[/name]:verb`,
/// without the self-review rules every authenticated user has.
/// The rules `client` has in `namespace` beyond `baseline` (what every ServiceAccount
/// has by the API server's default roles, which change between Kubernetes versions: 1.37
/// gives every user ClusterTrustBundles to read).
async fn rules_beyond(client: Client, baseline: &BTreeSet<String>, namespace: &str) -> BTreeSet<String> {
    rules_of(client, namespace).await.difference(baseline).cloned().collect()
}

async fn rules_of(client: Client, namespace: &str) -> BTreeSet<String> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec { namespace: Some(namespace.to_owned()) },
        ..Default::default()
    };
    let review = Api::<SelfSubjectRulesReview>::all(client).create(&PostParams::default(), &review).await.unwrap();
    let status = review.status.expect("rules review status");
    assert!(!status.incomplete, "the rules review is incomplete: {:?}", status.evaluation_error);
    let mut rules = BTreeSet::new();
    for rule in status.resource_rules {
        let groups = rule.api_groups.unwrap_or_default();
        let names = rule.resource_names.filter(|n| !n.is_empty()).unwrap_or_else(|| vec![String::new()]);
        for group in &groups {
            for resource in rule.resources.iter().flatten() {
                for name in &names {
                    for verb in &rule.verbs {
                        let name = if name.is_empty() { String::new() } else { format!("/{name}") };
                        rules.insert(format!("{group}/{resource}{name}:{verb}"));
                    }
                }
            }
        }
    }
    rules
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn api_code(result: Result<impl Sized, kube::Error>) -> u16 {
    api_answer(result).0
}

/// The agent's args as the DaemonSet gives them, with the paths inside the pod moved
/// under `dir`, the simulator as neuron-monitor, and the flags of `replaced` (its ports)
/// replaced as well.
fn agent_chart_args(container: &Value, dir: &Path, mut replaced: Vec<(&'static str, String)>) -> Vec<String> {
    replaced.extend([
        ("--monitor-command", workspace_bin("neuron-monitor-sim").display().to_string()),
        ("--state-dir", dir.join("state").display().to_string()),
        ("--pod-resources-socket", dir.join("kubelet.sock").display().to_string()),
        ("--log-format", "text".into()),
        ("--sysfs-root", dir.join("sys").display().to_string()),
    ]);
    chart_args(container, &replaced)
}

fn start(binary: &str, args: Vec<String>, env: Vec<(String, String)>, cp: &ControlPlane) -> Process {
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Process::start(binary, &args, &env, cp)
}

async fn wait<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for(limit, check).await.unwrap_or_else(|| panic!("timed out after {limit:?} waiting for {what}"))
}

/// The HTTP probes a container declares, as (probe, path). Each probe's port must be the
/// one the binary serves its probes on: a named port is resolved through the container's
/// ports and must equal the port of its `--probe-listen` flag (else `--listen`), as the
/// kubelet would resolve it.
fn http_probes(container: &Value) -> Vec<(&'static str, String)> {
    let args = strings(&container["args"]);
    let port_of = |flag: &str| -> Option<u64> {
        args.iter().find_map(|a| a.strip_prefix(flag)?.strip_prefix('=')?.rsplit_once(':')?.1.parse().ok())
    };
    let listen_port = port_of("--probe-listen")
        .or_else(|| port_of("--listen"))
        .expect("the container's args set --probe-listen or --listen=<host>:<port>");
    let mut probes = Vec::new();
    for kind in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let probe = &container[kind];
        if probe.is_null() {
            continue;
        }
        let get = &probe["httpGet"];
        let port = match &get["port"] {
            Value::Number(n) => n.as_u64().unwrap(),
            Value::String(name) => container["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find(|p| p["name"].as_str() == Some(name))
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("{kind}: the container has no port named {name}")),
            other => panic!("{kind}: not an HTTP probe with a port: {other:?}"),
        };
        assert_eq!(port, listen_port, "{kind} probes port {port}; the binary listens on {listen_port}");
        probes.push((kind, get["path"].as_str().expect("an httpGet path").to_owned()));
    }
    let kinds: Vec<&str> = probes.iter().map(|(k, _)| *k).collect();
    assert!(kinds.contains(&"livenessProbe") && kinds.contains(&"readinessProbe"), "probes: {kinds:?}");
    probes
}

/// Every probe the chart declares for `container` answers 200 in plain HTTP from the
/// binary at `addr` (the binary runs as the chart runs it, its probe port moved to `addr`).
async fn assert_probes_pass(what: &str, container: &Value, addr: SocketAddr) {
    for (kind, path) in http_probes(container) {
        wait(&format!("{what}: the chart's {kind} ({path}) to answer 200"), Duration::from_secs(60), || async {
            (http_get(addr, &path)?.0 == 200).then_some(())
        })
        .await;
    }
}

/// `helm install` on the control plane; then the operator (two replicas) and an agent,
/// run from the installed manifests as the chart's ServiceAccounts, do their whole job
/// with exactly the chart's RBAC, and nothing outside it.
#[tokio::test]
async fn installed_chart_runs_the_operator_and_agent_with_exactly_its_rbac() {
    let cp = ControlPlane::shared();
    install_all_crds(cp).await;
    let admin = cp.client().await;
    let ns = cp.namespace("nm-install").await;
    let team = cp.namespace("team").await;
    let kubeconfig = cp.kubeconfig.display().to_string();
    let chart = chart_dir().display().to_string();
    let started = Instant::now();
    // The test's Prometheus ServiceAccount is bound to the chart's metrics reader role.
    let bound = [
        format!("metricsEndpoint.prometheusServiceAccounts[0].namespace={team}"),
        "metricsEndpoint.prometheusServiceAccounts[0].name=prometheus".to_owned(),
    ];
    let (ok, out, err) = helm(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        &ns,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        &bound[0],
        "--set",
        &bound[1],
    ]);
    assert!(ok, "helm install: {out}{err}");
    println!("helm install: {:?}", started.elapsed());
    assert!(out.contains("STATUS: deployed") && out.contains("neuron-monitor"), "{out}");

    // What helm installed, as installed: the monitors too (the API is served).
    let (ok, manifest, err) = helm(&["get", "manifest", RELEASE, "--namespace", &ns, "--kubeconfig", &kubeconfig]);
    assert!(ok, "{err}");
    let docs = documents(&manifest);
    for k in [
        "ServiceMonitor",
        "PrometheusRule",
        "NeuronMonitorConfig",
        "DaemonSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
    ] {
        assert!(!find(&docs, k).is_empty(), "helm installed no {k}");
    }
    let operator_sa =
        one(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap().to_owned();
    let agent_sa =
        one(&docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap().to_owned();
    let operator_container = one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0].clone();
    let agent_container = one(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0].clone();
    let default_config = one(&docs, "NeuronMonitorConfig")["metadata"]["name"].as_str().unwrap().to_owned();

    // Exactly these rules, in the release namespace and elsewhere, beyond those of a
    // ServiceAccount no binding names.
    let operator_client = cp.service_account_client(&ns, &operator_sa).await;
    let agent_client = cp.service_account_client(&ns, &agent_sa).await;
    let nobody = cp.service_account_client(&ns, "bound-to-nothing").await;
    let (baseline_here, baseline_team) = (rules_of(nobody.clone(), &ns).await, rules_of(nobody, &team).await);
    let operator_cluster = [
        "neuronmonitor.io/neuronmonitorconfigs:list",
        "neuronmonitor.io/neuronmonitorconfigs:watch",
        "neuronmonitor.io/neuronmonitorconfigs:patch",
        "neuronmonitor.io/neuronmonitorconfigs/status:patch",
        "/nodes:list",
        "/nodes:watch",
        "/namespaces:list",
        "/namespaces:watch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
        "authentication.k8s.io/tokenreviews:create",
        "authorization.k8s.io/subjectaccessreviews:create",
    ];
    let mut operator_here = set(&operator_cluster);
    operator_here.extend(set(&[
        "/configmaps:list",
        "/configmaps:watch",
        "/configmaps:create",
        "/configmaps:patch",
        "/configmaps:delete",
        "coordination.k8s.io/leases:create",
        "coordination.k8s.io/leases/neuron-operator:get",
        "coordination.k8s.io/leases/neuron-operator:update",
        "/secrets/nm-neuron-monitor-otlp-headers:patch",
    ]));
    assert_eq!(rules_beyond(operator_client.clone(), &baseline_here, &ns).await, operator_here);
    assert_eq!(rules_beyond(operator_client.clone(), &baseline_team, &team).await, set(&operator_cluster));
    let agent_cluster = [
        "/pods:list",
        "/pods:watch",
        "resource.k8s.io/resourceslices:get",
        "resource.k8s.io/resourceslices:list",
        "resource.k8s.io/resourceslices:watch",
        "/nodes/status:get",
        "/nodes/status:patch",
        "/nodes:patch",
        "resource.k8s.io/devicetaintrules:list",
        "resource.k8s.io/devicetaintrules:create",
        "resource.k8s.io/devicetaintrules:delete",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
        "authentication.k8s.io/tokenreviews:create",
        "authorization.k8s.io/subjectaccessreviews:create",
    ];
    let mut agent_here = set(&agent_cluster);
    agent_here.extend(set(&[
        "/configmaps:list",
        "/configmaps:watch",
        "/configmaps:patch",
        "/secrets/nm-neuron-monitor-otlp-headers:get",
        "/secrets/nm-neuron-monitor-otlp-headers:list",
        "/secrets/nm-neuron-monitor-otlp-headers:watch",
    ]));
    assert_eq!(rules_beyond(agent_client.clone(), &baseline_here, &ns).await, agent_here);
    assert_eq!(rules_beyond(agent_client.clone(), &baseline_team, &team).await, set(&agent_cluster));

    // A Neuron node (no kubelet runs here: a Node object is enough for both binaries).
    let node_name = neuron_node(&admin).await;
    // The agent reads its Node's instance identity (node-agent/src/identity.rs) through
    // nodes/status, the get the chart grants: the Node itself it may not get.
    let agent_nodes = Api::<Node>::all(agent_client.clone());
    let read = agent_nodes.get_status(&node_name).await.expect("the agent reads its Node through nodes/status");
    assert_eq!(
        read.metadata.labels.unwrap_or_default().get("node.kubernetes.io/instance-type").map(String::as_str),
        Some("trn1.2xlarge"),
        "the whole Node, its labels too"
    );
    assert_eq!(api_code(agent_nodes.get(&node_name).await), 403);

    // Two operator replicas, as the Deployment runs them, authenticated as its ServiceAccount.
    let dir = std::env::temp_dir().join(format!("neuron-e2e-chart-{:08x}", random_u32()));
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    let operator_kubeconfig = dir.join("operator.kubeconfig");
    let agent_kubeconfig = dir.join("agent.kubeconfig");
    cp.service_account_kubeconfig(&ns, &operator_sa, None, &operator_kubeconfig).expect("a ServiceAccount kubeconfig");
    // The agent's token is bound to its pod on the node: the chart's admission policy
    // lets it write that node's objects only.
    cp.service_account_kubeconfig(&ns, &agent_sa, Some(&node_name), &agent_kubeconfig)
        .expect("a ServiceAccount kubeconfig");
    // The metrics ports' certificate, as the chart made it and mounts it in both binaries.
    let (secret_name, _) = certificate_files(&docs, "Deployment");
    let tls = Api::<Secret>::namespaced(admin.clone(), &ns).get(&secret_name).await.expect("the chart's certificate");
    let tls = tls.data.expect("certificate data");
    let files: Vec<(&str, &[u8])> = tls.iter().map(|(k, v)| (k.as_str(), v.0.as_slice())).collect();
    let volume = https::SecretVolume::new(dir.join("tls"), &files).unwrap();
    let tls_args = |workload: &str, ports: &Ports| -> Vec<(&'static str, String)> {
        let (secret, files) = certificate_files(&docs, workload);
        assert_eq!(secret, secret_name, "{workload} mounts the same certificate");
        let mut args = vec![("--listen", ports.metrics.to_string()), ("--probe-listen", ports.probes.to_string())];
        args.extend(files.into_iter().map(|(flag, file)| (flag, volume.path(&file).display().to_string())));
        args
    };
    let operator = |pod: &str| -> (Process, Ports) {
        let ports = Ports::new();
        let args = chart_args(&operator_container, &tls_args("Deployment", &ports));
        let mut env =
            chart_env(&operator_container, &[("metadata.namespace", ns.clone()), ("metadata.name", pod.to_owned())]);
        env.push(("KUBECONFIG".into(), operator_kubeconfig.display().to_string()));
        env.push(("NEURON_OPERATOR_LOG_FORMAT".into(), "text".into()));
        (start("neuron-operator", args, env, cp), ports)
    };
    let mut replicas = vec![("nm-operator-a", operator("nm-operator-a")), ("nm-operator-b", operator("nm-operator-b"))];

    // The default config is rendered for the node, its status written, an Event published.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let cm_name = configmap_name(&node_name);
    wait("the node's ConfigMap", Duration::from_secs(60), || async {
        configmaps.get_opt(&cm_name).await.ok().flatten()?.annotations().get(CONFIG_HASH_ANNOTATION).map(drop)
    })
    .await;
    let configs: Api<api::crd::NeuronMonitorConfig> = Api::namespaced(admin.clone(), &ns);
    wait("Accepted=True on the default config", Duration::from_secs(60), || async {
        let status = configs.get(&default_config).await.ok()?.status?;
        let accepted = status.conditions.iter().any(|c| c.type_ == "Accepted" && c.status == "True");
        (accepted && status.matched_nodes == 1).then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(admin.clone(), &ns);
    wait("the operator's Event on the config", Duration::from_secs(60), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reporting_controller.as_deref() == Some("neuron-operator")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(default_config.as_str())
            })
            .then_some(())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let holder = || async {
        leases.get_opt("neuron-operator").await.ok().flatten()?.spec?.holder_identity.filter(|h| !h.is_empty())
    };
    let leader = wait("a leader", Duration::from_secs(60), holder).await;
    assert!(replicas.iter().any(|(name, _)| *name == leader), "leader {leader}");
    // Every replica, leader or standby, passes the probes the kubelet will run: without
    // that, `helm install --wait` hangs and the PodDisruptionBudget blocks node drains.
    for (name, (_, ports)) in &replicas {
        assert_probes_pass(&format!("operator {name}"), &operator_container, ports.probes).await;
    }

    // The agent, as the DaemonSet runs it: it follows and acknowledges its ConfigMap.
    // The driver's tree is the node's /sys, mounted read-only where --sysfs-root says.
    let sysfs_root = strings(&agent_container["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix("--sysfs-root=").map(str::to_owned))
        .expect("the chart gives the agent --sysfs-root");
    let sys_mount = agent_container["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"].as_str() == Some(sysfs_root.as_str()))
        .expect("a volume mounted at --sysfs-root");
    assert_eq!(sys_mount["readOnly"].as_bool(), Some(true), "the sysfs tree is mounted read-only: {sys_mount:?}");
    let agent_ports = Ports::new();
    let mut agent_args = agent_chart_args(&agent_container, &dir, tls_args("DaemonSet", &agent_ports));
    // A driver tree with one device in the invalid state: the Node condition and an
    // Event, written with the chart's rules.
    let device = dir.join("sys/devices/virtual/neuron_device/neuron0");
    std::fs::create_dir_all(&device).unwrap();
    std::fs::write(device.join("reset"), "2\n").unwrap();
    std::fs::write(dir.join("kmsg"), "").unwrap();
    agent_args.push(format!("--kmsg-path={}", dir.join("kmsg").display()));
    // No host to attribute on: an empty proc root.
    agent_args.push(format!("--proc-root={}", dir.join("proc").display()));
    let mut agent_env = chart_env(&agent_container, &[("spec.nodeName", node_name.clone())]);
    agent_env.push(("KUBECONFIG".into(), agent_kubeconfig.display().to_string()));
    let agent = start("neuron-node-agent", agent_args, agent_env, cp);
    // Other tests' releases share this API server, and their configs reach this node's
    // rendering as tenants' routes: the hash may change at any time, so the agent is
    // expected to acknowledge whichever is current, not the first one seen.
    wait("the agent's acknowledgement", Duration::from_secs(60), || acknowledged(&configmaps, &cm_name)).await;
    assert_probes_pass("agent", &agent_container, agent_ports.probes).await;
    wait("Ready with the node applied", Duration::from_secs(60), || async {
        let status = configs.get(&default_config).await.ok()?.status?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.applied_nodes == 1).then_some(())
    })
    .await;

    // The agent watches this node's pods, whatever their namespace.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "train", "namespace": team },
        "spec": { "nodeName": node_name, "containers": [{ "name": "main", "image": "trainer:1" }] }
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), &team).create(&PostParams::default(), &pod).await.unwrap();
    // /metrics over HTTPS, as the chart's ServiceMonitor scrapes it: the CA, the
    // Service's name, the token of a ServiceAccount the chart binds to its reader role.
    let server_name = |suffix: &str| {
        let monitor = find(&docs, "ServiceMonitor")
            .into_iter()
            .find(|m| m["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
            .expect("a ServiceMonitor");
        monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"].as_str().expect("a serverName").to_owned()
    };
    let ca = &tls["ca.crt"].0;
    let agent_https = https::Client::new(ca, &server_name("node-agent")).unwrap();
    let operator_https = https::Client::new(ca, &server_name("operator")).unwrap();
    let token = cp.service_account_token(&team, "prometheus", &[]).await;
    let agent_metrics = wait("the agent to see the node's pod", Duration::from_secs(60), || async {
        let answer = agent_https.get(agent_ports.metrics, "/metrics", Some(&token)).ok()?;
        (answer.status == 200 && sample(&answer.body, "neuron_agent_pods") == Some(1.0)).then_some(answer.body)
    })
    .await;
    // The attack finding "/metrics is unauthenticated and shows every namespace's pod
    // labels to anyone who can reach the port": as the chart runs it, the agent answers
    // a request without a token (or over plain HTTP) with nothing of its metrics.
    let anyone = agent_https.get(agent_ports.metrics, "/metrics", None).unwrap();
    assert_eq!(anyone.status, 401, "{}", anyone.body);
    assert!(!anyone.body.contains("neuron_") && !anyone.body.contains(&team), "{}", anyone.body);
    assert_ne!(http_get(agent_ports.metrics, "/metrics").map(|r| r.0), Some(200), "plain HTTP");
    assert_eq!(http_get(agent_ports.probes, "/metrics").map(|r| r.0), Some(404), "the probe port");
    assert!(agent_metrics.contains("neuron_agent_config{source=\"configmap\""), "runs the ConfigMap's configuration");
    assert!(sample(&agent_metrics, "neuron_agent_pod_watch_errors_total").unwrap_or(0.0) == 0.0);
    let nodes = Api::<Node>::all(admin.clone());
    let reason = wait("the NeuronHealth condition", Duration::from_secs(60), || async {
        let status = nodes.get_status(&node_name).await.ok()?.status?;
        let c = status.conditions?.into_iter().find(|c| c.type_ == "NeuronHealth")?;
        (c.status == "True").then_some(c.reason)
    })
    .await;
    assert_eq!(reason.as_deref(), Some("NeuronHasError_DEVICE_STATE_INVALID"));
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), "default");
    wait("the fault's Event", Duration::from_secs(60), || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node_name.as_str())
                    && e.reason.as_deref() == Some("NeuronHasError_DEVICE_STATE_INVALID")
            })
            .then_some(())
    })
    .await;
    // Tainting turned on in the default config: the agent taints its Node with the
    // chart's rules (patch of nodes), without a restart.
    let health = json!({ "spec": { "health": { "taint": { "enabled": true, "errors": ["DEVICE_STATE_INVALID"] } } } });
    configs.patch(&default_config, &PatchParams::default(), &Patch::Merge(health)).await.unwrap();
    let taint = wait("the agent's NoSchedule taint", Duration::from_secs(60), || async {
        let spec = nodes.get(&node_name).await.ok()?.spec?;
        spec.taints?.into_iter().find(|t| t.key == "neuronmonitor.io/hardware-error")
    })
    .await;
    assert_eq!((taint.effect.as_str(), taint.value.as_deref()), ("NoSchedule", Some("DEVICE_STATE_INVALID")));
    // The leader steps down (SIGTERM releases the lease); the other replica takes over and
    // renders the next change, which the agent applies and acknowledges.
    let index = replicas.iter().position(|(name, _)| *name == leader).unwrap();
    let (_, (mut stopped, _)) = replicas.remove(index);
    assert!(stopped.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()), "the leader exits cleanly");
    let successor = replicas[0].0;
    let takeover = Instant::now();
    wait("the standby to take the lease", Duration::from_secs(60), || async {
        holder().await.filter(|h| h == successor)
    })
    .await;
    println!("leader hand-over after SIGTERM: {:?}", takeover.elapsed());
    configs
        .patch(&default_config, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "period": "10s" } })))
        .await
        .unwrap();
    // The node-level groups come from the release namespace's configs alone: their
    // period is this change's, whatever other releases' configs add.
    wait("the new leader's rendering", Duration::from_secs(60), || async {
        let cm = configmaps.get_opt(&cm_name).await.ok().flatten()?;
        let monitor: serde_json::Value = serde_json::from_str(cm.data?.get(MONITOR_CONFIG_KEY)?).ok()?;
        let periods: Vec<_> = monitor["system_metrics"].as_array()?.iter().map(|g| g["period"].clone()).collect();
        (!periods.is_empty() && periods.iter().all(|p| p == "10s")).then_some(())
    })
    .await;
    wait("the agent's acknowledgement of the change", Duration::from_secs(60), || acknowledged(&configmaps, &cm_name))
        .await;
    let (_, operator_ports) = &replicas[0].1;
    let operator_metrics = operator_https.get(operator_ports.metrics, "/metrics", Some(&token)).unwrap();
    assert_eq!(operator_metrics.status, 200, "{}", operator_metrics.body);
    let operator_metrics = operator_metrics.body;
    assert_eq!(operator_https.get(operator_ports.metrics, "/metrics", None).unwrap().status, 401);
    assert_eq!(sample(&operator_metrics, "neuron_operator_leader"), Some(1.0));
    assert!(
        !operator_metrics.contains("neuron_operator_reconcile_errors_total{"),
        "no reconcile failed:\n{operator_metrics}"
    );

    // Outside their job: denied. The agent's token, bound to its node, cannot patch the
    // dashboard's ConfigMap in the same namespace (the admission policy; RBAC allows it).
    let dashboard = find(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("dashboard")))
        .expect("the dashboard ConfigMap");
    let bound_agent = cp.service_account_client_on_node(&ns, &agent_sa, &node_name).await;
    let mark = Patch::Merge(json!({ "metadata": { "annotations": { APPLIED_HASH_ANNOTATION: "x" } } }));
    let (code, message) = api_answer(
        Api::<ConfigMap>::namespaced(bound_agent, &ns)
            .patch(dashboard["metadata"]["name"].as_str().unwrap(), &PatchParams::default(), &mark)
            .await,
    );
    assert!(code == 403 && message.contains("may write only its own Node and ConfigMap"), "{code} {message}");
    let agent_cms: Api<ConfigMap> = Api::namespaced(agent_client.clone(), &ns);
    assert_eq!(api_code(agent_cms.delete(&cm_name, &DeleteParams::default()).await), 403, "agent deletes a ConfigMap");
    let fresh: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "agent-made" } })).unwrap();
    assert_eq!(api_code(agent_cms.create(&PostParams::default(), &fresh).await), 403, "agent creates a ConfigMap");
    assert_eq!(api_code(Api::<Secret>::namespaced(agent_client.clone(), &ns).list(&ListParams::default()).await), 403);
    assert_eq!(api_code(Api::<Node>::all(agent_client.clone()).list(&ListParams::default()).await), 403);
    assert_eq!(
        api_code(Api::<Secret>::namespaced(operator_client.clone(), &ns).list(&ListParams::default()).await),
        403
    );
    assert_eq!(
        api_code(Api::<Secret>::namespaced(operator_client.clone(), &team).list(&ListParams::default()).await),
        403
    );
    let label = Patch::Merge(json!({ "metadata": { "labels": { "owned": "yes" } } }));
    assert_eq!(
        api_code(Api::<Node>::all(operator_client.clone()).patch(&node_name, &PatchParams::default(), &label).await),
        403
    );
    let operator_configs: Api<api::crd::NeuronMonitorConfig> = Api::namespaced(operator_client.clone(), &ns);
    assert_eq!(api_code(operator_configs.delete(&default_config, &DeleteParams::default()).await), 403);
    assert_eq!(api_code(Api::<Pod>::all(operator_client.clone()).list(&ListParams::default()).await), 403);
    assert_eq!(
        api_code(
            Api::<ConfigMap>::namespaced(operator_client.clone(), &team)
                .patch("x", &PatchParams::apply("t"), &label)
                .await
        ),
        403,
        "the operator writes ConfigMaps in its namespace only"
    );

    drop(agent);
    drop(replicas);

    // Upgrade with a changed value; uninstall keeps the CRD (and so every config).
    let (ok, out, err) = helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        &ns,
        "--kubeconfig",
        &kubeconfig,
        "--reuse-values",
        "--set",
        "agent.neuronMonitor.source=hostPath",
    ]);
    assert!(ok, "helm upgrade: {out}{err}");
    let (ok, ds, err) = kubectl(cp, &["get", "daemonset", "-n", &ns, "-o", "yaml"], None);
    assert!(ok && ds.contains("path: /opt/aws/neuron"), "the upgrade reached the DaemonSet: {err}");
    let (ok, out, err) = helm(&["uninstall", RELEASE, "--namespace", &ns, "--kubeconfig", &kubeconfig]);
    assert!(ok, "helm uninstall: {out}{err}");
    let (_, roles, _) = kubectl(
        cp,
        &["get", "clusterroles", "-l", &format!("app.kubernetes.io/instance={RELEASE}"), "-o", "name"],
        None,
    );
    assert!(roles.trim().is_empty(), "cluster roles left: {roles}");
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    assert!(crds.get_opt("neuronmonitorconfigs.neuronmonitor.io").await.unwrap().is_some(), "helm keeps crds/");
    Api::<Node>::all(admin.clone()).delete(&node_name, &DeleteParams::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Some` once the agent has acknowledged the ConfigMap's current rendering.
async fn acknowledged(configmaps: &Api<ConfigMap>, name: &str) -> Option<()> {
    let cm = configmaps.get_opt(name).await.ok().flatten()?;
    let a = cm.annotations();
    (a.get(APPLIED_HASH_ANNOTATION).is_some() && a.get(APPLIED_HASH_ANNOTATION) == a.get(CONFIG_HASH_ANNOTATION))
        .then_some(())
}

/// A binary's two ports on the loopback: /metrics (HTTPS), and the probes.
struct Ports {
    metrics: SocketAddr,
    probes: SocketAddr,
}

impl Ports {
    fn new() -> Ports {
        let port = || -> SocketAddr { format!("127.0.0.1:{}", free_port()).parse().unwrap() };
        Ports { metrics: port(), probes: port() }
    }
}

/// The certificate the chart gives the container of `workload`: the Secret it mounts
/// and, for `--tls-cert-file` and `--tls-key-file`, the file of that Secret each names
/// (each flag must point into the Secret volume, as the kubelet lays it out).
fn certificate_files(docs: &[Value], workload: &str) -> (String, Vec<(&'static str, String)>) {
    let pod = &one(docs, workload)["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    let mut secret = None;
    let mut files = Vec::new();
    for flag in ["--tls-cert-file", "--tls-key-file"] {
        let path = args.iter().find_map(|a| a.strip_prefix(flag)?.strip_prefix('=')).expect("the chart sets it");
        let (dir, file) = path.rsplit_once('/').expect("a path");
        let named = |list: &Value, key: &str, value: &str| -> Value {
            list.as_sequence()
                .into_iter()
                .flatten()
                .find(|v| v[key].as_str() == Some(value))
                .cloned()
                .unwrap_or_else(|| panic!("{workload} {flag}: no {key} {value}"))
        };
        let mount = named(&container["volumeMounts"], "mountPath", dir);
        assert_eq!(mount["readOnly"].as_bool(), Some(true), "{workload}: the certificate is mounted read-only");
        let volume = named(&pod["volumes"], "name", mount["name"].as_str().unwrap());
        secret = Some(volume["secret"]["secretName"].as_str().expect("a Secret volume").to_owned());
        files.push((flag, file.to_owned()));
    }
    (secret.expect("a Secret"), files)
}

/// The OTLP headers of a config's Secret reach its endpoint with exactly the chart's
/// RBAC: the operator cannot read the Secret until a Role grants it `get` on it (the
/// config's `OtlpHeaders` condition says so, and the agent sends nothing without its
/// headers); then it mirrors them into the chart's Secret, the only one the agent reads,
/// and every request carries them. The agent can read no other Secret.
#[tokio::test]
async fn otlp_headers_reach_the_endpoint_with_exactly_the_charts_rbac() {
    const RELEASE: &str = "nmh";
    let cp = ControlPlane::shared();
    install_all_crds(cp).await;
    let admin = cp.client().await;
    let ns = cp.namespace("nm-otlp").await;
    let kubeconfig = cp.kubeconfig.display().to_string();
    let chart = chart_dir().display().to_string();
    // Plain /metrics: this test is about the headers Secret's way (the metrics endpoint's
    // HTTPS and token reviews have tests of their own).
    let plain = ["--set", "metricsEndpoint.tls.enabled=false", "--set", "metricsEndpoint.authorization.enabled=false"];
    let mut install = vec!["install", RELEASE, &chart, "--namespace", &ns, "--kubeconfig", &kubeconfig];
    install.extend(plain);
    let (ok, out, err) = helm(&install);
    assert!(ok, "helm install: {out}{err}");
    let (ok, manifest, err) = helm(&["get", "manifest", RELEASE, "--namespace", &ns, "--kubeconfig", &kubeconfig]);
    assert!(ok, "{err}");
    let docs = documents(&manifest);
    let pod_spec = |k: &str| one(&docs, k)["spec"]["template"]["spec"].clone();
    let (operator_pod, agent_pod) = (pod_spec("Deployment"), pod_spec("DaemonSet"));
    let operator_sa = operator_pod["serviceAccountName"].as_str().unwrap().to_owned();
    let agent_sa = agent_pod["serviceAccountName"].as_str().unwrap().to_owned();
    let mirror = one(&docs, "Secret")["metadata"]["name"].as_str().unwrap().to_owned();

    let node_name = neuron_node(&admin).await;
    let dir = std::env::temp_dir().join(format!("neuron-e2e-chart-otlp-{:08x}", random_u32()));
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    let (operator_kubeconfig, agent_kubeconfig) = (dir.join("operator.kubeconfig"), dir.join("agent.kubeconfig"));
    cp.service_account_kubeconfig(&ns, &operator_sa, None, &operator_kubeconfig).expect("a kubeconfig");
    cp.service_account_kubeconfig(&ns, &agent_sa, Some(&node_name), &agent_kubeconfig).expect("a kubeconfig");

    // The operator (one replica) and the agent, as the chart runs them.
    let operator_container = &operator_pod["containers"][0];
    let operator_ports = Ports::new();
    let mut env = chart_env(operator_container, &[("metadata.namespace", ns.clone()), ("metadata.name", "op".into())]);
    env.push(("KUBECONFIG".into(), operator_kubeconfig.display().to_string()));
    let operator = start(
        "neuron-operator",
        chart_args(
            operator_container,
            &[
                ("--listen", operator_ports.metrics.to_string()),
                ("--probe-listen", operator_ports.probes.to_string()),
                ("--leader-election", "false".into()),
            ],
        ),
        env,
        cp,
    );
    let agent_container = &agent_pod["containers"][0];
    let agent_ports = Ports::new();
    let ports = vec![("--listen", agent_ports.metrics.to_string()), ("--probe-listen", agent_ports.probes.to_string())];
    let mut agent_args = agent_chart_args(agent_container, &dir, ports);
    agent_args.extend([
        format!("--kmsg-path={}", dir.join("kmsg").display()),
        format!("--proc-root={}", dir.join("proc").display()),
        "--monitor-arg=--app=tag=serve,cores=0,util=60,rps=50".to_owned(),
    ]);
    let mut agent_env = chart_env(agent_container, &[("spec.nodeName", node_name.clone())]);
    agent_env.push(("KUBECONFIG".into(), agent_kubeconfig.display().to_string()));
    let agent = start("neuron-node-agent", agent_args, agent_env, cp);

    // No config names a headersSecret yet: the agent does not watch the mirror.
    let followed = |value: &'static str| {
        let port = agent_ports.metrics;
        move || async move {
            let (_, body) = http_get(port, "/metrics")?;
            body.lines().any(|l| l == format!("neuron_agent_otlp_headers_followed {value}")).then_some(())
        }
    };
    wait("the agent up, not following the headers", Duration::from_secs(60), followed("0")).await;

    // A config of the release namespace (it sees every application) sending to the test
    // receiver with the headers of its Secret.
    let receiver = neuron_e2e::otlp::Receiver::start().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "otlp-token", "namespace": ns },
        "stringData": { "Authorization": "Bearer s3cr3t", "X-Scope-OrgID": "team-a" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &secret).await.unwrap();
    let config: api::crd::NeuronMonitorConfig = serde_json::from_value(json!({
        "apiVersion": "neuronmonitor.io/v1alpha1", "kind": "NeuronMonitorConfig",
        "metadata": { "name": "otlp", "namespace": ns },
        "spec": { "period": "1s", "sinks": { "otlp": {
            "endpoint": receiver.url("/v1/metrics"), "headersSecret": { "name": "otlp-token" }, "flushInterval": "1s",
        } } },
    }))
    .unwrap();
    let configs: Api<api::crd::NeuronMonitorConfig> = Api::namespaced(admin.clone(), &ns);
    configs.create(&PostParams::default(), &config).await.unwrap();
    let headers_condition = |configs: Api<api::crd::NeuronMonitorConfig>| async move {
        let status = configs.get("otlp").await.ok()?.status?;
        status.conditions.into_iter().find(|c| c.type_ == "OtlpHeaders")
    };
    let refused = wait("OtlpHeaders=False", Duration::from_secs(60), || async {
        headers_condition(configs.clone()).await.filter(|c| c.status == "False")
    })
    .await;
    assert_eq!(refused.reason, "Forbidden", "{}", refused.message);
    wait("the agent following the headers", Duration::from_secs(60), followed("1")).await;
    // Without its headers the sink sends nothing.
    wait("the agent waiting for its headers", Duration::from_secs(60), || async {
        let (_, body) = http_get(agent_ports.metrics, "/metrics")?;
        body.contains("neuron_agent_otlp_failures_total{sink=")
            .then_some(())
            .filter(|_| body.contains("reason=\"headers\""))
    })
    .await;
    assert!(receiver.received().is_empty(), "a request without its headers");

    // The grant a team makes: get on that one Secret, to the operator's ServiceAccount.
    let grant = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: otlp-headers-reader, namespace: {ns}}}\n\
         rules: [{{apiGroups: [''], resources: [secrets], resourceNames: [otlp-token], verbs: [get]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: otlp-headers-reader, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: otlp-headers-reader}}\n\
         subjects: [{{kind: ServiceAccount, name: {operator_sa}, namespace: {ns}}}]\n"
    );
    let (ok, out, err) = kubectl(cp, &["apply", "-f", "-"], Some(&grant));
    assert!(ok, "{out}{err}");
    // The next pass reads it (within a minute; a change of the config starts one now).
    let touch = json!({ "metadata": { "annotations": { "test/touched": "1" } } });
    configs.patch("otlp", &PatchParams::default(), &Patch::Merge(touch)).await.unwrap();
    let mirrored = wait("OtlpHeaders=True", Duration::from_secs(90), || async {
        headers_condition(configs.clone()).await.filter(|c| c.status == "True")
    })
    .await;
    assert_eq!(mirrored.reason, "Mirrored", "{}", mirrored.message);
    let received = receiver
        .wait_for("a request with the headers", Duration::from_secs(60), |r| r.first().cloned())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(received.headers.get("authorization").map(String::as_str), Some("Bearer s3cr3t"));
    assert_eq!(received.headers.get("x-scope-orgid").map(String::as_str), Some("team-a"));
    assert!(!received.decode().unwrap().resource_metrics.is_empty());

    // The agent reads the mirror and no other Secret.
    let agent_secrets = Api::<Secret>::namespaced(cp.service_account_client(&ns, &agent_sa).await, &ns);
    assert_eq!(api_code(agent_secrets.get("otlp-token").await), 403);
    assert_eq!(api_code(agent_secrets.get(&mirror).await), 200);

    // The config goes: the agent stops watching the mirror.
    configs.delete("otlp", &DeleteParams::default()).await.unwrap();
    wait("the agent no longer following the headers", Duration::from_secs(60), followed("0")).await;
    drop(agent);
    drop(operator);
    Api::<Node>::all(admin.clone()).delete(&node_name, &DeleteParams::default()).await.unwrap();
    let (ok, out, err) = helm(&["uninstall", RELEASE, "--namespace", &ns, "--kubeconfig", &kubeconfig]);
    assert!(ok, "helm uninstall: {out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates a Neuron node (a trn1.2xlarge Node object) of a name of its own.
async fn neuron_node(admin: &Client) -> String {
    let name = format!("ip-10-0-{}-{}.ec2.internal", random_u32() % 250, random_u32() % 250);
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "node.kubernetes.io/instance-type": "trn1.2xlarge" } }
    }))
    .unwrap();
    Api::<Node>::all(admin.clone()).create(&PostParams::default(), &node).await.unwrap();
    name
}

/// The chart's ValidatingAdmissionPolicy on the real API server: the agent's
/// ServiceAccount, with a token bound to a pod on node A, writes node A's ConfigMap
/// annotation, condition and taint, and nothing of node B, nor any other field of its
/// own objects, nor anything without a node in its token; other users are unaffected.
#[tokio::test]
async fn the_admission_policy_holds_the_agent_to_its_own_node_and_fields() {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    let ns = cp.namespace("nm-vap").await;
    // A release of its own: the policy's name derives from it.
    let docs = documents(&template_as(&ns, &ns, None, &[]));
    let off = documents(&template_as(&ns, &ns, None, &["--set", "agent.admissionPolicy.enabled=false"]));
    assert!(
        find(&off, "ValidatingAdmissionPolicy").is_empty() && find(&off, "ValidatingAdmissionPolicyBinding").is_empty()
    );
    // The ServiceAccounts, their RBAC and the policy, as the chart renders them.
    const KINDS: [&str; 7] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let objects: Vec<String> =
        docs.iter().filter(|d| KINDS.contains(&kind(d))).map(|d| serde_norway::to_string(d).unwrap()).collect();
    assert_eq!(find(&docs, "ValidatingAdmissionPolicy").len(), 1, "on by default");
    let (ok, out, err) = kubectl(cp, &["apply", "-f", "-"], Some(&objects.join("---\n")));
    assert!(ok, "applying the chart's RBAC and policy: {out}{err}");
    let agent_sa = one(&docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
    let operator_sa = one(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();

    // Two nodes, each with its ConfigMap as the operator writes it.
    let suffix = random_u32();
    let (node_a, node_b) = (format!("vap-a-{suffix:08x}"), format!("vap-b-{suffix:08x}"));
    let nodes = Api::<Node>::all(admin.clone());
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
    for node in [&node_a, &node_b] {
        let object =
            json!({ "metadata": { "name": node, "labels": { "node.kubernetes.io/instance-type": "trn1.2xlarge" } } });
        nodes.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
        let cm = json!({
            "metadata": {
                "name": configmap_name(node),
                "annotations": { CONFIG_HASH_ANNOTATION: "h1", api::node_config::NODE_ANNOTATION: node },
            },
            "data": { "config.json": "{}" },
        });
        configmaps.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
    }
    let (cm_a, cm_b) = (configmap_name(&node_a), configmap_name(&node_b));

    let agent = cp.service_account_client_on_node(&ns, agent_sa, &node_a).await;
    let agent_nodes = Api::<Node>::all(agent.clone());
    let agent_cms = Api::<ConfigMap>::namespaced(agent.clone(), &ns);
    let params = PatchParams::default();
    let ack = |hash: &str| Patch::Merge(json!({ "metadata": { "annotations": { APPLIED_HASH_ANNOTATION: hash } } }));
    let condition = Patch::Strategic(json!({ "status": { "conditions": [{
        "type": "NeuronHealth", "status": "True", "reason": "NeuronHasError_DMA_ERROR", "message": "test",
    }] } }));
    // Taints as the agent writes them: the Node's own (the API server adds not-ready) kept.
    let with_taint = |node: &Node, key: &str| {
        let mut taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: key.to_owned(),
            value: Some("DMA_ERROR".to_owned()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        });
        Patch::Merge(json!({ "spec": { "taints": taints } }))
    };

    // The policy is in force once the API server has loaded it: B's ConfigMap refused.
    let started = Instant::now();
    let refusal = wait("the policy in force", Duration::from_secs(30), || async {
        let answer = api_answer(agent_cms.patch(&cm_b, &params, &ack("h1")).await);
        (answer.0 != 200).then_some(answer)
    })
    .await;
    println!("admission policy in force {:?} after it was applied", started.elapsed());
    assert_refused("node B's ConfigMap", refusal, &format!("node {node_a} may write only its own Node and ConfigMap"));

    // Its own objects, its own fields: allowed.
    assert_eq!(api_answer(agent_cms.patch(&cm_a, &params, &ack("h1")).await), (200, String::new()));
    assert_eq!(api_answer(agent_nodes.patch_status(&node_a, &params, &condition).await), (200, String::new()));
    let own = agent_nodes.get_status(&node_a).await.unwrap();
    let taint = with_taint(&own, "neuronmonitor.io/hardware-error");
    assert_eq!(api_answer(agent_nodes.patch(&node_a, &params, &taint).await), (200, String::new()));
    let spec = nodes.get(&node_a).await.unwrap().spec.unwrap();
    assert!(spec.taints.unwrap().iter().any(|t| t.key == "neuronmonitor.io/hardware-error"), "tainted");
    // ... and removing the taint again.
    let untaint = Patch::Merge(json!({ "spec": { "taints": own.spec.as_ref().and_then(|s| s.taints.clone()) } }));
    assert_eq!(api_answer(agent_nodes.patch(&node_a, &params, &untaint).await), (200, String::new()));

    // Node B: refused, naming what.
    let other = format!("refused: UPDATE of Node {node_b}");
    assert_refused(
        "node B's condition",
        api_answer(agent_nodes.patch_status(&node_b, &params, &condition).await),
        &other,
    );
    let b = agent_nodes.get_status(&node_b).await.unwrap();
    let taint_b = with_taint(&b, "neuronmonitor.io/hardware-error");
    assert_refused("node B's taint", api_answer(agent_nodes.patch(&node_b, &params, &taint_b).await), &other);

    // The chart's other ConfigMaps in the release namespace, which RBAC lets the agent
    // patch: the Grafana dashboard (the attack's finding) and the tenancy policy. Refused.
    for suffix in ["-dashboard", "-tenancy"] {
        let object = find(&docs, "ConfigMap")
            .into_iter()
            .find(|c| c["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
            .unwrap_or_else(|| panic!("the chart's {suffix} ConfigMap"));
        let name = object["metadata"]["name"].as_str().unwrap();
        let configmap: ConfigMap = serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap();
        configmaps.create(&PostParams::default(), &configmap).await.unwrap();
        let widened = Patch::Merge(json!({ "data": { "policy.yaml": "default: { cloudWatchNamespaces: ['*'] }" } }));
        assert_refused(
            &format!("the {suffix} ConfigMap"),
            api_answer(agent_cms.patch(name, &params, &widened).await),
            &format!("node {node_a} may write only its own Node and ConfigMap"),
        );
        assert_refused(
            &format!("the {suffix} ConfigMap's annotation"),
            api_answer(agent_cms.patch(name, &params, &ack("h1")).await),
            "may write only its own Node and ConfigMap",
        );
    }

    // Other fields of its own objects: refused.
    let data = Patch::Merge(json!({ "data": { "config.json": "{\"sinks\":[]}" } }));
    let only_ack = "may change only the annotation neuronmonitor.io/applied-hash";
    assert_refused("its ConfigMap's data", api_answer(agent_cms.patch(&cm_a, &params, &data).await), only_ack);
    let rendered_hash = Patch::Merge(json!({ "metadata": { "annotations": { CONFIG_HASH_ANNOTATION: "forged" } } }));
    assert_refused("its ConfigMap's hash", api_answer(agent_cms.patch(&cm_a, &params, &rendered_hash).await), only_ack);
    let label =
        Patch::Merge(json!({ "metadata": { "labels": { "node.kubernetes.io/instance-type": "inf2.xlarge" } } }));
    let metadata = format!("may not change the labels, annotations, owners or finalizers of Node {node_a}");
    assert_refused("its Node's label", api_answer(agent_nodes.patch(&node_a, &params, &label).await), &metadata);
    let foreign_taint = with_taint(&own, "example.com/not-the-agents");
    let only_taint = "may change only taints with the key neuronmonitor.io/hardware-error";
    assert_refused("another taint", api_answer(agent_nodes.patch(&node_a, &params, &foreign_taint).await), only_taint);
    let cordon = Patch::Merge(json!({ "spec": { "unschedulable": true } }));
    assert_refused("cordoning its Node", api_answer(agent_nodes.patch(&node_a, &params, &cordon).await), only_taint);
    let address = Patch::Merge(json!({ "status": { "addresses": [{ "type": "InternalIP", "address": "10.9.9.9" }] } }));
    assert_refused(
        "its Node's addresses",
        api_answer(agent_nodes.patch_status(&node_a, &params, &address).await),
        "may change only conditions",
    );

    // A token bound to no node: refused.
    let unbound = cp.service_account_client(&ns, agent_sa).await;
    assert_refused(
        "a token without the node",
        api_answer(Api::<ConfigMap>::namespaced(unbound.clone(), &ns).patch(&cm_a, &params, &ack("h2")).await),
        "no (single) authentication.kubernetes.io/node-name",
    );
    assert_refused(
        "a token without the node, on a Node",
        api_answer(Api::<Node>::all(unbound).patch_status(&node_a, &params, &condition).await),
        "no (single) authentication.kubernetes.io/node-name",
    );

    // Everyone else: the operator renders node B's ConfigMap; an administrator labels a
    // Node, even with a node in its user extra.
    let operator = cp.service_account_client_on_node(&ns, operator_sa, &node_a).await;
    let operator_cms = Api::<ConfigMap>::namespaced(operator, &ns);
    assert_eq!(api_answer(operator_cms.patch(&cm_b, &params, &data).await), (200, String::new()));
    assert_eq!(api_answer(nodes.patch(&node_b, &params, &label).await), (200, String::new()));
    let admin_on_a = cp.client_as_with_extra("root", &["system:masters"], &[(NODE_NAME_EXTRA, &node_a)]).await;
    assert_eq!(api_answer(Api::<Node>::all(admin_on_a).patch(&node_b, &params, &cordon).await), (200, String::new()));

    for node in [&node_a, &node_b] {
        nodes.delete(node, &DeleteParams::default()).await.unwrap();
    }
    // The cluster-scoped objects (the namespace's go with it).
    for d in docs.iter().filter(|d| KINDS[1..].contains(&kind(d)) && !kind(d).starts_with("Role")) {
        let name = d["metadata"]["name"].as_str().unwrap();
        let _ = kubectl(cp, &["delete", &kind(d).to_lowercase(), name], None);
    }
}

#[test]
fn alert_rules_pass_promtool_checks_and_unit_tests() {
    let chart = chart_dir();
    let (ok, out, err) = run({
        let mut c = Command::new(tool("promtool"));
        c.args(["check", "rules", "files/alerts.yaml"]).current_dir(&chart);
        c
    });
    assert!(ok, "promtool check rules: {out}{err}");
    let (ok, out, err) = run({
        let mut c = Command::new(tool("promtool"));
        c.args(["test", "rules", "tests/alerts_test.yaml"]).current_dir(&chart);
        c
    });
    assert!(ok, "promtool test rules: {out}{err}");

    // The rules as the chart renders them (labels added) are valid too.
    let api = monitoring_api_flags();
    let api: Vec<&str> = api.iter().map(String::as_str).collect();
    let docs = documents(&template("ns", Some(&chart.join("ci/irsa-cloudwatch-values.yaml")), &api));
    let rendered = std::env::temp_dir().join(format!("neuron-e2e-rules-{:08x}.yaml", random_u32()));
    std::fs::write(&rendered, serde_norway::to_string(&one(&docs, "PrometheusRule")["spec"]).unwrap()).unwrap();
    let (ok, out, err) = run({
        let mut c = Command::new(tool("promtool"));
        c.arg("check").arg("rules").arg(&rendered);
        c
    });
    let _ = std::fs::remove_file(&rendered);
    assert!(ok, "promtool check rules on the rendered PrometheusRule: {out}{err}");

    // Every alert has a unit test, and every metric an alert reads is one the binaries
    // export (a typo would pass a unit test written with the same typo).
    let file: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart.join("files/alerts.yaml")).unwrap()).unwrap();
    let tests = std::fs::read_to_string(chart.join("tests/alerts_test.yaml")).unwrap();
    let sources = source_text(&[repo_root().join("node-agent/src"), repo_root().join("operator/src")]);
    let mut alerts = 0;
    for rule in file["groups"].as_sequence().unwrap().iter().flat_map(|g| g["rules"].as_sequence().unwrap()) {
        let alert = rule["alert"].as_str().unwrap();
        alerts += 1;
        assert!(tests.contains(&format!("alertname: {alert}\n")), "{alert} has no unit test in tests/alerts_test.yaml");
        for metric in neuron_e2e::dashboard::metric_names(rule["expr"].as_str().unwrap()) {
            let family = metric.strip_suffix("_total").unwrap_or(&metric);
            assert!(
                metric == "up" || registered(&sources, family),
                "{alert} reads {metric}, which neither binary registers"
            );
        }
    }
    assert!(alerts >= 10, "{alerts} alerts");
}

/// The text of every .rs file under `dirs`.
/// Whether the sources register a metric family: by its full name, or by the rest of it
/// in a registry with its prefix (`sub_registry_with_prefix`).
fn registered(sources: &str, family: &str) -> bool {
    const PREFIXES: [&str; 4] = ["neuron_agent_cloudwatch", "neuron_agent_gpu", "neuron_agent", "neuron_operator"];
    sources.contains(&format!("\"{family}\""))
        || PREFIXES.iter().any(|prefix| {
            family.strip_prefix(prefix).and_then(|rest| rest.strip_prefix('_')).is_some_and(|rest| {
                sources.contains(&format!("sub_registry_with_prefix(\"{prefix}\")"))
                    && sources.contains(&format!("\"{rest}\""))
            })
        })
}

fn source_text(dirs: &[PathBuf]) -> String {
    let mut text = String::new();
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                text.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    text
}

/// A process of this test started with [`spawn_tied`], stopped with SIGTERM on drop.
struct Tied(u32);

impl Drop for Tied {
    fn drop(&mut self) {
        // SAFETY: signalling a child this test started.
        unsafe {
            libc::kill(self.0 as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", self.0)).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A standalone agent on the simulator (no Kubernetes), serving on a free port.
/// The agent on the simulator, with the simulator's fake driver tree and kernel log.
fn standalone_agent(state_dir: &Path, sim_args: &[&str]) -> (Tied, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (sys, kmsg) = (state_dir.join("sys"), state_dir.join("kmsg"));
    let mut command = Command::new(workspace_bin("neuron-node-agent"));
    command
        .arg("--monitor-command")
        .arg(workspace_bin("neuron-monitor-sim"))
        .arg(format!("--monitor-arg=--sysfs-root={}", sys.display()))
        .arg(format!("--monitor-arg=--kmsg={}", kmsg.display()))
        .arg(format!("--sysfs-root={}", sys.display()))
        .arg(format!("--kmsg-path={}", kmsg.display()))
        .arg("--health-interval=1s")
        .arg(format!("--listen={addr}"))
        .arg(format!("--state-dir={}", state_dir.display()))
        .arg("--period=1s")
        .arg("--restart-backoff-initial=200ms")
        .arg("--restart-backoff-max=1s")
        .args(sim_args.iter().map(|a| format!("--monitor-arg={a}")))
        .env("NEURON_AGENT_LOG", "warn")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let (pid, _stdout) = spawn_tied(command, libc::SIGTERM).expect("start the agent");
    (Tied(pid), addr)
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let dashboard = neuron_e2e::dashboard::load();
    // Its shape, as Grafana's sidecar loads it.
    assert!(dashboard["uid"].is_string() && dashboard["title"].is_string());
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_i64().unwrap()), "panel ids are unique");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{} uses the datasource variable", panel["title"]);
        assert!(!panel["targets"].as_array().unwrap().is_empty(), "{} has a query", panel["title"]);
    }
    // Panels' queries, and the variables' label_values(<selector>, label): each must have data.
    let queries = neuron_e2e::dashboard::queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());

    // Two simulated nodes: a trn1 with ECC events, an uncorrectable HBM error on its
    // device and two fake EFA devices carrying its application's traffic, and an inf2
    // whose neuron-monitor crashes, writes garbage and has a group in error.
    let dir = std::env::temp_dir().join(format!("neuron-e2e-dashboard-{:08x}", random_u32()));
    let trn1 = standalone_agent(
        &dir.join("a"),
        &[
            "--instance-type=trn1.2xlarge",
            "--app=tag=serve,cores=0,util=60,rps=50,errors=2",
            "--ecc-every=2",
            "--health-fault=hbm-ue:0@1s",
            "--efa-devices=2",
        ],
    );
    let faulty = standalone_agent(
        &dir.join("b"),
        &[
            "--instance-type=inf2.8xlarge",
            "--app=tag=train,cores=0-1,util=90,rps=10",
            "--group-error=neuron_runtime_vcpu_usage",
            "--garbage-every=3",
            "--exit-after=6",
        ],
    );
    let scrape = format!(
        "  - job_name: neuron-node-agent\n    static_configs:\n      - targets: ['{}']\n        labels: {{node: sim-a}}\n      - targets: ['{}']\n        labels: {{node: sim-b}}\n",
        trn1.1, faulty.1
    );
    let prometheus = Prometheus::start(&scrape).expect("prometheus");
    prometheus
        .wait_for("count(up{job=\"neuron-node-agent\"} == 1)", Duration::from_secs(60), |r| {
            (r.first().map(|s| s.1) == Some(2.0)).then_some(())
        })
        .unwrap();
    // Enough scrapes for rates, and a restart of the faulty neuron-monitor.
    prometheus
        .wait_for("neuron_agent_monitor_restarts_total", Duration::from_secs(60), |r| (!r.is_empty()).then_some(()))
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));

    let started = Instant::now();
    let mut empty = Vec::new();
    let mut elsewhere = 0;
    for (title, expr) in &queries {
        let promql = neuron_e2e::dashboard::expand(expr);
        assert!(!promql.contains('$'), "{title}: unknown variable in {expr}");
        if neuron_e2e::dashboard::needs_kubelet(&promql) {
            elsewhere += 1; // node-agent/tests/attribution.rs answers them
            continue;
        }
        let found = prometheus.wait_for(&promql, Duration::from_secs(20), |r| (!r.is_empty()).then_some(r.len()));
        match found {
            Ok(n) => println!("{n:>3} series  {title}: {promql}"),
            Err(e) => empty.push(format!("{title}: {e}")),
        }
    }
    assert!(empty.is_empty(), "queries without data:\n{}", empty.join("\n"));
    assert!(elsewhere >= 3, "{elsewhere} allocation queries");
    println!("{} dashboard queries answered in {:?} ({elsewhere} left to a kubelet)", queries.len(), started.elapsed());
    drop(prometheus);
    drop(trn1);
    drop(faulty);
    let _ = std::fs::remove_dir_all(&dir);
}
