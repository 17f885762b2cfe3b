//! A fake Neuron driver: the sysfs tree of the instance type's devices under a
//! directory (`--sysfs-root`), kernel-log records appended to a file (`--kmsg`), and
//! faults injected into both on a schedule (`--health-fault KIND[:DEVICE[:ARG]]@AFTER`)
//! or when a line naming one is appended to a control file (`--health-control FILE`,
//! the simulator's stand-in for a signal: it checks the file every 50 ms).
//! On a host without Neuron devices (a GPU node, [`Driver::without_devices`]) only the
//! kernel log is kept: `xid:<code>:<bus id>` lines write an NVIDIA driver's Xid records.
//!
//! Written from the facts of the reference, independently of the agent's readers:
//! files are replaced atomically (a new file renamed over the old one), so a reader
//! never sees half a value.

use std::{
    fs,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    thread::sleep,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context, Result};
use api::{duration::Period, hardware::Generation};

use crate::hardware::InstanceType;

/// The driver version the fake tree claims (unhealthy_components and the heartbeat
/// exist from 2.30.2 on).
pub const DRIVER_VERSION: &str = "2.30.2.0";
/// How often the heartbeat advances (Trn2 and later).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How often the control file and the schedule are checked.
const TICK: Duration = Duration::from_millis(50);

/// A fault the simulator can inject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// HBM uncorrectable: kernel record, `mem_ecc_uncorrected` and its health_status twin.
    HbmUe,
    /// SRAM uncorrectable: kernel record, `sram_ecc_uncorrected`.
    SramUe,
    /// NeuronCore uncorrectable: kernel record, the core's `hw_nc_ue_error`.
    NcUe,
    /// DMA abort: kernel record, the core's `hw_dma_abort_error`, a driver error record.
    Dma,
    /// Repairable HBM uncorrectable: the repairable counters only (no kernel record).
    RepairableHbm,
    /// A component listed in `unhealthy_components`.
    Component(String),
    /// The heartbeat stops advancing.
    HeartbeatStall,
    /// `stats/power/utilization` with this status token.
    Power(String),
    /// `reset` reads this state (0 resetting, 1 ready, 2 invalid).
    Reset(u8),
    /// Every counter back to zero, components healthy, state ready: a driver reload.
    Reload,
    /// An NVIDIA Xid record in the kernel log for the GPU at this PCI address (the
    /// kernel's form, `0000:00:1e`); no Neuron device is involved.
    Xid { code: u32, pci: String },
}

/// One fault on one device; `arg` is the core (NC/DMA), the component, the power
/// status or the reset state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub device: u32,
    pub core: u32,
}

pub const FAULT_KINDS: &str = "hbm-ue, sram-ue, nc-ue, dma, repairable-hbm, component, heartbeat-stall, power, \
                               reset, reload, xid";

/// Parses `KIND[:DEVICE[:ARG]]`, or `xid:CODE:BUS_ID` (the bus id has colons of its own).
pub fn parse_fault(spec: &str) -> Result<Fault> {
    if let Some(rest) = spec.trim().strip_prefix("xid:") {
        let (code, bus) = rest.split_once(':').with_context(|| format!("fault {spec:?}: xid:CODE:BUS_ID"))?;
        let code = code.parse().with_context(|| format!("Xid code {code:?} of fault {spec:?}"))?;
        return Ok(Fault { kind: FaultKind::Xid { code, pci: kernel_pci_address(bus)? }, device: 0, core: 0 });
    }
    let mut parts = spec.trim().split(':');
    let kind = parts.next().unwrap_or_default();
    let device = match parts.next() {
        Some(d) => d.parse().with_context(|| format!("device {d:?} of fault {spec:?}"))?,
        None => 0,
    };
    let arg = parts.next();
    if parts.next().is_some() {
        bail!("fault {spec:?}: KIND[:DEVICE[:ARG]]");
    }
    let core = |arg: Option<&str>| -> Result<u32> {
        arg.map(|a| a.parse::<u32>().with_context(|| format!("core {a:?} of fault {spec:?}")))
            .transpose()
            .map(|c| c.unwrap_or(0))
    };
    let kind = match kind {
        "hbm-ue" => FaultKind::HbmUe,
        "sram-ue" => FaultKind::SramUe,
        "nc-ue" => FaultKind::NcUe,
        "dma" => FaultKind::Dma,
        "repairable-hbm" => FaultKind::RepairableHbm,
        "component" => FaultKind::Component(arg.unwrap_or("link_efa").to_owned()),
        "heartbeat-stall" => FaultKind::HeartbeatStall,
        "power" => FaultKind::Power(
            match arg.unwrap_or("invalid") {
                "valid" => "POWER_STATUS_VALID",
                "no_data" => "POWER_STATUS_NO_DATA",
                "invalid" => "POWER_STATUS_INVALID",
                other => bail!("power status {other:?}: valid, no_data or invalid"),
            }
            .to_owned(),
        ),
        "reset" => FaultKind::Reset(match arg.unwrap_or("2") {
            "0" => 0,
            "1" => 1,
            "2" => 2,
            other => bail!("reset state {other:?}: 0, 1 or 2"),
        }),
        "reload" => FaultKind::Reload,
        other => bail!("unknown fault kind {other:?}; known: {FAULT_KINDS}"),
    };
    let core = match kind {
        FaultKind::NcUe | FaultKind::Dma => core(arg)?,
        _ => 0,
    };
    Ok(Fault { kind, device, core })
}

/// Parses `KIND[:DEVICE[:ARG]]@AFTER` (AFTER: "500ms", "2s").
pub fn parse_scheduled(spec: &str) -> Result<(Duration, Fault)> {
    let (fault, after) = spec.rsplit_once('@').with_context(|| format!("fault {spec:?}: KIND[:DEVICE[:ARG]]@AFTER"))?;
    let after: Period = after.parse().map_err(|e| anyhow::anyhow!("fault {spec:?}: {e}"))?;
    Ok((after.as_duration(), parse_fault(fault)?))
}

/// A GPU's PCI bus id as NVIDIA's driver writes it in an Xid record: `0000:00:1e`, from
/// NVML's `00000000:00:1E.0` (or the legacy `0000:00:1E.0`, or that form already).
pub fn kernel_pci_address(bus_id: &str) -> Result<String> {
    let bad = || anyhow::anyhow!("PCI bus id {bus_id:?}: DOMAIN:BUS:DEVICE[.FUNCTION] in hex");
    let mut parts = bus_id.split(':');
    let (Some(domain), Some(bus), Some(device), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let device = device.split_once('.').map_or(device, |(d, _)| d);
    let hex = |s: &str, width: usize| {
        (!s.is_empty() && s.len() <= width && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    match (hex(domain, 8), hex(bus, 2), hex(device, 2)) {
        (Some(d), Some(b), Some(v)) if d <= 0xffff => Ok(format!("{d:04x}:{b:02x}:{v:02x}")),
        _ => Err(bad()),
    }
}

/// The kernel log file (`--kmsg`): records in /dev/kmsg's format,
/// `PRIORITY,SEQ,USEC,-;TEXT`, numbered on from the records already there.
pub struct KernelLog {
    path: PathBuf,
    seq: u64,
}

impl KernelLog {
    /// Opens (creates) the log; the next sequence number follows the file's last one.
    pub fn open(path: PathBuf) -> Result<KernelLog> {
        let seq = fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.lines().rev().find_map(|l| l.split(',').nth(1)?.parse::<u64>().ok()))
            .map_or(1, |s| s + 1);
        // The log exists from the start, as /dev/kmsg does.
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(KernelLog { path, seq })
    }

    /// Appends one record of the kernel facility at `level` (3: err, 4: warning).
    pub fn record(&mut self, level: u8, text: &str) -> Result<()> {
        let line = format!("{level},{},{},-;{text}\n", self.seq, uptime_usec());
        self.seq += 1;
        // Created again when rotated away, as the simulator always did.
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.write_all(line.as_bytes()).with_context(|| format!("appending to {}", self.path.display()))
    }

    /// An NVIDIA driver's Xid record, as the driver writes it when no process is to blame.
    pub fn xid(&mut self, code: u32, pci: &str) -> Result<()> {
        let what = match code {
            79 => "GPU has fallen off the bus.",
            48 => "An uncorrectable double bit error (DBE) has been detected on GPU.",
            13 => "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
            _ => "Xid error injected by neuron-monitor-sim",
        };
        self.record(3, &format!("NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', name=<unknown>, {what}"))
    }
}

/// Counters of one simulated device.
#[derive(Clone, Debug, Default)]
struct Device {
    hbm_ue: u64,
    sram_ue: u64,
    repairable: u64,
    hw_error_event: u64,
    /// Per core: hw_nc_ue_error, hw_dma_abort_error, hw_repairable_hbm_ue_error.
    cores: Vec<[u64; 3]>,
    components: Vec<String>,
    heartbeat: u64,
    stalled: bool,
    power: String,
    reset: u8,
}

/// The fake driver.
pub struct Driver {
    /// None: a host without Neuron devices (only the kernel log is kept).
    instance: Option<InstanceType>,
    root: Option<PathBuf>,
    kmsg: Option<KernelLog>,
    devices: Vec<Device>,
}

/// Replaces `path` by a file holding `text`, so that a reader sees the old or the new
/// text, never part of it. The directory is made only when missing: the simulated
/// kernel's writes are part of what the agent bench measures, and most are to a tree that
/// exists.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().context("a file in a directory")?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.sim-tmp"));
    if let Err(e) = fs::write(&tmp, text) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e).with_context(|| format!("writing {}", tmp.display()));
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    }
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Microseconds since boot, as kernel records carry them.
fn uptime_usec() -> u64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1e6) as u64)
        .unwrap_or(0)
}

impl Driver {
    pub fn new(instance: InstanceType, root: Option<PathBuf>, kmsg: Option<PathBuf>) -> Result<Driver> {
        let cores = instance.cores_per_device as usize;
        let device = Device {
            cores: vec![[0; 3]; cores],
            power: "POWER_STATUS_VALID".to_owned(),
            reset: 1,
            ..Device::default()
        };
        let kmsg = kmsg.map(KernelLog::open).transpose()?;
        let mut driver =
            Driver { instance: Some(instance), root, kmsg, devices: vec![device; instance.devices as usize] };
        driver.write_tree()?;
        Ok(driver)
    }

    /// The kernel log of a host without Neuron devices (a GPU node): Xid faults only.
    pub fn without_devices(kmsg: PathBuf) -> Result<Driver> {
        Ok(Driver { instance: None, root: None, kmsg: Some(KernelLog::open(kmsg)?), devices: Vec::new() })
    }

    fn v2(&self) -> bool {
        self.instance.is_some_and(|i| i.generation != Generation::Inferentia)
    }

    fn trn2(&self) -> bool {
        self.instance.is_some_and(|i| i.generation == Generation::Trainium2)
    }

    fn device_dir(root: &Path, index: usize) -> PathBuf {
        root.join(format!("devices/virtual/neuron_device/neuron{index}"))
    }

    /// Writes every file of the tree.
    fn write_tree(&mut self) -> Result<()> {
        let (Some(root), Some(instance)) = (self.root.clone(), self.instance) else { return Ok(()) };
        let (arch, family, name) = match instance.generation {
            Generation::Inferentia => ("NDv2", "Inf1", "Inferentia"),
            Generation::Inferentia2 => ("NDv3", "Inf2", "Inferentia2"),
            Generation::Trainium => ("NDv3", "Trn1", "Trainium1"),
            Generation::Trainium2 => ("NDv4", "Trn2", "Trainium2"),
            // The driver's Trn3 names (aws-neuron-driver v4/neuron_dhal_v4.c).
            Generation::Trainium3 => ("NDv4", "Trn3", "Trainium3"),
        };
        for i in 0..self.devices.len() {
            let dir = Self::device_dir(&root, i);
            write_atomic(&dir.join("core_count"), &instance.cores_per_device.to_string())?;
            write_atomic(&dir.join("connected_devices"), "\n")?;
            write_atomic(&dir.join("info/architecture/arch_type"), &format!("{arch}\n"))?;
            write_atomic(&dir.join("info/architecture/instance_type"), &format!("{family}\n"))?;
            write_atomic(&dir.join("info/architecture/device_name"), &format!("{name}\n"))?;
            if self.v2() {
                write_atomic(&dir.join("info/serial_number"), &format!("{}\n", serial(i)))?;
            }
            for core in 0..self.devices[i].cores.len() {
                for counter in ["success", "failure", "hw_hbm_ue_error", "hw_collectives_error"] {
                    let base = dir.join(format!("neuron_core{core}/stats/status/{counter}"));
                    write_atomic(&base.join("total"), "0\n")?;
                    write_atomic(&base.join("present"), "0\n")?;
                }
            }
            self.write_device(i)?;
        }
        // Last: a reader that finds the version finds the whole tree.
        write_atomic(&root.join("module/neuron/version"), &format!("{DRIVER_VERSION}\n"))
    }

    /// Writes the files that change.
    fn write_device(&self, i: usize) -> Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        let d = &self.devices[i];
        let dir = Self::device_dir(root, i);
        write_atomic(&dir.join("reset"), &format!("{}\n", d.reset))?;
        if !self.v2() {
            return Ok(());
        }
        let hw = dir.join("stats/hardware");
        for (file, value) in [
            ("mem_ecc_uncorrected", d.hbm_ue),
            ("mem_ecc_repairable_uncorrected", d.repairable),
            ("mem_ecc_corrected", 0),
            ("sram_ecc_uncorrected", d.sram_ue),
            ("sram_ecc_corrected", 0),
            ("health_status/hbm_ecc_err_count", d.hbm_ue),
            ("health_status/repairable_hbm_ecc_err_count", d.repairable),
            ("health_status/sram_ecc_err_count", d.sram_ue),
        ] {
            write_atomic(&hw.join(file), &format!("{value}\n"))?;
        }
        if self.trn2() {
            write_atomic(&hw.join("health_status/unhealthy_components"), &format!("{}\n", d.components.join(",")))?;
            write_atomic(&hw.join("health_status/healthcheck_heartbeat"), &format!("{}\n", d.heartbeat))?;
        }
        let power = if d.power == "POWER_STATUS_VALID" {
            format!("{},{},12.50,61.75,38.20\n", d.power, unix_now())
        } else {
            format!("{},{},0.00,0.00,0.00\n", d.power, unix_now())
        };
        write_atomic(&dir.join("stats/power/utilization"), &power)?;
        for (core, counters) in d.cores.iter().enumerate() {
            for (name, value) in
                ["hw_nc_ue_error", "hw_dma_abort_error", "hw_repairable_hbm_ue_error"].iter().zip(counters)
            {
                let base = dir.join(format!("neuron_core{core}/stats/status/{name}"));
                write_atomic(&base.join("total"), &format!("{value}\n"))?;
                write_atomic(&base.join("present"), &format!("{value}\n"))?;
            }
        }
        // Last: what the driver notifies once the registers changed.
        write_atomic(&hw.join("health_status/hw_error_event"), &format!("{}\n", d.hw_error_event))
    }

    /// Appends a kernel record (kern.err) to the log file.
    fn kernel_record(&mut self, text: &str) -> Result<()> {
        match &mut self.kmsg {
            Some(log) => log.record(3, text),
            None => Ok(()),
        }
    }

    fn hw_err(&mut self, name: &str, device: usize, core: u32) -> Result<()> {
        let serial = if self.v2() { serial(device) } else { String::new() };
        self.kernel_record(&format!(
            "NEURON_HW_ERR={name} instance-id=i-0sim0000000000000 hostname=ip-10-0-0-1 nd-id={device} nc-id={core} \
             serial-num={serial} action=TERMINATE_INSTANCE"
        ))
    }

    /// Injects one fault.
    pub fn inject(&mut self, fault: &Fault) -> Result<()> {
        if let FaultKind::Xid { code, pci } = &fault.kind {
            return match &mut self.kmsg {
                Some(log) => log.xid(*code, pci),
                None => bail!("an Xid fault needs the kernel log (--kmsg)"),
            };
        }
        let i = fault.device as usize;
        if i >= self.devices.len() {
            let name = self.instance.map_or("host", |i| i.name);
            bail!("device {} of a fault: the {name} has {} Neuron devices", fault.device, self.devices.len());
        }
        let core = (fault.core as usize).min(self.devices[i].cores.len().saturating_sub(1));
        let d = &mut self.devices[i];
        let mut hardware = true;
        match &fault.kind {
            FaultKind::HbmUe => d.hbm_ue += 1,
            FaultKind::SramUe => d.sram_ue += 1,
            FaultKind::NcUe => d.cores[core][0] += 1,
            FaultKind::Dma => d.cores[core][1] += 1,
            FaultKind::RepairableHbm => {
                d.repairable += 1;
                d.cores[core][2] += 1;
            }
            FaultKind::Component(c) => {
                if !d.components.contains(c) {
                    d.components.push(c.clone());
                }
            }
            FaultKind::HeartbeatStall => {
                d.stalled = true;
                hardware = false;
            }
            FaultKind::Power(status) => {
                d.power = status.clone();
                hardware = false;
            }
            FaultKind::Reset(state) => {
                d.reset = *state;
                hardware = false;
            }
            FaultKind::Reload => {
                let cores = d.cores.len();
                *d = Device { cores: vec![[0; 3]; cores], power: d.power.clone(), reset: 1, ..Device::default() };
                hardware = false;
            }
            // Written above, without a device.
            FaultKind::Xid { .. } => hardware = false,
        }
        if hardware {
            d.hw_error_event += 1;
        }
        self.write_device(i)?;
        match fault.kind {
            FaultKind::HbmUe => self.hw_err("HBM_UNCORRECTABLE_ERROR", i, 0),
            FaultKind::SramUe => self.hw_err("SRAM_UNCORRECTABLE_ERROR", i, 0),
            FaultKind::NcUe => self.hw_err("NC_UNCORRECTABLE_ERROR", i, core as u32),
            FaultKind::Dma => {
                self.kernel_record(&format!("neuron:ndma_memcpy_wait_for_completion: DMA completion timeout nd{i}"))?;
                self.hw_err("DMA_ERROR", i, core as u32)
            }
            _ => Ok(()),
        }
    }

    /// Advances the heartbeats, injects the scheduled faults when due and those the
    /// control file names (from the offset given, see [`control_start`]); returns only on an
    /// error.
    pub fn run(mut self, mut schedule: Vec<(Duration, Fault)>, control: Option<(PathBuf, u64)>) -> Result<()> {
        let start = Instant::now();
        schedule.sort_by_key(|(after, _)| *after);
        let mut schedule = schedule.into_iter().peekable();
        let (control, mut control_offset) = match control {
            Some((path, offset)) => (Some(path), offset),
            None => (None, 0),
        };
        let mut pending = String::new();
        let mut next_beat = start + HEARTBEAT_EVERY;
        loop {
            while let Some((_, fault)) = schedule.next_if(|(after, _)| start.elapsed() >= *after) {
                self.inject(&fault)?;
            }
            if let Some(path) = &control {
                for line in read_new_lines(path, &mut control_offset, &mut pending) {
                    // A line the driver cannot apply is said, not fatal: the next may be fine.
                    if let Err(e) = parse_fault(&line).and_then(|fault| self.inject(&fault)) {
                        eprintln!("neuron-monitor-sim: control file: {e:#}");
                    }
                }
            }
            if self.trn2() && Instant::now() >= next_beat {
                next_beat += HEARTBEAT_EVERY;
                for i in 0..self.devices.len() {
                    if !self.devices[i].stalled {
                        self.devices[i].heartbeat += 1;
                        let root = self.root.clone();
                        if let Some(root) = root {
                            let path =
                                Self::device_dir(&root, i).join("stats/hardware/health_status/healthcheck_heartbeat");
                            write_atomic(&path, &format!("{}\n", self.devices[i].heartbeat))?;
                        }
                    }
                }
            }
            sleep(TICK);
        }
    }
}

/// Where the lines of a control file start: after what it holds when the simulator starts.
pub fn control_start(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// A device's serial number: 16 hex digits.
fn serial(device: usize) -> String {
    format!("{:016x}", 0x19fc_da00_f5ff_6e00_u64 + device as u64)
}

/// The complete lines appended to `path` since `offset`.
fn read_new_lines(path: &Path, offset: &mut u64, pending: &mut String) -> Vec<String> {
    let Ok(mut file) = fs::File::open(path) else { return Vec::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len < *offset {
        *offset = 0;
        pending.clear();
    }
    if file.seek(SeekFrom::Start(*offset)).is_err() {
        return Vec::new();
    }
    let mut text = String::new();
    let read = file.take(64 * 1024).read_to_string(&mut text).unwrap_or(0);
    *offset += read as u64;
    pending.push_str(&text);
    let mut lines = Vec::new();
    while let Some(nl) = pending.find('\n') {
        let line: String = pending.drain(..=nl).collect();
        if !line.trim().is_empty() {
            lines.push(line.trim().to_owned());
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("sim-driver-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn read(path: PathBuf) -> String {
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn fault_specs() {
        assert_eq!(parse_fault("hbm-ue").unwrap(), Fault { kind: FaultKind::HbmUe, device: 0, core: 0 });
        assert_eq!(parse_fault("dma:3:1").unwrap(), Fault { kind: FaultKind::Dma, device: 3, core: 1 });
        assert_eq!(parse_fault("component:2:hbm").unwrap().kind, FaultKind::Component("hbm".to_owned()));
        assert_eq!(parse_fault("power:0:invalid").unwrap().kind, FaultKind::Power("POWER_STATUS_INVALID".to_owned()));
        assert_eq!(parse_fault("reset:1").unwrap().kind, FaultKind::Reset(2));
        assert!(parse_fault("melt").is_err());
        assert!(parse_fault("power:0:hot").is_err());
        let (after, fault) = parse_scheduled("nc-ue:1:2@1500ms").unwrap();
        assert_eq!((after, fault.device, fault.core), (Duration::from_millis(1500), 1, 2));
        assert!(parse_scheduled("nc-ue").is_err());
    }

    #[test]
    fn writes_the_tree_of_the_instance_type_and_injects_faults() {
        let dir = temp("tree");
        let (root, kmsg) = (dir.join("sys"), dir.join("kmsg"));
        let trn2 = crate::hardware::lookup("trn2.48xlarge").unwrap();
        let mut driver = Driver::new(trn2, Some(root.clone()), Some(kmsg.clone())).unwrap();
        let dev = |i: usize, f: &str| root.join(format!("devices/virtual/neuron_device/neuron{i}/{f}"));
        assert!(dev(15, "reset").exists());
        assert!(!dev(16, "reset").exists());
        assert_eq!(read(dev(0, "core_count")), "4");
        assert_eq!(read(dev(0, "info/serial_number")).len(), 17);
        assert_eq!(read(root.join("module/neuron/version")), "2.30.2.0\n");
        assert!(read(dev(0, "stats/power/utilization")).starts_with("POWER_STATUS_VALID,"));
        driver.inject(&parse_fault("hbm-ue:2").unwrap()).unwrap();
        driver.inject(&parse_fault("dma:3:1").unwrap()).unwrap();
        driver.inject(&parse_fault("component:4:link_efa").unwrap()).unwrap();
        driver.inject(&parse_fault("power:5:invalid").unwrap()).unwrap();
        assert_eq!(read(dev(2, "stats/hardware/mem_ecc_uncorrected")), "1\n");
        assert_eq!(read(dev(2, "stats/hardware/health_status/hw_error_event")), "1\n");
        assert_eq!(read(dev(3, "neuron_core1/stats/status/hw_dma_abort_error/total")), "1\n");
        assert_eq!(read(dev(4, "stats/hardware/health_status/unhealthy_components")), "link_efa\n");
        assert!(read(dev(5, "stats/power/utilization")).starts_with("POWER_STATUS_INVALID,"));
        let log = read(kmsg.clone());
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("3,1,") && lines[0].contains(";NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR "));
        assert!(lines[0].contains(" nd-id=2 ") && lines[0].contains(" action=TERMINATE_INSTANCE"));
        assert!(lines[1].contains(";neuron:ndma_"));
        assert!(lines[2].starts_with("3,3,") && lines[2].contains("nc-id=1"));
        // A new driver continues the sequence of the file.
        let again = Driver::new(trn2, None, Some(kmsg)).unwrap();
        assert_eq!(again.kmsg.map(|k| k.seq), Some(4));
        assert!(driver.inject(&parse_fault("hbm-ue:16").unwrap()).is_err());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn xid_faults_name_the_gpu_by_its_kernel_pci_address() {
        let fault = parse_fault("xid:79:00000000:00:1E.0").unwrap();
        assert_eq!(fault.kind, FaultKind::Xid { code: 79, pci: "0000:00:1e".to_owned() });
        assert_eq!(
            parse_fault(" xid:48:0000:53:00 ").unwrap().kind,
            FaultKind::Xid { code: 48, pci: "0000:53:00".into() }
        );
        for bad in [
            "xid",
            "xid:79",
            "xid:x:0000:00:1e",
            "xid:79:00:1e",
            "xid:79:0000:00:1e:0",
            "xid:79:0000:100:1e",
            "xid:79:123456789:00:1e",
            "xid:79:0000:zz:1e",
            "xid:-1:0000:00:1e",
            "xid:79:0000::1e",
        ] {
            assert!(parse_fault(bad).is_err(), "{bad} accepted");
        }
    }

    /// The records a GPU node's agent reads: the kernel facility at err (3), numbered on,
    /// NVIDIA's `NVRM: Xid (PCI:…): CODE, …` text; other faults need a Neuron device.
    #[test]
    fn a_driver_without_devices_writes_xid_records_in_the_kmsg_format() {
        let dir = temp("xid");
        let kmsg = dir.join("kmsg");
        fs::write(&kmsg, "3,7,100,-;an earlier record\n").unwrap();
        let mut driver = Driver::without_devices(kmsg.clone()).unwrap();
        driver.inject(&parse_fault("xid:79:00000000:00:1B.0").unwrap()).unwrap();
        driver.inject(&parse_fault("xid:31:00000000:00:1C.0").unwrap()).unwrap();
        assert!(driver.inject(&parse_fault("hbm-ue:0").unwrap()).is_err());
        let log = read(kmsg.clone());
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        let (head, text) = lines[1].split_once(';').unwrap();
        let fields: Vec<&str> = head.split(',').collect();
        assert_eq!((fields[0], fields[1], fields[3]), ("3", "8", "-"), "{head}");
        assert!(fields[2].parse::<u64>().unwrap() > 0, "microseconds since boot: {head}");
        assert_eq!(
            text,
            "NVRM: Xid (PCI:0000:00:1b): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        );
        assert!(lines[2].starts_with("3,9,") && lines[2].contains(";NVRM: Xid (PCI:0000:00:1c): 31, "), "{}", lines[2]);
        // A log rotated away is created again at its path, numbered on.
        fs::rename(&kmsg, dir.join("kmsg.1")).unwrap();
        driver.inject(&parse_fault("xid:48:0000:00:1d").unwrap()).unwrap();
        assert!(read(kmsg.clone()).starts_with("3,10,"));
        // A Neuron driver without --kmsg has nowhere to write one.
        let trn1 = crate::hardware::lookup("trn1.2xlarge").unwrap();
        let mut silent = Driver::new(trn1, None, None).unwrap();
        assert!(silent.inject(&parse_fault("xid:79:0000:00:1e").unwrap()).is_err());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn inf1_has_no_hardware_stats() {
        let dir = temp("inf1");
        let inf1 = crate::hardware::lookup("inf1.xlarge").unwrap();
        Driver::new(inf1, Some(dir.clone()), None).unwrap();
        let d = dir.join("devices/virtual/neuron_device/neuron0");
        assert!(d.join("reset").exists());
        assert!(!d.join("stats/hardware").exists());
        assert!(!d.join("info/serial_number").exists());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn the_control_file_gives_new_complete_lines() {
        let dir = temp("control");
        let path = dir.join("control");
        fs::write(&path, "").unwrap();
        let (mut offset, mut pending) = (0, String::new());
        fs::write(&path, "hbm-ue:1\ndma").unwrap();
        assert_eq!(read_new_lines(&path, &mut offset, &mut pending), ["hbm-ue:1"]);
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b":0\n").unwrap();
        assert_eq!(read_new_lines(&path, &mut offset, &mut pending), ["dma:0"]);
        let _ = fs::remove_dir_all(dir);
    }
}
