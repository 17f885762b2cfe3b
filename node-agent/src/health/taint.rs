//! The optional NoSchedule taint on the agent's own Node (off by default): while tainting
//! is on (`spec.health.taint.enabled`) and a device (or the node) has a fault whose error
//! name is in the taint list, the Node carries [`TAINT_KEY`] with effect NoSchedule, so
//! that new pods stop landing on it. The taint goes when the fault does (the driver is
//! reloaded, the node reboots) or when tainting is turned off.
//!
//! Only the agent's own taint is touched: the Node's taints are read (`get` of
//! `nodes/status`, which returns the whole Node), ours added or removed, and the list
//! written back by a merge patch of the Node carrying the resourceVersion read, so a
//! concurrent change of another taint makes the API server refuse the write (409) rather
//! than lose it; the agent then reads again and retries. RBAC: `patch` of `nodes`.

use std::time::Duration;

use api::names::AGENT_MANAGER;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    api::{Api, Patch, PatchParams},
    Client,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{model::HealthModel, settings::SettingsReceiver, SharedHealth};

/// The taint the agent puts on its Node; its value names the fault.
pub const TAINT_KEY: &str = api::names::TAINT_KEY;
pub const TAINT_EFFECT: &str = "NoSchedule";
/// After a failed write, the next attempt waits this long (a missing permission or an
/// unreachable API server is not retried at each change of the model).
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// Conflicting writes (another writer changed the Node meanwhile) retried at once.
const CONFLICT_RETRIES: usize = 5;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// add, remove
    pub action: &'static str,
    /// written, conflict, error
    pub result: &'static str,
}

/// `neuron_agent_health_taint*`.
#[derive(Clone, Debug, Default)]
pub struct TaintMetrics {
    pub writes: Family<WriteLabel, Counter>,
    pub tainted: Gauge,
}

impl TaintMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = TaintMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent_health_taint");
        r.register(
            "writes",
            "Writes of the agent's NoSchedule taint on its Node, by action (add, remove) and result (written, conflict: \
             the Node changed meanwhile and is read again, error)",
            m.writes.clone(),
        );
        r.register("active", "1 while the agent's taint is on its Node", m.tainted.clone());
        m
    }
}

/// Keeps the agent's taint on its Node as the model and the settings want it.
pub struct Tainter {
    pub client: Client,
    pub node: String,
    pub health: SharedHealth,
    pub settings: SettingsReceiver,
    pub metrics: TaintMetrics,
}

/// The taint value for a model under a taint list: the first (sorted) listed error name
/// among the faults of the Neuron devices and the GPUs (`XID_79`, `GPU_LOST`, …), `None`
/// when no listed fault (or tainting is off).
pub fn wanted(model: &HealthModel, errors: Option<&[String]>) -> Option<String> {
    let errors = errors?;
    let gpu_faults = model.gpus.gpus.values().flat_map(|g| g.reasons.values());
    let faults =
        model.devices.values().flat_map(|d| d.reasons.values()).chain(model.node_reasons.values()).chain(gpu_faults);
    faults.map(|r| r.error.as_str()).filter(|e| errors.iter().any(|x| x == e)).min().map(str::to_owned)
}

/// The Node's taints with ours set to `wanted` (removed when `None`), others untouched;
/// `None` when nothing changes.
pub fn taints_with(current: &[Taint], wanted: Option<&str>) -> Option<Vec<Taint>> {
    let ours = |t: &Taint| t.key == TAINT_KEY && t.effect == TAINT_EFFECT;
    let mut taints: Vec<Taint> = current.iter().filter(|t| !ours(t)).cloned().collect();
    if let Some(error) = wanted {
        taints.push(Taint {
            key: TAINT_KEY.to_owned(),
            value: api::device_taints::taint_value(error),
            effect: TAINT_EFFECT.to_owned(),
            time_added: None,
        });
    }
    let same = taints.len() == current.len()
        && current
            .iter()
            .filter(|t| ours(t))
            .map(|t| t.value.clone())
            .eq(taints.iter().filter(|t| ours(t)).map(|t| t.value.clone()));
    (!same).then_some(taints)
}

impl Tainter {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        // What the Node carries as far as the agent knows; `None`: not read yet, so the
        // first pass also removes a taint a previous agent left while tainting is now off.
        let mut applied: Option<Option<String>> = None;
        let mut model_changed = self.health.lock().unwrap_or_else(|p| p.into_inner()).subscribe();
        loop {
            let errors = self.settings.borrow_and_update().taint_errors.clone();
            let want = {
                let model = self.health.lock().unwrap_or_else(|p| p.into_inner());
                // With tainting on, nothing is decided before the devices were read once.
                (errors.is_none() || model.read_once).then(|| wanted(&model, errors.as_deref()))
            };
            let mut failed = false;
            if let Some(want) = want.filter(|w| applied.as_ref() != Some(w)) {
                match self.apply(&nodes, want.as_deref()).await {
                    Ok(()) => {
                        self.metrics.tainted.set(i64::from(want.is_some()));
                        applied = Some(want);
                    }
                    Err(e) => {
                        warn!(error = %e, node = %self.node, "cannot write the Node's hardware-error taint; retrying");
                        failed = true;
                    }
                }
            }
            // Nothing to compare until the model or the settings change, or a retry is due.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.settings.changed() => {}
                Ok(()) = model_changed.changed(), if !failed => {}
                _ = tokio::time::sleep(RETRY_AFTER_ERROR), if failed => {}
            }
        }
    }

    /// Sets the Node's taint to `wanted`, keeping every other taint, retrying when the
    /// Node changed between the read and the write.
    async fn apply(&self, nodes: &Api<Node>, wanted: Option<&str>) -> kube::Result<()> {
        let action = if wanted.is_some() { "add" } else { "remove" };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let node = nodes.get_status(&self.node).await?;
            let current = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let Some(taints) = taints_with(&current, wanted) else { return Ok(()) };
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": node.metadata.resource_version },
                "spec": { "taints": taints },
            });
            let params = PatchParams { field_manager: Some(AGENT_MANAGER.to_owned()), ..Default::default() };
            match nodes.patch(&self.node, &params, &Patch::Merge(&patch)).await {
                Ok(_) => {
                    self.metrics.writes.get_or_create(&WriteLabel { action, result: "written" }).inc();
                    match wanted {
                        Some(error) => {
                            info!(taint = TAINT_KEY, error, "tainted the Node NoSchedule: a fatal Neuron fault")
                        }
                        None => info!(taint = TAINT_KEY, "removed the Node's hardware-error taint"),
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < CONFLICT_RETRIES => {
                    self.metrics.writes.get_or_create(&WriteLabel { action, result: "conflict" }).inc();
                }
                Err(e) => {
                    self.metrics.writes.get_or_create(&WriteLabel { action, result: "error" }).inc();
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::kmsg::kernel_event;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.to_owned(), value: value.map(str::to_owned), effect: effect.to_owned(), time_added: None }
    }

    #[test]
    fn only_listed_faults_taint_and_the_value_is_stable() {
        let mut model = HealthModel::with_ready_devices(2);
        let fatal = ["DMA_ERROR".to_owned(), "NC_UNCORRECTABLE_ERROR".to_owned()];
        assert_eq!(wanted(&model, Some(&fatal)), None);
        let repairable = kernel_event("NEURON_HW_ERR=REPAIRABLE_HBM_UNCORRECTABLE_ERROR nd-id=0").unwrap();
        model.apply_events(vec![(Some(1), repairable)], Some(1), 1);
        assert_eq!(wanted(&model, Some(&fatal)), None, "not in the list");
        let nc = kernel_event("NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=1").unwrap();
        let dma = kernel_event("NEURON_HW_ERR=DMA_ERROR nd-id=0").unwrap();
        model.apply_events(vec![(Some(2), nc), (Some(3), dma)], Some(3), 2);
        assert_eq!(wanted(&model, Some(&fatal)).as_deref(), Some("DMA_ERROR"), "the first name, whatever came last");
        assert_eq!(wanted(&model, None), None, "tainting off");
    }

    #[test]
    fn a_gpu_fault_taints_when_its_name_is_listed() {
        use crate::gpu::{Gpu, GpuIdentity, GpuSnapshot};
        let mut model = HealthModel::with_ready_devices(0);
        let gpu = Gpu {
            identity: GpuIdentity {
                index: 0,
                uuid: "GPU-0".into(),
                pci_bus_id: "00000000:53:00.0".into(),
                ..GpuIdentity::default()
            },
            ..Gpu::default()
        };
        model.apply_gpu_snapshot(&GpuSnapshot { gpus: vec![gpu], collections: 1, ..GpuSnapshot::default() }, 1);
        let raw = "3,5,100,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=a, GPU has fallen off the bus.";
        let record = crate::health::kmsg::parse_record(raw).unwrap();
        let event = crate::health::kmsg::parse_event(record.text, Some(record.origin)).unwrap().unwrap();
        model.apply_events(vec![(Some(5), event)], Some(5), 2);
        assert_eq!(wanted(&model, Some(&["DMA_ERROR".to_owned()])), None, "XID_79 is not listed");
        let listed = ["DMA_ERROR".to_owned(), "XID_79".to_owned()];
        assert_eq!(wanted(&model, Some(&listed)).as_deref(), Some("XID_79"));
    }

    #[test]
    fn other_taints_are_kept_and_nothing_changes_twice() {
        let other = taint("example.com/maintenance", Some("yes"), "NoSchedule");
        let added = taints_with(std::slice::from_ref(&other), Some("DMA_ERROR")).expect("a change");
        assert_eq!(added, vec![other.clone(), taint(TAINT_KEY, Some("DMA_ERROR"), "NoSchedule")]);
        assert_eq!(taints_with(&added, Some("DMA_ERROR")), None, "already there");
        assert_eq!(taints_with(&added, None), Some(vec![other.clone()]));
        assert_eq!(taints_with(std::slice::from_ref(&other), None), None, "nothing to remove");
        // Someone else's NoExecute taint with our key is not ours to remove.
        let foreign = taint(TAINT_KEY, None, "NoExecute");
        assert_eq!(taints_with(std::slice::from_ref(&foreign), None), None);
        let long = "A".repeat(64);
        let with_long = taints_with(&[], Some(&long)).unwrap();
        assert_eq!(with_long[0].value, None, "not a label value: no value");
    }
}
