//! The second kind of device of the health model: NVIDIA GPUs, each `healthy`,
//! `unhealthy` or `unknown` with the [`Reason`]s that made it so, under the Neuron
//! devices' rules.
//!
//! - A fault: a fatal Xid ([`crate::gpu::xid::XID_TABLE`]) from the kernel log naming a
//!   GPU of the latest collection by its PCI address, or from NVML's event set; NVML
//!   calling the GPU lost ([`GPU_LOST`]); an uncorrectable ECC error since the driver's
//!   load (the volatile uncorrected count above zero, [`ECC_UNCORRECTABLE`]) or a row
//!   remapping failure ([`ROW_REMAP_FAILURE`]). A GPU with a fault is unhealthy until the
//!   driver is reloaded (its energy or volatile ECC counters go down, or its version
//!   changes) or the node reboots; the faults are persisted per boot with the Neuron ones.
//! - Informational Xids are counted, never a fault. NVSwitch SXids are counted by code,
//!   attributed to no GPU.
//! - Without a fault a GPU is `unknown` before the first collection, while a collection
//!   is stuck (the snapshot is stale), while the configuration has the collector off and
//!   while it is missing from the collection.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use super::{Announced, Changes, GpuFaultKey, Reason, Source, State, StateChange};
use crate::{
    gpu::{
        xid::{self, XidKind, XidRecord},
        GpuIdentity, GpuSnapshot, PciAddress, MAX_GPUS,
    },
    health::kmsg::Refusal,
};

/// NVML answered "GPU lost": fallen off the bus.
pub const GPU_LOST: &str = "GPU_LOST";
/// An uncorrectable (double-bit) ECC error since the driver was loaded.
pub const ECC_UNCORRECTABLE: &str = "ECC_UNCORRECTABLE";
/// A row remapping that failed (Ampere and later).
pub const ROW_REMAP_FAILURE: &str = "ROW_REMAP_FAILURE";
/// Distinct Xid code labels kept per GPU (`0`..=`999` and `other` bound them anyway).
const MAX_XID_LABELS: usize = 1001;
/// Distinct NVSwitch SXid codes counted under their own label; the rest as `other`.
const MAX_SXID_LABELS: usize = 64;
/// Faults kept per GPU.
const MAX_REASONS_PER_GPU: usize = 32;

/// One GPU as the model knows it.
#[derive(Clone, Debug, Default)]
pub struct GpuHealth {
    pub identity: GpuIdentity,
    /// By reason name (`XID_79`, `GPU_LOST`, …).
    pub reasons: BTreeMap<String, Reason>,
    /// The latest Xid code (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: Option<u32>,
    /// Xids seen, by code label.
    pub xids: BTreeMap<String, u64>,
    /// In the latest collection.
    pub present: bool,
    /// The latest counters that tell a driver reload.
    uncorrected_volatile: Option<u64>,
    energy: Option<u64>,
}

impl GpuHealth {
    /// `stale`: the latest collection did not return in time.
    pub fn state(&self, stale: bool) -> State {
        if !self.reasons.is_empty() {
            State::Unhealthy
        } else if stale || !self.present {
            State::Unknown
        } else {
            State::Healthy
        }
    }

    /// The fault a condition names: the latest.
    pub fn worst(&self) -> Option<&Reason> {
        self.reasons.values().max_by_key(|r| r.last_seen)
    }

    /// Adds or counts a fault; `true` when it was new.
    fn upsert(&mut self, reason: Reason, bump: bool) -> Option<bool> {
        if let Some(r) = self.reasons.get_mut(&reason.error) {
            let count = if bump { r.count.saturating_add(1) } else { reason.count.max(r.count) };
            if count == r.count {
                return None;
            }
            r.count = count;
            r.last_seen = reason.last_seen;
            return Some(false);
        }
        if self.reasons.len() >= MAX_REASONS_PER_GPU {
            return None;
        }
        self.reasons.insert(reason.error.clone(), reason);
        Some(true)
    }
}

/// What the agent knows about the node's GPUs.
#[derive(Debug, Default)]
pub struct GpuHealthModel {
    /// By NVML index.
    pub gpus: BTreeMap<u32, GpuHealth>,
    /// Collections seen (0: none yet: every GPU unknown).
    pub collections: u64,
    pub stale: bool,
    /// A GPU collector runs: the kernel-log reader waits for its first collection.
    pub expected: bool,
    pub driver_version: Option<String>,
    /// NVSwitch SXids by code label.
    pub nvswitch_xids: BTreeMap<String, u64>,
    /// Driver reloads seen (each clears every fault).
    pub reloads: u64,
    /// The faults whose Event is on the Node (persisted: a restart writes the others).
    pub announced: Announced<GpuFaultKey>,
    pub(super) dirty: bool,
}

/// A GPU's or the GPUs' (None) state, to compare before and after an update.
type States = (BTreeMap<u32, State>, State);

impl GpuHealthModel {
    /// Whether any GPU was ever collected or restored: a node without one shows nothing
    /// about GPUs.
    pub fn present(&self) -> bool {
        self.collections > 0 || !self.gpus.is_empty()
    }

    pub fn state_of(&self, index: u32) -> State {
        self.gpus.get(&index).map_or(State::Unknown, |g| g.state(self.stale))
    }

    /// The GPUs' state together: unhealthy if one is, unknown if one is or none is known.
    pub fn node_state(&self) -> State {
        let states: Vec<State> = self.gpus.values().map(|g| g.state(self.stale)).collect();
        if states.contains(&State::Unhealthy) {
            State::Unhealthy
        } else if states.is_empty() || states.contains(&State::Unknown) {
            State::Unknown
        } else {
            State::Healthy
        }
    }

    pub fn by_address(&self, address: PciAddress) -> Option<u32> {
        let matches = |g: &GpuHealth| PciAddress::parse(&g.identity.pci_bus_id) == Some(address);
        self.gpus.iter().find(|(_, g)| g.present && matches(g)).map(|(i, _)| *i)
    }

    fn states(&self) -> States {
        (self.gpus.iter().map(|(i, g)| (*i, g.state(self.stale))).collect(), self.node_state())
    }

    /// The GPUs (and the GPUs together, `None`) whose state changed since `before`.
    fn state_changes(&self, before: &States) -> Vec<StateChange> {
        let mut out: Vec<StateChange> = self
            .gpus
            .iter()
            .filter_map(|(i, g)| {
                let (b, after) = (before.0.get(i).copied(), g.state(self.stale));
                let changed = b.map_or(after != State::Healthy, |b| b != after);
                changed.then_some(StateChange { device: Some(*i), before: b, after })
            })
            .collect();
        let node = self.node_state();
        if node != before.1 {
            out.push(StateChange { device: None, before: Some(before.1), after: node });
        }
        out
    }

    /// Folds one collection in (`now`: seconds since the epoch).
    pub fn apply_snapshot(&mut self, snapshot: &GpuSnapshot, now: u64, changes: &mut Changes) {
        let before = self.states();
        // Switched off by the configuration: nothing is read, nothing can be told.
        self.stale = snapshot.stale || snapshot.off;
        if snapshot.collections > 0 && snapshot.collections != self.collections && !self.stale {
            self.collections = snapshot.collections;
            if self.reloaded(snapshot) {
                self.clear(changes);
            }
            self.driver_version = Some(snapshot.driver_version.clone()).filter(|v| !v.is_empty());
            self.fold_gpus(snapshot, now, changes);
        }
        changes.gpu_state_changes = self.state_changes(&before);
    }

    /// A driver reload: another driver version, or a GPU's counters since the driver's
    /// load went down.
    fn reloaded(&self, snapshot: &GpuSnapshot) -> bool {
        let version_changed = self.driver_version.as_ref().is_some_and(|v| *v != snapshot.driver_version);
        let went_down = |old: Option<u64>, new: Option<u64>| matches!((old, new), (Some(o), Some(n)) if n < o);
        version_changed
            || snapshot.gpus.iter().any(|g| {
                self.gpus.get(&g.identity.index).is_some_and(|known| {
                    went_down(known.energy, g.values.energy_millijoules)
                        || went_down(known.uncorrected_volatile, g.values.ecc.uncorrected_volatile)
                })
            })
    }

    fn clear(&mut self, changes: &mut Changes) {
        self.reloads += 1;
        self.announced.clear();
        for gpu in self.gpus.values_mut() {
            changes.gpu_reasons_cleared |= !gpu.reasons.is_empty();
            gpu.reasons.clear();
        }
        self.dirty = true;
    }

    fn fold_gpus(&mut self, snapshot: &GpuSnapshot, now: u64, changes: &mut Changes) {
        for gpu in self.gpus.values_mut() {
            gpu.present = false;
        }
        for g in snapshot.gpus.iter().filter(|g| g.identity.index < MAX_GPUS) {
            let index = g.identity.index;
            let entry = self.gpus.entry(index).or_default();
            // A GPU lost before NVML gave its handle has no identity: it keeps the one known.
            if !g.identity.uuid.is_empty() {
                if entry.identity.uuid != g.identity.uuid && !entry.identity.uuid.is_empty() {
                    // Another GPU at this index than the restored one: its faults are not this one's.
                    entry.reasons.clear();
                    self.announced.retain(|(i, _)| *i != index);
                }
                entry.identity = g.identity.clone();
            }
            entry.present = true;
            entry.energy = g.values.energy_millijoules;
            entry.uncorrected_volatile = g.values.ecc.uncorrected_volatile;
            let reason = |error: &str, action: xid::Action, count: u64| nvml_reason(error, action, count, now);
            let mut found = Vec::new();
            if g.lost {
                found.push(reason(GPU_LOST, xid::Action::RebootNode, 1));
            }
            if let Some(n) = g.values.ecc.uncorrected_volatile.filter(|n| *n > 0) {
                found.push(reason(ECC_UNCORRECTABLE, xid::Action::ResetGpu, n));
            }
            if let Some(n) = g.values.remapped_rows.failure.filter(|n| *n > 0) {
                found.push(reason(ROW_REMAP_FAILURE, xid::Action::ContactSupport, n));
            }
            for r in found {
                match entry.upsert(r.clone(), false) {
                    Some(true) => {
                        self.dirty = true;
                        changes.gpu_faults.push((index, r));
                    }
                    Some(false) => self.dirty = true,
                    None => {}
                }
            }
        }
    }

    /// Folds one Xid record in: from the kernel log (`source` [`Source::KernelLog`]: its
    /// address must be a GPU of the latest collection) or NVML's event set (by index).
    pub fn apply_xid(&mut self, record: &XidRecord, now: u64, changes: &mut Changes) {
        if record.kind == XidKind::NvSwitch {
            let code = record.code.to_string();
            let label = if self.nvswitch_xids.contains_key(&code) || self.nvswitch_xids.len() < MAX_SXID_LABELS {
                code
            } else {
                "other".to_owned()
            };
            *self.nvswitch_xids.entry(label).or_default() += 1;
            return;
        }
        let Some(index) = self.by_address(record.address) else {
            changes.refused.push(Refusal::UnknownDevice);
            return;
        };
        self.apply_code(index, record.code, Source::KernelLog, now, changes);
    }

    /// Folds in an Xid NVML reported for the GPU at `index`.
    pub fn apply_nvml_xid(&mut self, index: u32, code: u32, now: u64, changes: &mut Changes) {
        if self.gpus.get(&index).is_some_and(|g| g.present) {
            self.apply_code(index, code, Source::Nvml, now, changes);
        }
    }

    fn apply_code(&mut self, index: u32, code: u32, source: Source, now: u64, changes: &mut Changes) {
        let before = self.states();
        let Some(gpu) = self.gpus.get_mut(&index) else { return };
        let label = xid::code_label(code);
        if gpu.xids.contains_key(&label) || gpu.xids.len() < MAX_XID_LABELS {
            *gpu.xids.entry(label).or_default() += 1;
        }
        gpu.last_xid = Some(code);
        let info = xid::info(code);
        if info.fatal {
            let mut reason = nvml_reason(&xid::reason_name(code), info.action, 1, now);
            reason.source = source;
            if gpu.upsert(reason.clone(), true) == Some(true) {
                changes.gpu_faults.push((index, reason));
            }
            self.dirty = true;
        }
        let mut found = self.state_changes(&before);
        changes.gpu_state_changes.retain(|c| !found.iter().any(|f| f.device == c.device));
        changes.gpu_state_changes.append(&mut found);
    }

    /// The faults whose Event is not written yet (bounded), and the count given up.
    pub(super) fn unannounced(&mut self, dropped: &Counter) -> (Vec<(GpuFaultKey, Reason)>, u64) {
        let faults = self.gpus.iter().flat_map(|(i, g)| g.reasons.values().map(move |r| ((*i, r.error.clone()), r)));
        self.announced.pending(faults, dropped)
    }

    pub fn persisted(&self) -> Vec<PersistedGpu> {
        self.gpus
            .iter()
            .filter(|(_, g)| !g.reasons.is_empty() || !g.xids.is_empty())
            .map(|(i, g)| PersistedGpu {
                index: *i,
                uuid: g.identity.uuid.clone(),
                pci_bus_id: g.identity.pci_bus_id.clone(),
                reasons: g.reasons.values().cloned().collect(),
                last_xid: g.last_xid,
                xids: g.xids.iter().map(|(c, n)| (c.clone(), *n)).collect(),
                announced: Some(
                    self.announced.of(g.reasons.keys().map(|e| (*i, e.clone()))).into_iter().map(|(_, e)| e).collect(),
                ),
            })
            .collect()
    }

    /// What the previous agent of this boot persisted (bounded).
    pub fn restore(&mut self, saved: Vec<PersistedGpu>) {
        for p in saved.into_iter().filter(|p| p.index < MAX_GPUS).take(MAX_GPUS as usize) {
            let gpu = self.gpus.entry(p.index).or_default();
            gpu.identity.index = p.index;
            gpu.identity.uuid = xid_bounded(&p.uuid);
            gpu.identity.pci_bus_id = xid_bounded(&p.pci_bus_id);
            // A file of an agent before the list was kept: every fault was announced.
            let written = p.announced.map(|a| a.into_iter().take(MAX_REASONS_PER_GPU).collect::<BTreeSet<String>>());
            for r in p.reasons.into_iter().take(MAX_REASONS_PER_GPU) {
                if written.as_ref().is_none_or(|w| w.contains(&r.error)) {
                    self.announced.insert((p.index, r.error.clone()));
                }
                gpu.reasons.insert(r.error.clone(), r);
            }
            gpu.last_xid = p.last_xid;
            for (label, n) in p.xids.into_iter().take(MAX_XID_LABELS) {
                gpu.xids.insert(label, n);
            }
        }
    }
}

fn xid_bounded(s: &str) -> String {
    s.chars().take(128).collect()
}

fn nvml_reason(error: &str, action: xid::Action, count: u64, now: u64) -> Reason {
    Reason {
        error: error.to_owned(),
        component: String::new(),
        counter: String::new(),
        source: Source::Nvml,
        action: action.as_str().to_owned(),
        core: None,
        serial: None,
        first_seen: now,
        last_seen: now,
        count,
    }
}

/// One GPU in the health state file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedGpu {
    pub index: u32,
    pub uuid: String,
    #[serde(default)]
    pub pci_bus_id: String,
    pub reasons: Vec<Reason>,
    #[serde(default)]
    pub last_xid: Option<u32>,
    #[serde(default)]
    pub xids: Vec<(String, u64)>,
    /// The reasons whose Event is on the Node (absent in files of agents before this
    /// list: every reason then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced: Option<Vec<String>>,
}

#[cfg(test)]
mod tests;
