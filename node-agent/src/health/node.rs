//! The health model on the agent's Node (with `--node-name`): the condition `NeuronHealth`
//! (the reasons AWS's recovery tooling watches: `NeuronHasNoError`,
//! `NeuronHasError_<NAME>`) and an Event for every new fault, naming the device, core,
//! serial number, recommended action and the pods holding the device.
//!
//! The condition's type follows the settings in force: when a configuration changes it,
//! the next write adds the new type and deletes the old one this agent wrote.
//!
//! API calls: `get` of `nodes/status` (the Node's uid and current condition), a
//! strategic-merge `patch` of `nodes/status` when the condition changes, `create` (and `patch` for
//! repeats) of `events.k8s.io` Events. The chart's RBAC grants exactly these.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, ObjectReference},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    api::{Api, Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
    Client,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    model::{HealthModel, Reason, State},
    settings::SettingsReceiver,
    SharedHealth,
};
use crate::{
    attribution::podresources::{SharedDevices, Unit},
    gpu::SharedGpuHolders,
};

mod gpus;

/// The default condition type.
pub const CONDITION_TYPE: &str = api::node_config::DEFAULT_CONDITION_TYPE;
/// After a failed write, the next attempt waits this long (changes of the model meanwhile
/// do not hasten it).
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
/// Bytes of a condition message or an Event note.
const MAX_MESSAGE_BYTES: usize = 1000;

pub struct NodeReporter {
    pub client: Client,
    pub node: String,
    /// The condition's type is the one in force ([`HealthSettings::condition_type`]).
    ///
    /// [`HealthSettings::condition_type`]: super::settings::HealthSettings::condition_type
    pub settings: SettingsReceiver,
    pub health: SharedHealth,
    pub devices: Option<SharedDevices>,
    /// Whether the node has Neuron devices: a GPU-only node gets no `NeuronHealth`.
    pub neuron: bool,
    /// The pods holding each GPU (with GPU attribution).
    pub gpu_holders: Option<SharedGpuHolders>,
}

/// The condition the model calls for: status, reason, message.
pub fn condition(model: &HealthModel) -> (&'static str, String, String) {
    match model.node_state() {
        State::Healthy => ("False", "NeuronHasNoError".to_owned(), "every Neuron device is healthy".to_owned()),
        State::Unknown => (
            "Unknown",
            "NeuronHealthUnknown".to_owned(),
            "the health of a Neuron device cannot be read (no driver, unreadable files or a stalled heartbeat)"
                .to_owned(),
        ),
        State::Unhealthy => {
            // The latest fault names the condition; the message lists every faulty device.
            let faults = model
                .devices
                .iter()
                .filter_map(|(i, d)| d.worst().map(|r| (Some(*i), r)))
                .chain(model.node_reasons.values().map(|r| (None, r)));
            let mut latest: Option<(Option<u32>, &Reason)> = None;
            let mut message = String::new();
            for (device, r) in faults {
                if latest.is_none_or(|(_, l)| r.last_seen > l.last_seen) {
                    latest = Some((device, r));
                }
                let device = device.map_or("node".to_owned(), |d| format!("device {d}"));
                push_bounded(&mut message, &format!("{device}: {} (action {}); ", r.error, r.action));
            }
            let name = latest.map_or("UNKNOWN", |(_, r)| r.error.as_str());
            ("True", format!("NeuronHasError_{name}"), message.trim_end_matches("; ").to_owned())
        }
    }
}

/// Cuts an Event's note to the API's limit, on a character boundary.
fn truncate_note(note: &mut String) {
    if note.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
}

fn push_bounded(s: &mut String, part: &str) {
    if s.len() + part.len() <= MAX_MESSAGE_BYTES {
        s.push_str(part);
    }
}

impl NodeReporter {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let uid = loop {
            match nodes.get_status(&self.node).await {
                Ok(node) => break node.metadata.uid,
                Err(e) => warn!(node = %self.node, error = %e, "cannot read the Node; the health condition waits"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        };
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(self.node.clone()),
            uid,
            ..ObjectReference::default()
        };
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter { controller: "neuron-node-agent".to_owned(), instance: Some(self.node.clone()) },
        );
        // The condition as written, with its type.
        let mut shown: Option<(String, (&'static str, String, String))> = None;
        let mut gpus_shown = gpus::Shown::default();
        let mut model_changed = self.health.lock().unwrap_or_else(|p| p.into_inner()).subscribe();
        loop {
            let mut failed = false;
            let condition_type = self.settings.borrow_and_update().condition_type.clone();
            let wanted = {
                let model = self.health.lock().unwrap_or_else(|p| p.into_inner());
                (self.neuron && model.read_once).then(|| condition(&model))
            };
            let written =
                |w: &(&str, String, String)| shown.as_ref().is_some_and(|(t, c)| *t == condition_type && c == w);
            if let Some(wanted) = wanted.filter(|w| !written(w)) {
                // A new type: the condition of the old one, written by this agent, goes.
                let old_type = shown.as_ref().map(|(t, _)| t.clone()).filter(|t| *t != condition_type);
                match self.patch_condition(&nodes, &condition_type, &wanted, old_type.as_deref()).await {
                    Ok(()) => {
                        info!(status = wanted.0, reason = %wanted.1, "Node condition {condition_type}");
                        shown = Some((condition_type, wanted));
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot write the Node's health condition; retrying");
                        failed = true;
                    }
                }
            }
            // The faults whose Event is not written yet (the model keeps which are, over
            // restarts too).
            let (reloads, faults) = self.health.lock().unwrap_or_else(|p| p.into_inner()).unannounced();
            for (key, reason) in faults {
                let event = self.event(key.0, &reason);
                match recorder.publish(&event, &reference).await {
                    Ok(()) => {
                        self.health.lock().unwrap_or_else(|p| p.into_inner()).announce(key, reloads);
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot publish a Neuron fault Event; retrying");
                        failed = true;
                        break;
                    }
                }
            }
            failed |= !self.report_gpus(&nodes, &recorder, &reference, &mut gpus_shown).await;
            // Nothing to compare until the model or the settings change, or a retry is due.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Ok(()) = self.settings.changed() => {}
                Ok(()) = model_changed.changed(), if !failed => {}
                _ = tokio::time::sleep(RETRY_AFTER_ERROR), if failed => {}
            }
        }
    }

    /// The Event of a new fault: device, core, serial number, action, the pods holding
    /// the device.
    fn event(&self, device: Option<u32>, r: &Reason) -> Event {
        let mut note = match device {
            Some(d) => format!("Neuron device {d}"),
            None => "A Neuron device".to_owned(),
        };
        if let Some(core) = r.core {
            note.push_str(&format!(" core {core}"));
        }
        if let Some(serial) = &r.serial {
            note.push_str(&format!(" (serial {serial})"));
        }
        note.push_str(&format!(": {}", r.error));
        if !r.component.is_empty() {
            note.push_str(&format!(" of {}", r.component));
        }
        if !r.counter.is_empty() {
            note.push_str(&format!(" ({} = {})", r.counter, r.count));
        }
        note.push_str(&format!("; recommended action: {}", r.action));
        let pods = device.map(|d| self.pods_holding(d)).unwrap_or_default();
        if !pods.is_empty() {
            push_bounded(&mut note, &format!("; pods holding the device: {}", pods.join(", ")));
        }
        truncate_note(&mut note);
        Event {
            type_: EventType::Warning,
            // Event reasons are at most 128 characters; error names at most 64.
            reason: format!("NeuronHasError_{}", r.error),
            note: Some(note),
            // Events of one key (regarding, reason, action, …) are merged into one series:
            // the device in the action keeps one device's fault from hiding another's.
            action: match device {
                Some(d) => format!("DetectHardwareFaultOnDevice{d}"),
                None => "DetectHardwareFault".to_owned(),
            },
            secondary: None,
        }
    }

    fn pods_holding(&self, device: u32) -> Vec<String> {
        let Some(devices) = &self.devices else { return Vec::new() };
        let cores_per_device = {
            let model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            model.devices.get(&device).and_then(|d| d.reading.as_ref()?.core_count)
        };
        let ownership = devices.read().unwrap_or_else(|p| p.into_inner());
        let mut pods: Vec<String> = ownership
            .allocations()
            .iter()
            .filter(|a| match a.unit {
                Unit::Device => a.id == device,
                Unit::Core => cores_per_device.is_some_and(|n| n > 0 && a.id / n == device),
            })
            .map(|a| format!("{}/{}", a.namespace, a.pod))
            .collect();
        pods.sort();
        pods.dedup();
        pods
    }

    /// Writes the condition `condition_type`; removes the condition `replaces` (the type
    /// this agent wrote before the settings changed it) in the same patch.
    async fn patch_condition(
        &self,
        nodes: &Api<Node>,
        condition_type: &str,
        (status, reason, message): &(&str, String, String),
        replaces: Option<&str>,
    ) -> kube::Result<()> {
        // The transition time changes only with the status (kept from the Node's condition).
        let current = nodes.get_status(&self.node).await?;
        let existing =
            current.status.and_then(|s| s.conditions).and_then(|c| c.into_iter().find(|c| c.type_ == condition_type));
        let now = Time(Timestamp::now());
        let transition = match &existing {
            Some(c) if c.status == *status => c.last_transition_time.clone().unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        let condition = NodeCondition {
            type_: condition_type.to_owned(),
            status: (*status).to_owned(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            last_heartbeat_time: Some(now),
            last_transition_time: Some(transition),
        };
        let mut conditions = vec![serde_json::to_value(condition).map_err(kube::Error::SerdeError)?];
        if let Some(old) = replaces {
            // Conditions merge by type: this directive deletes the old type's entry.
            conditions.push(serde_json::json!({ "type": old, "$patch": "delete" }));
        }
        let patch = serde_json::json!({ "status": { "conditions": conditions } });
        nodes.patch_status(&self.node, &PatchParams::default(), &Patch::Strategic(patch)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{
        kmsg::kernel_event,
        sysfs::{DeviceReading, DeviceState, NodeReading},
    };
    use std::time::Instant;

    #[test]
    fn condition_follows_the_node_state() {
        let mut m = HealthModel::new("b".to_owned(), Duration::from_secs(60));
        let ready = |index| DeviceReading { index, state: Some(DeviceState::Ready), ..DeviceReading::default() };
        m.apply_reading(
            NodeReading { driver_loaded: true, devices: vec![ready(0), ready(1)], ..NodeReading::default() },
            1,
            Instant::now(),
        );
        assert_eq!(condition(&m).0, "False");
        assert_eq!(condition(&m).1, "NeuronHasNoError");
        let hbm = kernel_event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1").unwrap();
        m.apply_events(vec![(Some(1), hbm)], Some(1), 5);
        let (status, reason, message) = condition(&m);
        assert_eq!((status, reason.as_str()), ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"));
        assert_eq!(message, "device 1: HBM_UNCORRECTABLE_ERROR (action TERMINATE_INSTANCE)");
        let dma = kernel_event("NEURON_HW_ERR=DMA_ERROR nd-id=0").unwrap();
        m.apply_events(vec![(Some(2), dma)], Some(2), 9);
        assert_eq!(condition(&m).1, "NeuronHasError_DMA_ERROR", "the latest fault names it");
        let mut unknown = HealthModel::new("b".to_owned(), Duration::from_secs(60));
        unknown.apply_reading(NodeReading::default(), 1, Instant::now());
        assert_eq!(condition(&unknown).0, "Unknown");
    }
}
