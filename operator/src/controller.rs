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
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    api::{DeleteParams, Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        events::Recorder,
        reflector::{self, Store},
        watcher, WatchStreamExt,
    },
    Api, Client, ResourceExt,
};
use serde_json::json;
use service::tasks::CriticalTasks;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod accepted;
mod admission;
mod cluster_apis;
mod pace;
mod pending;
mod policy;
mod status;

pub use self::policy::POLICY_KEY;
use self::{admission::Accepted, policy::PolicySource, status::Outcome};
use api::{
    cloudwatch::cost::Costs,
    render::{self, RenderedNode, Rendering},
    validate::{ConfigKey, Invalid, Refusal, ValidConfig},
};

use crate::{
    headers::{HeadersMirror, HeadersOutcome},
    nodes::{self, NeuronNodePolicy},
    telemetry::{ErrorLabel, OperatorMetrics, ReasonLabel},
    MANAGER,
};

/// A full pass at least this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);
/// ... and this often while a config names an OTLP headers Secret: the Secrets are read,
/// not watched (the operator may not watch them), so a rotation or a new grant reaches
/// the agents within it.
const HEADERS_RESYNC: Duration = Duration::from_secs(60);
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

/// A config's verdict once rendered: refused by validation or admission, else by the room
/// on its nodes (`refusal`), else accepted.
fn with_room(verdict: Result<(), Invalid>, refusal: Option<Invalid>) -> Result<(), Invalid> {
    verdict.and_then(|()| refusal.map_or(Ok(()), Err))
}

pub struct Controller {
    client: Client,
    namespace: String,
    policy: NeuronNodePolicy,
    metrics: OperatorMetrics,
    recorder: Recorder,
    configs: Store<NeuronMonitorConfig>,
    nodes: Store<Node>,
    /// Metadata only: the operator reads their annotations, never their data (which can
    /// approach 1 MiB per node).
    configmaps: Store<PartialObjectMeta<ConfigMap>>,
    /// The configs' OTLP headers, mirrored for the agents.
    headers: HeadersMirror,
    /// The last pass found a config with an OTLP headers Secret.
    reads_headers: std::sync::atomic::AtomicBool,
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
    /// ConfigMap writes (and deletes) in flight at once in a pass.
    writes_in_flight: usize,
    /// ConfigMaps written that the cache may not show yet.
    pending: pending::PendingWrites,
    /// How fast each namespace's config changes are adopted.
    pace: pace::ChangePace,
    /// What the API server serves that configs may ask for.
    cluster_apis: cluster_apis::ClusterApis,
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

/// How the controller runs, beyond what it watches.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The Secret of the operator's namespace the configs' OTLP headers are mirrored into.
    pub headers_secret: String,
    /// ConfigMap writes (and deletes) a pass has in flight at once (at least 1).
    pub writes_in_flight: usize,
    /// The ConfigMap of the operator's namespace holding the tenancy policy
    /// ([`POLICY_KEY`]); `None`: the built-in policy.
    pub policy_configmap: Option<String>,
    /// The prices of the cost estimate.
    pub prices: Prices,
    /// Which nodes are monitored.
    pub nodes: NeuronNodePolicy,
}

impl Controller {
    /// Starts the watches among `tasks`, until `shutdown`; their caches fill in the
    /// background.
    pub fn start(
        tasks: &mut CriticalTasks,
        shutdown: &CancellationToken,
        client: Client,
        namespace: &str,
        metrics: OperatorMetrics,
        recorder: Recorder,
        options: Options,
    ) -> Arc<Controller> {
        let changed = Arc::new(Notify::new());
        let (listed_tx, listed) = watch::channel(Listed::default());
        let listed_tx = Arc::new(listed_tx);
        let (configs, configs_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (configmaps, configmaps_writer) = reflector::store();
        let config_api: Api<NeuronMonitorConfig> = Api::all(client.clone());
        let node_api: Api<Node> = Api::all(client.clone());
        // Metadata-only requests (`PartialObjectMeta`).
        let configmap_api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), namespace);
        let label = format!("{MANAGED_LABEL}=true");
        spawn_watch(
            tasks,
            shutdown,
            "neuronmonitorconfigs",
            changed.clone(),
            mark_listed(&listed_tx, |l| l.configs = true),
            reflector::reflector(
                configs_writer,
                watcher(config_api, watcher::Config::default().timeout(WATCH_SECONDS)).default_backoff(),
            ),
        );
        spawn_watch(
            tasks,
            shutdown,
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
            tasks,
            shutdown,
            "configmaps",
            changed.clone(),
            mark_listed(&listed_tx, |l| l.configmaps = true),
            reflector::reflector(
                configmaps_writer,
                watcher(configmap_api, watcher::Config::default().labels(&label).timeout(WATCH_SECONDS))
                    .default_backoff()
                    .modify(|cm| cm.managed_fields_mut().clear()),
            ),
        );
        let policy_configmap = options.policy_configmap.as_deref();
        let tenancy_policy =
            PolicySource::start(tasks, shutdown, &client, namespace, policy_configmap, &changed, &listed_tx);
        Arc::new(Controller {
            headers: HeadersMirror::new(client.clone(), namespace, &options.headers_secret),
            reads_headers: Default::default(),
            client,
            namespace: namespace.to_owned(),
            policy: options.nodes,
            metrics,
            recorder,
            configs,
            nodes,
            configmaps,
            tenancy: tenancy_policy,
            prices: options.prices,
            last_good: Mutex::default(),
            announced: Mutex::default(),
            changed,
            listed,
            writes_in_flight: options.writes_in_flight.max(1),
            pending: Default::default(),
            pace: Default::default(),
            cluster_apis: Default::default(),
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
                // A pass over thousands of nodes takes seconds: it stops at once when the
                // lease is lost (the new leader writes now) or on shutdown (so the lease is
                // released without delay); the next leader's pass finishes it.
                let lost = async {
                    if leading.wait_for(|leads| !*leads).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                let pass = tokio::select! {
                    pass = self.reconcile() => pass,
                    _ = lost => {
                        warn!("lost the lease during a pass; stopped writing");
                        continue;
                    }
                    _ = shutdown.cancelled() => return,
                };
                match pass {
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
                _ = leadership_change(&mut leading) => {}
                _ = tokio::time::sleep(self.next_pass()) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// When the next pass is due without a change: at the resync, or at the next slot of
    /// a namespace whose changes wait.
    fn next_pass(&self) -> Duration {
        let resync =
            if self.reads_headers.load(std::sync::atomic::Ordering::Relaxed) { HEADERS_RESYNC } else { RESYNC };
        self.pace.next_slot().map_or(resync, |slot| slot.min(resync))
    }

    /// One full pass.
    pub async fn reconcile(&self) -> Result<(), Error> {
        let started = Instant::now();
        let all = self.configs.state();
        self.metrics.configs.set(all.len() as i64);
        let paced = self.pace.pace(all, &self.namespace);
        self.metrics.namespaces_held.set(self.pace.held_namespaces() as i64);
        let configs = paced.configs;
        let nodes: Vec<Arc<Node>> =
            self.nodes.state().into_iter().filter(|n| self.policy.is_monitored_node(n)).collect();
        self.metrics.nodes.set(nodes.len() as i64);

        let policy = self.tenancy.current(&self.metrics, &self.recorder).await;
        let device_taints = self.cluster_apis.device_taints(&self.client, &configs).await;
        let admission = self.admit(&configs, &nodes, &policy, device_taints);
        let mut failures = WriteFailures::default();
        // Before the nodes get a new version: a restart must find it recorded.
        for config in &admission.to_record {
            if let Err(e) = self.record_accepted(config).await {
                failures.record(&self.metrics, "config", "annotate", &config.name_any(), &e);
            }
        }

        // Render (configs that do not fit on their nodes are refused) and write what
        // changed. A failed write stops nothing else: it is counted, and the pass retried.
        let rendering = render::render_all(nodes.iter(), &admission.usable)?;
        self.pending.expire();
        let written = self.write_configmaps(&nodes, &rendering, &mut failures).await;
        self.delete_stale_configmaps(&rendering, &mut failures).await;

        let headers = self.mirror_headers(&admission.usable, &rendering, &mut failures).await;

        // Verdicts: refused by validation, else by the room on its nodes.
        let mut verdicts: Vec<Verdict> = admission
            .verdicts
            .into_iter()
            .map(|(config, verdict)| {
                let refusal = ConfigKey::of(&config).ok().and_then(|key| rendering.refusal(&key).cloned());
                (config, with_room(verdict, refusal))
            })
            .collect();
        self.count_refusals(&verdicts);
        // A config whose newest version waits is told nothing until it is adopted.
        verdicts.retain(|(config, _)| config.uid().is_none_or(|uid| !paced.held.contains(&uid)));

        self.report_statuses(verdicts, &rendering, &written, &headers, &admission.costs, &mut failures).await;
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

    /// Writes the rendered ConfigMaps, several in flight; returns the nodes written. A
    /// failed write stops nothing else: it is counted in `failures`.
    async fn write_configmaps(
        &self,
        nodes: &[Arc<Node>],
        rendering: &Rendering,
        failures: &mut WriteFailures,
    ) -> HashSet<String> {
        let mut written: HashSet<String> = HashSet::new();
        // Several writes in flight: one at a time, a round trip per node made a change
        // reach 1,000 nodes in tens of seconds.
        // (Futures collected first: a stream mapped by a closure over borrowed nodes would
        // not be `Send` for the spawned reconcile loop.)
        let writes: Vec<_> = nodes
            .iter()
            .filter_map(|node| {
                let rendered = rendering.rendered(&node.name_any())?;
                Some(async move { (node.name_any(), self.apply_configmap(node, rendered).await) })
            })
            .collect();
        let applied: Vec<(String, Result<(), Error>)> =
            futures::stream::iter(writes).buffer_unordered(self.writes_in_flight).collect().await;
        for (name, result) in applied {
            match result {
                Ok(()) => {
                    written.insert(name);
                }
                Err(e) => failures.record(&self.metrics, "configmap", "apply", &name, &e),
            }
        }
        written
    }

    /// Mirrors the OTLP headers of the configs the nodes run, for their agents; returns
    /// what became of each config's headers.
    async fn mirror_headers(
        &self,
        usable: &[ValidConfig],
        rendering: &Rendering,
        failures: &mut WriteFailures,
    ) -> HashMap<ConfigKey, HeadersOutcome> {
        let on_nodes = usable.iter().filter(|v| rendering.refusal(&v.key).is_none()).map(|v| (&v.key, &v.route));
        let (headers, mirrored) = self.headers.sync(on_nodes).await;
        self.reads_headers.store(!headers.is_empty(), std::sync::atomic::Ordering::Relaxed);
        match mirrored {
            Ok(true) => self.metrics.wrote("secret", "apply"),
            Ok(false) => {}
            Err(e) => failures.record(&self.metrics, "secret", "apply", "OTLP headers mirror", &e.into()),
        }

        headers
    }

    /// Writes every config's status: its verdict, and per config the nodes whose ConfigMap
    /// carries it, those whose agent applied it, and those with a device fault.
    async fn report_statuses(
        &self,
        verdicts: Vec<Verdict>,
        rendering: &Rendering,
        written: &HashSet<String>,
        headers: &HashMap<ConfigKey, HeadersOutcome>,
        costs: &HashMap<ConfigKey, Costs>,
        failures: &mut WriteFailures,
    ) {
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
            let costs = verdict.is_ok().then(|| costs.get(&key).cloned()).flatten();
            let outcome = Outcome {
                verdict,
                matched: rendering.matched_nodes(&key),
                carried: carried.get(&key).copied().unwrap_or(0),
                applied: applied.get(&key).copied().unwrap_or(0),
                unhealthy: unhealthy.get(&key).copied().unwrap_or(0),
                health: config.spec.health.is_some().then(|| health_conflicts.get(&key).cloned()),
                headers: headers.get(&key).cloned(),
                costs,
            };
            if let Err(e) = self.update_status(&config, outcome).await {
                failures.record(&self.metrics, "status", "apply", &key.to_string(), &e);
            }
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
            self.pending.seen(&name);
            return Ok(());
        }
        let cached_version = current.as_ref().and_then(|cm| cm.metadata.resource_version.as_deref());
        if self.pending.is_pending(&name, &rendered.hash, cached_version) {
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
        self.pending.wrote(&name, &rendered.hash, cached_version);
        self.metrics.wrote("configmap", "apply");
        info!(node = %node_name, configmap = %name, hash = %rendered.hash, "wrote node configuration");
        Ok(())
    }

    /// Deletes the ConfigMaps of nodes nothing applies to any more (a node that is gone
    /// takes its own: the garbage collector follows its owner reference).
    async fn delete_stale_configmaps(&self, rendering: &Rendering, failures: &mut WriteFailures) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let deletes: Vec<_> = self
            .configmaps
            .state()
            .into_iter()
            .filter(|cm| {
                let node = cm.annotations().get(NODE_ANNOTATION).map(String::as_str).unwrap_or_default();
                rendering.rendered(node).is_none()
            })
            .map(|cm| {
                let api = api.clone();
                async move {
                    let name = cm.name_any();
                    self.pending.seen(&name);
                    let result = match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {
                            self.metrics.wrote("configmap", "delete");
                            let node = cm.annotations().get(NODE_ANNOTATION).cloned().unwrap_or_default();
                            info!(configmap = %name, %node, "deleted the configuration of a node nothing applies to");
                            Ok(())
                        }
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                        Err(e) => Err(e),
                    };
                    (name, result)
                }
            })
            .collect();
        let deleted: Vec<(String, Result<(), kube::Error>)> =
            futures::stream::iter(deletes).buffer_unordered(self.writes_in_flight).collect().await;
        for (name, result) in deleted {
            if let Err(e) = result {
                failures.record(&self.metrics, "configmap", "delete", &name, &e.into());
            }
        }
    }
}

/// The next change of leadership. Without an election nobody sends one (the sender is
/// gone): that is "never", not a change, or the loop would pass without pause.
async fn leadership_change(leading: &mut watch::Receiver<bool>) {
    if leading.changed().await.is_err() {
        std::future::pending::<()>().await;
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
/// The watch is one of `tasks`, by the name `what`: its stream never ends while it runs.
fn spawn_watch<K, S>(
    tasks: &mut CriticalTasks,
    shutdown: &CancellationToken,
    what: &'static str,
    changed: Arc<Notify>,
    on_listed: impl Fn() + Send + 'static,
    stream: S,
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tasks.spawn_until(what, shutdown, async move {
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

#[cfg(test)]
mod tests;
