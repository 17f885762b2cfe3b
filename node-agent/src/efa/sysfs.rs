//! The EFA devices' counters in sysfs, under the sysfs root:
//! `class/infiniband/<dev>/hw_counters/*` (the device's) and
//! `class/infiniband/<dev>/ports/<n>/hw_counters/*` (each port's; EFA devices have port 1).
//!
//! An RDMA device is an EFA device when its PCI function is bound to the kernel's `efa`
//! driver: `<dev>/device/driver` is a link ending in `drivers/efa`, looked at again when
//! `class/infiniband` lists anew (the driver changes with the device). Other RDMA devices (a
//! Mellanox HCA, a software `rxe`) are left alone. The `class/infiniband/<dev>` entries
//! and those links are relative symbolic links, so they resolve under a sysfs mounted
//! elsewhere (`/host/sys`).
//!
//! Whatever counter files exist are read (drivers add counters over time), each within
//! bounds: entries per directory, a name of `[a-z0-9_]`, a file of a few bytes holding a
//! u64 decimal. What does not fit is left out and counted by [`Skip`] reason. A host with
//! no `class/infiniband`, or none of its devices EFA, reads as no device: not an error.

use std::{
    collections::HashMap,
    fs::{self, File},
    io,
    os::unix::fs::DirEntryExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use api::hardware::{valid_efa_device_name as valid_device_name, MAX_EFA_NAME_BYTES};

use crate::{
    health::sysfs::parse_counter,
    processes::procfs::{self, DirStamp, Failure},
    timed_read::Watch,
};

/// The RDMA devices' class directory, under the sysfs root.
pub const INFINIBAND_DIR: &str = "class/infiniband";
/// The name of the kernel driver of EFA devices.
pub const EFA_DRIVER: &str = "efa";
/// Entries of `class/infiniband` looked at; the rest of the listing is not read. A host
/// has one RDMA device per network card at most (32 on the largest EC2 type).
pub const MAX_RDMA_DEVICES: usize = 256;
/// EFA devices read, the first by name; more are counted and left out.
pub const MAX_EFA_DEVICES: usize = 64;
/// Ports read per device (EFA devices have one, port 1); port numbers are 1 to 255.
pub const MAX_PORTS: usize = 8;
const MAX_PORT_NUMBER: u32 = 255;
/// Counter files read per `hw_counters` directory (a port has about 25, a device 12); the
/// rest of the listing is not read.
pub const MAX_COUNTERS_PER_DIR: usize = 128;
/// Counters read in all, devices' and ports' together: each is a series on `/metrics` and
/// in every OTLP request. The largest EC2 type has 32 EFA devices of about 34 counters
/// (1,088); the other bounds alone would let a tree make 64 × (128 + 8 × 128) = 73,728
/// series (a 24 MB scrape). Counters beyond it are left out, `limit`.
pub const MAX_EFA_COUNTERS: usize = 2048;
/// Bytes of a device or counter name.
pub const MAX_NAME_BYTES: usize = MAX_EFA_NAME_BYTES;
/// Bytes of a counter file: a u64 is at most 20 digits and a newline.
pub const MAX_COUNTER_FILE_BYTES: u64 = 64;

/// Why something of the tree was left out: the `reason` label of
/// `neuron_agent_efa_read_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Listed, then gone before it was read.
    Gone,
    /// Not readable by the agent.
    Denied,
    /// A counter file beyond [`MAX_COUNTER_FILE_BYTES`].
    TooLarge,
    /// Not a u64 decimal.
    Malformed,
    /// A device or counter name outside its charset or length.
    BadName,
    /// Devices, ports or counter files beyond their bounds.
    Limit,
    /// A counter entry that is not a regular file (a link, a directory, a pipe).
    NotAFile,
    /// Any other error of the file system.
    Other,
    /// A read that missed its deadline, or one of a file whose earlier read never returned.
    Stuck,
}

impl Skip {
    pub const ALL: [Skip; 9] = [
        Skip::Gone,
        Skip::Denied,
        Skip::TooLarge,
        Skip::Malformed,
        Skip::BadName,
        Skip::Limit,
        Skip::NotAFile,
        Skip::Other,
        Skip::Stuck,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Gone => "gone",
            Skip::Denied => "denied",
            Skip::TooLarge => "too_large",
            Skip::Malformed => "malformed",
            Skip::BadName => "bad_name",
            Skip::Limit => "limit",
            Skip::NotAFile => "not_a_file",
            Skip::Other => "other",
            Skip::Stuck => "stuck",
        }
    }

    fn from_io(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Skip::Gone,
            io::ErrorKind::PermissionDenied => Skip::Denied,
            io::ErrorKind::TimedOut => Skip::Stuck,
            _ => Skip::Other,
        }
    }
}

impl From<Failure> for Skip {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Gone => Skip::Gone,
            Failure::Denied => Skip::Denied,
            Failure::TooLarge => Skip::TooLarge,
            Failure::Malformed => Skip::Malformed,
            Failure::Other => Skip::Other,
        }
    }
}

/// One counter file and its value. The name is the directory listing's, shared from one
/// read to the next while the listing holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub name: Arc<str>,
    pub value: u64,
}

/// One port's counters, sorted by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub number: u32,
    pub counters: Vec<Counter>,
}

/// One EFA device: its own counters and its ports', each sorted (ports by number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub counters: Vec<Counter>,
    pub ports: Vec<Port>,
}

impl Device {
    /// Whether a counter of this device reads lower than in `before` (the same device at
    /// an earlier read): the driver was reloaded and its counters started again from zero.
    pub fn went_back_from(&self, before: &Device) -> bool {
        let lower = |now: &[Counter], then: &[Counter]| {
            now.iter().enumerate().any(|(at, c)| {
                // Usually the same listing, so the same name at the same place.
                let same_place = then.get(at).filter(|t| Arc::ptr_eq(&t.name, &c.name));
                let was = same_place.or_else(|| then.binary_search_by(|t| t.name.cmp(&c.name)).ok().map(|i| &then[i]));
                was.is_some_and(|t| t.value > c.value)
            })
        };
        lower(&self.counters, &before.counters)
            || self.ports.iter().any(|p| {
                before.ports.iter().find(|b| b.number == p.number).is_some_and(|b| lower(&p.counters, &b.counters))
            })
    }
}

/// The tree at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    /// `class/infiniband` exists.
    pub rdma_class: bool,
    /// EFA devices, sorted by name.
    pub devices: Vec<Device>,
    /// RDMA devices of other drivers, left alone.
    pub other_devices: usize,
    /// What was left out, by [`Skip::ALL`].
    pub skipped: [u64; Skip::ALL.len()],
    /// Counters read so far, against [`MAX_EFA_COUNTERS`].
    counters: usize,
}

impl Reading {
    fn skip(&mut self, why: Skip) {
        self.skipped[why as usize] += 1;
    }
}

/// A counter name as part of a metric name (`efa_<name>_total`): `[a-z][a-z0-9_]*`, at most
/// [`MAX_NAME_BYTES`].
pub fn valid_counter_name(name: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    name.len() <= MAX_NAME_BYTES && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase()) && name.bytes().all(ok)
}

/// Whether the RDMA device at `dir` is bound to the `efa` driver; `None` when its driver
/// link could not be read.
fn is_efa(dir: &Path, watch: &Watch) -> Option<bool> {
    let target = watch.access(&dir.join("device/driver"), |p| fs::read_link(p)).ok()?;
    Some(target.file_name().is_some_and(|n| n == EFA_DRIVER))
}

/// Which devices of a listing of `class/infiniband` are EFA devices: the previous read's
/// verdict (`known`) for an entry listed then under the same name and inode (a device's
/// driver changes only with the device: unbound, it leaves the class directory, and one
/// registered again is a new entry); else the device's driver link (one `readlink`
/// through two links). A link that could not be read is not a verdict: it is read again
/// next time.
fn efa_verdicts(class: &Path, names: &[Entry], known: Option<Verdicts>, watch: &Watch) -> Vec<Option<bool>> {
    let (listed, verdicts) = known.unwrap_or_default();
    let known = |e: &Entry| {
        let at = listed.binary_search_by(|k| k.name.cmp(&e.name)).ok()?;
        verdicts.get(at).copied().flatten().filter(|_| listed[at].inode == e.inode)
    };
    names.iter().map(|e| known(e).or_else(|| is_efa(&class.join(&*e.name), watch))).collect()
}

/// A listing of `class/infiniband` and which of its devices are EFA devices.
type Verdicts = (Vec<Entry>, Vec<Option<bool>>);

/// The names of a directory's entries that are not hidden (`.name`: no sysfs attribute is;
/// a writer's temporary file may be), at most `max` of them; more are counted as
/// [`Skip::Limit`] (once) and the rest of the listing is not read. A name that is not
/// UTF-8 is counted as [`Skip::BadName`]. Each name comes with whether its entry is a
/// regular file (without following a link) and its inode.
///
/// A directory listed by the previous read and unchanged since (its [`DirStamp`]) is not
/// listed again: its listing, and what it counted, are taken from `files.listed`. Sysfs
/// makes a device's files when the device registers (a reload makes new directories, and
/// a new class entry: `class_inode`, the inode of the one `dir` is reached through), and a
/// writer that adds, renames or removes a file in a fake tree changes the directory's
/// change time.
///
/// The directory is held open from one read to the next, within the held files' bound:
/// its stamp is then an `fstat`, not a walk of its path through the class link (most of
/// what a `stat` costs). A directory removed since has no links left, so its stamp differs.
fn list(
    dir: &Path,
    class_inode: u64,
    max: usize,
    reading: &mut Reading,
    files: &mut Files<'_>,
) -> io::Result<Arc<[Entry]>> {
    let watch = files.watch;
    let before = files.listed.before.remove(dir).filter(|l| l.class_inode == class_inode);
    let listing = match before {
        Some(listing) if listing.is_current(dir, watch)? => listing,
        _ => {
            *files.listed.anew += 1;
            let held = files.held.has_room().then(|| watch.access(dir, procfs::Dir::open)).transpose()?;
            let stamp = match &held {
                Some(held) => DirStamp::of(&held.metadata()?),
                None => watch.access(dir, |dir| fs::metadata(dir).map(|m| DirStamp::of(&m)))?,
            };
            let (entries, skipped) = list_now(dir, max, watch)?;
            Listing { class_inode, stamp, held, entries: entries.into(), skipped }
        }
    };
    files.held.held_dirs += usize::from(listing.held.is_some());
    count_skipped(reading, listing.skipped);
    // Shared with the listing kept for the next read: no copy of the names.
    let entries = Arc::clone(&listing.entries);
    files.listed.now.insert(dir.to_owned(), listing);
    Ok(entries)
}

/// `class/infiniband`, listed at every read: sysfs keeps a directory's change time when
/// a device registers in it or leaves (kernfs sets a directory's times only where they
/// were set before), so no stamp tells that it would list otherwise.
fn list_class(dir: &Path, reading: &mut Reading, watch: &Watch, listed: &mut Listed<'_>) -> io::Result<Vec<Entry>> {
    *listed.anew += 1;
    let (entries, skipped) = list_now(dir, MAX_RDMA_DEVICES, watch)?;
    count_skipped(reading, skipped);
    Ok(entries)
}

fn count_skipped(reading: &mut Reading, skipped: [u64; Skip::ALL.len()]) {
    for (total, skipped) in reading.skipped.iter_mut().zip(skipped) {
        *total += skipped;
    }
}

/// `dir`'s entries, sorted by name, and what the listing counted (by [`Skip`]).
fn list_now(dir: &Path, max: usize, watch: &Watch) -> io::Result<(Vec<Entry>, [u64; Skip::ALL.len()])> {
    let mut entries = Vec::new();
    let mut skipped = [0; Skip::ALL.len()];
    let mut skip = |why: Skip| skipped[why as usize] += 1;
    watch.access(dir, |dir| {
        for entry in fs::read_dir(dir)? {
            let Ok(entry) = entry else {
                skip(Skip::Other);
                continue;
            };
            let Some(name) = entry.file_name().to_str().map(Arc::<str>::from) else {
                skip(Skip::BadName);
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            if entries.len() == max {
                skip(Skip::Limit);
                break;
            }
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            entries.push(Entry { name, is_file, inode: entry.ino() });
        }
        Ok(())
    })?;
    entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok((entries, skipped))
}

/// A directory entry, as [`list`] gives it.
struct Entry {
    name: Arc<str>,
    is_file: bool,
    inode: u64,
}

/// A directory's entries as listed, with its stamp then and what the listing counted
/// (by [`Skip`]); the directory itself while held open; the inode of the class entry it
/// was reached through.
struct Listing {
    class_inode: u64,
    stamp: DirStamp,
    held: Option<procfs::Dir>,
    entries: Arc<[Entry]>,
    skipped: [u64; Skip::ALL.len()],
}

impl Listing {
    /// Whether `dir` would still list as this: the same stamp, through the directory held
    /// open (an `fstat`, which no driver handler can hang) or else its path.
    fn is_current(&self, dir: &Path, watch: &Watch) -> io::Result<bool> {
        let now = match &self.held {
            Some(held) => held.metadata()?,
            None => watch.access(dir, |dir| fs::metadata(dir))?,
        };
        Ok(DirStamp::of(&now) == self.stamp)
    }
}

/// The listings of the previous read (taken when used again) and those of this one,
/// and how many of these were listed anew.
struct Listed<'r> {
    before: &'r mut HashMap<PathBuf, Listing>,
    now: &'r mut HashMap<PathBuf, Listing>,
    anew: &'r mut usize,
}

/// Reads every EFA device under the sysfs root `root`, without a deadline, holding no
/// file open. Never writes.
pub fn read(root: &Path) -> Reading {
    read_watched(root, &Watch::untimed(), &mut HeldFiles::new(0))
}

/// A counter file held open: its name, inode and descriptor.
type HeldFile = (Arc<str>, u64, File);

/// Counter files kept open from one read to the next, so that a read costs one `pread`
/// per counter instead of an open, a read and a close (three times the system calls,
/// most of a read's cost). A file is opened again when its directory lists another inode
/// under its name (a driver reload makes new files, a writer may rename a new one over
/// it) and closed when it is no longer listed. The directories listed are held open
/// too (see [`list`]). At most `max` descriptors are held, directories first; the other
/// files are opened for each read.
#[derive(Default)]
pub struct HeldFiles {
    max: usize,
    /// By `hw_counters` directory: each file's name, inode and descriptor, by name.
    dirs: HashMap<PathBuf, Vec<HeldFile>>,
    /// Counter files and directories held by the latest read.
    held: usize,
    held_dirs: usize,
    /// The directories the read listed, by path, and how many it listed anew.
    listings: HashMap<PathBuf, Listing>,
    listed_anew: usize,
    /// Which devices of the read's `class/infiniband` listing are EFA devices.
    efa_verdicts: Option<Verdicts>,
}

impl HeldFiles {
    pub fn new(max: usize) -> Self {
        HeldFiles { max, ..HeldFiles::default() }
    }

    /// Counter files held open.
    pub fn count(&self) -> usize {
        self.held
    }

    fn has_room(&self) -> bool {
        self.held + self.held_dirs < self.max
    }

    /// Directories the latest read listed, not taking the previous read's listing.
    pub fn listed_anew(&self) -> usize {
        self.listed_anew
    }
}

/// Reads every EFA device under the sysfs root `root`, each file through `watch` (the
/// files stuck earlier skipped, as [`Skip::Stuck`]), reading the files `held` holds and
/// leaving it holding those of this read. Never writes.
pub fn read_watched(root: &Path, watch: &Watch, held: &mut HeldFiles) -> Reading {
    let mut before = std::mem::take(&mut held.dirs);
    let mut listed_before = std::mem::take(&mut held.listings);
    let mut listed_now = HashMap::with_capacity(listed_before.len());
    let mut anew = 0;
    (held.held, held.held_dirs) = (0, 0);
    let mut files = Files {
        watch,
        before: &mut before,
        held: &mut *held,
        listed: Listed { before: &mut listed_before, now: &mut listed_now, anew: &mut anew },
    };
    let reading = read_devices(root, &mut files);
    // What `before` still holds is no longer listed: closed here.
    drop(before);
    held.listings = listed_now;
    held.listed_anew = anew;
    reading
}

fn read_devices(root: &Path, files: &mut Files<'_>) -> Reading {
    let mut reading = Reading::default();
    let class = root.join(INFINIBAND_DIR);
    let watch = files.watch;
    let names = match list_class(&class, &mut reading, watch, &mut files.listed) {
        Ok(names) => names,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return reading,
        Err(e) => {
            reading.rdma_class = true;
            reading.skip(Skip::from_io(&e));
            return reading;
        }
    };
    reading.rdma_class = true;
    let verdicts = efa_verdicts(&class, &names, files.held.efa_verdicts.take(), watch);
    for (Entry { name, inode, .. }, efa) in names.iter().zip(&verdicts) {
        if *efa != Some(true) {
            reading.other_devices += 1;
            continue;
        }
        let dir = class.join(&**name);
        if !valid_device_name(name) {
            reading.skip(Skip::BadName);
            continue;
        }
        if reading.devices.len() == MAX_EFA_DEVICES {
            reading.skip(Skip::Limit);
            continue;
        }
        let device = read_device(name.to_string(), &dir, *inode, &mut reading, files);
        reading.devices.push(device);
    }
    files.held.efa_verdicts = Some((names, verdicts));
    reading
}

/// How a read reaches the counter files: through `watch`, with the files held open
/// since the previous read (`before`) and those it leaves open (`held`), and the
/// directories' listings.
struct Files<'r> {
    watch: &'r Watch,
    before: &'r mut HashMap<PathBuf, Vec<HeldFile>>,
    held: &'r mut HeldFiles,
    listed: Listed<'r>,
}

/// Reads the device at `dir`, reached through the class entry of inode `class_inode`.
fn read_device(name: String, dir: &Path, class_inode: u64, reading: &mut Reading, files: &mut Files<'_>) -> Device {
    let counters = read_counters(&dir.join("hw_counters"), class_inode, reading, files);
    let mut ports = Vec::new();
    match list(&dir.join("ports"), class_inode, MAX_PORTS, reading, files) {
        Ok(entries) => {
            for Entry { name: entry, .. } in entries.iter() {
                let number = entry.parse::<u32>().ok().filter(|n| (1..=MAX_PORT_NUMBER).contains(n));
                match number {
                    // Parsed back, so `01` and `1` are not two ports.
                    Some(number) if number.to_string() == **entry => {
                        let path: PathBuf =
                            [dir, Path::new("ports"), Path::new(&**entry), Path::new("hw_counters")].iter().collect();
                        ports.push(Port { number, counters: read_counters(&path, class_inode, reading, files) });
                    }
                    _ => reading.skip(Skip::BadName),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => reading.skip(Skip::from_io(&e)),
    }
    ports.sort_unstable_by_key(|p| p.number);
    Device { name, counters, ports }
}

/// A counter file's value: a u64 decimal and its newline.
fn parse(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok().and_then(parse_counter)
}

/// The counters of one `hw_counters` directory of the device reached through the class
/// entry of inode `class_inode`, sorted by name; none when it does not exist.
fn read_counters(dir: &Path, class_inode: u64, reading: &mut Reading, files: &mut Files<'_>) -> Vec<Counter> {
    let watch = files.watch;
    let entries = match list(dir, class_inode, MAX_COUNTERS_PER_DIR, reading, files) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            reading.skip(Skip::from_io(&e));
            return Vec::new();
        }
    };
    let mut before = files.before.remove(dir).unwrap_or_default();
    let mut held = Vec::new();
    // Opened when a file is not held already.
    let mut dir_fd = None;
    let mut buf = [0u8; MAX_COUNTER_FILE_BYTES as usize + 1];
    let mut counters = Vec::with_capacity(entries.len());
    // Each counter's path, the directory's with the name pushed and popped.
    let mut path = dir.to_owned();
    for &Entry { ref name, is_file, inode } in entries.iter() {
        if reading.counters == MAX_EFA_COUNTERS {
            // Once per directory: the rest of it is not read.
            reading.skip(Skip::Limit);
            break;
        }
        if !valid_counter_name(name) {
            reading.skip(Skip::BadName);
            continue;
        }
        // Never opened unless a regular file: a pipe would block the read.
        if !is_file {
            reading.skip(Skip::NotAFile);
            continue;
        }
        // The inode first: it tells the files apart without comparing their names.
        let kept = before.iter().position(|(n, i, _)| *i == inode && n == name).map(|at| before.swap_remove(at).2);
        path.push(&**name);
        let read = watch.access(&path, |_| {
            let file = match kept {
                Some(file) => file,
                None => match open_in(dir, &mut dir_fd).and_then(|d| d.open_file(name)) {
                    Ok(file) => file,
                    Err(failure) => return Ok(Err(failure)),
                },
            };
            let value = procfs::read_whole(&file, &mut buf).map(parse);
            Ok(value.map(|value| (value, file)))
        });
        path.pop();
        match read.map_err(|e| Skip::from_io(&e)).and_then(|read| read.map_err(Skip::from)) {
            Ok((Some(value), file)) => {
                reading.counters += 1;
                if files.held.has_room() {
                    files.held.held += 1;
                    held.push((name.clone(), inode, file));
                }
                counters.push(Counter { name: name.clone(), value });
            }
            Ok((None, _)) => reading.skip(Skip::Malformed),
            Err(why) => reading.skip(why),
        }
    }
    if !held.is_empty() {
        files.held.dirs.insert(dir.to_owned(), held);
    }
    counters
}

/// The directory `dir`, opened at its first use in a read.
fn open_in<'d>(dir: &Path, dir_fd: &'d mut Option<procfs::Dir>) -> Result<&'d procfs::Dir, Failure> {
    if dir_fd.is_none() {
        *dir_fd = Some(procfs::Dir::open(dir).map_err(|e| Failure::from_io(&e))?);
    }
    dir_fd.as_ref().ok_or(Failure::Other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::TempDir;
    use std::os::unix::fs::symlink;

    /// An RDMA device of `driver` on PCI function `pci` in a fake sysfs root, laid out as
    /// the kernel's: under `devices/`, relative links from `class/infiniband` and to the
    /// driver. Returns its directory.
    fn device(tree: &TempDir, name: &str, pci: &str, driver: &str) -> String {
        let function = format!("devices/pci0000:00/{pci}");
        let dev = format!("{function}/infiniband/{name}");
        fs::create_dir_all(tree.0.join(&dev)).unwrap();
        fs::create_dir_all(tree.0.join(format!("bus/pci/drivers/{driver}"))).unwrap();
        symlink(format!("../../../bus/pci/drivers/{driver}"), tree.0.join(&function).join("driver")).unwrap();
        symlink(format!("../../../{pci}"), tree.0.join(&dev).join("device")).unwrap();
        fs::create_dir_all(tree.0.join(INFINIBAND_DIR)).unwrap();
        symlink(format!("../../{dev}"), tree.0.join(INFINIBAND_DIR).join(name)).unwrap();
        dev
    }

    fn counters(pairs: &[(&str, u64)]) -> Vec<Counter> {
        pairs.iter().map(|(n, v)| Counter { name: (*n).into(), value: *v }).collect()
    }

    fn skipped(reading: &Reading, why: Skip) -> u64 {
        reading.skipped[why as usize]
    }

    #[test]
    fn no_rdma_class_or_no_efa_device_is_no_device() {
        let tree = TempDir::new("efa-sysfs");
        assert_eq!(read(&tree.0), Reading::default());
        let dev = device(&tree, "mlx5_0", "0000:00:04.0", "mlx5_core");
        tree.write(format!("{dev}/ports/1/hw_counters/rx_bytes"), "5\n");
        let reading = read(&tree.0);
        assert!(reading.rdma_class && reading.devices.is_empty());
        assert_eq!((reading.other_devices, reading.skipped), (1, [0; 9]));
    }

    #[test]
    fn reads_every_counter_file_of_efa_devices_through_their_links() {
        let tree = TempDir::new("efa-sysfs");
        for (name, pci) in [("rdmap32s27", "0000:20:1b.0"), ("rdmap16s27", "0000:10:1b.0")] {
            let dev = device(&tree, name, pci, "efa");
            tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "1024\n");
            tree.write(format!("{dev}/ports/1/hw_counters/rx_drops"), "0\n");
            tree.write(format!("{dev}/ports/1/hw_counters/a_counter_of_a_newer_driver"), "18446744073709551615\n");
            tree.write(format!("{dev}/hw_counters/cmds_err"), "3");
        }
        let other = device(&tree, "mlx5_0", "0000:00:04.0", "mlx5_core");
        tree.write(format!("{other}/ports/1/hw_counters/tx_bytes"), "7\n");
        let reading = read(&tree.0);
        assert_eq!(reading.other_devices, 1);
        assert_eq!(reading.skipped, [0; 9]);
        let names: Vec<&str> = reading.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["rdmap16s27", "rdmap32s27"]);
        let device = &reading.devices[0];
        assert_eq!(device.counters, counters(&[("cmds_err", 3)]));
        assert_eq!(device.ports.len(), 1);
        assert_eq!(device.ports[0].number, 1);
        assert_eq!(
            device.ports[0].counters,
            counters(&[("a_counter_of_a_newer_driver", u64::MAX), ("rx_drops", 0), ("tx_bytes", 1024)])
        );
    }

    /// Counter files are held open from one read to the next, within their bound, and
    /// still read what the files hold now: a value written in place, a file a writer
    /// renamed over the old one (opened again), a file gone (closed), a new one (opened).
    #[test]
    fn counter_files_are_held_open_between_reads_and_follow_the_tree() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        let port = tree.0.join(&dev).join("ports/1/hw_counters");
        // The reader's path to it, through the class directory's link.
        let port_listed = tree.0.join(INFINIBAND_DIR).join("rdmap16s27/ports/1/hw_counters");
        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "1\n");
        tree.write(format!("{dev}/ports/1/hw_counters/rx_bytes"), "2\n");
        tree.write(format!("{dev}/hw_counters/cmds_err"), "3\n");
        let mut held = HeldFiles::new(8);
        let reading = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!(reading.devices[0].ports[0].counters, counters(&[("rx_bytes", 2), ("tx_bytes", 1)]));
        assert_eq!(held.count(), 3);
        let tx_before = held.dirs[&port_listed].iter().find(|(n, ..)| &**n == "tx_bytes").map(|(_, inode, _)| *inode);

        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "10\n");
        tree.write(format!("{dev}/ports/1/hw_counters/.rx_bytes.new"), "20\n");
        fs::rename(port.join(".rx_bytes.new"), port.join("rx_bytes")).unwrap();
        fs::remove_file(tree.0.join(&dev).join("hw_counters/cmds_err")).unwrap();
        tree.write(format!("{dev}/hw_counters/keep_alive_rcvd"), "4\n");
        let reading = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!(reading.devices[0].ports[0].counters, counters(&[("rx_bytes", 20), ("tx_bytes", 10)]));
        assert_eq!(reading.devices[0].counters, counters(&[("keep_alive_rcvd", 4)]));
        assert_eq!(reading.skipped, [0; 9]);
        assert_eq!(held.count(), 3, "cmds_err closed, keep_alive_rcvd opened");
        assert_eq!(held.listed_anew(), 3, "the class directory and the two a file was renamed, removed or added in");
        let tx_after = held.dirs[&port_listed].iter().find(|(n, ..)| &**n == "tx_bytes").map(|(_, inode, _)| *inode);
        assert_eq!(tx_before, tx_after, "a file written in place is the one held");

        // The three directories first, then one file.
        let mut few = HeldFiles::new(4);
        let bounded = read_watched(&tree.0, &Watch::untimed(), &mut few);
        assert_eq!(bounded, reading, "beyond the bound, files are opened for each read");
        assert_eq!((few.held_dirs, few.count()), (3, 1));
        let mut none = HeldFiles::new(0);
        assert_eq!(read_watched(&tree.0, &Watch::untimed(), &mut none), reading, "nothing held");
        assert_eq!((none.held_dirs, none.count()), (0, 0));
    }

    /// A directory held open and removed is listed again through its path, also where the
    /// one made in its place has the same change time (a clock that ticks coarser than the
    /// writer): the removed one has no links left.
    #[test]
    fn a_held_directory_made_anew_is_listed_anew() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "1\n");
        let mut held = HeldFiles::new(8);
        let first = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!(first.devices[0].ports[0].counters, counters(&[("tx_bytes", 1)]));
        assert_eq!(held.held_dirs, 2, "its ports and port 1's hw_counters");
        fs::remove_dir_all(tree.0.join(&dev).join("ports/1")).unwrap();
        tree.write(format!("{dev}/ports/1/hw_counters/rx_bytes"), "7\n");
        let second = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!(second.devices[0].ports[0].counters, counters(&[("rx_bytes", 7)]));
        assert_eq!(second.skipped, [0; 9]);
    }

    /// An unchanged tree is not listed again but for its class directory: the second read
    /// stats the devices' directories, reads the held files, and counts what the first
    /// read's listings counted.
    #[test]
    fn an_unchanged_directory_is_not_listed_again() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "1\n");
        tree.write(format!("{dev}/ports/1/hw_counters/Bad-Name"), "2\n");
        tree.write(format!("{dev}/hw_counters/cmds_err"), "3\n");
        let mut held = HeldFiles::new(8);
        let first = read_watched(&tree.0, &Watch::untimed(), &mut held);
        // The class directory, the device's hw_counters, its ports, port 1's hw_counters.
        assert_eq!(held.listed_anew(), 4);
        assert_eq!(skipped(&first, Skip::BadName), 1);
        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "10\n");
        let second = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!(held.listed_anew(), 1, "the class directory, listed at every read");
        assert_eq!(second.devices[0].ports[0].counters, counters(&[("tx_bytes", 10)]), "written in place");
        assert_eq!(skipped(&second, Skip::BadName), 1, "counted again from the kept listing");
    }

    /// A device's driver is looked at once per class directory entry: a driver changes
    /// with the device (unbound, it leaves the class directory; registered again, it is a
    /// new entry). A device that registers later is found at the next read, though sysfs
    /// leaves the class directory's change time as it was.
    #[test]
    fn a_devices_driver_is_looked_at_once_per_class_entry() {
        let tree = TempDir::new("efa-sysfs");
        device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        let mut held = HeldFiles::new(8);
        let first = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!((first.devices.len(), first.other_devices), (1, 0));
        // The link alone changes (no real device does that): the verdict is kept.
        let link = tree.0.join("devices/pci0000:00/0000:10:1b.0/driver");
        fs::create_dir_all(tree.0.join("bus/pci/drivers/mlx5_core")).unwrap();
        fs::remove_file(&link).unwrap();
        symlink("../../../bus/pci/drivers/mlx5_core", &link).unwrap();
        let kept = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!((kept.devices.len(), kept.other_devices), (1, 0));
        // A device registered beside it is looked at; the first keeps its verdict.
        device(&tree, "rdmap32s27", "0000:20:1b.0", "efa");
        let beside = read_watched(&tree.0, &Watch::untimed(), &mut held);
        let names: Vec<&str> = beside.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!((names, beside.other_devices), (vec!["rdmap16s27", "rdmap32s27"], 0));
        // The first registered again (a new entry, made before the old one goes: a file
        // system may give a freed inode number to the next file): its driver is looked at
        // again.
        let class = tree.0.join(INFINIBAND_DIR);
        symlink("../../devices/pci0000:00/0000:10:1b.0/infiniband/rdmap16s27", class.join(".new")).unwrap();
        fs::rename(class.join(".new"), class.join("rdmap16s27")).unwrap();
        let again = read_watched(&tree.0, &Watch::untimed(), &mut held);
        let names: Vec<&str> = again.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!((names, again.other_devices), (vec!["rdmap32s27"], 1));
    }

    /// A driver link that cannot be read is no verdict: the next read looks again.
    #[test]
    fn an_unreadable_driver_link_is_looked_at_again() {
        let tree = TempDir::new("efa-sysfs");
        device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        let link = tree.0.join("devices/pci0000:00/0000:10:1b.0/driver");
        let mut held = HeldFiles::new(8);
        let stuck = read_watched(
            &tree.0,
            &Watch::with_stuck([tree.0.join(INFINIBAND_DIR).join("rdmap16s27/device/driver")]),
            &mut held,
        );
        assert_eq!((stuck.devices.len(), stuck.other_devices), (0, 1));
        assert!(link.exists());
        let next = read_watched(&tree.0, &Watch::untimed(), &mut held);
        assert_eq!((next.devices.len(), next.other_devices), (1, 0));
    }

    /// Issue 24, fault 5: a counter whose earlier read never returned is not opened again,
    /// and the device's other counters are still read.
    #[test]
    fn a_stuck_counter_is_skipped_and_counted() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        let port = format!("{dev}/ports/1/hw_counters");
        tree.write(format!("{port}/tx_bytes"), "1\n");
        tree.write(format!("{port}/rx_bytes"), "2\n");
        let stuck = tree.0.join(INFINIBAND_DIR).join("rdmap16s27/ports/1/hw_counters/rx_bytes");
        let reading = read_watched(&tree.0, &Watch::with_stuck([stuck]), &mut HeldFiles::new(8));
        assert_eq!(reading.devices[0].ports[0].counters, counters(&[("tx_bytes", 1)]));
        assert_eq!(skipped(&reading, Skip::Stuck), 1);
    }

    #[test]
    fn broken_files_are_left_out_and_counted_by_reason() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        let port = format!("{dev}/ports/1/hw_counters");
        tree.write(format!("{port}/tx_bytes"), "1\n");
        tree.write(format!("{port}/negative"), "-1\n");
        tree.write(format!("{port}/garbage"), "12 apples\n");
        tree.write(format!("{port}/overflow"), "18446744073709551616\n");
        tree.write(format!("{port}/empty"), "");
        fs::write(tree.0.join(&port).join("not_utf8"), b"\xff\xfe").unwrap();
        tree.write(format!("{port}/huge"), "1".repeat(MAX_COUNTER_FILE_BYTES as usize + 1));
        tree.write(format!("{port}/Upper_Case"), "1\n");
        tree.write(format!("{port}/{}", "x".repeat(MAX_NAME_BYTES + 1)), "1\n");
        tree.write(format!("{port}/.tx_bytes.tmp"), "999\n");
        fs::create_dir_all(tree.0.join(&port).join("a_directory")).unwrap();
        symlink("tx_bytes", tree.0.join(&port).join("linked")).unwrap();
        symlink("/dev/zero", tree.0.join(&port).join("zeros")).unwrap();
        let fifo = std::ffi::CString::new(tree.0.join(&port).join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        tree.write(format!("{dev}/ports/01/hw_counters/tx_bytes"), "1\n");
        tree.write(format!("{dev}/ports/0/hw_counters/tx_bytes"), "1\n");
        tree.write(format!("{dev}/ports/x/hw_counters/tx_bytes"), "1\n");
        device(&tree, "a device", "0000:11:1b.0", "efa");

        let reading = read(&tree.0);
        let device = &reading.devices[0];
        assert_eq!(device.ports.len(), 1);
        assert_eq!(device.ports[0].counters, counters(&[("tx_bytes", 1)]));
        assert_eq!(skipped(&reading, Skip::Malformed), 5, "negative, garbage, overflow, empty, not UTF-8");
        assert_eq!(skipped(&reading, Skip::TooLarge), 1);
        assert_eq!(reading.devices.len(), 1);
        assert_eq!(skipped(&reading, Skip::BadName), 2 + 3 + 1, "two counter names, three port names, a device");
        assert_eq!(skipped(&reading, Skip::NotAFile), 4, "directory, two links, pipe");
        assert_eq!(skipped(&reading, Skip::Limit), 0);
    }

    #[test]
    fn devices_ports_and_counters_are_bounded() {
        let tree = TempDir::new("efa-sysfs");
        for i in 0..MAX_EFA_DEVICES + 2 {
            let dev = device(&tree, &format!("rdmap{i:03}s27"), &format!("0000:{i:02x}:1b.0"), "efa");
            if i == 0 {
                for c in 0..MAX_COUNTERS_PER_DIR + 10 {
                    tree.write(format!("{dev}/hw_counters/c{c:03}"), "1\n");
                }
                for p in 1..=MAX_PORTS + 1 {
                    tree.write(format!("{dev}/ports/{p}/hw_counters/tx_bytes"), "1\n");
                }
            }
        }
        let reading = read(&tree.0);
        assert_eq!(reading.devices.len(), MAX_EFA_DEVICES);
        assert_eq!(reading.devices.last().unwrap().name, format!("rdmap{:03}s27", MAX_EFA_DEVICES - 1));
        let first = &reading.devices[0];
        assert_eq!(first.counters.len(), MAX_COUNTERS_PER_DIR);
        assert_eq!(first.ports.len(), MAX_PORTS);
        // Two devices, the rest of one counter listing, the rest of one port listing.
        assert_eq!(skipped(&reading, Skip::Limit), 2 + 1 + 1);
    }

    /// Issue 24 (smaller): the counters of a whole read are bounded too, not only each
    /// directory's: the maximal tree no longer makes 73,728 series.
    #[test]
    fn counters_of_a_read_are_bounded_in_all() {
        let tree = TempDir::new("efa-sysfs");
        let devices = MAX_EFA_COUNTERS / MAX_COUNTERS_PER_DIR + 1;
        for i in 0..devices {
            let dev = device(&tree, &format!("rdmap{i:03}s27"), &format!("0000:{i:02x}:1b.0"), "efa");
            for c in 0..MAX_COUNTERS_PER_DIR {
                tree.write(format!("{dev}/hw_counters/c{c:03}"), "1\n");
            }
        }
        let reading = read(&tree.0);
        let read: usize = reading.devices.iter().map(|d| d.counters.len()).sum();
        assert_eq!(read, MAX_EFA_COUNTERS);
        assert!(reading.devices.last().unwrap().counters.is_empty());
        assert_eq!(skipped(&reading, Skip::Limit), 1, "the last directory, once");
    }

    #[test]
    fn unreadable_directories_are_counted() {
        let tree = TempDir::new("efa-sysfs");
        let dev = device(&tree, "rdmap16s27", "0000:10:1b.0", "efa");
        // A loop instead of the counters directory.
        symlink("hw_counters", tree.0.join(&dev).join("hw_counters")).unwrap();
        tree.write(format!("{dev}/ports/1/hw_counters/tx_bytes"), "4\n");
        let reading = read(&tree.0);
        assert_eq!(reading.devices[0].counters, Vec::new());
        assert_eq!(reading.devices[0].ports[0].counters, counters(&[("tx_bytes", 4)]));
        assert_eq!(skipped(&reading, Skip::Other), 1);
    }

    #[test]
    fn a_counter_lower_than_before_is_a_reload() {
        let device = |tx: u64, cmds: u64| Device {
            name: "rdmap16s27".into(),
            counters: counters(&[("cmds_err", cmds)]),
            ports: vec![Port { number: 1, counters: counters(&[("rx_bytes", 5), ("tx_bytes", tx)]) }],
        };
        assert!(!device(10, 1).went_back_from(&device(10, 1)));
        assert!(!device(11, 2).went_back_from(&device(10, 1)));
        assert!(device(9, 1).went_back_from(&device(10, 1)));
        assert!(device(10, 0).went_back_from(&device(10, 1)));
        // A counter that appeared or went is no reload.
        let mut fewer = device(10, 1);
        fewer.ports[0].counters.remove(0);
        assert!(!fewer.went_back_from(&device(10, 1)));
        assert!(!device(10, 1).went_back_from(&fewer));
        // Names shared with the earlier read (as one listing gives them) compare in place;
        // a name found elsewhere is still compared with its own value.
        let before = device(10, 1);
        let mut now = before.clone();
        assert!(!now.went_back_from(&before));
        now.ports[0].counters[1].value = 9;
        assert!(now.went_back_from(&before));
        now.ports[0].counters.swap(0, 1);
        assert!(now.went_back_from(&before));
        now.ports[0].counters[0].value = 10;
        assert!(!now.went_back_from(&before));
    }

    #[test]
    fn names_are_bounded_labels() {
        assert!(valid_device_name("rdmap16s27") && valid_device_name("efa_0") && valid_device_name("mlx5:0.1-a"));
        assert!(!valid_device_name("") && !valid_device_name("a b") && !valid_device_name(&"a".repeat(65)));
        assert!(valid_counter_name("rdma_read_wr_err") && valid_counter_name("tx_bytes2"));
        assert!(!valid_counter_name("") && !valid_counter_name("2x") && !valid_counter_name("_x"));
        assert!(!valid_counter_name("Tx") && !valid_counter_name("tx-bytes") && !valid_counter_name(&"a".repeat(65)));
    }
}
