//! NVIDIA GPUs beside (or instead of) Neuron devices: what NVML says of each GPU, read
//! off the report path, on `/metrics` under dcgm-exporter's names ([`dcgm`]).
//!
//! The driver's library is loaded at run time ([`nvml`]): a node without it has no GPU
//! collector, said once. A task reads every GPU on a blocking thread at each period and
//! publishes a new [`GpuSnapshot`]; the exposition and the sinks encode the latest one. A
//! collection that hangs in the driver is waited for, never doubled: the snapshot goes
//! stale (its GPUs `unknown`) until the read returns.

pub mod dcgm;
pub mod nvml;
pub mod processes;
pub mod xid;

use std::{
    collections::{hash_map::Entry, BTreeMap, HashMap, HashSet},
    fmt,
    hash::Hash,
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use api::gpu_groups::{GpuGroup, GpuGroups};
use prometheus_client::{
    metrics::{counter::Counter, family::Family as MetricFamily, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    routing::SharedRouting,
    series::{Exported, FamilyEncoder, Scope},
    state::{InstanceLabels, NodeState, PodRef},
    telemetry::ReasonLabel,
};

/// At most this many GPUs are read (the largest instances have 8; MIG and odd drivers
/// cannot make the agent allocate without end).
pub const MAX_GPUS: u32 = 64;
/// At most this many compute processes of one GPU are kept.
pub const MAX_PROCESSES_PER_GPU: usize = 256;
/// At most this many MIG instances of one GPU are read (NVML's own maximum is 7).
pub const MAX_MIG_INSTANCES: u32 = 16;
/// A collection still running after this long makes the GPUs `unknown`.
pub const COLLECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// What the node configuration asks of the collector while it is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuCollection {
    pub period: Duration,
    /// What is read and exported of each GPU (ECC is read for health whatever it says).
    pub groups: GpuGroups,
}

/// Who a GPU is: the labels every series of it carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuIdentity {
    /// NVML's index (`gpu`).
    pub index: u32,
    /// `GPU-…` (`UUID`).
    pub uuid: String,
    /// `00000000:53:00.0`, as NVML prints it (`pci_bus_id`).
    pub pci_bus_id: String,
    /// The device node's name, `nvidia<minor>` (`device`).
    pub device: String,
    /// `NVIDIA H100 80GB HBM3` (`modelName`).
    pub model: String,
}

/// ECC error counts (NVML's total counts, all memory locations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EccCounts {
    pub corrected_volatile: Option<u64>,
    pub uncorrected_volatile: Option<u64>,
    pub corrected_aggregate: Option<u64>,
    pub uncorrected_aggregate: Option<u64>,
}

/// NVLink of a GPU with links, every link together (`None` where NVML does not say).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvLinkCounts {
    /// TX and RX data together since the previous collection, in DCGM's unit: KiB/s
    /// divided by 1000 ("MiB/s" in its field's help). None at the first collection and
    /// after a counter reset.
    pub bandwidth: Option<f64>,
    pub crc_flit_errors: Option<u64>,
    pub crc_data_errors: Option<u64>,
    pub replay_errors: Option<u64>,
    pub recovery_errors: Option<u64>,
}

/// Row remapping (Ampere and later).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: Option<u64>,
    pub uncorrectable: Option<u64>,
    pub pending: Option<u64>,
    pub failure: Option<u64>,
}

/// What one collection read of a GPU; `None` where the GPU does not support it or the
/// read failed (counted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuValues {
    /// Percent of the last sample period a kernel ran.
    pub utilization_gpu: Option<u32>,
    /// Percent of the last sample period device memory was read or written.
    pub utilization_memory: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_reserved_bytes: Option<u64>,
    pub temperature_gpu_c: Option<u32>,
    pub temperature_memory_c: Option<u64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    /// Since the driver was loaded.
    pub energy_millijoules: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub graphics_clock_mhz: Option<u32>,
    pub pcie_link_gen: Option<u32>,
    pub pcie_link_width: Option<u32>,
    pub pcie_tx_bytes_per_second: Option<u64>,
    pub pcie_rx_bytes_per_second: Option<u64>,
    pub pcie_replays: Option<u64>,
    pub ecc: EccCounts,
    pub remapped_rows: RemappedRows,
    /// `None` on a GPU without NVLink.
    pub nvlink: Option<NvLinkCounts>,
    /// NVML's clock throttle (event) reasons, a bit mask.
    pub throttle_reasons: Option<u64>,
}

impl GpuValues {
    /// Framebuffer used as a percentage of what is usable (total less reserved), as
    /// DCGM's `FB_USED_PERCENT` has it.
    pub fn memory_used_percent(&self) -> Option<f64> {
        let usable = self.memory_total_bytes?.saturating_sub(self.memory_reserved_bytes.unwrap_or(0));
        (usable > 0).then(|| self.memory_used_bytes.unwrap_or(0) as f64 * 100.0 / usable as f64)
    }
}

/// A compute process on a GPU (of one MIG GPU instance: NVML's listings of it in each
/// compute instance are one, [`merge_processes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where NVML cannot tell (Windows WDDM, some MIG setups).
    pub used_memory_bytes: Option<u64>,
    /// The MIG GPU instance it runs in, if any.
    pub gpu_instance_id: Option<u32>,
    /// Percent of the driver's latest utilization sample (at most 100); `None` where NVML
    /// has no sample of the process since the previous collection.
    pub sm_utilization: Option<u32>,
}

/// NVML lists a process once per MIG compute instance it runs in (and an odd driver may
/// list one twice): one entry per (GPU instance, PID) is kept, in the order first listed,
/// with the memory of its listings summed (what dcgm-exporter's labels can tell apart: a
/// GPU instance, no compute instance) and the highest utilization (NVML samples it per
/// PID: the same). Returns how many listings were folded into an earlier one.
pub fn merge_processes(processes: &mut Vec<GpuProcess>) -> usize {
    let listed = processes.len();
    let mut first: HashMap<(u32, Option<u32>), usize> = HashMap::with_capacity(listed);
    let mut merged: Vec<GpuProcess> = Vec::with_capacity(listed);
    for p in processes.drain(..) {
        match first.entry((p.pid, p.gpu_instance_id)) {
            Entry::Vacant(e) => {
                e.insert(merged.len());
                merged.push(p);
            }
            Entry::Occupied(e) => {
                let kept = &mut merged[*e.get()];
                kept.used_memory_bytes = match (kept.used_memory_bytes, p.used_memory_bytes) {
                    (Some(a), Some(b)) => Some(a.saturating_add(b)),
                    (a, b) => a.or(b),
                };
                kept.sm_utilization = kept.sm_utilization.max(p.sm_utilization);
            }
        }
    }
    *processes = merged;
    listed - processes.len()
}

/// Which of `items` are the first of their `key` (the others would be a second series of
/// the same name and labels): the last guard of the GPU series on `/metrics`.
pub(crate) fn firsts<'a, T, K: Hash + Eq>(items: &'a [T], key: impl Fn(&'a T) -> K) -> Vec<bool> {
    let mut seen = HashSet::with_capacity(items.len());
    items.iter().map(|item| seen.insert(key(item))).collect()
}

/// `items` without those that are not the first of their key (`firsts`), counted in
/// `dropped`.
pub(crate) fn keep_firsts<T>(items: Vec<T>, firsts: Vec<bool>, dropped: &Counter) -> Vec<T> {
    let duplicates = firsts.iter().filter(|first| !**first).count();
    if duplicates == 0 {
        return items;
    }
    dropped.inc_by(duplicates as u64);
    items.into_iter().zip(firsts).filter_map(|(item, first)| first.then_some(item)).collect()
}

/// A MIG GPU instance of a GPU in MIG mode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigInstance {
    /// `GPU_I_ID`.
    pub gpu_instance_id: u32,
    /// `MIG-…`.
    pub uuid: String,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
}

/// One GPU as the latest collection read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gpu {
    pub identity: GpuIdentity,
    pub values: GpuValues,
    pub processes: Vec<GpuProcess>,
    /// Empty unless MIG mode is on.
    pub mig: Vec<MigInstance>,
    /// NVML answered "GPU lost" (fallen off the bus) during this collection.
    pub lost: bool,
}

/// The latest collection of every GPU, sorted by index.
#[derive(Clone, Debug, Default)]
pub struct GpuSnapshot {
    pub driver_version: String,
    pub gpus: Vec<Gpu>,
    /// Collections so far (0: none yet).
    pub collections: u64,
    /// The latest collection did not return in time: every value is old, every GPU's
    /// health `unknown`.
    pub stale: bool,
    /// The node configuration switched the collector off: no GPU is read.
    pub off: bool,
    /// The groups this collection read: the only ones exported.
    pub groups: GpuGroups,
    /// Counts the series the encoders leave out as duplicates of another
    /// (`neuron_agent_gpu_duplicate_series_total`, the reader's counter).
    pub duplicate_series: Counter,
}

impl GpuSnapshot {
    /// The GPU at a PCI address as the kernel log writes it (`0000:53:00`), matched on
    /// domain, bus and device whatever the case or the domain's width.
    pub fn by_pci_address(&self, address: &str) -> Option<&Gpu> {
        let wanted = PciAddress::parse(address)?;
        self.gpus.iter().find(|g| PciAddress::parse(&g.identity.pci_bus_id) == Some(wanted))
    }

    pub fn by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.identity.uuid.eq_ignore_ascii_case(uuid))
    }
}

/// Domain, bus and device of a PCI address (`0000:53:00`, `00000000:53:00.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
}

impl PciAddress {
    /// `None` unless the text is `domain:bus:device[.function]` in hex, each part in range.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split(':');
        let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let device = rest.split_once('.').map_or(rest, |(device, _function)| device);
        let hex = |s: &str, max_len: usize| {
            (!s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some(PciAddress {
            domain: hex(domain, 8)?,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok().filter(|d| *d < 32)?,
        })
    }
}

/// Who holds a GPU: a pod, and the replica it got when the GPU is time-sliced or shared
/// (`<id>::<n>`: one GPU, several pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuHolder {
    pub pod: Arc<PodRef>,
    pub replica: Option<u32>,
}

/// The pods holding each GPU, by UUID (upper case); filled by attribution.
pub type GpuHolders = BTreeMap<String, Vec<GpuHolder>>;

/// The latest [`GpuHolders`]; cloning shares them.
pub type SharedGpuHolders = Arc<Mutex<Arc<GpuHolders>>>;

/// One GPU as one holder of it sees it: the pod (`None`: held by no pod) and the replica
/// it got of a shared GPU.
#[derive(Clone, Copy, Debug)]
pub struct Holding<'a> {
    pub gpu: &'a Gpu,
    pub pod: Option<&'a PodRef>,
    pub replica: Option<u32>,
}

/// The GPUs with values that `scope` sees, one entry per (GPU, holding pod): a GPU held
/// by pods goes where their namespaces are seen, one no pod holds where the operator
/// namespace's series go. A stale snapshot or a lost GPU has no values to give.
pub fn holdings<'a>(snapshot: &'a GpuSnapshot, holders: &'a GpuHolders, scope: Scope<'_>) -> Vec<Holding<'a>> {
    if snapshot.stale {
        return Vec::new();
    }
    let mut out = Vec::new();
    for gpu in snapshot.gpus.iter().filter(|g| !g.lost) {
        let held = holders.get(&gpu.identity.uuid.to_ascii_uppercase()).map(Vec::as_slice).unwrap_or_default();
        if held.is_empty() {
            if scope.sees(None) {
                out.push(Holding { gpu, pod: None, replica: None });
            }
            continue;
        }
        for h in held.iter().filter(|h| scope.sees(Some(&h.pod.namespace))) {
            out.push(Holding { gpu, pod: Some(&h.pod), replica: h.replica });
        }
    }
    out
}

/// The pod of each GPU process that runs in one, by PID; filled by attribution.
pub type GpuProcessPods = BTreeMap<u32, Arc<PodRef>>;

/// The latest [`GpuProcessPods`]; cloning shares them.
pub type SharedGpuProcessPods = Arc<Mutex<Arc<GpuProcessPods>>>;

/// What the GPU series are encoded from; cloning shares it. The exposition and the
/// OTLP sinks encode the same.
#[derive(Clone)]
pub struct GpuSource {
    pub snapshot: watch::Receiver<Arc<GpuSnapshot>>,
    pub holders: SharedGpuHolders,
    pub process_pods: SharedGpuProcessPods,
    /// The node's name for `Hostname` (the Node's, else the host's).
    pub hostname: Arc<str>,
}

impl GpuSource {
    /// The GPU families `scope` takes. Takes the holders' lock, the process pods', then
    /// the snapshot's (one at a time): call it without the node state's.
    pub fn encode(
        &self,
        instance: &InstanceLabels,
        scope: Scope<'_>,
        encoder: &mut dyn FamilyEncoder,
    ) -> Result<(), fmt::Error> {
        let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let process_pods = self.process_pods.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let snapshot = self.snapshot.borrow().clone();
        dcgm::encode_gpus(&snapshot, &self.hostname, instance, &holders, scope, encoder)?;
        processes::encode_processes(&snapshot, instance, &process_pods, &holders, scope, encoder)
    }

    /// Whether a first collection was published, or the collector is off (then there is
    /// nothing to wait for).
    pub fn collected(&self) -> bool {
        let snapshot = self.snapshot.borrow();
        snapshot.collections > 0 || snapshot.off
    }
}

/// Encodes the GPUs on each scrape.
pub struct GpuCollector {
    pub source: GpuSource,
    /// For the instance labels.
    pub state: Arc<Mutex<NodeState>>,
    pub routing: SharedRouting,
}

impl Exported for GpuCollector {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        let instance = self.state.lock().unwrap_or_else(|p| p.into_inner()).instance.clone();
        let routing = self.routing.current();
        self.source.encode(&instance, Scope::Exposition(&routing), encoder)
    }
}

/// `neuron_agent_gpu_*`; cloning shares them.
#[derive(Clone, Default)]
pub struct GpuMetrics {
    pub failures: MetricFamily<ReasonLabel, Counter>,
    pub collect_seconds: Gauge<f64, AtomicU64>,
    pub gpus: Gauge,
    pub collections: Counter,
    pub stuck: Gauge,
    pub processes_merged: Counter,
    pub duplicate_series: Counter,
}

impl GpuMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = GpuMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent_gpu");
        r.register(
            "read_failures",
            "NVML reads that failed, by reason (lost, timeout, too_many, other); unsupported values are not failures",
            m.failures.clone(),
        );
        r.register("collect_seconds", "Time the latest collection of every GPU took", m.collect_seconds.clone());
        r.register("devices", "GPUs the latest collection read", m.gpus.clone());
        r.register("collections", "Collections of every GPU through NVML", m.collections.clone());
        r.register(
            "collection_stuck",
            "1 while a collection has not returned after its timeout (a hung driver call): the GPUs are unknown",
            m.stuck.clone(),
        );
        r.register(
            "processes_merged",
            "NVML listings of a GPU process folded into another of the same GPU instance and PID (one per MIG compute \
             instance past the first, memory summed; or listed twice by the driver)",
            m.processes_merged.clone(),
        );
        r.register(
            "duplicate_series",
            "GPU series left out of /metrics or a sink's request as the duplicate of another of the same name and \
             labels (never expected: the collection merges NVML's duplicates)",
            m.duplicate_series.clone(),
        );
        m
    }

    pub(crate) fn failed(&self, reason: &'static str) {
        self.failures.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// Collects every GPU at start and each period until `shutdown`, publishing each
/// snapshot on `tx`. A collection that does not return within [`COLLECTION_TIMEOUT`]
/// marks the snapshot stale, and the next one starts only when it has returned. While
/// the collection is `None` (the node configuration switched the collector off) nothing
/// is read and the snapshot is empty.
pub async fn follow(
    reader: Arc<nvml::NvmlReader>,
    mut collection: watch::Receiver<Option<GpuCollection>>,
    tx: watch::Sender<Arc<GpuSnapshot>>,
    shutdown: CancellationToken,
) {
    let mut collections = 0u64;
    loop {
        let asked = *collection.borrow_and_update();
        let groups = match asked {
            Some(c) => c.groups,
            None => {
                info!("GPU collection off by the node configuration");
                tx.send_replace(Arc::new(GpuSnapshot { off: true, ..GpuSnapshot::default() }));
                if !wait_until_on(&mut collection, &shutdown).await {
                    return;
                }
                continue;
            }
        };
        let started = Instant::now();
        let read = {
            let reader = reader.clone();
            tokio::task::spawn_blocking(move || reader.read(groups))
        };
        tokio::pin!(read);
        let reading = tokio::select! {
            _ = shutdown.cancelled() => return,
            done = &mut read => done,
            _ = tokio::time::sleep(COLLECTION_TIMEOUT) => {
                warn!(timeout_s = COLLECTION_TIMEOUT.as_secs(), "an NVML read did not return: the GPUs are unknown until it does");
                reader.metrics.failed("timeout");
                reader.metrics.stuck.set(1);
                tx.send_modify(|s| Arc::make_mut(s).stale = true);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    done = &mut read => done,
                }
            }
        };
        reader.metrics.stuck.set(0);
        match reading {
            Ok(mut snapshot) => {
                collections += 1;
                snapshot.collections = collections;
                reader.metrics.collections.inc();
                reader.metrics.gpus.set(snapshot.gpus.len() as i64);
                reader.metrics.collect_seconds.set(started.elapsed().as_secs_f64());
                tx.send_replace(Arc::new(snapshot));
            }
            Err(e) => {
                warn!(error = %e, "the GPU collection failed");
                reader.metrics.failed("other");
            }
        }
        let Some(wait) = collection.borrow_and_update().map(|c| c.period) else { continue };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // A new period or groups apply at once; without a sender, the last ones hold.
            Ok(()) = collection.changed() => {}
        }
    }
}

/// Waits while the collector is off; false when the agent stops meanwhile. Without a
/// sender, the last setting (off) holds until then.
async fn wait_until_on(collection: &mut watch::Receiver<Option<GpuCollection>>, shutdown: &CancellationToken) -> bool {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            changed = collection.changed() => if changed.is_err() { shutdown.cancelled().await; return false },
        }
        if collection.borrow().is_some() {
            return true;
        }
    }
}

/// Opens NVML and reads the GPUs once: `None` (said once) where the node has no driver
/// library or no GPU, so the agent runs no GPU collector.
pub fn open(library: Option<&std::path::Path>, metrics: GpuMetrics) -> Option<nvml::NvmlReader> {
    match nvml::NvmlReader::open(library, metrics) {
        Ok(reader) if reader.gpu_count() > 0 => {
            info!(library = %reader.library(), gpus = reader.gpu_count(), driver = %reader.driver_version(),
                  "reading the node's NVIDIA GPUs through NVML");
            Some(reader)
        }
        Ok(reader) => {
            info!(library = %reader.library(), "NVML loaded but it sees no GPU: no GPU collector");
            None
        }
        Err(e) => {
            info!(reason = %e, "no NVIDIA driver library: no GPU collector");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_match_whatever_the_domain_width_case_and_function() {
        let kernel = PciAddress::parse("0000:cb:00").unwrap();
        assert_eq!(Some(kernel), PciAddress::parse("00000000:CB:00.0"));
        assert_eq!(kernel, PciAddress { domain: 0, bus: 0xcb, device: 0 });
        assert_ne!(Some(kernel), PciAddress::parse("0000:cc:00"));
    }

    #[test]
    fn pci_addresses_out_of_range_or_malformed_are_refused() {
        for bad in
            ["", "0000:cb", "0000:cb:00:00", "0000:1cb:00", "0000:cb:20", "000000000:cb:00", "zz:cb:00", "0000::00"]
        {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_collector_switched_off_has_nothing_to_wait_for() {
        let (tx, snapshot) = watch::channel(Arc::new(GpuSnapshot::default()));
        let source = GpuSource {
            snapshot,
            holders: Default::default(),
            process_pods: Default::default(),
            hostname: "node-1".into(),
        };
        assert!(!source.collected());
        tx.send_replace(Arc::new(GpuSnapshot { off: true, ..GpuSnapshot::default() }));
        assert!(source.collected());
    }

    #[test]
    fn a_process_listed_per_compute_instance_is_one_per_gpu_instance_with_its_memory_summed() {
        let listing = |pid, gpu_instance_id, mib: Option<u64>, sm_utilization| GpuProcess {
            pid,
            used_memory_bytes: mib.map(|m| m << 20),
            gpu_instance_id,
            sm_utilization,
        };
        let mut processes = vec![
            listing(7, Some(1), Some(1000), Some(30)),
            listing(8, Some(1), Some(10), None),
            listing(7, Some(1), Some(500), None),
            listing(7, Some(2), Some(1), None),
            listing(9, None, None, None),
            listing(9, None, Some(4), Some(5)),
        ];
        assert_eq!(merge_processes(&mut processes), 2);
        assert_eq!(
            processes,
            vec![
                listing(7, Some(1), Some(1500), Some(30)),
                listing(8, Some(1), Some(10), None),
                listing(7, Some(2), Some(1), None),
                listing(9, None, Some(4), Some(5)),
            ]
        );
    }

    #[test]
    fn only_the_first_of_a_key_is_kept_and_the_others_counted() {
        let items = vec![("a", 1), ("b", 2), ("a", 3), ("a", 4)];
        let firsts = firsts(&items, |(key, _)| *key);
        let dropped = Counter::default();
        assert_eq!(keep_firsts(items, firsts, &dropped), vec![("a", 1), ("b", 2)]);
        assert_eq!(dropped.get(), 2);
    }

    #[test]
    fn memory_used_percent_is_of_the_usable_framebuffer() {
        let values = GpuValues {
            memory_total_bytes: Some(1000),
            memory_reserved_bytes: Some(200),
            memory_used_bytes: Some(400),
            ..GpuValues::default()
        };
        assert_eq!(values.memory_used_percent(), Some(50.0));
        assert_eq!(GpuValues::default().memory_used_percent(), None);
    }

    #[test]
    fn a_snapshot_finds_a_gpu_by_its_kernel_log_address_or_uuid() {
        let gpu = |index: u32, bus: &str| Gpu {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:{bus}:00.0"),
                ..GpuIdentity::default()
            },
            ..Gpu::default()
        };
        let snapshot = GpuSnapshot { gpus: vec![gpu(0, "53"), gpu(1, "CB")], ..GpuSnapshot::default() };
        assert_eq!(snapshot.by_pci_address("0000:cb:00").map(|g| g.identity.index), Some(1));
        assert_eq!(snapshot.by_pci_address("0000:cc:00"), None);
        assert_eq!(snapshot.by_uuid("gpu-0").map(|g| g.identity.index), Some(0));
    }
}
