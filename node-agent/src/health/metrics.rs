//! The health model on `/metrics`, with the instance labels of the other node-level
//! series and, on the device health series, the pods holding the device (and the DRA
//! claims they hold it through).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
};

use api::limits::{MAX_NEURON_DEVICES, MAX_REPORT_LABEL_VALUE_BYTES};
use prometheus_client::metrics::MetricType;

pub mod gpus;

use super::{
    model::{HealthModel, State},
    sysfs::{Ecc, PowerStatus, CORE_ERRORS},
    SharedHealth,
};
use crate::{
    attribution::podresources::{SharedDevices, Unit},
    series::{Exported, Family, FamilyEncoder, Labels},
    state::NodeState,
};

/// Encodes the health model on each scrape.
pub struct HealthCollector {
    pub health: SharedHealth,
    /// For the instance labels and the device count neuron-monitor reports.
    pub state: Arc<Mutex<NodeState>>,
    /// The kubelet's device allocations (with pod attribution).
    pub devices: Option<SharedDevices>,
    /// With a GPU collector: the `Hostname` of the GPU series.
    pub gpu_hostname: Option<Arc<str>>,
    /// Whether the node may have Neuron devices: `false` on a node with GPUs and no Neuron
    /// device, whose Neuron health would only ever be `unknown` (and alert for nothing).
    pub neuron: bool,
}

impl Exported for HealthCollector {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        self.encode_into(encoder)
    }
}

impl HealthCollector {
    /// The health families (what `/metrics` serves; an OTLP sink of the operator's
    /// namespace sends them too).
    pub fn encode_into(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        let (instance, hardware) = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.instance.clone(), state.hardware.clone())
        };
        if self.neuron {
            self.encode_neuron(&instance, hardware, encoder)?;
        }
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        // A node that never had a GPU shows no GPU family.
        if health.gpus.present() {
            gpus::encode(&health.gpus, &instance, self.gpu_hostname.as_deref().unwrap_or_default(), encoder)?;
        }
        Ok(())
    }

    /// The Neuron devices' health families.
    fn encode_neuron(
        &self,
        instance: &crate::state::InstanceLabels,
        hardware: Option<crate::state::HardwareSummary>,
        encoder: &mut dyn FamilyEncoder,
    ) -> Result<(), fmt::Error> {
        let (devices_reported, cores_per_device) = hardware
            .map(|h| (h.device_count.unwrap_or(0).min(MAX_NEURON_DEVICES), h.cores_per_device))
            .unwrap_or((0, None));
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let pods = self.devices.as_ref().map(|d| {
            let ownership = d.read().unwrap_or_else(|p| p.into_inner());
            holders(ownership.allocations(), &health, cores_per_device)
        });
        encode_health(&health, instance, devices_reported, pods.as_ref(), encoder)
    }
}

/// Who holds one device: the pods, and the DRA claims they hold it through, each as
/// `namespace/name` joined by commas in name order, bounded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceHolders {
    pub pods: String,
    /// Empty where no claim holds it (the device plugin's allocations).
    pub claims: String,
}

/// Who holds each device.
pub(crate) fn holders(
    allocations: &[crate::attribution::podresources::Allocation],
    health: &HealthModel,
    cores_per_device: Option<u32>,
) -> BTreeMap<u32, DeviceHolders> {
    let mut by_device: BTreeMap<u32, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for a in allocations {
        let device = match a.unit {
            Unit::Device => Some(a.id),
            Unit::Core => cores_per_device
                .or_else(|| health.devices.values().find_map(|d| d.reading.as_ref()?.core_count))
                .filter(|n| *n > 0)
                .map(|n| a.id / n),
        };
        if let Some(device) = device.filter(|d| *d < MAX_NEURON_DEVICES) {
            let (pods, claims) = by_device.entry(device).or_default();
            pods.push(format!("{}/{}", a.namespace, a.pod));
            claims.extend(a.claim.as_ref().map(|c| format!("{}/{}", c.namespace, c.name)));
        }
    }
    let joined = |mut names: Vec<String>| {
        names.sort();
        names.dedup();
        let mut joined = String::new();
        for name in names {
            if joined.len() + name.len() + 1 > MAX_REPORT_LABEL_VALUE_BYTES {
                break;
            }
            if !joined.is_empty() {
                joined.push(',');
            }
            joined.push_str(&name);
        }
        joined
    };
    by_device
        .into_iter()
        .map(|(d, (pods, claims))| (d, DeviceHolders { pods: joined(pods), claims: joined(claims) }))
        .collect()
}

/// The health series. Devices: those the model knows and those neuron-monitor reports
/// (unknown until read). `pods`: with attribution, the pods holding each device.
pub fn encode_health(
    health: &HealthModel,
    instance: &crate::state::InstanceLabels,
    devices_reported: u32,
    pods: Option<&BTreeMap<u32, DeviceHolders>>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let mut indices: Vec<u32> = health.devices.keys().copied().chain(0..devices_reported).collect();
    indices.sort_unstable();
    indices.dedup();
    encode_states(health, instance, &indices, pods, encoder)?;
    encode_faults(health, instance, &indices, encoder)?;
    encode_readings(health, instance, encoder)
}

/// Each device's and the node's state, and why a state is unknown.
fn encode_states(
    health: &HealthModel,
    instance: &crate::state::InstanceLabels,
    indices: &[u32],
    pods: Option<&BTreeMap<u32, DeviceHolders>>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let state_of = |i: u32| health.devices.get(&i).map(|d| d.state()).unwrap_or(State::Unknown);
    let mut f = Family::new(
        "neuron_device_health_state",
        "1 for the Neuron device's current health state (healthy, unhealthy, unknown), 0 for the two others; \
         pods: the pods holding the device; dra_claims: the DRA claims they hold it through",
        MetricType::Gauge,
    );
    for i in indices {
        let state = state_of(*i);
        let holding = pods.and_then(|p| p.get(i));
        for s in State::ALL {
            let mut labels = Labels::node(instance).number("neuron_device_index", *i).text("state", s.as_str());
            if pods.is_some() {
                labels = labels.text("pods", holding.map_or("", |h| h.pods.as_str()));
            }
            if let Some(h) = holding.filter(|h| !h.claims.is_empty()) {
                labels = labels.text("dra_claims", &h.claims);
            }
            f.push(labels, Some(f64::from(u8::from(s == state))));
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_node_health_state",
        "1 for the node's Neuron health state: unhealthy if a device is, unknown if one is or none can be read",
        MetricType::Gauge,
    );
    let node = health.node_state();
    for s in State::ALL {
        f.push(Labels::node(instance).text("state", s.as_str()), Some(f64::from(u8::from(s == node))));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_device_health_unknown",
        "1 for why a Neuron device's health is unknown (no_driver, device_missing, unreadable, resetting, \
         no_health_files, heartbeat_stalled)",
        MetricType::Gauge,
    );
    for (i, d) in &health.devices {
        if let Some(why) = d.unknown {
            f.push(Labels::node(instance).number("neuron_device_index", *i).text("reason", why), Some(1.0));
        }
    }
    f.write(encoder)
}

/// What the kernel log said (by device and error name, by driver function), and when
/// each device's faults were first and last seen.
fn encode_faults(
    health: &HealthModel,
    instance: &crate::state::InstanceLabels,
    indices: &[u32],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let index_text: BTreeMap<Option<u32>, String> =
        indices.iter().map(|i| (Some(*i), i.to_string())).chain(std::iter::once((None, String::new()))).collect();
    let idx = |d: Option<u32>| index_text.get(&d).map(String::as_str).unwrap_or_default();

    let mut f = Family::new(
        "neuron_hardware_errors",
        "NEURON_HW_ERR records of the kernel log by device and error name (empty device: the record named none)",
        MetricType::Counter,
    );
    for ((device, name), count) in &health.kernel_errors {
        f.push(
            Labels::node(instance).text("neuron_device_index", idx(*device)).text("error", name),
            Some(*count as f64),
        );
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_driver_errors",
        "Error records of the Neuron driver (neuron:<function>:) in the kernel log, by function",
        MetricType::Counter,
    );
    for (function, count) in &health.driver_errors {
        f.push(Labels::node(instance).text("function", function), Some(*count as f64));
    }
    f.write(encoder)?;

    // When each device's fault was first and last seen, by error name.
    let mut seen: BTreeMap<(u32, &str), (u64, u64, &str)> = BTreeMap::new();
    for (i, d) in &health.devices {
        for r in d.reasons.values() {
            let e = seen.entry((*i, &r.error)).or_insert((r.first_seen, r.last_seen, &r.action));
            e.0 = e.0.min(r.first_seen);
            e.1 = e.1.max(r.last_seen);
        }
    }
    for (name, help, pick) in [
        (
            "neuron_device_fault_first_seen_timestamp_seconds",
            "When the agent first saw a fault of the device, by error name and recommended action (until a driver \
             reload or a reboot)",
            0,
        ),
        (
            "neuron_device_fault_last_seen_timestamp_seconds",
            "When the agent last saw a fault of the device grow, by error name and recommended action",
            1,
        ),
    ] {
        let mut f = Family::new(name, help, MetricType::Gauge);
        for ((i, error), (first, last, action)) in &seen {
            let value = if pick == 0 { *first } else { *last };
            let labels =
                Labels::node(instance).number("neuron_device_index", *i).text("error", error).text("action", action);
            f.push(labels, Some(value as f64));
        }
        f.write(encoder)?;
    }
    Ok(())
}

/// What the driver's sysfs tree reads: ECC and core error counters, unhealthy components,
/// power, the driver's version.
fn encode_readings(
    health: &HealthModel,
    instance: &crate::state::InstanceLabels,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let readings = || health.devices.iter().filter_map(|(i, d)| d.reading.as_ref().map(|r| (*i, r)));

    let mut f = Family::new(
        "neuron_device_ecc_errors",
        "ECC errors of a Neuron device by memory (hbm, sram) and kind (corrected, uncorrected, \
         repairable_uncorrected), from the driver's sysfs counters (since the driver was loaded)",
        MetricType::Counter,
    );
    for (i, r) in readings() {
        for (ecc, value) in Ecc::ALL.iter().zip(r.ecc) {
            let labels = Labels::node(instance)
                .number("neuron_device_index", i)
                .text("memory", ecc.memory())
                .text("kind", ecc.kind());
            f.push(labels, value.map(|v| v as f64));
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuroncore_hardware_errors",
        "Hardware errors of a NeuronCore by counter (hw_hbm_ue_error, hw_nc_ue_error, hw_dma_abort_error, \
         hw_collectives_error, hw_repairable_hbm_ue_error); neuroncore: the core within its device",
        MetricType::Counter,
    );
    for (i, r) in readings() {
        for core in &r.cores {
            for ((name, _), value) in CORE_ERRORS.iter().zip(core.errors) {
                let labels = Labels::node(instance)
                    .number("neuron_device_index", i)
                    .number("neuroncore", core.index)
                    .text("error", name);
                f.push(labels, value.map(|v| v as f64));
            }
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_device_unhealthy_component",
        "1 for each component the driver reports unhealthy on a Neuron device",
        MetricType::Gauge,
    );
    for (i, r) in readings() {
        for component in r.components.iter().flat_map(|c| c.names()) {
            f.push(Labels::node(instance).number("neuron_device_index", i).text("component", component), Some(1.0));
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_device_power_status",
        "1 for the status of the Neuron device's latest power window (valid, no_data, invalid)",
        MetricType::Gauge,
    );
    for (i, r) in readings() {
        if let Some(power) = &r.power {
            for s in PowerStatus::ALL {
                let labels = Labels::node(instance).number("neuron_device_index", i).text("status", s.as_str());
                f.push(labels, Some(f64::from(u8::from(power.status == s))));
            }
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_device_power_utilization_ratio",
        "Power of the Neuron device as a share of its maximum over the latest one-minute window (stat: min, max, \
         avg); only with a valid status",
        MetricType::Gauge,
    );
    for (i, r) in readings() {
        if let Some(values) = r.power.and_then(|p| p.utilization) {
            for (stat, v) in ["min", "max", "avg"].iter().zip(values) {
                f.push(Labels::node(instance).number("neuron_device_index", i).text("stat", stat), Some(v / 100.0));
            }
        }
    }
    f.write(encoder)?;

    let mut f = Family::new("neuron_driver", "The Neuron driver's version", MetricType::Info);
    if let Some(version) = &health.driver_version {
        f.push(Labels::node(instance).text("version", version), Some(1.0));
    }
    f.write(encoder)
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::attribution::{dra::Claim, podresources::Allocation};

    fn allocation(pod: &str, unit: Unit, id: u32, claim: Option<&str>) -> Allocation {
        Allocation {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
            unit,
            id,
            claim: claim.map(|name| Arc::new(Claim { namespace: "ml".into(), name: name.into() })),
        }
    }

    #[test]
    fn a_device_names_its_pods_and_the_claims_they_hold_it_through() {
        let health = HealthModel::new("boot".into(), Duration::from_secs(60));
        let allocations = [
            allocation("serve", Unit::Core, 4, None),
            allocation("serve", Unit::Core, 5, None),
            allocation("train", Unit::Device, 3, Some("neurons")),
            allocation("eval", Unit::Device, 3, Some("shared")),
            allocation("train", Unit::Device, 3, Some("neurons")),
        ];
        let by_device = holders(&allocations, &health, Some(2));
        assert_eq!(by_device[&2], DeviceHolders { pods: "ml/serve".into(), claims: String::new() });
        assert_eq!(
            by_device[&3],
            DeviceHolders { pods: "ml/eval,ml/train".into(), claims: "ml/neurons,ml/shared".into() }
        );
        assert_eq!(by_device.len(), 2);
    }

    #[test]
    fn the_lists_are_cut_at_a_label_values_bound() {
        let health = HealthModel::new("boot".into(), Duration::from_secs(60));
        let many: Vec<Allocation> = (0..200)
            .map(|i| allocation(&format!("pod-{i:03}"), Unit::Device, 0, Some(&format!("claim-{i:03}"))))
            .collect();
        let h = &holders(&many, &health, None)[&0];
        for list in [&h.pods, &h.claims] {
            assert!(list.len() <= MAX_REPORT_LABEL_VALUE_BYTES, "{}", list.len());
            assert!(list.starts_with("ml/") && !list.ends_with(','), "whole names: {list}");
        }
    }
}
