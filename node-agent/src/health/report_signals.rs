//! neuron-monitor's reports as a health source: its uncorrected ECC events per device and
//! the executions its applications saw fail with a hardware error, read from the node
//! state after each report ([`signals`]) and folded into the model by a thread of its own.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{announce, logs, model::MonitorSignals, unix_now, SharedHealth, StateWriter};
use crate::state::NodeState;

/// Indices into `SystemState::ecc_totals` (`DeviceEccCounters::KINDS`).
const MEM_UNCORRECTED: usize = 1;
const SRAM_UNCORRECTED: usize = 3;
/// The error type of `error_summary` that counts hardware errors.
const HARDWARE_ERRORS: &str = "hardware";

/// What the node state says of the devices' health.
pub fn signals(state: &NodeState) -> MonitorSignals {
    // Running sums of a report's non-negative values; `as` saturates.
    let count = |v: f64| v.max(0.0) as u64;
    let uncorrected_ecc = state
        .system
        .ecc_totals
        .iter()
        .flat_map(|(device, totals)| {
            [(*device, "hbm", count(totals[MEM_UNCORRECTED])), (*device, "sram", count(totals[SRAM_UNCORRECTED]))]
        })
        .collect();
    let mut hardware_errors: BTreeMap<u32, u64> = BTreeMap::new();
    let cores_per_device = state.hardware.as_ref().and_then(|h| h.cores_per_device).filter(|n| *n > 0);
    if let Some(per_device) = cores_per_device {
        for rt in &state.runtimes {
            let errors = rt.errors_total.as_ref().and_then(|e| e.get(HARDWARE_ERRORS)).map(count);
            let Some(errors) = errors.filter(|n| *n > 0) else {
                continue;
            };
            let mut devices: Vec<u32> = rt.cores.iter().map(|c| c.index / per_device).collect();
            devices.dedup();
            for device in devices {
                let slot = hardware_errors.entry(device).or_default();
                *slot = slot.saturating_add(errors);
            }
        }
    }
    MonitorSignals { uncorrected_ecc, hardware_errors: hardware_errors.into_iter().collect() }
}

/// Folds the signals of every applied report into the model.
pub(super) struct MonitorReader {
    pub health: SharedHealth,
    pub writer: Arc<StateWriter>,
    pub feed: Option<logs::Feed>,
    pub shutdown: CancellationToken,
    pub state: Arc<Mutex<NodeState>>,
    pub applied: watch::Receiver<u64>,
}

impl MonitorReader {
    pub fn run(mut self) {
        let runtime = self.writer.runtime.clone();
        loop {
            let applied = runtime.block_on(async {
                tokio::select! {
                    _ = self.shutdown.cancelled() => false,
                    // An error: the pipeline is gone.
                    changed = self.applied.changed() => changed.is_ok(),
                }
            });
            if !applied {
                return;
            }
            let signals = signals(&self.state.lock().unwrap_or_else(|p| p.into_inner()));
            let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let changes = model.apply_monitor(&signals, unix_now());
            announce(&changes, &model, self.feed.as_ref());
            self.writer.save(&mut model);
        }
    }
}

#[cfg(test)]
mod tests {
    use api::report::Report;

    use super::*;

    #[test]
    fn ecc_and_hardware_execution_errors_are_read_per_device() {
        let report = r#"{"neuron_runtime_data":[
            {"pid":7,"neuron_runtime_tag":"train","error":"","report":{
              "neuroncore_counters":{"period":1,"error":"","neuroncores_in_use":{"2":{"neuroncore_utilization":50},"3":{"neuroncore_utilization":50}}},
              "execution_stats":{"period":1,"error":"","error_summary":{"generic":0,"numerical":0,"transient":0,"model":0,"runtime":0,"hardware":2},
                "execution_summary":{"completed":1,"completed_with_err":0,"completed_with_num_err":0,"timed_out":0,"incorrect_input":0,"failed_to_queue":0}}}}],
          "system_data":{"neuron_hw_counters":{"period":1,"error":"","neuron_devices":[
            {"neuron_device_index":0,"mem_ecc_corrected":5,"mem_ecc_uncorrected":0,"sram_ecc_corrected":0,"sram_ecc_uncorrected":1}]}},
          "instance_info":{"error":""},
          "neuron_hardware_info":{"neuron_device_count":2,"neuroncore_per_device_count":2,"error":""}}"#;
        let mut state = NodeState::default();
        state.apply(&Report::parse(report).unwrap());
        let s = signals(&state);
        assert_eq!(s.uncorrected_ecc, vec![(0, "hbm", 0), (0, "sram", 1)]);
        // Cores 2 and 3 are device 1's.
        assert_eq!(s.hardware_errors, vec![(1, 2)]);
        // Running sums: the next report's events add up.
        state.apply(&Report::parse(report).unwrap());
        assert_eq!(signals(&state).hardware_errors, vec![(1, 4)]);
        assert_eq!(signals(&state).uncorrected_ecc[1], (0, "sram", 2));
    }
}
