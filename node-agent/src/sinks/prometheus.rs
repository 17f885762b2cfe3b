//! The metric families of the node state, with the metric names and labels of AWS's
//! `neuron-monitor-prometheus.py` (the names AWS's Grafana dashboard queries), and their
//! Prometheus exposition.
//!
//! One piece of code ([`encode_node`]) produces the families of a [`Scope`]: `/metrics`'
//! (what every Prometheus route exports) or one route's (what its OTLP sink sends: a
//! team's config its namespace's applications, the operator namespace's config also the
//! node-level series). Each family goes to a [`FamilyEncoder`]: the page's text encoder
//! ([`text::TextEncoder`]) here, an OTLP request in `sinks::otlp`.
//!
//! The node state, like every [`Exported`] source, is encoded on each scrape, so a series
//! that left the state (a runtime that exited) leaves the exposition at once, with no
//! bookkeeping. The sources' families are written in the scraper's format directly; the
//! agent's own metrics (prometheus-client's registry, a small part of the page) are
//! written by prometheus-client and converted when the classic format is asked for. The
//! page is written into buffers the renders reuse ([`Buffers`]): a page of half a
//! megabyte built afresh on each scrape cost a megabyte of new memory and ~245 page
//! faults every time.
//!
//! `/metrics` sends a page in two parts: the agent's own metrics, encoded for each scrape
//! (a few kilobytes: its counters of connections, token checks, reports are exact), then
//! the families of the node, the costly part, which are kept and shared
//! ([`Exposition::shared_families`]): the scrapes that follow within [`PAGE_MAX_AGE`],
//! with no report in between, are answered with the same `bytes::Bytes` (a reference,
//! not a copy, per connection), so a flood of scrapes costs one render a second and one
//! copy of the families in memory. Renders wait for a slot of the scrape's own port
//! ([`Exposition::render_slot`]): a flood on the token-free port does not queue
//! Prometheus on the main one.

use std::{
    collections::BTreeMap,
    fmt::{self, Write},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::{
    hardware::{peak_flops, Generation, InstanceType},
    monitor_config::{RuntimeGroup, SystemGroup},
    report::DeviceEccCounters,
};
use prometheus_client::{
    encoding::text as own_metrics,
    metrics::{counter::Counter, MetricType},
    registry::Registry,
};
use service::http::Port;

mod text;

use crate::{
    processes::{ProcessSample, SharedProcesses},
    routing::{PrometheusView, SharedRouting},
    series::{classic_suffix, Exported, Family, FamilyEncoder, Labels, Scope},
    state::{IdleCore, InstanceLabels, LoadedModels, NamedValues, NodeState, RuntimeState},
};

/// The exposition formats the agent serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: what `promtool check metrics` and most tools read.
    Classic,
    /// `application/openmetrics-text; version=1.0.0`, when the scraper asks for it.
    OpenMetrics,
}

impl Format {
    /// Picks the format from an HTTP `Accept` header.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Classic,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// Its place among the kept pages.
    fn index(self) -> usize {
        match self {
            Format::Classic => 0,
            Format::OpenMetrics => 1,
        }
    }
}

/// How long the node's rendered families answer the scrapes that follow (none after a
/// report): what the sources read between reports (health, EFA, GPUs, processes) may lag
/// in a repeated scrape.
pub const PAGE_MAX_AGE: Duration = Duration::from_secs(1);

/// The node's families kept for the scrapes that follow their render.
struct Page {
    /// Reports applied when its render began.
    reports: u64,
    /// When its render began.
    started: Instant,
    body: bytes::Bytes,
}

impl Page {
    /// Whether it answers a scrape that arrived at `asked`, `reports` reports applied:
    /// rendered since that report, less than [`PAGE_MAX_AGE`] ago, or begun since the
    /// scrape arrived.
    fn answers(&self, reports: u64, asked: Instant) -> bool {
        self.started >= asked || (self.reports >= reports && self.started.elapsed() < PAGE_MAX_AGE)
    }
}

/// Everything `/metrics` serves: the agent's own registry plus the node state.
pub struct Exposition {
    /// The agent's own metrics.
    registry: Registry,
    /// The node state's families, then those of the other sources, in the page's order.
    exported: Vec<Box<dyn Exported>>,
    /// Renders at once, per port: each holds a whole exposition in memory, so a burst of
    /// scrapes waits here rather than multiplying the agent's memory, and a port's burst
    /// waits for that port's slots alone.
    renders: [tokio::sync::Semaphore; 3],
    /// The latest families of each format.
    pages: Mutex<[Option<Page>; 2]>,
    /// Renders of the families (`neuron_agent_metrics_renders_total`).
    renders_done: Counter,
    buffers: Arc<Buffers>,
}

/// The text buffers of the renders, kept between scrapes: two per render slot (the page,
/// and the agent's own metrics before their classic conversion).
#[derive(Default)]
struct Buffers(Mutex<Vec<String>>);

/// A buffer is kept only up to this size: a page that grew once (a burst of runtimes)
/// must not hold its memory for good.
const MAX_KEPT_BUFFER: usize = 4 * 1024 * 1024;

impl Buffers {
    fn take(&self) -> String {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        kept.unwrap_or_else(|| String::with_capacity(64 * 1024))
    }

    fn give(&self, mut text: String) {
        if text.capacity() > MAX_KEPT_BUFFER {
            return;
        }
        text.clear();
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < 2 * CONCURRENT_RENDERS {
            kept.push(text);
        }
    }
}

/// A rendered page: its text, whose buffer goes back to the renders once the page is
/// dropped (for `/metrics`, once the response is sent).
pub struct Rendered {
    text: String,
    buffers: Arc<Buffers>,
}

impl Rendered {
    /// The page as a response body, sent without a copy.
    pub fn into_body(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl std::ops::Deref for Rendered {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Rendered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AsRef<[u8]> for Rendered {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
}

impl Drop for Rendered {
    fn drop(&mut self) {
        self.buffers.give(std::mem::take(&mut self.text));
    }
}

/// Concurrent renders of [`Exposition`] per port: Prometheus scrapes a target one at a
/// time; two leave room for a second scraper or a person with curl.
const CONCURRENT_RENDERS: usize = 2;

/// The render slots of `port`.
fn slot_index(port: Port) -> usize {
    match port {
        Port::Main => 0,
        Port::Tokenless => 1,
        Port::Probes => 2,
    }
}

impl Exposition {
    /// `registry`: the agent's own metrics, where the count of renders is registered too;
    /// `processes`: the latest read of the runtimes' processes, joined to them by PID.
    pub fn new(
        mut registry: Registry,
        state: Arc<Mutex<NodeState>>,
        processes: SharedProcesses,
        routing: SharedRouting,
    ) -> Self {
        let renders_done = Counter::default();
        registry.register(
            "neuron_agent_metrics_renders",
            "Renders of the node's families for /metrics (scrapes within a second and no report apart share one)",
            renders_done.clone(),
        );
        Exposition {
            registry,
            exported: vec![Box::new(NodeCollector { state, processes, routing })],
            renders: std::array::from_fn(|_| tokio::sync::Semaphore::new(CONCURRENT_RENDERS)),
            pages: Mutex::default(),
            renders_done,
            buffers: Arc::default(),
        }
    }

    /// Adds a source's families to the page, after those there.
    pub fn export(&mut self, source: Box<dyn Exported>) {
        self.exported.push(source);
    }

    /// Waits for one of the [`CONCURRENT_RENDERS`] render slots of `port`; hold it while
    /// rendering.
    pub async fn render_slot(&self, port: Port) -> tokio::sync::SemaphorePermit<'_> {
        // The semaphore is never closed, so `acquire` cannot fail; `forget`-free fallback anyway.
        loop {
            if let Ok(permit) = self.renders[slot_index(port)].acquire().await {
                return permit;
            }
        }
    }

    /// The kept families of `format` for a scrape that arrived at `asked`, `reports`
    /// reports applied ([`Page::answers`]), shared.
    pub fn shared_families(&self, format: Format, reports: u64, asked: Instant) -> Option<bytes::Bytes> {
        let pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        pages[format.index()].as_ref().filter(|page| page.answers(reports, asked)).map(|page| page.body.clone())
    }

    /// Renders the node's families in `format` and keeps them for the scrapes that
    /// follow; `reports`: the reports applied before the render began.
    pub fn render_families(&self, format: Format, reports: u64) -> Result<bytes::Bytes, fmt::Error> {
        let started = Instant::now();
        let mut families = Rendered { text: self.buffers.take(), buffers: self.buffers.clone() };
        self.write_families(format, &mut families.text)?;
        let body = families.into_body();
        self.renders_done.inc();
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        let newer = pages[format.index()].as_ref().is_some_and(|kept| kept.started > started);
        if !newer {
            pages[format.index()] = Some(Page { reports, started, body: body.clone() });
        }
        Ok(body)
    }

    /// The agent's own metrics in `format`, the part of the page before the families: a
    /// copy of its exact size (a few kilobytes, one per response waiting to be sent), the
    /// buffer written given back at once.
    pub fn own_metrics(&self, format: Format) -> Result<bytes::Bytes, fmt::Error> {
        let mut own = Rendered { text: self.buffers.take(), buffers: self.buffers.clone() };
        self.write_own(format, &mut own.text)?;
        Ok(bytes::Bytes::copy_from_slice(own.text.as_bytes()))
    }

    /// The whole page: the agent's own metrics, then the node's families.
    pub fn render(&self, format: Format) -> Result<Rendered, fmt::Error> {
        let mut page = Rendered { text: self.buffers.take(), buffers: self.buffers.clone() };
        self.write_own(format, &mut page.text)?;
        self.write_families(format, &mut page.text)?;
        Ok(page)
    }

    fn write_own(&self, format: Format, out: &mut String) -> fmt::Result {
        match format {
            Format::OpenMetrics => own_metrics::encode_registry(out, &self.registry),
            Format::Classic => {
                let mut open = self.buffers.take();
                own_metrics::encode_registry(&mut open, &self.registry)?;
                write_classic(&open, out);
                self.buffers.give(open);
                Ok(())
            }
        }
    }

    /// The sources' families, and the end of an OpenMetrics page.
    fn write_families(&self, format: Format, out: &mut String) -> fmt::Result {
        let mut encoder = text::TextEncoder::new(out, format);
        for source in &self.exported {
            source.export(&mut encoder)?;
        }
        if format == Format::OpenMetrics {
            own_metrics::encode_eof(out)?;
        }
        Ok(())
    }
}

struct NodeCollector {
    state: Arc<Mutex<NodeState>>,
    processes: SharedProcesses,
    routing: SharedRouting,
}

impl Exported for NodeCollector {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        let routing = self.routing.current();
        // A poisoned lock only means an update panicked half-way; the data is still the
        // best there is, and a scrape must not fail because of it.
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Taken after the state's lock, never the other way (the reader holds one at a time).
        let processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        encode_node(&state, &processes, Scope::Exposition(&routing), encoder)
    }
}

/// `HeldCore::flops`, in order. The report gives no data type per core, so no ratio to
/// a peak is computed (the peak depends on it): `neuroncore_peak_flops` exports the
/// documented peaks per data type to divide by.
const CORE_FLOPS_METRICS: [(&str, &str); 2] = [
    ("neuroncore_flops", "Floating-point operations per second of a NeuronCore over the period (neuron-monitor's flops)"),
    (
        "neuroncore_effective_flops",
        "Effective floating-point operations per second of a NeuronCore over the period (neuron-monitor's effective_flops)",
    ),
];

const CORE_MEMORY_METRICS: [(&str, &str); 5] = [
    ("neuroncore_memory_usage_constants", "NeuronCore memory used by constants, bytes"),
    ("neuroncore_memory_usage_model_code", "NeuronCore memory used by model code, bytes"),
    ("neuroncore_memory_usage_model_shared_scratchpad", "NeuronCore memory used by the model shared scratchpad, bytes"),
    ("neuroncore_memory_usage_runtime_memory", "NeuronCore memory used by the runtime, bytes"),
    ("neuroncore_memory_usage_tensors", "NeuronCore memory used by tensors, bytes"),
];

/// The families of the node state that `scope` takes.
pub fn encode_node(
    state: &NodeState,
    processes: &BTreeMap<u32, ProcessSample>,
    scope: Scope<'_>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    // Each runtime with what the scope gives it; runtimes it does not take drop out.
    let routed: Vec<(&RuntimeState, PrometheusView)> = state
        .runtimes
        .iter()
        .filter_map(|rt| {
            let namespace = rt.labels.pod.as_ref().map(|p| p.namespace.as_str());
            scope.view(namespace, &rt.labels.runtime_tag).map(|view| (rt, view))
        })
        .collect();
    let idle_cores = state.idle_cores.iter().filter(|c| scope.idle_core(c.pod.as_ref().map(|p| p.namespace.as_str())));
    let idle_cores: Vec<&IdleCore> = idle_cores.collect();
    encode_runtimes(state, &routed, &idle_cores, encoder)?;
    encode_processes(processes, &routed, encoder)?;
    // A team sees the node's description only where it has series of its own.
    let described = scope.node_level() || !routed.is_empty() || !idle_cores.is_empty();
    encode_system(state, scope, described, encoder)?;
    if scope.node_level() {
        encode_problems(state, &routed, encoder)?;
        encode_allocation(state, encoder)?;
    }
    Ok(())
}

/// What the kubelet can allocate and has allocated, on the node and per device
/// ([`crate::attribution::allocation`]); nothing while it is unknown.
fn encode_allocation(state: &NodeState, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
    let Some(allocation) = &state.allocation else { return Ok(()) };
    let instance = &*state.instance;
    let mut f = Family::new(
        "neuron_node_neuroncores",
        "NeuronCores of the node the kubelet can allocate (allocatable), has allocated to pods (allocated), and \
         allocated ones idle for the agent's idle window (allocated_idle)",
        MetricType::Gauge,
    );
    for (state, count) in allocation.cores.by_state() {
        f.push(Labels::node(instance).text("state", state), Some(f64::from(count)));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_node_neuron_devices",
        "Neuron devices of the node with a core the kubelet can allocate (allocatable) or has allocated (allocated)",
        MetricType::Gauge,
    );
    for (state, count) in [("allocatable", allocation.devices_allocatable), ("allocated", allocation.devices_allocated)]
    {
        f.push(Labels::node(instance).text("state", state), Some(f64::from(count)));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_device_neuroncores",
        "NeuronCores of one Neuron device by allocation state, as neuron_node_neuroncores",
        MetricType::Gauge,
    );
    for (device, counts) in &allocation.devices {
        for (state, count) in counts.by_state() {
            let labels = Labels::node(instance).number("neuron_device_index", *device).text("state", state);
            f.push(labels, Some(f64::from(count)));
        }
    }
    f.write(encoder)
}

/// The series of each routed runtime, and of the idle cores taken.
fn encode_runtimes(
    state: &NodeState,
    routed: &[(&RuntimeState, PrometheusView)],
    idle_cores: &[&IdleCore],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    encode_core_utilization(&state.instance, routed, idle_cores, encoder)?;
    encode_core_flops(routed, encoder)?;
    encode_memory(routed, encoder)?;
    encode_vcpu(routed, encoder)?;
    encode_execution(routed, encoder)?;
    encode_models(encoder, in_group(routed, RuntimeGroup::MemoryUsed))
}

/// The routed runtimes whose view takes `group`.
fn in_group<'a>(
    routed: &'a [(&'a RuntimeState, PrometheusView)],
    group: RuntimeGroup,
) -> impl Iterator<Item = &'a (&'a RuntimeState, PrometheusView)> + Clone {
    routed.iter().filter(move |(_, view)| view.groups.contains(&group))
}

/// A percentage as a ratio (0..1).
fn ratio(percent: Option<f64>) -> Option<f64> {
    percent.map(|p| p / 100.0)
}

/// Utilization of each held core (idle cores at 0, with the pod holding them, if any)
/// and of the physical cores of each logical one.
fn encode_core_utilization(
    instance: &InstanceLabels,
    routed: &[(&RuntimeState, PrometheusView)],
    idle_cores: &[&IdleCore],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let mut f = Family::new(
        "neuroncore_utilization_ratio",
        "NeuronCore utilization over the period (0..1), per core held by a runtime; idle cores have no runtime_tag \
         (and the pod holding them, if any)",
        MetricType::Gauge,
    );
    for (rt, view) in in_group(routed, RuntimeGroup::NeuroncoreCounters) {
        for core in &rt.cores {
            f.push(Labels::runtime(&rt.labels, view).number("neuroncore", core.index), ratio(core.utilization));
        }
    }
    for core in idle_cores {
        f.push(Labels::held_by(instance, core.pod.as_deref()).number("neuroncore", core.index), Some(0.0));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuroncore_physical_utilization_ratio",
        "Utilization (0..1) of each physical NeuronCore of a held logical one (trn2 logical NeuronCores); \
         physical_neuroncore counts the host's physical cores",
        MetricType::Gauge,
    );
    for (rt, view) in in_group(routed, RuntimeGroup::NeuroncoreCounters) {
        for (logical, physical, utilization) in &rt.physical_cores {
            let labels = Labels::runtime(&rt.labels, view)
                .number("neuroncore", *logical)
                .number("physical_neuroncore", *physical);
            f.push(labels, ratio(Some(*utilization)));
        }
    }
    f.write(encoder)
}

/// FLOPS of each held core.
fn encode_core_flops(
    routed: &[(&RuntimeState, PrometheusView)],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    for (slot, (name, help)) in CORE_FLOPS_METRICS.iter().enumerate() {
        let mut f = Family::new(*name, help, MetricType::Gauge);
        for (rt, view) in in_group(routed, RuntimeGroup::NeuroncoreCounters) {
            for core in &rt.cores {
                f.push(Labels::runtime(&rt.labels, view).number("neuroncore", core.index), core.flops[slot]);
            }
        }
        f.write(encoder)?;
    }
    Ok(())
}

/// Memory of each held core by kind, and of each runtime by location.
fn encode_memory(
    routed: &[(&RuntimeState, PrometheusView)],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    for (slot, (name, help)) in CORE_MEMORY_METRICS.iter().enumerate() {
        let mut f = Family::new(*name, help, MetricType::Gauge);
        for (rt, view) in in_group(routed, RuntimeGroup::MemoryUsed) {
            for core in &rt.cores {
                let value = core.memory.and_then(|m| m.values()[slot]);
                let labels =
                    Labels::runtime(&rt.labels, view).number("neuroncore", core.index).text("memory_location", "None");
                f.push(labels, value);
            }
        }
        f.write(encoder)?;
    }

    per_runtime(
        encoder,
        in_group(routed, RuntimeGroup::MemoryUsed),
        ("neuron_runtime_memory_used_bytes", "Memory used by the runtime, bytes", MetricType::Gauge),
        "memory_location",
        &["host", "neuron_device"],
        |rt| rt.memory_used.map(|m| m.to_vec()),
    )
}

/// vCPU usage of each runtime.
fn encode_vcpu(routed: &[(&RuntimeState, PrometheusView)], encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
    per_runtime(
        encoder,
        in_group(routed, RuntimeGroup::NeuronRuntimeVcpuUsage),
        ("neuron_runtime_vcpu_usage_ratio", "vCPU usage of the runtime (0..1)", MetricType::Gauge),
        "usage_type",
        &["user", "system"],
        |rt| rt.vcpu.map(|v| v.iter().map(|p| ratio(*p)).collect()),
    )
}

/// Execution errors, outcomes and latencies of each runtime.
fn encode_execution(
    routed: &[(&RuntimeState, PrometheusView)],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    per_name(
        encoder,
        in_group(routed, RuntimeGroup::ExecutionStats),
        ("execution_errors", "Executions that failed, by error type (running sum)", MetricType::Counter),
        "error_type",
        |rt| rt.errors_total.as_ref(),
    )?;
    per_name(
        encoder,
        in_group(routed, RuntimeGroup::ExecutionStats),
        ("execution_status", "Executions by outcome (running sum)", MetricType::Counter),
        "status_type",
        |rt| rt.status_total.as_ref(),
    )?;
    per_name(
        encoder,
        in_group(routed, RuntimeGroup::ExecutionStats),
        (
            "execution_latency_seconds",
            "Total execution latency percentiles over the period, seconds",
            MetricType::Gauge,
        ),
        "percentile",
        |rt| rt.latency.as_ref(),
    )?;
    per_name(
        encoder,
        in_group(routed, RuntimeGroup::ExecutionStats),
        (
            "execution_device_latency_seconds",
            "Device execution latency percentiles over the period (time on the device alone), seconds",
            MetricType::Gauge,
        ),
        "percentile",
        |rt| rt.device_latency.as_ref(),
    )
}

/// The models each runtime has loaded: a count by state, and, where a configuration asks
/// for them (half the page of a 32-runtime node), an info series for each of the first few.
fn encode_models<'r>(
    encoder: &mut dyn FamilyEncoder,
    runtimes: impl Iterator<Item = &'r (&'r RuntimeState, PrometheusView)> + Clone,
) -> Result<(), fmt::Error> {
    let mut f = Family::new(
        "neuron_runtime_loaded_models",
        "Models the runtime has loaded, by state: running (started), idle (loaded, not started), unknown (not said)",
        MetricType::Gauge,
    );
    fn readable(rt: &RuntimeState) -> Option<&LoadedModels> {
        rt.models.as_ref().filter(|m| m.readable)
    }
    for (rt, view) in runtimes.clone() {
        let Some(models) = readable(rt) else { continue };
        for (state, count) in [("running", models.running), ("idle", models.idle), ("unknown", models.unknown)] {
            // `unknown` only when some model does not say.
            if state != "unknown" || count > 0 {
                f.push(Labels::runtime(&rt.labels, view).text("state", state), Some(f64::from(count)));
            }
        }
    }
    f.write(encoder)?;
    let mut f = Family::new(
        "neuron_runtime_loaded_model",
        "A model the runtime has loaded (the first 32 of each runtime): its name, neuron-monitor's model_id, \
         whether it runs",
        MetricType::Info,
    );
    for (rt, view) in runtimes.filter(|(_, view)| view.loaded_model_info) {
        for model in readable(rt).into_iter().flat_map(|m| &m.info) {
            let running = match model.is_running {
                Some(true) => "true",
                Some(false) => "false",
                None => "",
            };
            let labels = Labels::runtime(&rt.labels, view).text("model_name", &model.name).text("running", running);
            let labels = match model.model_id {
                Some(id) => labels.id("model_id", id),
                None => labels.text("model_id", ""),
            };
            f.push(labels, Some(1.0));
        }
    }
    f.write(encoder)
}

/// One value of a process sample.
type ProcessValue = fn(&ProcessSample) -> Option<f64>;

/// The series of each routed runtime's process (with its `neuron_runtime_vcpu_usage`
/// group, which neuron-monitor reads from the same process), as of the latest read.
fn encode_processes(
    processes: &BTreeMap<u32, ProcessSample>,
    routed: &[(&RuntimeState, PrometheusView)],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let sampled = routed.iter().filter(|(_, view)| view.groups.contains(&RuntimeGroup::NeuronRuntimeVcpuUsage));
    let sampled: Vec<(&RuntimeState, &PrometheusView, &ProcessSample)> =
        sampled.filter_map(|(rt, view)| Some((*rt, view, processes.get(&rt.pid?)?))).collect();
    let mut f = Family::new(
        "neuron_process_cpu_seconds",
        "CPU time of the runtime's process by mode (user, system), seconds",
        MetricType::Counter,
    );
    for (rt, view, sample) in &sampled {
        for (mode, value) in ["user", "system"].iter().zip(sample.cpu_seconds.into_iter().flatten()) {
            f.push(Labels::runtime(&rt.labels, view).text("mode", mode), Some(value));
        }
    }
    f.write(encoder)?;
    let single: [(&str, &str, MetricType, ProcessValue); 5] = [
        (
            "neuron_process_resident_memory_bytes",
            "Resident memory of the runtime's process, bytes",
            MetricType::Gauge,
            |s| s.resident_bytes,
        ),
        ("neuron_process_threads", "Threads of the runtime's process", MetricType::Gauge, |s| s.threads),
        ("neuron_process_open_fds", "Open file descriptors of the runtime's process", MetricType::Gauge, |s| {
            s.open_fds
        }),
        (
            "neuron_process_io_read_bytes",
            "Bytes the runtime's process made the storage layer read (read_bytes of /proc/<pid>/io)",
            MetricType::Counter,
            |s| s.io_bytes.map(|io| io[0]),
        ),
        (
            "neuron_process_io_write_bytes",
            "Bytes the runtime's process sent to the storage layer (write_bytes of /proc/<pid>/io)",
            MetricType::Counter,
            |s| s.io_bytes.map(|io| io[1]),
        ),
    ];
    for (name, help, kind, value) in single {
        let mut f = Family::new(name, help, kind);
        for (rt, view, sample) in &sampled {
            f.push(Labels::runtime(&rt.labels, view), value(sample));
        }
        f.write(encoder)?;
    }
    Ok(())
}

/// The node-level series: ECC counters, vCPUs, memory, and (when `described`) instance
/// and hardware info.
fn encode_system(
    state: &NodeState,
    scope: Scope<'_>,
    described: bool,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let instance = &*state.instance;
    let ratio = |percent: Option<f64>| percent.map(|p| p / 100.0);
    let system = &state.system;
    let mut f = Family::new("hardware_ecc_events", "ECC events of Neuron devices (running sum)", MetricType::Counter);
    let ecc = scope.system(SystemGroup::NeuronHwCounters);
    for (device, totals) in system.ecc_totals.iter().filter(|_| ecc) {
        for (kind, total) in DeviceEccCounters::KINDS.iter().zip(totals) {
            let labels = Labels::node(instance).text("event_type", kind).number("neuron_device_index", *device);
            f.push(labels, Some(*total));
        }
    }
    f.write(encoder)?;

    let mut f = Family::new("system_vcpu_count", "Number of vCPUs of the host", MetricType::Gauge);
    let vcpu = scope.system(SystemGroup::VcpuUsage);
    f.push(Labels::node(instance), system.vcpu_count.filter(|_| vcpu).map(|c| c as f64));
    f.write(encoder)?;

    let mut f = Family::new("system_vcpu_usage_ratio", "vCPU usage of the host (0..1)", MetricType::Gauge);
    for (kind, value) in ["user", "system"].iter().zip(system.vcpu_usage.filter(|_| vcpu).unwrap_or_default()) {
        f.push(Labels::node(instance).text("usage_type", kind), ratio(value));
    }
    f.write(encoder)?;

    let memory = system.memory.filter(|_| scope.system(SystemGroup::MemoryInfo)).unwrap_or_default();
    for ((name, help), value) in [
        ("system_memory_total_bytes", "Memory of the host, bytes"),
        ("system_memory_used_bytes", "Memory used on the host, bytes"),
        ("system_swap_total_bytes", "Swap of the host, bytes"),
        ("system_swap_used_bytes", "Swap used on the host, bytes"),
    ]
    .into_iter()
    .zip(memory)
    {
        let mut f = Family::new(name, help, MetricType::Gauge);
        f.push(Labels::node(instance), value);
        f.write(encoder)?;
    }

    if state.reports > 0 && described {
        let mut f = Family::new("instance", "Instance the agent runs on", MetricType::Info);
        f.push(Labels::node(instance), Some(1.0));
        f.write(encoder)?;
    }

    if let Some(hw) = state.hardware.as_ref().filter(|_| described) {
        if let (Some(devices), Some(cores)) = (hw.device_count, hw.cores_per_device) {
            let mut f = Family::new(
                "neuron_hardware",
                "Neuron hardware of the host (and the newer fields of neuron_hardware_info the report has)",
                MetricType::Info,
            );
            let labels = Labels::node(instance)
                .number("neuron_device_count", devices)
                .number("neuroncore_per_device_count", cores)
                .fields(&hw.labels);
            f.push(labels, Some(1.0));
            f.write(encoder)?;
        }
    }
    if described {
        encode_peak_flops(state, encoder)?;
    }
    Ok(())
}

/// The documented peak FLOPS of one of the host's NeuronCores (as neuron-monitor counts
/// them: a logical core is its physical ones together), per data type: what
/// `neuroncore_flops` can be divided by, the data type being the user's to choose.
fn encode_peak_flops(state: &NodeState, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
    let instance = &*state.instance;
    let table = InstanceType::lookup(&instance.instance_type);
    let hardware = state.hardware.as_ref();
    let generation = table
        .map(|t| t.generation)
        .or_else(|| hardware.and_then(|h| h.device_type.as_deref()).and_then(Generation::from_device_type));
    let Some(generation) = generation else {
        return Ok(());
    };
    // Physical cores per reported core: the report's, else the type's default, else 1.
    let lnc = hardware
        .and_then(|h| h.logical_neuroncore_config)
        .or_else(|| table.and_then(|t| t.logical_neuroncore_config()))
        .unwrap_or(1);
    let mut f = Family::new(
        "neuroncore_peak_flops",
        "Documented peak dense floating-point operations per second of one NeuronCore of this host (a logical core: \
         its physical cores together), by data type; divide neuroncore_flops by the data type the workload uses",
        MetricType::Gauge,
    );
    for peak in peak_flops(generation) {
        f.push(Labels::node(instance).text("data_type", peak.data_type), Some(peak.per_core * f64::from(lnc)));
    }
    f.write(encoder)
}

/// What the agent could not read or export from the latest report.
fn encode_problems(
    state: &NodeState,
    routed: &[(&RuntimeState, PrometheusView)],
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let instance = &*state.instance;
    let mut f = Family::new(
        "neuron_agent_group_error",
        "1 for each metric group in error or unreadable in the latest report (kind: monitor or malformed)",
        MetricType::Gauge,
    );
    for p in &state.problems {
        let labels = Labels::node(instance)
            .text("group", p.group)
            .text("runtime_tag", &p.runtime_tag)
            .text("kind", p.kind.as_str());
        f.push(labels, Some(1.0));
    }
    f.write(encoder)?;

    let mut f = Family::new(
        "neuron_agent_extra_labels_dropped",
        "Extra labels of NeuronMonitorConfigs left off runtime series in this exposition, summed over runtimes \
         (a series carries at most 32)",
        MetricType::Gauge,
    );
    let dropped: usize = routed.iter().map(|(_, view)| view.dropped_labels).sum();
    f.push(Labels::node(instance), Some(dropped as f64).filter(|_| state.reports > 0));
    f.write(encoder)
}

/// A family with one series per runtime and per name its values carry (error types,
/// statuses, percentiles: whatever the reports said, under its own label value).
fn per_name<'r>(
    encoder: &mut dyn FamilyEncoder,
    runtimes: impl Iterator<Item = &'r (&'r RuntimeState, PrometheusView)>,
    (name, help, kind): (&'static str, &'static str, MetricType),
    label: &'static str,
    values: impl Fn(&RuntimeState) -> Option<&NamedValues>,
) -> Result<(), fmt::Error> {
    let mut f = Family::new(name, help, kind);
    for (rt, view) in runtimes {
        for (label_value, value) in values(rt).into_iter().flat_map(NamedValues::iter) {
            f.push(Labels::runtime(&rt.labels, view).text(label, label_value), Some(value));
        }
    }
    f.write(encoder)
}

/// A family with one series per runtime and per value of one label.
fn per_runtime<'r>(
    encoder: &mut dyn FamilyEncoder,
    runtimes: impl Iterator<Item = &'r (&'r RuntimeState, PrometheusView)>,
    (name, help, kind): (&'static str, &'static str, MetricType),
    label: &'static str,
    label_values: &'static [&'static str],
    values: impl Fn(&RuntimeState) -> Option<Vec<Option<f64>>>,
) -> Result<(), fmt::Error> {
    let mut f = Family::new(name, help, kind);
    for (rt, view) in runtimes {
        for (label_value, value) in label_values.iter().zip(values(rt).unwrap_or_default()) {
            f.push(Labels::runtime(&rt.labels, view).text(label, label_value), value);
        }
    }
    f.write(encoder)
}

/// Rewrites prometheus-client's OpenMetrics output into the classic text format:
/// counters are named with their `_total`, info metrics become gauges named `…_info`,
/// `# UNIT` and `# EOF` go away. Sample lines are the same in both formats.
pub fn openmetrics_to_classic(open: &str) -> String {
    let mut out = String::with_capacity(open.len());
    write_classic(open, &mut out);
    out
}

/// The page's text of one source's families alone.
#[cfg(test)]
pub(crate) fn render_families(source: &dyn Exported, format: Format) -> String {
    let mut page = String::new();
    let _ = source.export(&mut text::TextEncoder::new(&mut page, format));
    page
}

/// Appends the classic text of the OpenMetrics `open` to `out`.
fn write_classic(open: &str, out: &mut String) {
    let mut pending_help: Option<(&str, &str)> = None;
    for line in open.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            pending_help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (suffix, classic_kind) = match kind {
                "counter" => (classic_suffix(MetricType::Counter), "counter"),
                "info" => (classic_suffix(MetricType::Info), "gauge"),
                "gauge" | "histogram" | "summary" => ("", kind),
                _ => ("", "untyped"),
            };
            if let Some((help_name, help)) = pending_help.take() {
                if help_name == name {
                    let _ = writeln!(out, "# HELP {name}{suffix} {help}");
                }
            }
            let _ = writeln!(out, "# TYPE {name}{suffix} {classic_kind}");
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests;
