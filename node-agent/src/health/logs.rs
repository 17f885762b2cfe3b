//! The hardware-health event stream in CloudWatch Logs: one JSON event per new fault and
//! per state change of a device or of the node, in a log group (default
//! `/aws/neuron/hardware-events`) with one stream per instance id — the pattern the
//! CloudWatch agent uses for accelerator errors.
//!
//! Data flows: the readers turn the [`Changes`] of each update into [`Record`]s under the
//! model's lock and hand them to a [`Feed`] (a bounded channel, never waiting: a full
//! channel drops and counts) → [`LogSink::run`] adds what the readers do not know (the
//! instance id, the node, the pods holding the device) and queues them (bounded, oldest
//! dropped first) → a sender task puts them with `PutLogEvents`, in batches within the
//! API's limits ([`take_batch`]), after creating the group and the stream when absent
//! ([`send`]).
//!
//! Sending follows the CloudWatch metrics sink's rules ([`crate::sinks::cloudwatch`]):
//! same credential chain and client settings, throttling, 5xx, time-outs and
//! credentials retried with backoff without end (a long outage costs at most the queue),
//! other refusals counted as failed; on shutdown what is queued is sent within the
//! shutdown time limit. The destination (group, region) comes from a `watch` channel:
//! the flags today, the NeuronMonitorConfig's `health` section later; `None` turns the
//! stream off.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::send::Sender;
use super::{
    metrics::holders,
    model::{Changes, HealthModel, Source, State},
    SharedHealth,
};
use crate::{
    attribution::podresources::SharedDevices,
    delivery::backoff::Backoff,
    state::NodeState,
    telemetry::{ReasonLabel, ResultLabel},
};

pub use api::node_config::DEFAULT_LOG_GROUP;

/// PutLogEvents' limits: events per request, bytes per request (each event's UTF-8
/// message plus 26), the span of a request's timestamps.
pub const MAX_EVENTS_PER_REQUEST: usize = 10_000;
pub const MAX_REQUEST_BYTES: usize = 1_048_576;
pub const EVENT_OVERHEAD_BYTES: usize = 26;
pub const MAX_SPAN_MS: i64 = 24 * 3600 * 1000;
/// Bytes of any one text field of an event (driver version, serial number, names): the
/// values come from files and records the agent does not control.
const MAX_FIELD_BYTES: usize = 256;
/// Changes the readers may hand over before the sink task takes them.
const FEED_CAPACITY: usize = 1024;
/// How long the first events wait for neuron-monitor's instance id (their stream's
/// name) before going to the stream named after the node or host.
const INSTANCE_ID_WAIT: Duration = Duration::from_secs(30);

/// Where the events go (the node configuration's `health.logs`, or the flags).
pub use api::node_config::LogDestination;

/// A log stream name from an instance id, node or host name: at most 512 characters,
/// without `:` or `*` (which CloudWatch Logs refuses).
pub fn stream_name(name: &str) -> String {
    let cleaned: String = name.chars().map(|c| if c == ':' || c == '*' || c.is_control() { '_' } else { c }).collect();
    let cleaned = cut(&cleaned, 512);
    if cleaned.is_empty() {
        "unknown".to_owned()
    } else {
        cleaned
    }
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// One event of the stream, as it is written (JSON). Every key is always present
/// (`null` when it does not apply), so queries see one schema.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Record {
    /// RFC 3339, milliseconds, UTC.
    pub time: String,
    /// `fault` (a fault first seen) or `state_change` (of a device, or of the node when
    /// `device` is null).
    pub event: &'static str,
    pub instance_id: Option<String>,
    pub node: Option<String>,
    pub device: Option<u32>,
    pub core: Option<u32>,
    /// The `NEURON_HW_ERR` name, or the equivalent for a sysfs signal.
    pub error: Option<String>,
    pub component: Option<String>,
    pub counter: Option<String>,
    pub count: Option<u64>,
    pub source: Option<Source>,
    pub serial_number: Option<String>,
    pub action: Option<String>,
    pub state_before: Option<&'static str>,
    pub state_after: &'static str,
    /// Why the state is unknown, when it is.
    pub unknown_reason: Option<&'static str>,
    /// `namespace/pod` of the pods holding the device (with pod attribution).
    pub pods: Vec<String>,
    pub driver_version: Option<String>,
    /// `neuron`, or `nvidia_gpu` for a GPU's event (`device` null, `gpu` its index; both
    /// null: the GPUs together).
    pub accelerator: &'static str,
    pub gpu: Option<u32>,
    pub gpu_uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    /// The Xid code of an Xid fault.
    pub xid: Option<u32>,
    /// The event's CloudWatch timestamp (the `time` above).
    #[serde(skip)]
    pub timestamp_ms: i64,
}

/// The records of one update of the model (call with the model's lock held, after the
/// update): a `fault` per new fault, a `state_change` per device or node state changed.
pub fn records(changes: &Changes, model: &HealthModel, timestamp_ms: i64) -> Vec<Record> {
    let time =
        k8s_openapi::jiff::Timestamp::from_millisecond(timestamp_ms).map(|t| format!("{t:.3}")).unwrap_or_default();
    let driver_version = model.driver_version.as_deref().map(|v| cut(v.trim(), MAX_FIELD_BYTES));
    let state_of = |device: Option<u32>| match device {
        Some(d) => model.devices.get(&d).map_or(State::Unknown, |d| d.state()),
        None => model.node_state(),
    };
    let serial_of = |device: Option<u32>| {
        device.and_then(|d| model.devices.get(&d)?.reading.as_ref()?.serial.as_deref().map(|s| cut(s, MAX_FIELD_BYTES)))
    };
    let blank = |event, device: Option<u32>, before: Option<State>, after: State| Record {
        time: time.clone(),
        event,
        instance_id: None,
        node: None,
        device,
        core: None,
        error: None,
        component: None,
        counter: None,
        count: None,
        source: None,
        serial_number: serial_of(device),
        action: None,
        state_before: before.map(State::as_str),
        state_after: after.as_str(),
        unknown_reason: None,
        pods: Vec::new(),
        driver_version: driver_version.clone(),
        accelerator: "neuron",
        gpu: None,
        gpu_uuid: None,
        pci_bus_id: None,
        xid: None,
        timestamp_ms,
    };
    let text = |s: &str| (!s.is_empty()).then(|| cut(s, MAX_FIELD_BYTES));
    let mut out = Vec::with_capacity(changes.new_faults.len() + changes.state_changes.len());
    for (device, r) in &changes.new_faults {
        let (before, after) = changes.states_of(*device, state_of(*device));
        let mut record = blank("fault", *device, before, after);
        record.core = r.core;
        record.error = text(&r.error);
        record.component = text(&r.component);
        record.counter = text(&r.counter);
        record.count = Some(r.count);
        record.source = Some(r.source);
        record.action = text(&r.action);
        if let Some(serial) = r.serial.as_deref().and_then(text) {
            record.serial_number = Some(serial);
        }
        out.push(record);
    }
    for change in &changes.state_changes {
        let mut record = blank("state_change", change.device, change.before, change.after);
        if let Some(device) = change.device.and_then(|d| model.devices.get(&d)) {
            if change.after == State::Unhealthy {
                if let Some(r) = device.worst() {
                    record.error = text(&r.error);
                    record.action = text(&r.action);
                    record.core = r.core;
                }
            }
            if change.after == State::Unknown {
                record.unknown_reason = Some(device.unknown.unwrap_or("not_read"));
            }
        }
        out.push(record);
    }
    out.extend(gpu_records(changes, model, blank("fault", None, None, State::Unknown)));
    out
}

/// The records of the GPUs' new faults and state changes; `blank`: a Neuron record of
/// this update to start from.
fn gpu_records(changes: &Changes, model: &HealthModel, blank: Record) -> Vec<Record> {
    let gpus = &model.gpus;
    let driver_version = gpus.driver_version.as_deref().map(|v| cut(v.trim(), MAX_FIELD_BYTES));
    let text = |s: &str| (!s.is_empty()).then(|| cut(s, MAX_FIELD_BYTES));
    let record = |event, gpu: Option<u32>, before: Option<State>, after: State| {
        let identity = gpu.and_then(|g| gpus.gpus.get(&g)).map(|g| &g.identity);
        Record {
            event,
            accelerator: "nvidia_gpu",
            serial_number: None,
            driver_version: driver_version.clone(),
            state_before: before.map(State::as_str),
            state_after: after.as_str(),
            gpu,
            gpu_uuid: identity.and_then(|i| text(&i.uuid)),
            pci_bus_id: identity.and_then(|i| text(&i.pci_bus_id)),
            ..blank.clone()
        }
    };
    let mut out = Vec::new();
    for (gpu, r) in &changes.gpu_faults {
        let state = gpus.state_of(*gpu);
        let (before, after) = changes
            .gpu_state_changes
            .iter()
            .find(|c| c.device == Some(*gpu))
            .map_or((Some(state), state), |c| (c.before, c.after));
        let mut fault = record("fault", Some(*gpu), before, after);
        fault.error = text(&r.error);
        fault.count = Some(r.count);
        fault.source = Some(r.source);
        fault.action = text(&r.action);
        fault.xid = r.error.strip_prefix("XID_").and_then(|c| c.parse().ok());
        out.push(fault);
    }
    for change in &changes.gpu_state_changes {
        let mut state = record("state_change", change.device, change.before, change.after);
        let worst = change.device.and_then(|g| gpus.gpus.get(&g)?.worst());
        if let Some(r) = worst.filter(|_| change.after == State::Unhealthy) {
            state.error = text(&r.error);
            state.action = text(&r.action);
        }
        out.push(state);
    }
    out
}

fn unix_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The readers' end of the stream; cloning shares it.
#[derive(Clone, Debug)]
pub struct Feed {
    tx: mpsc::Sender<Record>,
    destination: watch::Receiver<Option<LogDestination>>,
    metrics: LogMetrics,
}

impl Feed {
    /// Hands the records of an update over (with the model's lock held): never waits;
    /// nothing to do while the stream is off.
    pub fn send(&self, changes: &Changes, model: &HealthModel) {
        let nothing = changes.new_faults.is_empty()
            && changes.state_changes.is_empty()
            && changes.gpu_faults.is_empty()
            && changes.gpu_state_changes.is_empty();
        if nothing || self.destination.borrow().is_none() {
            return;
        }
        for record in records(changes, model, unix_millis()) {
            if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(record) {
                self.metrics.events("dropped", 1);
            }
        }
    }
}

/// The stream's own metrics (`neuron_agent_health_log_*`); cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct LogMetrics {
    pub events: Family<ResultLabel, Counter>,
    pub failures: Family<ReasonLabel, Counter>,
    pub queue: Gauge,
    pub invalid: Gauge,
}

impl LogMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = LogMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent_health_log");
        r.register(
            "events",
            "Hardware-health events of the CloudWatch Logs stream, by result (sent: accepted; dropped: the queue was \
             full, the stream was turned off or the shutdown time limit passed; failed: refused by CloudWatch Logs)",
            m.events.clone(),
        );
        r.register(
            "failures",
            "Failed CloudWatch Logs requests by reason (throttled, server_error, timeout, network, auth, not_found, \
             rejected, response, response_too_large: an answer over 64 KiB, not read, other); all but rejected and \
             response_too_large after a 2xx are retried",
            m.failures.clone(),
        );
        r.register(
            "queue_events",
            "Events waiting to be sent, including those of the request in flight",
            m.queue.clone(),
        );
        r.register(
            "invalid_destination",
            "1 while the configured log group or region is not valid, or the region is in another AWS partition \
             than the instance's (nothing is sent)",
            m.invalid.clone(),
        );
        m
    }

    fn events(&self, result: &'static str, n: usize) {
        if n > 0 {
            self.events.get_or_create(&ResultLabel { result }).inc_by(n as u64);
        }
    }

    fn failure(&self, reason: &'static str) {
        self.failures.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// The agent-wide settings of the stream.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// Events kept waiting at most; beyond it the oldest are dropped.
    pub queue_events: usize,
    /// How long an event may wait for others to share its request.
    pub flush_interval: Duration,
    pub backoff: Backoff,
    pub request_timeout: Duration,
    pub shutdown_timeout: Duration,
}

/// The readers' feed and the sink that takes it.
pub fn channel(
    destination: watch::Receiver<Option<LogDestination>>,
    metrics: &LogMetrics,
) -> (Feed, mpsc::Receiver<Record>) {
    let (tx, rx) = mpsc::channel(FEED_CAPACITY);
    (Feed { tx, destination, metrics: metrics.clone() }, rx)
}

/// The sink: enriches the readers' records, queues them and sends them.
pub struct LogSink {
    pub destination: watch::Receiver<Option<LogDestination>>,
    pub records: mpsc::Receiver<Record>,
    /// Instance id, region and cores per device, from neuron-monitor's reports.
    pub state: Arc<Mutex<NodeState>>,
    pub health: SharedHealth,
    pub devices: Option<SharedDevices>,
    pub node_name: Option<String>,
    pub options: LogOptions,
    pub metrics: LogMetrics,
}

impl LogSink {
    /// Runs until `shutdown`, then sends what is queued within the shutdown time limit.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let queue = Arc::new(Queue::new(self.options.queue_events, self.metrics.clone()));
        let stop_sender = CancellationToken::new();
        let sender = Sender {
            queue: queue.clone(),
            destination: self.destination.clone(),
            state: self.state.clone(),
            node_name: self.node_name.clone(),
            options: self.options.clone(),
            metrics: self.metrics.clone(),
            closing: shutdown.clone(),
            started: Instant::now(),
        };
        let sender = tokio::spawn(sender.run(stop_sender.clone()));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                record = self.records.recv() => match record {
                    Some(record) => self.take(&queue, record),
                    None => break,
                },
            }
        }
        while let Ok(record) = self.records.try_recv() {
            self.take(&queue, record);
        }
        if !queue.is_empty() {
            info!(events = queue.len(), "sending the queued hardware-health events");
        }
        if tokio::time::timeout(self.options.shutdown_timeout, queue.wait_drained()).await.is_err() {
            warn!(events = queue.len(), "hardware-health events not sent within the shutdown time limit");
        }
        stop_sender.cancel();
        let _ = sender.await;
        queue.abandon("dropped");
    }

    /// Adds the pods holding the record's device, and queues it.
    fn take(&self, queue: &Queue, mut record: Record) {
        if self.destination.borrow().is_none() {
            return;
        }
        record.node = self.node_name.as_deref().map(|n| cut(n, MAX_FIELD_BYTES));
        if let (Some(devices), Some(device)) = (&self.devices, record.device) {
            let cores_per_device = {
                let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state.hardware.as_ref().and_then(|h| h.cores_per_device)
            };
            let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let ownership = devices.read().unwrap_or_else(|p| p.into_inner());
            let holding = holders(ownership.allocations(), &health, cores_per_device);
            if let Some(h) = holding.get(&device).filter(|h| !h.pods.is_empty()) {
                record.pods = h.pods.split(',').map(str::to_owned).collect();
            }
        }
        queue.push([record]);
    }
}

mod send;

pub use send::{rejected_count, take_batch, Batch, Identity, Queue};

#[cfg(test)]
mod tests;
