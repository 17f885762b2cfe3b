//! The pods of this node, from a watch of the API restricted to `spec.nodeName=<node>`:
//! namespace, pod and container names by container ID, by pod UID and by name. Only
//! what the labels need is kept; pods that have finished (phase Succeeded or Failed)
//! or were deleted leave the index, so they are credited with nothing.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::{runtime::watcher::Event, Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::AttributionMetrics;
use crate::{kubernetes::Watch, state::PodRef};

/// The pod index shared by the watch (writer) and the report path (reader).
pub type SharedPods = Arc<RwLock<PodIndex>>;

/// Pod labels exported as metric labels: (pod label key, metric label name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLabelKeys(Vec<(String, String)>);

impl PodLabelKeys {
    /// Keeps the first key of each metric label name, in the order given.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Self {
        let mut out: Vec<(String, String)> = Vec::new();
        for key in keys.iter().map(|k| k.as_ref().trim()).filter(|k| !k.is_empty()) {
            let name = metric_label_name(key);
            if !out.iter().any(|(_, n)| *n == name) {
                out.push((key.to_owned(), name));
            }
        }
        PodLabelKeys(out)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `app.kubernetes.io/name` → `label_app_kubernetes_io_name`, as kube-state-metrics does.
pub fn metric_label_name(key: &str) -> String {
    let mut name = String::with_capacity(key.len() + 6);
    name.push_str("label_");
    name.extend(key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }));
    name
}

/// What the agent keeps of one pod.
#[derive(Clone, Debug, PartialEq)]
struct PodEntry {
    namespace: String,
    name: String,
    /// Container name empty: a process in the pod whose container is not (yet) known.
    pod_level: Arc<PodRef>,
    /// One per container of the spec (app, init and ephemeral), by name.
    containers: Vec<Arc<PodRef>>,
    /// Container IDs from the statuses, without the `<runtime>://` scheme.
    ids: Vec<(String, Arc<PodRef>)>,
}

impl PodEntry {
    /// `None` for a pod that has finished or lacks its identity.
    fn from_pod(pod: &Pod, keys: &PodLabelKeys) -> Option<(String, PodEntry)> {
        let meta = &pod.metadata;
        let (uid, namespace, name) = (meta.uid.as_ref()?, meta.namespace.as_ref()?, meta.name.as_ref()?);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let labels: Vec<(String, String)> = keys
            .0
            .iter()
            .filter_map(|(key, label)| meta.labels.as_ref()?.get(key).map(|v| (label.clone(), v.clone())))
            .collect();
        let owner = workload_name(pod);
        let pod_ref = |container: &str| {
            Arc::new(PodRef {
                namespace: namespace.clone(),
                pod: name.clone(),
                owner: owner.clone(),
                container: container.to_owned(),
                labels: labels.clone(),
            })
        };
        let mut containers: Vec<Arc<PodRef>> = Vec::new();
        if let Some(spec) = &pod.spec {
            let names = spec
                .containers
                .iter()
                .map(|c| c.name.as_str())
                .chain(spec.init_containers.iter().flatten().map(|c| c.name.as_str()))
                .chain(spec.ephemeral_containers.iter().flatten().map(|c| c.name.as_str()));
            for container in names {
                if !containers.iter().any(|c| c.container == container) {
                    containers.push(pod_ref(container));
                }
            }
        }
        let mut ids = Vec::new();
        if let Some(status) = &pod.status {
            let statuses: [&Option<Vec<ContainerStatus>>; 3] =
                [&status.container_statuses, &status.init_container_statuses, &status.ephemeral_container_statuses];
            for cs in statuses.into_iter().flatten().flatten() {
                let Some(id) = cs.container_id.as_deref().and_then(strip_scheme) else {
                    continue;
                };
                let container = match containers.iter().find(|c| c.container == cs.name) {
                    Some(c) => c.clone(),
                    None => {
                        let c = pod_ref(&cs.name);
                        containers.push(c.clone());
                        c
                    }
                };
                ids.push((id.to_owned(), container));
            }
        }
        let entry =
            PodEntry { namespace: namespace.clone(), name: name.clone(), pod_level: pod_ref(""), containers, ids };
        Some((uid.clone(), entry))
    }
}

/// The workload a pod belongs to, as Container Insights names it: the Deployment of a
/// ReplicaSet's pod (the ReplicaSet's name without the pod's `pod-template-hash`), the
/// DaemonSet, the CronJob of a Job's pod (the Job's name without the CronJob's
/// scheduled-time suffix of 8 to 10 digits), else the Job name's first word (up to the
/// first `-` or `.`, as the CloudWatch agent does); StatefulSet pods, ownerless pods and
/// pods of other kinds keep their own name. Read from the pod alone: the agent watches no
/// ReplicaSets or Jobs.
pub fn workload_name(pod: &Pod) -> String {
    let own = pod.metadata.name.clone().unwrap_or_default();
    let refs = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let Some(owner) = refs.iter().find(|o| o.controller == Some(true)).or(refs.first()) else {
        return own;
    };
    let name = owner.name.as_str();
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = pod.metadata.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
            match hash.and_then(|h| name.strip_suffix(h.as_str())).and_then(|n| n.strip_suffix('-')) {
                Some(deployment) if !deployment.is_empty() => deployment.to_owned(),
                _ => name.to_owned(),
            }
        }
        "DaemonSet" => name.to_owned(),
        "Job" => match name.rsplit_once('-') {
            Some((cronjob, suffix))
                if !cronjob.is_empty()
                    && (8..=10).contains(&suffix.len())
                    && suffix.bytes().all(|b| b.is_ascii_digit()) =>
            {
                cronjob.to_owned()
            }
            _ => name.split(['-', '.']).next().filter(|p| !p.is_empty()).unwrap_or(name).to_owned(),
        },
        _ => own,
    }
}

/// `containerd://<id>` → `<id>`; an empty id (container not started) is none.
fn strip_scheme(id: &str) -> Option<&str> {
    let id = id.split_once("://").map_or(id, |(_, rest)| rest);
    (!id.is_empty()).then_some(id)
}

/// The running pods of this node.
#[derive(Debug, Default)]
pub struct PodIndex {
    keys: PodLabelKeys,
    pods: HashMap<String, PodEntry>,
    /// Container ID → (pod UID, labels).
    by_container_id: HashMap<String, (String, Arc<PodRef>)>,
    /// (namespace, name) → pod UID.
    by_name: HashMap<(String, String), String>,
    generation: u64,
    synced: bool,
}

impl PodIndex {
    pub fn new(keys: PodLabelKeys) -> Self {
        PodIndex { keys, ..Default::default() }
    }

    /// Changes whenever a lookup may answer differently.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True once a first complete listing was read.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// A pod was added or changed: indexed, or removed when it has finished.
    pub fn apply(&mut self, pod: &Pod) {
        match PodEntry::from_pod(pod, &self.keys) {
            Some((uid, entry)) => {
                if self.pods.get(&uid) != Some(&entry) {
                    self.remove_uid(&uid);
                    self.insert(uid, entry);
                    self.generation += 1;
                }
            }
            None => {
                if let Some(uid) = &pod.metadata.uid {
                    if self.remove_uid(uid) {
                        self.generation += 1;
                    }
                }
            }
        }
    }

    pub fn delete(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            if self.remove_uid(uid) {
                self.generation += 1;
            }
        }
    }

    /// Replaces the whole index with a complete listing.
    pub fn replace(&mut self, pods: &[Pod]) {
        self.pods.clear();
        self.by_container_id.clear();
        self.by_name.clear();
        for pod in pods {
            if let Some((uid, entry)) = PodEntry::from_pod(pod, &self.keys) {
                self.insert(uid, entry);
            }
        }
        self.synced = true;
        self.generation += 1;
    }

    fn insert(&mut self, uid: String, entry: PodEntry) {
        for (id, container) in &entry.ids {
            self.by_container_id.insert(id.clone(), (uid.clone(), container.clone()));
        }
        self.by_name.insert((entry.namespace.clone(), entry.name.clone()), uid.clone());
        self.pods.insert(uid, entry);
    }

    fn remove_uid(&mut self, uid: &str) -> bool {
        let Some(entry) = self.pods.remove(uid) else {
            return false;
        };
        for (id, _) in &entry.ids {
            if self.by_container_id.get(id).is_some_and(|(owner, _)| owner == uid) {
                self.by_container_id.remove(id);
            }
        }
        let key = (entry.namespace, entry.name);
        if self.by_name.get(&key).is_some_and(|owner| owner == uid) {
            self.by_name.remove(&key);
        }
        true
    }

    /// The labels of a process found in pod `pod_uid`, in container `container_id` if known.
    /// A container the pod's statuses do not list yet gives the pod with no container name.
    pub fn for_process(&self, pod_uid: &str, container_id: Option<&str>) -> Option<&Arc<PodRef>> {
        if let Some((owner, container)) = container_id.and_then(|id| self.by_container_id.get(id)) {
            if owner == pod_uid {
                return Some(container);
            }
        }
        self.pods.get(pod_uid).map(|p| &p.pod_level)
    }

    /// The labels of a container named by the kubelet.
    pub fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<&Arc<PodRef>> {
        // Owned key: this runs when the ownership changes, not per report.
        let uid = self.by_name.get(&(namespace.to_owned(), pod.to_owned()))?;
        let entry = self.pods.get(uid)?;
        entry.containers.iter().find(|c| c.container == container).or(Some(&entry.pod_level))
    }
}

/// Follows the pods of this node into a [`PodIndex`].
pub struct PodWatcher {
    pub client: Client,
    pub node: String,
    pub index: SharedPods,
    pub metrics: AttributionMetrics,
    /// Server-side duration of each watch call (see [`crate::kubernetes::DEFAULT_WATCH_TIMEOUT`]):
    /// a connection that went silently dead is found within it.
    pub watch_timeout: std::time::Duration,
}

impl PodWatcher {
    /// Runs until `shutdown`; errors are logged and retried with backoff, the index stays.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = Watch {
            fields: format!("spec.nodeName={}", self.node),
            timeout: self.watch_timeout,
            errors: self.metrics.pod_watch_errors.clone(),
            what: "the pods of this node",
            meanwhile: "the known pods stay",
        };
        let mut events = std::pin::pin!(watch.events(Api::<Pod>::all(self.client.clone()), shutdown));
        let mut listing: Vec<Pod> = Vec::new();
        info!(node = %self.node, "watching the pods of this node");
        while let Some(event) = events.next().await {
            let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
            match event {
                Event::Init => listing.clear(),
                Event::InitApply(pod) => listing.push(strip(pod)),
                Event::InitDone => {
                    index.replace(&std::mem::take(&mut listing));
                    info!(pods = index.len(), "pods of this node listed");
                }
                Event::Apply(pod) => index.apply(&pod),
                Event::Delete(pod) => index.delete(&pod),
            }
            self.metrics.pods.set(index.len() as i64);
        }
    }
}

/// Drops the parts of a listed pod the index never reads, while the listing is buffered.
fn strip(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    // Only the controller's reference is read (`workload_name`).
    if let Some(refs) = &mut pod.metadata.owner_references {
        refs.retain(|r| r.controller == Some(true));
        refs.truncate(1);
    }
    if let Some(spec) = &mut pod.spec {
        spec.volumes = None;
        for c in &mut spec.containers {
            *c = k8s_openapi::api::core::v1::Container { name: std::mem::take(&mut c.name), ..Default::default() };
        }
        for c in spec.init_containers.iter_mut().flatten() {
            *c = k8s_openapi::api::core::v1::Container { name: std::mem::take(&mut c.name), ..Default::default() };
        }
    }
    if let Some(status) = &mut pod.status {
        status.conditions = None;
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CID_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const CID_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn pod(uid: &str, ns: &str, name: &str, phase: &str, containers: &[(&str, Option<&str>)]) -> Pod {
        let spec: Vec<_> = containers.iter().map(|(n, _)| json!({"name": n, "image": "x"})).collect();
        let statuses: Vec<_> = containers
            .iter()
            .filter_map(|(n, id)| {
                id.map(|id| {
                    json!({"name": n, "containerID": format!("containerd://{id}"), "image": "x", "imageID": "",
                           "ready": true, "restartCount": 0})
                })
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"uid": uid, "namespace": ns, "name": name,
                         "labels": {"app.kubernetes.io/name": name, "team": "ml", "other": "x"}},
            "spec": {"nodeName": "n1", "containers": spec},
            "status": {"phase": phase, "containerStatuses": statuses}
        }))
        .unwrap()
    }

    #[test]
    fn workload_names_follow_container_insights() {
        let owned = |kind: &str, owner: &str, hash: Option<&str>| {
            let mut p = pod("u1", "a", "the-pod-x1", "Running", &[]);
            p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "o1", "controller": true
            }))
            .unwrap()]);
            if let Some(h) = hash {
                p.metadata.labels.get_or_insert_with(Default::default).insert("pod-template-hash".into(), h.into());
            }
            workload_name(&p)
        };
        assert_eq!(owned("ReplicaSet", "train-6d4cf56db6", Some("6d4cf56db6")), "train");
        assert_eq!(owned("ReplicaSet", "train-6d4cf56db6", None), "train-6d4cf56db6");
        assert_eq!(owned("DaemonSet", "probe", None), "probe");
        assert_eq!(owned("Job", "nightly-eval-29412345", None), "nightly-eval");
        assert_eq!(owned("Job", "bert.finetune-7", None), "bert");
        assert_eq!(owned("StatefulSet", "serve", None), "the-pod-x1");
        assert_eq!(owned("Workflow", "wf", None), "the-pod-x1");
        assert_eq!(workload_name(&pod("u1", "a", "alone", "Running", &[])), "alone");
        // The index keeps the controller's reference through `strip`, and puts it on the refs.
        let mut p = pod("u1", "a", "train-6d4cf56db6-abcde", "Running", &[("main", Some(CID_A))]);
        p.metadata.labels.get_or_insert_with(Default::default).insert("pod-template-hash".into(), "6d4cf56db6".into());
        p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-6d4cf56db6", "uid": "o1", "controller": true
        }))
        .unwrap()]);
        let mut index = PodIndex::new(PodLabelKeys::default());
        index.replace(&[strip(p)]);
        let main = index.for_process("u1", Some(CID_A)).unwrap();
        assert_eq!((main.pod.as_str(), main.owner.as_str()), ("train-6d4cf56db6-abcde", "train"));
    }

    #[test]
    fn containers_are_found_by_id_and_by_kubelet_names() {
        let mut index = PodIndex::new(PodLabelKeys::new(&["app.kubernetes.io/name", "team"]));
        index.replace(&[pod("u1", "a", "train", "Running", &[("main", Some(CID_A)), ("sidecar", None)])]);
        assert!(index.is_synced());
        let main = index.for_process("u1", Some(CID_A)).unwrap();
        assert_eq!((main.namespace.as_str(), main.pod.as_str(), main.container.as_str()), ("a", "train", "main"));
        assert_eq!(
            main.labels,
            vec![("label_app_kubernetes_io_name".to_owned(), "train".to_owned()), ("label_team".into(), "ml".into())]
        );
        // A container id the statuses do not list yet: the pod, no container name.
        assert_eq!(index.for_process("u1", Some(CID_B)).unwrap().container, "");
        // An id of another pod's container is not trusted for this pod.
        assert_eq!(index.for_process("u2", Some(CID_A)), None);
        assert_eq!(index.container("a", "train", "sidecar").unwrap().container, "sidecar");
        assert_eq!(index.container("a", "nope", "main"), None);
    }

    #[test]
    fn finished_and_deleted_pods_leave_the_index() {
        let mut index = PodIndex::new(PodLabelKeys::default());
        index.apply(&pod("u1", "a", "job", "Running", &[("main", Some(CID_A))]));
        index.apply(&pod("u2", "b", "serve", "Running", &[("main", Some(CID_B))]));
        let generation = index.generation();
        // An unchanged pod changes nothing.
        index.apply(&pod("u2", "b", "serve", "Running", &[("main", Some(CID_B))]));
        assert_eq!(index.generation(), generation);
        index.apply(&pod("u1", "a", "job", "Succeeded", &[("main", Some(CID_A))]));
        assert_eq!(index.for_process("u1", Some(CID_A)), None);
        assert_eq!(index.container("a", "job", "main"), None);
        index.delete(&pod("u2", "b", "serve", "Running", &[]));
        assert!(index.is_empty());
        assert!(index.generation() > generation);
    }

    #[test]
    fn label_names_are_sanitized_and_deduplicated() {
        assert_eq!(metric_label_name("app.kubernetes.io/name"), "label_app_kubernetes_io_name");
        assert_eq!(metric_label_name("team"), "label_team");
        let keys = PodLabelKeys::new(&["a.b", "a/b", " ", "c"]);
        assert_eq!(keys.0, vec![("a.b".to_owned(), "label_a_b".to_owned()), ("c".into(), "label_c".into())]);
    }

    #[test]
    fn scheme_is_stripped_and_empty_ids_ignored() {
        assert_eq!(strip_scheme("containerd://abc"), Some("abc"));
        assert_eq!(strip_scheme("cri-o://abc"), Some("abc"));
        assert_eq!(strip_scheme("abc"), Some("abc"));
        assert_eq!(strip_scheme(""), None);
    }

    #[test]
    fn stripping_keeps_what_the_index_reads() {
        let full = pod("u1", "a", "train", "Running", &[("main", Some(CID_A))]);
        let keys = PodLabelKeys::new(&["team"]);
        assert_eq!(PodEntry::from_pod(&strip(full.clone()), &keys), PodEntry::from_pod(&full, &keys));
    }
}
