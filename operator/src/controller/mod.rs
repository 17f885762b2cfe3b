//! The controller: watches NeuronMonitorConfigs (all namespaces), Nodes, its own node
//! ConfigMaps and the tenancy policy ([`policy`]), and on any change reconciles
//! everything at once: validate every config and hold it to the policy and its
//! namespace's cost ceiling ([`admission`]), render every Neuron node, write the
//! ConfigMaps whose content changed, delete those of nodes nothing applies to any more,
//! and update each config's status ([`status`]).
//!
//! A full, level-triggered pass is simple and always correct: a config change can
//! touch thousands of nodes anyway, and rendering 5,000 nodes takes milliseconds.
//! Only the leader writes; every replica keeps its caches warm to take over at once.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::{
    cloudwatch::cost::Prices,
    crd::NeuronMonitorConfig,
    node_config::{
        configmap_name, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION, DEFAULT_CONDITION_TYPE, MANAGED_LABEL,
        MONITOR_CONFIG_KEY, NODE_ANNOTATION, NODE_CONFIG_KEY,
    },
};
use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        events::Recorder,
        reflector::{self, Store},
        watcher, WatchStreamExt,
    },
    Api, Client, ResourceExt,
};
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod admission;
mod policy;
mod status;

pub use self::policy::POLICY_KEY;
use self::{admission::Accepted, policy::PolicySource, status::Outcome};
use api::{
    render::{self, RenderedNode, Rendering},
    validate::{ConfigKey, Invalid, Refusal},
};

use crate::{
    nodes::{self, NeuronNodePolicy},
    telemetry::{ErrorLabel, OperatorMetrics, ReasonLabel},
};

/// Field manager of everything the operator writes (server-side apply).
pub const MANAGER: &str = "neuron-operator";
/// A full pass at least this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);
/// Server-side duration of each watch call; below the client's read timeout, so a quiet
/// watch ends normally and is resumed from its resource version.
pub const WATCH_SECONDS: u32 = 20;
/// Changes arriving together (a rollout touching many nodes) are handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding a node configuration: {0}")]
    Encode(#[from] serde_json::Error),
    /// The pass went through every node and config, but some writes failed; it is retried.
    #[error("{failed} write(s) failed")]
    Incomplete { failed: usize },
}

impl Error {
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Encode(_) => "encode",
            Error::Incomplete { .. } => "write",
        }
    }
}

/// A config and whether it is accepted.
type Verdict = (Arc<NeuronMonitorConfig>, Result<(), Invalid>);

pub struct Controller {
    client: Client,
    namespace: String,
    policy: NeuronNodePolicy,
    metrics: OperatorMetrics,
    recorder: Recorder,
    configs: Store<NeuronMonitorConfig>,
    nodes: Store<Node>,
    configmaps: Store<ConfigMap>,
    /// The tenancy policy and the namespaces' labels.
    tenancy: PolicySource,
    /// The prices of the cost estimate.
    prices: Prices,
    /// Last accepted version of each config (by uid): a refused update keeps the nodes
    /// on it, as the API promises ("never a half-applied config").
    last_good: Mutex<HashMap<String, Accepted>>,
    /// Accepted state and reason last announced by an Event, by uid.
    announced: Mutex<HashMap<String, (bool, String)>>,
    changed: Arc<Notify>,
    /// Which watches have listed everything (see [`Listed`]).
    listed: watch::Receiver<Listed>,
}

/// Which watches have completed their first listing. Kept here rather than asked of the
/// reflector stores: a store's `wait_until_ready` wakes only the last task that polled it,
/// so `/readyz` and the reconcile loop waiting at once left one of them asleep for good.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub configs: bool,
    pub nodes: bool,
    pub configmaps: bool,
    /// The tenancy policy's ConfigMap, and the namespaces (their labels).
    pub policy: bool,
    pub namespaces: bool,
}

impl Listed {
    pub fn all(&self) -> bool {
        self.configs && self.nodes && self.configmaps && self.policy && self.namespaces
    }
}

/// What the tenancy policy and the cost estimate are given.
#[derive(Clone, Debug, Default)]
pub struct TenancyOptions {
    /// The ConfigMap of the operator's namespace holding the policy ([`POLICY_KEY`]);
    /// `None`: the built-in policy.
    pub policy_configmap: Option<String>,
    pub prices: Prices,
}

impl Controller {
    /// Starts the watches; their caches fill in the background.
    pub fn start(
        client: Client,
        namespace: &str,
        policy: NeuronNodePolicy,
        metrics: OperatorMetrics,
        recorder: Recorder,
        tenancy: TenancyOptions,
    ) -> Arc<Controller> {
        let changed = Arc::new(Notify::new());
        let (listed_tx, listed) = watch::channel(Listed::default());
        let listed_tx = Arc::new(listed_tx);
        let (configs, configs_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (configmaps, configmaps_writer) = reflector::store();
        let config_api: Api<NeuronMonitorConfig> = Api::all(client.clone());
        let node_api: Api<Node> = Api::all(client.clone());
        let configmap_api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let label = format!("{MANAGED_LABEL}=true");
        spawn_watch(
            "neuronmonitorconfigs",
            changed.clone(),
            mark_listed(&listed_tx, |l| l.configs = true),
            reflector::reflector(
                configs_writer,
                watcher(config_api, watcher::Config::default().timeout(WATCH_SECONDS)).default_backoff(),
            ),
        );
        spawn_watch(
            "nodes",
            changed.clone(),
            mark_listed(&listed_tx, |l| l.nodes = true),
            reflector::reflector(
                nodes_writer,
                watcher(node_api, watcher::Config::default().timeout(WATCH_SECONDS))
                    .default_backoff()
                    // Node objects are large; keep what deciding and rendering need, and
                    // of the conditions their type and status (the unhealthy-node count).
                    .modify(|node: &mut Node| {
                        node.managed_fields_mut().clear();
                        if let Some(status) = node.status.as_mut() {
                            status.images = None;
                            status.volumes_attached = None;
                            status.volumes_in_use = None;
                            for c in status.conditions.iter_mut().flatten() {
                                c.reason = None;
                                c.message = None;
                                c.last_heartbeat_time = None;
                                c.last_transition_time = None;
                            }
                        }
                    }),
            ),
        );
        spawn_watch(
            "configmaps",
            changed.clone(),
            mark_listed(&listed_tx, |l| l.configmaps = true),
            reflector::reflector(
                configmaps_writer,
                watcher(configmap_api, watcher::Config::default().labels(&label).timeout(WATCH_SECONDS))
                    .default_backoff(),
            ),
        );
        let tenancy_policy =
            PolicySource::start(&client, namespace, tenancy.policy_configmap.as_deref(), &changed, &listed_tx);
        Arc::new(Controller {
            client,
            namespace: namespace.to_owned(),
            policy,
            metrics,
            recorder,
            configs,
            nodes,
            configmaps,
            tenancy: tenancy_policy,
            prices: tenancy.prices,
            last_good: Mutex::default(),
            announced: Mutex::default(),
            changed,
            listed,
        })
    }

    /// Returns once every watch has listed its objects; any number of tasks may wait.
    pub async fn wait_until_synced(&self) {
        let mut listed = self.listed.clone();
        // An error means the watch tasks are gone: nothing will ever sync.
        if listed.wait_for(Listed::all).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether every watch has listed its objects (what `/readyz` answers).
    pub fn is_synced(&self) -> bool {
        self.listed.borrow().all()
    }

    /// Reconciles on every change while this replica leads, until `shutdown`.
    pub async fn run(self: Arc<Self>, mut leading: watch::Receiver<bool>, shutdown: CancellationToken) {
        // A shutdown must not wait for watches that have not listed yet; a long wait is said.
        let synced = self.wait_until_synced();
        tokio::pin!(synced);
        loop {
            tokio::select! {
                _ = &mut synced => break,
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(10)) => {
                    let listed = *self.listed.borrow();
                    warn!(
                        configs = listed.configs,
                        nodes = listed.nodes,
                        configmaps = listed.configmaps,
                        "watch caches not synced yet; nothing is written until they are"
                    );
                }
            }
        }
        info!("caches synced");
        let mut retry = Duration::from_millis(500);
        loop {
            if *leading.borrow_and_update() {
                match self.reconcile().await {
                    Ok(()) => retry = Duration::from_millis(500),
                    Err(e) => {
                        warn!(error = %e, retry_in_ms = retry.as_millis() as u64, "reconcile failed");
                        self.metrics.reconcile_errors.get_or_create(&ErrorLabel { error: e.label() }).inc();
                        tokio::select! {
                            _ = tokio::time::sleep(retry) => {}
                            _ = shutdown.cancelled() => return,
                        }
                        retry = (retry * 2).min(Duration::from_secs(30));
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = self.changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                _ = leading.changed() => {}
                _ = tokio::time::sleep(RESYNC) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// One full pass.
    pub async fn reconcile(&self) -> Result<(), Error> {
        let started = Instant::now();
        let configs = self.configs.state();
        let nodes: Vec<Arc<Node>> = self.nodes.state().into_iter().filter(|n| self.policy.is_neuron_node(n)).collect();
        self.metrics.configs.set(configs.len() as i64);
        self.metrics.nodes.set(nodes.len() as i64);

        let policy = self.tenancy.current(&self.metrics, &self.recorder).await;
        let admission = self.admit(&configs, &nodes, &policy);

        // Render (configs that do not fit on their nodes are refused) and write what
        // changed. A failed write stops nothing else: it is counted, and the pass retried.
        let rendering = render::render_all(nodes.iter(), &admission.usable)?;
        let mut failures = WriteFailures::default();
        let mut written: HashSet<String> = HashSet::new();
        for node in &nodes {
            let name = node.name_any();
            if let Some(rendered) = rendering.rendered(&name) {
                match self.apply_configmap(node, rendered).await {
                    Ok(()) => {
                        written.insert(name);
                    }
                    Err(e) => failures.record(&self.metrics, "configmap", "apply", &name, &e),
                }
            }
        }
        self.delete_stale_configmaps(&rendering, &mut failures).await;

        // Verdicts: refused by validation, else by the room on its nodes.
        let verdicts: Vec<Verdict> = admission
            .verdicts
            .into_iter()
            .map(|(config, verdict)| {
                let refusal = ConfigKey::of(&config).ok().and_then(|key| rendering.refusal(&key).cloned());
                let verdict = verdict.and_then(|()| refusal.map_or(Ok(()), Err));
                (config, verdict)
            })
            .collect();
        self.count_refusals(&verdicts);

        // Per config, the nodes whose ConfigMap carries it, and of those the nodes whose
        // agent acknowledged that content.
        let carried = rendering.count_matched_where(|node, _| written.contains(node));
        let applied = rendering.count_matched_where(|node, rendered| {
            let configmap =
                self.configmaps.get(&reflector::ObjectRef::new(&configmap_name(node)).within(&self.namespace));
            written.contains(node)
                && configmap.as_ref().and_then(|cm| cm.annotations().get(APPLIED_HASH_ANNOTATION))
                    == Some(&rendered.hash)
        });
        // Of those, the nodes whose health condition (the type their configuration sets)
        // is True: a Neuron device has a fault.
        let unhealthy = rendering.count_matched_where(|node, rendered| {
            let condition_type = rendered.config.health.as_ref().and_then(|h| h.condition_type.as_deref());
            written.contains(node)
                && self
                    .nodes
                    .get(&reflector::ObjectRef::new(node))
                    .is_some_and(|n| nodes::condition_is_true(&n, condition_type.unwrap_or(DEFAULT_CONDITION_TYPE)))
        });
        let health_conflicts = rendering.health_conflicts();
        for (config, verdict) in verdicts {
            let Ok(key) = ConfigKey::of(&config) else { continue };
            // What an accepted config with a CloudWatch or OTLP sink costs on its nodes.
            let costs = verdict.is_ok().then(|| admission.costs.get(&key).cloned()).flatten();
            let outcome = Outcome {
                verdict,
                matched: rendering.matched_nodes(&key),
                carried: carried.get(&key).copied().unwrap_or(0),
                applied: applied.get(&key).copied().unwrap_or(0),
                unhealthy: unhealthy.get(&key).copied().unwrap_or(0),
                health: config.spec.health.is_some().then(|| health_conflicts.get(&key).cloned()),
                costs,
            };
            if let Err(e) = self.update_status(&config, outcome).await {
                failures.record(&self.metrics, "status", "apply", &key.to_string(), &e);
            }
        }
        self.metrics.reconciles.inc();
        self.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        debug!(
            nodes = nodes.len(),
            configs = configs.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "reconciled"
        );
        match failures.count {
            0 => Ok(()),
            failed => Err(Error::Incomplete { failed }),
        }
    }

    /// Sets the gauges of configs not accepted, by reason.
    fn count_refusals(&self, verdicts: &[Verdict]) {
        let mut by_reason: HashMap<Refusal, i64> = Refusal::ALL.iter().map(|r| (*r, 0)).collect();
        for (_, verdict) in verdicts {
            if let Err(invalid) = verdict {
                *by_reason.entry(invalid.kind).or_default() += 1;
            }
        }
        self.metrics.invalid_configs.set(by_reason.values().sum());
        for (reason, count) in by_reason {
            self.metrics.refused_configs.get_or_create(&ReasonLabel { reason: reason.as_str() }).set(count);
        }
    }

    /// Writes a node's ConfigMap if its content changed.
    async fn apply_configmap(&self, node: &Node, rendered: &RenderedNode) -> Result<(), Error> {
        let node_name = node.name_any();
        let name = configmap_name(&node_name);
        let current = self.configmaps.get(&reflector::ObjectRef::new(&name).within(&self.namespace));
        if current.as_ref().and_then(|cm| cm.annotations().get(CONFIG_HASH_ANNOTATION)) == Some(&rendered.hash) {
            return Ok(());
        }
        let monitor = serde_json::to_string_pretty(&rendered.config.monitor)?;
        let configmap = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": { MANAGED_LABEL: "true", "app.kubernetes.io/managed-by": MANAGER },
                "annotations": { CONFIG_HASH_ANNOTATION: rendered.hash, NODE_ANNOTATION: node_name },
                // Owned by its Node: deleted with it by the garbage collector.
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node.uid().unwrap_or_default(),
                }],
            },
            "data": { NODE_CONFIG_KEY: rendered.json, MONITOR_CONFIG_KEY: monitor },
        });
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&configmap)).await?;
        self.metrics.wrote("configmap", "apply");
        info!(node = %node_name, configmap = %name, hash = %rendered.hash, "wrote node configuration");
        Ok(())
    }

    async fn delete_stale_configmaps(&self, rendering: &Rendering, failures: &mut WriteFailures) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        for cm in self.configmaps.state() {
            let node = cm.annotations().get(NODE_ANNOTATION).cloned().unwrap_or_default();
            if rendering.rendered(&node).is_some() {
                continue;
            }
            match api.delete(&cm.name_any(), &DeleteParams::default()).await {
                Ok(_) => {
                    self.metrics.wrote("configmap", "delete");
                    info!(configmap = %cm.name_any(), node = %node, "deleted the configuration of a node nothing applies to");
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => failures.record(&self.metrics, "configmap", "delete", &cm.name_any(), &e.into()),
            }
        }
    }
}

/// The writes that failed in one pass: counted in `neuron_operator_write_failures_total`,
/// the first few logged (a pass over thousands of nodes could fail them all).
#[derive(Default)]
struct WriteFailures {
    count: usize,
}

impl WriteFailures {
    const LOGGED_PER_PASS: usize = 5;

    fn record(&mut self, metrics: &OperatorMetrics, kind: &'static str, action: &'static str, object: &str, e: &Error) {
        self.count += 1;
        metrics.write_failed(kind, action);
        if self.count <= Self::LOGGED_PER_PASS {
            warn!(kind, action, object, error = %e, "write failed; the pass goes on and is retried");
        } else if self.count == Self::LOGGED_PER_PASS + 1 {
            warn!("more writes failed in this pass; see neuron_operator_write_failures_total");
        }
    }
}

/// A callback that records one watch's first complete listing.
fn mark_listed(tx: &Arc<watch::Sender<Listed>>, mark: fn(&mut Listed)) -> impl Fn() + Send + 'static {
    let tx = tx.clone();
    move || tx.send_modify(mark)
}

/// Drives a reflector's stream: every event wakes the reconcile loop, and the end of the
/// first listing (`InitDone`, after the reflector has filled its store) calls `on_listed`.
fn spawn_watch<K, S>(what: &'static str, changed: Arc<Notify>, on_listed: impl Fn() + Send + 'static, stream: S)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    if matches!(event, watcher::Event::InitDone) {
                        on_listed();
                    }
                    changed.notify_one();
                }
                Ok(None) => break,
                // The backoff inside the stream retries; say what is failing.
                Err(e) => warn!(watch = what, error = %e, "watch failed; retrying"),
            }
        }
    });
}
