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
    time::Instant,
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

    /// Reads every PID's files; the table of the ones that gave anything.
    pub fn read_all(&self, pids: &[u32]) -> BTreeMap<u32, ProcessSample> {
        let started = Instant::now();
        let table = pids.iter().map(|pid| (*pid, self.read(*pid))).filter(|(_, s)| *s != ProcessSample::default());
        let table = table.collect();
        self.metrics.read_seconds.set(started.elapsed().as_secs_f64());
        table
    }

    /// Reads one process's files, by name in its directory: a process that exited since
    /// the report costs one failed lookup, not one per file.
    pub fn read(&self, pid: u32) -> ProcessSample {
        let path = self.proc_root.join(pid.to_string());
        let mut sample = ProcessSample::default();
        let dir = match procfs::Dir::open(&path) {
            Ok(dir) => dir,
            Err(e) => {
                let failure = Failure::from_io(&e);
                for file in ["stat", "io", "fd"] {
                    self.value::<()>(pid, file, Err(failure));
                }
                return sample;
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
        sample
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
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
        }
        let pids: Vec<u32> = {
            let state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.runtimes.iter().filter_map(|rt| rt.pid).collect()
        };
        let reader = reader.clone();
        // Reports that arrive meanwhile wake this loop once: one read per report at most.
        match tokio::task::spawn_blocking(move || reader.read_all(&pids)).await {
            Ok(read) => *table.lock().unwrap_or_else(|p| p.into_inner()) = read,
            Err(e) => warn!(error = %e, "reading the applications' processes failed"),
        }
    }
}
