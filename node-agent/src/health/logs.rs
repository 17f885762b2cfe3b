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
//! API's limits ([`take_batch`]), after creating the group and the stream when absent.
//!
//! Sending follows the CloudWatch metrics sink's rules ([`crate::sinks::cloudwatch`]):
//! same credential chain and client settings, throttling, 5xx, time-outs and
//! credentials retried with backoff without end (a long outage costs at most the queue),
//! other refusals counted as failed; on shutdown what is queued is sent within the
//! shutdown time limit. The destination (group, region) comes from a `watch` channel:
//! the flags today, the NeuronMonitorConfig's `health` section later; `None` turns the
//! stream off.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use api::cloudwatch::sink::valid_region;
use aws_sdk_cloudwatchlogs::{
    error::{ProvideErrorMetadata, SdkError},
    types::InputLogEvent,
    Client,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::Serialize;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    metrics::holders,
    model::{Changes, HealthModel, Source, State},
    SharedHealth,
};
use crate::{
    attribution::podresources::SharedDevices,
    ratelimit::{Decision, RateLimit},
    sinks::cloudwatch::publish::{classify, sdk_config, Backoff},
    state::NodeState,
    telemetry::ResultLabel,
};

/// The log group of the `health.logs` section when it names none.
pub const DEFAULT_LOG_GROUP: &str = "/aws/neuron/hardware-events";

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

/// Where the events go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDestination {
    pub group: String,
    /// Default: the instance's region, from neuron-monitor's `instance_info`.
    pub region: Option<String>,
}

impl LogDestination {
    /// The field that is not valid, if one is not.
    pub fn check(&self) -> Result<(), &'static str> {
        if !valid_log_group(&self.group) {
            return Err("group");
        }
        match &self.region {
            Some(r) if !valid_region(r) => Err("region"),
            _ => Ok(()),
        }
    }
}

/// A log group name CloudWatch Logs accepts: 1–512 characters of `[.-_/#A-Za-z0-9]`.
pub fn valid_log_group(name: &str) -> bool {
    (1..=512).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/' | b'#'))
}

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
        if (changes.new_faults.is_empty() && changes.state_changes.is_empty()) || self.destination.borrow().is_none() {
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
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
             rejected, response, other); all but rejected are retried",
            m.failures.clone(),
        );
        r.register(
            "queue_events",
            "Events waiting to be sent, including those of the request in flight",
            m.queue.clone(),
        );
        r.register(
            "invalid_destination",
            "1 while the configured log group or region is not valid (nothing is sent)",
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
            if let Some(pods) = holding.get(&device).filter(|p| !p.is_empty()) {
                record.pods = pods.split(',').map(str::to_owned).collect();
            }
        }
        queue.push(record);
    }
}

/// The events waiting to be sent, oldest first.
pub struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
    drained: Notify,
    capacity: usize,
    metrics: LogMetrics,
}

#[derive(Default)]
struct QueueState {
    records: VecDeque<Record>,
    in_flight: usize,
}

impl Queue {
    pub fn new(capacity: usize, metrics: LogMetrics) -> Self {
        Queue {
            state: Mutex::default(),
            notify: Notify::new(),
            drained: Notify::new(),
            capacity: capacity.max(1),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_depth(&self, state: &QueueState) {
        let depth = state.records.len() + state.in_flight;
        self.metrics.queue.set(depth as i64);
        if depth == 0 {
            self.drained.notify_waiters();
        }
    }

    /// Queues a record; the oldest make room when the queue is full.
    pub fn push(&self, record: Record) {
        let mut state = self.lock();
        state.records.push_back(record);
        let room = self.capacity.saturating_sub(state.in_flight).max(1);
        let excess = state.records.len().saturating_sub(room);
        if excess > 0 {
            state.records.drain(..excess);
            self.metrics.events("dropped", excess);
        }
        self.publish_depth(&state);
        drop(state);
        self.notify.notify_one();
    }

    /// Age of the oldest queued record (not in flight), if any.
    fn oldest_ms(&self) -> Option<i64> {
        self.lock().records.front().map(|r| r.timestamp_ms)
    }

    /// The next request's events, now in flight.
    fn take(&self, identity: &Identity) -> Batch {
        let mut state = self.lock();
        let batch = take_batch(&mut state.records, identity);
        state.in_flight = batch.records.len();
        batch
    }

    /// The request in flight failed and may succeed later: its records go back to the
    /// front of the queue.
    fn put_back(&self, records: Vec<Record>) {
        let mut state = self.lock();
        state.in_flight = 0;
        for record in records.into_iter().rev() {
            state.records.push_front(record);
        }
        self.publish_depth(&state);
    }

    /// The request in flight is over (sent or given up).
    fn finish(&self) {
        let mut state = self.lock();
        state.in_flight = 0;
        self.publish_depth(&state);
    }

    pub fn len(&self) -> usize {
        let state = self.lock();
        state.records.len() + state.in_flight
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Gives up everything still queued, counted under `result`.
    fn abandon(&self, result: &'static str) {
        let mut state = self.lock();
        let n = state.records.len() + state.in_flight;
        state.records.clear();
        state.in_flight = 0;
        self.metrics.events(result, n);
        self.publish_depth(&state);
    }
}

/// What names the instance in its events and stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub instance_id: Option<String>,
    pub node: Option<String>,
}

impl Identity {
    /// The stream: the instance id, else the node's name, else the host's.
    pub fn stream(&self) -> String {
        let name = self.instance_id.clone().or_else(|| self.node.clone()).unwrap_or_else(hostname);
        stream_name(&name)
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it
    // or truncates, and the last byte stays 0.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(0);
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    }
}

/// One request's events: the records (to put back if it fails) and their messages.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Record>,
    pub events: Vec<InputLogEvent>,
    /// Records left out because one alone is over the byte limit (cannot happen with
    /// the bounded fields; counted as failed rather than looped on).
    pub oversized: usize,
}

/// The next request's events, taken from the front of `queue`: at most
/// [`MAX_EVENTS_PER_REQUEST`] and [`MAX_REQUEST_BYTES`] (messages + 26 bytes each),
/// timestamps within [`MAX_SPAN_MS`], sorted by timestamp (the readers of the sysfs tree
/// and of the kernel log may hand theirs over out of order). The instance id, once
/// known, goes into the records that lack it. Every field of a record is bounded, so
/// one record is far below the byte limit.
pub fn take_batch(queue: &mut VecDeque<Record>, identity: &Identity) -> Batch {
    let mut out = Batch::default();
    let mut batch: Vec<(Record, String)> = Vec::new();
    let (mut bytes, mut min, mut max) = (0usize, i64::MAX, i64::MIN);
    while let Some(record) = queue.front() {
        if batch.len() >= MAX_EVENTS_PER_REQUEST {
            break;
        }
        let t = record.timestamp_ms;
        if !batch.is_empty() && (t.max(max) - t.min(min) > MAX_SPAN_MS) {
            break;
        }
        let mut record = record.clone();
        if record.instance_id.is_none() {
            record.instance_id = identity.instance_id.clone();
        }
        let message = serde_json::to_string(&record).unwrap_or_default();
        let size = message.len() + EVENT_OVERHEAD_BYTES;
        if size > MAX_REQUEST_BYTES {
            queue.pop_front();
            out.oversized += 1;
            continue;
        }
        if bytes + size > MAX_REQUEST_BYTES {
            break;
        }
        queue.pop_front();
        bytes += size;
        (min, max) = (min.min(t), max.max(t));
        batch.push((record, message));
    }
    batch.sort_by_key(|(r, _)| r.timestamp_ms);
    for (record, message) in batch {
        if let Ok(event) = InputLogEvent::builder().timestamp(record.timestamp_ms).message(message).build() {
            out.events.push(event);
            out.records.push(record);
        }
    }
    out
}

/// How many events of a request of `n` CloudWatch Logs refused (too old, expired, too new).
pub fn rejected_count(
    n: usize,
    too_old_end: Option<i32>,
    expired_end: Option<i32>,
    too_new_start: Option<i32>,
) -> usize {
    let index = |i: Option<i32>| i.and_then(|i| usize::try_from(i).ok());
    let old = [index(too_old_end), index(expired_end)].into_iter().flatten().map(|i| i + 1).max().unwrap_or(0);
    let new = index(too_new_start).map_or(0, |i| n.saturating_sub(i));
    (old.min(n) + new).min(n)
}

/// What a failed call says: retry it (and why it failed), or give up.
enum Outcome {
    Done,
    /// The group or stream is missing: create them and retry.
    NotFound,
    Retry(&'static str),
    GiveUp(&'static str),
}

fn outcome<E: ProvideErrorMetadata + std::error::Error + 'static>(
    error: &SdkError<E, aws_sdk_cloudwatchlogs::config::http::HttpResponse>,
    log_limit: &mut RateLimit,
    what: &str,
) -> Outcome {
    let code = match error {
        SdkError::ServiceError(e) => e.err().code().unwrap_or_default(),
        _ => "",
    };
    let outcome = match code {
        "ResourceAlreadyExistsException" => return Outcome::Done,
        "ResourceNotFoundException" => Outcome::NotFound,
        _ => {
            let failure = classify(error);
            if failure.retry {
                Outcome::Retry(failure.reason)
            } else {
                Outcome::GiveUp(failure.reason)
            }
        }
    };
    if let Decision::Allow { suppressed_before } = log_limit.check() {
        let detail = aws_sdk_cloudwatchlogs::error::DisplayErrorContext(error);
        warn!(call = what, suppressed_before, error = %detail, "CloudWatch Logs request failed");
    }
    outcome
}

/// Sends the queue's events to the destination in force.
struct Sender {
    queue: Arc<Queue>,
    destination: watch::Receiver<Option<LogDestination>>,
    state: Arc<Mutex<NodeState>>,
    node_name: Option<String>,
    options: LogOptions,
    metrics: LogMetrics,
    /// The agent is stopping: send at once, do not wait for the instance id.
    closing: CancellationToken,
    started: Instant,
}

/// The client of a region, and the group and stream it created.
struct Connection {
    region: String,
    client: Client,
    ready: Option<(String, String)>,
}

impl Sender {
    async fn run(self, stop: CancellationToken) {
        let mut connection: Option<Connection> = None;
        let mut log_limit = RateLimit::new(5, Duration::from_secs(60));
        let mut attempt = 0u32;
        let mut announced: Option<LogDestination> = None;
        loop {
            // Something to send, and the time to send it.
            let wait = self.wait();
            tokio::select! {
                _ = stop.cancelled() => return,
                ready = wait => if !ready { continue },
            }
            let destination = self.destination.borrow().clone();
            let Some(destination) = destination else {
                // Turned off: what was queued for it goes.
                self.queue.abandon("dropped");
                continue;
            };
            if let Err(field) = destination.check() {
                self.metrics.invalid.set(1);
                if announced.as_ref() != Some(&destination) {
                    warn!(group = %destination.group, region = ?destination.region, field,
                          "hardware-health log stream left out: invalid destination");
                    announced = Some(destination);
                }
                self.queue.abandon("dropped");
                continue;
            }
            self.metrics.invalid.set(0);
            let (identity, instance_region) = self.identity();
            // The first events wait a little for the instance id that names the stream.
            if identity.instance_id.is_none()
                && self.started.elapsed() < INSTANCE_ID_WAIT
                && !self.closing.is_cancelled()
            {
                self.pause(&stop, Duration::from_millis(250)).await;
                continue;
            }
            let Some(region) = destination.region.clone().or(instance_region) else {
                // No region yet: the events wait for neuron-monitor's first report.
                self.pause(&stop, Duration::from_millis(500)).await;
                continue;
            };
            if announced.as_ref() != Some(&destination) {
                info!(group = %destination.group, %region, stream = %identity.stream(),
                      "sending hardware-health events to CloudWatch Logs");
                announced = Some(destination.clone());
            }
            if connection.as_ref().is_none_or(|c| c.region != region) {
                let client = Client::new(&sdk_config(&region, self.options.request_timeout).await);
                connection = Some(Connection { region: region.clone(), client, ready: None });
            }
            let Some(conn) = connection.as_mut() else { continue };
            let target = (destination.group.clone(), identity.stream());
            let result = match conn.ready.as_ref() == Some(&target) {
                true => self.put(conn, &target, &identity, &mut log_limit).await,
                false => match ensure(&conn.client, &target, &mut log_limit).await {
                    Outcome::Done => {
                        conn.ready = Some(target.clone());
                        self.put(conn, &target, &identity, &mut log_limit).await
                    }
                    other => other,
                },
            };
            match result {
                Outcome::Done => attempt = 0,
                Outcome::NotFound => {
                    self.metrics.failure("not_found");
                    conn.ready = None;
                    self.backoff(&stop, &mut attempt).await;
                }
                Outcome::Retry(reason) => {
                    self.metrics.failure(reason);
                    self.backoff(&stop, &mut attempt).await;
                }
                Outcome::GiveUp(reason) => {
                    // The group or stream cannot be made (an invalid name for the
                    // service, a refused request): what is queued cannot go.
                    self.metrics.failure(reason);
                    self.queue.abandon("failed");
                    attempt = 0;
                }
            }
        }
    }

    /// Waits until there is something to send and its time came: the oldest event waited
    /// the flush interval, a request's worth is queued, or the agent is stopping. `false`:
    /// look again.
    async fn wait(&self) -> bool {
        let notified = self.queue.notify.notified();
        let Some(oldest) = self.queue.oldest_ms() else {
            // Nothing to send, closing or not: wait for more (or for `stop`).
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            return false;
        };
        if self.closing.is_cancelled() || self.queue.len() >= MAX_EVENTS_PER_REQUEST {
            return true;
        }
        let waited = Duration::from_millis(unix_millis().saturating_sub(oldest).max(0) as u64);
        if waited >= self.options.flush_interval {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(self.options.flush_interval - waited) => {}
            _ = self.closing.cancelled() => {}
        }
        true
    }

    /// The instance id (once known, or given up waiting for) and the instance's region.
    fn identity(&self) -> (Identity, Option<String>) {
        let instance = self.state.lock().unwrap_or_else(|p| p.into_inner()).instance.clone();
        let known = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let identity = Identity { instance_id: known(&instance.instance_id), node: self.node_name.clone() };
        (identity, known(&instance.region))
    }

    async fn pause(&self, stop: &CancellationToken, d: Duration) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    async fn backoff(&self, stop: &CancellationToken, attempt: &mut u32) {
        let delay = self.options.backoff.delay(*attempt);
        *attempt = attempt.saturating_add(1);
        self.pause(stop, delay).await;
    }

    /// One PutLogEvents of the queue's next events.
    async fn put(
        &self,
        conn: &Connection,
        (group, stream): &(String, String),
        identity: &Identity,
        log_limit: &mut RateLimit,
    ) -> Outcome {
        let Batch { records, events, oversized } = self.queue.take(identity);
        self.metrics.events("failed", oversized);
        if events.is_empty() {
            self.queue.finish();
            return Outcome::Done;
        }
        let n = events.len();
        let result = conn
            .client
            .put_log_events()
            .log_group_name(group)
            .log_stream_name(stream)
            .set_log_events(Some(events))
            .send()
            .await;
        let outcome = match result {
            Ok(out) => {
                let rejected = out.rejected_log_events_info().map_or(0, |r| {
                    rejected_count(
                        n,
                        r.too_old_log_event_end_index(),
                        r.expired_log_event_end_index(),
                        r.too_new_log_event_start_index(),
                    )
                });
                if rejected > 0 {
                    self.metrics.failure("rejected");
                    warn!(events = rejected, "CloudWatch Logs refused hardware-health events (too old or too new)");
                }
                self.metrics.events("sent", n - rejected);
                self.metrics.events("failed", rejected);
                debug!(events = n, %group, %stream, "PutLogEvents accepted");
                self.queue.finish();
                return Outcome::Done;
            }
            Err(e) => outcome(&e, log_limit, "PutLogEvents"),
        };
        match outcome {
            // Refused for its content: these events cannot go, the others may.
            Outcome::GiveUp(reason) => {
                self.metrics.failure(reason);
                self.metrics.events("failed", n);
                self.queue.finish();
                Outcome::Done
            }
            // Not sent: the events go back to the front of the queue.
            other => {
                self.queue.put_back(records);
                other
            }
        }
    }
}

/// Creates the group and the stream when absent.
async fn ensure(client: &Client, (group, stream): &(String, String), log_limit: &mut RateLimit) -> Outcome {
    match client.create_log_group().log_group_name(group).send().await {
        Ok(_) => info!(%group, "created the log group"),
        Err(e) => match outcome(&e, log_limit, "CreateLogGroup") {
            Outcome::Done => {}
            // Not allowed to create groups: the group may exist, made by its owner.
            Outcome::Retry("auth") => {}
            other => return other,
        },
    }
    match client.create_log_stream().log_group_name(group).log_stream_name(stream).send().await {
        Ok(_) => {
            info!(%group, %stream, "created the log stream");
            Outcome::Done
        }
        Err(e) => outcome(&e, log_limit, "CreateLogStream"),
    }
}

#[cfg(test)]
mod tests;
