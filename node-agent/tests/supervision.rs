//! The real agent binary supervising the simulator: restarts, silence, bad output,
//! runtimes leaving, shutdown.

mod support;

use std::time::{Duration, Instant};

use neuron_test_support::{fixture, fixture_path, TRN1N_32};
use support::{alive, Agent, TempDir};

const FAST: &[&str] = &["--period", "200ms", "--restart-backoff-initial", "200ms", "--restart-backoff-max", "3s"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    FAST.iter().copied().chain(extra.iter().copied()).collect()
}

#[test]
fn a_crashing_monitor_is_restarted_with_growing_delays() {
    let agent = Agent::start(&["--exit-after=2"], &args(&[]));
    // Record when each restart happens.
    let mut seen = 0.0;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 4 && start.elapsed() < Duration::from_secs(30) {
        let restarts = agent.metrics().sum("neuron_agent_monitor_restarts_total", &[("reason", "exited")]);
        if restarts > seen {
            seen = restarts;
            times.push(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(times.len(), 4, "expected 4 restarts in 30 s");
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // Each life is ~2 periods; the backoff in between goes 200 → 400 → 800 ms (±20%
    // jitter), so the third gap is at least 400 ms longer than the first.
    assert!(gaps[2] > gaps[0] + Duration::from_millis(250), "backoff did not grow: {gaps:?}");
    let metrics = agent.metrics();
    assert!(metrics.sum("neuron_agent_reports_total", &[]) >= 6.0);
    assert_eq!(agent.get("/readyz").map(|r| r.0), Some(200));
}

#[test]
fn a_silent_monitor_is_killed_and_replaced() {
    let agent = Agent::start(&["--hang-after=2"], &args(&["--silence-timeout", "1s"]));
    let first =
        agent.wait_for("a first monitor process", Duration::from_secs(10), |_| agent.children().first().copied());
    agent.wait_for("a restart for silence", Duration::from_secs(15), |m| {
        (m.sum("neuron_agent_monitor_restarts_total", &[("reason", "silent")]) >= 1.0).then_some(())
    });
    assert!(!alive(first), "the hung monitor {first} must be gone");
    // The replacement delivers reports again.
    agent.wait_for("reports from the new monitor", Duration::from_secs(10), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 3.0).then_some(())
    });
}

#[test]
fn garbage_truncated_and_oversized_lines_are_counted_and_skipped() {
    let agent = Agent::start(
        &["--garbage-every=2", "--truncate-every=3", "--oversized-at=2", "--oversized-bytes=3000000"],
        &args(&["--max-line-bytes", "1000000"]),
    );
    let metrics = agent.wait_for("every kind of bad line", Duration::from_secs(20), |m| {
        let rejected = |reason| m.sum("neuron_agent_lines_rejected_total", &[("reason", reason)]);
        (rejected("malformed") >= 1.0
            && rejected("truncated") >= 1.0
            && rejected("oversized") >= 1.0
            && m.sum("neuron_agent_reports_total", &[]) >= 5.0)
            .then(|| m.clone())
    });
    assert_eq!(metrics.sum("neuron_agent_lines_rejected_total", &[("reason", "oversized")]), 1.0);
    assert_eq!(metrics.sum("neuron_agent_monitor_restarts_total", &[]), 0.0, "bad lines are not fatal");
    assert!(metrics.value("neuroncore_utilization_ratio", &[("runtime_tag", "sim-app")]).is_some());
}

#[test]
fn series_of_a_runtime_that_exits_disappear() {
    // Two recorded reports in turn: all 32 runtimes, then the same without one.
    let dir = TempDir::new("replay");
    let full = fixture(TRN1N_32);
    let mut doc: serde_json::Value = serde_json::from_str(&full).expect("json");
    let runtimes = doc["neuron_runtime_data"].as_array_mut().expect("runtimes");
    let gone = runtimes.remove(5);
    let gone_tag = gone["neuron_runtime_tag"].as_str().expect("tag").to_owned();
    let fewer = dir.0.join("fewer.json");
    std::fs::write(&fewer, serde_json::to_string(&doc).expect("json")).expect("write");
    let full_path = fixture_path(TRN1N_32);
    let replay = [
        format!("--replay={}", full_path.display()),
        format!("--replay={}", fewer.display()),
        "--interval=300ms".to_owned(),
    ];
    let replay: Vec<&str> = replay.iter().map(String::as_str).collect();
    let agent = Agent::start(&replay, &args(&[]));
    for expect_present in [true, false, true, false] {
        agent.wait_for(&format!("runtime {gone_tag} present={expect_present}"), Duration::from_secs(10), |m| {
            let cores = m.find("neuroncore_utilization_ratio", &[]);
            let held = cores.iter().filter(|s| s.labels.contains_key("runtime_tag")).count();
            let present = m.text.contains(&format!("runtime_tag=\"{gone_tag}\""));
            // The core it held stays exported, as idle.
            let expected_held = if expect_present { 32 } else { 31 };
            (present == expect_present && held == expected_held && cores.len() == 32).then_some(())
        });
    }
}

#[test]
fn sigterm_stops_the_agent_and_its_monitor() {
    let mut agent = Agent::start(&[], &args(&[]));
    let monitor = agent.wait_for("a monitor process", Duration::from_secs(10), |_| agent.children().first().copied());
    agent.wait_until("ready", Duration::from_secs(10), |a| a.get("/readyz").map(|r| r.0) == Some(200));
    let status = agent.terminate(Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!alive(monitor), "monitor {monitor} outlived the agent");
}

#[test]
fn values_match_what_the_simulator_produced() {
    let agent = Agent::start(
        &[
            "--instance-type=inf2.xlarge",
            "--app=tag=web,cores=1,util=37,rps=10",
            "--group-error=neuron_runtime_vcpu_usage",
            "--stderr-lines=30",
        ],
        &args(&[]),
    );
    let m = agent.wait_for("two reports", Duration::from_secs(10), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 2.0).then(|| m.clone())
    });
    assert_eq!(m.value("neuroncore_utilization_ratio", &[("runtime_tag", "web"), ("neuroncore", "1")]), Some(0.37));
    let idle = m.find("neuroncore_utilization_ratio", &[("neuroncore", "0")]);
    assert_eq!(idle.len(), 1);
    assert_eq!(idle[0].value, 0.0);
    assert!(!idle[0].labels.contains_key("runtime_tag"), "an idle core belongs to no runtime");
    assert_eq!(m.find("neuroncore_utilization_ratio", &[]).len(), 2, "inf2.xlarge has 2 cores");
    assert!(m.value("instance_info", &[("instance_type", "inf2.xlarge")]).is_some());
    // The group in error: flagged, and no made-up zeros.
    assert!(m.find("neuron_runtime_vcpu_usage_ratio", &[]).is_empty());
    assert_eq!(
        m.value("neuron_agent_group_error", &[("group", "neuron_runtime_vcpu_usage"), ("runtime_tag", "web")]),
        Some(1.0)
    );
    // Stderr is forwarded, rate-limited (burst of 20).
    let stderr = agent.wait_for("stderr lines counted", Duration::from_secs(5), |m| {
        let logged = m.sum("neuron_agent_monitor_stderr_lines_total", &[("outcome", "logged")]);
        let suppressed = m.sum("neuron_agent_monitor_stderr_lines_total", &[("outcome", "suppressed")]);
        (logged + suppressed >= 30.0).then_some((logged, suppressed))
    });
    assert_eq!(stderr, (20.0, 10.0));
}

#[test]
fn a_missing_monitor_binary_is_retried_not_fatal() {
    let agent = Agent::start_with("/nonexistent/neuron-monitor", &[], &args(&[]));
    agent.wait_for("spawn failures", Duration::from_secs(10), |m| {
        (m.sum("neuron_agent_monitor_restarts_total", &[("reason", "spawn_failed")]) >= 2.0).then_some(())
    });
    assert_eq!(agent.get("/readyz").map(|r| r.0), Some(503));
    assert_eq!(agent.get("/healthz").map(|r| r.0), Some(200));
}

/// A fake neuron-monitor: a shell that forks a sleeping grandchild holding its stdout
/// (recording the grandchild's PID in `pids`), then becomes the simulator with the
/// agent's arguments.
fn forking_monitor(dir: &TempDir) -> (String, Grandchildren) {
    let pids = dir.0.join("grandchildren");
    let script = dir.0.join("forking-monitor.sh");
    let text = format!("#!/bin/sh\nsleep 300 &\necho $! >> '{}'\nexec '{}' \"$@\"\n", pids.display(), support::sim());
    std::fs::write(&script, text).expect("write the script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    (script.display().to_string(), Grandchildren(pids))
}

/// The grandchildren a [`forking_monitor`] started; any still running is killed on drop.
struct Grandchildren(std::path::PathBuf);

impl Grandchildren {
    fn pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }

    fn first(&self, agent: &Agent) -> u32 {
        agent.wait_for("a grandchild", Duration::from_secs(10), |_| self.pids().first().copied())
    }
}

impl Drop for Grandchildren {
    fn drop(&mut self) {
        for pid in self.pids() {
            let is_sleep = std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep");
            if is_sleep {
                let _ = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            }
        }
    }
}

fn wait_gone(pid: u32, limit: Duration, what: &str) {
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < limit, "{what}: process {pid} still alive after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_exit_is_an_exit_even_when_a_descendant_holds_the_output() {
    let dir = TempDir::new("forking");
    let (script, grandchildren) = forking_monitor(&dir);
    // The silence limit is far away: only the exit itself can end the run in time.
    let agent = Agent::start_with(&script, &["--exit-after=2"], &args(&["--silence-timeout", "60s"]));
    let first = grandchildren.first(&agent);
    agent.wait_for("an exit counted as one", Duration::from_secs(15), |m| {
        (m.sum("neuron_agent_monitor_restarts_total", &[("reason", "exited")]) >= 1.0).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(m.sum("neuron_agent_monitor_restarts_total", &[("reason", "silent")]), 0.0);
    assert!(m.sum("neuron_agent_monitor_orphans_total", &[]) >= 1.0, "the left-over grandchild is counted");
    // The exited monitor's group is stopped with it.
    wait_gone(first, Duration::from_secs(10), "the grandchild of an exited monitor");
}

#[test]
fn sigterm_stops_the_monitor_and_its_descendants() {
    let dir = TempDir::new("forking");
    let (script, grandchildren) = forking_monitor(&dir);
    let mut agent = Agent::start_with(&script, &[], &args(&[]));
    let grandchild = grandchildren.first(&agent);
    agent.wait_until("ready", Duration::from_secs(10), |a| a.get("/readyz").map(|r| r.0) == Some(200));
    agent.signal("TERM");
    let start = Instant::now();
    while agent.child.try_wait().expect("wait").is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "agent did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_gone(grandchild, Duration::from_secs(2), "the monitor's grandchild after the agent's SIGTERM");
}

#[test]
fn sigkill_of_the_agent_takes_the_monitors_descendants_along() {
    let dir = TempDir::new("forking");
    let (script, grandchildren) = forking_monitor(&dir);
    let mut agent = Agent::start_with(&script, &[], &args(&[]));
    let grandchild = grandchildren.first(&agent);
    agent.wait_until("ready", Duration::from_secs(10), |a| a.get("/readyz").map(|r| r.0) == Some(200));
    agent.signal("KILL");
    let _ = agent.child.wait();
    wait_gone(grandchild, Duration::from_secs(10), "the monitor's grandchild after the agent's SIGKILL");
}

/// A critical task that ends (here: made to panic through the test-only hook) is named in
/// the log, and the agent stops the others and exits non-zero for the kubelet to restart
/// it, instead of serving on without it.
#[test]
fn a_critical_task_that_dies_makes_the_agent_exit_non_zero_naming_it() {
    let dir = TempDir::new("task-death");
    let log_path = dir.0.join("agent.log");
    let log = std::fs::File::create(&log_path).expect("create the log file");
    let port = support::free_port();
    let mut child = std::process::Command::new(support::AGENT)
        .args(["--monitor-command", support::sim(), "--listen", &format!("127.0.0.1:{port}")])
        .arg("--state-dir")
        .arg(dir.0.join("state"))
        .args(FAST)
        .env("NEURON_AGENT_LOG", "info")
        .env("NEURON_AGENT_KMSG_PATH", dir.0.join("no-kmsg"))
        .env("NEURON_AGENT_SYSFS_ROOT", dir.0.join("no-sysfs"))
        .env(service::tasks::TEST_PANIC_ENV, "EFA follower")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the agent");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the agent did not exit within 30 s of a critical task's end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&log_path).expect("read the log");
    assert!(!status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("a critical task ended") && log.contains("EFA follower"), "log:\n{log}");
    // neuron-monitor was stopped on the way out, not left behind.
    assert!(!log.contains("did not stop in time"), "log:\n{log}");
}

/// neuron-monitor outlives the runtime's threads: it was forked by whichever thread ran
/// the supervisor, with `PR_SET_PDEATHSIG`, which fires when that *thread* ends; a worker
/// that ran `block_in_place` for a report later retires as an idle blocking thread (10 s
/// unused), and neuron-monitor was SIGKILLed with it during a quiet spell.
#[test]
fn a_quiet_monitor_is_not_killed_when_the_runtimes_threads_retire() {
    let sim = ["--instance-type=trn1.2xlarge", "--app=tag=train,cores=0,util=80,rps=20", "--hang-after=6"];
    let agent = Agent::start(&sim, &["--period", "1s", "--silence-timeout", "1h"]);
    agent.wait_for("six reports", Duration::from_secs(30), |m| {
        m.value("neuron_agent_reports_total", &[]).filter(|n| *n >= 6.0)
    });
    let monitor = agent.children();
    // Past the blocking pool's keep-alive (10 s) twice over, scraped meanwhile.
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        agent.metrics();
    }
    let restarts = agent.metrics().sum("neuron_agent_monitor_restarts_total", &[]);
    assert_eq!(restarts, 0.0, "neuron-monitor was restarted while it was quiet");
    assert_eq!(agent.children(), monitor);
}
