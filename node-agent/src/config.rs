//! The node's configuration: the built-in one, or the ConfigMap the operator renders
//! for this node, watched through the API (a mounted ConfigMap would take the kubelet
//! 60–90 s to refresh). A new configuration is written to a file named by its hash,
//! neuron-monitor is restarted on it, the routing table is swapped, and the applied
//! hash is written back to the ConfigMap so the operator can count applied nodes.
//! An unreadable ConfigMap changes nothing: the last good configuration stays.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use api::{
    monitor_config::MonitorConfig,
    node_config::{
        configmap_name, content_hash, NodeConfig, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION, NODE_CONFIG_KEY,
    },
};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    runtime::{watcher, WatchStreamExt},
    Api, Client, ResourceExt,
};
use serde_json::json;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    monitor::LaunchSpec,
    routing::Routing,
    sinks::prometheus::SharedRouting,
    telemetry::{AgentMetrics, ResultLabel},
};

/// Field manager of the agent's writes.
pub const MANAGER: &str = "neuron-node-agent";

/// How neuron-monitor is started, whatever the configuration.
#[derive(Clone, Debug)]
pub struct Launcher {
    pub program: PathBuf,
    /// Arguments before `-c FILE`.
    pub args: Vec<String>,
    pub state_dir: PathBuf,
    /// Fixed silence limit; default: three periods of the fastest group, at least 2 s.
    pub silence_timeout: Option<Duration>,
}

impl Launcher {
    /// Writes `config` to `<state dir>/neuron-monitor-<hash>.json` (removing older
    /// files) and returns the spec that runs neuron-monitor on it.
    pub async fn prepare(&self, config: &MonitorConfig) -> std::io::Result<LaunchSpec> {
        let body = serde_json::to_vec_pretty(config).map_err(std::io::Error::other)?;
        let name = format!("neuron-monitor-{}.json", content_hash(&body));
        let path = self.state_dir.join(&name);
        let partial = self.state_dir.join(format!(".{name}.partial"));
        tokio::fs::write(&partial, &body).await?;
        tokio::fs::rename(&partial, &path).await?;
        remove_other_configs(&self.state_dir, &name).await;
        let silence_limit = self
            .silence_timeout
            .unwrap_or_else(|| (config.shortest_period().as_duration() * 3).max(Duration::from_secs(2)));
        let mut args = self.args.clone();
        args.extend(["-c".to_owned(), path.display().to_string()]);
        Ok(LaunchSpec { program: self.program.clone(), args, silence_limit })
    }
}

async fn remove_other_configs(dir: &Path, keep: &str) {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else { return };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("neuron-monitor-") && name.ends_with(".json") && name != keep {
            let _ = tokio::fs::remove_file(entry.path()).await;
        }
    }
}

/// Why `--node-config-file` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a rendered node configuration: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {source}")]
    Routing { path: PathBuf, source: crate::routing::RoutingError },
    #[error("writing the neuron-monitor configuration: {0}")]
    Prepare(std::io::Error),
}

/// Runs a rendered node configuration (the JSON the operator puts under
/// [`NODE_CONFIG_KEY`]) from a file instead of the ConfigMap: for nodes without the
/// operator, and for tests. Swaps the routing table like a ConfigMap change does and
/// returns the launch spec of its neuron-monitor configuration.
pub async fn load_node_config_file(
    path: &Path,
    launcher: &Launcher,
    routing: &SharedRouting,
    metrics: &AgentMetrics,
) -> Result<LaunchSpec, ConfigFileError> {
    let body = tokio::fs::read(path).await.map_err(|source| ConfigFileError::Read { path: path.to_owned(), source })?;
    let config: NodeConfig =
        serde_json::from_slice(&body).map_err(|source| ConfigFileError::Parse { path: path.to_owned(), source })?;
    let compiled =
        Routing::compile(&config).map_err(|source| ConfigFileError::Routing { path: path.to_owned(), source })?;
    let spec = launcher.prepare(&config.monitor).await.map_err(ConfigFileError::Prepare)?;
    *routing.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(compiled);
    let hash = content_hash(&body);
    metrics.config_in_force("file", &hash);
    info!(path = %path.display(), %hash, routes = config.routes.len(), "running the node configuration from a file");
    Ok(spec)
}

/// Follows this node's ConfigMap.
pub struct Reloader {
    pub client: Client,
    pub namespace: String,
    pub node: String,
    pub launcher: Launcher,
    pub builtin: MonitorConfig,
    pub launch: watch::Sender<LaunchSpec>,
    pub routing: SharedRouting,
    pub metrics: AgentMetrics,
}

/// What the reloader runs now.
#[derive(PartialEq, Eq)]
enum InForce {
    Builtin,
    ConfigMap(String),
}

impl Reloader {
    /// Runs until `shutdown`. `initialized` fires once the first state of the ConfigMap
    /// (present or absent) is in force.
    pub async fn run(self, initialized: oneshot::Sender<()>, shutdown: CancellationToken) {
        let name = configmap_name(&self.node);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(api.clone(), config).default_backoff());
        let mut initialized = Some(initialized);
        let mut in_force: Option<InForce> = None;
        let mut seen_in_listing = false;
        info!(configmap = %name, namespace = %self.namespace, "following the node configuration");
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.try_next() => event,
            };
            match event {
                Ok(Some(watcher::Event::Init)) => seen_in_listing = false,
                Ok(Some(watcher::Event::InitApply(cm))) => {
                    seen_in_listing = true;
                    self.apply(&api, &cm, &mut in_force).await;
                }
                Ok(Some(watcher::Event::InitDone)) => {
                    if !seen_in_listing {
                        self.use_builtin(&mut in_force, "no ConfigMap for this node").await;
                    }
                    if let Some(tx) = initialized.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Some(watcher::Event::Apply(cm))) => self.apply(&api, &cm, &mut in_force).await,
                Ok(Some(watcher::Event::Delete(_))) => {
                    self.use_builtin(&mut in_force, "the node's ConfigMap was deleted").await
                }
                Ok(None) => return,
                Err(e) => {
                    warn!(error = %e, "watching the node ConfigMap failed; retrying (the current configuration stays)")
                }
            }
        }
    }

    async fn apply(&self, api: &Api<ConfigMap>, cm: &ConfigMap, in_force: &mut Option<InForce>) {
        let hash = cm.annotations().get(CONFIG_HASH_ANNOTATION).cloned().unwrap_or_default();
        let acked = cm.annotations().get(APPLIED_HASH_ANNOTATION) == Some(&hash);
        if *in_force == Some(InForce::ConfigMap(hash.clone())) {
            if !acked {
                self.acknowledge(api, cm, &hash).await;
            }
            return;
        }
        let parsed = cm
            .data
            .as_ref()
            .and_then(|d| d.get(NODE_CONFIG_KEY))
            .ok_or_else(|| format!("no {NODE_CONFIG_KEY} key"))
            .and_then(|body| serde_json::from_str::<NodeConfig>(body).map_err(|e| format!("{NODE_CONFIG_KEY}: {e}")))
            .and_then(|config| Routing::compile(&config).map(|r| (config, r)).map_err(|e| e.to_string()));
        let (config, routing) = match parsed {
            Ok(ok) => ok,
            Err(reason) => {
                self.metrics.config_reloads.get_or_create(&ResultLabel { result: "invalid" }).inc();
                warn!(configmap = %cm.name_any(), %hash, %reason, "unreadable node configuration; keeping the last good one");
                return;
            }
        };
        let spec = match self.launcher.prepare(&config.monitor).await {
            Ok(spec) => spec,
            Err(e) => {
                self.metrics.config_reloads.get_or_create(&ResultLabel { result: "invalid" }).inc();
                warn!(error = %e, "could not write the neuron-monitor configuration; keeping the last good one");
                return;
            }
        };
        // Routing and monitor switch together: the next report is read under the new table.
        *self.routing.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(routing);
        self.launch.send_replace(spec);
        *in_force = Some(InForce::ConfigMap(hash.clone()));
        self.metrics.config_reloads.get_or_create(&ResultLabel { result: "applied" }).inc();
        self.metrics.config_in_force("configmap", &hash);
        info!(%hash, routes = config.routes.len(), "applied the node configuration");
        self.acknowledge(api, cm, &hash).await;
    }

    async fn use_builtin(&self, in_force: &mut Option<InForce>, why: &str) {
        if *in_force == Some(InForce::Builtin) {
            return;
        }
        match self.launcher.prepare(&self.builtin).await {
            Ok(spec) => {
                *self.routing.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Routing::default());
                self.launch.send_replace(spec);
                *in_force = Some(InForce::Builtin);
                self.metrics.config_in_force("builtin", "");
                info!(reason = why, "running the built-in configuration");
            }
            Err(e) => warn!(error = %e, "could not write the built-in configuration; keeping the current one"),
        }
    }

    /// Tells the operator which content this node runs. A merge patch, not an apply:
    /// it must never create a ConfigMap the operator has just deleted.
    async fn acknowledge(&self, api: &Api<ConfigMap>, cm: &ConfigMap, hash: &str) {
        let patch = json!({ "metadata": { "annotations": { APPLIED_HASH_ANNOTATION: hash } } });
        let params = PatchParams { field_manager: Some(MANAGER.to_owned()), ..Default::default() };
        if let Err(e) = api.patch(&cm.name_any(), &params, &Patch::Merge(&patch)).await {
            warn!(error = %e, %hash, "could not acknowledge the node configuration");
        }
    }
}
