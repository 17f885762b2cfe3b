//! Neuron hardware health, off the report path. In the order the data flows:
//!
//! - [`sysfs`]: the driver's sysfs tree (ECC counters, unhealthy components, device
//!   state, heartbeat, power, per-core hardware error counters, driver version);
//! - [`kmsg`]: the kernel log (`NEURON_HW_ERR=<NAME>` records, the driver's `neuron:`
//!   error records), followed from `/dev/kmsg` or a regular file;
//! - [`report_signals`]: neuron-monitor's reports (ECC events, hardware execution errors);
//! - [`gpu_readers`]: on a node with NVIDIA GPUs, their collections and NVML's event set
//!   (the kernel log's Xid records come through [`kmsg`]);
//! - [`model`]: the health of each device (healthy / unhealthy / unknown and why),
//!   persisted per boot in the state directory;
//! - [`metrics`]: its Prometheus series; [`telemetry`]: the agent's own
//!   `neuron_agent_health_*`;
//! - [`node`]: with `--node-name`, the Node condition `NeuronHealth` and an Event per
//!   new fault; [`taint`]: the optional NoSchedule taint of a node with a fatal error;
//!   [`device_taint`]: the optional DeviceTaintRule of each unhealthy DRA-managed device;
//! - [`logs`]: with a log group, a JSON event per new fault and per state change in
//!   CloudWatch Logs, one stream per instance;
//! - [`settings`]: the health settings in force (flags, then the node configuration).
//!
//! Each reader runs on a thread of its own (blocking reads, `poll()`), and takes the
//! model's lock only to fold a reading or a batch of records in.

pub mod device_taint;
pub mod gpu_readers;
pub mod kmsg;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod node;
pub mod report_signals;
pub mod settings;
pub mod stop;
pub mod sysfs;
pub mod taint;
pub mod telemetry;

use std::{
    fs,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use api::limits::MAX_HEALTH_STATE_BYTES;
use service::tasks::CriticalTasks;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    kmsg::{Batch, Follower, LookBack, Refusal},
    model::{Changes, HealthModel, Persisted},
    report_signals::MonitorReader,
    stop::Stop,
    sysfs::HeldTree,
    telemetry::HealthMetrics,
};
use crate::{
    ratelimit::{Decision, RateLimit},
    state::NodeState,
    state_dir::{self, open_state_dir, StateFile},
    timed_read::{self, TimedReads},
};

/// The model, shared by the readers and the exposition.
pub type SharedHealth = Arc<Mutex<HealthModel>>;

/// The health state file in the state directory.
pub const STATE_FILE: &str = "neuron-health.json";

/// Where and how often the health signals are read.
#[derive(Clone, Debug)]
pub struct Options {
    /// The sysfs root (`/sys`).
    pub sysfs_root: PathBuf,
    /// `/dev/kmsg`, or a regular file followed as it grows.
    pub kmsg_path: PathBuf,
    /// The proc root: `sys/kernel/random/boot_id` and `uptime` are read there.
    pub proc_root: PathBuf,
    pub state_dir: PathBuf,
    /// Re-read of the whole tree when no `hw_error_event` notification came.
    pub interval: Duration,
    /// A heartbeat unchanged for longer makes its device unknown.
    pub heartbeat_timeout: Duration,
    /// The settings in force: the kernel-log look-back is read at each start of its reader.
    pub settings: settings::SettingsReceiver,
    /// With a GPU collector: what the model reads of the GPUs.
    pub gpus: Option<gpu_readers::GpuInputs>,
}

/// Time between attempts to open a kernel log or sysfs root that is not there.
const RETRY: Duration = Duration::from_secs(10);
/// Longest single wait of a GPU reader (NVML's event wait, a collection), so that it
/// notices the stop; the other readers wait on the stop itself ([`stop::Stop`]).
const TICK: Duration = Duration::from_millis(500);

/// The node state and the count of reports applied to it (`Pipeline::subscribe`).
pub struct Reports {
    pub state: Arc<Mutex<NodeState>>,
    pub applied: watch::Receiver<u64>,
}

/// Starts the readers, as critical tasks of `tasks` (each on a blocking thread of its
/// own: one that ends before `shutdown` stops the agent); they stop with `shutdown`.
/// Call within the tokio runtime. `feed`: where the changes of each update go for the
/// CloudWatch Logs stream.
pub fn start(
    options: Options,
    reports: Reports,
    metrics: HealthMetrics,
    feed: Option<logs::Feed>,
    tasks: &mut CriticalTasks,
    shutdown: CancellationToken,
) -> SharedHealth {
    let boot_id = read_boot_id(&options.proc_root);
    let mut model = HealthModel::new(boot_id.clone().unwrap_or_default(), options.heartbeat_timeout);
    if boot_id.is_none() {
        warn!(proc_root = %options.proc_root.display(), "no boot id: the health state is not persisted across restarts");
    } else if let Some(saved) = load_state(&options.state_dir, &metrics) {
        if model.restore(saved) {
            info!(file = STATE_FILE, "restored the devices' health of this boot");
        }
    }
    model.gpus.expected = options.gpus.is_some();
    model.events_dropped = metrics.events_dropped.clone();
    let saves = model.subscribe_saves();
    let health = Arc::new(Mutex::new(model));
    let stop = Arc::new(Stop::new());
    let writer = Arc::new(StateWriter {
        runtime: tokio::runtime::Handle::current(),
        dir: options.state_dir.clone(),
        enabled: boot_id.is_some(),
        metrics: metrics.clone(),
        log_limit: Mutex::new(RateLimit::new(5, Duration::from_secs(300))),
        failing: AtomicBool::new(false),
    });
    tasks.spawn("health state writer", writer.clone().follow(health.clone(), saves, shutdown.clone()));
    {
        let (stop, shutdown) = (stop.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            stop.set();
        });
    }
    let mut spawn = |name: &'static str, f: Box<dyn FnOnce() + Send>| tasks.adopt(name, tokio::task::spawn_blocking(f));
    let sysfs = SysfsReader {
        options: options.clone(),
        health: health.clone(),
        metrics: metrics.clone(),
        writer: writer.clone(),
        feed: feed.clone(),
        stop: stop.clone(),
        reads: TimedReads::new("health-sysfs-read", timed_read::READ_DEADLINE),
        held: Arc::new(Mutex::new(HeldTree::new(sysfs::held_files_bound()))),
        log_limit: Mutex::new(RateLimit::new(5, Duration::from_secs(300))),
    };
    spawn("health-sysfs", Box::new(move || sysfs.run()));
    if let Some(gpus) = options.gpus.clone() {
        let snapshots = gpu_readers::SnapshotReader {
            snapshots: gpus.snapshots,
            health: health.clone(),
            writer: writer.clone(),
            feed: feed.clone(),
            stop: stop.clone(),
        };
        spawn("health-gpu", Box::new(move || snapshots.run()));
        if gpu_readers::events_supported(gpus.nvml.nvml(), gpus.nvml.gpu_count()) {
            let events = gpu_readers::EventReader {
                nvml: gpus.nvml,
                period: gpus.period,
                health: health.clone(),
                writer: writer.clone(),
                feed: feed.clone(),
                stop: stop.clone(),
            };
            spawn("health-gpu-events", Box::new(move || events.run()));
        } else {
            info!("NVML gives no critical-Xid events on this node: Xids come from the kernel log alone");
        }
    }
    let kernel = KmsgReader {
        options,
        health: health.clone(),
        metrics,
        writer: writer.clone(),
        feed: feed.clone(),
        stop: stop.clone(),
    };
    spawn("health-kmsg", Box::new(move || kernel.run()));
    let monitor = MonitorReader {
        health: health.clone(),
        writer,
        feed,
        shutdown,
        state: reports.state,
        applied: reports.applied,
    };
    spawn("health-monitor", Box::new(move || monitor.run()));
    health
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The boot id (`<proc>/sys/kernel/random/boot_id`): a UUID.
fn read_boot_id(proc_root: &Path) -> Option<String> {
    let text = sysfs::read_small(&proc_root.join("sys/kernel/random/boot_id")).ok().flatten()?;
    let id = text.trim();
    (!id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then(|| id.to_owned())
}

/// Time since boot (`<proc>/uptime`), to which kernel-log timestamps compare.
fn read_uptime(proc_root: &Path) -> Option<Duration> {
    let text = sysfs::read_small(&proc_root.join("uptime")).ok().flatten()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

fn load_state(dir: &Path, metrics: &HealthMetrics) -> Option<Persisted> {
    let path = dir.join(STATE_FILE);
    let meta = fs::symlink_metadata(&path).ok()?;
    let refuse = |why: &str| {
        metrics.refused("state_file");
        warn!(file = %path.display(), why, "ignored the persisted health state");
        None
    };
    if !meta.is_file() {
        return refuse("not a regular file");
    }
    if meta.len() > MAX_HEALTH_STATE_BYTES as u64 {
        return refuse("larger than the limit");
    }
    match fs::read(&path).map(|b| serde_json::from_slice::<Persisted>(&b)) {
        Ok(Ok(saved)) => Some(saved),
        Ok(Err(_)) => refuse("not a health state"),
        Err(_) => refuse("unreadable"),
    }
}

/// Time between attempts to write the health state while it cannot be written (a full
/// or read-only state directory).
const STATE_RETRY: Duration = Duration::from_secs(10);

/// Writes the model's state when it changed: a temporary file, then a rename. A write
/// that fails leaves the model to be written at the next attempt.
struct StateWriter {
    /// For the state directory's checks (async, shared with the configuration writer).
    runtime: tokio::runtime::Handle,
    dir: PathBuf,
    enabled: bool,
    metrics: HealthMetrics,
    log_limit: Mutex<RateLimit>,
    /// The last write failed: retried every [`STATE_RETRY`].
    failing: AtomicBool,
}

impl StateWriter {
    /// Writes the state if it changed since the last write. On a blocking thread.
    fn save(&self, model: &mut HealthModel) {
        if !std::mem::take(&mut model.dirty) || !self.enabled {
            return;
        }
        let body = match serde_json::to_vec(&model.persisted()) {
            Ok(body) => body,
            Err(_) => return,
        };
        // The directory is checked (made if missing) before each write, as for the
        // configuration files.
        let checked = self.runtime.block_on(open_state_dir(&self.dir)).map_err(std::io::Error::other);
        match checked.and_then(|()| write_atomically(&self.dir, STATE_FILE, &body)) {
            Ok(()) => {
                self.failing.store(false, Ordering::Relaxed);
                state_dir::status().written(StateFile::Health);
            }
            Err(e) => {
                model.dirty = true;
                self.failing.store(true, Ordering::Relaxed);
                state_dir::status().failed(StateFile::Health, &self.dir, &e);
                self.metrics.state_write_errors.inc();
                let mut limit = self.log_limit.lock().unwrap_or_else(|p| p.into_inner());
                if let Decision::Allow { suppressed_before } = limit.check() {
                    warn!(error = %e, suppressed_before, "cannot persist the devices' health; retrying");
                }
            }
        }
    }

    /// Writes the state when the model asks (an Event written: a restart must not write
    /// it again), and every [`STATE_RETRY`] while the last write failed, until `shutdown`.
    async fn follow(
        self: Arc<Self>,
        health: SharedHealth,
        mut saves: watch::Receiver<()>,
        shutdown: CancellationToken,
    ) {
        loop {
            let retry = self.failing.load(Ordering::Relaxed);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = saves.changed() => if changed.is_err() { return shutdown.cancelled().await },
                _ = tokio::time::sleep(STATE_RETRY), if retry => {}
            }
            let (writer, health) = (self.clone(), health.clone());
            let saved = tokio::task::spawn_blocking(move || {
                writer.save(&mut health.lock().unwrap_or_else(|p| p.into_inner()));
            });
            let _ = saved.await;
        }
    }
}

fn write_atomically(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    let partial = dir.join(format!(".{name}.{:016x}.partial", fastrand::u64(..)));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&partial)?;
    let written = file.write_all(body).and_then(|()| file.sync_data()).and_then(|()| {
        drop(file);
        fs::rename(&partial, dir.join(name))
    });
    if written.is_err() {
        let _ = fs::remove_file(&partial);
    }
    written
}

/// Announces what an update changed: the faults it found for the first time in the
/// agent's log, and every change to the CloudWatch Logs stream (without waiting).
fn announce(changes: &Changes, model: &HealthModel, feed: Option<&logs::Feed>) {
    log_changes(changes);
    if let Some(feed) = feed {
        feed.send(changes, model);
    }
}

fn log_changes(changes: &Changes) {
    for (device, r) in &changes.new_faults {
        warn!(
            device = device.map(|d| d.to_string()).unwrap_or_default(),
            error = %r.error,
            component = %r.component,
            counter = %r.counter,
            core = r.core.map(|c| c.to_string()).unwrap_or_default(),
            serial = r.serial.as_deref().unwrap_or_default(),
            action = %r.action,
            "Neuron hardware fault"
        );
    }
    if changes.reasons_cleared {
        info!("the Neuron driver was reloaded: the devices' faults are cleared");
    }
    for (gpu, r) in &changes.gpu_faults {
        warn!(gpu, error = %r.error, action = %r.action, source = ?r.source, "NVIDIA GPU fault");
    }
    if changes.gpu_reasons_cleared {
        info!("the NVIDIA driver was reloaded: the GPUs' faults are cleared");
    }
}

struct SysfsReader {
    options: Options,
    health: SharedHealth,
    metrics: HealthMetrics,
    writer: Arc<StateWriter>,
    feed: Option<logs::Feed>,
    stop: Arc<Stop>,
    /// The tree's reads, with their deadline.
    reads: TimedReads,
    /// The tree's files held open from one read to the next.
    held: Arc<Mutex<HeldTree>>,
    log_limit: Mutex<RateLimit>,
}

impl SysfsReader {
    fn run(mut self) {
        let mut trigger = "start";
        while !self.stop.is_set() {
            let (reading, event_files) = self.read_tree();
            self.metrics.sysfs_reads.get_or_create(&telemetry::TriggerLabel { trigger }).inc();
            let stuck = self.reads.stuck();
            self.metrics.sysfs_stuck_reads.set(stuck as i64);
            self.metrics.sysfs_held_files.set(self.held.lock().unwrap_or_else(|p| p.into_inner()).count() as i64);
            self.metrics.source_up(telemetry::SOURCE_SYSFS, reading.driver_loaded && !reading.unreadable && stuck == 0);
            for what in &reading.refused {
                self.metrics.refused(what);
            }
            {
                let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
                model.set_thresholds(&self.options.settings.borrow().thresholds);
                let changes = model.apply_reading(reading, unix_now(), Instant::now());
                announce(&changes, &model, self.feed.as_ref());
                self.writer.save(&mut model);
            }
            trigger = self.wait(event_files);
        }
    }

    /// Reads the tree and opens its `hw_error_event` files, within the read deadline. A
    /// read that misses it blames the file it was on, and is done again without that
    /// file (named unreadable: its device is unknown) — at most once per file that may be
    /// stuck at once. None at all: the tree counts as unreadable.
    fn read_tree(&mut self) -> (sysfs::NodeReading, Vec<fs::File>) {
        let (root, held) = (self.options.sysfs_root.clone(), self.held.clone());
        let (read, missed) = self.reads.run_around_stuck(move |watch| {
            // A read stuck past its deadline keeps the files it took; the next starts
            // without any.
            let lock = || held.lock().unwrap_or_else(|p| p.into_inner());
            let mut files = {
                let mut held = lock();
                let max = held.max();
                std::mem::replace(&mut *held, HeldTree::new(max))
            };
            let reading = sysfs::read_node_watched(&root, watch, &mut files);
            *lock() = files;
            let devices: Vec<u32> = reading.devices.iter().map(|d| d.index).collect();
            (reading, sysfs::open_event_files(&root, &devices, watch))
        });
        for missed in missed {
            self.metrics.sysfs_read_timeouts.inc();
            let mut limit = self.log_limit.lock().unwrap_or_else(|p| p.into_inner());
            if let Decision::Allow { suppressed_before } = limit.check() {
                warn!(?missed, deadline = ?timed_read::READ_DEADLINE, suppressed_before,
                      "a read of the Neuron driver's sysfs tree did not return: the file is skipped, its device unknown");
            }
        }
        read.unwrap_or_else(|_| {
            let unreadable = sysfs::NodeReading { driver_loaded: true, unreadable: true, ..Default::default() };
            (unreadable, Vec::new())
        })
    }

    /// Waits for a `hw_error_event` notification of one of the `files` (POLLPRI: the
    /// driver calls `sysfs_notify`), at most the interval. Regular files (a fake tree)
    /// never notify: the interval re-reads them.
    fn wait(&self, files: Vec<fs::File>) -> &'static str {
        let mut fds: Vec<libc::pollfd> = files
            .iter()
            .map(|f| libc::pollfd { fd: std::os::unix::io::AsRawFd::as_raw_fd(f), events: libc::POLLPRI, revents: 0 })
            .collect();
        let deadline = Instant::now() + self.options.interval;
        loop {
            let now = Instant::now();
            if now >= deadline || self.stop.is_set() {
                return "interval";
            }
            if self.stop.poll(&mut fds, deadline - now) > 0
                && fds.iter().any(|p| p.revents & (libc::POLLPRI | libc::POLLERR) != 0)
            {
                return "event";
            }
        }
    }
}

struct KmsgReader {
    options: Options,
    health: SharedHealth,
    metrics: HealthMetrics,
    writer: Arc<StateWriter>,
    feed: Option<logs::Feed>,
    stop: Arc<Stop>,
}

/// Longest wait of the kernel-log reader for the first reading of the driver's tree:
/// a fault is taken only for a device the tree lists.
const FIRST_READING_WAIT: Duration = Duration::from_secs(10);

impl KmsgReader {
    fn run(self) {
        self.wait_for_the_tree();
        let refusals_logged = Mutex::new(RateLimit::new(5, Duration::from_secs(300)));
        let mut logged_failure = false;
        while !self.stop.is_set() {
            let after_seq = self.health.lock().unwrap_or_else(|p| p.into_inner()).kmsg_seq;
            let follower = Follower {
                path: self.options.kmsg_path.clone(),
                look_back: LookBack {
                    window: self.options.settings.borrow().kmsg_look_back,
                    uptime: read_uptime(&self.options.proc_root),
                    after_seq,
                },
            };
            let outcome = follower.run(&self.stop, |batch| self.take(batch, &refusals_logged));
            self.metrics.source_up(telemetry::SOURCE_KMSG, false);
            match outcome {
                Ok(()) => return,
                Err(e) => {
                    if !std::mem::replace(&mut logged_failure, true) {
                        warn!(path = %self.options.kmsg_path.display(), error = %e,
                              "cannot read the kernel log: its hardware errors are not seen; retrying");
                    }
                }
            }
            self.stop.sleep(RETRY);
        }
    }

    /// Until the sysfs reader has read the tree once and the GPU collector (if any) has
    /// collected once (at most [`FIRST_READING_WAIT`]): the records of the look-back name
    /// devices only the tree and the collection can confirm.
    fn wait_for_the_tree(&self) {
        let until = Instant::now() + FIRST_READING_WAIT;
        while Instant::now() < until && !self.stop.is_set() {
            let model = self.health.lock().unwrap_or_else(|p| p.into_inner());
            if model.read_once && (!model.gpus.expected || model.gpus.collections > 0) {
                return;
            }
            drop(model);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Folds one batch of records into the model; counts what it refused.
    fn take(&self, batch: Batch, refusals_logged: &Mutex<RateLimit>) {
        self.metrics.kmsg_records.inc_by(batch.records);
        self.metrics.kmsg_overruns.inc_by(batch.overruns);
        if batch.too_long > 0 {
            self.metrics.refused_by("kmsg_record_too_long", batch.too_long);
        }
        if batch.refused > 0 {
            self.metrics.refused_by("kmsg_field", batch.refused);
        }
        let mut model = self.health.lock().unwrap_or_else(|p| p.into_inner());
        model.set_thresholds(&self.options.settings.borrow().thresholds);
        let changes = model.apply_events(batch.events, batch.last_seq, unix_now());
        if changes.names_over_limit > 0 {
            self.metrics.refused_by("error_name", changes.names_over_limit);
        }
        let refused = batch.refusals.iter().map(|(seq, r)| (*seq, *r));
        let refused: Vec<(Option<u64>, Refusal)> = refused.chain(changes.refused.iter().map(|r| (None, *r))).collect();
        for (seq, refusal) in &refused {
            self.metrics.kmsg_refused(*refusal);
            let mut limit = refusals_logged.lock().unwrap_or_else(|p| p.into_inner());
            if let Decision::Allow { suppressed_before } = limit.check() {
                warn!(
                    reason = refusal.as_str(),
                    seq = seq.map(|s| s.to_string()).unwrap_or_default(),
                    suppressed_before,
                    "refused a kernel-log record naming a Neuron fault or an Xid: not as the driver writes them"
                );
            }
        }
        announce(&changes, &model, self.feed.as_ref());
        self.writer.save(&mut model);
        if batch.caught_up {
            // Up once the history is in the model and what is written now is read as it
            // comes, not judged by the look-back.
            self.metrics.source_up(telemetry::SOURCE_KMSG, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(dir: PathBuf, runtime: &tokio::runtime::Runtime) -> StateWriter {
        StateWriter {
            runtime: runtime.handle().clone(),
            dir,
            enabled: true,
            metrics: HealthMetrics::default(),
            log_limit: Mutex::new(RateLimit::new(5, Duration::from_secs(300))),
            failing: AtomicBool::new(false),
        }
    }

    fn faulty_model() -> HealthModel {
        let mut model = HealthModel::with_ready_devices(2);
        let event = kmsg::kernel_event("NEURON_HW_ERR=DMA_ERROR nd-id=1").unwrap();
        model.apply_events(vec![(Some(9), event)], Some(9), 1);
        model
    }

    #[test]
    fn the_state_is_written_only_into_a_checked_directory() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let base = crate::testdata::TempDir::new("health-state");
        let (real, link) = (base.path().join("real"), base.path().join("link"));
        fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();

        // Through a symbolic link: refused, counted, nothing written.
        let through_link = writer(link, &runtime);
        let mut model = faulty_model();
        through_link.save(&mut model);
        assert_eq!(through_link.metrics.state_write_errors.get(), 1);
        assert_eq!(fs::read_dir(&real).unwrap().count(), 0);
        assert!(model.dirty && through_link.failing.load(Ordering::Relaxed), "written again at the next attempt");

        let direct = writer(real.clone(), &runtime);
        let mut model = faulty_model();
        direct.save(&mut model);
        assert_eq!(direct.metrics.state_write_errors.get(), 0);
        let saved = load_state(&real, &direct.metrics).expect("written and readable");
        assert_eq!((saved.kmsg_seq, saved.devices.len()), (Some(9), 2), "the devices the tree listed");
        assert!(!model.dirty, "written once");
    }
}
