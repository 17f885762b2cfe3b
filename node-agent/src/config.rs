//! The node's configuration: the built-in one, or the ConfigMap the operator renders
//! for this node, watched through the API (a mounted ConfigMap would take the kubelet
//! 60–90 s to refresh). A new configuration is written to a file named by its hash,
//! neuron-monitor is restarted on it, the routing table is swapped, and the applied
//! hash is written back to the ConfigMap so the operator can count applied nodes.
//! An unreadable ConfigMap changes nothing: the last good configuration stays.
//!
//! The state directory holds only what the agent writes. It must be a directory of the
//! agent's user (or root's), never a symbolic link; files in it are written through a
//! fresh temporary file and a rename, and a file the agent did not make (a link, another
//! user's) is neither followed nor deleted.

use std::{
    os::unix::fs::MetadataExt,
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
use prometheus_client::metrics::counter::Counter;
use serde_json::json;
use tokio::{
    io::AsyncWriteExt,
    sync::{oneshot, watch},
};
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
    /// Checked by [`check_state_dir`].
    pub state_dir: PathBuf,
    /// Fixed silence limit; default: three periods of the fastest group, at least 2 s.
    pub silence_timeout: Option<Duration>,
    /// Counts files of the state directory left alone (`neuron_agent_state_files_refused`).
    pub refused_files: Counter,
}

impl Launcher {
    /// Writes `config` to `<state dir>/neuron-monitor-<hash>.json` (removing older
    /// files) and returns the spec that runs neuron-monitor on it.
    pub async fn prepare(&self, config: &MonitorConfig) -> std::io::Result<LaunchSpec> {
        let body = serde_json::to_vec_pretty(config).map_err(std::io::Error::other)?;
        let name = format!("neuron-monitor-{}.json", content_hash(&body));
        // Again before each write: the directory may have been replaced since the start.
        check_state_dir(&self.state_dir).await.map_err(std::io::Error::other)?;
        let path = self.state_dir.join(&name);
        write_file(&self.state_dir, &name, &body).await?;
        self.remove_other_configs(&name).await;
        let silence_limit = self
            .silence_timeout
            .unwrap_or_else(|| (config.shortest_period().as_duration() * 3).max(Duration::from_secs(2)));
        let mut args = self.args.clone();
        args.extend(["-c".to_owned(), path.display().to_string()]);
        Ok(LaunchSpec { program: self.program.clone(), args, silence_limit })
    }

    /// Deletes the agent's older configurations (and temporary files); refuses (counts, logs) what it did not
    /// write. Deleting removes a directory entry, never what a link points to.
    async fn remove_other_configs(&self, keep: &str) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.state_dir).await else { return };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let config = name.starts_with("neuron-monitor-") && name.ends_with(".json");
            // Left by an agent that died while writing.
            let partial = name.starts_with(".neuron-monitor-") && name.ends_with(".partial");
            if !(config || partial) || name == keep {
                continue;
            }
            // Of the entry itself: a symbolic link is not followed.
            match entry.metadata().await {
                Ok(meta) if meta.file_type().is_file() && meta.uid() == agent_uid() => {
                    let _ = tokio::fs::remove_file(entry.path()).await;
                }
                Ok(meta) => {
                    self.refused_files.inc();
                    warn!(
                        file = %entry.path().display(),
                        kind = file_kind(&meta),
                        owner = meta.uid(),
                        "left alone a file of the state directory the agent did not write"
                    );
                }
                Err(_) => {}
            }
        }
    }
}

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("state directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "state directory {path} is a symbolic link: give the directory itself (the agent never follows a link there)"
    )]
    Symlink { path: PathBuf },
    #[error("state directory {path} is not a directory but a {kind}")]
    NotADirectory { path: PathBuf, kind: &'static str },
    #[error("state directory {path} is owned by uid {owner}, not by the agent's user (uid {agent}) or root")]
    ForeignOwner { path: PathBuf, owner: u32, agent: u32 },
}

/// Creates the state directory when missing (mode 0700, its parents as usual) and
/// checks it: a directory, not a symbolic link, owned by the agent's user or by root
/// (a Kubernetes emptyDir is root's; root could replace the agent anyway).
pub async fn open_state_dir(path: &Path) -> Result<(), StateDirError> {
    let io = |source| StateDirError::Io { path: path.to_owned(), source };
    if let Err(e) = tokio::fs::symlink_metadata(path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io(e));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent).await.map_err(io)?;
        }
        let mut builder = tokio::fs::DirBuilder::new();
        builder.mode(0o700);
        match builder.create(path).await {
            Ok(()) => {}
            // Made meanwhile by someone else: checked below like any existing one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    check_state_dir(path).await
}

/// The checks of [`open_state_dir`] on an existing directory.
pub async fn check_state_dir(path: &Path) -> Result<(), StateDirError> {
    let meta = tokio::fs::symlink_metadata(path)
        .await
        .map_err(|source| StateDirError::Io { path: path.to_owned(), source })?;
    let path = path.to_owned();
    if meta.file_type().is_symlink() {
        return Err(StateDirError::Symlink { path });
    }
    if !meta.is_dir() {
        return Err(StateDirError::NotADirectory { path, kind: file_kind(&meta) });
    }
    let agent = agent_uid();
    if meta.uid() != agent && meta.uid() != 0 {
        return Err(StateDirError::ForeignOwner { path, owner: meta.uid(), agent });
    }
    Ok(())
}

fn agent_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// Writes `dir/name` atomically without following any link: a new temporary file of a
/// random name (O_CREAT|O_EXCL|O_NOFOLLOW: a planted link fails it), then a rename over
/// `name` (which replaces a link there rather than writing through it).
async fn write_file(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..8 {
        let partial = dir.join(format!(".{name}.{:016x}.partial", fastrand::u64(..)));
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW);
        let mut file = match options.open(&partial).await {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = async {
            file.write_all(body).await?;
            file.flush().await?;
            drop(file);
            tokio::fs::rename(&partial, dir.join(name)).await
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        return written;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
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

/// Server-side duration of each call of the agent's watches (its ConfigMap, its pods),
/// by default. A quiet call ends normally and is resumed from its resource version (no
/// new listing); a call that stays silent 5 s longer is taken for a dead connection and
/// renewed. Each node then makes 2 watch requests per period: 100 per second per 1,000
/// nodes at 20 s, served from the API server's watch cache.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Follows this node's ConfigMap.
pub struct Reloader {
    pub client: Client,
    /// See [`DEFAULT_WATCH_TIMEOUT`].
    pub watch_timeout: Duration,
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
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(self.watch_timeout.as_secs().try_into().unwrap_or(u32::MAX));
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
                    self.metrics.config_watch_errors.inc();
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
