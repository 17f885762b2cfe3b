//! Following the ConfigMap the operator renders for this node, through the API (a
//! mounted ConfigMap would take the kubelet 60–90 s to refresh). Its configuration is put
//! in force and the applied hash written back to the ConfigMap, so the operator can count
//! applied nodes (retried until it lands: a fleet acknowledging one change at once can
//! meet the API server's 429s); no ConfigMap means the built-in configuration. An
//! unreadable ConfigMap changes nothing: the last good configuration stays.

use std::{sync::Arc, time::Duration};

use api::names::AGENT_MANAGER;
use api::node_config::{configmap_name, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION, NODE_CONFIG_KEY};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    runtime::watcher::Event,
    Api, Client, ResourceExt,
};
use serde_json::json;
use tokio::{sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{ActivationError, Activator, Candidate, Origin};
use crate::{
    kubernetes::Watch,
    telemetry::{AgentMetrics, ResultLabel},
};

/// Follows this node's ConfigMap.
pub struct Reloader {
    pub client: Client,
    /// See [`crate::kubernetes::DEFAULT_WATCH_TIMEOUT`].
    pub watch_timeout: Duration,
    pub namespace: String,
    pub node: String,
    pub activator: Arc<Activator>,
    pub metrics: AgentMetrics,
}

impl Reloader {
    /// Runs until `shutdown`. `initialized` fires once the first state of the ConfigMap
    /// (present or absent) is in force.
    pub async fn run(self, initialized: oneshot::Sender<()>, shutdown: CancellationToken) {
        let name = configmap_name(&self.node);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let watch = Watch {
            fields: format!("metadata.name={name}"),
            timeout: self.watch_timeout,
            errors: self.metrics.config_watch_errors.clone(),
            what: "the node ConfigMap",
            meanwhile: "the current configuration stays",
        };
        let mut events = std::pin::pin!(watch.events(api.clone(), shutdown));
        let mut initialized = Some(initialized);
        let mut seen_in_listing = false;
        let mut ack = PendingAck::default();
        info!(configmap = %name, namespace = %self.namespace, "following the node configuration");
        while let Some(event) = events.next().await {
            match event {
                Event::Init => seen_in_listing = false,
                Event::InitApply(cm) => {
                    seen_in_listing = true;
                    self.apply(&api, &cm, &mut ack).await;
                }
                Event::InitDone => {
                    if !seen_in_listing {
                        self.use_builtin("no ConfigMap for this node").await;
                    }
                    if let Some(tx) = initialized.take() {
                        let _ = tx.send(());
                    }
                }
                Event::Apply(cm) => self.apply(&api, &cm, &mut ack).await,
                Event::Delete(_) => self.use_builtin("the node's ConfigMap was deleted").await,
            }
        }
    }

    async fn apply(&self, api: &Api<ConfigMap>, cm: &ConfigMap, ack: &mut PendingAck) {
        let hash = cm.annotations().get(CONFIG_HASH_ANNOTATION).cloned().unwrap_or_default();
        let acked = cm.annotations().get(APPLIED_HASH_ANNOTATION) == Some(&hash);
        if self.activator.is_in_force(Origin::ConfigMap, &hash) {
            if !acked {
                self.acknowledge(api, cm, &hash, ack);
            }
            return;
        }
        let body = cm.data.as_ref().and_then(|d| d.get(NODE_CONFIG_KEY)).ok_or(ActivationError::MissingKey);
        let activation = async {
            let candidate = Candidate::parse(body?.as_bytes())?;
            self.activator.activate(Origin::ConfigMap, &hash, candidate).await
        };
        if let Err(e) = activation.await {
            self.metrics.config_reloads.get_or_create(&ResultLabel { result: "invalid" }).inc();
            warn!(configmap = %cm.name_any(), %hash, error = %e, "node configuration not applied; keeping the last good one");
            return;
        }
        self.metrics.config_reloads.get_or_create(&ResultLabel { result: "applied" }).inc();
        self.acknowledge(api, cm, &hash, ack);
    }

    async fn use_builtin(&self, why: &str) {
        if self.activator.is_in_force(Origin::Builtin, "") {
            return;
        }
        match self.activator.activate_builtin().await {
            Ok(()) => info!(reason = why, "running the built-in configuration"),
            Err(e) => warn!(error = %e, "could not write the built-in configuration; keeping the current one"),
        }
    }

    /// Tells the operator which content this node runs. A merge patch, not an apply:
    /// it must never create a ConfigMap the operator has just deleted. Sent from a task of
    /// its own and retried with backoff until it lands, the ConfigMap is gone, or a newer
    /// acknowledgement replaces it: nothing else would send it again before the next
    /// change, and the node would be counted as not applied until then.
    fn acknowledge(&self, api: &Api<ConfigMap>, cm: &ConfigMap, hash: &str, pending: &mut PendingAck) {
        let (api, name, hash) = (api.clone(), cm.name_any(), hash.to_owned());
        let failures = self.metrics.config_ack_failures.clone();
        pending.replace(tokio::spawn(async move {
            let patch = json!({ "metadata": { "annotations": { APPLIED_HASH_ANNOTATION: hash } } });
            let params = PatchParams { field_manager: Some(AGENT_MANAGER.to_owned()), ..Default::default() };
            let mut delay = ACK_RETRY_FIRST;
            loop {
                match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(e)) if e.code == 404 => return,
                    Err(e) => {
                        failures.inc();
                        // Jittered over its upper half: a fleet refused together retries apart.
                        let wait = delay.mul_f64(0.5 + fastrand::f64() / 2.0);
                        warn!(error = %e, %hash, retry_in_ms = wait.as_millis() as u64,
                              "could not acknowledge the node configuration; retrying");
                        tokio::time::sleep(wait).await;
                        delay = (delay * 2).min(ACK_RETRY_MAX);
                    }
                }
            }
        }));
    }
}

/// First and longest wait before an acknowledgement is sent again.
const ACK_RETRY_FIRST: Duration = Duration::from_millis(500);
const ACK_RETRY_MAX: Duration = Duration::from_secs(30);

/// The acknowledgement being sent: replaced by a newer one, stopped with the follower.
#[derive(Default)]
struct PendingAck(Option<JoinHandle<()>>);

impl PendingAck {
    fn replace(&mut self, task: JoinHandle<()>) {
        if let Some(previous) = self.0.replace(task) {
            previous.abort();
        }
    }
}

impl Drop for PendingAck {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}
