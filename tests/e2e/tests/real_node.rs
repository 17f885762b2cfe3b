//! The product as deployed: the chart installed with `helm install --wait` on a real
//! node (tests/realnode.sh: a kubelet, containerd and runc, kube-proxy, the scheduler),
//! with the images built from this workspace's binaries, and checked as a cluster
//! operator would: every pod Ready through the kubelet's own probes, the agent's
//! container held to the security context the chart sets, /metrics over HTTPS only for
//! a ServiceAccount token with the chart's metrics-reader role, the node's ConfigMap
//! rendered by the operator and followed by the agent (with its pod's bound token,
//! through the chart's admission policy). Then the node is stopped and the machine must
//! be as it was.
//!
//! One test function per kind of node (the GPU node's in `real_node/gpu.rs`, the DRA
//! node's in `real_node/dra.rs`): one node
//! per machine (the kubelet's device-plugin socket is a fixed path; the second test waits
//! for the first's node to go), and starting a node costs about half a minute.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use api::{
    crd::NeuronMonitorConfig,
    node_config::{configmap_name, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION},
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::{ConfigMap, Container, Pod, PodSpec, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleRef, Subject},
};
use kube::{
    api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    Api, Client, ResourceExt,
};
use neuron_e2e::{
    chart::chart_dir,
    https,
    real_node::{leftovers, HostState, RealNode},
    wait_for,
};
use neuron_node_agent::attribution::podresources::{self, Unit};
use serde_json::json;

#[path = "real_node/dra.rs"]
mod dra;
#[path = "real_node/gpu.rs"]
mod gpu;

const RELEASE: &str = "neuron-monitor";
const NAMESPACE: &str = "neuron-monitor";
/// Where the test's Prometheus-like clients live.
const SCRAPERS: &str = "scrapers";
const AGENT_PORT: u16 = 9010;
const OPERATOR_PORT: u16 = 8080;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_on_a_real_node_and_stopping_the_node_restores_the_machine() {
    let started = Instant::now();
    let mut node = RealNode::up().expect("a real node");
    let t = &node.info.timings;
    eprintln!(
        "node up in {:.1}s (control plane {:.1}s, images {:.1}s, kubelet to Ready node {:.1}s)",
        t.total_s, t.controlplane_s, t.images_s, t.node_ready_s
    );
    let client = node.client().await;
    let version = client.apiserver_version().await.expect("the API server's version");
    eprintln!("Kubernetes {} (kubelet and control plane built from the same release)", version.git_version);

    let install = Instant::now();
    helm_install(&node);
    eprintln!("helm install --wait: {:.1}s", install.elapsed().as_secs_f64());

    let waited = Instant::now();
    let pods = every_pod_ready(&client).await;
    eprintln!("every pod Ready {:.1}s after helm returned", waited.elapsed().as_secs_f64());
    containers_hold_the_charts_security_context(&client, &pods).await;
    let scraper = metrics_answer_only_a_token_with_the_reader_role(&client, &pods).await;
    the_agent_follows_its_nodes_configmap(&client, &node.info.node).await;
    a_workload_pods_runtime_is_attributed_through_the_kubelet(&client, &node, &scraper, &pods).await;
    a_device_fault_reaches_the_node_condition_an_event_and_metrics(&client, &node, &scraper, &pods).await;
    the_agents_own_token_cannot_write_another_nodes_configmap(&client, &node, &pods).await;
    helm_upgrade_rolls_the_agent_without_a_gap_longer_than_a_scrape_interval(&client, &node, &scraper, &pods).await;
    the_agent_holds_its_memory_limit_on_the_worst_accepted_report(&client, &node, &scraper).await;
    uninstalling_leaves_only_what_the_chart_readme_says_it_keeps(&client, &node).await;

    down_leaving_nothing_behind(&mut node);
    eprintln!("the whole test {:.1}s", started.elapsed().as_secs_f64());
}

/// Stops the node and checks the machine is as before it: sysctls, kubelet root, no
/// process, mount, cgroup, interface or file left.
fn down_leaving_nothing_behind(node: &mut RealNode) {
    let pids = node.pids();
    let took = node.down().expect("tests/realnode.sh down");
    eprintln!("down in {:.1}s", took.as_secs_f64());
    assert_eq!(HostState::read(), node.before, "the machine's sysctls or kubelet root differ from before the node");
    let left = leftovers(&node.info, &node.dir, &pids);
    assert!(left.is_empty(), "the stopped node left behind:\n{}", left.join("\n"));
}

/// Every pod of the release Ready (its readiness probe passed, run by the kubelet), never
/// restarted (no liveness probe failed), as many as the chart asks for: one agent on the
/// node, the operator's replicas. Waited for: `helm install --wait` counts a DaemonSet
/// ready with `maxUnavailable` of its pods unready, which on one node is the agent.
async fn every_pod_ready(client: &Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let _ = wait_for(Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default()).await.ok().filter(|l| !l.items.is_empty() && l.items.iter().all(ready))
        }
    })
    .await;
    assert_all_ready(client).await
}

async fn assert_all_ready(client: &Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-operator"))
        .await
        .expect("the operator's Deployment");
    let replicas = deployment.spec.and_then(|s| s.replicas).unwrap_or(1) as usize;
    let list = pods.list(&ListParams::default()).await.expect("the release's pods").items;
    let of = |component: &str| list.iter().filter(|p| component_of(p) == component).count();
    assert_eq!((of("node-agent"), of("operator")), (1, replicas), "pods: {:?}", names(&list));
    for pod in &list {
        let status = pod.status.as_ref().expect("a pod status");
        assert!(ready(pod), "{} not Ready: {:?}", name(pod), status.conditions);
        for container in status.container_statuses.iter().flatten() {
            assert!(container.ready, "{}/{} not ready", name(pod), container.name);
            assert_eq!(container.restart_count, 0, "{}/{} restarted", name(pod), container.name);
        }
    }
    list
}

/// Each container's processes, seen from the host, run as the chart's security context
/// says: its user, no capabilities when it drops them all, no privilege escalation, a
/// read-only root file system.
async fn containers_hold_the_charts_security_context(client: &Client, pods: &[Pod]) {
    let agent = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-node-agent"))
        .await
        .expect("the agent's DaemonSet");
    let operator = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-operator"))
        .await
        .expect("the operator's Deployment");
    let templates = [
        ("node-agent", agent.spec.and_then(|s| s.template.spec).expect("the agent's pod template")),
        ("operator", operator.spec.and_then(|s| s.template.spec).expect("the operator's pod template")),
    ];
    for (component, template) in &templates {
        let pod = pods.iter().find(|p| component_of(p) == *component).expect("a pod of the component");
        for container in &template.containers {
            let processes = container_processes(pod, &container.name);
            assert!(!processes.is_empty(), "no process of {}/{} found on the host", name(pod), container.name);
            for pid in processes {
                process_holds(pid, template, container, &format!("{}/{}", name(pod), container.name));
            }
        }
    }
}

fn process_holds(pid: u32, pod: &PodSpec, container: &Container, what: &str) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let context = container.security_context.clone().unwrap_or_default();
    let user = context.run_as_user.or_else(|| pod.security_context.as_ref().and_then(|c| c.run_as_user));
    if let Some(user) = user {
        assert_eq!(field("Uid:").get(1).copied(), Some(user.to_string().as_str()), "{what} ({pid}): effective UID");
    }
    let drops_all = context.capabilities.and_then(|c| c.drop).is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if drops_all {
        assert_eq!(field("CapEff:"), ["0000000000000000"], "{what} ({pid}): capabilities");
    }
    if context.allow_privilege_escalation == Some(false) {
        assert_eq!(field("NoNewPrivs:"), ["1"], "{what} ({pid}): no_new_privs");
    }
    if context.read_only_root_filesystem == Some(true) {
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        let root = mounts.lines().map(|l| l.split(' ').collect::<Vec<_>>()).find(|f| f.get(4) == Some(&"/"));
        let options = root.and_then(|f| f.get(5).map(|o| o.to_string())).unwrap_or_default();
        assert!(options.split(',').any(|o| o == "ro"), "{what} ({pid}): root file system mounted {options}");
    }
}

/// The host PIDs of a container: those whose cgroup path ends in its container ID.
fn container_processes(pod: &Pod, container: &str) -> Vec<u32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .expect("a containerd container ID")
        .to_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cgroup.lines().any(|l| l.ends_with(&id)) {
            pids.push(pid);
        }
    }
    pids
}

/// What Prometheus would scrape with: the chart's CA and a token of a ServiceAccount the
/// metrics-reader ClusterRole is bound to.
struct Scraper {
    ca: String,
    token: String,
}

impl Scraper {
    /// `GET /metrics` of a pod of `component` on `port`, over HTTPS (the Service's name).
    fn answer(&self, pod: &Pod, component: &str, port: u16, token: Option<&str>) -> anyhow::Result<https::Answer> {
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).ok_or_else(|| anyhow::anyhow!("no pod IP"))?;
        let addr: SocketAddr = format!("{ip}:{port}").parse()?;
        let https = https::Client::new(self.ca.as_bytes(), &format!("{RELEASE}-{component}.{NAMESPACE}.svc"))?;
        https.get(addr, "/metrics", token)
    }

    fn metrics(&self, pod: &Pod, component: &str, port: u16, token: Option<&str>) -> https::Answer {
        self.answer(pod, component, port, token).expect("an answer from /metrics")
    }

    /// The page with the reader's token, when the pod answers 200 (a pod going away may
    /// not answer at all).
    fn metrics_if_served(&self, pod: &Pod, component: &str, port: u16) -> Option<String> {
        let answer = self.answer(pod, component, port, Some(&self.token)).ok()?;
        (answer.status == 200).then_some(answer.body)
    }
}

/// /metrics of the agent and of an operator replica, over HTTPS (the chart's CA, the
/// Service's name): 401 without a token, 403 with the token of a ServiceAccount the
/// metrics-reader ClusterRole is not bound to, the series with one it is bound to.
async fn metrics_answer_only_a_token_with_the_reader_role(client: &Client, pods: &[Pod]) -> Scraper {
    let ca = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-metrics-ca"))
        .await
        .expect("the metrics CA ConfigMap")
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .expect("ca.crt");
    let reader = service_account_token(client, "prometheus", Some(&format!("{RELEASE}-metrics-reader"))).await;
    let stranger = service_account_token(client, "stranger", None).await;
    let scraper = Scraper { ca, token: reader };
    for (component, port, series) in
        [("node-agent", AGENT_PORT, "neuron_agent_"), ("operator", OPERATOR_PORT, "# TYPE")]
    {
        let pod = pods.iter().find(|p| component_of(p) == component).expect("a pod of the component");
        let get = |token: Option<&str>| scraper.metrics(pod, component, port, token);
        assert_eq!(get(None).status, 401, "{component} without a token");
        assert_eq!(get(Some(&stranger)).status, 403, "{component} with a token without the role");
        let answer = get(Some(&scraper.token));
        assert_eq!(answer.status, 200, "{component} with the reader's token: {}", answer.body);
        assert!(answer.body.contains(series), "{component}'s /metrics lacks {series}:\n{}", answer.body);
    }
    scraper
}

/// A workload pod holding NeuronCores of the test device plugin runs the simulated
/// application (`neuron-monitor-sim app`, cores from NEURON_RT_VISIBLE_CORES); the
/// agent's /metrics shows its runtime on exactly the cores the kubelet's pod-resources
/// API says the container holds, with its namespace, pod and container: attribution
/// through the real kubelet and the real `/proc/<pid>/cgroup` of a real container.
async fn a_workload_pods_runtime_is_attributed_through_the_kubelet(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    pods: &[Pod],
) {
    const TEAM: &str = "team-train";
    const TAG: &str = "realnode-train";
    let started = Instant::now();
    workload_pod(client, TEAM, "trainer", &node.info.images.agent, TAG, 3).await;
    let socket = node.info.kubelet_root.join("pod-resources/kubelet.sock");
    let answer = podresources::list(&socket).await.expect("the kubelet's pod-resources answer");
    let held: BTreeSet<String> = podresources::allocations(&answer)
        .0
        .into_iter()
        .filter(|a| (a.namespace.as_str(), a.pod.as_str(), a.unit) == (TEAM, "trainer", Unit::Core))
        .map(|a| a.id.to_string())
        .collect();
    let indices: Vec<u32> = held.iter().filter_map(|c| c.parse().ok()).collect::<BTreeSet<u32>>().into_iter().collect();
    assert_eq!(indices.len(), 3, "the kubelet's allocation of 3 NeuronCores: {held:?}");
    // A contiguous run, as AWS's device plugin prefers (the runtime's cores are a range).
    assert_eq!(indices[2] - indices[0], 2, "the kubelet's allocation is not contiguous: {indices:?}");

    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod");
    let expected: BTreeSet<(String, String, String, String)> =
        held.iter().map(|core| (core.clone(), TEAM.into(), "trainer".into(), "app".into())).collect();
    let seen = wait_for(Duration::from_secs(60), || {
        let answer = scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token));
        let cores = runtime_cores(&answer.body, TAG);
        std::future::ready((cores == expected).then_some(cores))
    })
    .await;
    let last = runtime_cores(&scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body, TAG);
    assert!(seen.is_some(), "{TAG}'s cores on /metrics {last:?}, the kubelet's allocation {expected:?}");
    // Both ways agree: the process's own cgroup placed the runtime, the kubelet's
    // pod-resources answer placed its cores.
    let page = scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    for (series, value) in [
        ("neuron_agent_runtimes_attributed{source=\"process\"}", "1"),
        ("neuron_agent_device_source{source=\"kubelet\"}", "1"),
        ("neuron_agent_attribution_disagreements_total", "0"),
    ] {
        let line = page.lines().find(|l| l.starts_with(series)).unwrap_or_default();
        assert_eq!(line.split(' ').nth(1), Some(value), "{series} on the agent's page: {line:?}");
    }
    eprintln!(
        "a workload pod's runtime attributed on /metrics {:.1}s after it was created",
        started.elapsed().as_secs_f64()
    );

    // What the real kubelet says the device plugin can allocate and has allocated is what
    // the agent counts.
    let (listed, allocatable) = podresources::list_and_allocatable(&socket).await.expect("pod-resources");
    let allocatable = allocatable.expect("the kubelet serves GetAllocatableResources");
    let per_device = node.cores_per_device();
    let cores = |units: Vec<(Unit, u32)>| -> BTreeSet<u32> {
        units.into_iter().flat_map(|(unit, id)| unit.cores(id, Some(per_device))).collect()
    };
    let can = cores(podresources::allocatable(&allocatable)).len() as f64;
    let did = cores(podresources::allocations(&listed).0.into_iter().map(|a| (a.unit, a.id)).collect()).len() as f64;
    assert!(can >= 32.0 && did >= 3.0, "the kubelet's allocatable {can} and allocated {did} cores");
    let counted = wait_for(Duration::from_secs(30), || {
        let counts = allocation_counts(&scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body);
        std::future::ready(
            (counts.get("allocatable") == Some(&can) && counts.get("allocated") == Some(&did)).then_some(()),
        )
    })
    .await;
    let last = allocation_counts(&scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body);
    assert!(counted.is_some(), "neuron_node_neuroncores {last:?}; the kubelet: {can} allocatable, {did} allocated");
}

/// `state` → value of `neuron_node_neuroncores` on an agent's page.
fn allocation_counts(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter_map(|line| line.strip_prefix("neuron_node_neuroncores{"))
        .filter_map(|rest| rest.split_once("} "))
        .filter_map(|(labels, value)| Some((labels_of(labels).get("state")?.clone(), value.trim().parse().ok()?)))
        .collect()
}

/// Creates pod `namespace/name` (its namespace too) holding `cores` NeuronCores and
/// running the simulated application tagged `tag` in container `app`; waits until it runs.
async fn workload_pod(client: &Client, namespace: &str, name: &str, image: &str, tag: &str, cores: u32) -> Pod {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({ "metadata": { "name": namespace } })).expect("a Namespace");
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["neuron-monitor-sim", "app", "--tag", tag, "--util", "70"],
                "resources": { "limits": { "aws.amazon.com/neuroncore": cores.to_string() } },
                "securityContext": { "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                     "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] } },
            }],
        },
    }))
    .expect("a Pod");
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &pod).await.expect("creating the workload pod");
    let running = wait_for(Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let pod = api.get(name).await.ok()?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            (phase.as_deref() == Some("Running")).then_some(pod)
        }
    })
    .await;
    let last = api.get(name).await.ok().and_then(|p| p.status);
    running.unwrap_or_else(|| panic!("workload pod {namespace}/{name} never ran: {last:?}"))
}

/// The `neuroncore_utilization_ratio` series of runtime `tag` on a /metrics page, as
/// (neuroncore, namespace, pod, container).
fn runtime_cores(page: &str, tag: &str) -> BTreeSet<(String, String, String, String)> {
    page.lines()
        .filter_map(|line| line.strip_prefix("neuroncore_utilization_ratio{"))
        .filter_map(|rest| rest.split_once('}').map(|(labels, _)| labels_of(labels)))
        .filter(|labels| labels.get("runtime_tag").map(String::as_str) == Some(tag))
        .map(|l| {
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            (get("neuroncore"), get("namespace"), get("pod"), get("container"))
        })
        .collect()
}

/// `key="value",...` of an exposition line (values with `\"` and `\\` escapes).
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| if c == 'n' { '\n' } else { c })),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = &after[end..];
    }
    labels
}

/// A bound token (TokenRequest) of ServiceAccount SCRAPERS/name, bound to `role` when given.
async fn service_account_token(client: &Client, name: &str, role: Option<&str>) -> String {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = k8s_openapi::api::core::v1::Namespace {
        metadata: ObjectMeta { name: Some(SCRAPERS.to_owned()), ..Default::default() },
        ..Default::default()
    };
    let _ = namespaces.create(&PostParams::default(), &namespace).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), SCRAPERS);
    let account = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        ..Default::default()
    };
    accounts.create(&PostParams::default(), &account).await.expect("a ServiceAccount");
    if let Some(role) = role {
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(format!("{SCRAPERS}-{name}")), ..Default::default() },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some(SCRAPERS.into()),
                ..Default::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("the ClusterRoleBinding");
    }
    let request = k8s_openapi::api::authentication::v1::TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued = accounts.create_token_request(name, &PostParams::default(), &request).await.expect("a TokenRequest");
    issued.status.expect("the TokenRequest's status").token
}

/// The operator renders the node's ConfigMap and the agent acknowledges it (its pod's
/// token, bound to the node, is what the chart's admission policy lets write there);
/// after a change of the default config, the agent follows the new version too.
async fn the_agent_follows_its_nodes_configmap(client: &Client, node: &str) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let name = configmap_name(node);
    let applied = |configmaps: Api<ConfigMap>, name: String| async move {
        let cm = configmaps.get_opt(&name).await.ok().flatten()?;
        let annotations = cm.metadata.annotations?;
        let hash = annotations.get(CONFIG_HASH_ANNOTATION)?;
        (annotations.get(APPLIED_HASH_ANNOTATION) == Some(hash)).then(|| hash.clone())
    };
    let first = wait_for(Duration::from_secs(60), || applied(configmaps.clone(), name.clone()))
        .await
        .unwrap_or_else(|| panic!("the agent never applied its ConfigMap {name}"));

    Api::<NeuronMonitorConfig>::namespaced(client.clone(), NAMESPACE)
        .patch("default", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "period": "7s" } })))
        .await
        .expect("changing the default config's period");
    let changed = wait_for(Duration::from_secs(60), || {
        let configmaps = configmaps.clone();
        let name = name.clone();
        let first = first.clone();
        async move { applied(configmaps, name).await.filter(|h| *h != first) }
    })
    .await;
    assert!(changed.is_some(), "the agent never applied the changed config (first version {first})");
}

/// An uncorrectable HBM error injected into the node's simulated driver, on the device
/// the workload pod holds, reaches, from inside the agent's container (the driver's tree
/// through the chart's sysfs mount): the device's health on /metrics, the Node's
/// `NeuronHealth` condition, and an Event on the Node naming the pod.
async fn a_device_fault_reaches_the_node_condition_an_event_and_metrics(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    pods: &[Pod],
) {
    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod");
    let page = || scraper.metrics(agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;
    let held = wait_for(Duration::from_secs(60), || {
        let device = health_series(&page()).into_iter().find(|(_, state, pods, v)| {
            state == "healthy" && pods.split(',').any(|p| p == "team-train/trainer") && *v == 1.0
        });
        std::future::ready(device.map(|(device, ..)| device))
    })
    .await;
    let device = held
        .unwrap_or_else(|| panic!("no healthy device held by the workload on /metrics:\n{:?}", health_series(&page())));

    let injected = Instant::now();
    let mut control =
        std::fs::OpenOptions::new().append(true).open(&node.info.health_control).expect("the control file");
    std::io::Write::write_all(&mut control, format!("hbm-ue:{device}\n").as_bytes()).expect("injecting the fault");
    let unhealthy = wait_for(Duration::from_secs(30), || {
        let series = health_series(&page());
        std::future::ready(
            series.iter().any(|(d, state, _, v)| *d == device && state == "unhealthy" && *v == 1.0).then_some(()),
        )
    })
    .await;
    assert!(unhealthy.is_some(), "device {device} never unhealthy on /metrics: {:?}", health_series(&page()));
    // The driver's record reaches the agent too: its kernel log is the simulated one.
    let kmsg = page().lines().any(|l| l == "neuron_agent_health_source_up{source=\"kmsg\"} 1");
    assert!(kmsg, "the agent does not read the node's kernel log (--kmsg-path /host/sys/kmsg)");
    eprintln!("an injected fault on /metrics {:.1}s later", injected.elapsed().as_secs_f64());

    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let condition = wait_for(Duration::from_secs(30), || {
        let nodes = nodes.clone();
        let name = node.info.node.clone();
        async move {
            let status = nodes.get_status(&name).await.ok()?.status?;
            status.conditions?.into_iter().find(|c| c.type_ == "NeuronHealth" && c.status == "True")
        }
    })
    .await
    .expect("the Node's NeuronHealth condition True");
    assert_eq!(condition.reason.as_deref(), Some("NeuronHasError_HBM_UNCORRECTABLE_ERROR"), "{condition:?}");

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let event = wait_for(Duration::from_secs(30), || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            list.into_iter().find(|e| e.reason.as_deref() == Some("NeuronHasError_HBM_UNCORRECTABLE_ERROR"))
        }
    })
    .await
    .expect("an Event of the fault");
    let note = event.note.clone().unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{event:?}");
    assert!(note.contains("team-train/trainer"), "the Event names no pod holding the device: {note}");
    eprintln!("the Node condition and the Event {:.1}s after the fault", injected.elapsed().as_secs_f64());
}

/// `neuron_device_health_state` series of a /metrics page as (device, state, pods, value).
fn health_series(page: &str) -> Vec<(String, String, String, f64)> {
    page.lines()
        .filter_map(|line| line.strip_prefix("neuron_device_health_state{"))
        .filter_map(|rest| rest.split_once("} "))
        .map(|(labels, value)| {
            let l = labels_of(labels);
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            (get("neuron_device_index"), get("state"), get("pods"), value.trim().parse().unwrap_or(f64::NAN))
        })
        .collect()
}

/// `helm upgrade` with a changed value replaces the agent's pod; scraped every second
/// meanwhile (whichever agent pod answers), the workload's series are never missing for
/// longer than the chart's scrape interval, so Prometheus misses at most one scrape.
async fn helm_upgrade_rolls_the_agent_without_a_gap_longer_than_a_scrape_interval(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
    pods: &[Pod],
) {
    const SCRAPE_INTERVAL: Duration = Duration::from_secs(30);
    let before = pods.iter().find(|p| component_of(p) == "node-agent").and_then(|p| p.metadata.uid.clone());
    let args = helm_upgrade(node, &["--set", "agent.logLevel=debug"]);
    let upgrade = tokio::task::spawn_blocking(move || {
        neuron_e2e::chart::helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
    });
    let agents: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let agent_pods = ListParams::default().labels("app.kubernetes.io/component=node-agent");
    let started = Instant::now();
    let (mut last_seen, mut longest, mut served_by_new) = (Instant::now(), Duration::ZERO, false);
    while started.elapsed() < Duration::from_secs(180) && !(upgrade.is_finished() && served_by_new) {
        let listed = agents.list(&agent_pods).await.map(|l| l.items).unwrap_or_default();
        for pod in listed.iter().filter(|p| p.status.as_ref().is_some_and(|s| s.pod_ip.is_some())) {
            let answer = scraper.metrics_if_served(pod, "node-agent", AGENT_PORT);
            if answer.is_some_and(|page| !runtime_cores(&page, "realnode-train").is_empty()) {
                longest = longest.max(last_seen.elapsed());
                last_seen = Instant::now();
                served_by_new |= pod.metadata.uid != before;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    longest = longest.max(last_seen.elapsed());
    let (ok, stdout, stderr) = upgrade.await.expect("helm upgrade's task");
    assert!(ok, "helm upgrade failed:\n{stdout}\n{stderr}");
    assert!(served_by_new, "no new agent pod served the workload's series after helm upgrade");
    eprintln!("helm upgrade: the longest gap of the workload's series {:.1}s", longest.as_secs_f64());
    assert!(longest <= SCRAPE_INTERVAL, "the workload's series were missing for {longest:?} during helm upgrade");
}

/// The agent, fed every second the densest report it accepts (just under its 8 MiB line
/// limit: 1,024 runtimes with 255-byte tags, each claiming 190 busy cores), applies it
/// in its container without reaching the chart's memory limit: the container's cgroup
/// peak stays below it and the container is never OOM-killed or restarted.
async fn the_agent_holds_its_memory_limit_on_the_worst_accepted_report(
    client: &Client,
    node: &RealNode,
    scraper: &Scraper,
) {
    // Where the agent's container sees it: the chart mounts the node's sysfs (here the
    // simulated driver's tree) at /host/sys.
    let report = densest_report();
    assert!(report.len() < 8 << 20, "the report must be accepted: {} bytes", report.len());
    let sysfs = node.info.health_control.parent().expect("the node's directory").join("node-sys");
    std::fs::write(sysfs.join("worst-report.ndjson"), format!("{report}\n")).expect("writing the report");
    let values = node.dir.join("worst-report-values.yaml");
    let replay = "agent:\n  extraEnv:\n    - name: NEURON_SIM_REPLAY\n      value: /host/sys/worst-report.ndjson\n";
    std::fs::write(&values, replay).expect("the values of the worst report");
    let args = helm_upgrade(node, &["--values", &values.display().to_string()]);
    let (ok, stdout, stderr) = neuron_e2e::chart::helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "helm upgrade to the worst report failed:\n{stdout}\n{stderr}");

    let agents: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let agent_pods = ListParams::default().labels("app.kubernetes.io/component=node-agent");
    let refused = |page: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix("neuron_agent_report_values_refused_total{what=\"neuroncore_entry\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // 20 reports applied (each refuses 190,464 per-core values beyond the budget).
    let applied = wait_for(Duration::from_secs(120), || {
        let agents = agents.clone();
        let agent_pods = agent_pods.clone();
        async move {
            let pod = agents.list(&agent_pods).await.ok()?.items.into_iter().find(ready)?;
            let page = scraper.metrics_if_served(&pod, "node-agent", AGENT_PORT)?;
            (refused(&page) >= 20.0 * 190_464.0).then_some(pod)
        }
    })
    .await
    .expect("the agent applying 20 of the worst reports");
    let pod = agents.get(&applied.name_any()).await.expect("the agent's pod");
    let status = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first().cloned());
    let status = status.expect("the agent container's status");
    assert_eq!(status.restart_count, 0, "the agent's container restarted: {:?}", status.last_state);
    let (peak, limit) = container_memory(&pod, &status.name);
    eprintln!(
        "the worst accepted report ({:.1} MB): the agent's container peaked at {:.1} MiB of its {:.0} MiB limit",
        report.len() as f64 / 1e6,
        peak as f64 / 1048576.0,
        limit as f64 / 1048576.0
    );
    assert!(peak < limit, "the agent's container reached its memory limit: {peak} of {limit} bytes");
}

/// The arguments of a `helm upgrade --wait` of the release on the node, with its values
/// file and then `extra`.
/// `helm install --wait` of the chart with the node's values; fails the test with the
/// node's diagnostics.
fn helm_install(node: &RealNode) {
    helm_install_with(node, &[]);
}

/// `helm install` with the node's values and `extra` arguments (`--set …`).
fn helm_install_with(node: &RealNode, extra: &[&str]) {
    let chart = chart_dir().display().to_string();
    let values = node.info.values.display().to_string();
    let mut args = vec![
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--values",
        &values,
        "--wait",
        "--timeout",
        "180s",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = node.helm(&args);
    assert!(ok, "helm install --wait failed:\n{stdout}\n{stderr}\n{}", node.diagnostics());
}

fn helm_upgrade(node: &RealNode, extra: &[&str]) -> Vec<String> {
    let (chart, values, kubeconfig) =
        (chart_dir(), node.info.values.display().to_string(), node.info.kubeconfig.display().to_string());
    let mut args: Vec<String> = ["upgrade", RELEASE, &chart.display().to_string(), "--namespace", NAMESPACE]
        .into_iter()
        .map(str::to_owned)
        .collect();
    args.extend(["--values".into(), values]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend(["--wait", "--timeout", "180s", "--kubeconfig", &kubeconfig].map(str::to_owned));
    args
}

/// The densest report the agent accepts (hostile_inputs.sh's `cores` case).
fn densest_report() -> String {
    let mut doc: serde_json::Value =
        serde_json::from_str(&neuron_test_support::fixture("neuron-monitor/trn1n.32xlarge-32runtimes.json"))
            .expect("the 32-runtime fixture");
    doc["neuron_hardware_info"]["neuron_device_count"] = json!(32);
    doc["neuron_hardware_info"]["neuroncore_per_device_count"] = json!(16);
    let runtimes: Vec<serde_json::Value> = (0..1024u32)
        .map(|i| {
            let cores: serde_json::Map<String, serde_json::Value> = (0..190u32)
                .map(|c| (((i * 7 + c) % 512).to_string(), json!({ "neuroncore_utilization": 12.5 })))
                .collect();
            json!({ "pid": 10_000 + i, "neuron_runtime_tag": format!("t{i:04}-{}", "x".repeat(249)), "error": "",
                    "report": { "neuroncore_counters": { "period": 1.0, "error": "", "neuroncores_in_use": cores } } })
        })
        .collect();
    doc["neuron_runtime_data"] = json!(runtimes);
    doc.to_string()
}

/// A container's peak memory and limit, from its memory cgroup (v1 or v2) on the host.
fn container_memory(pod: &Pod, container: &str) -> (u64, u64) {
    let pid = container_processes(pod, container).into_iter().next().expect("a process of the container");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the process's cgroups");
    let read = |path: std::path::PathBuf| -> u64 {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.trim().parse().unwrap_or_else(|_| panic!("{}: {text:?}", path.display()))
    };
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next(), fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "memory") {
            let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return (read(dir.join("memory.max_usage_in_bytes")), read(dir.join("memory.limit_in_bytes")));
        }
        if controllers.is_empty() {
            let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            return (read(dir.join("memory.peak")), read(dir.join("memory.max")));
        }
    }
    panic!("no memory cgroup in {cgroups}");
}

/// The agent's pod token (bound to its pod and node, read where the kubelet mounted it)
/// writes its own node's ConfigMap, and the chart's admission policy refuses it another
/// node's: what holds a compromised agent to its node.
async fn the_agents_own_token_cannot_write_another_nodes_configmap(client: &Client, node: &RealNode, pods: &[Pod]) {
    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod");
    let uid = agent.metadata.uid.as_deref().expect("the agent pod's UID");
    let volumes = node.info.kubelet_root.join(format!("pods/{uid}/volumes/kubernetes.io~projected"));
    let token = std::fs::read_dir(&volumes)
        .expect("the agent pod's projected volumes")
        .flatten()
        .find_map(|v| std::fs::read_to_string(v.path().join("token")).ok())
        .expect("the agent pod's ServiceAccount token");
    let as_agent = node.client_with_token(token.trim()).await;

    let admin: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let other = configmap_name("another-node");
    let configmap =
        ConfigMap { metadata: ObjectMeta { name: Some(other.clone()), ..Default::default() }, ..Default::default() };
    admin.create(&PostParams::default(), &configmap).await.expect("another node's ConfigMap, as admin");
    let agents: Api<ConfigMap> = Api::namespaced(as_agent, NAMESPACE);
    let acknowledge =
        |hash: &str| Patch::Merge(json!({ "metadata": { "annotations": { APPLIED_HASH_ANNOTATION: hash } } }));

    let own = configmap_name(&node.info.node);
    let current = admin.get(&own).await.expect("the node's ConfigMap").metadata.annotations.unwrap_or_default();
    let hash = current.get(APPLIED_HASH_ANNOTATION).cloned().unwrap_or_default();
    agents
        .patch(&own, &PatchParams::default(), &acknowledge(&hash))
        .await
        .expect("the agent acknowledging its own ConfigMap");
    match agents.patch(&other, &PatchParams::default(), &acknowledge("forged")).await {
        Err(kube::Error::Api(refusal)) => {
            assert_eq!(refusal.code, 403, "{refusal:?}");
            assert!(refusal.message.contains("neuron-monitor:"), "refused, but not by the chart's policy: {refusal:?}");
        }
        other => panic!("the agent's token wrote another node's ConfigMap: {other:?}"),
    }
    admin.delete(&other, &Default::default()).await.expect("removing the other node's ConfigMap");
}

/// `helm uninstall --wait` leaves, of every kind the API server serves, only what the
/// chart's README says it keeps: the CRD, the node ConfigMaps, the operator's Lease (the
/// operator makes it, Helm does not own it). Nothing else labelled with
/// the release anywhere, nothing else in the release's namespace but what Kubernetes puts
/// in every namespace.
async fn uninstalling_leaves_only_what_the_chart_readme_says_it_keeps(client: &Client, node: &RealNode) {
    let (ok, stdout, stderr) =
        node.helm(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s"]);
    assert!(ok, "helm uninstall failed:\n{stdout}\n{stderr}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let gone = wait_for(Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { pods.list(&ListParams::default()).await.ok().filter(|l| l.items.is_empty()) }
    })
    .await;
    assert!(gone.is_some(), "the release's pods outlived helm uninstall");

    let discovery = kube::Discovery::new(client.clone()).run().await.expect("the API server's discovery");
    let release = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let mut left = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(kube::discovery::verbs::LIST) || resource.plural == "events" {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            for object in api.list(&release).await.map(|l| l.items).unwrap_or_default() {
                left.push(format!("{} {}", resource.kind, object.name_any()));
            }
            if caps.scope == kube::discovery::Scope::Namespaced {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
                for object in api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
                    if !kept_in_the_namespace(&resource.kind, &object) {
                        left.push(format!("{} {NAMESPACE}/{}", resource.kind, object.name_any()));
                    }
                }
            }
        }
    }
    left.sort();
    left.dedup();
    assert!(left.is_empty(), "helm uninstall left behind: {left:#?}");
}

/// What the release's namespace may hold after an uninstall: the node ConfigMaps and the
/// leader-election Lease (the chart README's list), and what Kubernetes gives every
/// namespace.
fn kept_in_the_namespace(kind: &str, object: &DynamicObject) -> bool {
    let labels = object.metadata.labels.clone().unwrap_or_default();
    match (kind, object.name_any().as_str()) {
        ("ConfigMap", _) if labels.get("neuronmonitor.io/node-config").map(String::as_str) == Some("true") => true,
        ("ConfigMap", "kube-root-ca.crt") | ("ServiceAccount", "default") | ("Lease", "neuron-operator") => true,
        _ => false,
    }
}

fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn component_of(pod: &Pod) -> &str {
    pod.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/component")).map_or("", String::as_str)
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

fn names(pods: &[Pod]) -> Vec<&str> {
    pods.iter().map(name).collect()
}
