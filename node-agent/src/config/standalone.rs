//! NeuronMonitorConfig documents from a YAML file, for a host without Kubernetes
//! (`--config FILE`): the documents users `kubectl apply`, checked by the operator's
//! validation and rendered for this host by its renderer ([`api::validate`],
//! [`api::render`]), so a file means on a host what it means in a cluster.
//!
//! Without pods there are no namespaces to scope by: every document acts as a config of
//! the operator's namespace, so it sees every application of the host (routing by tag
//! filter only) and may collect the system groups. A `nodeSelector` has nothing to
//! select on one host and is refused, like any other invalid field: the agent never
//! runs part of a file. [`Follower`] re-reads the file when it changes; a bad edit keeps
//! the last good configuration in force (logged, `neuron_agent_config_reloads_total{result="invalid"}`).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use api::{
    crd::NeuronMonitorConfig,
    limits::MAX_CONFIGS_PER_NODE,
    render::{render_all, RenderedNode},
    validate::{validate, ConfigKey, ValidConfig},
    yaml_nesting::check_nesting,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{read_config_file, Activator, Candidate, ConfigFileError, Origin};
use crate::telemetry::{AgentMetrics, ResultLabel};

/// How often the file's metadata is checked for a change: a saved edit is in force
/// within this plus the reload itself (a few milliseconds).
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The name rendering gives this host (a node name is required; nothing shows it).
const HOST: &str = "localhost";

/// The documents of a configuration file, validated and rendered for this host.
pub fn render_file(path: &Path, body: &[u8]) -> Result<RenderedNode, ConfigFileError> {
    let document_error =
        |document: String, reason: String| ConfigFileError::Document { path: path.to_owned(), document, reason };
    // Before the parser: its cost grows with the square of the nesting.
    check_nesting(body).map_err(|e| ConfigFileError::TooDeep { path: path.to_owned(), too_deep: e })?;
    let mut configs: Vec<ValidConfig> = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_slice(body).enumerate() {
        let number = index + 1;
        // Checked before the document is read: a file of thousands of small documents
        // must not cost thousands of validations.
        if configs.len() == MAX_CONFIGS_PER_NODE {
            let reason = format!("more than {MAX_CONFIGS_PER_NODE} configs: a node runs at most that many");
            return Err(document_error(number.to_string(), reason));
        }
        let value = serde_norway::Value::deserialize(document)
            .map_err(|e| document_error(number.to_string(), e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let config = parse_document(value).map_err(|reason| document_error(number.to_string(), reason))?;
        let name = format!(
            "{number} ({}/{})",
            config.metadata.namespace.as_deref().unwrap_or(""),
            config.metadata.name.as_deref().unwrap_or("")
        );
        if config.spec.node_selector.is_some() {
            let reason = "spec.nodeSelector: selects nodes of a cluster; without Kubernetes every config runs on this host: remove it";
            return Err(document_error(name, reason.to_owned()));
        }
        // Each document acts as a config of the operator's namespace (see the module doc).
        let namespace = config.metadata.namespace.clone().unwrap_or_default();
        let valid = validate(&config, &namespace).map_err(|e| document_error(name.clone(), e.to_string()))?;
        if configs.iter().any(|c| c.key == valid.key) {
            return Err(document_error(name, format!("a second config named {}", valid.key)));
        }
        configs.push(valid);
    }
    if configs.is_empty() {
        return Err(ConfigFileError::Empty { path: path.to_owned() });
    }
    let host = (HOST.to_owned(), Default::default());
    let rendering = render_all(std::iter::once(&host), &configs)
        .map_err(|e| ConfigFileError::Activation { path: path.to_owned(), source: e.into() })?;
    if let Some((key, invalid)) = rendering.refused().iter().next() {
        return Err(document_error(document_of(&configs, key), invalid.to_string()));
    }
    let rendered = rendering.rendered(HOST).cloned();
    rendered.ok_or_else(|| ConfigFileError::Empty { path: path.to_owned() })
}

/// One document as a NeuronMonitorConfig: its kind and API version checked, its
/// namespace `default` when absent (as `kubectl apply` does).
fn parse_document(value: serde_norway::Value) -> Result<NeuronMonitorConfig, String> {
    let field = |name: &str| value.get(name).and_then(serde_norway::Value::as_str).unwrap_or("").to_owned();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let wanted_version = <NeuronMonitorConfig as kube::Resource>::api_version(&());
    let wanted_kind = <NeuronMonitorConfig as kube::Resource>::kind(&());
    if api_version != wanted_version || kind != wanted_kind {
        return Err(format!("apiVersion/kind: {api_version:?}/{kind:?} is not {wanted_version}/{wanted_kind}"));
    }
    // The path names the field (`spec.runtimes[0].metrics`), as the API server would.
    let mut config: NeuronMonitorConfig =
        serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    config.metadata.namespace.get_or_insert_with(|| "default".to_owned());
    Ok(config)
}

fn document_of(configs: &[ValidConfig], key: &ConfigKey) -> String {
    let number = configs.iter().position(|c| &c.key == key).map_or(0, |i| i + 1);
    format!("{number} ({key})")
}

/// Reads, renders and puts in force the configuration file at `path`.
pub async fn activate_file(activator: &Activator, path: &Path) -> Result<(), ConfigFileError> {
    let body = read_config_file(path).await?;
    let rendered = render_file(path, &body)?;
    if activator.is_in_force(Origin::Config, &rendered.hash) {
        return Ok(()); // touched, or saved without a change that matters
    }
    let activation =
        async { activator.activate(Origin::Config, &rendered.hash, Candidate::new(rendered.config)?).await };
    activation.await.map_err(|source| ConfigFileError::Activation { path: path.to_owned(), source })
}

/// Follows the configuration file: a change of its size, modification time or inode
/// (an editor that renames a new file over it) is read within [`POLL_INTERVAL`].
pub struct Follower {
    pub path: PathBuf,
    pub activator: Arc<Activator>,
    pub metrics: AgentMetrics,
}

/// What identifies a version of the file without reading it.
type Stamp = Option<(u64, u64, Option<SystemTime>)>;

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Some((meta.ino(), meta.len(), meta.modified().ok()))
}

impl Follower {
    /// Runs until `shutdown`; the file was put in force once before.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut seen: Stamp = tokio::fs::metadata(&self.path).await.ok().as_ref().and_then(stamp);
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(path = %self.path.display(), "following the configuration file");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = tokio::fs::metadata(&self.path).await.ok().as_ref().and_then(stamp);
            if now == seen {
                continue;
            }
            seen = now;
            self.reload().await;
        }
    }

    async fn reload(&self) {
        match activate_file(&self.activator, &self.path).await {
            Ok(()) => {
                self.metrics.config_reloads.get_or_create(&ResultLabel { result: "applied" }).inc();
            }
            Err(e) => {
                self.metrics.config_reloads.get_or_create(&ResultLabel { result: "invalid" }).inc();
                warn!(error = %e, "configuration file not applied; keeping the last good configuration");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str) -> String {
        format!("apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: {name}, namespace: ops }}\nspec: {{}}\n")
    }

    #[test]
    fn a_file_may_hold_as_many_configs_as_a_node_runs_and_no_more() {
        let file = |n: usize| (0..n).map(|i| doc(&format!("c{i}"))).collect::<Vec<_>>().join("---\n");
        let path = Path::new("configs.yaml");
        let rendered = render_file(path, file(3).as_bytes()).expect("three configs");
        assert_eq!(rendered.config.routes.len(), 3);
        let err = render_file(path, file(MAX_CONFIGS_PER_NODE + 1).as_bytes()).expect_err("one too many");
        let text = err.to_string();
        assert!(text.contains(&format!("document {}", MAX_CONFIGS_PER_NODE + 1)), "{text}");
        assert!(text.contains("more than 512 configs"), "{text}");
    }

    /// Issue 24, fault 7: a deeply nested file is refused before the parser sees it (the
    /// parser's cost grows with the square of the nesting: minutes for 400 KB).
    #[test]
    fn a_deeply_nested_file_is_refused_at_once_naming_the_limit() {
        let levels = 200_000;
        let body =
            format!("{}spec: {}1{}\n", doc("deep").replace("spec: {}\n", ""), "[".repeat(levels), "]".repeat(levels));
        let started = std::time::Instant::now();
        let err = render_file(Path::new("deep.yaml"), body.as_bytes()).expect_err("too deep");
        let took = started.elapsed();
        let text = err.to_string();
        assert!(text.contains("deep.yaml: line 4: nested deeper than 64 levels"), "{text}");
        assert!(took < Duration::from_millis(500), "refused after {took:?}");
        let block = format!("{}spec:\n  x: {}1\n", doc("deep").replace("spec: {}\n", ""), "- ".repeat(levels));
        assert!(
            render_file(Path::new("deep.yaml"), block.as_bytes()).is_err_and(|e| e.to_string().contains("64 levels"))
        );
    }
}
