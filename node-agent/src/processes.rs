//! The Neuron applications' own processes: CPU time, resident memory, threads, open
//! descriptors and storage I/O of each runtime's PID, from `<proc root>/<pid>/`.
//!
//! Read off the report path: a task woken after each applied report takes the runtimes'
//! PIDs (bounded by the runtimes of a report), reads their files on a blocking thread and
//! replaces the [`SharedProcesses`] table the exposition joins to the runtimes. A runtime
//! gone from the state is gone from the exposition at once; its PID leaves the table at
//! the next read. A file that cannot be read (a process gone, another user's `io`) leaves
//! its series out and is counted, logged at debug level only: it can repeat every period.

pub mod procfs;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::state::NodeState;
use procfs::{Failure, MAX_OPEN_FDS, MAX_PROC_FILE_BYTES};

/// What `/proc` said of one process at the latest read; `None` where its file gave nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// user, system seconds.
    pub cpu_seconds: Option<[f64; 2]>,
    pub resident_bytes: Option<f64>,
    pub threads: Option<f64>,
    pub open_fds: Option<f64>,
    /// read, write bytes.
    pub io_bytes: Option<[f64; 2]>,
}

/// The latest read, by PID.
pub type SharedProcesses = Arc<Mutex<BTreeMap<u32, ProcessSample>>>;

/// How long a PID found gone is not looked up again while the reports still list it.
/// A process that exited does not come back: until neuron-monitor drops its runtime (or
/// where the agent cannot see the applications' PIDs at all), looking it up at each report
/// would cost a failed `/proc` lookup each time. After this, a new process that took the
/// PID is read.
pub const GONE_RECHECK: Duration = Duration::from_secs(60);

/// PIDs whose `/proc` directory was gone at a read, and since when.
#[derive(Debug, Default)]
pub struct GonePids(BTreeMap<u32, Instant>);

impl GonePids {
    /// Forgets the PIDs no longer listed and those found gone [`GONE_RECHECK`] ago.
    fn keep_listed(&mut self, pids: &[u32], now: Instant) {
        let before = std::mem::take(&mut self.0);
        self.0 =
            pids.iter().filter_map(|pid| Some((*pid, *before.get(pid)?))).filter(|(_, t)| fresh(*t, now)).collect();
    }

    /// Whether every one of `pids` is remembered gone: a read would read nothing.
    fn cover(&self, pids: &[u32], now: Instant) -> bool {
        pids.iter().all(|pid| self.0.get(pid).is_some_and(|t| fresh(*t, now)))
    }
}

fn fresh(found_gone: Instant, now: Instant) -> bool {
    now.duration_since(found_gone) < GONE_RECHECK
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub file: &'static str,
    pub reason: &'static str,
}

/// `neuron_agent_process_*`.
#[derive(Clone)]
pub struct ProcessMetrics {
    pub failures: Family<FailureLabels, Counter>,
    pub read_seconds: Gauge<f64, AtomicU64>,
}

impl ProcessMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ProcessMetrics { failures: Family::default(), read_seconds: Gauge::default() };
        registry.register(
            "neuron_agent_process_read_failures",
            "Files of the applications' processes that gave no value (file: stat, io, fd; reason: gone, denied, \
             too_large, malformed, other); their series are left out",
            metrics.failures.clone(),
        );
        registry.register(
            "neuron_agent_process_read_seconds",
            "Time the latest read of the applications' /proc files took",
            metrics.read_seconds.clone(),
        );
        metrics
    }
}

/// Reads the files of a set of PIDs.
pub struct ProcReader {
    pub proc_root: PathBuf,
    /// `sysconf(_SC_CLK_TCK)` and `sysconf(_SC_PAGESIZE)`; `None` if the system did not say.
    pub clock_ticks: Option<f64>,
    pub page_size: Option<f64>,
    pub metrics: ProcessMetrics,
}

impl ProcReader {
    pub fn new(proc_root: PathBuf, metrics: ProcessMetrics) -> Self {
        let sysconf = |name| {
            // SAFETY: sysconf reads a constant of the system; no memory is passed.
            let value = unsafe { libc::sysconf(name) };
            (value > 0).then_some(value as f64)
        };
        let (clock_ticks, page_size) = (sysconf(libc::_SC_CLK_TCK), sysconf(libc::_SC_PAGESIZE));
        if clock_ticks.is_none() || page_size.is_none() {
            warn!(?clock_ticks, ?page_size, "the system gives no clock tick or page size: no CPU or memory series");
        }
        ProcReader { proc_root, clock_ticks, page_size, metrics }
    }

    /// Reads the files of every PID but those `gone` holds; the table of the ones that
    /// gave anything. `gone` keeps the PIDs still listed in `pids`, gains those found
    /// gone, and lets go of each after [`GONE_RECHECK`].
    pub fn read_all(&self, pids: &[u32], gone: &mut GonePids) -> BTreeMap<u32, ProcessSample> {
        let started = Instant::now();
        gone.keep_listed(pids, started);
        let mut table = BTreeMap::new();
        for &pid in pids {
            if gone.0.contains_key(&pid) {
                continue;
            }
            match self.read(pid) {
                Ok(sample) if sample != ProcessSample::default() => {
                    table.insert(pid, sample);
                }
                Err(Failure::Gone) => {
                    gone.0.insert(pid, started);
                }
                _ => {}
            }
        }
        self.metrics.read_seconds.set(started.elapsed().as_secs_f64());
        table
    }

    /// Reads one process's files, by name in its directory: a process that exited since
    /// the report costs one failed lookup, not one per file. `Err`: its directory could
    /// not be opened (counted as each file's failure).
    pub fn read(&self, pid: u32) -> Result<ProcessSample, Failure> {
        let path = self.proc_root.join(pid.to_string());
        let mut sample = ProcessSample::default();
        let dir = match procfs::Dir::open(&path) {
            Ok(dir) => dir,
            Err(e) => {
                let failure = Failure::from_io(&e);
                for file in ["stat", "io", "fd"] {
                    self.value::<()>(pid, file, Err(failure));
                }
                return Err(failure);
            }
        };
        let mut buf = [0; MAX_PROC_FILE_BYTES + 1];
        let stat = dir.read_file("stat", &mut buf).and_then(procfs::parse_stat);
        if let Some(stat) = self.value(pid, "stat", stat) {
            sample.cpu_seconds =
                self.clock_ticks.map(|hz| [stat.utime_ticks as f64 / hz, stat.stime_ticks as f64 / hz]);
            sample.resident_bytes = self.page_size.map(|size| stat.rss_pages as f64 * size);
            sample.threads = Some(stat.threads as f64);
        }
        let io = dir.read_file("io", &mut buf).and_then(procfs::parse_io);
        sample.io_bytes = self.value(pid, "io", io).map(|io| [io.read_bytes as f64, io.write_bytes as f64]);
        let fds = procfs::count_fds(&path.join("fd"), MAX_OPEN_FDS);
        sample.open_fds = self.value(pid, "fd", fds).map(|n| n as f64);
        Ok(sample)
    }

    /// The value, or `None` with the failure counted.
    fn value<T>(&self, pid: u32, file: &'static str, read: Result<T, Failure>) -> Option<T> {
        match read {
            Ok(value) => Some(value),
            Err(failure) => {
                let reason = failure.as_str();
                self.metrics.failures.get_or_create(&FailureLabels { file, reason }).inc();
                debug!(pid, file, reason, "a process file gave no value");
                None
            }
        }
    }
}

/// Re-reads the runtimes' processes after each applied report, until `shutdown`.
pub async fn follow(
    reader: ProcReader,
    state: Arc<Mutex<NodeState>>,
    mut applied: watch::Receiver<u64>,
    table: SharedProcesses,
    shutdown: CancellationToken,
) {
    let reader = Arc::new(reader);
    let mut gone = GonePids::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
        }
        let pids: Vec<u32> = {
            let state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.runtimes.iter().filter_map(|rt| rt.pid).collect()
        };
        if gone.cover(&pids, Instant::now()) {
            table.lock().unwrap_or_else(|p| p.into_inner()).clear();
            continue;
        }
        let reader = reader.clone();
        // Reports that arrive meanwhile wake this loop once: one read per report at most.
        match tokio::task::spawn_blocking(move || (reader.read_all(&pids, &mut gone), gone)).await {
            Ok((read, still_gone)) => {
                *table.lock().unwrap_or_else(|p| p.into_inner()) = read;
                gone = still_gone;
            }
            Err(e) => {
                warn!(error = %e, "reading the applications' processes failed");
                gone = GonePids::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::TempDir;

    fn reader(root: &TempDir) -> ProcReader {
        ProcReader::new(root.path().to_owned(), ProcessMetrics::register(&mut Registry::default()))
    }

    fn gone_stats(reader: &ProcReader) -> u64 {
        reader.metrics.failures.get_or_create(&FailureLabels { file: "stat", reason: "gone" }).get()
    }

    #[test]
    fn a_gone_pid_is_not_looked_up_again_while_listed_until_the_recheck() {
        let root = TempDir::new("procs-gone");
        let reader = reader(&root);
        let mut gone = GonePids::default();
        assert!(reader.read_all(&[7, 8], &mut gone).is_empty());
        assert_eq!(gone_stats(&reader), 2, "each counted once when found gone");
        assert!(gone.cover(&[8, 7], Instant::now()) && !gone.cover(&[7, 9], Instant::now()));
        // A process that took PID 7 is not read while 7 is remembered gone.
        root.write("7/stat", "7 (serve) S 1 1 1 0 -1 0 0 0 0 0 5 1 0 0 20 0 3 0 1 1 9\n");
        assert!(reader.read_all(&[7, 8], &mut gone).is_empty());
        assert_eq!(gone_stats(&reader), 2, "not looked up again");
        // Dropped by the report, then listed again: read at once.
        reader.read_all(&[8], &mut gone);
        let table = reader.read_all(&[7, 8], &mut gone);
        assert_eq!(table.get(&7).and_then(|s| s.threads), Some(3.0));
        assert_eq!(gone_stats(&reader), 2, "8 still remembered");
        // After the recheck, still listed: looked up again.
        for since in gone.0.values_mut() {
            *since = since.checked_sub(GONE_RECHECK).expect("a clock older than a minute");
        }
        reader.read_all(&[7, 8], &mut gone);
        assert_eq!(gone_stats(&reader), 3);
        assert_eq!(gone.0.keys().collect::<Vec<_>>(), [&8]);
    }
}
