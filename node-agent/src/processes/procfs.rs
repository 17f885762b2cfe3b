//! The few `/proc/<pid>/` files the process series come from, read with a size bound and
//! parsed without trusting them: `stat` (CPU time, threads, resident pages), `io` (bytes
//! read and written) and the `fd` directory (open descriptors, counted up to a bound).
//!
//! Also the home of what the readers of many small files share (these, EFA's and the
//! Neuron driver's sysfs trees): a directory held open to open its files by name
//! ([`Dir`]), a bounded whole read ([`read_whole`]), a directory's [`DirStamp`], and the
//! share of descriptors a reader may hold ([`held_files_share`]).

use std::{
    ffi::CString,
    fs::{File, OpenOptions},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::{FileExt, OpenOptionsExt},
    },
    path::Path,
};

/// Bytes of `stat` (about 300 on a real kernel: a command name is at most 64 bytes) and
/// of `io` (seven short lines).
pub const MAX_PROC_FILE_BYTES: usize = 4096;
/// Entries of `fd/` counted: a process with more has no `open_fds` series (counting a
/// million descriptors each period would cost more than the number is worth).
pub const MAX_OPEN_FDS: usize = 1 << 16;

/// Why a file gave no value; the `reason` label of the failure counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The process (or the file) is gone: it exited since the report.
    Gone,
    /// Not ours to read (another user's `io` or `fd/` without the capability).
    Denied,
    /// Beyond the bound of its kind.
    TooLarge,
    /// Not the documented format.
    Malformed,
    /// Any other error of the file system.
    Other,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Gone => "gone",
            Failure::Denied => "denied",
            Failure::TooLarge => "too_large",
            Failure::Malformed => "malformed",
            Failure::Other => "other",
        }
    }

    pub(crate) fn from_io(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Failure::Gone,
            io::ErrorKind::PermissionDenied => Failure::Denied,
            // procfs answers ESRCH for a process that exited while its file was open.
            _ if e.raw_os_error() == Some(libc::ESRCH) => Failure::Gone,
            _ => Failure::Other,
        }
    }
}

/// What `stat` says, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Clock ticks in user and kernel mode.
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub threads: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Bytes the process made the storage layer read and write (`read_bytes`, `write_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// A directory held open, so that each of its many small files is opened by name
/// (`openat`): the kernel walks one path component instead of the whole path, which on a
/// sysfs tree behind links was most of what opening a counter cost.
pub struct Dir(File);

impl Dir {
    pub fn open(path: &Path) -> io::Result<Dir> {
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(path).map(Dir)
    }

    /// The directory's metadata (`fstat`: no walk of its path).
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.0.metadata()
    }

    /// Opens the directory `name` (a path relative to this one), never through a link at
    /// its end.
    pub fn open_dir(&self, name: &str) -> io::Result<Dir> {
        self.open_at(name, libc::O_DIRECTORY | libc::O_NOFOLLOW).map(Dir)
    }

    /// Opens the file `name` (a path relative to this one) for reading as [`File::open`]
    /// does: through links, and blocking on a FIFO until a writer opens it (for a reader
    /// whose reads are bounded in time otherwise: `timed_read`).
    pub fn open_as_path(&self, name: &str) -> io::Result<File> {
        self.open_at(name, 0)
    }

    fn open_at(&self, name: &str, flags: libc::c_int) -> io::Result<File> {
        let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid directory descriptor (owned by `self`) and a NUL-terminated name.
        let fd = unsafe { libc::openat(self.0.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Opens the file `name` of this directory for reading. Never follows a link (a tree
    /// could point it anywhere) and never blocks on opening a FIFO.
    pub fn open_file(&self, name: &str) -> Result<File, Failure> {
        self.open_at(name, libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY).map_err(|e| Failure::from_io(&e))
    }

    /// Reads the whole file `name` of this directory ([`read_whole`]).
    pub fn read_file<'b>(&self, name: &str, buf: &'b mut [u8]) -> Result<&'b [u8], Failure> {
        read_whole(&self.open_file(name)?, buf)
    }
}

/// Descriptors a reader of a tree (EFA's, the Neuron driver's) may hold open from one
/// read to the next: a quarter of those the process may open, the rest for its sockets
/// and the other readers (a container's soft limit may be as low as 1,024).
pub fn held_files_share() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_cur } else { 1024 };
    usize::try_from(soft / 4).unwrap_or(usize::MAX)
}

/// A directory's identity, links and change time (set by the kernel at each entry added,
/// renamed or removed; unlike the modification time, no writer can set it back): another
/// means it may list otherwise, or hold other files under the same names. A directory
/// removed has no links left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirStamp {
    device: u64,
    inode: u64,
    links: u64,
    changed: (i64, i64),
}

impl DirStamp {
    pub fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        DirStamp { device: m.dev(), inode: m.ino(), links: m.nlink(), changed: (m.ctime(), m.ctime_nsec()) }
    }
}

/// Reads `file` from its start into `buf`, whose length is one more than the file may
/// hold: the bytes read, or [`Failure::TooLarge`] when they fill `buf`. Read at an offset,
/// so a file held open gives its current content each time (a sysfs attribute is
/// generated anew by a read from its start). A read shorter than asked ends the file: a
/// regular file and a sysfs attribute give all they have at once, so a counter costs one
/// read, not two.
pub fn read_whole<'b>(file: &File, buf: &'b mut [u8]) -> Result<&'b [u8], Failure> {
    let mut len = 0;
    while len < buf.len() {
        let asked = buf.len() - len;
        let n = match file.read_at(&mut buf[len..], len as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::from_io(&e)),
        };
        len += n;
        if n < asked {
            return Ok(&buf[..len]);
        }
    }
    Err(Failure::TooLarge)
}

/// Parses `stat`: `pid (comm) state ppid …`. The command name may hold spaces, `)` and
/// any byte, so the fields are those after the last `)`; they are ASCII numbers.
pub fn parse_stat(bytes: &[u8]) -> Result<Stat, Failure> {
    let close = bytes.iter().rposition(|b| *b == b')').ok_or(Failure::Malformed)?;
    let rest = std::str::from_utf8(&bytes[close + 1..]).map_err(|_| Failure::Malformed)?;
    // Field 3 (state) is the first after the name; utime is field 14, stime 15,
    // num_threads 20, rss 24 (proc(5)).
    let fields: Vec<&str> = rest.split_ascii_whitespace().take(22).collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).ok_or(Failure::Malformed);
    Ok(Stat { utime_ticks: field(14)?, stime_ticks: field(15)?, threads: field(20)?, rss_pages: field(24)? })
}

/// Parses `io`: `name: value` lines, of which `read_bytes` and `write_bytes` are kept.
pub fn parse_io(bytes: &[u8]) -> Result<Io, Failure> {
    let text = std::str::from_utf8(bytes).map_err(|_| Failure::Malformed)?;
    let (mut read, mut write) = (None, None);
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match name.trim() {
            "read_bytes" => &mut read,
            "write_bytes" => &mut write,
            _ => continue,
        };
        *slot = Some(value.trim().parse::<u64>().map_err(|_| Failure::Malformed)?);
    }
    match (read, write) {
        (Some(read_bytes), Some(write_bytes)) => Ok(Io { read_bytes, write_bytes }),
        _ => Err(Failure::Malformed),
    }
}

/// Counts the entries of an `fd/` directory, giving up past `max`.
pub fn count_fds(dir: &Path, max: usize) -> Result<u64, Failure> {
    let entries = std::fs::read_dir(dir).map_err(|e| Failure::from_io(&e))?;
    let mut count = 0usize;
    for entry in entries {
        // A descriptor closed while listing is simply not counted.
        if entry.is_ok() {
            count += 1;
            if count > max {
                return Err(Failure::TooLarge);
            }
        }
    }
    Ok(count as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::TempDir;

    /// A real line of `/proc/<pid>/stat` (kernel 6.8), its command name replaced by one
    /// with spaces and parentheses, as `prctl(PR_SET_NAME)` allows.
    const STAT: &[u8] = b"48213 (python (w) 3) S 48190 48213 48190 0 -1 4194560 1273634 0 8 0 \
        84213 12077 0 0 20 0 37 0 3581226 19771981824 1284519 18446744073709551615 \
        94360834412544 94360837276533 140734588461040 0 0 0 16386 16781312 1073745102 0 0 0 17 \
        11 0 0 0 0 0 94360838158480 94360838420264 94360850354176 140734588464766 \
        140734588464843 140734588464843 140734588467161 0\n";

    #[test]
    fn small_files_are_opened_by_name_and_read_whole_within_their_bound() {
        let tree = TempDir::new("procfs-dir");
        tree.write("value", "18446744073709551615\n");
        tree.write("full", "x".repeat(8));
        tree.write("over", "x".repeat(9));
        std::os::unix::fs::symlink(tree.path().join("value"), tree.path().join("link")).unwrap();
        let fifo = CString::new(tree.path().join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let dir = Dir::open(tree.path()).unwrap();
        let read = |name: &str, buf: &mut [u8]| -> Result<Vec<u8>, Failure> {
            Ok(read_whole(&dir.open_file(name)?, buf)?.to_vec())
        };
        let mut buf = [0u8; 64];
        assert_eq!(read("value", &mut buf), Ok(b"18446744073709551615\n".to_vec()));
        let mut nine = [0u8; 9];
        assert_eq!(read("full", &mut nine), Ok(b"xxxxxxxx".to_vec()));
        assert_eq!(read("over", &mut nine), Err(Failure::TooLarge));
        assert_eq!(read("gone", &mut buf), Err(Failure::Gone));
        // A link is not followed, and a FIFO neither blocks nor is read.
        assert_eq!(read("link", &mut buf), Err(Failure::Other));
        assert_eq!(read("fifo", &mut buf), Err(Failure::Other));
        // A file held open reads what it holds now, from its start.
        let held = dir.open_file("value").unwrap();
        tree.write("value", "7\n");
        assert_eq!(read_whole(&held, &mut buf), Ok(&b"7\n"[..]));
        assert!(Dir::open(&tree.path().join("value")).is_err(), "a file is no directory");
    }

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        let stat = parse_stat(STAT).unwrap();
        assert_eq!(stat, Stat { utime_ticks: 84213, stime_ticks: 12077, threads: 37, rss_pages: 1284519 });
    }

    #[test]
    fn a_command_name_of_any_bytes_is_skipped() {
        let mut line = b"7 (\xff) ) x\x00) ".to_vec();
        line.extend_from_slice(&STAT[STAT.iter().position(|b| *b == b'S').unwrap()..]);
        assert_eq!(parse_stat(&line).unwrap().threads, 37);
    }

    #[test]
    fn a_short_or_garbled_stat_is_malformed() {
        assert_eq!(parse_stat(b"48213 (python) S 1 2 3"), Err(Failure::Malformed));
        assert_eq!(parse_stat(b"48213 python S"), Err(Failure::Malformed));
        assert_eq!(parse_stat(b""), Err(Failure::Malformed));
        let negative = String::from_utf8_lossy(STAT).replace(" 84213 ", " -5 ");
        assert_eq!(parse_stat(negative.as_bytes()), Err(Failure::Malformed));
    }

    #[test]
    fn io_keeps_the_storage_bytes() {
        let io = b"rchar: 323934931\nwchar: 323929600\nsyscr: 632687\nsyscw: 632675\n\
            read_bytes: 4096\nwrite_bytes: 323932160\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io(io).unwrap(), Io { read_bytes: 4096, write_bytes: 323932160 });
        assert_eq!(parse_io(b"rchar: 1\nwchar: 2\n"), Err(Failure::Malformed));
        assert_eq!(parse_io(b"read_bytes: x\nwrite_bytes: 1\n"), Err(Failure::Malformed));
    }

    #[test]
    fn files_beyond_their_bound_are_refused() {
        let scratch = TempDir::new("procfs-bound");
        let dir = Dir::open(scratch.path()).unwrap();
        let mut buf = [0; MAX_PROC_FILE_BYTES + 1];
        std::fs::write(scratch.path().join("stat"), vec![b'1'; MAX_PROC_FILE_BYTES]).unwrap();
        assert_eq!(dir.read_file("stat", &mut buf).unwrap().len(), MAX_PROC_FILE_BYTES);
        std::fs::write(scratch.path().join("stat"), vec![b'1'; MAX_PROC_FILE_BYTES + 1]).unwrap();
        assert_eq!(dir.read_file("stat", &mut buf), Err(Failure::TooLarge));
        assert_eq!(dir.read_file("missing", &mut buf), Err(Failure::Gone));
    }

    #[test]
    fn descriptors_are_counted_up_to_the_bound() {
        let dir = TempDir::new("procfs-fd");
        for fd in 0..5 {
            dir.write(fd.to_string(), "");
        }
        assert_eq!(count_fds(dir.path(), 5), Ok(5));
        assert_eq!(count_fds(dir.path(), 4), Err(Failure::TooLarge));
        assert_eq!(count_fds(&dir.path().join("none"), 5), Err(Failure::Gone));
    }

    #[test]
    fn this_process_reads_as_the_kernel_writes_it() {
        let proc = Path::new("/proc/self");
        let (dir, mut buf) = (Dir::open(proc).unwrap(), [0; MAX_PROC_FILE_BYTES + 1]);
        let stat = parse_stat(dir.read_file("stat", &mut buf).unwrap()).unwrap();
        assert!(stat.threads >= 1 && stat.rss_pages > 0, "{stat:?}");
        parse_io(dir.read_file("io", &mut buf).unwrap()).unwrap();
        assert!(count_fds(&proc.join("fd"), MAX_OPEN_FDS).unwrap() >= 3);
    }
}
