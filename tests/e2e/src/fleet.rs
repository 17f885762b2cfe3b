//! The fleet harness: many fake Neuron nodes on the real control plane, the operator
//! binary with the chart's RBAC as its ServiceAccount, and what a roll-out costs, as
//! `tests/e2e/benches/fleet.rs` and `tests/e2e/tests/fleet.rs` measure it:
//!
//! - [`Fleet`]: an operator namespace, the chart's ServiceAccounts and RBAC in it, N Nodes
//!   labelled for this fleet alone, and NeuronMonitorConfigs applied to them.
//! - [`Observer`]: a metadata watch of the node ConfigMaps that stamps when each node's
//!   ConfigMap first carries a content hash and when its agent acknowledged it.
//! - [`ApiRequests`], [`ProcStats`], [`OperatorMetrics`]: the API server's request
//!   counters, a process's CPU and memory, the operator's own counters.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::PartialObjectMeta,
    runtime::{watcher, WatchStreamExt},
    Api, Client, ResourceExt,
};
use serde_json::json;

use crate::{free_port, http_get, kubectl, random_u32, repo_root, tool, wait_for, ControlPlane, Process};

/// The node ConfigMaps' label, content hash, acknowledged hash and node (as in
/// `api::node_config`, which this support crate does not depend on; the tests using
/// these constants check them against the api crate).
pub const MANAGED_LABEL: &str = "neuronmonitor.io/node-config";
pub const CONFIG_HASH_ANNOTATION: &str = "neuronmonitor.io/config-hash";
pub const APPLIED_HASH_ANNOTATION: &str = "neuronmonitor.io/applied-hash";
pub const NODE_ANNOTATION: &str = "neuronmonitor.io/node";

/// The chart's ServiceAccounts and RBAC, and the OTLP headers mirror they name, as
/// `helm template` renders them.
const RBAC_TEMPLATES: [&str; 5] = [
    "templates/operator-serviceaccount.yaml",
    "templates/operator-rbac.yaml",
    "templates/agent-serviceaccount.yaml",
    "templates/agent-rbac.yaml",
    "templates/otlp-headers-secret.yaml",
];
/// Requests in flight when the harness creates or deletes nodes.
const SETUP_CONCURRENCY: usize = 16;

/// A fleet of fake Neuron nodes and the operator's namespace, with the chart's RBAC.
pub struct Fleet {
    pub cp: &'static ControlPlane,
    pub admin: Client,
    /// The operator's namespace (node ConfigMaps, Lease, cluster-wide configs).
    pub namespace: String,
    /// Value of the `e2e-fleet` label on this fleet's nodes.
    pub run: String,
    pub nodes: Vec<String>,
    /// Kubeconfigs and agents' state directories.
    pub dir: PathBuf,
    /// The release name of the chart's objects: cluster-wide ones (ClusterRoles and their
    /// bindings) are this fleet's own.
    release: String,
    operator_kubeconfig: PathBuf,
}

impl Fleet {
    /// A namespace with the chart's ServiceAccounts and RBAC, and `nodes` Neuron nodes
    /// (trn1.32xlarge) labelled `e2e-fleet=<run>`, created `SETUP_CONCURRENCY` at a time.
    pub async fn new(prefix: &str, nodes: usize) -> anyhow::Result<Fleet> {
        let cp = ControlPlane::shared();
        cp.install_crds().await;
        let namespace = cp.namespace(prefix).await;
        let run = format!("{prefix}-{:08x}", random_u32());
        let release = format!("f{:08x}", random_u32());
        let rbac = chart_objects(&release, &namespace, &RBAC_TEMPLATES)?;
        let (ok, out, err) = kubectl(cp, &["apply", "--server-side", "-f", "-"], Some(&rbac));
        if !ok {
            bail!("applying the chart's RBAC: {out}{err}");
        }
        let dir = std::env::temp_dir().join(format!("neuron-fleet-{run}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let operator_kubeconfig = dir.join("operator.kubeconfig");
        let operator_account = format!("{release}-neuron-monitor-operator");
        cp.service_account_kubeconfig(&namespace, &operator_account, None, &operator_kubeconfig)?;
        let fleet = Fleet {
            cp,
            admin: cp.client().await,
            namespace,
            nodes: (0..nodes).map(|i| format!("{run}-{i:05}")).collect(),
            run,
            dir,
            release,
            operator_kubeconfig,
        };
        fleet.create_nodes(&fleet.nodes).await?;
        Ok(fleet)
    }

    /// The agent's ServiceAccount (the chart's), in the operator's namespace.
    pub fn agent_service_account(&self) -> String {
        format!("{}-neuron-monitor-node-agent", self.release)
    }

    /// The chart's OTLP headers mirror, which both binaries are named.
    pub fn otlp_headers_secret(&self) -> String {
        format!("{}-neuron-monitor-otlp-headers", self.release)
    }

    /// Creates these Neuron nodes (trn1.32xlarge, labelled for this fleet).
    pub async fn create_nodes(&self, names: &[String]) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(self.admin.clone());
        futures::stream::iter(names)
            .map(|name| {
                let api = api.clone();
                let node: Node = serde_json::from_value(json!({
                    "metadata": { "name": name, "labels": {
                        "node.kubernetes.io/instance-type": "trn1.32xlarge",
                        "e2e-fleet": self.run,
                    } }
                }))
                .expect("a Node");
                async move { api.create(&PostParams::default(), &node).await.with_context(|| format!("creating {name}")) }
            })
            .buffer_unordered(SETUP_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    /// Deletes these nodes (their ConfigMaps go with them: owner references).
    pub async fn delete_nodes(&self, names: &[String]) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(self.admin.clone());
        futures::stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move {
                    match api.delete(name, &DeleteParams::default()).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                        Err(e) => Err(e).with_context(|| format!("deleting {name}")),
                    }
                }
            })
            .buffer_unordered(SETUP_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    /// Applies (server-side, as `kubectl apply --server-side` would) a NeuronMonitorConfig
    /// of the operator's namespace selecting this fleet's nodes; `spec` adds to the
    /// selector. Returns when the API server has stored it.
    pub async fn apply_config(&self, name: &str, spec: serde_json::Value) -> anyhow::Result<()> {
        let mut spec = spec;
        spec["nodeSelector"] = json!({ "matchLabels": { "e2e-fleet": self.run } });
        let config = json!({
            "apiVersion": "neuronmonitor.io/v1alpha1",
            "kind": "NeuronMonitorConfig",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": spec,
        });
        self.configs()
            .patch(name, &PatchParams::apply("fleet-harness").force(), &Patch::Apply(&config))
            .await
            .with_context(|| format!("applying the config {name}"))?;
        Ok(())
    }

    /// The NeuronMonitorConfigs of the operator's namespace (untyped: this crate does not
    /// depend on the api crate).
    pub fn configs(&self) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: "neuronmonitor.io".into(),
            version: "v1alpha1".into(),
            api_version: "neuronmonitor.io/v1alpha1".into(),
            kind: "NeuronMonitorConfig".into(),
            plural: "neuronmonitorconfigs".into(),
        };
        Api::namespaced_with(self.admin.clone(), &self.namespace, &resource)
    }

    /// Starts an operator replica with this identity (`POD_NAME`), as the chart's
    /// Deployment runs it: its ServiceAccount, leader election on, the chart's flags'
    /// defaults. `extra` adds flags.
    pub fn operator(&self, identity: &str, extra: &[&str]) -> Operator {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("an address");
        let mut args = vec![
            "--namespace".to_owned(),
            self.namespace.clone(),
            "--listen".to_owned(),
            addr.to_string(),
            format!("--otlp-headers-secret={}", self.otlp_headers_secret()),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let env = [
            ("KUBECONFIG", self.operator_kubeconfig.display().to_string()),
            ("POD_NAME", identity.to_owned()),
            ("NEURON_OPERATOR_LOG", "warn".to_owned()),
        ];
        Operator { process: Process::start("neuron-operator", &args, &env, self.cp), addr }
    }

    /// Node ConfigMaps left in the namespace.
    pub async fn configmaps_left(&self) -> anyhow::Result<usize> {
        let api: Api<ConfigMap> = Api::namespaced(self.admin.clone(), &self.namespace);
        let params = kube::api::ListParams::default().labels(&format!("{MANAGED_LABEL}=true"));
        Ok(api.list_metadata(&params).await?.items.len())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `helm template` of some of the chart's templates, as `release` in `namespace`.
fn chart_objects(release: &str, namespace: &str, templates: &[&str]) -> anyhow::Result<String> {
    let chart = repo_root().join("charts/neuron-monitor");
    let home = std::env::temp_dir().join("neuron-fleet-helm-home");
    let mut command = std::process::Command::new(tool("helm"));
    command.args(["template", release]).arg(&chart).args(["--namespace", namespace]);
    for t in templates {
        command.args(["--show-only", t]);
    }
    let out = command
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An operator replica.
pub struct Operator {
    pub process: Process,
    pub addr: SocketAddr,
}

impl Operator {
    /// Its `/metrics`, once it answers.
    pub fn metrics(&self) -> Option<OperatorMetrics> {
        let (status, body) = http_get(self.addr, "/metrics")?;
        (status == 200).then_some(OperatorMetrics(body))
    }

    /// Waits until this replica leads and has finished `passes` reconciles.
    pub async fn wait_reconciled(&self, passes: f64, limit: Duration) -> Option<OperatorMetrics> {
        wait_for(limit, || async {
            let m = self.metrics()?;
            (m.value("neuron_operator_leader", &[]) == 1.0
                && m.value("neuron_operator_reconciles_total", &[]) >= passes)
                .then_some(m)
        })
        .await
    }

    pub fn stats(&self) -> Option<ProcStats> {
        ProcStats::of(self.process.pid())
    }
}

/// The operator's `/metrics` exposition.
#[derive(Clone, Debug, Default)]
pub struct OperatorMetrics(pub String);

impl OperatorMetrics {
    /// The sum of the samples of `name` whose labels include `labels` (0 when none).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, label_text) = series.split_once('{').unwrap_or((series, ""));
                (metric == name && labels.iter().all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\""))))
                    .then(|| value.parse::<f64>().ok())
                    .flatten()
            })
            .sum::<f64>()
            // An empty sum is -0.0.
            + 0.0
    }

    /// ConfigMaps and statuses written (server-side apply) and ConfigMaps deleted.
    pub fn writes(&self) -> Writes {
        let w = |kind, action| self.value("neuron_operator_writes_total", &[("kind", kind), ("action", action)]);
        Writes {
            configmaps: w("configmap", "apply"),
            deletes: w("configmap", "delete"),
            statuses: w("status", "apply"),
            failures: self.value("neuron_operator_write_failures_total", &[]),
        }
    }
}

/// The operator's write counters (or their difference between two scrapes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Writes {
    pub configmaps: f64,
    pub deletes: f64,
    pub statuses: f64,
    pub failures: f64,
}

impl std::ops::Sub for Writes {
    type Output = Writes;
    fn sub(self, o: Writes) -> Writes {
        Writes {
            configmaps: self.configmaps - o.configmaps + 0.0,
            deletes: self.deletes - o.deletes + 0.0,
            statuses: self.statuses - o.statuses + 0.0,
            failures: self.failures - o.failures + 0.0,
        }
    }
}

/// CPU time and memory of a process, from `/proc`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStats {
    /// User + system CPU time so far.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// Peak RSS (`VmHWM`).
    pub peak_rss_bytes: u64,
}

impl ProcStats {
    pub fn of(pid: u32) -> Option<ProcStats> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name (which may hold spaces) in parentheses.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k * 1024)
        };
        Some(ProcStats { cpu_seconds: ticks as f64 / hz, rss_bytes: kib("VmRSS:")?, peak_rss_bytes: kib("VmHWM:")? })
    }
}

/// The API server's `apiserver_request_total`, by (verb, resource, code), and its
/// priority-and-fairness rejections.
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    pub requests: BTreeMap<(String, String, String), f64>,
    /// `apiserver_flowcontrol_rejected_requests_total`: requests refused (429) by API
    /// Priority and Fairness.
    pub rejected: f64,
}

impl ApiRequests {
    /// Reads the API server's `/metrics` (as its administrator).
    pub async fn read(admin: &Client) -> anyhow::Result<ApiRequests> {
        let request = http::Request::get("/metrics").body(Vec::new()).context("a request")?;
        let text = admin.request_text(request).await.context("GET /metrics of the API server")?;
        let mut out = ApiRequests::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let Some((metric, labels)) = series.split_once('{') else { continue };
            match metric {
                "apiserver_request_total" => {
                    let label = |key: &str| label_value(labels, key).unwrap_or_default().to_owned();
                    *out.requests.entry((label("verb"), label("resource"), label("code"))).or_default() += value;
                }
                "apiserver_flowcontrol_rejected_requests_total" => out.rejected += value,
                _ => {}
            }
        }
        Ok(out)
    }

    /// What happened since `before`.
    pub fn since(&self, before: &ApiRequests) -> ApiRequests {
        let mut requests = self.requests.clone();
        for (key, value) in requests.iter_mut() {
            // (+ 0.0: no "-0" in the reports.)
            *value = *value - before.requests.get(key).copied().unwrap_or(0.0) + 0.0;
        }
        requests.retain(|_, v| *v > 0.0);
        ApiRequests { requests, rejected: self.rejected - before.rejected + 0.0 }
    }

    /// Requests by (verb, resource), every code.
    pub fn by_verb_and_resource(&self) -> BTreeMap<(String, String), f64> {
        let mut out = BTreeMap::new();
        for ((verb, resource, _), value) in &self.requests {
            *out.entry((verb.clone(), resource.clone())).or_default() += value;
        }
        out
    }

    /// Requests of this verb on this resource.
    pub fn count(&self, verb: &str, resource: &str) -> f64 {
        self.requests.iter().filter(|((v, r, _), _)| v == verb && r == resource).map(|(_, n)| n).sum::<f64>() + 0.0
    }

    /// Requests answered 429 (too many requests).
    pub fn throttled(&self) -> f64 {
        self.requests.iter().filter(|((_, _, code), _)| code == "429").map(|(_, n)| n).sum::<f64>() + 0.0
    }
}

/// The value of `key` in an exposition's label text (`a="1",b="2"`).
fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split("\",").find_map(|pair| {
        let (k, v) = pair.split_once("=\"")?;
        (k == key).then(|| v.trim_end_matches('"'))
    })
}

/// What the observer saw of one node's ConfigMap: each content hash with when it first
/// appeared, and when each hash was first acknowledged.
#[derive(Clone, Debug, Default)]
pub struct NodeHistory {
    pub written: Vec<(String, Instant)>,
    pub applied: Vec<(String, Instant)>,
    /// Watch events that changed the object (any field).
    pub events: u64,
    pub deleted: Option<Instant>,
}

impl NodeHistory {
    pub fn config_hash(&self) -> Option<&str> {
        self.written.last().map(|(h, _)| h.as_str())
    }
    pub fn applied_hash(&self) -> Option<&str> {
        self.applied.last().map(|(h, _)| h.as_str())
    }
    pub fn written_at(&self, hash: &str) -> Option<Instant> {
        self.written.iter().find(|(h, _)| h == hash).map(|(_, t)| *t)
    }
    pub fn applied_at(&self, hash: &str) -> Option<Instant> {
        self.applied.iter().find(|(h, _)| h == hash).map(|(_, t)| *t)
    }
}

/// Follows the node ConfigMaps of a namespace (metadata only) and keeps each node's
/// [`NodeHistory`].
pub struct Observer {
    seen: Arc<Mutex<HashMap<String, NodeHistory>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Starts watching; returns once the first listing is in.
    pub async fn start(admin: Client, namespace: &str) -> Observer {
        let seen: Arc<Mutex<HashMap<String, NodeHistory>>> = Arc::default();
        let api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(admin, namespace);
        let config = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true")).timeout(20);
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut listed = Some(listed_tx);
                let mut events = std::pin::pin!(watcher(api, config).default_backoff());
                while let Some(event) = events.next().await {
                    let now = Instant::now();
                    let Ok(event) = event else { continue };
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    match event {
                        watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) => {
                            let a = cm.annotations();
                            let Some(node) = a.get(NODE_ANNOTATION) else { continue };
                            let history = seen.entry(node.clone()).or_default();
                            history.events += 1;
                            history.deleted = None;
                            if let Some(hash) = a.get(CONFIG_HASH_ANNOTATION) {
                                if history.written_at(hash).is_none() {
                                    history.written.push((hash.clone(), now));
                                }
                            }
                            if let Some(hash) = a.get(APPLIED_HASH_ANNOTATION) {
                                if history.applied_at(hash).is_none() {
                                    history.applied.push((hash.clone(), now));
                                }
                            }
                        }
                        watcher::Event::Delete(cm) => {
                            if let Some(node) = cm.annotations().get(NODE_ANNOTATION) {
                                seen.entry(node.clone()).or_default().deleted = Some(now);
                            }
                        }
                        watcher::Event::InitDone => {
                            if let Some(tx) = listed.take() {
                                let _ = tx.send(());
                            }
                        }
                        watcher::Event::Init => {}
                    }
                }
            })
        };
        let _ = listed_rx.await;
        Observer { seen, task }
    }

    /// Every node's history so far.
    pub fn snapshot(&self) -> HashMap<String, NodeHistory> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until every one of `nodes` has a ConfigMap whose content differs from
    /// `before` (the snapshot taken before the change), and, if `acknowledged`, whose
    /// agent acknowledged it. Returns the roll-out's per-node times from `started`, or
    /// what was missing at `limit`.
    pub async fn rollout(
        &self,
        nodes: &[String],
        before: &HashMap<String, NodeHistory>,
        started: Instant,
        acknowledged: bool,
        limit: Duration,
    ) -> Result<Rollout, String> {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.snapshot();
            let mut rollout = Rollout::default();
            let mut missing = Vec::new();
            for node in nodes {
                let old = before.get(node).and_then(NodeHistory::config_hash);
                let history = now.get(node);
                let new = history.and_then(NodeHistory::config_hash).filter(|h| Some(*h) != old);
                let (Some(history), Some(hash)) = (history, new) else {
                    missing.push(format!("{node}: not written"));
                    continue;
                };
                rollout.hashes.insert(hash.to_owned());
                let written = history.written_at(hash).unwrap_or(started);
                rollout.written.push(written.saturating_duration_since(started));
                match history.applied_at(hash) {
                    Some(t) => rollout.applied.push(t.saturating_duration_since(started)),
                    None if acknowledged => missing.push(format!("{node}: not acknowledged")),
                    None => {}
                }
            }
            if missing.is_empty() {
                return Ok(rollout);
            }
            if Instant::now() >= deadline {
                let n = missing.len();
                missing.truncate(5);
                return Err(format!("{n} of {} node(s) not done after {limit:?}, e.g. {missing:?}", nodes.len()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Node ConfigMap events after `before` (for a change that must write nothing).
    pub fn events_since(&self, before: &HashMap<String, NodeHistory>) -> u64 {
        self.snapshot().iter().map(|(node, h)| h.events - before.get(node).map_or(0, |b| b.events)).sum()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Per-node times of one roll-out, from the change.
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    /// When each node's ConfigMap first carried the new content.
    pub written: Vec<Duration>,
    /// When each node's agent acknowledged it.
    pub applied: Vec<Duration>,
    /// The new content hashes (one when every node runs the same configs).
    pub hashes: std::collections::BTreeSet<String>,
}

/// p50, p95 and the maximum of some durations (zero when empty).
pub fn percentiles(values: &[Duration]) -> (Duration, Duration, Duration) {
    let mut v = values.to_vec();
    v.sort_unstable();
    let at = |q: f64| v.get(((v.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or_default();
    (at(0.5), at(0.95), v.last().copied().unwrap_or_default())
}

/// `p50 / p95 / max` in seconds, for a report line.
pub fn summary(values: &[Duration]) -> String {
    let (p50, p95, max) = percentiles(values);
    format!("p50 {:.2} s, p95 {:.2} s, max {:.2} s", p50.as_secs_f64(), p95.as_secs_f64(), max.as_secs_f64())
}

/// Mebibytes, for a report line.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_hundred() {
        let v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentiles(&v), (Duration::from_millis(50), Duration::from_millis(95), Duration::from_millis(100)));
        assert_eq!(percentiles(&[]), (Duration::ZERO, Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn operator_metrics_are_summed_by_label() {
        let m = OperatorMetrics(
            "# TYPE x counter\nneuron_operator_writes_total{kind=\"configmap\",action=\"apply\"} 7\n\
             neuron_operator_writes_total{kind=\"status\",action=\"apply\"} 2\nneuron_operator_leader 1\n"
                .to_owned(),
        );
        assert_eq!(m.writes().configmaps, 7.0);
        assert_eq!(m.writes().statuses, 2.0);
        assert_eq!(m.value("neuron_operator_writes_total", &[]), 9.0);
        assert_eq!(m.value("neuron_operator_leader", &[]), 1.0);
    }

    #[test]
    fn labels_are_read_by_key() {
        let labels = r#"code="429",resource="configmaps",subresource="status",verb="PATCH""#;
        assert_eq!(label_value(labels, "verb"), Some("PATCH"));
        assert_eq!(label_value(labels, "code"), Some("429"));
        assert_eq!(label_value(labels, "resource"), Some("configmaps"));
        assert_eq!(label_value(labels, "group"), None);
    }
}
