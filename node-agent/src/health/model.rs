//! The health of each Neuron device, folded from the sysfs readings and the kernel-log
//! events: `healthy`, `unhealthy` or `unknown`, with the reasons that made it so.
//!
//! - A fault (a kernel `NEURON_HW_ERR` record naming a device the sysfs tree lists, with
//!   its serial number if both give one; an uncorrected or repairable ECC count, a
//!   per-core hardware error count, an unhealthy component, the invalid device state)
//!   is a [`Reason`]; a device with a reason is unhealthy until the driver is reloaded
//!   (its counters start again from zero, or its tree goes away and comes back) or the
//!   node reboots (another boot id). The reasons are persisted per boot id
//!   ([`Persisted`]), so an agent restart does not clear them.
//! - Without a reason, a device is `unknown` when its health cannot be told: no driver
//!   tree, unreadable files, a device being reset, a heartbeat that stopped advancing.
//!   Never `healthy` for lack of data.
//! - neuron-monitor's reports are a third source ([`HealthModel::apply_monitor`]), for what
//!   the other two did not already say: its uncorrected ECC events for a device without a
//!   sysfs reading, and executions failed by a hardware error on a device with no reason.
//! - A fault whose error has a threshold ([`thresholds`]) becomes a reason only once it
//!   occurred that often within the window; until then its occurrences wait.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use api::{
    limits::{MAX_HEALTH_ERROR_NAMES, MAX_HEALTH_REASONS_PER_DEVICE, MAX_NEURON_DEVICES, MAX_THRESHOLD_COUNT},
    node_config::DEFAULT_TAINT_ERRORS,
};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

pub mod announced;
pub mod gpus;
pub mod thresholds;

pub use self::announced::{Announced, FaultKey, GpuFaultKey};
pub use self::gpus::{GpuHealth, GpuHealthModel, PersistedGpu};
use self::thresholds::{FaultGate, Pending, Seen, Thresholds, MAX_PENDING_FAULTS};
use super::{
    kmsg::{Event, HwError, Refusal},
    sysfs::{DeviceReading, DeviceState, Ecc, NodeReading, Power, CORE_ERRORS, REPAIRABLE_HBM_ERROR},
};

/// A device's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Healthy,
    Unhealthy,
    Unknown,
}

impl State {
    pub const ALL: [State; 3] = [State::Healthy, State::Unhealthy, State::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Unhealthy => "unhealthy",
            State::Unknown => "unknown",
        }
    }
}

/// What replaces the instance and what a driver reload repairs.
pub const ACTION_TERMINATE: &str = "TERMINATE_INSTANCE";
pub const ACTION_RELOAD: &str = "RELOAD_DRIVER_OR_REBOOT";

/// The name of a fault from the sysfs tree that the kernel log has no name for.
pub const UNHEALTHY_COMPONENT: &str = "UNHEALTHY_COMPONENT";
pub const DEVICE_STATE_INVALID: &str = "DEVICE_STATE_INVALID";
/// Executions that failed with a hardware error (neuron-monitor's `execution_stats`).
pub const EXECUTION_HW_ERROR: &str = "EXECUTION_HARDWARE_ERROR";
/// Kernel-log names beyond [`MAX_HEALTH_ERROR_NAMES`].
pub const OTHER_ERROR: &str = "OTHER";

/// The `NEURON_HW_ERR` names the Neuron documentation gives (and the repairable HBM
/// error its counters and status codes know): each keeps a slot of its own in the name
/// table, however many other names the kernel log shows.
pub fn documented_error(name: &str) -> bool {
    DEFAULT_TAINT_ERRORS.contains(&name) || name == REPAIRABLE_HBM_ERROR
}

/// Distinct other names kept: the rest of the table, less the documented names' slots
/// and [`OTHER_ERROR`]'s.
const MAX_UNDOCUMENTED_ERROR_NAMES: usize = MAX_HEALTH_ERROR_NAMES - DEFAULT_TAINT_ERRORS.len() - 2;

/// Where a reason was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    KernelLog,
    Sysfs,
    NeuronMonitor,
    /// The NVIDIA driver's library (a GPU's state, its event set).
    Nvml,
}

/// One fault of a device, as long as it lasts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// The `NEURON_HW_ERR` name, or the equivalent for a sysfs signal.
    pub error: String,
    /// The unhealthy component, for [`UNHEALTHY_COMPONENT`]; else empty.
    pub component: String,
    /// The sysfs counter (relative to the device directory) it comes from; else empty.
    pub counter: String,
    pub source: Source,
    /// The recommended action.
    pub action: String,
    /// Core within the device, when the record or counter names one.
    pub core: Option<u32>,
    pub serial: Option<String>,
    /// Seconds since the epoch.
    pub first_seen: u64,
    pub last_seen: u64,
    /// Records seen, or the counter's value.
    pub count: u64,
}

type ReasonKey = (String, String, String);

fn key(r: &Reason) -> ReasonKey {
    (r.error.clone(), r.component.clone(), r.counter.clone())
}

/// The default action of an error name: a repairable error needs a driver reload.
pub fn default_action(error: &str) -> &'static str {
    if error.contains("REPAIRABLE") {
        ACTION_RELOAD
    } else {
        ACTION_TERMINATE
    }
}

/// One device as the model knows it.
#[derive(Clone, Debug, Default)]
pub struct DeviceHealth {
    pub reasons: BTreeMap<ReasonKey, Reason>,
    /// The latest reading of its sysfs directory, if it has one.
    pub reading: Option<DeviceReading>,
    /// Why its health cannot be told, when it cannot.
    pub unknown: Option<&'static str>,
    /// The latest heartbeat value and when it last changed.
    heartbeat: Option<(String, Instant)>,
    /// [`DeviceReading::counter_sum`] of the latest reading (or of the previous agent's).
    counter_sum: Option<u64>,
}

impl DeviceHealth {
    pub fn state(&self) -> State {
        if !self.reasons.is_empty() {
            State::Unhealthy
        } else if self.unknown.is_some() || self.reading.is_none() {
            State::Unknown
        } else {
            State::Healthy
        }
    }

    /// The reason a Node condition or an alert names: the latest fatal one.
    pub fn worst(&self) -> Option<&Reason> {
        self.reasons.values().max_by_key(|r| (r.action == ACTION_TERMINATE, r.last_seen))
    }

    pub fn power(&self) -> Option<&Power> {
        self.reading.as_ref().and_then(|r| r.power.as_ref())
    }

    fn upsert(&mut self, reason: Reason, bump: bool) -> bool {
        if let Some(r) = self.reasons.get_mut(&key(&reason)) {
            let count = if bump { r.count.saturating_add(1) } else { reason.count.max(r.count) };
            if count == r.count {
                return false;
            }
            r.count = count;
            r.last_seen = reason.last_seen;
            if reason.serial.is_some() {
                r.serial = reason.serial;
            }
            return true;
        }
        if self.reasons.len() >= MAX_HEALTH_REASONS_PER_DEVICE {
            return false;
        }
        self.reasons.insert(key(&reason), reason);
        true
    }
}

/// What the agent knows about the node's devices.
#[derive(Debug)]
pub struct HealthModel {
    pub boot_id: String,
    pub devices: BTreeMap<u32, DeviceHealth>,
    /// Faults of the kernel log that name no device.
    pub node_reasons: BTreeMap<ReasonKey, Reason>,
    /// `NEURON_HW_ERR` records by (device, name): `neuron_hardware_errors_total`.
    pub kernel_errors: BTreeMap<(Option<u32>, String), u64>,
    /// `neuron:` error records by driver function.
    pub driver_errors: BTreeMap<String, u64>,
    pub kmsg_seq: Option<u64>,
    /// The latest sysfs reading of the node as a whole.
    pub driver_loaded: bool,
    pub tree_unreadable: bool,
    pub driver_version: Option<String>,
    /// A sysfs reading happened.
    pub read_once: bool,
    /// Changed since the last [`HealthModel::persisted`].
    pub dirty: bool,
    /// The faults whose Event is on the Node (persisted: a restart writes the others).
    pub announced: Announced<FaultKey>,
    /// Events given up for [`api::limits::MAX_PENDING_HEALTH_EVENTS`].
    pub events_dropped: Counter,
    /// Driver reloads seen (each clears every fault): a fault after one is new again.
    pub reloads: u64,
    /// The NVIDIA GPUs: the second kind of device.
    pub gpus: GpuHealthModel,
    /// The fault thresholds in force and the faults below them.
    pub gate: FaultGate,
    heartbeat_timeout: Duration,
    /// Sent after each fold that may have changed what the model shows: the outputs that
    /// follow it (the Node's condition, Events and taint, the DeviceTaintRules) wait on it
    /// instead of comparing on a timer.
    changed: tokio::sync::watch::Sender<()>,
    /// Sent when a change outside the readers' folds (an Event written) is to be
    /// persisted: the state writer waits on it.
    save_wanted: tokio::sync::watch::Sender<()>,
}

/// What changed in one update, for the outputs that announce faults.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Devices (None: the node) with a reason first seen in this update.
    pub new_faults: Vec<(Option<u32>, Reason)>,
    /// Error names counted under [`OTHER_ERROR`] or `other` because of the limit.
    pub names_over_limit: u64,
    /// Kernel-log faults refused for what the driver's tree says of their device.
    pub refused: Vec<Refusal>,
    pub reasons_cleared: bool,
    /// Devices and the node (None) whose state this update changed, in index order, the
    /// node last.
    pub state_changes: Vec<StateChange>,
    /// GPUs (by index) with a fault first seen in this update.
    pub gpu_faults: Vec<(u32, Reason)>,
    /// GPUs and the GPUs together (None) whose state this update changed.
    pub gpu_state_changes: Vec<StateChange>,
    /// An NVIDIA driver reload cleared the GPUs' faults.
    pub gpu_reasons_cleared: bool,
}

/// A device's (None: the node's) state before and after an update. A device seen for
/// the first time has no state before; one found healthy then is not a change (the
/// agent's first reading), one found unhealthy or unknown is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateChange {
    pub device: Option<u32>,
    pub before: Option<State>,
    pub after: State,
}

impl Changes {
    /// The state of `device` before and after this update (the same twice when it did
    /// not change).
    pub fn states_of(&self, device: Option<u32>, now: State) -> (Option<State>, State) {
        self.state_changes.iter().find(|c| c.device == device).map_or((Some(now), now), |c| (c.before, c.after))
    }
}

/// Every device's state and the node's, to compare before and after an update.
struct Snapshot {
    devices: BTreeMap<u32, State>,
    node: State,
}

impl HealthModel {
    pub fn new(boot_id: String, heartbeat_timeout: Duration) -> Self {
        HealthModel {
            boot_id,
            devices: BTreeMap::new(),
            node_reasons: BTreeMap::new(),
            kernel_errors: BTreeMap::new(),
            driver_errors: BTreeMap::new(),
            kmsg_seq: None,
            driver_loaded: false,
            tree_unreadable: false,
            driver_version: None,
            read_once: false,
            dirty: false,
            announced: Announced::default(),
            events_dropped: Counter::default(),
            reloads: 0,
            gpus: GpuHealthModel::default(),
            gate: FaultGate::default(),
            heartbeat_timeout,
            changed: tokio::sync::watch::Sender::new(()),
            save_wanted: tokio::sync::watch::Sender::new(()),
        }
    }

    /// A receiver told when the model wants to be persisted outside the readers' folds.
    pub fn subscribe_saves(&self) -> tokio::sync::watch::Receiver<()> {
        self.save_wanted.subscribe()
    }

    fn want_save(&mut self) {
        self.dirty = true;
        self.save_wanted.send_replace(());
    }

    /// Every Neuron fault, keyed as announced.
    fn fault_keys(&self) -> impl Iterator<Item = (FaultKey, &Reason)> {
        let key = |d: Option<u32>, r: &Reason| (d, r.error.clone(), r.component.clone(), r.counter.clone());
        let devices = self.devices.iter().flat_map(|(i, d)| d.reasons.values().map(move |r| (Some(*i), r)));
        devices.chain(self.node_reasons.values().map(|r| (None, r))).map(move |(d, r)| (key(d, r), r))
    }

    /// The Neuron faults whose Event is not written yet (bounded: see [`announced`]), and
    /// the driver reloads seen, to give [`HealthModel::announce`].
    pub fn unannounced(&mut self) -> (u64, Vec<(FaultKey, Reason)>) {
        let faults: Vec<(FaultKey, Reason)> = self.fault_keys().map(|(k, r)| (k, r.clone())).collect();
        let (pending, dropped) =
            self.announced.pending(faults.iter().map(|(k, r)| (k.clone(), r)), &self.events_dropped);
        if dropped > 0 {
            self.want_save();
        }
        (self.reloads, pending)
    }

    /// The Event of the fault `key` is written (while the model had seen `reloads` driver
    /// reloads: after another one, the fault is news again).
    pub fn announce(&mut self, key: FaultKey, reloads: u64) {
        if reloads == self.reloads && self.announced.insert(key) {
            self.want_save();
        }
    }

    /// The GPU faults whose Event is not written yet (bounded), and the GPU driver
    /// reloads seen, to give [`HealthModel::announce_gpu`].
    pub fn unannounced_gpus(&mut self) -> (u64, Vec<(GpuFaultKey, Reason)>) {
        let (pending, dropped) = self.gpus.unannounced(&self.events_dropped);
        if dropped > 0 {
            self.want_save();
        }
        (self.gpus.reloads, pending)
    }

    /// The Event of the GPU fault `key` is written (as [`HealthModel::announce`]).
    pub fn announce_gpu(&mut self, key: GpuFaultKey, reloads: u64) {
        if reloads == self.gpus.reloads && self.gpus.announced.insert(key) {
            self.want_save();
        }
    }

    /// A receiver told of each fold that may have changed the model (see `changed`).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Puts `thresholds` in force (from the next occurrence on).
    pub fn set_thresholds(&mut self, thresholds: &Thresholds) {
        if !std::sync::Arc::ptr_eq(&self.gate.thresholds, thresholds) {
            self.gate.thresholds = thresholds.clone();
        }
    }

    /// The node's state: unhealthy if a device is, unknown if one is or none is known.
    pub fn node_state(&self) -> State {
        let states: Vec<State> = self.devices.values().map(DeviceHealth::state).collect();
        if !self.node_reasons.is_empty() || states.contains(&State::Unhealthy) {
            State::Unhealthy
        } else if states.is_empty() || states.contains(&State::Unknown) {
            State::Unknown
        } else {
            State::Healthy
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot { devices: self.devices.iter().map(|(i, d)| (*i, d.state())).collect(), node: self.node_state() }
    }

    /// What changed since `before`.
    fn state_changes(&self, before: &Snapshot) -> Vec<StateChange> {
        let mut out: Vec<StateChange> = self
            .devices
            .iter()
            .filter_map(|(i, d)| {
                let (before, after) = (before.devices.get(i).copied(), d.state());
                let changed = match before {
                    Some(b) => b != after,
                    None => after != State::Healthy,
                };
                changed.then_some(StateChange { device: Some(*i), before, after })
            })
            .collect();
        let node = self.node_state();
        if node != before.node {
            out.push(StateChange { device: None, before: Some(before.node), after: node });
        }
        out
    }

    /// Folds one reading of the sysfs tree in (`now`: seconds since the epoch).
    pub fn apply_reading(&mut self, node: NodeReading, now: u64, mono: Instant) -> Changes {
        let before = self.snapshot();
        let mut changes = self.fold_reading(node, now, mono);
        changes.state_changes = self.state_changes(&before);
        // Every reading: it also tells presence, readability and stalled heartbeats.
        self.changed.send_replace(());
        changes
    }

    fn fold_reading(&mut self, node: NodeReading, now: u64, mono: Instant) -> Changes {
        let mut changes = Changes::default();
        self.read_once = true;
        let was_loaded = self.driver_loaded;
        self.driver_loaded = node.driver_loaded;
        self.tree_unreadable = node.unreadable;
        self.driver_version = node.driver_version;
        // A driver reload: the tree came back, or a device's counters went down.
        let reloaded = (!was_loaded && node.driver_loaded && self.devices.values().any(|d| d.reading.is_some()))
            || node.devices.iter().any(|r| {
                self.devices.get(&r.index).and_then(|d| d.counter_sum).is_some_and(|sum| r.counter_sum() < sum)
            });
        if reloaded {
            self.clear_reasons(&mut changes);
        }
        let present: Vec<u32> = node.devices.iter().map(|d| d.index).collect();
        for (index, device) in &mut self.devices {
            if !present.contains(index) {
                device.unknown = Some(if node.driver_loaded { "device_missing" } else { "no_driver" });
            }
        }
        for reading in node.devices {
            let index = reading.index;
            let device = self.devices.entry(index).or_default();
            device.unknown = unknown_why(&reading);
            let heartbeat = reading.heartbeat.clone();
            match (&mut device.heartbeat, heartbeat) {
                (Some((value, since)), Some(new)) if *value == new => {
                    if mono.duration_since(*since) > self.heartbeat_timeout {
                        device.unknown = device.unknown.or(Some("heartbeat_stalled"));
                    }
                }
                (slot, new) => *slot = new.map(|v| (v, mono)),
            }
            for reason in sysfs_reasons(&reading, now) {
                let new = !device.reasons.contains_key(&key(&reason));
                if new && !self.gate.admits(index, &key(&reason), Seen::Counter(reason.count), now) {
                    self.dirty = true;
                    continue;
                }
                if device.upsert(reason.clone(), false) {
                    self.dirty = true;
                    if new {
                        changes.new_faults.push((Some(index), reason));
                    }
                }
            }
            device.counter_sum = Some(reading.counter_sum());
            device.reading = Some(reading);
        }
        changes
    }

    fn clear_reasons(&mut self, changes: &mut Changes) {
        self.reloads += 1;
        for device in self.devices.values_mut() {
            if !device.reasons.is_empty() {
                device.reasons.clear();
                changes.reasons_cleared = true;
            }
        }
        changes.reasons_cleared |= !self.node_reasons.is_empty();
        self.node_reasons.clear();
        self.announced.clear();
        // The counters start again from zero, and what occurred before is repaired.
        self.gate.pending.clear();
        self.dirty = true;
    }

    /// Folds in what neuron-monitor's latest report says of the devices' health.
    pub fn apply_monitor(&mut self, signals: &MonitorSignals, now: u64) -> Changes {
        let before = self.snapshot();
        let mut changes = Changes::default();
        let reason = |error: &str, counter: &str, count: u64| Reason {
            error: error.to_owned(),
            component: String::new(),
            counter: counter.to_owned(),
            source: Source::NeuronMonitor,
            action: default_action(error).to_owned(),
            core: None,
            serial: None,
            first_seen: now,
            last_seen: now,
            count,
        };
        let mut found = Vec::new();
        for (device, memory, count) in &signals.uncorrected_ecc {
            // The driver's own counters, when read, say the same with more detail.
            if self.devices.get(device).is_none_or(|d| d.reading.is_none()) && *count > 0 {
                let (error, counter) = match *memory {
                    "hbm" => ("HBM_UNCORRECTABLE_ERROR", "neuron_hw_counters/mem_ecc_uncorrected"),
                    _ => ("SRAM_UNCORRECTABLE_ERROR", "neuron_hw_counters/sram_ecc_uncorrected"),
                };
                found.push((*device, reason(error, counter, *count)));
            }
        }
        for (device, count) in &signals.hardware_errors {
            // The kernel log or the driver's counters usually name the fault first.
            if self.devices.get(device).is_none_or(|d| d.reasons.is_empty()) && *count > 0 {
                found.push((*device, reason(EXECUTION_HW_ERROR, "execution_stats/error_summary/hardware", *count)));
            }
        }
        let any = !found.is_empty();
        for (index, reason) in found {
            if index >= MAX_NEURON_DEVICES {
                continue;
            }
            let device = self.devices.entry(index).or_default();
            let new = !device.reasons.contains_key(&key(&reason));
            if new && !self.gate.admits(index, &key(&reason), Seen::Counter(reason.count), now) {
                self.dirty = true;
                continue;
            }
            if device.upsert(reason.clone(), false) {
                self.dirty = true;
                if new {
                    changes.new_faults.push((Some(index), reason));
                }
            }
        }
        changes.state_changes = self.state_changes(&before);
        if any {
            self.changed.send_replace(());
        }
        changes
    }

    /// Folds kernel-log events in.
    pub fn apply_events(&mut self, events: Vec<(Option<u64>, Event)>, last_seq: Option<u64>, now: u64) -> Changes {
        let before = self.snapshot();
        let any = !events.is_empty();
        let mut changes = Changes::default();
        for (_, event) in events {
            match event {
                Event::HwError(e) => self.apply_hw_error(e, now, &mut changes),
                Event::Xid(record) => self.gpus.apply_xid(&record, now, &mut changes),
                Event::DriverError { function } => {
                    let known = self.driver_errors.contains_key(&function);
                    let function = if known || self.driver_errors.len() < MAX_HEALTH_ERROR_NAMES {
                        function
                    } else {
                        changes.names_over_limit += 1;
                        "other".to_owned()
                    };
                    *self.driver_errors.entry(function).or_default() += 1;
                }
            }
        }
        // Persisted with the next fault: what a restart must not count twice is the
        // records with events, and those are persisted with their sequence number.
        if last_seq.is_some() {
            self.kmsg_seq = last_seq;
        }
        changes.state_changes = self.state_changes(&before);
        self.dirty |= std::mem::take(&mut self.gpus.dirty);
        if any {
            self.changed.send_replace(());
        }
        changes
    }

    /// Folds in a collection of the GPUs.
    pub fn apply_gpu_snapshot(&mut self, snapshot: &crate::gpu::GpuSnapshot, now: u64) -> Changes {
        let mut changes = Changes::default();
        self.gpus.apply_snapshot(snapshot, now, &mut changes);
        self.dirty |= std::mem::take(&mut self.gpus.dirty);
        self.changed.send_replace(());
        changes
    }

    /// Folds in an Xid NVML's event set reported for the GPU at `index`.
    pub fn apply_nvml_xid(&mut self, index: u32, code: u32, now: u64) -> Changes {
        let mut changes = Changes::default();
        self.gpus.apply_nvml_xid(index, code, now, &mut changes);
        self.dirty |= std::mem::take(&mut self.gpus.dirty);
        self.changed.send_replace(());
        changes
    }

    fn apply_hw_error(&mut self, e: HwError, now: u64, changes: &mut Changes) {
        if let Err(refusal) = self.check_device(&e) {
            changes.refused.push(refusal);
            return;
        }
        let name = self.table_name(e.name, changes);
        *self.kernel_errors.entry((Some(e.device), name.clone())).or_default() += 1;
        let reason = Reason {
            action: e.action.unwrap_or_else(|| default_action(&name).to_owned()),
            error: name,
            component: String::new(),
            counter: String::new(),
            source: Source::KernelLog,
            core: e.core,
            serial: e.serial,
            first_seen: now,
            last_seen: now,
            count: 1,
        };
        self.dirty = true;
        let device = self.devices.entry(e.device).or_default();
        let new = !device.reasons.contains_key(&key(&reason));
        if new && !self.gate.admits(e.device, &key(&reason), Seen::Once, now) {
            return;
        }
        device.upsert(reason.clone(), true);
        if new {
            changes.new_faults.push((Some(e.device), reason));
        }
    }

    /// A record's device must be one the driver's sysfs tree lists, and its serial
    /// number, when both say one, the tree's.
    fn check_device(&self, e: &HwError) -> Result<(), Refusal> {
        let reading = self.devices.get(&e.device).and_then(|d| d.reading.as_ref()).ok_or(Refusal::UnknownDevice)?;
        match (&reading.serial, &e.serial) {
            (Some(tree), Some(record)) if tree != record => Err(Refusal::SerialMismatch),
            _ => Ok(()),
        }
    }

    /// The name a record is counted under: a documented name always as itself, another
    /// one while the table has room for it, else [`OTHER_ERROR`].
    fn table_name(&self, name: String, changes: &mut Changes) -> String {
        if documented_error(&name) || name == OTHER_ERROR {
            return name;
        }
        let others: std::collections::BTreeSet<&String> =
            self.kernel_errors.keys().map(|(_, n)| n).filter(|n| !documented_error(n) && *n != OTHER_ERROR).collect();
        if others.contains(&name) || others.len() < MAX_UNDOCUMENTED_ERROR_NAMES {
            name
        } else {
            changes.names_over_limit += 1;
            OTHER_ERROR.to_owned()
        }
    }

    /// The state to persist.
    pub fn persisted(&self) -> Persisted {
        Persisted {
            boot_id: self.boot_id.clone(),
            kmsg_seq: self.kmsg_seq,
            devices: self
                .devices
                .iter()
                .filter(|(_, d)| !d.reasons.is_empty() || d.reading.is_some())
                .map(|(i, d)| PersistedDevice {
                    index: *i,
                    counter_sum: d.counter_sum.unwrap_or(0),
                    reasons: d.reasons.values().cloned().collect(),
                })
                .collect(),
            node_reasons: self.node_reasons.values().cloned().collect(),
            kernel_errors: self.kernel_errors.iter().map(|((d, n), c)| (*d, n.clone(), *c)).collect(),
            gpus: self.gpus.persisted(),
            announced: Some(self.announced.of(self.fault_keys().map(|(k, _)| k))),
            pending: self
                .gate
                .pending
                .iter()
                .map(|((device, error, component, counter), pending)| PersistedPending {
                    device: *device,
                    error: error.clone(),
                    component: component.clone(),
                    counter: counter.clone(),
                    pending: pending.clone(),
                })
                .collect(),
        }
    }

    /// Restores what a previous agent of the same boot persisted; `false` (nothing
    /// restored) for another boot.
    pub fn restore(&mut self, saved: Persisted) -> bool {
        if saved.boot_id != self.boot_id {
            return false;
        }
        self.kmsg_seq = saved.kmsg_seq;
        self.gpus.restore(saved.gpus);
        for d in saved.devices.into_iter().filter(|d| d.index < MAX_NEURON_DEVICES) {
            let device = self.devices.entry(d.index).or_default();
            device.counter_sum = Some(d.counter_sum);
            for r in d.reasons.into_iter().take(MAX_HEALTH_REASONS_PER_DEVICE) {
                device.reasons.insert(key(&r), r);
            }
        }
        for r in saved.node_reasons.into_iter().take(MAX_HEALTH_REASONS_PER_DEVICE) {
            self.node_reasons.insert(key(&r), r);
        }
        // The faults whose Event the previous agent wrote; a file of an agent before this
        // list was kept: all of them (it wrote them, or gave up with its restart).
        let written: Option<std::collections::BTreeSet<FaultKey>> = saved.announced.map(|a| a.into_iter().collect());
        let faults: Vec<FaultKey> = self.fault_keys().map(|(k, _)| k).collect();
        for k in faults {
            if written.as_ref().is_none_or(|w| w.contains(&k)) {
                self.announced.insert(k);
            }
        }
        for p in saved.pending.into_iter().filter(|p| p.device < MAX_NEURON_DEVICES).take(MAX_PENDING_FAULTS) {
            let mut pending = p.pending;
            pending.times.truncate(MAX_THRESHOLD_COUNT as usize);
            self.gate.pending.insert((p.device, p.error, p.component, p.counter), pending);
        }
        for (d, n, c) in saved.kernel_errors.into_iter().take(MAX_HEALTH_ERROR_NAMES * 4) {
            if d.is_none_or(|d| d < MAX_NEURON_DEVICES) {
                self.kernel_errors.insert((d, n), c);
            }
        }
        true
    }
}

/// Why a device's health cannot be told from its reading (before the heartbeat).
fn unknown_why(r: &DeviceReading) -> Option<&'static str> {
    if !r.unreadable.is_empty() {
        Some("unreadable")
    } else if r.state == Some(DeviceState::Resetting) {
        Some("resetting")
    } else if !r.has_health_signal() {
        Some("no_health_files")
    } else {
        None
    }
}

/// The faults a reading shows, with the counters' values as counts.
fn sysfs_reasons(r: &DeviceReading, now: u64) -> Vec<Reason> {
    let reason = |error: &str, component: &str, counter: String, core: Option<u32>, count: u64| Reason {
        error: error.to_owned(),
        component: component.to_owned(),
        counter,
        source: Source::Sysfs,
        action: default_action(error).to_owned(),
        core,
        serial: r.serial.clone(),
        first_seen: now,
        last_seen: now,
        count,
    };
    let mut out = Vec::new();
    if r.state == Some(DeviceState::Invalid) {
        out.push(reason(DEVICE_STATE_INVALID, "", "reset".to_owned(), None, 1));
    }
    for (ecc, value) in Ecc::ALL.iter().zip(r.ecc) {
        if let (Some(error), Some(n)) = (ecc.fault(), value.filter(|n| *n > 0)) {
            out.push(reason(error, "", format!("stats/hardware/{}", ecc.files().0), None, n));
        }
    }
    for component in r.components.iter().flat_map(|c| c.names()) {
        out.push(reason(UNHEALTHY_COMPONENT, component, "unhealthy_components".to_owned(), None, 1));
    }
    for core in &r.cores {
        for ((name, error), value) in CORE_ERRORS.iter().zip(core.errors) {
            if let Some(n) = value.filter(|n| *n > 0) {
                let counter = format!("neuron_core{}/stats/status/{name}/total", core.index);
                out.push(reason(error, "", counter, Some(core.index), n));
            }
        }
    }
    debug_assert!(out.iter().all(|r| r.error != REPAIRABLE_HBM_ERROR || r.action == ACTION_RELOAD));
    out
}

/// What one neuron-monitor report says of the devices' health.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MonitorSignals {
    /// (device, memory `hbm`/`sram`, uncorrected ECC events since the agent started).
    pub uncorrected_ecc: Vec<(u32, &'static str, u64)>,
    /// (device, executions failed by a hardware error since the agent started, of the
    /// applications on that device's cores).
    pub hardware_errors: Vec<(u32, u64)>,
}

/// The health state file, keyed by boot id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persisted {
    pub boot_id: String,
    pub kmsg_seq: Option<u64>,
    pub devices: Vec<PersistedDevice>,
    pub node_reasons: Vec<Reason>,
    pub kernel_errors: Vec<(Option<u32>, String, u64)>,
    /// The GPUs' faults and Xid counts (absent in files of agents without GPUs).
    #[serde(default)]
    pub gpus: Vec<PersistedGpu>,
    /// The faults whose Event is on the Node (absent in files of agents before this
    /// list: every fault then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced: Option<Vec<FaultKey>>,
    /// The faults below their threshold (absent without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PersistedPending>,
}

/// A fault below its threshold, as persisted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedPending {
    pub device: u32,
    pub error: String,
    pub component: String,
    pub counter: String,
    pub pending: Pending,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedDevice {
    pub index: u32,
    pub counter_sum: u64,
    pub reasons: Vec<Reason>,
}

#[cfg(test)]
impl HealthModel {
    /// A model whose driver tree lists devices `0..n`, ready: the kernel log's faults
    /// must name a device the tree lists (the other modules' tests).
    pub fn with_ready_devices(n: u32) -> HealthModel {
        let mut model = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
        let ready = |index| DeviceReading { index, state: Some(DeviceState::Ready), ..DeviceReading::default() };
        let node = NodeReading { driver_loaded: true, devices: (0..n).map(ready).collect(), ..NodeReading::default() };
        model.apply_reading(node, 0, Instant::now());
        model
    }
}

#[cfg(test)]
mod tests;
