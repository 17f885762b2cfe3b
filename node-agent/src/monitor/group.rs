//! neuron-monitor's process group. The monitor runs as the leader of a group of its
//! own, so that whatever it forks is stopped with it: SIGTERM to the whole group, then
//! SIGKILL after the grace, and adopted orphans of the group are reaped.
//!
//! The kernel kills the monitor itself when the agent dies (`PR_SET_PDEATHSIG`), but not
//! its descendants. A guard does: a second process (the agent binary started with
//! [`GUARD_ARG`]) that reads a pipe from the agent and SIGKILLs the group when the pipe
//! closes without the agent having stopped it first, which happens only when the agent
//! died (even by SIGKILL: the kernel closes the dead agent's end). A descendant that
//! leaves the group (`setsid`, `setpgid`) escapes both.

use std::{io::Read, process::Stdio, time::Duration};

use tokio::{
    process::{Child, Command},
    time::{sleep, timeout, Instant},
};
use tracing::warn;

/// First argument that makes the agent binary run as a group guard: `<agent> GUARD_ARG <pgid>`.
pub const GUARD_ARG: &str = "--internal-monitor-group-guard";

/// How often a stopping group is checked for remaining members.
const POLL: Duration = Duration::from_millis(20);
/// How long the kernel and the reaper (the agent, init or containerd-shim) get to clear
/// a group after SIGKILL.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Runs the guard when the process was started as one; returns its exit code. `None`:
/// this is the agent.
pub fn run_guard_if_requested() -> Option<i32> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != GUARD_ARG {
        return None;
    }
    let pgid = args.next().and_then(|a| a.to_str()?.parse::<libc::pid_t>().ok()).filter(|p| *p > 1);
    let Some(pgid) = pgid else {
        eprintln!("{GUARD_ARG}: expected the process group to guard");
        return Some(2);
    };
    // A read returns 0 only when the agent closed its end: by stopping the guard with
    // SIGKILL first (then this never runs) or by dying.
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // SAFETY: kill(2) with a negative PID signals the group; no memory is involved.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    Some(0)
}

/// Makes the agent the reaper of the monitor's orphaned descendants (instead of init,
/// which may reap late), so that a stopped group is gone at once. Other orphans that
/// would come to the agent are left alone by [`reap_adopted`]; none are expected.
pub fn adopt_orphans() {
    // SAFETY: prctl with an integer argument; no memory is involved.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == -1 {
        warn!(error = %std::io::Error::last_os_error(), "could not become the reaper of neuron-monitor's descendants");
    }
}

/// The running monitor's group and its guard.
pub struct Group {
    pgid: libc::pid_t,
    guard: Option<Child>,
}

impl Group {
    /// Follows the group led by the just started `monitor` and starts its guard. Without
    /// a guard (it could not start) the group is still stopped with the monitor, but not
    /// when the agent is killed.
    pub fn new(monitor: &Child) -> Option<Group> {
        let pgid = libc::pid_t::try_from(monitor.id()?).ok()?;
        let guard = match spawn_guard(pgid) {
            Ok(guard) => Some(guard),
            Err(e) => {
                warn!(error = %e, "could not start the monitor's group guard: its descendants would outlive a killed agent");
                None
            }
        };
        Some(Group { pgid, guard })
    }

    /// Some process of the group still exists (a zombie counts until it is reaped).
    fn has_members(&self) -> bool {
        // SAFETY: signal 0 only checks that the group exists.
        unsafe { libc::kill(-self.pgid, 0) == 0 }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: the group is led by our child: its PID, hence the group ID, is not
        // reused while the child is unreaped or any member lives (see `has_members`).
        unsafe {
            libc::kill(-self.pgid, signal);
        }
    }

    /// Stops the whole group: SIGTERM, SIGKILL for what is left after `grace`; reaps the
    /// monitor (and adopted members) and then stops the guard. Returns what it took.
    pub async fn stop(mut self, monitor: &mut Child, grace: Duration) -> Stopped {
        let mut stopped = Stopped { left_descendants: false, killed: false };
        // The monitor is reaped first: until then it keeps the group alive as a zombie.
        let monitor_exited = matches!(monitor.try_wait(), Ok(Some(_)));
        if monitor_exited {
            reap_adopted(self.pgid);
            stopped.left_descendants = self.has_members();
        }
        let deadline = Instant::now() + grace;
        self.signal(libc::SIGTERM);
        if !monitor_exited {
            let _ = tokio::time::timeout_at(deadline, monitor.wait()).await;
        }
        if !self.wait_empty(deadline).await {
            stopped.killed = true;
            self.signal(libc::SIGKILL);
            let _ = monitor.wait().await;
            if !self.wait_empty(Instant::now() + AFTER_KILL).await {
                warn!(pgid = self.pgid, "processes of neuron-monitor's group survived SIGKILL");
            }
        }
        // Only now: a guard killed earlier could not act if the agent died meanwhile.
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.start_kill();
            let _ = timeout(AFTER_KILL, guard.wait()).await;
        }
        stopped
    }

    /// Waits until the group is gone (reaping what the agent adopted); false at `deadline`.
    async fn wait_empty(&self, deadline: Instant) -> bool {
        loop {
            reap_adopted(self.pgid);
            if !self.has_members() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            sleep(POLL).await;
        }
    }
}

/// What stopping a group took.
pub struct Stopped {
    /// The monitor had exited, other processes of its group had not.
    pub left_descendants: bool,
    /// SIGTERM was not enough within the grace.
    pub killed: bool,
}

fn spawn_guard(pgid: libc::pid_t) -> std::io::Result<Child> {
    // The running binary, even if its file was replaced since.
    let mut command = Command::new("/proc/self/exe");
    command
        .arg(GUARD_ARG)
        .arg(pgid.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    // SAFETY: signal(2) is async-signal-safe. The guard ignores the signals a terminal
    // or a container runtime sends to the agent's group: it must outlive the agent.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(signal, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Reaps the agent's children that belong to `pgid` without being the ones tokio
/// waits for (the monitor, the guard): descendants of the monitor re-parented to the
/// agent (see [`adopt_orphans`]). Other children (from libraries) are never touched.
fn reap_adopted(pgid: libc::pid_t) {
    // SAFETY: getpid has no preconditions.
    let own = unsafe { libc::getpid() };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{own}/task")) else { return };
    for task in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else { continue };
        for pid in children.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()) {
            // The leader is the monitor itself, which tokio reaps.
            if pid != pgid && process_group_of(pid) == Some(pgid) {
                // SAFETY: WNOHANG on one specific child of ours, which nothing else waits for.
                unsafe {
                    libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
                }
            }
        }
    }
}

/// The process group of `pid`, from `/proc/<pid>/stat` (field 5, after the command name).
fn process_group_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_is_read_from_stat() {
        // SAFETY: no preconditions.
        let (pid, pgid) = unsafe { (libc::getpid(), libc::getpgrp()) };
        assert_eq!(process_group_of(pid), Some(pgid));
        assert_eq!(process_group_of(-5), None);
    }
}
