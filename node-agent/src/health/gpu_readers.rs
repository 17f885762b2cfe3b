//! The GPUs' readers of the health model, each on a blocking thread of its own: the
//! collections the GPU collector publishes (lost GPUs, ECC, staleness), and NVML's event
//! set (critical Xids), started only where the driver supports those events.

use std::{fmt, sync::Arc};

use nvml_wrapper::{bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError, EventSet, Nvml};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{announce, logs, stop::Stop, unix_now, SharedHealth, StateWriter, TICK};
use crate::gpu::{nvml::NvmlReader, GpuCollection, GpuSnapshot};

/// What the health model reads of the GPUs.
#[derive(Clone)]
pub struct GpuInputs {
    /// The GPU collector's collections.
    pub snapshots: watch::Receiver<Arc<GpuSnapshot>>,
    /// The open library, for its event set.
    pub nvml: Arc<NvmlReader>,
    /// The collection in force; `None`: GPUs turned off by the configuration (no
    /// NVML call, the event set's waits included).
    pub period: watch::Receiver<Option<GpuCollection>>,
}

impl fmt::Debug for GpuInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GpuInputs")
    }
}

/// Folds each collection into the model.
pub(super) struct SnapshotReader {
    pub snapshots: watch::Receiver<Arc<GpuSnapshot>>,
    pub health: SharedHealth,
    pub writer: Arc<StateWriter>,
    pub feed: Option<logs::Feed>,
    pub stop: Arc<Stop>,
}

impl SnapshotReader {
    pub fn run(mut self) {
        let runtime = self.writer.runtime.clone();
        let mut open = true;
        while !self.stop.is_set() {
            let snapshot = self.snapshots.borrow_and_update().clone();
            let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let changes = model.apply_gpu_snapshot(&snapshot, unix_now());
            announce(&changes, &model, self.feed.as_ref());
            self.writer.save(&mut model);
            drop(model);
            // The next collection, or a tick to notice shutdown (the collector ends first).
            loop {
                if self.stop.is_set() {
                    return;
                }
                if !open {
                    std::thread::sleep(TICK);
                    continue;
                }
                match runtime.block_on(tokio::time::timeout(TICK, self.snapshots.changed())) {
                    Ok(Ok(())) => break,
                    Ok(Err(_)) => open = false,
                    Err(_) => {}
                }
            }
        }
    }
}

/// Whether a GPU of the node supports NVML's critical-Xid events (Linux, data-centre
/// GPUs).
pub(super) fn events_supported(nvml: &Nvml, gpus: u32) -> bool {
    (0..gpus).any(|i| {
        nvml.device_by_index(i)
            .and_then(|d| d.supported_event_types())
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
    })
}

/// Waits on NVML's event set for critical Xids of every GPU that supports them.
pub(super) struct EventReader {
    pub nvml: Arc<NvmlReader>,
    pub period: watch::Receiver<Option<GpuCollection>>,
    pub health: SharedHealth,
    pub writer: Arc<StateWriter>,
    pub feed: Option<logs::Feed>,
    pub stop: Arc<Stop>,
}

impl EventReader {
    pub fn run(self) {
        // An event names a GPU by index: the model must know the GPUs first.
        while !self.stop.is_set() && self.health.lock().unwrap_or_else(|p| p.into_inner()).gpus.collections == 0 {
            std::thread::sleep(TICK / 10);
        }
        let nvml = self.nvml.nvml();
        match register(nvml, self.nvml.gpu_count()) {
            Some((set, registered)) => {
                info!(gpus = registered, "reading critical Xids from NVML's event set");
                self.wait_for_events(&set);
            }
            None => {
                warn!("NVML's event set could not be registered: Xids come from the kernel log alone");
                while !self.stop.sleep(super::RETRY) {}
            }
        }
    }

    fn wait_for_events(&self, set: &EventSet<'_>) {
        let wait_ms = TICK.as_millis() as u32;
        while !self.stop.is_set() {
            if self.period.borrow().is_none() {
                std::thread::sleep(TICK);
                continue;
            }
            match set.wait(wait_ms) {
                Ok(event) => {
                    let Some(XidError::Value(code)) = event.event_data else { continue };
                    let (Ok(index), Ok(code)) = (event.device.index(), u32::try_from(code)) else { continue };
                    let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
                    let changes = model.apply_nvml_xid(index, code, unix_now());
                    announce(&changes, &model, self.feed.as_ref());
                    self.writer.save(&mut model);
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    self.nvml.metrics.failed(if matches!(e, NvmlError::GpuLost) { "lost" } else { "other" });
                    std::thread::sleep(TICK);
                }
            }
        }
    }
}

/// An event set with every GPU that supports critical Xids registered; `None` when none
/// could be.
fn register(nvml: &Nvml, gpus: u32) -> Option<(EventSet<'_>, u32)> {
    let mut set = nvml.create_event_set().ok()?;
    let mut registered = 0;
    for index in 0..gpus {
        let Ok(device) = nvml.device_by_index(index) else { continue };
        if !device.supported_event_types().is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR)) {
            continue;
        }
        // A failed registration frees the set: a new one takes the GPUs registered after.
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(kept) => {
                set = kept;
                registered += 1;
            }
            Err(_) => {
                set = nvml.create_event_set().ok()?;
                registered = 0;
            }
        }
    }
    (registered > 0).then_some((set, registered))
}
