//! The GPUs' health on the Node: the condition [`GPU_CONDITION_TYPE`] (reason: the latest
//! fault, e.g. `XID_79`) and an Event per new fault naming the GPU, the Xid, NVIDIA's
//! recommended action and the pods holding the GPU. A node that never had a GPU gets
//! neither.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{
    api::Api,
    runtime::events::{Event, EventType, Recorder},
};
use tracing::{info, warn};

use super::{push_bounded, truncate_note, NodeReporter};
use crate::{
    gpu::xid,
    health::model::{GpuHealthModel, Reason, State},
};

/// The GPUs' condition type.
pub const GPU_CONDITION_TYPE: &str = "GpuHealth";

type Condition = (&'static str, String, String);

/// What this agent wrote of the GPUs (which faults have their Event, the model keeps).
#[derive(Default)]
pub(super) struct Shown {
    condition: Option<Condition>,
}

/// The condition the GPUs call for: status, reason, message; `None` on a node that never
/// had a GPU.
pub fn gpu_condition(gpus: &GpuHealthModel) -> Option<Condition> {
    if !gpus.present() {
        return None;
    }
    Some(match gpus.node_state() {
        State::Healthy => ("False", "GpuHasNoError".to_owned(), "every NVIDIA GPU is healthy".to_owned()),
        State::Unknown => (
            "Unknown",
            "GpuHealthUnknown".to_owned(),
            "the health of an NVIDIA GPU cannot be told (not collected yet, NVML stuck, or missing)".to_owned(),
        ),
        State::Unhealthy => {
            let mut latest: Option<&Reason> = None;
            let mut message = String::new();
            for (index, gpu) in &gpus.gpus {
                let Some(r) = gpu.worst() else { continue };
                if latest.is_none_or(|l| r.last_seen > l.last_seen) {
                    latest = Some(r);
                }
                push_bounded(
                    &mut message,
                    &format!("GPU {index} ({}): {} (action {}); ", gpu.identity.uuid, r.error, r.action),
                );
            }
            let reason = latest.map_or("UNKNOWN".to_owned(), |r| r.error.clone());
            ("True", reason, message.trim_end_matches("; ").to_owned())
        }
    })
}

/// What an Xid reason's description says (`XID_79` → the table's words), else nothing.
fn description(error: &str) -> String {
    let Some(code) = error.strip_prefix("XID_").and_then(|c| c.parse::<u32>().ok()) else { return String::new() };
    let info = xid::info(code);
    format!(" {} (likely cause: {})", info.what, info.cause.as_str())
}

impl NodeReporter {
    /// Writes the GPUs' condition when it changed, and an Event per new GPU fault;
    /// `false` when a write failed (to be retried).
    pub(super) async fn report_gpus(
        &self,
        nodes: &Api<Node>,
        recorder: &Recorder,
        reference: &ObjectReference,
        shown: &mut Shown,
    ) -> bool {
        let mut written = true;
        let (wanted, (reloads, faults)) = {
            let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            (gpu_condition(&model.gpus), model.unannounced_gpus())
        };
        if let Some(wanted) = wanted.filter(|w| shown.condition.as_ref() != Some(w)) {
            match self.patch_condition(nodes, GPU_CONDITION_TYPE, &wanted, None).await {
                Ok(()) => {
                    info!(status = wanted.0, reason = %wanted.1, "Node condition {GPU_CONDITION_TYPE}");
                    shown.condition = Some(wanted);
                }
                Err(e) => {
                    warn!(error = %e, "cannot write the Node's GPU health condition; retrying");
                    written = false;
                }
            }
        }
        for (key, reason) in faults {
            match recorder.publish(&self.gpu_event(key.0, &reason), reference).await {
                Ok(()) => {
                    self.health.lock().unwrap_or_else(|p| p.into_inner()).announce_gpu(key, reloads);
                }
                Err(e) => {
                    warn!(error = %e, "cannot publish a GPU fault Event; retrying");
                    written = false;
                    break;
                }
            }
        }
        written
    }

    /// The Event of a new GPU fault: GPU, Xid, recommended action, the pods holding it.
    fn gpu_event(&self, index: u32, r: &Reason) -> Event {
        let (uuid, pci) = {
            let model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let id = model.gpus.gpus.get(&index).map(|g| g.identity.clone()).unwrap_or_default();
            (id.uuid, id.pci_bus_id)
        };
        let mut note = format!("NVIDIA GPU {index} ({uuid}, PCI {pci}): {}{}", r.error, description(&r.error));
        note.push_str(&format!("; recommended action: {}", r.action));
        let pods = self.pods_holding_gpu(&uuid);
        if !pods.is_empty() {
            push_bounded(&mut note, &format!("; pods holding the GPU: {}", pods.join(", ")));
        }
        truncate_note(&mut note);
        Event {
            type_: EventType::Warning,
            reason: format!("GpuHasError_{}", r.error),
            note: Some(note),
            action: format!("DetectHardwareFaultOnGpu{index}"),
            secondary: None,
        }
    }

    fn pods_holding_gpu(&self, uuid: &str) -> Vec<String> {
        let Some(holders) = &self.gpu_holders else { return Vec::new() };
        let holders = holders.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut pods: Vec<String> = holders
            .get(&uuid.to_ascii_uppercase())
            .into_iter()
            .flatten()
            .map(|h| format!("{}/{}", h.pod.namespace, h.pod.pod))
            .collect();
        pods.sort();
        pods.dedup();
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        gpu::{Gpu, GpuIdentity, GpuSnapshot},
        health::{kmsg, model::HealthModel},
    };
    use std::time::Duration;

    #[test]
    fn the_gpu_condition_names_the_latest_xid_and_is_absent_without_gpus() {
        let mut m = HealthModel::new("b".to_owned(), Duration::from_secs(60));
        assert_eq!(gpu_condition(&m.gpus), None, "a Neuron-only node shows nothing of GPUs");
        let gpu = |index: u32| Gpu {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x53 + index),
                ..GpuIdentity::default()
            },
            ..Gpu::default()
        };
        let snapshot = GpuSnapshot { gpus: vec![gpu(0), gpu(1)], collections: 1, ..GpuSnapshot::default() };
        m.apply_gpu_snapshot(&snapshot, 1);
        assert_eq!(gpu_condition(&m.gpus).map(|c| (c.0, c.1)), Some(("False", "GpuHasNoError".to_owned())));
        let raw = "3,5,100,-;NVRM: Xid (PCI:0000:54:00): 79, pid=1, name=a, GPU has fallen off the bus.";
        let record = kmsg::parse_record(raw).unwrap();
        let event = kmsg::parse_event(record.text, Some(record.origin)).unwrap().unwrap();
        m.apply_events(vec![(Some(5), event)], Some(5), 9);
        let (status, reason, message) = gpu_condition(&m.gpus).unwrap();
        assert_eq!((status, reason.as_str()), ("True", "XID_79"));
        assert_eq!(message, "GPU 1 (GPU-1): XID_79 (action REBOOT_NODE)");
        assert_eq!(description("XID_79"), " GPU has fallen off the bus (likely cause: bus)");
        assert_eq!(description("GPU_LOST"), "");
    }
}
