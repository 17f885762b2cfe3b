//! The GPUs through NVML (`nvml-wrapper`, the driver's library loaded at run time).
//!
//! One read asks each GPU for every value the collector exports; a value the GPU does
//! not support is left out without a word, a failed one is counted. A GPU NVML calls
//! lost (fallen off the bus) is kept in the snapshot, marked lost, with the identity it
//! had: its health turns, its series stop.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::Path,
    sync::Mutex,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor},
    enums::device::{SampleValue, UsedGpuMemory},
    error::NvmlError,
    struct_wrappers::device::FieldValueSample,
    structs::device::FieldId,
    Device, Nvml,
};

use super::{
    merge_processes, EccCounts, Gpu, GpuGroup, GpuGroups, GpuIdentity, GpuMetrics, GpuProcess, GpuSnapshot, GpuValues,
    MigInstance, NvLinkCounts, RemappedRows, MAX_GPUS, MAX_MIG_INSTANCES, MAX_PROCESSES_PER_GPU,
};

/// The name the driver installs; found through the dynamic loader's search path.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// Longest identity text kept (NVML's own buffers are 96 bytes at most).
const MAX_TEXT: usize = 96;

// NVML field ids (nvml.h): values NVML gives only through the field-value call.
const FI_MEMORY_TEMP: u32 = 82;
const FI_REMAPPED_COR: u32 = 142;
const FI_REMAPPED_UNC: u32 = 143;
const FI_REMAPPED_PENDING: u32 = 144;
const FI_REMAPPED_FAILURE: u32 = 145;
const FI_NVLINK_CRC_FLIT_ERRORS: u32 = 38;
const FI_NVLINK_CRC_DATA_ERRORS: u32 = 45;
const FI_NVLINK_REPLAY_ERRORS: u32 = 52;
const FI_NVLINK_RECOVERY_ERRORS: u32 = 59;
const FI_NVLINK_LINK_COUNT: u32 = 91;
/// KiB sent and received over every link since the driver loaded.
const FI_NVLINK_DATA_TX_KIB: u32 = 138;
const FI_NVLINK_DATA_RX_KIB: u32 = 139;

/// The fields read on every GPU (health needs the row-remapping ones whatever the groups).
const ALWAYS_FIELDS: [u32; 4] = [FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE];
const NVLINK_FIELDS: [u32; 7] = [
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_CRC_FLIT_ERRORS,
    FI_NVLINK_CRC_DATA_ERRORS,
    FI_NVLINK_REPLAY_ERRORS,
    FI_NVLINK_RECOVERY_ERRORS,
    FI_NVLINK_DATA_TX_KIB,
    FI_NVLINK_DATA_RX_KIB,
];

/// An open NVML library and the counts the collector keeps.
pub struct NvmlReader {
    nvml: Nvml,
    library: String,
    driver_version: String,
    /// The costly values of each GPU (by index), read at most every `slow_refresh`.
    slow: Mutex<BTreeMap<u32, SlowValues>>,
    slow_refresh: Duration,
    /// Each GPU's (by index) NVLink data counter (KiB, TX and RX) at its previous read.
    nvlink_data: Mutex<BTreeMap<u32, (u64, Instant)>>,
    /// Each GPU's newest per-process utilization sample seen (µs), asked for newer ones.
    process_samples_seen: Mutex<BTreeMap<u32, u64>>,
    pub metrics: GpuMetrics,
}

/// How often the values that cost the driver milliseconds are read. Measured on an H200
/// (driver 580): the energy counter 4.2 ms of CPU per call, each PCIe throughput
/// direction 0.8 ms of CPU and 21 ms of wall time (a 20 ms sample), the replay counter and
/// the MIG mode 0.2 ms, the link width 0.1 ms; every other value together under 0.05 ms.
/// Read each period they were ~90 % of a collection's 8 ms; between reads the last values
/// are kept (a counter read every 30 s still rates over any Prometheus window).
pub const SLOW_REFRESH: Duration = Duration::from_secs(30);

/// The costly values of one GPU and when they were read.
#[derive(Clone, Copy, Debug, Default)]
struct SlowValues {
    read_at: Option<Instant>,
    /// The groups they were read for: others are read again at once.
    groups: GpuGroups,
    energy_millijoules: Option<u64>,
    pcie_tx_bytes_per_second: Option<u64>,
    pcie_rx_bytes_per_second: Option<u64>,
    pcie_replays: Option<u64>,
    pcie_link_width: Option<u32>,
    mig_enabled: bool,
}

impl NvmlReader {
    /// Loads the library (`None`: [`DEFAULT_LIBRARY`]) and initialises NVML.
    pub fn open(library: Option<&Path>, metrics: GpuMetrics) -> Result<Self, NvmlError> {
        let path = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let nvml = Nvml::builder().lib_path(path).init()?;
        let driver_version = nvml.sys_driver_version().map(|v| bounded(&v)).unwrap_or_default();
        let library = path.to_string_lossy().into_owned();
        Ok(NvmlReader {
            nvml,
            library,
            driver_version,
            slow: Mutex::default(),
            slow_refresh: SLOW_REFRESH,
            nvlink_data: Mutex::default(),
            process_samples_seen: Mutex::default(),
            metrics,
        })
    }

    /// Reads the costly values this often instead of every [`SLOW_REFRESH`].
    pub fn with_slow_refresh(self, every: Duration) -> Self {
        NvmlReader { slow_refresh: every, ..self }
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    pub fn driver_version(&self) -> &str {
        &self.driver_version
    }

    /// GPUs NVML sees (at most [`MAX_GPUS`]); 0 when it cannot tell.
    pub fn gpu_count(&self) -> u32 {
        self.nvml.device_count().map_or(0, |n| n.min(MAX_GPUS))
    }

    /// The NVML handle, for the Xid event reader.
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Reads every GPU, the values of `groups` and those health needs (blocking: NVML
    /// calls go to the driver).
    pub fn read(&self, groups: GpuGroups) -> GpuSnapshot {
        let count = match self.nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                self.count_failure(&e);
                0
            }
        };
        if count > MAX_GPUS {
            self.metrics.failed("too_many");
        }
        let gpus = (0..count.min(MAX_GPUS)).filter_map(|index| self.read_gpu(index, groups)).collect();
        GpuSnapshot {
            driver_version: self.driver_version.clone(),
            gpus,
            collections: 0,
            stale: false,
            off: false,
            groups,
            duplicate_series: self.metrics.duplicate_series.clone(),
        }
    }

    fn read_gpu(&self, index: u32, groups: GpuGroups) -> Option<Gpu> {
        let device = match self.nvml.device_by_index(index) {
            Ok(device) => device,
            // Lost before its handle: kept, marked lost, so that its health says so.
            Err(NvmlError::GpuLost) => {
                self.metrics.failed("lost");
                return Some(Gpu {
                    identity: GpuIdentity { index, ..GpuIdentity::default() },
                    lost: true,
                    ..Gpu::default()
                });
            }
            Err(e) => {
                self.count_failure(&e);
                return None;
            }
        };
        let mut reads = Reads { reader: self, lost: false, index, groups };
        let identity = GpuIdentity {
            index,
            uuid: reads.value(device.uuid()).map(|u| bounded(&u)).unwrap_or_default(),
            pci_bus_id: reads.value(device.pci_info()).map(|p| bounded(&p.bus_id)).unwrap_or_default(),
            device: reads.value(device.minor_number()).map(|m| format!("nvidia{m}")).unwrap_or_default(),
            model: reads.value(device.name()).map(|n| bounded(&n)).unwrap_or_default(),
        };
        let slow = self.slow_values(index, &device, &mut reads);
        let values = reads.values(&device, &slow);
        let processes = if groups.contains(GpuGroup::Processes) { reads.processes(&device) } else { Vec::new() };
        let mig = if slow.mig_enabled { reads.mig_instances(&device) } else { Vec::new() };
        Some(Gpu { identity, values, processes, mig, lost: reads.lost })
    }

    /// The GPU's costly values: read again once `slow_refresh` has passed, else the last.
    fn slow_values(&self, index: u32, device: &Device<'_>, reads: &mut Reads<'_>) -> SlowValues {
        let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        let last = slow.get(&index).copied().unwrap_or_default();
        if last.groups == reads.groups && last.read_at.is_some_and(|at| at.elapsed() < self.slow_refresh) {
            return last;
        }
        use GpuGroup::{Pcie, Power};
        let fresh = SlowValues {
            read_at: Some(Instant::now()),
            groups: reads.groups,
            energy_millijoules: reads.of(Power, || device.total_energy_consumption()),
            // NVML gives KB/s over its last 20 ms sample.
            pcie_tx_bytes_per_second: reads
                .of(Pcie, || device.pcie_throughput(PcieUtilCounter::Send))
                .map(kib_to_bytes),
            pcie_rx_bytes_per_second: reads
                .of(Pcie, || device.pcie_throughput(PcieUtilCounter::Receive))
                .map(kib_to_bytes),
            pcie_replays: reads.of(Pcie, || device.pcie_replay_counter()).map(u64::from),
            pcie_link_width: reads.of(Pcie, || device.current_pcie_link_width()),
            // MIG instances say which pod holds what: read whatever the groups.
            mig_enabled: reads.value(device.mig_mode()).is_some_and(|m| m.current == 1),
        };
        // A lost GPU is read again at the next collection, whatever it gave.
        if !reads.lost {
            slow.insert(index, fresh);
        }
        fresh
    }

    fn count_failure(&self, e: &NvmlError) {
        match e {
            NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::NotFound => {}
            NvmlError::GpuLost => self.metrics.failed("lost"),
            _ => self.metrics.failed("other"),
        }
    }
}

/// The reads of one GPU (by index) for `groups`: remembers whether NVML called it lost.
struct Reads<'r> {
    reader: &'r NvmlReader,
    lost: bool,
    index: u32,
    groups: GpuGroups,
}

impl Reads<'_> {
    /// The value, or `None` (a failure counted, unless the GPU does not support it).
    fn value<T>(&mut self, read: Result<T, NvmlError>) -> Option<T> {
        match read {
            Ok(v) => Some(v),
            Err(e) => {
                // Once lost, every further call says so again: counted once per GPU.
                if matches!(e, NvmlError::GpuLost) {
                    if self.lost {
                        return None;
                    }
                    self.lost = true;
                }
                self.reader.count_failure(&e);
                None
            }
        }
    }

    /// A value of a group: read only while the group is on.
    fn of<T>(&mut self, group: GpuGroup, read: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.groups.contains(group) {
            self.value(read())
        } else {
            None
        }
    }

    fn values(&mut self, device: &Device<'_>, slow: &SlowValues) -> GpuValues {
        use GpuGroup::{Clocks, Memory, Pcie, Power, Temperature, Utilization};
        let utilization = self.of(Utilization, || device.utilization_rates());
        let memory = self.of(Memory, || device.memory_info());
        let ecc =
            |s: &mut Self, error: MemoryError, counter: EccCounter| s.value(device.total_ecc_errors(error, counter));
        let fields = self.fields(device);
        let field = |id: u32| fields.iter().find(|(f, _)| *f == id).map(|(_, v)| *v);
        GpuValues {
            utilization_gpu: utilization.as_ref().map(|u| u.gpu.min(100)),
            utilization_memory: utilization.as_ref().map(|u| u.memory.min(100)),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_free_bytes: memory.as_ref().map(|m| m.free),
            memory_reserved_bytes: memory.as_ref().map(|m| m.reserved),
            temperature_gpu_c: self.of(Temperature, || device.temperature(TemperatureSensor::Gpu)),
            temperature_memory_c: field(FI_MEMORY_TEMP),
            power_watts: self.of(Power, || device.power_usage()).map(|mw| f64::from(mw) / 1000.0),
            power_limit_watts: self.of(Power, || device.enforced_power_limit()).map(|mw| f64::from(mw) / 1000.0),
            energy_millijoules: slow.energy_millijoules,
            sm_clock_mhz: self.of(Clocks, || device.clock_info(Clock::SM)),
            memory_clock_mhz: self.of(Clocks, || device.clock_info(Clock::Memory)),
            graphics_clock_mhz: self.of(Clocks, || device.clock_info(Clock::Graphics)),
            pcie_link_gen: self.of(Pcie, || device.current_pcie_link_gen()),
            pcie_link_width: slow.pcie_link_width,
            pcie_tx_bytes_per_second: slow.pcie_tx_bytes_per_second,
            pcie_rx_bytes_per_second: slow.pcie_rx_bytes_per_second,
            pcie_replays: slow.pcie_replays,
            // Read whatever the groups: uncorrectable errors turn the GPU's health.
            ecc: EccCounts {
                corrected_volatile: ecc(self, MemoryError::Corrected, EccCounter::Volatile),
                uncorrected_volatile: ecc(self, MemoryError::Uncorrected, EccCounter::Volatile),
                corrected_aggregate: ecc(self, MemoryError::Corrected, EccCounter::Aggregate),
                uncorrected_aggregate: ecc(self, MemoryError::Uncorrected, EccCounter::Aggregate),
            },
            remapped_rows: RemappedRows {
                correctable: field(FI_REMAPPED_COR),
                uncorrectable: field(FI_REMAPPED_UNC),
                pending: field(FI_REMAPPED_PENDING),
                failure: field(FI_REMAPPED_FAILURE),
            },
            nvlink: self.nvlink(&field),
            throttle_reasons: self.of(Clocks, || device.current_throttle_reasons()).map(|r| r.bits()),
        }
    }

    /// The NVLink counters of a GPU with links (none: `None`), its bandwidth over the time
    /// since its previous read.
    fn nvlink(&self, field: &dyn Fn(u32) -> Option<u64>) -> Option<NvLinkCounts> {
        if field(FI_NVLINK_LINK_COUNT).unwrap_or(0) == 0 {
            return None;
        }
        let data = field(FI_NVLINK_DATA_TX_KIB).zip(field(FI_NVLINK_DATA_RX_KIB)).map(|(tx, rx)| tx.saturating_add(rx));
        Some(NvLinkCounts {
            bandwidth: data.and_then(|kib| self.nvlink_bandwidth(kib)),
            crc_flit_errors: field(FI_NVLINK_CRC_FLIT_ERRORS),
            crc_data_errors: field(FI_NVLINK_CRC_DATA_ERRORS),
            replay_errors: field(FI_NVLINK_REPLAY_ERRORS),
            recovery_errors: field(FI_NVLINK_RECOVERY_ERRORS),
        })
    }

    /// DCGM's NVLink bandwidth: the data counter's KiB/s since the previous read, divided
    /// by 1000. `None` at the first read and when the counter went back (driver reload).
    fn nvlink_bandwidth(&self, kib: u64) -> Option<f64> {
        let now = Instant::now();
        let mut last = self.reader.nvlink_data.lock().unwrap_or_else(|p| p.into_inner());
        let previous = last.insert(self.index, (kib, now))?;
        bandwidth(previous, (kib, now))
    }

    /// The values NVML gives only as fields, each `(id, value)` it answered.
    fn fields(&mut self, device: &Device<'_>) -> Vec<(u32, u64)> {
        let mut ids = ALWAYS_FIELDS.to_vec();
        if self.groups.contains(GpuGroup::Temperature) {
            ids.push(FI_MEMORY_TEMP);
        }
        if self.groups.contains(GpuGroup::Nvlink) {
            ids.extend(NVLINK_FIELDS);
        }
        let ids: Vec<FieldId> = ids.into_iter().map(FieldId).collect();
        let Some(samples) = self.value(device.field_values_for(&ids)) else {
            return Vec::new();
        };
        samples.into_iter().zip(ids).filter_map(|(sample, id)| Some((id.0, sample_value(sample.ok()?)?))).collect()
    }

    fn processes(&mut self, device: &Device<'_>) -> Vec<GpuProcess> {
        let mut processes = self.value(device.running_compute_processes()).unwrap_or_default();
        if processes.len() > MAX_PROCESSES_PER_GPU {
            self.reader.metrics.failed("too_many");
            processes.truncate(MAX_PROCESSES_PER_GPU);
        }
        let utilization = if processes.is_empty() { BTreeMap::new() } else { self.process_utilization(device) };
        let mut processes = processes
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
                gpu_instance_id: p.gpu_instance_id,
                sm_utilization: utilization.get(&p.pid).copied(),
            })
            .collect();
        let folded = merge_processes(&mut processes);
        self.reader.metrics.processes_merged.inc_by(folded as u64);
        processes
    }

    /// The SM utilization of each process the driver sampled since the previous read, by
    /// PID (its newest sample). None sampled is no failure (NVML says "not found").
    fn process_utilization(&mut self, device: &Device<'_>) -> BTreeMap<u32, u32> {
        let seen = self.reader.process_samples_seen.lock().unwrap_or_else(|p| p.into_inner()).get(&self.index).copied();
        let Some(mut samples) = self.value(device.process_utilization_stats(seen)) else {
            return BTreeMap::new();
        };
        // The driver keeps a sample buffer per GPU; more than the processes kept is noise.
        samples.sort_unstable_by_key(|s| s.timestamp);
        if let Some(newest) = samples.last() {
            self.reader
                .process_samples_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.index, newest.timestamp);
        }
        samples.iter().rev().take(MAX_PROCESSES_PER_GPU).fold(BTreeMap::new(), |mut by_pid, s| {
            by_pid.entry(s.pid).or_insert(s.sm_util.min(100));
            by_pid
        })
    }

    /// The MIG instances of a GPU in MIG mode.
    fn mig_instances(&mut self, device: &Device<'_>) -> Vec<MigInstance> {
        let slots = self.value(device.mig_device_count()).unwrap_or(0).min(MAX_MIG_INSTANCES);
        // Empty slots answer "not found": no instance there.
        (0..slots)
            .filter_map(|slot| device.mig_device_by_index(slot).ok())
            .map(|mig| {
                let memory = self.value(mig.memory_info());
                MigInstance {
                    gpu_instance_id: gpu_instance_id(self.reader.nvml(), &mig).unwrap_or(u32::MAX),
                    uuid: self.value(mig.uuid()).map(|u| bounded(&u)).unwrap_or_default(),
                    memory_total_bytes: memory.as_ref().map(|m| m.total),
                    memory_used_bytes: memory.as_ref().map(|m| m.used),
                }
            })
            .collect()
    }
}

/// A MIG device's GPU instance id (the wrapper has no call for it).
fn gpu_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Option<u32> {
    let get = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
    let mut id = 0u32;
    // SAFETY: the handle is a live MIG device handle of this NVML instance, and `id` is a
    // valid place for the one u32 the call writes.
    let code = unsafe { get(mig.handle(), &mut id) };
    (code == 0).then_some(id)
}

fn sample_value(sample: FieldValueSample) -> Option<u64> {
    match sample.value.ok()? {
        SampleValue::U32(v) => Some(v.into()),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(v) => (v.is_finite() && v >= 0.0).then_some(v as u64),
    }
}

/// KiB/s between two reads of a growing counter, divided by 1000 as DCGM divides it.
fn bandwidth((before, then): (u64, Instant), (after, now): (u64, Instant)) -> Option<f64> {
    let seconds = now.checked_duration_since(then)?.as_secs_f64();
    (after >= before && seconds > 0.0).then(|| (after - before) as f64 / seconds / 1000.0)
}

fn kib_to_bytes(kib: u32) -> u64 {
    u64::from(kib) * 1024
}

/// Identity text from the driver, cut at [`MAX_TEXT`] bytes (on a character boundary)
/// and without control characters.
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_text_is_bounded_and_cleaned() {
        assert_eq!(bounded("NVIDIA A10G"), "NVIDIA A10G");
        assert_eq!(bounded(&"é".repeat(100)).len(), MAX_TEXT);
        assert_eq!(bounded("A\u{7}B\n"), "AB");
    }

    #[test]
    fn nvlink_bandwidth_is_the_counters_kib_per_second_over_1000_and_none_after_a_reset() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        assert_eq!(bandwidth((1_000, then), (9_000_000, now)), Some(4_499.5));
        assert_eq!(bandwidth((9_000, then), (1_000, now)), None, "the counter went back");
        assert_eq!(bandwidth((1_000, now), (2_000, now)), None, "no time passed");
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_crash() {
        let missing = Path::new("/nonexistent/libnvidia-ml.so.1");
        assert!(NvmlReader::open(Some(missing), GpuMetrics::default()).is_err());
    }
}
