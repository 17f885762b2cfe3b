//! The YAML file named by `FAKE_NVML_CONFIG`: its model, its limits and how it becomes a
//! [`Machine`] (catalogue defaults, then the file's overrides). Every error names the field.

use serde::Deserialize;

use crate::catalogue::{self, InstanceType};
use crate::machine::{uuid_from, Ecc, Gpu, Machine, MigInstance, NvLink, Process, RemappedRows};

/// Larger files are refused before they are read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
pub const MAX_GPUS: usize = 64;
pub const MAX_PROCESSES_PER_GPU: usize = 1024;
pub const MAX_XIDS_PER_GPU: usize = 1024;
/// NVML's MIG limit on the models here (A100, H100).
pub const MAX_MIG_DEVICES: usize = 7;
/// NVML's version buffers hold 80 bytes with the NUL; the NVML version is "12." before it.
const MAX_VERSION_BYTES: usize = 76;
const MAX_SEED_BYTES: usize = 128;
const DEFAULT_DRIVER_VERSION: &str = "550.127.05";
/// CUDA 12.4, what driver 550 reports.
const DEFAULT_CUDA_DRIVER_VERSION: i32 = 12040;
const DEFAULT_TEMPERATURE_C: u32 = 30;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    instance_type: String,
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    /// What the UUIDs derive from (default: the instance type), so that two fake nodes differ.
    uuid_seed: Option<String>,
    #[serde(default)]
    gpus: Vec<GpuEntry>,
    #[serde(default)]
    processes: Vec<ProcessEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuEntry {
    index: usize,
    utilization_gpu: Option<u32>,
    utilization_memory: Option<u32>,
    memory_used_mib: Option<u64>,
    temperature_c: Option<u32>,
    power_w: Option<f64>,
    memory_temperature_c: Option<u32>,
    power_limit_w: Option<u32>,
    sm_clock_mhz: Option<u32>,
    memory_clock_mhz: Option<u32>,
    pcie_tx_kbps: Option<u32>,
    pcie_rx_kbps: Option<u32>,
    pcie_replay_counter: Option<u32>,
    throttle_reasons: Option<u64>,
    ecc: Option<EccEntry>,
    remapped_rows: Option<RemappedRowsEntry>,
    nvlink: Option<NvLinkEntry>,
    #[serde(default)]
    lost: bool,
    #[serde(default)]
    xid: Vec<u64>,
    mig: Option<MigEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EccEntry {
    #[serde(default)]
    corrected_volatile: u64,
    #[serde(default)]
    uncorrected_volatile: u64,
    corrected_aggregate: Option<u64>,
    uncorrected_aggregate: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemappedRowsEntry {
    #[serde(default)]
    correctable: u32,
    #[serde(default)]
    uncorrectable: u32,
    #[serde(default)]
    pending: bool,
    #[serde(default)]
    failure: bool,
}

/// A GPU's NVLink traffic and error counts; refused on a model without NVLink.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvLinkEntry {
    #[serde(default)]
    tx_kib_per_second: u64,
    #[serde(default)]
    rx_kib_per_second: u64,
    #[serde(default)]
    crc_flit_errors: u64,
    #[serde(default)]
    crc_data_errors: u64,
    #[serde(default)]
    replay_errors: u64,
    #[serde(default)]
    recovery_errors: u64,
}

/// NVLink 4's 18 links carry 900 GB/s together; more is a mistake in the file.
const MAX_NVLINK_KIB_PER_SECOND: u64 = 1 << 30;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigEntry {
    enabled: bool,
    #[serde(default)]
    instances: Vec<MigInstanceEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigInstanceEntry {
    profile: String,
    gpu_instance_id: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessEntry {
    gpu: usize,
    pid: u32,
    used_memory_mib: u64,
    gpu_instance_id: Option<u32>,
    /// The compute instance of the GPU instance (default 0). NVML lists a process once per
    /// compute instance it runs in: the same PID twice in one GPU instance.
    compute_instance_id: Option<u32>,
    /// Percent of the last sample the process's kernels ran (none: no utilization sample).
    sm_util: Option<u32>,
    #[serde(default)]
    mem_util: u32,
}

/// The machine a file describes, or what is wrong with it (naming the field).
pub fn parse(text: &str) -> Result<Machine, String> {
    let file: File = serde_norway::from_str(text).map_err(|e| format!("not a fake NVML configuration: {e}"))?;
    let kind = catalogue::instance_type(&file.instance_type).ok_or_else(|| {
        format!("instance_type {:?} is not one of {}", truncate(&file.instance_type, 64), catalogue::known_names())
    })?;
    let seed = truncate(file.uuid_seed.as_deref().unwrap_or(kind.name), MAX_SEED_BYTES);
    let mut gpus: Vec<Gpu> = (0..kind.pci_slots.len()).map(|i| default_gpu(kind, &seed, i)).collect();
    if gpus.len() > MAX_GPUS {
        return Err(format!("{} has more than {MAX_GPUS} GPUs", kind.name));
    }
    let mut seen = vec![false; gpus.len()];
    for (n, entry) in file.gpus.iter().enumerate() {
        let gpu = gpus.get_mut(entry.index).ok_or_else(|| {
            format!("gpus[{n}].index {} is not a GPU of {} (it has {})", entry.index, kind.name, seen.len())
        })?;
        if std::mem::replace(&mut seen[entry.index], true) {
            return Err(format!("gpus[{n}].index {} is given twice", entry.index));
        }
        apply(gpu, entry, &seed).map_err(|e| format!("gpus[{n}].{e}"))?;
    }
    for (n, entry) in file.processes.iter().enumerate() {
        add_process(&mut gpus, entry).map_err(|e| format!("processes[{n}].{e}"))?;
    }
    let driver_version = truncate(file.driver_version.as_deref().unwrap_or(DEFAULT_DRIVER_VERSION), MAX_VERSION_BYTES);
    let cuda_driver_version = file.cuda_driver_version.unwrap_or(DEFAULT_CUDA_DRIVER_VERSION);
    if !(1000..=99_990).contains(&cuda_driver_version) {
        return Err(format!("cuda_driver_version {cuda_driver_version} is not major*1000+minor*10"));
    }
    Ok(Machine { driver_version, cuda_driver_version, gpus })
}

fn default_gpu(kind: &InstanceType, seed: &str, index: usize) -> Gpu {
    let model = kind.model;
    let (pci_bus, pci_device) = kind.pci_slots[index];
    Gpu {
        index: index as u32,
        name: model.name.to_string(),
        uuid: format!("GPU-{}", uuid_from(seed, &[index as u64])),
        pci_bus,
        pci_device,
        pci_device_id: model.pci_device_id,
        pci_subsystem_id: model.pci_subsystem_id,
        memory_total_mib: model.memory_mib,
        memory_used_mib: 0,
        utilization_gpu: 0,
        utilization_memory: 0,
        temperature_c: DEFAULT_TEMPERATURE_C,
        memory_temperature_c: model.memory_temperature_c,
        power_mw: model.idle_power_w * 1000,
        power_limit_mw: model.power_limit_w * 1000,
        sm_clock_mhz: model.max_sm_clock_mhz,
        memory_clock_mhz: model.max_memory_clock_mhz,
        video_clock_mhz: model.video_clock_mhz,
        pcie_generation: model.pcie_generation,
        pcie_width: model.pcie_width,
        pcie_tx_kbps: 0,
        pcie_rx_kbps: 0,
        pcie_replay_counter: 0,
        // NVML's "GPU idle" reason, what an idle GPU reports.
        throttle_reasons: 0x1,
        ecc: Ecc::default(),
        remapped_rows: RemappedRows::default(),
        nvlink: NvLink { links: model.nvlinks, ..NvLink::default() },
        lost: false,
        xid: Vec::new(),
        max_mig_devices: model.max_mig_devices,
        mig_enabled: false,
        mig_instances: Vec::new(),
        processes: Vec::new(),
    }
}

/// One `gpus` entry over the GPU's defaults; the error starts with the field's name.
fn apply(gpu: &mut Gpu, entry: &GpuEntry, seed: &str) -> Result<(), String> {
    if let Some(u) = entry.utilization_gpu {
        gpu.utilization_gpu = percent("utilization_gpu", u)?;
        gpu.throttle_reasons = if u == 0 { 0x1 } else { 0 };
        gpu.pcie_tx_kbps = u * 1000;
        gpu.pcie_rx_kbps = u * 2000;
    }
    if let Some(u) = entry.utilization_memory {
        gpu.utilization_memory = percent("utilization_memory", u)?;
    }
    if let Some(m) = entry.memory_used_mib {
        gpu.memory_used_mib = at_most("memory_used_mib", m, gpu.memory_total_mib)?;
    }
    if let Some(t) = entry.temperature_c {
        gpu.temperature_c = at_most("temperature_c", t, 200)?;
    }
    if let Some(t) = entry.memory_temperature_c {
        gpu.memory_temperature_c = Some(at_most("memory_temperature_c", t, 200)?);
    }
    if let Some(w) = entry.power_limit_w {
        gpu.power_limit_mw = at_most("power_limit_w", w, 5000)? * 1000;
    }
    if let Some(w) = entry.power_w {
        if !(0.0..=5000.0).contains(&w) {
            return Err(format!("power_w {w} is not between 0 and 5000"));
        }
        gpu.power_mw = (w * 1000.0).round() as u32;
    }
    apply_links(gpu, entry)?;
    apply_nvlink(gpu, entry.nvlink.as_ref())?;
    apply_faults(gpu, entry)?;
    if let Some(mig) = &entry.mig {
        apply_mig(gpu, mig, seed)?;
    }
    Ok(())
}

fn apply_links(gpu: &mut Gpu, entry: &GpuEntry) -> Result<(), String> {
    let clock = |name: &str, v: Option<u32>, default: u32| v.map_or(Ok(default), |v| at_most(name, v, 20_000));
    gpu.sm_clock_mhz = clock("sm_clock_mhz", entry.sm_clock_mhz, gpu.sm_clock_mhz)?;
    gpu.memory_clock_mhz = clock("memory_clock_mhz", entry.memory_clock_mhz, gpu.memory_clock_mhz)?;
    gpu.pcie_tx_kbps = entry.pcie_tx_kbps.unwrap_or(gpu.pcie_tx_kbps);
    gpu.pcie_rx_kbps = entry.pcie_rx_kbps.unwrap_or(gpu.pcie_rx_kbps);
    gpu.pcie_replay_counter = entry.pcie_replay_counter.unwrap_or(gpu.pcie_replay_counter);
    gpu.throttle_reasons = entry.throttle_reasons.unwrap_or(gpu.throttle_reasons);
    Ok(())
}

fn apply_nvlink(gpu: &mut Gpu, entry: Option<&NvLinkEntry>) -> Result<(), String> {
    let Some(e) = entry else { return Ok(()) };
    if gpu.nvlink.links == 0 {
        return Err(format!("nvlink: {} has no NVLink", gpu.name));
    }
    gpu.nvlink = NvLink {
        links: gpu.nvlink.links,
        tx_kib_per_second: at_most("nvlink.tx_kib_per_second", e.tx_kib_per_second, MAX_NVLINK_KIB_PER_SECOND)?,
        rx_kib_per_second: at_most("nvlink.rx_kib_per_second", e.rx_kib_per_second, MAX_NVLINK_KIB_PER_SECOND)?,
        crc_flit_errors: e.crc_flit_errors,
        crc_data_errors: e.crc_data_errors,
        replay_errors: e.replay_errors,
        recovery_errors: e.recovery_errors,
    };
    Ok(())
}

fn apply_faults(gpu: &mut Gpu, entry: &GpuEntry) -> Result<(), String> {
    if let Some(e) = &entry.ecc {
        gpu.ecc = Ecc {
            corrected_volatile: e.corrected_volatile,
            uncorrected_volatile: e.uncorrected_volatile,
            corrected_aggregate: e.corrected_aggregate.unwrap_or(e.corrected_volatile),
            uncorrected_aggregate: e.uncorrected_aggregate.unwrap_or(e.uncorrected_volatile),
        };
    }
    if let Some(r) = &entry.remapped_rows {
        gpu.remapped_rows = RemappedRows {
            correctable: r.correctable,
            uncorrectable: r.uncorrectable,
            pending: r.pending,
            failure: r.failure,
        };
    }
    gpu.lost = entry.lost;
    if entry.xid.len() > MAX_XIDS_PER_GPU {
        return Err(format!("xid has {} codes, more than {MAX_XIDS_PER_GPU}", entry.xid.len()));
    }
    gpu.xid.clone_from(&entry.xid);
    Ok(())
}

fn apply_mig(gpu: &mut Gpu, mig: &MigEntry, seed: &str) -> Result<(), String> {
    if gpu.max_mig_devices == 0 {
        return Err(format!("mig: {} has no MIG", gpu.name));
    }
    if !mig.enabled && !mig.instances.is_empty() {
        return Err("mig.instances given while mig.enabled is false".to_string());
    }
    if mig.instances.len() > MAX_MIG_DEVICES {
        return Err(format!("mig.instances has {}, more than {MAX_MIG_DEVICES}", mig.instances.len()));
    }
    gpu.mig_enabled = mig.enabled;
    for (n, inst) in mig.instances.iter().enumerate() {
        let memory_gb = profile_memory_gb(&inst.profile).ok_or_else(|| {
            format!("mig.instances[{n}].profile {:?} is not like 1g.10gb", truncate(&inst.profile, 32))
        })?;
        if gpu.mig_instances.iter().any(|m| m.gpu_instance_id == inst.gpu_instance_id) {
            return Err(format!("mig.instances[{n}].gpu_instance_id {} is given twice", inst.gpu_instance_id));
        }
        gpu.mig_instances.push(MigInstance {
            profile: inst.profile.clone(),
            gpu_instance_id: inst.gpu_instance_id,
            uuid: format!(
                "MIG-{}",
                uuid_from(seed, &[u64::from(gpu.index), u64::from(inst.gpu_instance_id), 0x6d6967])
            ),
            name: format!("{} MIG {}", gpu.name, inst.profile),
            memory_mib: (memory_gb * 1024).min(gpu.memory_total_mib),
        });
    }
    Ok(())
}

/// The memory of a MIG profile named `<slices>g.<memory>gb`, in GB.
fn profile_memory_gb(profile: &str) -> Option<u64> {
    let (slices, memory) = profile.split_once("g.")?;
    let memory = memory.strip_suffix("gb")?;
    let slices: u32 = slices.parse().ok()?;
    let memory: u64 = memory.parse().ok()?;
    ((1..=7).contains(&slices) && (1..=1024).contains(&memory)).then_some(memory)
}

fn add_process(gpus: &mut [Gpu], entry: &ProcessEntry) -> Result<(), String> {
    let count = gpus.len();
    let gpu = gpus.get_mut(entry.gpu).ok_or_else(|| format!("gpu {} is not a GPU (there are {count})", entry.gpu))?;
    if gpu.processes.len() >= MAX_PROCESSES_PER_GPU {
        return Err(format!("gpu {}: more than {MAX_PROCESSES_PER_GPU} processes", entry.gpu));
    }
    let used_memory_mib = at_most("used_memory_mib", entry.used_memory_mib, gpu.memory_total_mib)?;
    if let Some(id) = entry.gpu_instance_id {
        if !gpu.mig_instances.iter().any(|m| m.gpu_instance_id == id) {
            return Err(format!("gpu_instance_id {id} is not a MIG instance of GPU {}", entry.gpu));
        }
    }
    if entry.compute_instance_id.is_some() && entry.gpu_instance_id.is_none() {
        return Err("compute_instance_id without a gpu_instance_id".to_owned());
    }
    let utilization = match entry.sm_util {
        Some(sm) => Some((percent("sm_util", sm)?, percent("mem_util", entry.mem_util)?)),
        None => None,
    };
    gpu.processes.push(Process {
        pid: entry.pid,
        used_memory_mib,
        gpu_instance_id: entry.gpu_instance_id,
        compute_instance_id: entry.compute_instance_id.unwrap_or(0),
        utilization,
    });
    Ok(())
}

fn percent(name: &str, v: u32) -> Result<u32, String> {
    at_most(name, v, 100)
}

fn at_most<T: PartialOrd + std::fmt::Display>(name: &str, v: T, max: T) -> Result<T, String> {
    if v > max {
        return Err(format!("{name} {v} is more than {max}"));
    }
    Ok(v)
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_type_alone_gives_its_gpus_with_defaults() {
        let m = parse("instance_type: g5.12xlarge").unwrap();
        assert_eq!(m.gpus.len(), 4);
        assert_eq!(m.gpus[3].bus_id(), "00000000:00:1E.0");
        assert_eq!(m.gpus[0].memory_total_mib, 23028);
        assert_eq!(m.driver_version, DEFAULT_DRIVER_VERSION);
        assert_eq!(m.gpus[0].memory_temperature_c, None);
    }

    #[test]
    fn sxm_parts_have_their_nvlinks_and_pcie_cards_none() {
        let p5 = parse(
            "instance_type: p5.48xlarge\ngpus: [{index: 1, nvlink: {tx_kib_per_second: 5000, replay_errors: 3}}]",
        )
        .unwrap();
        assert_eq!((p5.gpus[0].nvlink.links, p5.gpus[0].nvlink.tx_kib_per_second), (18, 0));
        assert_eq!((p5.gpus[1].nvlink.tx_kib_per_second, p5.gpus[1].nvlink.replay_errors), (5000, 3));
        assert_eq!(parse("instance_type: p4d.24xlarge").unwrap().gpus[0].nvlink.links, 12);
        assert_eq!(parse("instance_type: g6.xlarge").unwrap().gpus[0].nvlink.links, 0);
    }

    #[test]
    fn overrides_touch_only_their_gpu() {
        let m = parse("instance_type: p5.48xlarge\ngpus:\n- {index: 2, utilization_gpu: 87, memory_used_mib: 4096, power_w: 412.5}")
            .unwrap();
        assert_eq!((m.gpus[2].utilization_gpu, m.gpus[2].memory_used_mib, m.gpus[2].power_mw), (87, 4096, 412_500));
        assert_eq!(m.gpus[2].throttle_reasons, 0);
        assert_eq!((m.gpus[1].utilization_gpu, m.gpus[1].memory_used_mib), (0, 0));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("instance_type: p9.huge", "instance_type"),
            ("instance_type: g5.xlarge\ngpus: [{index: 1}]", "gpus[0].index 1"),
            ("instance_type: g5.xlarge\ngpus: [{index: 0, utilization_gpu: 101}]", "gpus[0].utilization_gpu"),
            ("instance_type: g5.xlarge\ngpus: [{index: 0, memory_used_mib: 23029}]", "gpus[0].memory_used_mib"),
            ("instance_type: g5.xlarge\ngpus: [{index: 0}, {index: 0}]", "gpus[1].index 0 is given twice"),
            ("instance_type: g5.xlarge\ngpus: [{index: 0, mig: {enabled: true}}]", "has no MIG"),
            ("instance_type: g5.xlarge\ngpus: [{index: 0, nvlink: {}}]", "gpus[0].nvlink: NVIDIA A10G has no NVLink"),
            (
                "instance_type: p5.48xlarge\ngpus: [{index: 0, nvlink: {tx_kib_per_second: 1099511627776}}]",
                "gpus[0].nvlink.tx_kib_per_second",
            ),
            ("instance_type: p5.48xlarge\ngpus: [{index: 0, mig: {enabled: true, instances: [{profile: big, gpu_instance_id: 1}]}}]", "profile"),
            ("instance_type: g5.xlarge\nprocesses: [{gpu: 1, pid: 1, used_memory_mib: 1}]", "processes[0].gpu 1"),
            ("instance_type: g5.xlarge\nprocesses: [{gpu: 0, pid: 1, used_memory_mib: 1, gpu_instance_id: 3}]", "gpu_instance_id 3"),
            ("instance_type: g5.xlarge\nprocesses: [{gpu: 0, pid: 1, used_memory_mib: 1, compute_instance_id: 1}]", "processes[0].compute_instance_id"),
            ("instance_type: g5.xlarge\ncolour: red", "unknown field"),
            ("instance_type: [", "not a fake NVML configuration"),
        ];
        for (yaml, want) in cases {
            let err = parse(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml:?}: {err}");
        }
    }

    #[test]
    fn too_many_processes_on_one_gpu_are_refused() {
        let mut yaml = String::from("instance_type: g6.xlarge\nprocesses:\n");
        for pid in 0..=MAX_PROCESSES_PER_GPU {
            yaml.push_str(&format!("- {{gpu: 0, pid: {pid}, used_memory_mib: 1}}\n"));
        }
        assert!(parse(&yaml).unwrap_err().contains("more than 1024 processes"));
    }

    #[test]
    fn mig_instances_get_memory_names_and_distinct_uuids() {
        let yaml = "instance_type: p4d.24xlarge\ngpus:\n- index: 1\n  mig: {enabled: true, instances: [{profile: 1g.5gb, gpu_instance_id: 7}, {profile: 3g.20gb, gpu_instance_id: 1}]}";
        let m = parse(yaml).unwrap();
        let mig = &m.gpus[1].mig_instances;
        assert_eq!(mig[0].memory_mib, 5 * 1024);
        assert_eq!(mig[1].name, "NVIDIA A100-SXM4-40GB MIG 3g.20gb");
        assert!(mig[0].uuid.starts_with("MIG-") && mig[0].uuid.len() == 40);
        assert_ne!(mig[0].uuid, mig[1].uuid);
        assert!(m.gpus[1].mig_enabled && !m.gpus[0].mig_enabled);
    }

    #[test]
    fn long_strings_are_cut_to_nvml_buffers() {
        let long = "5".repeat(300);
        let m = parse(&format!("instance_type: g5.xlarge\ndriver_version: '{long}'")).unwrap();
        assert_eq!(m.driver_version.len(), MAX_VERSION_BYTES);
        assert_eq!(truncate("ééé", 3), "é");
    }

    #[test]
    fn uuid_seed_changes_every_uuid() {
        let a = parse("instance_type: g5.xlarge").unwrap();
        let b = parse("instance_type: g5.xlarge\nuuid_seed: node-b").unwrap();
        assert_ne!(a.gpus[0].uuid, b.gpus[0].uuid);
    }
}
