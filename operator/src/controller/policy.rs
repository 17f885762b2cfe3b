//! The tenancy policy in force (`api::tenancy`): the YAML under [`POLICY_KEY`] of a
//! ConfigMap in the operator's namespace (`--tenancy-policy`, which the chart renders
//! from its `tenancy` values), followed through a watch, so an edit is in force at the
//! next pass, within a second, without a restart. The labels of every namespace are
//! watched too (metadata only), for overrides that select namespaces by label.
//!
//! Fail closed: until the ConfigMap has been read, while it is missing, or when it is
//! not valid, the last valid policy stays in force, and the built-in one
//! (`TenancyPolicy::default`) before any. A policy that is not valid is logged, counted
//! (`neuron_operator_tenancy_policy_valid` 0) and announced by a Warning Event on the
//! ConfigMap, naming the field. Without `--tenancy-policy` the built-in policy applies.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use api::tenancy::{PolicySpec, TenancyPolicy};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    core::PartialObjectMeta,
    runtime::{
        events::{Event, EventType, Recorder},
        reflector::{self, ObjectRef, Store},
        watcher, WatchStreamExt,
    },
    Api, Client, Resource, ResourceExt,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{mark_listed, spawn_watch, Listed, WATCH_SECONDS};
use crate::telemetry::OperatorMetrics;
use service::tasks::CriticalTasks;

/// The key of the policy's YAML in its ConfigMap.
pub const POLICY_KEY: &str = "policy.yaml";
/// Bytes of policy YAML read; a ConfigMap holds at most 1 MiB anyway.
const MAX_POLICY_BYTES: usize = 256 * 1024;

/// Where the policy comes from, and the one in force.
pub(super) struct PolicySource {
    /// `namespace/name` of the ConfigMap, for messages; `None`: the built-in policy.
    configmap: Option<ObjectRef<ConfigMap>>,
    configmaps: Option<Store<ConfigMap>>,
    namespaces: Option<Store<PartialObjectMeta<Namespace>>>,
    state: Mutex<InForce>,
}

struct InForce {
    policy: Arc<TenancyPolicy>,
    /// The ConfigMap's resourceVersion last read (valid or not), `Some(None)` when it was
    /// missing; `None` before the first look.
    read: Option<Option<String>>,
}

impl PolicySource {
    /// Starts the watches when a ConfigMap is named; marks the policy listed otherwise.
    pub(super) fn start(
        tasks: &mut CriticalTasks,
        shutdown: &CancellationToken,
        client: &Client,
        namespace: &str,
        configmap: Option<&str>,
        changed: &Arc<Notify>,
        listed: &Arc<watch::Sender<Listed>>,
    ) -> PolicySource {
        let state = Mutex::new(InForce { policy: Arc::new(TenancyPolicy::default()), read: None });
        let Some(name) = configmap else {
            listed.send_modify(|l| (l.policy, l.namespaces) = (true, true));
            return PolicySource { configmap: None, configmaps: None, namespaces: None, state };
        };
        let (configmaps, configmaps_writer) = reflector::store();
        let (namespaces, namespaces_writer) = reflector::store();
        let configmap_api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}")).timeout(WATCH_SECONDS);
        spawn_watch(
            tasks,
            shutdown,
            "tenancy policy",
            changed.clone(),
            mark_listed(listed, |l| l.policy = true),
            reflector::reflector(configmaps_writer, watcher(configmap_api, by_name).default_backoff()),
        );
        spawn_watch(
            tasks,
            shutdown,
            "namespaces",
            changed.clone(),
            mark_listed(listed, |l| l.namespaces = true),
            reflector::reflector(
                namespaces_writer,
                // Metadata only: an `Api` of `PartialObjectMeta` asks for nothing else.
                watcher(
                    Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                    watcher::Config::default().timeout(WATCH_SECONDS),
                )
                .default_backoff()
                .modify(|ns| {
                    ns.managed_fields_mut().clear();
                    ns.annotations_mut().clear();
                }),
            ),
        );
        PolicySource {
            configmap: Some(ObjectRef::new(name).within(namespace)),
            configmaps: Some(configmaps),
            namespaces: Some(namespaces),
            state,
        }
    }

    /// The labels of a namespace (none when unknown).
    pub(super) fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        self.namespaces
            .as_ref()
            .and_then(|store| store.get(&ObjectRef::new(namespace)))
            .map(|ns| ns.labels().clone())
            .unwrap_or_default()
    }

    /// The policy in force, after reading the ConfigMap if it changed.
    pub(super) async fn current(&self, metrics: &OperatorMetrics, recorder: &Recorder) -> Arc<TenancyPolicy> {
        let (Some(store), Some(reference)) = (&self.configmaps, &self.configmap) else {
            metrics.tenancy_policy_valid.set(1);
            return self.state.lock().unwrap_or_else(|p| p.into_inner()).policy.clone();
        };
        let configmap = store.get(reference);
        let version = configmap.as_ref().and_then(|cm| cm.resource_version());
        let mut announce: Option<(Arc<ConfigMap>, String)> = None;
        let policy = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.read.as_ref() != Some(&version) {
                state.read = Some(version);
                match configmap.as_ref().map(|cm| parse(cm)) {
                    None => {
                        metrics.tenancy_policy_valid.set(0);
                        warn!(configmap = %reference, "tenancy policy ConfigMap not found; the last valid policy (or the built-in one) stays in force");
                    }
                    Some(Ok(policy)) => {
                        metrics.tenancy_policy_valid.set(1);
                        info!(configmap = %reference, "tenancy policy in force");
                        state.policy = Arc::new(policy);
                    }
                    Some(Err(e)) => {
                        metrics.tenancy_policy_valid.set(0);
                        warn!(configmap = %reference, error = %e, "tenancy policy not valid; the last valid policy (or the built-in one) stays in force");
                        announce = configmap.clone().map(|cm| (cm, e));
                    }
                }
            }
            state.policy.clone()
        };
        if let Some((cm, error)) = announce {
            let event = Event {
                type_: EventType::Warning,
                reason: "InvalidPolicy".to_owned(),
                note: Some(format!("{error}; the last valid policy stays in force").chars().take(1000).collect()),
                action: "ReadPolicy".to_owned(),
                secondary: None,
            };
            match recorder.publish(&event, &cm.object_ref(&())).await {
                Ok(()) => metrics.wrote("event", "create"),
                Err(e) => warn!(error = %e, "could not publish an event"),
            }
        }
        policy
    }
}

/// The policy of a ConfigMap, or what is wrong with it.
fn parse(configmap: &ConfigMap) -> Result<TenancyPolicy, String> {
    let text = configmap.data.as_ref().and_then(|d| d.get(POLICY_KEY)).ok_or_else(|| format!("no key {POLICY_KEY}"))?;
    if text.len() > MAX_POLICY_BYTES {
        return Err(format!("{POLICY_KEY}: {} bytes, more than {MAX_POLICY_BYTES}", text.len()));
    }
    api::yaml_nesting::check_nesting(text.as_bytes()).map_err(|e| format!("{POLICY_KEY}: {e}"))?;
    let spec: PolicySpec = serde_norway::from_str(text).map_err(|e| format!("{POLICY_KEY}: {e}"))?;
    TenancyPolicy::compile(&spec).map_err(|e| format!("{POLICY_KEY}: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn configmap(data: Option<(&str, String)>) -> ConfigMap {
        ConfigMap { data: data.map(|(k, v)| BTreeMap::from([(k.to_owned(), v)])), ..ConfigMap::default() }
    }

    #[test]
    fn a_policy_is_read_from_its_key_only() {
        assert!(parse(&configmap(Some((POLICY_KEY, "default:\n  regions: [us-east-1]\n".to_owned())))).is_ok());
        let missing = parse(&configmap(Some(("other.yaml", String::new())))).err().unwrap_or_default();
        assert!(missing.contains(POLICY_KEY), "{missing}");
        assert!(parse(&configmap(None)).is_err(), "no data at all");
    }

    #[test]
    fn an_unusable_policy_says_why() {
        let oversized =
            parse(&configmap(Some((POLICY_KEY, "#".repeat(MAX_POLICY_BYTES + 1))))).err().unwrap_or_default();
        assert!(oversized.contains("bytes, more than"), "{oversized}");
        let unknown = parse(&configmap(Some((POLICY_KEY, "defaults: {}\n".to_owned())))).err().unwrap_or_default();
        assert!(unknown.starts_with(POLICY_KEY), "an unknown field: {unknown}");
        let region = parse(&configmap(Some((POLICY_KEY, "default:\n  regions: [\"not a region\"]\n".to_owned()))));
        assert!(region.is_err(), "a rule the policy cannot compile");
    }
}
