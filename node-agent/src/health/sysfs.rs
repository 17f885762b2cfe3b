//! The Neuron driver's sysfs tree: one directory per device
//! (`<root>/devices/virtual/neuron_device/neuron<N>/`), one per core inside it
//! (`neuron_core<M>/`), and the driver version (`<root>/module/neuron/version`).
//!
//! Read-only: some of these files reset the device or clear counters when written.
//! Which files exist depends on the driver version and the chip family, so a file that
//! does not exist is simply absent; a file that exists but cannot be read or parsed is
//! named in [`DeviceReading::unreadable`] (the device's health is then unknown).

mod held;

use std::{
    collections::HashMap,
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use api::limits::{MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES, MAX_SYSFS_FILE_BYTES};

use crate::{
    processes::procfs::{self, Failure},
    timed_read::Watch,
};
use held::HeldDir;
pub use held::HeldTree;

/// Where the device directories are, under the sysfs root.
pub const DEVICES_DIR: &str = "devices/virtual/neuron_device";
/// The driver version, under the sysfs root.
pub const DRIVER_VERSION_FILE: &str = "module/neuron/version";
/// The file whose change the driver notifies (`poll()` with `POLLPRI`), per device.
pub const HW_ERROR_EVENT_FILE: &str = "stats/hardware/health_status/hw_error_event";

/// Descriptors the health reader holds open between reads (a 16-device node with 8 cores
/// a device takes about 1,600).
pub const MAX_HELD_FILES: usize = 2048;
/// Bytes of the driver version kept (a label value): versions read like `2.24.7.0`.
const MAX_VERSION_BYTES: usize = 64;
/// Bytes of the opaque heartbeat value kept.
const MAX_HEARTBEAT_BYTES: usize = 64;

// ---------------------------------------------------------------------------------------
// Parsers: pure, one per file format.
// ---------------------------------------------------------------------------------------

/// The device state in `reset` (read only: writing it resets the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceState {
    /// `0`: being reset.
    Resetting,
    /// `1`: ready.
    Ready,
    /// `2`: invalid (a reset failed).
    Invalid,
}

pub fn parse_state(text: &str) -> Option<DeviceState> {
    match text.trim() {
        "0" => Some(DeviceState::Resetting),
        "1" => Some(DeviceState::Ready),
        "2" => Some(DeviceState::Invalid),
        _ => None,
    }
}

/// One unsigned decimal, with or without its trailing newline.
pub fn parse_counter(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// `core_count`: a decimal, no newline; bounded by what a device may have.
pub fn parse_core_count(text: &str) -> Option<u32> {
    parse_counter(text).filter(|n| *n <= u64::from(MAX_NEURONCORES_PER_DEVICE)).map(|n| n as u32)
}

/// `info/serial_number`: 16 hex digits; an empty line when the driver could not read it.
pub fn parse_serial(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty() && t.len() <= 32 && t.bytes().all(|b| b.is_ascii_hexdigit())).then(|| t.to_ascii_lowercase())
}

/// The driver version as a label value: printable version characters, bounded.
pub fn parse_driver_version(text: &str) -> Option<String> {
    let t = text.trim();
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+');
    (!t.is_empty() && t.len() <= MAX_VERSION_BYTES && t.bytes().all(ok)).then(|| t.to_owned())
}

/// `healthcheck_heartbeat`: its format is not documented; an opaque value that should
/// keep changing.
pub fn parse_heartbeat(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty() && t.len() <= MAX_HEARTBEAT_BYTES).then(|| t.to_owned())
}

/// The components `unhealthy_components` may name (driver 2.30.2, Trn2/Trn3).
pub const COMPONENTS: [&str; 10] = [
    "hbm",
    "sram",
    "firmware_service_api",
    "firmware_service_processor",
    "link_intraserver",
    "link_host",
    "link_efa",
    "link_interserver",
    "link_switch",
    "axi_fabric",
];

/// `unhealthy_components`: a comma-separated subset of [`COMPONENTS`], empty when
/// healthy. Names outside the list are counted, not kept (a label value must be bounded);
/// the device is still unhealthy through them, as `other`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Components {
    /// Indices into [`COMPONENTS`], sorted, each once.
    pub known: Vec<usize>,
    pub unknown: usize,
}

impl Components {
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.known.iter().map(|i| COMPONENTS[*i]).chain((self.unknown > 0).then_some("other"))
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty() && self.unknown == 0
    }
}

pub fn parse_components(text: &str) -> Components {
    let mut out = Components::default();
    for name in text.split([',', '\n']).map(str::trim).filter(|n| !n.is_empty()) {
        match COMPONENTS.iter().position(|c| *c == name) {
            Some(i) if !out.known.contains(&i) => out.known.push(i),
            Some(_) => {}
            None => out.unknown += 1,
        }
    }
    out.known.sort_unstable();
    out
}

/// The status token of `stats/power/utilization`, compared exactly (`INVALID` contains
/// `VALID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerStatus {
    Valid,
    NoData,
    Invalid,
}

impl PowerStatus {
    pub const ALL: [PowerStatus; 3] = [PowerStatus::Valid, PowerStatus::NoData, PowerStatus::Invalid];

    pub fn as_str(self) -> &'static str {
        match self {
            PowerStatus::Valid => "valid",
            PowerStatus::NoData => "no_data",
            PowerStatus::Invalid => "invalid",
        }
    }
}

/// One window of `stats/power/utilization`: percent of the device's maximum power.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Power {
    pub status: PowerStatus,
    /// End of the window, seconds since the epoch.
    pub timestamp: Option<u64>,
    /// min, max, avg, in percent; only with a valid status.
    pub utilization: Option<[f64; 3]>,
}

/// `POWER_STATUS_VALID,<epoch s>,<min>,<max>,<avg>`; other statuses may carry fewer fields.
pub fn parse_power(text: &str) -> Option<Power> {
    let mut fields = text.trim().split(',').map(str::trim);
    let status = match fields.next()? {
        "POWER_STATUS_VALID" => PowerStatus::Valid,
        "POWER_STATUS_NO_DATA" => PowerStatus::NoData,
        "POWER_STATUS_INVALID" => PowerStatus::Invalid,
        _ => return None,
    };
    let timestamp = fields.next().and_then(parse_counter);
    let percent = |f: Option<&str>| f.and_then(|f| f.parse::<f64>().ok()).filter(|p| (0.0..=1000.0).contains(p));
    let values = [percent(fields.next()), percent(fields.next()), percent(fields.next())];
    let utilization = match (status, values) {
        (PowerStatus::Valid, [Some(min), Some(max), Some(avg)]) => Some([min, max, avg]),
        // A valid status without its three values is not a valid line.
        (PowerStatus::Valid, _) => return None,
        _ => None,
    };
    Some(Power { status, timestamp, utilization })
}

// ---------------------------------------------------------------------------------------
// The counters the agent reads, and what they mean.
// ---------------------------------------------------------------------------------------

/// A device's ECC counters: `stats/hardware/<file>` and, for the uncorrected ones, their
/// `health_status/` twin (driver 2.28); the larger of the two counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecc {
    HbmUncorrected,
    HbmRepairable,
    HbmCorrected,
    SramUncorrected,
    SramCorrected,
}

impl Ecc {
    pub const ALL: [Ecc; 5] =
        [Ecc::HbmUncorrected, Ecc::HbmRepairable, Ecc::HbmCorrected, Ecc::SramUncorrected, Ecc::SramCorrected];

    /// The files under `stats/hardware/`.
    pub fn files(self) -> (&'static str, Option<&'static str>) {
        match self {
            Ecc::HbmUncorrected => ("mem_ecc_uncorrected", Some("health_status/hbm_ecc_err_count")),
            Ecc::HbmRepairable => {
                ("mem_ecc_repairable_uncorrected", Some("health_status/repairable_hbm_ecc_err_count"))
            }
            Ecc::HbmCorrected => ("mem_ecc_corrected", None),
            Ecc::SramUncorrected => ("sram_ecc_uncorrected", Some("health_status/sram_ecc_err_count")),
            Ecc::SramCorrected => ("sram_ecc_corrected", None),
        }
    }

    pub fn memory(self) -> &'static str {
        match self {
            Ecc::HbmUncorrected | Ecc::HbmRepairable | Ecc::HbmCorrected => "hbm",
            Ecc::SramUncorrected | Ecc::SramCorrected => "sram",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Ecc::HbmUncorrected | Ecc::SramUncorrected => "uncorrected",
            Ecc::HbmRepairable => "repairable_uncorrected",
            Ecc::HbmCorrected | Ecc::SramCorrected => "corrected",
        }
    }

    /// The fault an increase means (the kernel log's name for it), if any.
    pub fn fault(self) -> Option<&'static str> {
        match self {
            Ecc::HbmUncorrected => Some("HBM_UNCORRECTABLE_ERROR"),
            Ecc::HbmRepairable => Some(REPAIRABLE_HBM_ERROR),
            Ecc::SramUncorrected => Some("SRAM_UNCORRECTABLE_ERROR"),
            Ecc::HbmCorrected | Ecc::SramCorrected => None,
        }
    }
}

/// The name the agent gives a repairable HBM uncorrectable error (runtime status 1205);
/// the kernel log has no name for it.
pub const REPAIRABLE_HBM_ERROR: &str = "REPAIRABLE_HBM_UNCORRECTABLE_ERROR";

/// Per-core hardware error counters (`stats/status/<name>/total`) and the fault each
/// means (runtime status codes 1200–1205).
pub const CORE_ERRORS: [(&str, &str); 5] = [
    ("hw_hbm_ue_error", "HBM_UNCORRECTABLE_ERROR"),
    ("hw_nc_ue_error", "NC_UNCORRECTABLE_ERROR"),
    ("hw_dma_abort_error", "DMA_ERROR"),
    ("hw_collectives_error", "HANG_ON_COLLECTIVES"),
    ("hw_repairable_hbm_ue_error", REPAIRABLE_HBM_ERROR),
];

// ---------------------------------------------------------------------------------------
// Reading the tree.
// ---------------------------------------------------------------------------------------

/// The whole tree at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeReading {
    /// The device directory exists (the driver is loaded).
    pub driver_loaded: bool,
    /// The device directory exists but cannot be listed.
    pub unreadable: bool,
    pub driver_version: Option<String>,
    /// By index.
    pub devices: Vec<DeviceReading>,
    /// Entries left out: device or core directories beyond the limits.
    pub refused: Vec<&'static str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceReading {
    pub index: u32,
    pub core_count: Option<u32>,
    pub state: Option<DeviceState>,
    pub serial: Option<String>,
    /// By [`Ecc::ALL`].
    pub ecc: [Option<u64>; 5],
    pub components: Option<Components>,
    pub hw_error_event: Option<u64>,
    pub heartbeat: Option<String>,
    pub power: Option<Power>,
    pub cores: Vec<CoreReading>,
    /// Files that exist but could not be read or parsed.
    pub unreadable: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoreReading {
    /// Index within the device (`neuron_core<M>`).
    pub index: u32,
    /// By [`CORE_ERRORS`].
    pub errors: [Option<u64>; 5],
}

impl DeviceReading {
    /// A running sum of every monotonic counter of the device: it goes down only when the
    /// driver was reloaded (the counters start again from zero).
    pub fn counter_sum(&self) -> u64 {
        let cores = self.cores.iter().flat_map(|c| c.errors.iter().flatten());
        self.ecc.iter().flatten().chain(self.hw_error_event.iter()).chain(cores).fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Whether any file that tells the device's health was read.
    pub fn has_health_signal(&self) -> bool {
        self.state.is_some()
            || self.ecc.iter().any(Option::is_some)
            || self.components.is_some()
            || self.hw_error_event.is_some()
    }
}

/// Reads a file of at most [`MAX_SYSFS_FILE_BYTES`]: `Ok(None)` when it does not exist.
/// One read where it gives all it has at once, as a sysfs attribute does
/// ([`procfs::read_whole`]): three system calls a file instead of four.
pub fn read_small(path: &Path) -> io::Result<Option<String>> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    read_small_file(&file)
}

/// [`read_small`] of a file open, from its start.
fn read_small_file(file: &fs::File) -> io::Result<Option<String>> {
    let mut buf = [0; MAX_SYSFS_FILE_BYTES + 1];
    let bytes = procfs::read_whole(file, &mut buf).map_err(|failure| match failure {
        Failure::TooLarge => io::Error::new(io::ErrorKind::InvalidData, "longer than the limit"),
        other => io::Error::other(other.as_str()),
    })?;
    String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// One device's reading in progress: absent files stay `None`, broken ones are named
/// (a stuck one too: its read missed the deadline, or an earlier one never returned).
/// Files are read through the device's directory held open ([`HeldTree`]), else by their
/// path.
struct FileReader<'a> {
    dir: &'a Path,
    held: Option<HeldDir>,
    tree: &'a mut HeldTree,
    watch: &'a Watch,
    unreadable: Vec<String>,
}

impl FileReader<'_> {
    /// The text of the file `name` (a path relative to the device's directory); `Ok(None)`
    /// when it does not exist.
    fn text(&mut self, name: &str) -> io::Result<Option<String>> {
        let (held, tree) = (&mut self.held, &mut *self.tree);
        self.watch.access(&self.dir.join(name), |path| match held {
            Some(dir) => dir.read(name, tree, read_small_file),
            None => read_small(path),
        })
    }

    fn read<T>(&mut self, name: &str, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        match self.text(name) {
            Ok(None) => None,
            Ok(Some(text)) => {
                let value = parse(&text);
                if value.is_none() {
                    self.unreadable.push(name.to_owned());
                }
                value
            }
            Err(_) => {
                self.unreadable.push(name.to_owned());
                None
            }
        }
    }
}

/// `<prefix><N>` with N a decimal below `limit`: `Ok(Some(N))`; another name: `Ok(None)`;
/// N beyond the limit, or written with a leading zero (`neuron00`: not a name the driver
/// gives, and it would read as a second device 0): `Err(())`.
fn indexed(name: &str, prefix: &str, limit: u32) -> Result<Option<u32>, ()> {
    let Some(digits) = name.strip_prefix(prefix) else { return Ok(None) };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(());
    }
    match digits.parse::<u32>() {
        Ok(n) if n < limit => Ok(Some(n)),
        _ => Err(()),
    }
}

/// The indexed subdirectories of `dir`, sorted; those beyond `limit` are refused.
fn indexed_dirs(
    dir: &Path,
    prefix: &str,
    limit: u32,
    refused: &mut usize,
    watch: &Watch,
) -> io::Result<Vec<(u32, PathBuf)>> {
    let mut out = Vec::new();
    let entries = watch.access(dir, |d| fs::read_dir(d)?.collect::<io::Result<Vec<_>>>())?;
    for entry in entries {
        let name = entry.file_name();
        match indexed(&name.to_string_lossy(), prefix, limit) {
            Ok(Some(n)) => out.push((n, entry.path())),
            Ok(None) => {}
            Err(()) => *refused += 1,
        }
    }
    out.sort_unstable_by_key(|(n, _)| *n);
    Ok(out)
}

/// Descriptors the tree's reader holds open: within its share of those the process may
/// open, and [`MAX_HELD_FILES`].
pub fn held_files_bound() -> usize {
    procfs::held_files_share().min(MAX_HELD_FILES)
}

/// Reads the whole tree under `root` (the sysfs root), without a deadline, holding no file
/// open. Never writes.
pub fn read_node(root: &Path) -> NodeReading {
    read_node_watched(root, &Watch::untimed(), &mut HeldTree::new(0))
}

/// Reads the whole tree under `root`, each file through `watch` (its deadline, the files
/// stuck earlier skipped and named unreadable), reading the files `held` holds and leaving
/// it holding those of this read. Never writes.
pub fn read_node_watched(root: &Path, watch: &Watch, held: &mut HeldTree) -> NodeReading {
    let mut node = NodeReading {
        driver_version: watch
            .access(&root.join(DRIVER_VERSION_FILE), read_small)
            .ok()
            .flatten()
            .and_then(|t| parse_driver_version(&t)),
        ..NodeReading::default()
    };
    let devices_dir = root.join(DEVICES_DIR);
    let mut refused_devices = 0;
    let devices = match indexed_dirs(&devices_dir, "neuron", MAX_NEURON_DEVICES, &mut refused_devices, watch) {
        Ok(devices) => devices,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return node,
        Err(_) => {
            node.driver_loaded = true;
            node.unreadable = true;
            return node;
        }
    };
    node.driver_loaded = true;
    node.refused.extend(std::iter::repeat_n("sysfs_device", refused_devices));
    // What the previous read held of a device no longer listed is closed with it.
    let mut before = held.begin();
    for (index, dir) in devices {
        let (device, refused_cores) = read_device(index, &dir, watch, held, &mut before);
        node.refused.extend(std::iter::repeat_n("sysfs_core", refused_cores));
        node.devices.push(device);
    }
    node
}

fn read_device(
    index: u32,
    dir: &Path,
    watch: &Watch,
    tree: &mut HeldTree,
    before: &mut HashMap<PathBuf, HeldDir>,
) -> (DeviceReading, usize) {
    let held = watch.access(dir, |dir| Ok(tree.take(before, dir))).ok().flatten();
    let mut files = FileReader { dir, held, tree, watch, unreadable: Vec::new() };
    let mut device = DeviceReading {
        index,
        core_count: files.read("core_count", parse_core_count),
        state: files.read("reset", parse_state),
        // An empty serial number is the driver's "could not read it", not a broken file.
        serial: files.text("info/serial_number").ok().flatten().and_then(|t| parse_serial(&t)),
        components: files.read("stats/hardware/health_status/unhealthy_components", |t| Some(parse_components(t))),
        hw_error_event: files.read(HW_ERROR_EVENT_FILE, parse_counter),
        heartbeat: files.read("stats/hardware/health_status/healthcheck_heartbeat", parse_heartbeat),
        power: files.read("stats/power/utilization", parse_power),
        ..DeviceReading::default()
    };
    for (slot, ecc) in Ecc::ALL.iter().enumerate() {
        let (stats, health) = ecc.files();
        let a = files.read(&format!("stats/hardware/{stats}"), parse_counter);
        let b = health.and_then(|h| files.read(&format!("stats/hardware/{h}"), parse_counter));
        device.ecc[slot] = a.max(b);
    }
    let mut refused = 0;
    if let Ok(cores) = indexed_dirs(dir, "neuron_core", MAX_NEURONCORES_PER_DEVICE, &mut refused, watch) {
        for (core, _) in cores {
            let mut reading = CoreReading { index: core, errors: [None; 5] };
            for (slot, (name, _)) in CORE_ERRORS.iter().enumerate() {
                reading.errors[slot] =
                    files.read(&format!("neuron_core{core}/stats/status/{name}/total"), parse_counter);
            }
            device.cores.push(reading);
        }
    }
    if let Some(held) = files.held.take() {
        files.tree.keep(dir, held);
    }
    device.unreadable = files.unreadable;
    (device, refused)
}

/// Opens the `hw_error_event` file of each of `devices` and reads it once: `poll()` waits
/// for a change of a sysfs attribute only after a read. Through `watch`: opening a FIFO
/// or reading a hung attribute blocks.
pub fn open_event_files(root: &Path, devices: &[u32], watch: &Watch) -> Vec<fs::File> {
    let dir = root.join(DEVICES_DIR);
    let open_and_read = |path: &Path| {
        let mut file = fs::File::open(path)?;
        io::copy(&mut (&mut file).take(64), &mut io::sink())?;
        Ok(file)
    };
    devices
        .iter()
        .filter_map(|d| watch.access(&dir.join(format!("neuron{d}")).join(HW_ERROR_EVENT_FILE), open_and_read).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_with_and_without_their_newline() {
        assert_eq!(parse_counter("17\n"), Some(17));
        assert_eq!(parse_counter("0"), Some(0));
        assert_eq!(parse_counter(""), None);
        assert_eq!(parse_counter("-1\n"), None);
        assert_eq!(parse_counter("12 apples"), None);
        assert_eq!(parse_counter("99999999999999999999999"), None);
        assert_eq!(parse_core_count("4"), Some(4));
        assert_eq!(parse_core_count("4096"), None, "bounded before it sizes anything");
    }

    #[test]
    fn device_state_from_reset() {
        assert_eq!(parse_state("1\n"), Some(DeviceState::Ready));
        assert_eq!(parse_state("0"), Some(DeviceState::Resetting));
        assert_eq!(parse_state("2\n"), Some(DeviceState::Invalid));
        assert_eq!(parse_state("3\n"), None);
    }

    #[test]
    fn serial_number_empty_when_unreadable() {
        assert_eq!(parse_serial("19FCDA00F5FF6EB9\n").as_deref(), Some("19fcda00f5ff6eb9"));
        assert_eq!(parse_serial("\n"), None);
        assert_eq!(parse_serial(""), None);
        assert_eq!(parse_serial("not-hex\n"), None);
    }

    #[test]
    fn power_status_is_compared_exactly() {
        let valid = parse_power("POWER_STATUS_VALID,1732000000,12.50,80.25,40.00\n").unwrap();
        assert_eq!(valid.status, PowerStatus::Valid);
        assert_eq!(valid.timestamp, Some(1_732_000_000));
        assert_eq!(valid.utilization, Some([12.5, 80.25, 40.0]));
        // INVALID contains VALID: it must not read as valid, and carries no values.
        let invalid = parse_power("POWER_STATUS_INVALID,1732000000,0.00,0.00,0.00").unwrap();
        assert_eq!((invalid.status, invalid.utilization), (PowerStatus::Invalid, None));
        assert_eq!(parse_power("POWER_STATUS_NO_DATA\n").unwrap().status, PowerStatus::NoData);
        assert_eq!(parse_power("POWER_STATUS_VALIDISH,1,2,3,4"), None);
        assert_eq!(parse_power("POWER_STATUS_VALID,1,2"), None, "valid without its values");
        assert_eq!(parse_power(""), None);
    }

    #[test]
    fn unhealthy_components_known_and_unknown() {
        assert!(parse_components("\n").is_empty());
        assert!(parse_components("").is_empty());
        let c = parse_components("sram, hbm,link_efa,hbm\n");
        assert_eq!(c.names().collect::<Vec<_>>(), ["hbm", "sram", "link_efa"]);
        let c = parse_components("hbm,flux_capacitor");
        assert_eq!(c.names().collect::<Vec<_>>(), ["hbm", "other"]);
        assert_eq!(c.unknown, 1);
    }

    #[test]
    fn driver_version_is_a_bounded_label() {
        assert_eq!(parse_driver_version("2.24.7.0\n").as_deref(), Some("2.24.7.0"));
        assert_eq!(parse_driver_version("2.24 7"), None);
        assert_eq!(parse_driver_version(&"9".repeat(65)), None);
        assert_eq!(parse_driver_version(""), None);
    }

    use crate::testdata::TempDir;

    #[test]
    fn no_driver_tree_is_not_an_error() {
        let tree = TempDir::new("health-sysfs");
        let node = read_node(&tree.0);
        assert!(!node.driver_loaded);
        assert!(node.devices.is_empty());
    }

    #[test]
    fn reads_what_exists_and_names_what_is_broken() {
        let tree = TempDir::new("health-sysfs");
        let d = "devices/virtual/neuron_device/neuron1";
        tree.write("module/neuron/version", "2.30.2.0\n");
        tree.write(format!("{d}/core_count"), "2");
        tree.write(format!("{d}/reset"), "1\n");
        tree.write(format!("{d}/info/serial_number"), "\n");
        tree.write(format!("{d}/stats/hardware/mem_ecc_uncorrected"), "1\n");
        tree.write(format!("{d}/stats/hardware/health_status/hbm_ecc_err_count"), "3\n");
        tree.write(format!("{d}/stats/hardware/sram_ecc_uncorrected"), "garbage\n");
        tree.write(format!("{d}/stats/power/utilization"), "POWER_STATUS_INVALID,0,0,0,0\n");
        tree.write(format!("{d}/neuron_core1/stats/status/hw_nc_ue_error/total"), "2\n");
        tree.write(format!("{d}/neuron_core99/stats/status/hw_nc_ue_error/total"), "2\n");
        tree.write("devices/virtual/neuron_device/neuron999/reset", "1\n");
        tree.write("devices/virtual/neuron_device/not_a_device/reset", "1\n");
        // Zero-padded twins of device 1 and of its core 1.
        tree.write("devices/virtual/neuron_device/neuron01/reset", "2\n");
        tree.write(format!("{d}/neuron_core01/stats/status/hw_nc_ue_error/total"), "5\n");
        let node = read_node(&tree.0);
        assert!(node.driver_loaded);
        assert_eq!(node.driver_version.as_deref(), Some("2.30.2.0"));
        let mut refused = node.refused.clone();
        refused.sort_unstable();
        assert_eq!(refused, ["sysfs_core", "sysfs_core", "sysfs_device", "sysfs_device"]);
        assert_eq!(node.devices.len(), 1);
        let dev = &node.devices[0];
        assert_eq!((dev.index, dev.core_count, dev.state), (1, Some(2), Some(DeviceState::Ready)));
        assert_eq!(dev.serial, None);
        assert_eq!(dev.ecc[0], Some(3), "the larger of stats/hardware and health_status");
        assert_eq!(dev.ecc[3], None);
        assert_eq!(dev.unreadable, ["stats/hardware/sram_ecc_uncorrected"]);
        assert_eq!(dev.components, None, "absent on this driver");
        assert_eq!(dev.power.unwrap().status, PowerStatus::Invalid);
        assert_eq!(dev.cores.len(), 1);
        assert_eq!(dev.cores[0].errors[1], Some(2));
        assert!(dev.has_health_signal());
        // Through files held open, the same, read after read, within any bound.
        for max in [0, 1, 3, 64] {
            let mut held = HeldTree::new(max);
            for _ in 0..2 {
                assert_eq!(read_node_watched(&tree.0, &Watch::untimed(), &mut held), node, "{max}");
                assert!(held.count() <= max);
            }
        }
    }

    /// Files held open from one read to the next still read what the tree holds now: a
    /// value written in place, a file renamed over the old one, one removed, one added
    /// where it was absent, a device's directory made anew (a driver reload).
    #[test]
    fn held_files_follow_the_tree() {
        let tree = TempDir::new("health-sysfs");
        let d = "devices/virtual/neuron_device/neuron0";
        let ecc = format!("{d}/stats/hardware/mem_ecc_uncorrected");
        tree.write(format!("{d}/reset"), "1\n");
        tree.write(&ecc, "1\n");
        tree.write(format!("{d}/neuron_core0/stats/status/hw_nc_ue_error/total"), "0\n");
        let mut held = HeldTree::new(64);
        let mut read = || read_node_watched(&tree.0, &Watch::untimed(), &mut held);
        let first = read();
        assert_eq!((first.devices[0].ecc[0], first.devices[0].cores[0].errors[1]), (Some(1), Some(0)));

        // In place: the file held is the one written.
        std::fs::write(tree.0.join(&ecc), "2\n").unwrap();
        assert_eq!(read().devices[0].ecc[0], Some(2));
        // Renamed over it, and a file absent before added beside it.
        tree.write(format!("{d}/stats/hardware/.new"), "3\n");
        std::fs::rename(tree.0.join(d).join("stats/hardware/.new"), tree.0.join(&ecc)).unwrap();
        tree.write(format!("{d}/stats/hardware/sram_ecc_uncorrected"), "5\n");
        tree.write(format!("{d}/neuron_core0/stats/status/hw_nc_ue_error/total"), "7\n");
        let renamed = read();
        assert_eq!((renamed.devices[0].ecc[0], renamed.devices[0].ecc[3]), (Some(3), Some(5)));
        assert_eq!(renamed.devices[0].cores[0].errors[1], Some(7));
        // Removed.
        std::fs::remove_file(tree.0.join(&ecc)).unwrap();
        assert_eq!(read().devices[0].ecc[0], None);
        // The device's directory made anew, with other values.
        std::fs::remove_dir_all(tree.0.join(d)).unwrap();
        tree.write(format!("{d}/reset"), "2\n");
        tree.write(&ecc, "9\n");
        let reloaded = read();
        assert_eq!(reloaded.devices[0].state, Some(DeviceState::Invalid));
        assert_eq!((reloaded.devices[0].ecc[0], reloaded.devices[0].cores.len()), (Some(9), 0));
        assert_eq!(reloaded, read_node(&tree.0));
    }

    #[test]
    fn an_oversized_file_is_unreadable() {
        let tree = TempDir::new("health-sysfs");
        let d = "devices/virtual/neuron_device/neuron0";
        tree.write(format!("{d}/reset"), "1".repeat(MAX_SYSFS_FILE_BYTES + 1));
        let node = read_node(&tree.0);
        assert_eq!(node.devices[0].state, None);
        assert_eq!(node.devices[0].unreadable, ["reset"]);
    }

    /// Issue 24, fault 5: a file whose earlier read never returned is not opened again,
    /// and is named unreadable (its device unknown); the other devices are read.
    #[test]
    fn a_stuck_file_is_skipped_and_named() {
        let tree = TempDir::new("health-sysfs");
        let dir = |d: u32| format!("{DEVICES_DIR}/neuron{d}");
        for d in [0, 1] {
            tree.write(format!("{}/reset", dir(d)), "1\n");
            tree.write(format!("{}/stats/hardware/mem_ecc_uncorrected", dir(d)), "4\n");
        }
        let stuck = tree.0.join(dir(0)).join("stats/hardware/mem_ecc_uncorrected");
        for max in [0, 64] {
            let node = read_node_watched(&tree.0, &Watch::with_stuck([stuck.clone()]), &mut HeldTree::new(max));
            assert_eq!(node.devices[0].unreadable, ["stats/hardware/mem_ecc_uncorrected"]);
            assert_eq!((node.devices[1].ecc[0], node.devices[1].unreadable.len()), (Some(4), 0));
        }
    }
}
