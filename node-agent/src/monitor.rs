//! Runs neuron-monitor as a child process and keeps it running: restarts it with capped
//! exponential backoff when it exits, is killed, or stays silent too long, and when its
//! launch spec changes: at once, unless changes come faster than [`CONFIG_RESTARTS`]
//! allows (a tenant editing its config in a loop must not stop every tenant's reports on
//! the node), then at the pace's next slot with the newest spec. Nothing the child does
//! can stop the agent. The child leads a process group of its own, stopped as a whole
//! (see [`group`]).

pub mod group;
pub mod lines;

use std::{
    path::PathBuf,
    process::{ExitStatus, Stdio},
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::AsyncRead,
    process::{Child, ChildStdout, Command},
    sync::watch,
    time::{sleep, sleep_until, timeout, Instant},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    pipeline::{Pipeline, Rejection},
    ratelimit::{Decision, RateLimit},
    telemetry::{AgentMetrics, ReasonLabel, StderrLabel},
};
use group::Group;
use lines::{Frame, LineReader};

/// Time the first report of a run gets beyond the silence limit.
pub const FIRST_REPORT_GRACE: Duration = Duration::from_secs(10);

/// Restarts for a new configuration: a burst of 3, then one every 10 s. A restart costs
/// every config on the node about one report; at this pace a config changed without end
/// costs them at most one report in ten seconds, and a few edits in a row still apply at once.
pub const CONFIG_RESTARTS: (u32, Duration) = (3, Duration::from_secs(30));

/// How to start neuron-monitor. A new value sent on the watch channel restarts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Kill and restart the child when no report arrives for this long.
    pub silence_limit: Duration,
}

#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    pub max_line_bytes: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Time between SIGTERM and SIGKILL when stopping the child.
    pub stop_grace: Duration,
}

/// Why a run of the child ended.
#[derive(Debug)]
enum RunEnd {
    Exited(Option<ExitStatus>),
    Silent,
    SpawnFailed(std::io::Error),
    ConfigChanged,
    Shutdown,
}

impl RunEnd {
    fn reason(&self) -> &'static str {
        match self {
            RunEnd::Exited(_) => "exited",
            RunEnd::Silent => "silent",
            RunEnd::SpawnFailed(_) => "spawn_failed",
            RunEnd::ConfigChanged => "config_changed",
            RunEnd::Shutdown => "shutdown",
        }
    }
}

pub struct Supervisor {
    pub config: SupervisorConfig,
    pub pipeline: Arc<Pipeline>,
    pub metrics: AgentMetrics,
}

impl Supervisor {
    /// Runs until `shutdown` is cancelled, then stops the child and returns.
    pub async fn run(self, spec: watch::Receiver<LaunchSpec>, shutdown: CancellationToken) {
        group::adopt_orphans();
        let mut backoff = Backoff::new(self.config.backoff_initial, self.config.backoff_max);
        let (burst, per) = CONFIG_RESTARTS;
        let mut spec = SpecChanges { specs: spec, pace: RateLimit::new(burst, per), metrics: self.metrics.clone() };
        let forker = match Forker::start() {
            Ok(forker) => forker,
            Err(e) => {
                // The supervisor ends: a critical task, so the agent exits and is restarted.
                warn!(error = %e, "could not start the thread neuron-monitor is forked from");
                return;
            }
        };
        loop {
            let current = spec.specs.borrow_and_update().clone();
            let started = Instant::now();
            let (end, reports) = self.run_once(&forker, &current, &mut spec, &shutdown).await;
            self.metrics.monitor_up.set(0);
            if matches!(end, RunEnd::Shutdown) {
                return;
            }
            self.metrics.monitor_restarts.get_or_create(&ReasonLabel { reason: end.reason() }).inc();
            if matches!(end, RunEnd::ConfigChanged) {
                info!(program = %current.program.display(), "restarting neuron-monitor on a new configuration");
                backoff.reset();
                continue;
            }
            // A run that delivered reports for longer than the longest backoff was
            // healthy: the next failure starts the backoff anew.
            if reports > 0 && started.elapsed() >= self.config.backoff_max {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            self.metrics.monitor_backoff_seconds.set(delay.as_secs_f64());
            match &end {
                RunEnd::Exited(status) => warn!(
                    status = status.map(|s| s.to_string()).unwrap_or_default(),
                    reports,
                    restart_in_ms = delay.as_millis() as u64,
                    "neuron-monitor exited"
                ),
                RunEnd::Silent => warn!(
                    silence_limit_ms = current.silence_limit.as_millis() as u64,
                    restart_in_ms = delay.as_millis() as u64,
                    "neuron-monitor sent no report in time; killed it"
                ),
                RunEnd::SpawnFailed(e) => warn!(
                    program = %current.program.display(),
                    error = %e,
                    restart_in_ms = delay.as_millis() as u64,
                    "could not start neuron-monitor"
                ),
                RunEnd::ConfigChanged | RunEnd::Shutdown => {}
            }
            tokio::select! {
                _ = sleep(delay) => {}
                _ = changed(&mut spec.specs) => {}
                _ = shutdown.cancelled() => return,
            }
            self.metrics.monitor_backoff_seconds.set(0.0);
        }
    }

    /// One life of the child. Returns why it ended and how many reports it delivered.
    async fn run_once(
        &self,
        forker: &Forker,
        spec: &LaunchSpec,
        spec_changes: &mut SpecChanges,
        shutdown: &CancellationToken,
    ) -> (RunEnd, u64) {
        let mut child = match forker.spawn(spec).await {
            Ok(child) => child,
            Err(e) => return (RunEnd::SpawnFailed(e), 0),
        };
        let group = Group::new(&child);
        self.metrics.monitor_up.set(1);
        info!(pid = child.id().unwrap_or(0), program = %spec.program.display(), args = ?spec.args, "started neuron-monitor");
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_stderr(stderr, self.metrics.clone()));
        }
        let (end, reports) = match child.stdout.take() {
            Some(stdout) => {
                widen_pipe(&stdout);
                self.follow(&mut child, stdout, spec, spec_changes, shutdown).await
            }
            None => (RunEnd::Exited(None), 0),
        };
        self.stop(group, &mut child).await;
        (end, reports)
    }

    /// Reads the child's reports until its run ends.
    async fn follow(
        &self,
        child: &mut Child,
        stdout: impl AsyncRead + Unpin,
        spec: &LaunchSpec,
        spec_changes: &mut SpecChanges,
        shutdown: &CancellationToken,
    ) -> (RunEnd, u64) {
        let mut lines = LineReader::new(stdout, self.config.max_line_bytes);
        let mut reports = 0u64;
        // neuron-monitor lists the devices and starts its collectors before its first
        // report: a loaded node must not have it killed for that.
        let mut deadline = Instant::now() + spec.silence_limit + FIRST_REPORT_GRACE;
        // Pinned across the loop: a change seen while its restart waits for the pace
        // must not be forgotten when a report arrives meanwhile.
        let restart = spec_changes.restart_due();
        tokio::pin!(restart);
        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break RunEnd::Shutdown,
                _ = &mut restart => break RunEnd::ConfigChanged,
                _ = sleep_until(deadline) => break RunEnd::Silent,
                frame = lines.next() => match frame {
                    Ok(Some(Frame::Line(line))) => {
                        if self.pipeline.handle_line(line) {
                            reports += 1;
                            deadline = Instant::now() + spec.silence_limit;
                        }
                    }
                    Ok(Some(Frame::Oversized(len))) => {
                        self.pipeline.reject(Rejection::Oversized, &format!("{len} bytes"));
                    }
                    Ok(Some(Frame::Unterminated(len))) => {
                        self.pipeline.reject(Rejection::Truncated, &format!("{len} bytes before the end of output"));
                    }
                    Ok(None) | Err(_) => {
                        // Output closed: the child is exiting. Give it a moment to be reaped.
                        let status = timeout(self.config.stop_grace, child.wait()).await.ok().and_then(Result::ok);
                        break RunEnd::Exited(status);
                    }
                },
                // After the output (biased): what the child wrote before exiting is read
                // first. Its exit ends the run even when a descendant still holds the
                // output open.
                status = child.wait() => break RunEnd::Exited(status.ok()),
            }
        };
        (end, reports)
    }

    /// Stops the child and everything in its process group; counts what it took.
    async fn stop(&self, group: Option<Group>, child: &mut Child) {
        let Some(group) = group else {
            return stop(child, self.config.stop_grace).await;
        };
        let stopped = group.stop(child, self.config.stop_grace).await;
        if stopped.left_descendants {
            self.metrics.monitor_orphans.inc();
            warn!("neuron-monitor exited and left processes of its group running; stopping them");
        }
        if stopped.killed {
            self.metrics.monitor_kills.inc();
            warn!(
                grace_ms = self.config.stop_grace.as_millis() as u64,
                "neuron-monitor's group outlived SIGTERM; killed it"
            );
        }
    }
}

/// The launch specs of the configurations put in force, with the pace of the restarts
/// they cause.
struct SpecChanges {
    specs: watch::Receiver<LaunchSpec>,
    pace: RateLimit,
    metrics: AgentMetrics,
}

impl SpecChanges {
    /// Resolves when the running child should make way for a new spec: at once while the
    /// pace allows, else at its next slot. Specs sent meanwhile are coalesced: the
    /// newest is the one started.
    async fn restart_due(&mut self) {
        changed(&mut self.specs).await;
        let wait = self.pace.wait();
        if !wait.is_zero() {
            self.metrics.monitor_restarts_paced.inc();
            info!(
                wait_ms = wait.as_millis() as u64,
                "configuration changes come fast; neuron-monitor restarts when the pace allows"
            );
            sleep(wait).await;
        }
        self.pace.check();
    }
}

/// Resolves when a new spec arrives; never, once nobody can send one.
async fn changed(spec: &mut watch::Receiver<LaunchSpec>) {
    if spec.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

type ForkRequest = (Command, tokio::sync::oneshot::Sender<std::io::Result<Child>>);

/// The thread neuron-monitor is forked from, alive as long as the supervisor.
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, not the
/// process, and the runtime's threads come and go: a worker that ran `block_in_place`
/// (every report) later retires as an idle blocking thread, and neuron-monitor was
/// SIGKILLed with it, tens of seconds after a quiet spell.
struct Forker(std::sync::mpsc::Sender<ForkRequest>);

impl Forker {
    /// Starts the thread; it ends when the forker is dropped.
    fn start() -> std::io::Result<Forker> {
        let (tx, rx) = std::sync::mpsc::channel::<ForkRequest>();
        // Spawned children need the runtime's reactor (pipes, exit notification).
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new().name("monitor-forker".into()).spawn(move || {
            let _runtime = runtime.enter();
            for (mut command, reply) in rx {
                let _ = reply.send(command.spawn());
            }
        })?;
        Ok(Forker(tx))
    }

    async fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Child> {
        let gone = || std::io::Error::other("the thread neuron-monitor is forked from is gone");
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.0.send((command(spec), reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Room in the pipe from neuron-monitor for a whole large report (the recorded 32-runtime
/// trn1n.32xlarge writes 440 kB a line; a pipe holds 64 KiB by default): the child writes
/// it at once and the agent wakes once for it, where both woke for every 64 KiB. The
/// kernel caps it at `fs.pipe-max-size` (1 MiB by default); where it refuses, the default
/// stays.
const PIPE_BYTES: libc::c_int = 1 << 20;

fn widen_pipe(stdout: &ChildStdout) {
    use std::os::fd::AsRawFd;
    #[cfg(target_os = "linux")]
    // SAFETY: F_SETPIPE_SZ on the pipe's descriptor, which `stdout` owns; no memory passed.
    if unsafe { libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) } < 0 {
        debug!(error = %std::io::Error::last_os_error(), "the pipe from neuron-monitor keeps its default size");
    }
}

fn command(spec: &LaunchSpec) -> Command {
    let mut command = Command::new(&spec.program);
    command.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    // A group of its own: whatever it forks is signalled with it.
    command.process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child
    // when the agent dies, so that no orphaned neuron-monitor outlives it.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// SIGTERM, then SIGKILL after `grace`; always reaps the child. For a child whose group
/// is not known (its PID was not).
async fn stop(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = child.id() {
        // SAFETY: sending a signal to our own child's PID, which is not reaped yet
        // (so not reused).
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// Forwards the child's stderr to the agent's logs, rate-limited.
async fn forward_stderr(stderr: impl AsyncRead + Unpin, metrics: AgentMetrics) {
    let mut lines = LineReader::new(stderr, 16 * 1024);
    let mut limit = RateLimit::new(20, Duration::from_secs(10));
    while let Ok(Some(frame)) = lines.next().await {
        let text = match frame {
            Frame::Line(l) => String::from_utf8_lossy(l).into_owned(),
            Frame::Oversized(n) => format!("<{n} bytes of stderr skipped>"),
            Frame::Unterminated(_) => continue,
        };
        let outcome = match limit.check() {
            Decision::Allow { suppressed_before } => {
                warn!(target: "neuron_monitor", suppressed_before, "{text}");
                "logged"
            }
            Decision::Suppress => "suppressed",
        };
        metrics.monitor_stderr_lines.get_or_create(&StderrLabel { outcome }).inc();
    }
}

/// Capped exponential backoff with ±20% jitter, so that agents restarted together do
/// not retry in lockstep.
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, next: initial }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }

    fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        base.mul_f64(0.8 + 0.4 * fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let delays: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        for (delay, base) in delays.iter().zip([100, 200, 400, 500, 500]) {
            assert!(*delay >= base * 8 / 10 && *delay <= base * 12 / 10, "{delays:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(120));
    }

    #[tokio::test]
    async fn the_pipe_from_the_child_holds_a_large_report_where_the_kernel_allows_it() {
        use std::os::fd::AsRawFd;
        let spec = LaunchSpec { program: "true".into(), args: Vec::new(), silence_limit: Duration::from_secs(1) };
        let mut child = command(&spec).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        widen_pipe(&stdout);
        // SAFETY: F_GETPIPE_SZ on the pipe's descriptor, which `stdout` owns.
        let size = unsafe { libc::fcntl(stdout.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let allowed: i64 = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap().trim().parse().unwrap();
        assert_eq!(size, if allowed >= i64::from(PIPE_BYTES) { PIPE_BYTES } else { 64 * 1024 });
        child.wait().await.unwrap();
    }
}
