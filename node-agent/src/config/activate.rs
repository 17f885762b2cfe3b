//! Putting a node configuration in force: the built-in one, a file's or the ConfigMap's
//! all go through [`Activator`], which writes neuron-monitor's configuration file, hands
//! neuron-monitor's supervisor the new launch spec and swaps the routing table, together,
//! so the next report is read under the new table, and sends its health settings and its
//! GPU period to their followers. A configuration that fails any step changes nothing.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use api::{
    gpu_groups::GpuGroups,
    monitor_config::{MonitorConfig, DEFAULT_PERIOD},
    node_config::{content_hash, NodeConfig, NodeGpu, NodeHealth, NODE_CONFIG_KEY},
};
use tokio::{io::AsyncReadExt, sync::watch};
use tracing::{info, warn};

use super::Launcher;
use crate::{
    gpu::GpuCollection,
    health::settings::{self, HealthDefaults, HealthSettings, SettingsReceiver},
    monitor::LaunchSpec,
    routing::{RefusedRoute, Routing, RoutingError, SharedRouting},
    telemetry::{AgentMetrics, ReasonLabel},
};

/// Where the configuration in force comes from: the `source` label of
/// `neuron_agent_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Builtin,
    /// A rendered node configuration (`--node-config-file`).
    File,
    /// NeuronMonitorConfig documents (`--config`), rendered by the agent.
    Config,
    ConfigMap,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Builtin => "builtin",
            Origin::File => "file",
            Origin::Config => "config",
            Origin::ConfigMap => "configmap",
        }
    }
}

/// Why a node configuration was not put in force (the one in force stays).
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("no {NODE_CONFIG_KEY} key")]
    MissingKey,
    #[error("not a rendered node configuration: {0}")]
    Parse(#[from] serde_json::Error),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error("writing the neuron-monitor configuration: {0}")]
    Write(#[from] std::io::Error),
}

/// Why a configuration file (`--node-config-file`, `--config`) cannot be run; the
/// configuration in force stays.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is {size} bytes; a configuration file may have at most {MAX_CONFIG_FILE_BYTES}")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path}: document {document}: {reason}")]
    Document { path: PathBuf, document: String, reason: String },
    #[error("{path}: {too_deep}")]
    TooDeep { path: PathBuf, too_deep: api::yaml_nesting::TooDeep },
    #[error("{path}: no NeuronMonitorConfig document")]
    Empty { path: PathBuf },
    #[error("{path}: {source}")]
    Activation { path: PathBuf, source: ActivationError },
}

/// Largest configuration file read: far beyond what a node needs (its whole rendering
/// is bounded by `api::limits::MAX_NODE_RENDERED_BYTES`), small enough that reading it
/// never weighs on the agent.
pub const MAX_CONFIG_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The content of a configuration file, refused beyond [`MAX_CONFIG_FILE_BYTES`].
pub async fn read_config_file(path: &Path) -> Result<Vec<u8>, ConfigFileError> {
    let too_large = |size| ConfigFileError::TooLarge { path: path.to_owned(), size };
    let file = tokio::fs::File::open(path).await;
    let file = file.map_err(|source| ConfigFileError::Read { path: path.to_owned(), source })?;
    let mut body = Vec::new();
    // One byte more than allowed tells a file that is too large (or grew meanwhile).
    let read = file.take(MAX_CONFIG_FILE_BYTES + 1).read_to_end(&mut body).await;
    read.map_err(|source| ConfigFileError::Read { path: path.to_owned(), source })?;
    if body.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(too_large(body.len() as u64));
    }
    Ok(body)
}

/// A rendered node configuration (the JSON the operator writes under
/// [`NODE_CONFIG_KEY`]), parsed and its routing compiled: ready to be put in force.
pub struct Candidate {
    monitor: MonitorConfig,
    routing: Routing,
    routes: usize,
    health: Option<NodeHealth>,
    gpu: Option<NodeGpu>,
}

impl Candidate {
    pub fn parse(body: &[u8]) -> Result<Self, ActivationError> {
        Candidate::new(serde_json::from_slice(body)?)
    }

    pub fn new(config: NodeConfig) -> Result<Self, ActivationError> {
        let routing = Routing::compile(&config)?;
        let NodeConfig { monitor, routes, health, gpu } = config;
        Ok(Candidate { monitor, routing, routes: routes.len(), health, gpu })
    }
}

/// The GPU collection under a node configuration's GPU settings (`None`: off); without
/// any, every group at the built-in configuration's period (the agent's `--period`).
fn gpu_collection(gpu: Option<NodeGpu>, builtin: &MonitorConfig) -> Option<GpuCollection> {
    match gpu {
        Some(NodeGpu { enabled: false, .. }) => None,
        Some(NodeGpu { period, groups, .. }) => Some(GpuCollection { period: period.into(), groups }),
        None => Some(GpuCollection { period: builtin.period.unwrap_or(DEFAULT_PERIOD).into(), groups: GpuGroups::ALL }),
    }
}

/// Puts node configurations in force, and knows which one is.
pub struct Activator {
    launcher: Launcher,
    builtin: MonitorConfig,
    launch: watch::Sender<LaunchSpec>,
    routing: SharedRouting,
    metrics: AgentMetrics,
    in_force: Mutex<(Origin, String)>,
    health_defaults: HealthDefaults,
    health: watch::Sender<HealthSettings>,
    /// The GPU collection; `None`: off.
    gpu: watch::Sender<Option<GpuCollection>>,
}

impl Activator {
    /// Starts on the built-in configuration `builtin`, with the health settings of the
    /// flags. The receiver is for neuron-monitor's supervisor: it sees each new launch
    /// spec, and the end of the agent when the activator is dropped.
    pub async fn start(
        launcher: Launcher,
        builtin: MonitorConfig,
        health_defaults: HealthDefaults,
        metrics: AgentMetrics,
    ) -> Result<(Self, watch::Receiver<LaunchSpec>), ActivationError> {
        let spec = launcher.prepare(&builtin, None).await?;
        let (launch, specs) = watch::channel(spec);
        let routing = SharedRouting::default();
        metrics.config_in_force(Origin::Builtin.as_str(), "");
        let in_force = Mutex::new((Origin::Builtin, String::new()));
        let (health, _) = settings::channel(&health_defaults);
        let (gpu, _) = watch::channel(gpu_collection(None, &builtin));
        let activator =
            Activator { launcher, builtin, launch, routing, metrics, in_force, health_defaults, health, gpu };
        Ok((activator, specs))
    }

    /// The health settings of the configuration in force, followed as it changes.
    pub fn health_settings(&self) -> SettingsReceiver {
        self.health.subscribe()
    }

    /// The GPU collection of the configuration in force (`None`: off), followed as it
    /// changes.
    pub fn gpu_collection(&self) -> watch::Receiver<Option<GpuCollection>> {
        self.gpu.subscribe()
    }

    /// The routing table of the configuration in force, as the sinks read it.
    pub fn routing(&self) -> SharedRouting {
        self.routing.clone()
    }

    /// Whether the configuration from `origin` with this hash is the one in force.
    pub fn is_in_force(&self, origin: Origin, hash: &str) -> bool {
        let in_force = self.in_force.lock().unwrap_or_else(|p| p.into_inner());
        in_force.0 == origin && in_force.1 == hash
    }

    /// Back to the built-in configuration (every group, Prometheus only).
    pub async fn activate_builtin(&self) -> Result<(), ActivationError> {
        let builtin = self.builtin.clone();
        self.put_in_force(Origin::Builtin, "", &builtin, Routing::default(), None, None).await
    }

    /// Puts a rendered configuration in force; `hash` names its content.
    pub async fn activate(&self, origin: Origin, hash: &str, candidate: Candidate) -> Result<(), ActivationError> {
        let Candidate { monitor, routing, routes, health, gpu } = candidate;
        let refused = routing.refused().to_vec();
        self.put_in_force(origin, hash, &monitor, routing, health.as_ref(), gpu).await?;
        info!(source = origin.as_str(), %hash, routes, refused = refused.len(), "node configuration in force");
        self.record_refused(&refused);
        Ok(())
    }

    /// Counts and logs, once per configuration put in force, the routes left out of it.
    fn record_refused(&self, refused: &[RefusedRoute]) {
        for route in refused {
            self.metrics.routes_refused.get_or_create(&ReasonLabel { reason: route.reason }).inc();
            warn!(config = %route.config, reason = route.reason, detail = %route.detail,
                  "route left out of the node configuration: its applications are not exported for it");
        }
    }

    /// Puts the rendered configuration of a file in force (read once).
    pub async fn activate_file(&self, path: &Path) -> Result<(), ConfigFileError> {
        let body = read_config_file(path).await?;
        let activation = async { self.activate(Origin::File, &content_hash(&body), Candidate::parse(&body)?).await };
        activation.await.map_err(|source| ConfigFileError::Activation { path: path.to_owned(), source })
    }

    async fn put_in_force(
        &self,
        origin: Origin,
        hash: &str,
        monitor: &MonitorConfig,
        routing: Routing,
        health: Option<&NodeHealth>,
        gpu: Option<NodeGpu>,
    ) -> Result<(), ActivationError> {
        let in_force = self.launch.borrow().clone();
        let spec = self.launcher.prepare(monitor, Some(&in_force)).await?;
        self.routing.replace(routing);
        // Only a new spec restarts neuron-monitor: a change of routes or sinks alone does not.
        self.launch.send_if_modified(|current| {
            let changed = *current != spec;
            *current = spec;
            changed
        });
        let settings = self.health_defaults.resolve(health);
        // Only a change wakes the followers (a new route alone is not one for them).
        self.health.send_if_modified(|current| {
            let changed = *current != settings;
            if changed {
                info!(config = ?settings.config, condition_type = %settings.condition_type,
                      taint = settings.taint_errors.is_some(), logs = ?settings.logs.as_ref().map(|l| &l.group),
                      "health settings in force");
                *current = settings;
            }
            changed
        });
        let gpu = gpu_collection(gpu, &self.builtin);
        self.gpu.send_if_modified(|current| {
            let changed = *current != gpu;
            if changed {
                info!(
                    period_ms = gpu.map(|c| c.period.as_millis() as u64),
                    groups = ?gpu.map(|c| c.groups),
                    enabled = gpu.is_some(),
                    "GPU collection in force"
                );
                *current = gpu;
            }
            changed
        });
        self.metrics.config_in_force(origin.as_str(), hash);
        *self.in_force.lock().unwrap_or_else(|p| p.into_inner()) = (origin, hash.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use api::{duration::Period, gpu_groups::GpuGroup};

    use super::*;

    #[test]
    fn the_gpu_collection_is_the_configurations_else_the_built_in_one_and_none_when_off() {
        let builtin = MonitorConfig::all_groups(Period::from_secs(7));
        let period = |gpu, builtin: &MonitorConfig| gpu_collection(gpu, builtin).map(|c| c.period);
        assert_eq!(period(None, &builtin), Some(Duration::from_secs(7)));
        assert_eq!(period(None, &MonitorConfig::default()), Some(Duration::from_secs(5)));
        assert_eq!(gpu_collection(None, &builtin).map(|c| c.groups), Some(GpuGroups::ALL));
        let pcie: GpuGroups = [GpuGroup::Pcie].into_iter().collect();
        let on = NodeGpu { enabled: true, period: Period::from_secs(30), groups: pcie };
        assert_eq!(
            gpu_collection(Some(on), &builtin),
            Some(GpuCollection { period: Duration::from_secs(30), groups: pcie })
        );
        assert_eq!(period(Some(NodeGpu { enabled: false, ..on }), &builtin), None);
    }

    #[tokio::test]
    async fn the_gpu_period_follows_the_configuration_in_force() {
        let state_dir = std::env::temp_dir().join(format!("nm-activate-gpu-{}", std::process::id()));
        tokio::fs::create_dir_all(&state_dir).await.unwrap();
        let metrics = AgentMetrics::register(&mut prometheus_client::registry::Registry::default());
        let launcher = Launcher {
            program: "neuron-monitor".into(),
            args: Vec::new(),
            state_dir: state_dir.clone(),
            silence_timeout: None,
            refused_files: metrics.state_files_refused.clone(),
            k8s_info: false,
            in_memory: Default::default(),
        };
        let health = HealthDefaults { condition_type: "NeuronHealth".into(), kmsg_look_back: Duration::from_secs(300) };
        let builtin = MonitorConfig::all_groups(Period::from_secs(7));
        let (activator, _specs) = Activator::start(launcher, builtin, health, metrics).await.unwrap();
        let mut gpu = activator.gpu_collection();
        let period = |c: &Option<GpuCollection>| c.map(|c| c.period);
        assert_eq!(period(&gpu.borrow_and_update()), Some(Duration::from_secs(7)), "the built-in period at first");

        let off = br#"{"monitor":{},"routes":[],"gpu":{"enabled":false,"period":"1m"}}"#;
        activator.activate(Origin::File, "off", Candidate::parse(off).unwrap()).await.unwrap();
        assert!(gpu.has_changed().unwrap());
        assert_eq!(period(&gpu.borrow_and_update()), None, "switched off");

        let fast = br#"{"monitor":{},"routes":[],"gpu":{"enabled":true,"period":"2s"}}"#;
        activator.activate(Origin::File, "fast", Candidate::parse(fast).unwrap()).await.unwrap();
        assert_eq!(period(&gpu.borrow_and_update()), Some(Duration::from_secs(2)));
        // The same settings again wake nobody.
        activator.activate(Origin::File, "fast-again", Candidate::parse(fast).unwrap()).await.unwrap();
        assert!(!gpu.has_changed().unwrap());
        // Fewer groups at the same period is a change.
        let fewer = br#"{"monitor":{},"routes":[],"gpu":{"enabled":true,"period":"2s","groups":["nvlink"]}}"#;
        activator.activate(Origin::File, "fewer", Candidate::parse(fewer).unwrap()).await.unwrap();
        assert_eq!(gpu.borrow_and_update().map(|c| c.groups), Some([GpuGroup::Nvlink].into_iter().collect()));

        activator.activate_builtin().await.unwrap();
        assert_eq!(period(&gpu.borrow_and_update()), Some(Duration::from_secs(7)), "back to the built-in period");
        let _ = tokio::fs::remove_dir_all(&state_dir).await;
    }

    #[test]
    fn a_rendered_configuration_carries_its_gpu_settings_to_the_candidate() {
        let body = br#"{"monitor":{},"routes":[],"gpu":{"enabled":false,"period":"1m"}}"#;
        let candidate = Candidate::parse(body).unwrap();
        assert_eq!(
            candidate.gpu,
            Some(NodeGpu { enabled: false, period: Period::from_secs(60), groups: GpuGroups::ALL })
        );
        assert_eq!(Candidate::parse(br#"{"monitor":{},"routes":[]}"#).unwrap().gpu, None);
    }
}
