//! The GPUs' health on `/metrics`: `gpu_health_state` (as the Neuron devices'
//! `neuron_device_health_state`), dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` (the latest
//! Xid code of each GPU, 0 before any) and the Xids counted by GPU and code.

use std::fmt;

use prometheus_client::metrics::MetricType;

use crate::{
    gpu::dcgm::gpu_labels,
    health::model::{GpuHealthModel, State},
    series::{Family, FamilyEncoder, Labels},
    state::InstanceLabels,
};

pub fn encode(
    model: &GpuHealthModel,
    instance: &InstanceLabels,
    hostname: &str,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let labels: Vec<(u32, Vec<(&'static str, String)>)> =
        model.gpus.iter().map(|(i, g)| (*i, gpu_labels(&g.identity, hostname))).collect();
    let mut f = Family::new(
        "gpu_health_state",
        "1 for the NVIDIA GPU's current health state (healthy, unhealthy, unknown), 0 for the two others",
        MetricType::Gauge,
    );
    for (index, fields) in &labels {
        let state = model.state_of(*index);
        for s in State::ALL {
            f.push(
                Labels::node(instance).fields(fields).text("state", s.as_str()),
                Some(f64::from(u8::from(s == state))),
            );
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered (0: none since the agent's boot record)",
        MetricType::Gauge,
    );
    for (index, fields) in &labels {
        let last = model.gpus.get(index).and_then(|g| g.last_xid).unwrap_or(0);
        f.push(Labels::node(instance).fields(fields), Some(f64::from(last)));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "gpu_xid_errors",
        "Xid records of each NVIDIA GPU, by code (0 to 999, else other), from the kernel log and NVML's event set",
        MetricType::Counter,
    );
    for (index, fields) in &labels {
        for (code, count) in model.gpus.get(index).map(|g| &g.xids).into_iter().flatten() {
            f.push(Labels::node(instance).fields(fields).text("xid", code), Some(*count as f64));
        }
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "nvswitch_sxid_errors",
        "SXid records of the node's NVSwitches in the kernel log, by code (64 distinct codes, else other), attributed to no GPU",
        MetricType::Counter,
    );
    for (code, count) in &model.nvswitch_xids {
        f.push(Labels::node(instance).text("sxid", code), Some(*count as f64));
    }
    f.write(encoder)
}
